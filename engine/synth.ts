/**
 * Synthetic models: GGUF files with the metadata keys, tensor names, shapes and per-tensor types of the
 * real published models (spec `qwen3next.md` §1-§4, §12; `quants.md` last section) and random weights at
 * sane scales. The plan (metadata + tensor list + types) is computed without any data, so full-size
 * presets can be checked for names, shapes and types without writing 20 GB.
 *
 * @example
 * ```ts
 * import { planModel, synthesize } from "./synth.ts";
 * const plan = planModel({ arch: "qwen35moe", preset: "tiny", quant: "q8_0", seed: 1 });
 * const { paths, mbPerSecond } = await synthesize(plan, { out: "/tmp/tiny.gguf" });
 * ```
 * @module
 */
import type { GgufKv } from "./gguf.ts";
import { GGUF_VALUE_TYPE, GgufMetadata } from "./gguf.ts";
import { kv, writeGguf, writeGgufSplit } from "./gguf_write.ts";
import { ARCHES, type ArchName, type DeltaNetLayout, type Hparams, type TensorSpec } from "./models/mod.ts";
import { archKey, type ArchKeyId, KEYS, type TensorId } from "./names.ts";
import { dequantize, fillRandomBlocks, quantize, RandomState } from "./quant/mod.ts";
import { type GgmlTypeName, typeInfo } from "./quant/types.ts";
import { type SpecialSet, synthVocab, TEMPLATE_QWEN35, TEMPLATE_QWEN3NEXT } from "./_synth_vocab.ts";

/** Model sizes: `tiny` = the llama.cpp fixtures' dims; the others = the real models' dims (spec §1). */
export type Preset = "tiny" | "35b-a3b" | "80b-a3b";
/** Every preset. */
export const PRESETS: readonly Preset[] = ["tiny", "35b-a3b", "80b-a3b"];

/** Quantization recipes: `iq4_xs` = a stock llama-quantize IQ4_XS file; others put one type on matrices. */
export type QuantPreset =
  | "f32"
  | "f16"
  | "bf16"
  | "q8_0"
  | "q4_0"
  | "q4_k"
  | "q5_k"
  | "q6_k"
  | "iq4_nl"
  | "iq4_xs";
/** Every quantization recipe. */
export const QUANT_PRESETS: readonly QuantPreset[] = [
  "f32",
  "f16",
  "bf16",
  "q8_0",
  "q4_0",
  "q4_k",
  "q5_k",
  "q6_k",
  "iq4_nl",
  "iq4_xs",
];

/** What to synthesize. */
export interface SynthOptions {
  /** Architecture (`general.architecture`). */
  readonly arch: ArchName;
  /** Dimensions. */
  readonly preset: Preset;
  /** Per-tensor type recipe. */
  readonly quant: QuantPreset;
  /** Seed of every random value (32-bit). */
  readonly seed: number;
  /** DeltaNet input layout: the architecture's current converter layout (default) or qwen3next's legacy one. */
  readonly layout?: "current" | "legacy";
  /** Append one MTP block (spec §12): `block_count` + 1 and `nextn_predict_layers` = 1. */
  readonly mtp?: boolean;
  /**
   * Routed experts instead of the preset's (tests: `tiny` with 64, where the router's output for the shared
   * expert's gate starts 256-byte aligned, so the engine fuses the two router mat-vecs as on real models).
   */
  readonly nExpert?: number;
}

/** How a tensor's values are drawn. */
export type InitKind = "norm" | "ssm_a" | "ssm_dt" | "conv" | "embedding" | "output" | "matrix";

/** One tensor of a plan: its spec, chosen type and size, and how to fill it. */
export interface PlannedTensor {
  /** The architecture's spec of this tensor. */
  readonly spec: TensorSpec;
  /** Chosen ggml type. */
  readonly type: GgmlTypeName;
  /** Data bytes. */
  readonly nbytes: number;
  /** Value distribution. */
  readonly init: InitKind;
}

