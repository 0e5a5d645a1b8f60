/**
 * Model inspection: what a GGUF holds and what it costs in memory, per layer — the numbers a split planner
 * needs. Weights come from the tensor table; the per-slot state from the hyper-parameters, in the sizes a stage
 * allocates (`exec/activations.ts`): an f32 KV cache on attention layers and the f32 conv + recurrent state on
 * DeltaNet layers (spec `qwen3next.md` §13).
 *
 * @example
 * ```ts
 * import { openGguf } from "./gguf.ts";
 * import { formatReport, inspectModel } from "./inspect.ts";
 * using file = await openGguf("model.gguf");
 * console.log(formatReport(inspectModel(file, { nCtx: 8192, nSlots: 2 })));
 * ```
 * @module
 */
import type { GgufFile } from "./gguf.ts";
import { type ArchName, archOf, convChannels, type DeltaNetLayout, type Hparams } from "./models/mod.ts";
import { tensorLayer } from "./names.ts";
import { kvBytesPerPosition } from "./exec/activations.ts";
import { type GgmlTypeName, typeInfo } from "./quant/types.ts";
import { dequantize } from "./quant/dequant.ts";

/** One row of the tensor table. */
export interface InspectTensor {
  /** GGUF name. */
  readonly name: string;
  /** ggml type name. */
  readonly type: string;
  /** Shape, innermost first. */
  readonly ne: readonly number[];
  /** Data bytes. */
  readonly bytes: number;
  /** 0-based split part holding it. */
  readonly part: number;
}

/** Memory of one layer: its weights and, per the requested context and slots, its sequence state. */
export interface InspectLayer {
  /** Layer index (`blk.N`). */
  readonly layer: number;
  /** Mixer kind; `mtp` blocks are listed but never loaded. */
  readonly kind: "attention" | "deltanet" | "mtp";
  /** DeltaNet input layout (DeltaNet layers of a file that passed the check). */
  readonly layout?: DeltaNetLayout;
  /** Bytes of the layer's tensors. */
  readonly weightBytes: number;
  /** f32 K and V for `nCtx` positions × `nSlots` (attention layers), as a stage allocates them. */
  readonly kvBytes: number;
  /**
   * f32 conv window and recurrent state × (`nSlots` + 1) (DeltaNet layers): one more for the taps a prefill
   * cut at a prompt-boundary snapshot writes (SlotStates.tap).
   */
  readonly recurrentBytes: number;
  /** weightBytes + kvBytes + recurrentBytes. */
  readonly totalBytes: number;
}

/** Everything {@linkcode inspectModel} reports. */
export interface InspectReport {
  /** First part's path. */
  readonly path: string;
  /** Number of split parts. */
  readonly parts: number;
  /** `general.architecture`. */
  readonly arch: ArchName;
  /** Hyper-parameters (κ left out: it is a function). */
  readonly hparams: Omit<Hparams, "kvGroupOfVHead">;
  /** Context length and slots the state numbers are for. */
  readonly nCtx: number;
  /** Concurrent sequences the state numbers are for. */
  readonly nSlots: number;
  /** Whether the KV numbers are for an f16 cache (`StageOptions.kvF16`) instead of f32. */
  readonly kvF16: boolean;
  /** `A` (attention) or `D` (DeltaNet) per decoder layer, then `M` per MTP block. */
  readonly pattern: string;
  /** Result of the architecture's tensor check: `ok`, or the error message. */
  readonly check: { readonly ok: true; readonly tiedOutput: boolean } | {
    readonly ok: false;
    readonly error: string;
  };
  /** Every tensor in file order. */
  readonly tensors: readonly InspectTensor[];
  /** Tensor count and bytes per ggml type. */
  readonly byType: Readonly<Record<string, { readonly count: number; readonly bytes: number }>>;
  /** Bytes of the tensors outside any layer (embedding, final norm, LM head). */
  readonly globalBytes: number;
  /** Per layer, decoder layers then MTP blocks. */
  readonly layers: readonly InspectLayer[];
  /** Sums over the loaded model (MTP blocks excluded). */
  readonly totals: {
    readonly weightBytes: number;
    readonly kvBytes: number;
    readonly recurrentBytes: number;
    readonly totalBytes: number;
  };
}

