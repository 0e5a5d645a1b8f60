/**
 * What both architectures share: the `Arch` contract, the hyper-parameter record, tensor specs, the
 * metadata readers with their range checks, and the tensor-list checker (spec `qwen3next.md` §1-§4, §12).
 * Private to `engine/models/`: each architecture file composes these and adds what is its own.
 * @module
 */
import { GgufError } from "../errors.ts";
import { GGUF_VALUE_TYPE, type GgufArray, type GgufFile, type GgufMetadata } from "../gguf.ts";
import {
  ARCH_KEYS,
  archKey,
  type ArchKeyId,
  KEYS,
  parseTensorName,
  type TensorId,
  tensorName,
} from "../names.ts";
import type { GgmlTypeName } from "../quant/types.ts";

/** The architectures this engine runs: their `general.architecture` strings. */
export type ArchName = "qwen35moe" | "qwen3next";

/**
 * How a DeltaNet layer stores its input projections on disk (spec `qwen3next.md` §4):
 * - `ssm_in`: legacy qwen3next, fused grouped `ssm_in` (q|k|v|z per key head) plus grouped `ssm_ba`;
 * - `qkv_ba`: current qwen3next converter, `attn_qkv` + `attn_gate` plus grouped `ssm_ba`;
 * - `qkv_beta_alpha`: qwen35moe, `attn_qkv` + `attn_gate` plus separate `ssm_beta` and `ssm_alpha`.
 */
export type DeltaNetLayout = "ssm_in" | "qkv_ba" | "qkv_beta_alpha";

/** Every DeltaNet layout, in the order the checker reports them. */
export const DELTANET_LAYOUTS: readonly DeltaNetLayout[] = ["ssm_in", "qkv_ba", "qkv_beta_alpha"];

/** Hyper-parameters of one model, read and range-checked from GGUF metadata (spec `qwen3next.md` §1-§3). */
export interface Hparams {
  /** `general.architecture`. */
  readonly arch: ArchName;
  /** Trained context length (`context_length`), informational. */
  readonly nCtxTrain: number;
  /** `block_count`: decoder layers plus MTP blocks. */
  readonly blockCount: number;
  /** Decoder layers run for generation: `block_count − nextn_predict_layers`. */
  readonly nLayer: number;
  /** MTP blocks appended after the decoder layers (`nextn_predict_layers`), never run. */
  readonly nextnLayers: number;
  /** Hidden size D. */
  readonly nEmbd: number;
  /** Vocabulary rows of `token_embd`/`output` (length of `tokenizer.ggml.tokens`). */
  readonly nVocab: number;
  /** Attention query heads. */
  readonly nHead: number;
  /** Attention KV heads (the value of the attention layers when the key is a per-layer array). */
  readonly nHeadKv: number;
  /** Attention head dim (`attention.key_length`, equal to `attention.value_length`). */
  readonly headDim: number;
  /** Rotary dims per head (NeoX pairing over the first `ropeDim` dims). */
  readonly ropeDim: number;
  /** Rope base θ. */
  readonly ropeBase: number;
  /** IMRoPE sections (qwen35moe; text-only they reduce to NeoX); empty for qwen3next. */
  readonly ropeSections: readonly number[];
  /** RMSNorm epsilon, also the l2-norm epsilon of DeltaNet q/k. */
  readonly rmsEps: number;
  /** Attention kq scale (`attention.scale`, default 1/√headDim). */
  readonly attnScale: number;
  /** Routed experts E. */
  readonly nExpert: number;
  /** Experts per token k_top. */
  readonly nExpertUsed: number;
  /** Routed expert FFN size F_e. */
  readonly nFfExp: number;
  /** Shared expert FFN size F_s. */
  readonly nFfShexp: number;
  /** Factor on the renormalized routing weights (1 when the key is absent or 0, spec §10). */
  readonly expertWeightsScale: number;
  /** DeltaNet causal conv kernel K_conv. */
  readonly ssmConv: number;
  /** DeltaNet value width n_v·d_v (`ssm.inner_size`). */
  readonly ssmInner: number;
  /** DeltaNet key head dim d_k (`ssm.state_size`), equal to the value head dim d_v. */
  readonly ssmState: number;
  /** DeltaNet key heads n_k (`ssm.group_count`). */
  readonly ssmGroups: number;
  /** DeltaNet value heads n_v (`ssm.time_step_rank`). */
  readonly ssmDtRank: number;
  /** Per decoder layer (length nLayer): true for full attention, false for gated DeltaNet. */
  readonly isAttention: readonly boolean[];
  /** κ of spec §9: the key head serving DeltaNet value head `h` (file order). */
  readonly kvGroupOfVHead: (h: number) => number;
}