/** Everything a file will hold except the tensor data. */
export interface SynthPlan {
  /** The options planned for. */
  readonly options: SynthOptions;
  /** Metadata in file order. */
  readonly kv: ReadonlyArray<readonly [string, GgufKv]>;
  /** Hyper-parameters the architecture reads back from {@linkcode SynthPlan.kv}. */
  readonly hparams: Hparams;
  /** DeltaNet input layout of every DeltaNet layer. */
  readonly layout: DeltaNetLayout;
  /** Tensors in file order. */
  readonly tensors: readonly PlannedTensor[];
  /** Sum of the tensors' data bytes. */
  readonly totalBytes: number;
}

/** Dimensions of one preset (the metadata values written). */
interface PresetDims {
  readonly nLayer: number;
  readonly nEmbd: number;
  readonly nVocab: number;
  readonly nCtxTrain: number;
  /** `feed_forward_length`: written when defined (present and unused in the fixtures and in Qwen3‑Next). */
  readonly feedForwardLength?: number;
  readonly nHead: number;
  readonly nHeadKv: number;
  readonly headDim: number;
  readonly ropeDim: number;
  readonly ropeBase: number;
  readonly nExpert: number;
  readonly nExpertUsed: number;
  readonly nFfExp: number;
  readonly nFfShexp: number;
  readonly ssmConv: number;
  readonly ssmState: number;
  readonly ssmGroups: number;
  readonly ssmDtRank: number;
  readonly interval: number;
  readonly specials: SpecialSet;
}

/** Preset dimensions: `tiny` from `shared/fixtures/README.md`, the others from spec §1 and `chat.md` §2-§3. */
const DIMS: Readonly<Record<Preset, PresetDims>> = {
  tiny: {
    nLayer: 4,
    nEmbd: 256,
    nVocab: 1024,
    nCtxTrain: 4096,
    feedForwardLength: 1024,
    nHead: 4,
    nHeadKv: 1,
    headDim: 256,
    ropeDim: 64,
    ropeBase: 1e7,
    nExpert: 8,
    nExpertUsed: 2,
    nFfExp: 256,
    nFfShexp: 256,
    ssmConv: 4,
    ssmState: 128,
    ssmGroups: 2,
    ssmDtRank: 4,
    interval: 4,
    specials: { kind: "tiny" },
  },
  "35b-a3b": {
    nLayer: 40,
    nEmbd: 2048,
    nVocab: 248320,
    nCtxTrain: 262144,
    nHead: 16,
    nHeadKv: 2,
    headDim: 256,
    ropeDim: 64,
    ropeBase: 1e7,
    nExpert: 256,
    nExpertUsed: 8,
    nFfExp: 512,
    nFfShexp: 512,
    ssmConv: 4,
    ssmState: 128,
    ssmGroups: 16,
    ssmDtRank: 32,
    interval: 4,
    specials: { kind: "qwen", base: 248044, pad: 248055 },
  },
  "80b-a3b": {
    nLayer: 48,
    nEmbd: 2048,
    nVocab: 151936,
    nCtxTrain: 262144,
    feedForwardLength: 5120,
    nHead: 16,
    nHeadKv: 2,
    headDim: 256,
    ropeDim: 64,
    ropeBase: 5e6,
    nExpert: 512,
    nExpertUsed: 10,
    nFfExp: 512,
    nFfShexp: 512,
    ssmConv: 4,
    ssmState: 128,
    ssmGroups: 16,
    ssmDtRank: 32,
    interval: 4,
    specials: { kind: "qwen", base: 151643, pad: 151643 },
  },
};

/** What differs per architecture in a synthesized file (the "tiny fixture in the synthesizer", STYLE.md). */
interface ArchSynth {
  /** `tokenizer.ggml.pre`. */
  readonly pre: string;
  /** `tokenizer.chat_template`. */
  readonly template: string;
  /** IMRoPE sections written as `rope.dimension_sections`, or none. */
  readonly ropeSections?: readonly number[];
}

const ARCH_SYNTH: Readonly<Record<ArchName, ArchSynth>> = {
  qwen3next: { pre: "qwen2", template: TEMPLATE_QWEN3NEXT },
  qwen35moe: { pre: "qwen35", template: TEMPLATE_QWEN35, ropeSections: [11, 11, 10, 0] },
};

/** `general.file_type` (llama_ftype) of each recipe. */
const FILE_TYPE: Readonly<Record<QuantPreset, number>> = {
  f32: 0,
  f16: 1,
  bf16: 32,
  q8_0: 7,
  q4_0: 2,
  q4_k: 15,
  q5_k: 17,
  q6_k: 18,
  iq4_nl: 25,
  iq4_xs: 30,
};