export { kvBytesPerPosition };

/**
 * Per-sequence state bytes of one DeltaNet layer as a stage holds them: the f32 conv ring of K_conv positions
 * of C channels (the kernel keeps a ring, one position more than the K_conv − 1 the conv reads) plus the f32
 * recurrent state n_v·d_k·d_v.
 */
export function recurrentBytesPerSlot(
  hp: Pick<Hparams, "ssmConv" | "ssmGroups" | "ssmState" | "ssmInner" | "ssmDtRank">,
): number {
  return 4 * (hp.ssmConv * convChannels(hp) + hp.ssmInner * hp.ssmState);
}

/**
 * Inspects an open model: hyper-parameters, layer pattern, tensor check, tensor table and memory per
 * layer for `nCtx` positions and `nSlots` sequences.
 * @throws {GgufError} when the architecture is unsupported or its hyper-parameters are invalid (a failed
 *   tensor check is reported in {@linkcode InspectReport.check} instead)
 */
export function inspectModel(
  file: GgufFile,
  opts: { nCtx: number; nSlots: number; kvF16?: boolean },
): InspectReport {
  const { nCtx, nSlots } = opts;
  if (!Number.isInteger(nCtx) || nCtx < 1 || !Number.isInteger(nSlots) || nSlots < 1) {
    throw new RangeError(`Context ${nCtx} and slots ${nSlots} must be positive integers`);
  }
  const arch = archOf(file.metadata);
  const hp = arch.readHparams(file.metadata);
  let check: InspectReport["check"];
  let layouts: readonly (DeltaNetLayout | undefined)[] = [];
  try {
    const c = arch.checkTensors(file, hp);
    layouts = c.layouts;
    check = { ok: true, tiedOutput: c.tiedOutput };
  } catch (e) {
    check = { ok: false, error: e instanceof Error ? e.message : String(e) };
  }

  const tensors: InspectTensor[] = [];
  const byType: Record<string, { count: number; bytes: number }> = {};
  const layerBytes = new Array<number>(hp.blockCount).fill(0);
  let globalBytes = 0;
  for (const t of file.tensors.values()) {
    tensors.push({ name: t.name, type: t.type.name, ne: t.ne, bytes: t.nbytes, part: t.part });
    const bt = (byType[t.type.name] ??= { count: 0, bytes: 0 });
    bt.count++;
    bt.bytes += t.nbytes;
    const layer = tensorLayer(t.name);
    if (layer === undefined) globalBytes += t.nbytes;
    else {
      if (layer < layerBytes.length) layerBytes[layer]! += t.nbytes;
      else globalBytes += t.nbytes; // a stray block beyond block_count: the check reports it
    }
  }

  const kvPerLayer = kvBytesPerPosition(hp, opts.kvF16) * nCtx * nSlots;
  const recPerLayer = recurrentBytesPerSlot(hp) * (nSlots + 1);
  const layers: InspectLayer[] = layerBytes.map((weightBytes, layer) => {
    const kind = layer >= hp.nLayer ? "mtp" : hp.isAttention[layer] ? "attention" : "deltanet";
    const kvBytes = kind === "attention" ? kvPerLayer : 0;
    const recurrentBytes = kind === "deltanet" ? recPerLayer : 0;
    const layout = layouts[layer];
    return {
      layer,
      kind,
      ...(layout === undefined ? {} : { layout }),
      weightBytes,
      kvBytes,
      recurrentBytes,
      totalBytes: weightBytes + kvBytes + recurrentBytes,
    };
  });
  const main = layers.filter((l) => l.kind !== "mtp");
  const sum = (f: (l: InspectLayer) => number) => main.reduce((a, l) => a + f(l), 0);
  const weightBytes = globalBytes + sum((l) => l.weightBytes);
  const kvBytes = sum((l) => l.kvBytes), recurrentBytes = sum((l) => l.recurrentBytes);
  const { kvGroupOfVHead: _, ...hparams } = hp;
  return {
    path: file.path,
    parts: file.parts.length,
    arch: arch.name,
    hparams,
    nCtx,
    nSlots,
    kvF16: opts.kvF16 ?? false,
    pattern: layers.map((l) => (l.kind === "attention" ? "A" : l.kind === "deltanet" ? "D" : "M")).join(""),
    check,
    tensors,
    byType,
    globalBytes,
    layers,
    totals: { weightBytes, kvBytes, recurrentBytes, totalBytes: weightBytes + kvBytes + recurrentBytes },
  };
}