/** Conv channels C = 2·n_k·d_k + n_v·d_v of a DeltaNet layer (spec §8.1). */
export function convChannels(hp: Pick<Hparams, "ssmGroups" | "ssmState" | "ssmInner">): number {
  return 2 * hp.ssmGroups * hp.ssmState + hp.ssmInner;
}

/** One tensor a model file must or may hold. */
export interface TensorSpec {
  /** Registry id. */
  readonly id: TensorId;
  /** Layer index for `blk.` tensors. */
  readonly layer?: number;
  /** GGUF name. */
  readonly name: string;
  /** Expected shape, innermost first (trailing 1s are insignificant). */
  readonly ne: readonly number[];
  /** Where each dimension comes from, for error messages (e.g. `embedding_length, ssm.time_step_rank`). */
  readonly neFrom: string;
  /** Accepted ggml types. */
  readonly dtypes: readonly GgmlTypeName[];
  /** May be absent even in a complete export (tied `output`, the extra MTP heads). */
  readonly optional: boolean;
  /** DeltaNet input layouts this tensor belongs to; absent: it belongs to every layout of its layer. */
  readonly layouts?: readonly DeltaNetLayout[];
  /** Part of an MTP block: never required, validated when present, never uploaded or run (spec §12). */
  readonly mtp: boolean;
}

/** What {@linkcode checkTensorList} found in a file that passed. */
export interface TensorCheck {
  /** Per decoder layer: the DeltaNet input layout, or undefined for attention layers. */
  readonly layouts: readonly (DeltaNetLayout | undefined)[];
  /** True when `output.weight` is absent and the LM head reuses `token_embd.weight`. */
  readonly tiedOutput: boolean;
  /** Names of the MTP tensors present (to be skipped by the loader). */
  readonly mtpTensors: readonly string[];
  /** The spec of every tensor present in the file, by name. */
  readonly specs: ReadonlyMap<string, TensorSpec>;
}

/** One architecture: metadata → hyper-parameters → tensor list → file check (STYLE.md). */
export interface Arch {
  /** `general.architecture`. */
  readonly name: ArchName;
  /** DeltaNet layouts files of this architecture may use; the first is the current converter's. */
  readonly deltaNetLayouts: readonly DeltaNetLayout[];
  /**
   * Reads and range-checks the hyper-parameters.
   * @throws {GgufError} code `bad_value` on a missing, mistyped or out-of-range key
   */
  readHparams(meta: GgufMetadata): Hparams;
  /** Every tensor a file may hold, layout alternatives and optional tensors included. */
  tensors(hp: Hparams): TensorSpec[];
  /**
   * Checks a file's tensor table against {@linkcode Arch.tensors} before anything is uploaded.
   * @throws {GgufError} code `bad_tensor` naming the first wrong tensor and how many problems there are
   */
  checkTensors(file: GgufFile, hp: Hparams): TensorCheck;
}

/** Every supported weight type (spec `quants.md`, last section: any of them may appear on any matrix). */
export const MATRIX_TYPES: readonly GgmlTypeName[] = [
  "F32",
  "F16",
  "BF16",
  "Q8_0",
  "Q4_0",
  "Q4_K",
  "Q5_K",
  "Q6_K",
  "IQ4_NL",
  "IQ4_XS",
];
/** Plain float types accepted for 1-D tensors and conv taps (the converter writes them unquantized). */
export const FLOAT_TYPES: readonly GgmlTypeName[] = ["F32", "F16", "BF16"];

// ---------------------------------------------------------------------------------------------------------
// Metadata readers

/** Reads the keys of one architecture with messages that name the key, the value and the fix. */
export class MetaReader {
  readonly #meta: GgufMetadata;
  readonly #arch: ArchName;
  readonly #path: string;