/** Matrix type of each recipe. */
const MATRIX_TYPE: Readonly<Record<QuantPreset, GgmlTypeName>> = {
  f32: "F32",
  f16: "F16",
  bf16: "BF16",
  q8_0: "Q8_0",
  q4_0: "Q4_0",
  q4_k: "Q4_K",
  q5_k: "Q5_K",
  q6_k: "Q6_K",
  iq4_nl: "IQ4_NL",
  iq4_xs: "IQ4_XS",
};

/** Tensors the converter forces to F32 whatever the recipe (spec `quants.md`, last section). */
const ALWAYS_F32: ReadonlySet<TensorId> = new Set<TensorId>([
  "ffn_gate_inp",
  "ssm_conv1d",
  "ffn_gate_inp_shexp",
]);

/** Value distributions of the tensors that are not plain matrices. */
const INIT: Readonly<Partial<Record<TensorId, InitKind>>> = {
  attn_norm: "norm",
  post_attention_norm: "norm",
  output_norm: "norm",
  attn_q_norm: "norm",
  attn_k_norm: "norm",
  ssm_norm: "norm",
  nextn_enorm: "norm",
  nextn_hnorm: "norm",
  nextn_shared_head_norm: "norm",
  ssm_a: "ssm_a",
  ssm_dt: "ssm_dt",
  ssm_conv1d: "conv",
  token_embd: "embedding",
  nextn_embed_tokens: "embedding",
  output: "output",
  nextn_shared_head_head: "output",
};

/**
 * The type a recipe gives one tensor. `iq4_xs` follows llama-quantize's stock rules (spec `quants.md`):
 * `output` Q6_K, `attn_v` Q5_K when n_head/n_head_kv ≥ 4, every other matrix IQ4_XS (the imatrix variant:
 * no Q5_K on the first layers' `ffn_down`). Rows that are not whole blocks fall back to IQ4_NL, then F16.
 */
export function tensorType(quant: QuantPreset, spec: TensorSpec, hp: Hparams): GgmlTypeName {
  if (quant === "f32" || spec.ne.length === 1 || ALWAYS_F32.has(spec.id)) return "F32";
  let t = MATRIX_TYPE[quant];
  if (quant === "iq4_xs") {
    if (spec.id === "output" || spec.id === "nextn_shared_head_head") t = "Q6_K";
    else if (spec.id === "attn_v" && hp.nHead / hp.nHeadKv >= 4) t = "Q5_K";
  }
  const ne0 = spec.ne[0]!;
  if (ne0 % typeInfo(t).blockElems === 0) return t;
  return ne0 % 32 === 0 ? "IQ4_NL" : "F16";
}