/** Bytes with a binary unit (`12.3 MiB`). */
export function formatBytes(n: number): string {
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let v = n, u = 0;
  while (v >= 1024 && u < units.length - 1) {
    v /= 1024;
    u++;
  }
  return u === 0 ? `${n} B` : `${v.toFixed(v >= 100 ? 0 : v >= 10 ? 1 : 2)} ${units[u]}`;
}

/** The report as aligned text: summary, hyper-parameters, check, per-type, per-layer and tensor tables. */
export function formatReport(r: InspectReport): string {
  const hp = r.hparams;
  const out: string[] = [];
  const table = (rows: string[][], right: number[]) => {
    const w = rows[0]!.map((_, c) => Math.max(...rows.map((row) => row[c]!.length)));
    for (const row of rows) {
      out.push(
        row.map((cell, c) => (right.includes(c) ? cell.padStart(w[c]!) : cell.padEnd(w[c]!))).join("  ")
          .trimEnd(),
      );
    }
  };
  out.push(`${r.path}${r.parts > 1 ? ` (+${r.parts - 1} split parts)` : ""}`);
  out.push(
    `architecture ${r.arch}: ${hp.nLayer} layers${hp.nextnLayers ? ` + ${hp.nextnLayers} MTP` : ""}, ` +
      `${r.tensors.length} tensors, ${formatBytes(r.totals.weightBytes)} of weights`,
  );
  out.push(`pattern      ${r.pattern} (A attention, D DeltaNet, M MTP block, not loaded)`);
  out.push(
    `dims         nEmbd ${hp.nEmbd}  nVocab ${hp.nVocab}  nCtxTrain ${hp.nCtxTrain}  rmsEps ${
      Number(hp.rmsEps.toPrecision(6))
    }`,
    `attention    nHead ${hp.nHead}  nHeadKv ${hp.nHeadKv}  headDim ${hp.headDim}  ropeDim ${hp.ropeDim}  ` +
      `ropeBase ${hp.ropeBase}${
        hp.ropeSections.length ? `  ropeSections [${hp.ropeSections.join(", ")}]` : ""
      }` +
      `  attnScale ${hp.attnScale.toPrecision(4)}`,
    `deltanet     ssmGroups ${hp.ssmGroups}  ssmDtRank ${hp.ssmDtRank}  ssmState ${hp.ssmState}  ` +
      `ssmInner ${hp.ssmInner}  ssmConv ${hp.ssmConv}`,
    `moe          nExpert ${hp.nExpert}  nExpertUsed ${hp.nExpertUsed}  nFfExp ${hp.nFfExp}  nFfShexp ${hp.nFfShexp}` +
      `  expertWeightsScale ${hp.expertWeightsScale}`,
  );
  out.push(
    r.check.ok
      ? `check        ok${r.check.tiedOutput ? " (output tied to token_embd)" : ""}`
      : `check        FAILED: ${r.check.error}`,
  );
  out.push("", `bytes per type`);
  const types = Object.entries(r.byType).sort((a, b) => b[1].bytes - a[1].bytes);
  table([
    ["type", "tensors", "bytes", ""],
    ...types.map(([t, v]) => [t, String(v.count), String(v.bytes), formatBytes(v.bytes)]),
  ], [
    1,
    2,
    3,
  ]);
  out.push(
    "",
    `memory per layer at ctx ${r.nCtx} × ${r.nSlots} slot(s) (KV ${
      r.kvF16 ? "f16" : "f32"
    }, recurrent state f32)`,
  );
  const layerRows = r.layers.map((l) => [
    String(l.layer),
    l.kind + (l.layout ? ` ${l.layout}` : ""),
    formatBytes(l.weightBytes),
    formatBytes(l.kvBytes),
    formatBytes(l.recurrentBytes),
    formatBytes(l.totalBytes),
  ]);
  table([
    ["layer", "kind", "weights", "kv", "recurrent", "total"],
    ["-", "globals", formatBytes(r.globalBytes), "0 B", "0 B", formatBytes(r.globalBytes)],
    ...layerRows,
    [
      "sum",
      "(MTP excluded)",
      formatBytes(r.totals.weightBytes),
      formatBytes(r.totals.kvBytes),
      formatBytes(r.totals.recurrentBytes),
      formatBytes(r.totals.totalBytes),
    ],
  ], [2, 3, 4, 5]);
  out.push("", "tensors");
  table([
    ["name", "type", "ne", "bytes", ...(r.parts > 1 ? ["part"] : [])],
    ...r.tensors.map((t) => [
      t.name,
      t.type,
      `[${t.ne.join(", ")}]`,
      String(t.bytes),
      ...(r.parts > 1 ? [String(t.part + 1)] : []),
    ]),
  ], [3, 4]);
  return out.join("\n");
}

