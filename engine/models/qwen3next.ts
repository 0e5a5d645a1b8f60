/**
 * `qwen3next` (Qwen3‑Next‑80B‑A3B): hyper-parameters and tensor list (spec `qwen3next.md`).
 * Hybrid stack of gated DeltaNet and gated full-attention layers, every layer with an MoE FFN; NeoX rope;
 * DeltaNet value heads grouped per key head (κ(h) = floor(h / r), spec §9); two on-disk DeltaNet input
 * layouts, the legacy fused `ssm_in` and the current `attn_qkv` + `attn_gate`, both with grouped `ssm_ba`.
 * @module
 */
import type { GgufFile, GgufMetadata } from "../gguf.ts";
import {
  addAttention,
  addDeltaNetCommon,
  addLayerCommon,
  type Arch,
  checkTensorList,
  CONV_CHANNELS,
  type DeltaNetLayout,
  from,
  globalTensors,
  type Hparams,
  k,
  mtpLayerTensors,
  readCommonHparams,
  SpecList,
  type TensorCheck,
  type TensorSpec,
} from "./_arch.ts";
import { assert } from "../errors.ts";
import type { HybridModel } from "./_hybrid.ts";
import type { Binding } from "../../wgsl/kernel.ts";
import { type BuildContext, GraphBuilder, type LayerWeights, sub } from "../graph/builder.ts";
import { batchedInputs, type DeltaNetInputs } from "../blocks/deltanet.ts";
import { fusedMatvec, matvec, matvecColumns } from "../blocks/linear.ts";
import { gdnDims, type GdnStepConstants } from "../../wgsl/gdn_step.ts";

/** DeltaNet layouts of qwen3next files: the current converter's first, then the legacy one. */
const LAYOUTS: readonly DeltaNetLayout[] = ["qkv_ba", "ssm_in"];

/**
 * κ of spec §9 for qwen3next: value head `h` (file order, grouped) reads key head floor(h / r),
 * r = n_v / n_k; key head g serves value heads r·g … r·g + r − 1.
 */
export function kvGroupOfVHead(hp: { ssmGroups: number; ssmDtRank: number }, h: number): number {
  return Math.floor(h / (hp.ssmDtRank / hp.ssmGroups));
}

/**
 * Reads qwen3next hyper-parameters (NeoX rope: `rope.dimension_sections` is absent, or must reduce to NeoX).
 * @throws {GgufError} code `bad_value` naming the key, its value and the constraint it breaks
 */
export function readHparams(meta: GgufMetadata): Hparams {
  return readCommonHparams(meta, "qwen3next", { kvGroupOfVHead, ropeSections: "optional" });
}

/** Every tensor a qwen3next file may hold, both DeltaNet layouts included (spec §4). */
export function tensors(hp: Hparams): TensorSpec[] {
  const out = globalTensors(hp);
  const D = hp.nEmbd, nv = hp.ssmDtRank;
  for (let layer = 0; layer < hp.nLayer; layer++) {
    const l = new SpecList(layer);
    addLayerCommon(l, hp);
    if (hp.isAttention[layer]) addAttention(l, hp);
    else {
      // Legacy: q|k|v|z fused and grouped per key head (spec §8.1 variant A).
      l.add(
        "ssm_in",
        [D, 2 * hp.ssmGroups * hp.ssmState + 2 * hp.ssmInner],
        from(
          "embeddingLength",
          `2·${k("ssmGroupCount")}·${k("ssmStateSize")} + 2·${k("ssmInnerSize")}`,
        ),
        { layouts: ["ssm_in"] },
      )
        .add(
          "attn_qkv",
          [D, 2 * hp.ssmGroups * hp.ssmState + hp.ssmInner],
          from("embeddingLength", CONV_CHANNELS),
          {
            layouts: ["qkv_ba"],
          },
        )
        .add("attn_gate", [D, hp.ssmInner], from("embeddingLength", "ssmInnerSize"), { layouts: ["qkv_ba"] })
        // β|α grouped per key head in both layouts (spec §8.1).
        .add("ssm_ba", [D, 2 * nv], from("embeddingLength", `2·${k("ssmTimeStepRank")}`));
      addDeltaNetCommon(l, hp);
    }
    out.push(...l.specs);
  }
  for (let layer = hp.nLayer; layer < hp.blockCount; layer++) out.push(...mtpLayerTensors(hp, layer));
  return out;
}

/**
 * Checks a qwen3next file's tensors against {@linkcode tensors} and reports each layer's DeltaNet layout.
 * @throws {GgufError} code `bad_tensor` on a missing, unknown, misshapen or mistyped tensor
 */
export function checkTensors(file: GgufFile, hp: Hparams): TensorCheck {
  return checkTensorList(file, hp, { specs: tensors(hp), accepted: LAYOUTS });
}

