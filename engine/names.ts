/**
 * THE registry of GGUF names: every tensor-name pattern and metadata key the project reads or writes
 * (spec `qwen3next.md` §2, §4; `gguf.md` §4-5; `chat.md` §2). No other file spells a `blk.` name or a
 * metadata key; a test enforces it.
 * @module
 */

/** Tensor ids: pattern with `{L}` for the layer index, and the role the engine gives it. */
export const TENSORS = {
  token_embd: { pattern: "token_embd.weight", role: "embedding" },
  output_norm: { pattern: "output_norm.weight", role: "final norm" },
  output: { pattern: "output.weight", role: "LM head (absent: tied to token_embd)" },

  attn_norm: { pattern: "blk.{L}.attn_norm.weight", role: "pre-mixer RMSNorm" },
  post_attention_norm: { pattern: "blk.{L}.post_attention_norm.weight", role: "pre-FFN RMSNorm" },

  attn_q: { pattern: "blk.{L}.attn_q.weight", role: "query and output gate, interleaved per head" },
  attn_k: { pattern: "blk.{L}.attn_k.weight", role: "key projection" },
  attn_v: { pattern: "blk.{L}.attn_v.weight", role: "value projection" },
  attn_output: { pattern: "blk.{L}.attn_output.weight", role: "attention output projection" },
  attn_q_norm: { pattern: "blk.{L}.attn_q_norm.weight", role: "per-head q RMSNorm" },
  attn_k_norm: { pattern: "blk.{L}.attn_k_norm.weight", role: "per-head k RMSNorm" },

  ssm_in: { pattern: "blk.{L}.ssm_in.weight", role: "legacy fused qkvz projection (qwen3next)" },
  attn_qkv: {
    pattern: "blk.{L}.attn_qkv.weight",
    role: "DeltaNet q|k|v projection (or fused attention qkv)",
  },
  attn_gate: { pattern: "blk.{L}.attn_gate.weight", role: "DeltaNet z (output gate) projection" },
  ssm_ba: { pattern: "blk.{L}.ssm_ba.weight", role: "DeltaNet beta|alpha, grouped (qwen3next)" },
  ssm_beta: { pattern: "blk.{L}.ssm_beta.weight", role: "DeltaNet beta projection (qwen35moe)" },
  ssm_alpha: { pattern: "blk.{L}.ssm_alpha.weight", role: "DeltaNet alpha projection (qwen35moe)" },
  ssm_conv1d: { pattern: "blk.{L}.ssm_conv1d.weight", role: "causal depthwise conv taps" },
  ssm_dt: { pattern: "blk.{L}.ssm_dt.bias", role: "time-step bias" },
  ssm_a: { pattern: "blk.{L}.ssm_a", role: "-exp(A_log)" },
  ssm_norm: { pattern: "blk.{L}.ssm_norm.weight", role: "gated RMSNorm weight" },
  ssm_out: { pattern: "blk.{L}.ssm_out.weight", role: "DeltaNet output projection" },

  ffn_gate_inp: { pattern: "blk.{L}.ffn_gate_inp.weight", role: "MoE router" },
  ffn_gate_exps: { pattern: "blk.{L}.ffn_gate_exps.weight", role: "expert gate projections" },
  ffn_up_exps: { pattern: "blk.{L}.ffn_up_exps.weight", role: "expert up projections" },
  ffn_down_exps: { pattern: "blk.{L}.ffn_down_exps.weight", role: "expert down projections" },
  ffn_gate_up_exps: { pattern: "blk.{L}.ffn_gate_up_exps.weight", role: "fused expert gate|up" },
  ffn_gate_inp_shexp: { pattern: "blk.{L}.ffn_gate_inp_shexp.weight", role: "shared-expert gate logit" },
  ffn_gate_shexp: { pattern: "blk.{L}.ffn_gate_shexp.weight", role: "shared-expert gate projection" },
  ffn_up_shexp: { pattern: "blk.{L}.ffn_up_shexp.weight", role: "shared-expert up projection" },
  ffn_down_shexp: { pattern: "blk.{L}.ffn_down_shexp.weight", role: "shared-expert down projection" },

  nextn_eh_proj: { pattern: "blk.{L}.nextn.eh_proj.weight", role: "MTP (not run)" },
  nextn_enorm: { pattern: "blk.{L}.nextn.enorm.weight", role: "MTP (not run)" },
  nextn_hnorm: { pattern: "blk.{L}.nextn.hnorm.weight", role: "MTP (not run)" },
  nextn_shared_head_norm: { pattern: "blk.{L}.nextn.shared_head_norm.weight", role: "MTP (not run)" },
  nextn_embed_tokens: { pattern: "blk.{L}.nextn.embed_tokens.weight", role: "MTP (not run, optional)" },
  nextn_shared_head_head: {
    pattern: "blk.{L}.nextn.shared_head_head.weight",
    role: "MTP (not run, optional)",
  },
} as const;