/** Metadata of a synthesized model, in the order llama.cpp's converter writes it. */
function buildKv(opts: SynthOptions): [string, GgufKv][] {
  const d = opts.nExpert === undefined ? DIMS[opts.preset] : { ...DIMS[opts.preset], nExpert: opts.nExpert };
  const a = ARCH_SYNTH[opts.arch];
  const k = (id: ArchKeyId) => archKey(opts.arch, id);
  const blockCount = d.nLayer + (opts.mtp ? 1 : 0);
  const vocab = synthVocab(d.nVocab, d.specials, opts.seed);
  const out: [string, GgufKv][] = [
    [KEYS.architecture, kv.str(opts.arch)],
    [KEYS.name, kv.str(`synth-${opts.arch}-${opts.preset}-${opts.quant}`)],
    [k("contextLength"), kv.u32(d.nCtxTrain)],
    [k("embeddingLength"), kv.u32(d.nEmbd)],
    [k("blockCount"), kv.u32(blockCount)],
  ];
  if (d.feedForwardLength !== undefined) out.push([k("feedForwardLength"), kv.u32(d.feedForwardLength)]);
  out.push(
    [k("headCount"), kv.u32(d.nHead)],
    [k("headCountKv"), kv.u32(d.nHeadKv)],
    [k("keyLength"), kv.u32(d.headDim)],
    [k("valueLength"), kv.u32(d.headDim)],
    [k("ropeFreqBase"), kv.f32(d.ropeBase)],
    [k("ropeDimCount"), kv.u32(d.ropeDim)],
  );
  if (a.ropeSections) out.push([k("ropeSections"), kv.arr(GGUF_VALUE_TYPE.INT32, a.ropeSections)]);
  out.push(
    [k("rmsEps"), kv.f32(1e-6)],
    [k("expertCount"), kv.u32(d.nExpert)],
    [k("expertUsedCount"), kv.u32(d.nExpertUsed)],
    [k("expertFfLength"), kv.u32(d.nFfExp)],
    [k("expertSharedFfLength"), kv.u32(d.nFfShexp)],
    [k("ssmConvKernel"), kv.u32(d.ssmConv)],
    [k("ssmStateSize"), kv.u32(d.ssmState)],
    [k("ssmGroupCount"), kv.u32(d.ssmGroups)],
    [k("ssmTimeStepRank"), kv.u32(d.ssmDtRank)],
    [k("ssmInnerSize"), kv.u32(d.ssmDtRank * d.ssmState)],
    [k("fullAttentionInterval"), kv.u32(d.interval)],
  );
  if (opts.mtp) out.push([k("nextnPredictLayers"), kv.u32(1)]);
  out.push(
    [KEYS.tokModel, kv.str("gpt2")],
    [KEYS.tokPre, kv.str(a.pre)],
    [KEYS.tokTokens, kv.arr(GGUF_VALUE_TYPE.STRING, vocab.tokens)],
    [KEYS.tokTypes, kv.arr(GGUF_VALUE_TYPE.INT32, vocab.types)],
    [KEYS.tokMerges, kv.arr(GGUF_VALUE_TYPE.STRING, vocab.merges)],
    [KEYS.tokEos, kv.u32(vocab.eos)],
    [KEYS.tokPad, kv.u32(vocab.pad)],
    [KEYS.tokBos, kv.u32(vocab.bos)],
    [KEYS.tokAddBos, kv.bool(false)],
    [KEYS.chatTemplate, kv.str(a.template)],
    [KEYS.quantizationVersion, kv.u32(2)],
    [KEYS.fileType, kv.u32(FILE_TYPE[opts.quant])],
  );
  return out;
}

/**
 * Plans a model: metadata, then the architecture's own tensor list (read back through its `readHparams`,
 * so the plan cannot drift from what the loader expects) narrowed to one DeltaNet layout, with types.
 * @throws {RangeError} on a layout the architecture does not accept
 */
export function planModel(opts: SynthOptions): SynthPlan {
  const arch = ARCHES[opts.arch];
  const kvs = buildKv(opts);
  const hparams = arch.readHparams(new GgufMetadata(new Map(kvs), `<synth ${opts.arch} ${opts.preset}>`));
  const layout: DeltaNetLayout = opts.layout === "legacy" ? "ssm_in" : arch.deltaNetLayouts[0]!;
  if (!arch.deltaNetLayouts.includes(layout)) {
    throw new RangeError(
      `Layout "${opts.layout}" (${layout}) is not a ${opts.arch} layout: ${opts.arch} files use ` +
        `${arch.deltaNetLayouts.join(", ")}; use --layout current`,
    );
  }
  const tensors: PlannedTensor[] = [];
  for (const spec of arch.tensors(hparams)) {
    if (spec.layouts !== undefined && !spec.layouts.includes(layout)) continue;
    // Optional tensors are the extra MTP heads; `output` is optional only because it may be tied.
    if (spec.optional && spec.id !== "output") continue;
    const type = tensorType(opts.quant, spec, hparams);
    const nElems = spec.ne.reduce((a, b) => a * b, 1);
    const info = typeInfo(type);
    tensors.push({
      spec,
      type,
      nbytes: (nElems / info.blockElems) * info.blockBytes,
      init: INIT[spec.id] ?? "matrix",
    });
  }
  const totalBytes = tensors.reduce((a, t) => a + t.nbytes, 0);
  return { options: opts, kv: kvs, hparams, layout, tensors, totalBytes };
}