/** The qwen3next architecture. */
export const QWEN3NEXT: Arch = {
  name: "qwen3next",
  deltaNetLayouts: LAYOUTS,
  readHparams,
  tensors,
  checkTensors,
};

/**
 * Source row of each canonical row of the legacy `ssm_in` (spec §8.1): canonical rows are
 * [q_0..q_{nK-1} | k_0.. | v_0..v_{nV-1} | z_0..z_{nV-1}], the file groups them per key head g as
 * [q_g | k_g | v_{rg}..v_{rg+r-1} | z_{rg}..z_{rg+r-1}].
 */
export function legacyRowOrder(hp: Hparams): Uint32Array {
  const nK = hp.ssmGroups;
  const nV = hp.ssmDtRank;
  const dK = hp.ssmState;
  const dV = hp.ssmInner / nV;
  const r = nV / nK;
  const G = 2 * dK + 2 * r * dV;
  const order = new Uint32Array(nK * G);
  let at = 0;
  for (let g = 0; g < nK; g++) for (let i = 0; i < dK; i++) order[at++] = g * G + i;
  for (let g = 0; g < nK; g++) for (let i = 0; i < dK; i++) order[at++] = g * G + dK + i;
  for (let h = 0; h < nV; h++) {
    const g = Math.floor(h / r);
    const j = h % r;
    for (let i = 0; i < dV; i++) order[at++] = g * G + 2 * dK + j * dV + i;
  }
  for (let h = 0; h < nV; h++) {
    const g = Math.floor(h / r);
    const j = h % r;
    for (let i = 0; i < dV; i++) order[at++] = g * G + 2 * dK + r * dV + j * dV + i;
  }
  assert(at === order.length, "legacy ssm_in row order covers every row");
  return order;
}

/**
 * The DeltaNet input projections of a qwen3next layer: the legacy fused `ssm_in` (uploaded in canonical row
 * order, {@linkcode legacyRowOrder}) or attn_qkv + attn_gate, then the grouped `ssm_ba`. Decode runs the
 * packed ones as one mat-vec into `inproj` ([qkv | z | ba]); a batched step writes that column per slot
 * ({@linkcode batchedInputs}).
 */
async function deltaNetInputs(
  g: GraphBuilder,
  cx: BuildContext,
  l: number,
  lw: LayerWeights,
  c0: GdnStepConstants,
): Promise<DeltaNetInputs> {
  const n = g.n;
  const A = cx.act;
  const d = gdnDims(c0);
  const nV = c0.N_V;
  const legacy = lw.layout === "ssm_in";
  const ws = legacy
    ? [lw.t("ssm_in"), lw.t("ssm_ba")]
    : [lw.t("attn_qkv"), lw.t("attn_gate"), lw.t("ssm_ba")];
  if (cx.batch || matvecColumns(g)) {
    const names = legacy ? ["ssm_in", "ssm_ba"] : ["attn_qkv", "attn_gate", "ssm_ba"];
    return await batchedInputs(g, cx, l, ws, names, c0, { aOff: 0, split: legacy ? d.convCh : undefined });
  }
  // One token: the packed ones as one mat-vec; a prefill chunk: each its own matmul.
  const fused = await fusedMatvec(g, `L${l}.in_proj`, ws, A.a!, A.inproj!, { joined: undefined });
  const nQkvz = legacy ? 1 : 2; // tensors holding qkv and z
  let xQkv: Binding = A.xqkv!;
  let z: Binding = A.z!;
  if (fused.length >= nQkvz) {
    xQkv = sub(A.inproj!, 0, d.convCh);
    z = sub(A.inproj!, d.convCh, d.inner);
  } else if (legacy) {
    const w = ws[0]!;
    await matvec(g, `L${l}.ssm_in.qkv`, w, A.a!, A.xqkv!, n, { rowStart: 0, rows: d.convCh });
    await matvec(g, `L${l}.ssm_in.z`, w, A.a!, A.z!, n, { rowStart: d.convCh, rows: d.inner });
  } else {
    await matvec(g, `L${l}.attn_qkv`, ws[0]!, A.a!, A.xqkv!, n);
    await matvec(g, `L${l}.attn_gate`, ws[1]!, A.a!, A.z!, n);
  }
  let ba: Binding = A.ba!;
  if (fused.length > nQkvz) {
    ba = sub(A.inproj!, d.convCh + d.inner, 2 * nV);
  } else {
    await matvec(g, `L${l}.ssm_ba`, ws[nQkvz]!, A.a!, A.ba!, n);
  }
  return { xQkv, z, b: ba, a: ba, aOff: 0 };
}

/** What qwen3next adds to the shared layer loop: its DeltaNet input projections and legacy row order. */
export const QWEN3NEXT_GRAPH: HybridModel = {
  deltaNetInputs,
  inProjRowOrder: (hp, layout) => layout === "ssm_in" ? legacyRowOrder(hp) : undefined,
};