/** A tensor id of the registry. */
export type TensorId = keyof typeof TENSORS;

/** The GGUF name of tensor `id` in `layer` (layer is required exactly when the pattern has `{L}`). */
export function tensorName(id: TensorId, layer?: number): string {
  const p: string = TENSORS[id].pattern;
  if (p.includes("{L}")) {
    if (layer === undefined || !Number.isInteger(layer) || layer < 0) {
      throw new RangeError(`Tensor ${id} needs a layer index, got ${layer}`);
    }
    return p.replace("{L}", String(layer));
  }
  if (layer !== undefined) throw new RangeError(`Tensor ${id} is global and takes no layer index`);
  return p;
}

/** Inverts {@linkcode tensorName}: the id and layer of a GGUF tensor name, or undefined when unknown. */
export function parseTensorName(name: string): { id: TensorId; layer?: number } | undefined {
  const m = /^blk\.(\d+)\.(.+)$/.exec(name);
  const layer = m ? Number(m[1]) : undefined;
  const probe = m ? `blk.{L}.${m[2]}` : name;
  for (const [id, t] of Object.entries(TENSORS)) {
    if (t.pattern === probe) {
      return layer === undefined ? { id: id as TensorId } : { id: id as TensorId, layer };
    }
  }
  return undefined;
}

/** Architecture-independent metadata keys. */
export const KEYS = {
  architecture: "general.architecture",
  name: "general.name",
  alignment: "general.alignment",
  fileType: "general.file_type",
  quantizationVersion: "general.quantization_version",
  splitNo: "split.no",
  splitCount: "split.count",
  splitTensorsCount: "split.tensors.count",

  tokModel: "tokenizer.ggml.model",
  tokPre: "tokenizer.ggml.pre",
  tokTokens: "tokenizer.ggml.tokens",
  tokTypes: "tokenizer.ggml.token_type",
  tokMerges: "tokenizer.ggml.merges",
  tokEos: "tokenizer.ggml.eos_token_id",
  tokBos: "tokenizer.ggml.bos_token_id",
  tokPad: "tokenizer.ggml.padding_token_id",
  tokAddBos: "tokenizer.ggml.add_bos_token",
  chatTemplate: "tokenizer.chat_template",
  tokEot: "tokenizer.ggml.eot_token_id",
  tokEom: "tokenizer.ggml.eom_token_id",
} as const;

/** Architecture-prefixed metadata keys: the full key is `${arch}.${suffix}`. */
export const ARCH_KEYS = {
  blockCount: "block_count",
  nextnPredictLayers: "nextn_predict_layers",
  contextLength: "context_length",
  embeddingLength: "embedding_length",
  feedForwardLength: "feed_forward_length",
  headCount: "attention.head_count",
  headCountKv: "attention.head_count_kv",
  keyLength: "attention.key_length",
  valueLength: "attention.value_length",
  rmsEps: "attention.layer_norm_rms_epsilon",
  attnScale: "attention.scale",
  recurrentLayers: "attention.recurrent_layers",
  ropeDimCount: "rope.dimension_count",
  ropeFreqBase: "rope.freq_base",
  ropeSections: "rope.dimension_sections",
  ropeScalingType: "rope.scaling.type",
  expertCount: "expert_count",
  expertUsedCount: "expert_used_count",
  expertFfLength: "expert_feed_forward_length",
  expertSharedFfLength: "expert_shared_feed_forward_length",
  expertWeightsScale: "expert_weights_scale",
  ssmConvKernel: "ssm.conv_kernel",
  ssmStateSize: "ssm.state_size",
  ssmGroupCount: "ssm.group_count",
  ssmTimeStepRank: "ssm.time_step_rank",
  ssmInnerSize: "ssm.inner_size",
  fullAttentionInterval: "full_attention_interval",
} as const;

/** An architecture-prefixed key id. */
export type ArchKeyId = keyof typeof ARCH_KEYS;

/** The full metadata key of `id` for architecture `arch` (e.g. `qwen3next.block_count`). */
export function archKey(arch: string, id: ArchKeyId): string {
  return `${arch}.${ARCH_KEYS[id]}`;
}

/** The layer index of any `blk.N.` tensor name, known to the registry or not (undefined for globals). */
export function tensorLayer(name: string): number | undefined {
  const m = /^blk\.(\d+)\./.exec(name);
  return m ? Number(m[1]) : undefined;
}