  /** @param meta file metadata; @param arch architecture prefix of every arch key */
  constructor(meta: GgufMetadata, arch: ArchName) {
    this.#meta = meta;
    this.#arch = arch;
    this.#path = meta.path;
  }

  /** Full key of an arch key id. */
  key(id: ArchKeyId): string {
    return archKey(this.#arch, id);
  }

  /** True when the arch key is present. */
  has(id: ArchKeyId): boolean {
    return this.#meta.has(this.key(id));
  }

  /** Error for a bad value of arch key `id`: `why` says what was expected. */
  bad(id: ArchKeyId | undefined, got: unknown, why: string): GgufError {
    const k = id === undefined ? "" : `Metadata ${this.key(id)} is ${fmt(got)}: `;
    return new GgufError("bad_value", `${k}${this.#arch} ${why}: re-export the GGUF (file ${this.#path})`, {
      path: this.#path,
    });
  }

  /** Required integer key, range-checked to [min, max]. */
  int(id: ArchKeyId, min: number, max: number): number {
    if (!this.has(id)) {
      throw new GgufError(
        "bad_value",
        `Metadata key ${this.key(id)} is missing but ${this.#arch} requires it: re-export the GGUF ` +
          `(file ${this.#path})`,
        { path: this.#path },
      );
    }
    return this.#range(id, this.#meta.getInt(this.key(id)), min, max);
  }

  /** Optional integer key: `fallback` when absent, else range-checked. */
  intOr(id: ArchKeyId, fallback: number, min: number, max: number): number {
    return this.has(id) ? this.#range(id, this.#meta.getInt(this.key(id)), min, max) : fallback;
  }

  /** Required float key, range-checked to [min, max]. */
  float(id: ArchKeyId, min: number, max: number): number {
    if (!this.has(id)) {
      throw new GgufError(
        "bad_value",
        `Metadata key ${this.key(id)} is missing but ${this.#arch} requires it: re-export the GGUF ` +
          `(file ${this.#path})`,
        { path: this.#path },
      );
    }
    return this.#range(id, this.#meta.getFloat(this.key(id)), min, max);
  }

  /** Optional float key. */
  floatOr(id: ArchKeyId, fallback: number, min: number, max: number): number {
    return this.has(id) ? this.#range(id, this.#meta.getFloat(this.key(id)), min, max) : fallback;
  }

  /** Integer array (or scalar read as a one-element array) of arch key `id`. */
  intArray(id: ArchKeyId): number[] {
    return this.#meta.getIntArray(this.key(id));
  }

  /** Bool or integer array of arch key `id` as numbers (true = 1): per-layer flags are written either way. */
  flagArray(id: ArchKeyId): number[] {
    const kv = this.#meta.entries.get(this.key(id));
    const isBool = kv !== undefined && (kv.type === GGUF_VALUE_TYPE.BOOL ||
      (kv.type === GGUF_VALUE_TYPE.ARRAY && (kv.value as GgufArray).elemType === GGUF_VALUE_TYPE.BOOL));
    return isBool ? this.#meta.getBoolArray(this.key(id)).map(Number) : this.intArray(id);
  }

  /** Optional string arch key. */
  stringOr(id: ArchKeyId, fallback: string): string {
    return this.has(id) ? this.#meta.getString(this.key(id)) : fallback;
  }

  /** Length of the vocabulary (`tokenizer.ggml.tokens`). */
  vocabSize(): number {
    if (!this.#meta.has(KEYS.tokTokens)) {
      throw new GgufError(
        "bad_value",
        `Metadata key ${KEYS.tokTokens} is missing: ${this.#arch} needs the vocabulary to size token_embd; ` +
          `re-export the GGUF with its tokenizer (file ${this.#path})`,
        { path: this.#path },
      );
    }
    return this.#meta.getStringArray(KEYS.tokTokens).length;
  }

  #range(id: ArchKeyId, v: number, min: number, max: number): number {
    if (!Number.isFinite(v) || v < min || v > max) {
      throw this.bad(id, v, `needs a value in [${min}, ${max}]`);
    }
    return v;
  }
}

function fmt(v: unknown): string {
  return Array.isArray(v) ? `[${v.join(", ")}]` : String(v);
}

/** Arch-specific parts of {@linkcode readCommonHparams}. */
export interface HparamsOptions {
  /** κ of spec §9 for this architecture. */
  readonly kvGroupOfVHead: (hp: { ssmGroups: number; ssmDtRank: number }, h: number) => number;
  /**
   * `rope.dimension_sections`: required (IMRoPE, qwen35moe) or optional (NeoX, qwen3next: absent in its
   * files, accepted when present only if it reduces to NeoX like IMRoPE does for text).
   */
  readonly ropeSections: "required" | "optional";
}

/**
 * Reads every hyper-parameter both architectures share, with the defaults and checks of spec §2-§3.
 * @throws {GgufError} code `bad_value` naming the key, its value and the constraint it breaks
 */
export function readCommonHparams(meta: GgufMetadata, arch: ArchName, opts: HparamsOptions): Hparams {
  const r = new MetaReader(meta, arch);
  const got = meta.has(KEYS.architecture) ? meta.getString(KEYS.architecture) : "(missing)";
  if (got !== arch) {
    throw new GgufError(
      "bad_value",
      `Metadata ${KEYS.architecture} is "${got}" but the ${arch} reader was asked to load it: ` +
        `pick the architecture from the file (file ${meta.path})`,
      { path: meta.path },
    );
  }
  const U = 1 << 20; // generous upper bound for dims: catches garbage (u32 wrap, negative i32) only

  const blockCount = r.int("blockCount", 1, 4096);
  // Absent in older files and in qwen3next: no MTP block (spec §2, §12).
  const nextnLayers = r.intOr("nextnPredictLayers", 0, 0, blockCount - 1);
  const nLayer = blockCount - nextnLayers;
  const nCtxTrain = r.int("contextLength", 1, 1 << 30);
  const nEmbd = r.int("embeddingLength", 1, U);
  const nVocab = r.vocabSize();
  if (nVocab < 1) throw r.bad(undefined, nVocab, `needs a non-empty ${KEYS.tokTokens}`);

  const nHead = r.int("headCount", 1, 4096);
  const headDim = r.int("keyLength", 1, 4096); // required: nEmbd / nHead is wrong here (spec §2)
  const valueLength = r.int("valueLength", 1, 4096);
  if (valueLength !== headDim) {
    throw r.bad(
      "valueLength",
      valueLength,
      `needs ${r.key("valueLength")} == ${r.key("keyLength")} = ${headDim}`,
    );
  }
  const isAttention = readLayerPattern(r, blockCount, nLayer);
  const nHeadKv = readHeadCountKv(r, blockCount, isAttention, nHead);
  const ropeDim = r.int("ropeDimCount", 2, headDim);
  if (ropeDim % 2 !== 0) throw r.bad("ropeDimCount", ropeDim, "needs an even number of rotary dims");
  // No default: θ differs between the two model families (spec §1), a guess would silently garble.
  const ropeBase = r.float("ropeFreqBase", 1, 1e12);
  const scaling = r.stringOr("ropeScalingType", "none");
  if (scaling !== "none") {
    throw r.bad(
      "ropeScalingType",
      scaling,
      "is supported only without rope scaling (YaRN etc. not implemented)",
    );
  }
  const ropeSections = readRopeSections(r, opts.ropeSections, ropeDim);
  const rmsEps = r.float("rmsEps", 1e-12, 1e-2);
  // Default kq scale is 1/√headDim (spec §7.6); the key is absent in published files.
  const attnScale = r.floatOr("attnScale", 1 / Math.sqrt(headDim), 1e-6, 1e3);

  const nExpert = r.int("expertCount", 1, 65536);
  const nExpertUsed = r.int("expertUsedCount", 1, nExpert);
  let nFfExp: number;
  if (r.has("expertFfLength")) nFfExp = r.int("expertFfLength", 1, U);
  else {
    // Fallback of spec §2: older converters wrote only feed_forward_length = k_top·F_e.
    const ff = r.int("feedForwardLength", 1, U);
    if (ff % nExpertUsed !== 0) {
      throw r.bad("feedForwardLength", ff, `lacks ${r.key("expertFfLength")} and is not a multiple of k_top`);
    }
    nFfExp = ff / nExpertUsed;
  }
  const nFfShexp = r.int("expertSharedFfLength", 1, U);
  // Absent or 0 means "do not scale" (L5 build_moe_ffn); stored as 1 so the multiply is unconditional.
  const ews = r.floatOr("expertWeightsScale", 0, 0, 1e6);
  const expertWeightsScale = ews === 0 ? 1 : ews;

  const ssmConv = r.int("ssmConvKernel", 2, 64);
  const ssmState = r.int("ssmStateSize", 1, 4096);
  const ssmGroups = r.int("ssmGroupCount", 1, 4096);
  const ssmDtRank = r.int("ssmTimeStepRank", 1, 4096);
  const ssmInner = r.int("ssmInnerSize", 1, U);
  if (ssmDtRank % ssmGroups !== 0) {
    throw r.bad(
      "ssmTimeStepRank",
      ssmDtRank,
      `needs value heads (${r.key("ssmTimeStepRank")}) to be a multiple of key heads ` +
        `(${r.key("ssmGroupCount")} = ${ssmGroups})`,
    );
  }
  if (ssmInner !== ssmDtRank * ssmState) {
    throw r.bad(
      "ssmInnerSize",
      ssmInner,
      `needs d_k == d_v, i.e. ${r.key("ssmInnerSize")} == ${r.key("ssmTimeStepRank")} · ` +
        `${r.key("ssmStateSize")} = ${ssmDtRank} · ${ssmState} = ${ssmDtRank * ssmState}`,
    );
  }

  const partial = { ssmGroups, ssmDtRank };
  return {
    arch,
    nCtxTrain,
    blockCount,
    nLayer,
    nextnLayers,
    nEmbd,
    nVocab,
    nHead,
    nHeadKv,
    headDim,
    ropeDim,
    ropeBase,
    ropeSections,
    rmsEps,
    attnScale,
    nExpert,
    nExpertUsed,
    nFfExp,
    nFfShexp,
    expertWeightsScale,
    ssmConv,
    ssmInner,
    ssmState,
    ssmGroups,
    ssmDtRank,
    isAttention,
    kvGroupOfVHead: (h: number) => opts.kvGroupOfVHead(partial, h),
  };
}

/** Per-layer attention flags (spec §3): `attention.recurrent_layers` when present, else the interval rule. */
function readLayerPattern(r: MetaReader, blockCount: number, nLayer: number): boolean[] {
  let isAttention: boolean[];
  if (r.has("recurrentLayers")) {
    const rec = r.flagArray("recurrentLayers");
    if (rec.length !== blockCount && rec.length !== nLayer) {
      throw r.bad(
        "recurrentLayers",
        `an array of ${rec.length}`,
        `needs one entry per layer (${r.key("blockCount")} = ${blockCount})`,
      );
    }
    isAttention = rec.slice(0, nLayer).map((v) => v === 0);
  } else {
    // Absent in some files: 4 is the value of every published model (spec §2).
    const interval = r.intOr("fullAttentionInterval", 4, 1, 4096);
    isAttention = Array.from({ length: nLayer }, (_, i) => (i + 1) % interval === 0);
  }
  return isAttention;
}

/** KV heads: scalar, or per-layer array whose attention-layer entries must agree (spec §2). */
function readHeadCountKv(r: MetaReader, blockCount: number, isAttention: boolean[], nHead: number): number {
  const arr = r.has("headCountKv") ? r.intArray("headCountKv") : undefined;
  if (arr === undefined) {
    throw r.bad("headCountKv", "missing", `requires ${r.key("headCountKv")}`);
  }
  let values: number[];
  if (arr.length === 1) values = [arr[0]!];
  else {
    if (arr.length !== blockCount) {
      throw r.bad("headCountKv", arr, `needs a scalar or one entry per layer (${blockCount})`);
    }
    values = arr.filter((_, i) => isAttention[i] === true);
  }
  const first = values[0];
  if (first === undefined) return arr[0] ?? 1; // no attention layer: the value is never used
  if (values.some((v) => v !== first)) {
    throw r.bad("headCountKv", arr, "needs the same KV head count on every attention layer");
  }
  if (first < 1 || nHead % first !== 0) {
    throw r.bad("headCountKv", first, `needs a divisor of ${r.key("headCount")} = ${nHead}`);
  }
  return first;
}

/** IMRoPE sections reducing to NeoX for text: required (qwen35moe) or optional (qwen3next, default none). */
function readRopeSections(r: MetaReader, mode: "required" | "optional", ropeDim: number): number[] {
  if (!r.has("ropeSections")) {
    if (mode === "optional") return [];
    throw r.bad("ropeSections", "missing", "requires IMRoPE sections");
  }
  const s = r.intArray("ropeSections");
  const sum = s.reduce((a, b) => a + b, 0);
  // Text-only input feeds one position to the t/h/w streams; the rotation equals NeoX exactly when the
  // sections cover every rotary pair and the 4th (extra) stream gets none (spec §7.4).
  if (s.length !== 4 || s.some((v) => v < 0) || sum !== ropeDim / 2 || s[3] !== 0) {
    throw r.bad(
      "ropeSections",
      s,
      `supports 4 sections summing to ${r.key("ropeDimCount")}/2 = ${ropeDim / 2} with the last one 0`,
    );
  }
  return s;
}

// ---------------------------------------------------------------------------------------------------------
// Tensor lists

/** Builds tensor specs for one layer (or the globals, layer undefined). */
export class SpecList {
  readonly specs: TensorSpec[] = [];
  readonly #layer: number | undefined;
  readonly #mtp: boolean;

  /** @param layer layer index, undefined for global tensors; @param mtp whether the layer is an MTP block */
  constructor(layer: number | undefined, mtp = false) {
    this.#layer = layer;
    this.#mtp = mtp;
  }

  /** Adds a tensor; `neFrom` names each dimension's source for messages. */
  add(
    id: TensorId,
    ne: readonly number[],
    neFrom: string,
    opts: { dtypes?: readonly GgmlTypeName[]; optional?: boolean; layouts?: readonly DeltaNetLayout[] } = {},
  ): this {
    const spec: TensorSpec = {
      id,
      name: tensorName(id, this.#layer),
      ne,
      neFrom,
      dtypes: opts.dtypes ?? (ne.length === 1 ? FLOAT_TYPES : MATRIX_TYPES),
      optional: opts.optional ?? false,
      mtp: this.#mtp,
      ...(this.#layer === undefined ? {} : { layer: this.#layer }),
      ...(opts.layouts === undefined ? {} : { layouts: opts.layouts }),
    };
    this.specs.push(spec);
    return this;
  }
}

/** `ne` source text: one entry per dimension, each an arch key id or an expression built with {@linkcode k}. */
export function from(...parts: (ArchKeyId | string)[]): string {
  return parts.map((p) => (p in ARCH_KEYS ? ARCH_KEYS[p as ArchKeyId] : p)).join(", ");
}

/** The key suffix of arch key `id`, for expressions in `ne` sources. */
export function k(id: ArchKeyId): string {
  return ARCH_KEYS[id];
}

/** `ne` source text of the vocabulary dimension. */
const VOCAB = `length of ${KEYS.tokTokens}`;

/** The global tensors (spec §4 "Global"). */
export function globalTensors(hp: Hparams): TensorSpec[] {
  return new SpecList(undefined)
    .add("token_embd", [hp.nEmbd, hp.nVocab], from("embeddingLength", VOCAB))
    .add("output_norm", [hp.nEmbd], from("embeddingLength"))
    // Absent means tied to token_embd (spec §11).
    .add("output", [hp.nEmbd, hp.nVocab], from("embeddingLength", VOCAB), { optional: true })
    .specs;
}

/** Norms and MoE FFN tensors every layer has (spec §4 "Every layer"). */
export function addLayerCommon(l: SpecList, hp: Hparams): void {
  const D = hp.nEmbd, E = hp.nExpert, Fe = hp.nFfExp, Fs = hp.nFfShexp;
  l.add("attn_norm", [D], from("embeddingLength"))
    .add("post_attention_norm", [D], from("embeddingLength"))
    .add("ffn_gate_inp", [D, E], from("embeddingLength", "expertCount"))
    .add("ffn_gate_exps", [D, Fe, E], from("embeddingLength", "expertFfLength", "expertCount"))
    .add("ffn_up_exps", [D, Fe, E], from("embeddingLength", "expertFfLength", "expertCount"))
    .add("ffn_down_exps", [Fe, D, E], from("expertFfLength", "embeddingLength", "expertCount"))
    // [D] or [D, 1] (trailing 1s compare equal); never quantized in stock files but any type is decodable.
    .add("ffn_gate_inp_shexp", [D], from("embeddingLength"), { dtypes: MATRIX_TYPES })
    .add("ffn_gate_shexp", [D, Fs], from("embeddingLength", "expertSharedFfLength"))
    .add("ffn_up_shexp", [D, Fs], from("embeddingLength", "expertSharedFfLength"))
    .add("ffn_down_shexp", [Fs, D], from("expertSharedFfLength", "embeddingLength"));
}

/** The extra tensors of a full-attention layer (spec §4, §7). */
export function addAttention(l: SpecList, hp: Hparams): void {
  const D = hp.nEmbd, qd = hp.nHead * hp.headDim, kvd = hp.nHeadKv * hp.headDim;
  l.add("attn_q", [D, 2 * qd], from("embeddingLength", `2·${k("headCount")}·${k("keyLength")}`))
    .add("attn_k", [D, kvd], from("embeddingLength", `${k("headCountKv")}·${k("keyLength")}`))
    .add("attn_v", [D, kvd], from("embeddingLength", `${k("headCountKv")}·${k("keyLength")}`))
    .add("attn_output", [qd, D], from(`${k("headCount")}·${k("keyLength")}`, "embeddingLength"))
    .add("attn_q_norm", [hp.headDim], from("keyLength"))
    .add("attn_k_norm", [hp.headDim], from("keyLength"));
}

/** `ne` source text of the DeltaNet conv channel count C. */
export const CONV_CHANNELS = `2·${k("ssmGroupCount")}·${k("ssmStateSize")} + ${k("ssmInnerSize")}`;

/** The DeltaNet tensors common to every layout (spec §4 table, last six rows). */
export function addDeltaNetCommon(l: SpecList, hp: Hparams): void {
  const D = hp.nEmbd, C = convChannels(hp);
  l.add("ssm_conv1d", [hp.ssmConv, C], from("ssmConvKernel", CONV_CHANNELS), {
    dtypes: FLOAT_TYPES,
  })
    .add("ssm_dt", [hp.ssmDtRank], from("ssmTimeStepRank"))
    .add("ssm_a", [hp.ssmDtRank], from("ssmTimeStepRank"))
    .add("ssm_norm", [hp.ssmState], from("ssmStateSize"))
    .add("ssm_out", [hp.ssmInner, D], from("ssmInnerSize", "embeddingLength"));
}

/** The tensors of MTP block `layer` (spec §12): an attention layer plus the nextn tensors. */
export function mtpLayerTensors(hp: Hparams, layer: number): TensorSpec[] {
  const D = hp.nEmbd;
  const l = new SpecList(layer, true);
  addLayerCommon(l, hp);
  addAttention(l, hp);
  l.add("nextn_eh_proj", [2 * D, D], from(`2·${k("embeddingLength")}`, "embeddingLength"))
    .add("nextn_enorm", [D], from("embeddingLength"))
    .add("nextn_hnorm", [D], from("embeddingLength"))
    .add("nextn_shared_head_norm", [D], from("embeddingLength"))
    // Written by some converters only; the trunk's token_embd/output serve otherwise.
    .add("nextn_embed_tokens", [D, hp.nVocab], from("embeddingLength", VOCAB), { optional: true })
    .add("nextn_shared_head_head", [D, hp.nVocab], from("embeddingLength", VOCAB), { optional: true });
  return l.specs;
}

// ---------------------------------------------------------------------------------------------------------
// Checking a file

/** Minimal view of a tensor info the checker needs. */
interface TensorView {
  readonly name: string;
  readonly type: { readonly name: string };
  readonly ne: readonly number[];
}

/** Drops trailing 1s so that [D] and [D, 1] compare equal (ggml treats them alike). */
function trimNe(ne: readonly number[]): number[] {
  const out = [...ne];
  while (out.length > 1 && out[out.length - 1] === 1) out.pop();
  return out;
}

function neText(ne: readonly number[]): string {
  return `ne=[${ne.join(", ")}]`;
}

/**
 * Checks `file` against `specs`: every required tensor present, nothing unknown, shapes and types right,
 * exactly one accepted DeltaNet layout per DeltaNet layer.
 * @throws {GgufError} code `bad_tensor` with the first problem and the number of others
 */
export function checkTensorList(
  file: Pick<GgufFile, "path" | "tensors">,
  hp: Hparams,
  opts: { specs: readonly TensorSpec[]; accepted: readonly DeltaNetLayout[] },
): TensorCheck {
  const arch = hp.arch;
  const problems: string[] = [];
  const tensors = file.tensors as ReadonlyMap<string, TensorView>;
  const byName = new Map(opts.specs.map((s) => [s.name, s]));

  // 1. Detect each DeltaNet layer's layout from which distinguishing tensors exist (L1 build_qkvz).
  const layouts: (DeltaNetLayout | undefined)[] = [];
  for (let layer = 0; layer < hp.nLayer; layer++) {
    if (hp.isAttention[layer]) {
      layouts.push(undefined);
      continue;
    }
    const present = (id: TensorId) => tensors.has(tensorName(id, layer));
    const found: DeltaNetLayout = present("ssm_in")
      ? "ssm_in"
      : present("ssm_beta") || present("ssm_alpha")
      ? "qkv_beta_alpha"
      : present("attn_qkv") || present("ssm_ba")
      ? "qkv_ba"
      : opts.accepted[0]!;
    if (!opts.accepted.includes(found)) {
      problems.push(
        `Layer ${layer} stores its DeltaNet inputs as "${found}" but ${arch} files use ` +
          `${opts.accepted.map((a) => `"${a}"`).join(" or ")} (spec qwen3next.md §4): re-export the GGUF ` +
          `with a current converter`,
      );
    }
    layouts.push(found);
  }

  // 2. Every expected tensor of the chosen layouts, then everything the file holds beyond them.
  const specs = new Map<string, TensorSpec>();
  for (const s of opts.specs) {
    const lay = s.layer === undefined ? undefined : layouts[s.layer];
    const inLayout = s.layouts === undefined || (lay !== undefined && s.layouts.includes(lay));
    const t = tensors.get(s.name);
    if (!t) {
      if (inLayout && !s.optional && !s.mtp) {
        problems.push(
          `Tensor ${s.name} is missing but ${arch} requires it (${neText(s.ne)}: ${s.neFrom}` +
            `${lay === undefined ? "" : `, DeltaNet layout "${lay}"`}): re-export the GGUF`,
        );
      }
      continue;
    }
    if (!inLayout) {
      problems.push(
        `Tensor ${s.name} does not belong to layer ${s.layer}'s DeltaNet layout "${lay}" ` +
          `(it is part of ${
            s.layouts!.map((a) => `"${a}"`).join(", ")
          }): the file mixes layouts; re-export the GGUF`,
      );
      continue;
    }
    const ne = trimNe(t.ne);
    if (ne.join() !== trimNe(s.ne).join()) {
      problems.push(
        `Tensor ${s.name} has ${neText(t.ne)} but ${arch} expects ${
          neText(s.ne)
        } (${s.neFrom}): re-export the GGUF`,
      );
    }
    if (!(s.dtypes as readonly string[]).includes(t.type.name)) {
      problems.push(
        `Tensor ${s.name} has type ${t.type.name} but ${arch} accepts ${s.dtypes.join(", ")} for it: ` +
          `re-quantize with a supported type`,
      );
    }
    specs.set(s.name, s);
  }
  for (const name of tensors.keys()) {
    if (byName.has(name)) continue;
    const p = parseTensorName(name);
    const what = p === undefined ? "an unknown tensor name" : `registry id ${p.id}, not used by ${arch}`;
    problems.push(
      `Tensor ${name} (${what}) is not part of a ${arch} model: the file is not a plain ${arch} export`,
    );
  }

  if (problems.length > 0) {
    const more = problems.length > 1
      ? ` (and ${problems.length - 1} more problem(s), next: ${problems[1]})`
      : "";
    throw new GgufError("bad_tensor", `${problems[0]}${more} (file ${file.path})`, { path: file.path });
  }
  const mtpTensors = [...specs.values()].filter((s) => s.mtp).map((s) => s.name);
  return { layouts, tiedOutput: !tensors.has(tensorName("output")), mtpTensors, specs };
}
