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
