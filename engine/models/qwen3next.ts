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
