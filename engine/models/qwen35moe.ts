/**
 * `qwen35moe` (Qwen3.5/3.6‑35B‑A3B): hyper-parameters and tensor list (spec `qwen3next.md`).
 * Same hybrid DeltaNet/attention + MoE stack as qwen3next, with three differences: IMRoPE sections (equal
 * to NeoX for text), DeltaNet value heads tiled over key heads (κ(h) = h mod n_k, spec §9), and separate
 * `ssm_beta`/`ssm_alpha` projections. Newer files append one MTP block (spec §12), listed and never run.
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
  mtpLayerTensors,
  readCommonHparams,
  SpecList,
  type TensorCheck,
  type TensorSpec,
} from "./_arch.ts";
import type { HybridModel } from "./_hybrid.ts";
import type { Binding } from "../../wgsl/kernel.ts";
import { type BuildContext, GraphBuilder, type LayerWeights, sub } from "../graph/builder.ts";
import { batchedInputs, type DeltaNetInputs } from "../blocks/deltanet.ts";
import { fusedMatvec, matvec, matvecColumns } from "../blocks/linear.ts";
import { gdnDims, type GdnStepConstants } from "../../wgsl/gdn_step.ts";

/** The one DeltaNet layout of qwen35moe files. */
const LAYOUTS: readonly DeltaNetLayout[] = ["qkv_beta_alpha"];

/**
 * κ of spec §9 for qwen35moe: the converter tiled the value heads, so value head `h` (file order) reads key
 * head h mod n_k; heads h and h + n_k share one key head.
 */
export function kvGroupOfVHead(hp: { ssmGroups: number; ssmDtRank: number }, h: number): number {
  return h % hp.ssmGroups;
}

/**
 * Reads qwen35moe hyper-parameters (IMRoPE sections required and checked to reduce to NeoX).
 * @throws {GgufError} code `bad_value` naming the key, its value and the constraint it breaks
 */
export function readHparams(meta: GgufMetadata): Hparams {
  return readCommonHparams(meta, "qwen35moe", { kvGroupOfVHead, ropeSections: "required" });
}

/** Every tensor a qwen35moe file may hold, the optional MTP block included (spec §4, §12). */
export function tensors(hp: Hparams): TensorSpec[] {
  const out = globalTensors(hp);
  const D = hp.nEmbd, nv = hp.ssmDtRank;
  for (let layer = 0; layer < hp.nLayer; layer++) {
    const l = new SpecList(layer);
    addLayerCommon(l, hp);
    if (hp.isAttention[layer]) addAttention(l, hp);
    else {
      l.add(
        "attn_qkv",
        [D, 2 * hp.ssmGroups * hp.ssmState + hp.ssmInner],
        from("embeddingLength", CONV_CHANNELS),
      )
        .add("attn_gate", [D, hp.ssmInner], from("embeddingLength", "ssmInnerSize"))
        .add("ssm_beta", [D, nv], from("embeddingLength", "ssmTimeStepRank"))
        .add("ssm_alpha", [D, nv], from("embeddingLength", "ssmTimeStepRank"));
      addDeltaNetCommon(l, hp);
    }
    out.push(...l.specs);
  }
  for (let layer = hp.nLayer; layer < hp.blockCount; layer++) out.push(...mtpLayerTensors(hp, layer));
  return out;
}

/**
 * Checks a qwen35moe file's tensors against {@linkcode tensors}.
 * @throws {GgufError} code `bad_tensor` on a missing, unknown, misshapen or mistyped tensor
 */
export function checkTensors(file: GgufFile, hp: Hparams): TensorCheck {
  return checkTensorList(file, hp, { specs: tensors(hp), accepted: LAYOUTS });
}

/** The qwen35moe architecture. */
export const QWEN35MOE: Arch = {
  name: "qwen35moe",
  deltaNetLayouts: LAYOUTS,
  readHparams,
  tensors,
  checkTensors,
};

/**
 * The DeltaNet input projections of a qwen35moe layer (`qkv_beta_alpha`): attn_qkv, attn_gate, ssm_beta and
 * ssm_alpha. Decode runs the packed ones as one mat-vec into `inproj` ([qkv | z | b | a]); a right after b
 * lets both bindings take the [b | a] range, the kernel reading a at word N_V of it (A_OFF). A batched step
 * writes that column per slot, a short chunk per token ({@linkcode batchedInputs}).
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
  const ws = [lw.t("attn_qkv"), lw.t("attn_gate"), lw.t("ssm_beta"), lw.t("ssm_alpha")];
  if (cx.batch || matvecColumns(g)) {
    const names = ["attn_qkv", "attn_gate", "ssm_beta", "ssm_alpha"];
    return await batchedInputs(g, cx, l, ws, names, c0, { joined: ws[3], aOff: nV });
  }
  // One token: the packed ones as one mat-vec; a prefill chunk: each its own matmul.
  const fused = await fusedMatvec(g, `L${l}.in_proj`, ws, A.a!, A.inproj!, { joined: ws[3] });
  let xQkv: Binding = A.xqkv!;
  let z: Binding = A.z!;
  if (fused.length >= 2) {
    xQkv = sub(A.inproj!, 0, d.convCh);
    z = sub(A.inproj!, d.convCh, d.inner);
  } else {
    await matvec(g, `L${l}.attn_qkv`, ws[0]!, A.a!, A.xqkv!, n);
    await matvec(g, `L${l}.attn_gate`, ws[1]!, A.a!, A.z!, n);
  }
  const baAt = d.convCh + d.inner;
  if (fused.length === 4) {
    const ba = sub(A.inproj!, baAt, 2 * nV);
    return { xQkv, z, b: ba, a: ba, aOff: nV };
  }
  let b: Binding = A.ba!;
  if (fused.length === 3) b = sub(A.inproj!, baAt, nV);
  else await matvec(g, `L${l}.ssm_beta`, ws[2]!, A.a!, A.ba!, n);
  await matvec(g, `L${l}.ssm_alpha`, ws[3]!, A.a!, A.alpha!, n);
  return { xQkv, z, b, a: A.alpha!, aOff: 0 };
}

/** What qwen35moe adds to the shared layer loop: its DeltaNet input projections. */
export const QWEN35MOE_GRAPH: HybridModel = { deltaNetInputs };
