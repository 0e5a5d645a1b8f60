/**
 * The sizes a stage allocates: its activation buffers (one chunk or one batched step wide), its per-slot
 * state (KV caches, conv rings, recurrent states), and the DeltaNet kernel constants those follow from.
 * `inspect` reports the same numbers (kvBytesPerPosition, deltaNetStateBytes), so a plan made from its
 * report is what a stage will allocate.
 * @module
 */
import type { DeltaNetLayout, Hparams } from "../models/_arch.ts";
import type { StateSpec } from "../state.ts";
import { assert } from "../errors.ts";
import { BATCH_MAX_COLS, MATVEC_MAX_COLS, padWords } from "../graph/builder.ts";
import { ATTN_SPLITS } from "../blocks/attention.ts";
import { GDN_ONE_COLUMN, gdnDims, type GdnStepConstants } from "../../wgsl/gdn_step.ts";
import { gdnChunkScratchBytes } from "../../wgsl/gdn_chunk.ts";

/** Most slots one batched decode step takes (the mat-vec's column limit: one weight read for all). */
export const MAX_BATCH_SLOTS: number = BATCH_MAX_COLS;

/** Buffer usage of every activation and state buffer. */
export const STORAGE: number = GPUBufferUsage.STORAGE | GPUBufferUsage.COPY_SRC | GPUBufferUsage.COPY_DST;

/** KV cache bytes per position of one attention layer: K and V, nHeadKv·headDim each, f32 (or f16). */
export function kvBytesPerPosition(hp: Pick<Hparams, "nHeadKv" | "headDim">, kvF16 = false): number {
  return 2 * hp.nHeadKv * hp.headDim * (kvF16 ? 2 : 4);
}

/**
 * The constants of `gdn_step` for this model and a layer's input layout (b/a grouped per key head for the
 * `ssm_in` and `qkv_ba` layouts).
 */
export function gdnConstants(hp: Hparams, layout: DeltaNetLayout | undefined): GdnStepConstants {
  return {
    N_K: hp.ssmGroups,
    N_V: hp.ssmDtRank,
    D_K: hp.ssmState,
    D_V: hp.ssmInner / hp.ssmDtRank,
    K_CONV: hp.ssmConv,
    EPS: hp.rmsEps,
    KAPPA_TILED: kappaTiled(hp),
    BA_GROUPED: layout === "ssm_in" || layout === "qkv_ba",
    A_OFF: 0,
    SPLIT: gdnSplit(hp.ssmInner / hp.ssmDtRank),
    ...GDN_ONE_COLUMN,
  };
}

/** Per-slot bytes of one DeltaNet layer's state as the stage holds it: conv ring and recurrent state, f32. */
export function deltaNetStateBytes(hp: Hparams): { convBytes: number; stateBytes: number } {
  const d = gdnDims(gdnConstants(hp, undefined));
  return { convBytes: d.convRing * 4, stateBytes: d.state * 4 };
}

/**
 * The per-slot state of layers `[a, b)` at `nCtx` positions: K/V per attention layer (f32, or f16 with
 * `kvF16`), conv + ssm per DeltaNet.
 */
export function stateSpecs(
  hp: Hparams,
  layers: readonly [number, number],
  nCtx: number,
  kvF16 = false,
): StateSpec[] {
  const specs: StateSpec[] = [];
  const posBytes = kvBytesPerPosition(hp, kvF16) / 2 / hp.nHeadKv;
  for (let l = layers[0]; l < layers[1]; l++) {
    if (hp.isAttention[l]) {
      const size = hp.nHeadKv * nCtx * posBytes;
      const liveRanges = (nPos: number) =>
        Array.from({ length: hp.nHeadKv }, (_, h) => ({
          offsetBytes: h * nCtx * posBytes,
          sizeBytes: nPos * posBytes,
        }));
      specs.push({ layer: l, name: "k_cache", sizeBytes: size, liveRanges });
      specs.push({ layer: l, name: "v_cache", sizeBytes: size, liveRanges });
    } else {
      const { convBytes, stateBytes } = deltaNetStateBytes(hp);
      specs.push({ layer: l, name: "conv", sizeBytes: convBytes });
      specs.push({ layer: l, name: "ssm", sizeBytes: stateBytes });
    }
  }
  return specs;
}