/** Options of {@linkcode synthesize}. */
export interface SynthesizeOptions {
  /** Output path (`.gguf`); with `splitParts` > 1 the parts are `<out minus .gguf>-0000i-of-0000K.gguf`. */
  readonly out: string;
  /** Number of split parts (default 1: one file). */
  readonly splitParts?: number;
  /** Called after each tensor's data is written. */
  readonly onTensor?: (done: number, total: number, bytesDone: number) => void;
  /**
   * Matrices with at most this many elements get per-element N(0, 1/K) values, quantized; bigger ones and
   * every IQ4_XS and IQ4_NL matrix are random blocks at the same std (default 4 Mi elements; tests pass 0 to exercise
   * the streaming path on `tiny`). Norms, conv, `ssm_a`, `ssm_dt` and routers are always drawn per element.
   */
  readonly explicitMaxElems?: number;
  /** Bytes per streamed chunk of random blocks (default 16 MiB; rounded up to whole blocks). */
  readonly chunkBytes?: number;
}

/** What {@linkcode synthesize} wrote. */
export interface SynthResult {
  /** Files written. */
  readonly paths: string[];
  /** Tensor data bytes written. */
  readonly dataBytes: number;
  /** Wall time. */
  readonly seconds: number;
  /** Data throughput. */
  readonly mbPerSecond: number;
}

/** Elements at or under which a tensor's values are drawn one by one and quantized (all of `tiny`). */
const EXPLICIT_MAX_ELEMS = 1 << 22;
/**
 * Types whose reference quantizer searches scales per block (~1 µs a weight): even tiny's 8 M weights would
 * take seconds, so their matrices are always streamed random blocks.
 */
const SEARCHING_QUANTIZERS: ReadonlySet<GgmlTypeName> = new Set<GgmlTypeName>(["IQ4_XS", "IQ4_NL"]);
/** Chunk of random blocks streamed per write (two of them alternate so filling overlaps writing). */
const CHUNK_BYTES = 16 * 1024 * 1024;

/**
 * Writes the planned model with random weights. Norms, routers, conv taps and small matrices (all of `tiny`
 * except IQ4_XS and IQ4_NL ones) get values drawn per element and quantized; big matrices are streamed as random blocks
 * at a calibrated std, a chunk at a time, never holding a whole tensor in memory.
 */
export async function synthesize(plan: SynthPlan, opts: SynthesizeOptions): Promise<SynthResult> {
  const t0 = performance.now();
  let done = 0, bytesDone = 0;
  const tensors = plan.tensors.map((t, i) => ({
    name: t.spec.name,
    type: t.type,
    ne: t.spec.ne,
    data: async (sink: (c: Uint8Array) => Promise<void>) => {
      await produce(t, tensorSeed(plan.options.seed, i), sink, {
        explicitMaxElems: opts.explicitMaxElems ?? EXPLICIT_MAX_ELEMS,
        chunkBytes: opts.chunkBytes ?? CHUNK_BYTES,
      });
      bytesDone += t.nbytes;
      opts.onTensor?.(++done, plan.tensors.length, bytesDone);
    },
  }));
  const spec = { kv: plan.kv, tensors };
  const parts = opts.splitParts ?? 1;
  let paths: string[];
  if (parts > 1) paths = await writeGgufSplit(opts.out.replace(/\.gguf$/, ""), spec, parts);
  else {
    await writeGguf(opts.out, spec);
    paths = [opts.out];
  }
  const seconds = (performance.now() - t0) / 1000;
  return {
    paths,
    dataBytes: plan.totalBytes,
    seconds,
    mbPerSecond: plan.totalBytes / 1e6 / Math.max(seconds, 1e-9),
  };
}

/** Independent seed per tensor, so a tensor's values do not depend on the others or on chunking. */
function tensorSeed(seed: number, index: number): number {
  return (Math.imul(seed ^ 0x3c6ef372, 0x9e3779b1) + Math.imul(index + 1, 0x85ebca6b)) >>> 0;
}