/** A tensor holding non-finite values ({@linkcode checkNumerics}). */
export interface NonFiniteTensor {
  /** Tensor name. */
  readonly name: string;
  /** Its ggml type. */
  readonly type: string;
  /** Non-finite values after dequantization (a NaN/Inf block scale spoils its whole block). */
  readonly count: number;
  /** Element index of the first one. */
  readonly first: number;
}

/** Bytes read per step of {@linkcode checkNumerics} (whole blocks). */
const CHECK_CHUNK_BYTES = 16 << 20;

/**
 * Scans every tensor for non-finite values: float tensors element by element, quantized ones through their
 * dequantization (quants are integers, so a NaN or Inf there comes from a block scale). Reads the whole file
 * once; `onProgress` gets the bytes done. Returns the tensors with non-finite values (empty: all finite).
 */
export async function checkNumerics(
  file: GgufFile,
  onProgress?: (doneBytes: number, totalBytes: number) => void,
): Promise<NonFiniteTensor[]> {
  const bad: NonFiniteTensor[] = [];
  const total = [...file.tensors.values()].reduce((s, t) => s + t.nbytes, 0);
  let done = 0;
  for (const t of file.tensors.values()) {
    const type = t.type.name as GgmlTypeName;
    const info = typeInfo(type);
    const step = Math.max(1, Math.floor(CHECK_CHUNK_BYTES / info.blockBytes)) * info.blockBytes;
    let count = 0;
    let first = -1;
    for (let at = 0; at < t.nbytes; at += step) {
      const bytes = await file.readTensor(t.name, {
        offsetBytes: at,
        sizeBytes: Math.min(step, t.nbytes - at),
      });
      const elems = (bytes.length / info.blockBytes) * info.blockElems;
      const v = dequantize(type, bytes, elems);
      for (let i = 0; i < v.length; i++) {
        if (!Number.isFinite(v[i]!)) {
          if (first < 0) first = (at / info.blockBytes) * info.blockElems + i;
          count++;
        }
      }
      done += bytes.length;
      onProgress?.(done, total);
    }
    if (count > 0) bad.push({ name: t.name, type: t.type.name, count, first });
  }
  return bad;
}