/**
 * Most logits rows a last stage computes at once: a prefill chunk needs one (its last token), a batched step
 * or a draft check a few; every-row logits (`rows: "all"`) of a wider chunk run in pieces of this many
 * (Stage.run), so a 2,048-token chunk does not hold 2,048 vocabulary-wide rows (1.9 GiB for 35B-A3B).
 */
export const LOGITS_ROWS = 64;

/**
 * f32 words of every activation buffer of a stage: rows for a prefill chunk of `maxChunk` or a batched decode
 * step, whichever is wider; the chunked DeltaNet's scratch when chunks exceed the mat-vec width and the stage
 * has DeltaNet layers; logits on the last stage ({@linkcode LOGITS_ROWS} rows at most).
 */
export function activationWords(
  hp: Hparams,
  o: { maxChunk: number; deltaNet: boolean; last: boolean },
): Record<string, number> {
  const T = Math.max(o.maxChunk, MAX_BATCH_SLOTS);
  const c = gdnConstants(hp, undefined);
  const d = gdnDims(c);
  const K = hp.nExpertUsed;
  const sizes: Record<string, number> = {
    tokens: T,
    h: hp.nEmbd * T,
    a: hp.nEmbd * T,
    t: hp.nEmbd * T,
    m: hp.nEmbd * T,
    xqkv: d.convCh * T,
    z: d.inner * T,
    ba: 2 * hp.ssmDtRank * T,
    alpha: hp.ssmDtRank * T,
    y: d.inner * T,
    // A batched step's fused in-projections, each column 256-byte aligned (one token's fit in one column).
    inproj: Math.max(
      padWords(d.convCh + d.inner + 2 * hp.ssmDtRank),
      padWords(2 * hp.nHead * hp.headDim + 2 * hp.nHeadKv * hp.headDim),
    ) * MAX_BATCH_SLOTS,
    qf: 2 * hp.nHead * hp.headDim * T,
    k: hp.nHeadKv * hp.headDim * T,
    v: hp.nHeadKv * hp.headDim * T,
    q: hp.nHead * hp.headDim * T,
    o: hp.nHead * hp.headDim * T,
    // A batched step's decode attention leaves each column's partials for one combine (256-byte strides).
    partO: padWords(hp.headDim * hp.nHead * ATTN_SPLITS) * MAX_BATCH_SLOTS,
    partMl: padWords(2 * hp.nHead * ATTN_SPLITS) * MAX_BATCH_SLOTS,
    router: (hp.nExpert + 1) * T,
    ids: K * T,
    wts: K * T,
    act: Math.max(hp.nFfExp, hp.nFfShexp) * (K + 1) * T,
    eo: hp.nEmbd * (K + 1) * T,
    sact: hp.nFfShexp * T,
    sho: hp.nEmbd * T,
    gam: T,
  };
  if (o.maxChunk > MATVEC_MAX_COLS && o.deltaNet) {
    const sb = gdnChunkScratchBytes(c, o.maxChunk);
    sizes.gdnQkw = sb.wsQkw / 4;
    sizes.gdnUp = sb.wsUp / 4;
  }
  if (o.last) {
    sizes.logits = Math.max(hp.nVocab * Math.min(T, LOGITS_ROWS), padWords(hp.nVocab) * MAX_BATCH_SLOTS);
  }
  return sizes;
}

/** Whether every per-slot row of a batched step of layers `[a, b)` starts 256-byte aligned (Stage.canBatch). */
export function batchable(hp: Hparams, layers: readonly [number, number]): boolean {
  const rows = [hp.nEmbd];
  for (let l = layers[0]; l < layers[1]; l++) {
    if (hp.isAttention[l]) {
      rows.push(2 * hp.nHead * hp.headDim, hp.nHead * hp.headDim, hp.nHeadKv * hp.headDim);
    } else {
      const dV = hp.ssmInner / hp.ssmDtRank;
      rows.push(2 * hp.ssmGroups * hp.ssmState + hp.ssmDtRank * dV, hp.ssmInner);
    }
  }
  return rows.every((w) => w % 64 === 0);
}

/**
 * Workgroups per v-head of `gdn_step` (its SPLIT): 4 where the head dim allows (D_V a multiple of 64), else 2
 * or 1 (the timings behind 4 are in docs/PERF.md).
 */
function gdnSplit(dV: number): number {
  return [4, 2, 1].find((s) => dV % (16 * s) === 0)!;
}