async function produce(
  t: PlannedTensor,
  seed: number,
  sink: (c: Uint8Array) => Promise<void>,
  opts: { explicitMaxElems: number; chunkBytes: number },
): Promise<void> {
  const nElems = t.spec.ne.reduce((a, b) => a * b, 1);
  const rs = new RandomState(seed);
  const isMatrix = t.init === "matrix" || t.init === "embedding" || t.init === "output";
  if (!isMatrix || (nElems <= opts.explicitMaxElems && !SEARCHING_QUANTIZERS.has(t.type))) {
    await sink(quantize(t.type, drawValues(t, nElems, rs)));
    return;
  }
  const info = typeInfo(t.type);
  const scale = blockScale(t.type, targetStd(t));
  // Whole blocks, a multiple of 8 bytes (fillRandomBlocks' chunking-invariance condition), ≥ CHUNK_BYTES.
  const unit = info.blockBytes * 8;
  const chunkBytes = Math.ceil(opts.chunkBytes / unit) * unit;
  const bufs = [
    new Uint8Array(Math.min(chunkBytes, t.nbytes)),
    new Uint8Array(Math.min(chunkBytes, t.nbytes)),
  ];
  let pending: Promise<void> | undefined;
  for (let off = 0, k = 0; off < t.nbytes; off += chunkBytes, k ^= 1) {
    const n = Math.min(chunkBytes, t.nbytes - off);
    const buf = bufs[k]!.subarray(0, n);
    fillRandomBlocks(t.type, buf, { scale, state: rs });
    await pending; // the other buffer's write; this one was filled meanwhile
    pending = sink(buf);
  }
  await pending;
}

/** Standard deviation of a matrix's elements: N(0, 1/√K) keeps activations O(1) (K = ne0, the dot length). */
function targetStd(t: PlannedTensor): number {
  switch (t.init) {
    case "embedding":
      return 1;
    case "output":
      return 3 / Math.sqrt(t.spec.ne[0]!); // logits of std ~3: clear top-1 gaps for greedy tests
    default:
      return 1 / Math.sqrt(t.spec.ne[0]!);
  }
}

const unitStd = new Map<GgmlTypeName, number>();

/** The `scale` for fillRandomBlocks giving elements of std `std`, measured once per type on decoded blocks. */
function blockScale(type: GgmlTypeName, std: number): number {
  let s = unitStd.get(type);
  if (s === undefined) {
    const info = typeInfo(type);
    const nBlocks = Math.max(1, Math.ceil(65536 / info.blockElems));
    const bytes = new Uint8Array(nBlocks * info.blockBytes);
    fillRandomBlocks(type, bytes, { scale: 1, state: new RandomState(1) });
    const v = dequantize(type, bytes, nBlocks * info.blockElems);
    let sq = 0;
    for (const x of v) sq += x * x;
    s = Math.sqrt(sq / v.length);
    unitStd.set(type, s);
  }
  return std / s;
}

/** Values of one tensor drawn per element (spec-motivated ranges: norms near 1, ssm_a < 0, small dt). */
function drawValues(t: PlannedTensor, n: number, rs: RandomState): Float32Array {
  const out = new Float32Array(n);
  const words = new Uint32Array(n + (n & 1));
  rs.fillWords(words);
  const U = 1 / 4294967296;
  switch (t.init) {
    case "norm": // GGUF norm weights include the +1 offset (spec §4)
      for (let i = 0; i < n; i++) out[i] = 0.8 + 0.4 * words[i]! * U;
      return out;
    case "ssm_a": // −exp(A_log) with A in [0.5, 2]: per-token decay exp(ssm_a·softplus(·)) stays in (0, 1)
      for (let i = 0; i < n; i++) out[i] = -(0.5 + 1.5 * words[i]! * U);
      return out;
    case "ssm_dt":
      for (let i = 0; i < n; i++) out[i] = words[i]! * U - 0.5;
      return out;
    case "conv":
      return normals(out, words, 0.5);
    case "embedding":
    case "output":
    case "matrix":
      return normals(out, words, targetStd(t));
    default: {
      const never: never = t.init;
      throw new Error(`Internal error: init ${String(never)}`);
    }
  }
}

/** Fills `out` with N(0, std²) from pairs of random words (Box-Muller, both outputs used). */
function normals(out: Float32Array, words: Uint32Array, std: number): Float32Array {
  const U = 1 / 4294967296, n = out.length;
  for (let i = 0; i < n; i += 2) {
    const r = std * Math.sqrt(-2 * Math.log(1 - words[i]! * U));
    const phi = 2 * Math.PI * words[i + 1]! * U;
    out[i] = r * Math.cos(phi);
    if (i + 1 < n) out[i + 1] = r * Math.sin(phi);
  }
  return out;
}