/** True when the file's κ is the modulo tiling (qwen35moe), false for the grouped one (qwen3next), spec §9. */
function kappaTiled(hp: Hparams): boolean {
  const nK = hp.ssmGroups;
  const r = hp.ssmDtRank / nK;
  let tiled = true;
  let grouped = true;
  for (let h = 0; h < hp.ssmDtRank; h++) {
    const g = hp.kvGroupOfVHead(h);
    if (g !== h % nK) tiled = false;
    if (g !== Math.floor(h / r)) grouped = false;
  }
  assert(tiled || grouped, `${hp.arch}: the DeltaNet k-head mapping is neither tiled nor grouped`);
  return tiled;
}

/** Most slots a stage holds: a decode step batches at most MAX_BATCH_SLOTS; more slots only hold idle state. */
export const MAX_SLOTS = 256;

/**
 * Checks, before anything is allocated, that every buffer a stage of layers `[a, b)` would create fits the
 * device's limits (each KV cache, conv ring, recurrent state and activation buffer is bound whole, so none may
 * exceed `maxStorageBufferBindingSize` nor `maxBufferSize`), and that the slot count is sane.
 * @throws {RangeError} naming the buffer, its size, the limit, and the largest `--ctx` or `--chunk` that fits
 */
export function checkStageFits(
  hp: Hparams,
  o: { layers: readonly [number, number]; nCtx: number; nSlots: number; maxChunk: number; kvF16?: boolean },
  limits: Pick<GPUSupportedLimits, "maxStorageBufferBindingSize" | "maxBufferSize">,
): void {
  if (!Number.isInteger(o.nSlots) || o.nSlots < 1 || o.nSlots > MAX_SLOTS) {
    throw new RangeError(
      `--slots ${o.nSlots} is out of range 1..${MAX_SLOTS}: a decode step runs at most ${MAX_BATCH_SLOTS} slots ` +
        `together and every slot holds its own KV cache and state; use fewer slots (more wait in the queue)`,
    );
  }
  const limit = Math.min(limits.maxStorageBufferBindingSize, limits.maxBufferSize);
  const mib = (b: number) => `${(b / 2 ** 20).toFixed(1)} MiB`;
  const kvPerPos = kvBytesPerPosition(hp, o.kvF16) / 2; // K or V alone
  const hasAttention = hp.isAttention.slice(o.layers[0], o.layers[1]).some((a) => a);
  if (hasAttention && kvPerPos * o.nCtx > limit) {
    throw new RangeError(
      `--ctx ${o.nCtx} needs a K (and a V) cache of ${
        mib(kvPerPos * o.nCtx)
      } per attention layer and slot, ` +
        `but this GPU binds at most ${mib(limit)} in one buffer (maxStorageBufferBindingSize): use --ctx ` +
        `${Math.floor(limit / kvPerPos)} or less`,
    );
  }
  const { convBytes, stateBytes } = deltaNetStateBytes(hp);
  if (Math.max(convBytes, stateBytes) > limit) {
    throw new RangeError(
      `A DeltaNet layer's state (${mib(Math.max(convBytes, stateBytes))}) exceeds this GPU's ` +
        `${mib(limit)} binding limit: the model is too large for this GPU's limits`,
    );
  }
  const last = o.layers[1] === hp.nLayer;
  const deltaNet = hp.isAttention.slice(o.layers[0], o.layers[1]).some((a) => !a);
  const words = activationWords(hp, { maxChunk: o.maxChunk, deltaNet, last });
  for (const [name, w] of Object.entries(words)) {
    if (4 * w <= limit) continue;
    // Every activation buffer grows with the chunk (rows of max(chunk, 8)): the largest chunk at which all fit.
    const allFit = (chunk: number) =>
      Object.values(activationWords(hp, { maxChunk: chunk, deltaNet, last })).every((x) => 4 * x <= limit);
    let chunk = o.maxChunk;
    while (chunk > 1 && !allFit(chunk)) chunk = Math.floor(chunk / 2);
    if (!allFit(chunk)) {
      throw new RangeError(
        `The activation buffer "${name}" needs ${
          mib(4 * w)
        } whatever --chunk is, but this GPU binds at most ` +
          `${
            mib(limit)
          } in one buffer (maxStorageBufferBindingSize): the model is too large for this GPU's limits`,
      );
    }
    throw new RangeError(
      `--chunk ${o.maxChunk} needs an activation buffer "${name}" of ${
        mib(4 * w)
      }, but this GPU binds at most ` +
        `${mib(limit)} in one buffer (maxStorageBufferBindingSize): use --chunk ${chunk} or less`,
    );
  }
}
