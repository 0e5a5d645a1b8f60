/**
 * A pipeline stage: the forward pass of layers `[a, b)` of a `qwen35moe` / `qwen3next` model on the GPU,
 * with per-slot state (KV caches, conv rings, recurrent states) and snapshots.
 *
 * The first stage embeds token ids, the last produces logits; a middle or last stage takes hidden rows.
 * A chunk of n tokens is one compute pass whose dispatches are built once per (slot, n, output) and cached:
 * the per-step values (position, token count) live in GPU buffers, so the same dispatches serve every step.
 *
 * @example
 * ```ts
 * const gpu = await acquireGpu();
 * const file = await openGguf("model.gguf");
 * const stage = await Stage.load(gpu, file, { nCtx: 4096, nSlots: 1 });
 * const logits = await stage.run(0, { tokens: [1, 2, 3] }, 0); // ne=[nVocab, 1]: the last position
 * ```
 * @module
 */
import type { Gpu } from "./gpu/device.ts";
import { bindGroup, type Binding, type ConstValues, type KernelSpec, PipelineCache } from "../wgsl/kernel.ts";
import { type GpuTensor, PACK_ALIGN_BYTES, type UploadProgress, uploadTensors } from "./gpu/weights.ts";
import { SlotStates, type StateSpec } from "./state.ts";
import type { GgufFile } from "./gguf.ts";
import { type TensorId, tensorName } from "./names.ts";
import { archOf, type DeltaNetLayout, type Hparams, type TensorCheck } from "./models/mod.ts";
import type { GgmlTypeName } from "./quant/types.ts";
import { assert } from "./errors.ts";
import { ReadbackRing } from "./gpu/readback.ts";
import {
  isGreedy,
  SAMPLE_HIST,
  sampleConstantsFor,
  sampleParamWords,
  type SamplingParams,
  unusedTokenMask,
} from "./sampling.ts";
import { packSampleState, SAMPLE, sampleBindGroups, sampleGrids, sampleVariants } from "../wgsl/sample.ts";
import { KEYS } from "./names.ts";
import {
  ARGMAX,
  argmaxBindGroups,
  type ArgmaxConstants,
  argmaxGrids,
  argmaxVariants,
} from "../wgsl/argmax.ts";
import {
  ARGMAX_TOPK,
  argmaxTopkBindGroups,
  type ArgmaxTopkConstants,
  argmaxTopkGrids,
  argmaxTopkVariants,
} from "../wgsl/argmax_topk.ts";
import { GET_ROWS, getRowsConstants, getRowsGrid, getRowsParams } from "../wgsl/get_rows.ts";
import { RMS_NORM, rmsNormBindGroup, type RmsNormConstants, rmsNormGrid } from "../wgsl/rms_norm.ts";
import { MATVEC, matvecConstants, matvecGrid, matvecParams, type MatvecShape } from "../wgsl/matvec.ts";
import {
  checkGroupedMatmul,
  groupedMatmulConstants,
  groupedMatmulGrid,
  groupedMatmulParams,
  type GroupedMatmulShape,
  groupedMatmulWorkgroupBytes,
  MATMUL,
  MATMUL_SPLITS,
  matmulPlan,
  type MatmulShape,
} from "../wgsl/matmul.ts";
import {
  checkMoeGroup,
  MOE_GROUP,
  moeGroupGrid,
  moeGroupParams,
  type MoeGroupShape,
  moeGroupWords,
} from "../wgsl/moe_group.ts";
import { normBindings } from "../wgsl/matvec.ts";
import {
  checkMatvecQ8,
  checkMatvecQ8Fused,
  checkQuantizeQ8,
  decodeQ8x,
  MATVEC_Q8,
  MATVEC_Q8_FUSED,
  MATVEC_Q8_TYPES,
  type MatvecQ8Bindings,
  matvecQ8Constants,
  type MatvecQ8FusedBindings,
  matvecQ8FusedConstants,
  type MatvecQ8FusedShape,
  matvecQ8FusedWorkgroupBytes,
  matvecQ8Grid,
  matvecQ8Params,
  type MatvecQ8Shape,
  q8Layout,
  q8xBytes,
  QUANTIZE_Q8,
  type QuantizeQ8Bindings,
  quantizeQ8Constants,
  quantizeQ8Grid,
  quantizeQ8Params,
  type QuantizeQ8Shape,
} from "../wgsl/matvec_q8.ts";
import {
  MOE_MATVEC,
  moeMatvecConstants,
  moeMatvecGrid,
  moeMatvecParams,
  type MoeMatvecShape,
} from "../wgsl/moe_matvec.ts";
import {
  checkMoeMatvecQ8,
  MOE_MATVEC_Q8,
  type MoeMatvecQ8Bindings,
  moeMatvecQ8Constants,
  moeMatvecQ8Fits,
  moeMatvecQ8Grid,
} from "../wgsl/moe_matvec_q8.ts";
import {
  MOE_ROUTE,
  moeRouteBindGroup,
  type MoeRouteConstants,
  moeRouteGrid,
  moeRouteWorkgroupBytes,
  moeWeightsScale,
} from "../wgsl/moe_route.ts";
import { RESIDUAL_ADD, type ResidualAddConstants, residualAddGrid } from "../wgsl/residual_add.ts";
import {
  ATTN_QK_ROPE,
  attnQkRopeBindGroup,
  type AttnQkRopeConstants,
  attnQkRopeGrid,
} from "../wgsl/attn_qk_rope.ts";
import {
  ATTN_DECODE,
  attnDecodeBindGroup,
  type AttnDecodeConstants,
  attnDecodeGrid,
} from "../wgsl/attn_decode.ts";
import {
  ATTN_COMBINE,
  attnCombineBindGroup,
  type AttnCombineConstants,
  attnCombineGrid,
} from "../wgsl/attn_combine.ts";
import {
  ATTN_PREFILL,
  attnPrefillBindGroup,
  type AttnPrefillConstants,
  attnPrefillGrid,
} from "../wgsl/attn_prefill.ts";
import {
  checkGdnStep,
  GDN_STEP,
  GDN_STEP_BINDINGS,
  gdnDims,
  type GdnStepBindings,
  type GdnStepConstants,
  gdnStepGrid,
  gdnStepNeedsNorm,
} from "../wgsl/gdn_step.ts";
import {
  GDN_CHUNK_NORM,
  GDN_CHUNK_NORM_BINDINGS,
  gdnChunkDispatches,
  gdnChunkScratchBytes,
} from "../wgsl/gdn_chunk.ts";
import {
  checkGdnConvRing,
  GDN_CONV_RING,
  GDN_CONV_RING_BINDINGS,
  type GdnConvRingConstants,
  gdnConvRingGrid,
} from "../wgsl/gdn_conv_ring.ts";

/** One recorded dispatch: everything `pass.dispatchWorkgroups` needs. */
export interface Op {
  /** Kernel and layer, for debugging and per-op timing. */
  readonly label: string;
  /** Pipeline of the kernel variant. */
  readonly pipeline: GPUComputePipeline;
  /** Bind group 0. */
  readonly bindGroup: GPUBindGroup;
  /** Workgroups in x, y, z. */
  readonly grid: readonly [number, number, number];
}

/** Records `ops` in order into `pass` (dispatches in one pass see each other's writes in order). */
export function encodeOps(pass: GPUComputePassEncoder, ops: readonly Op[]): void {
  for (const op of ops) {
    pass.setPipeline(op.pipeline);
    pass.setBindGroup(0, op.bindGroup);
    pass.dispatchWorkgroups(op.grid[0], op.grid[1], op.grid[2]);
  }
}

/** Options of {@linkcode Stage.load}. */
export interface StageOptions {
  /** Layer range `[a, b)` of the decoder layers (default: all). */
  readonly layers?: readonly [number, number];
  /** Positions per slot (KV cache capacity). */
  readonly nCtx: number;
  /** Concurrent sequences. */
  readonly nSlots: number;
  /** Tokens per prefill chunk (default 64). */
  readonly maxChunk?: number;
  /**
   * Tallest decode mat-vec (rows) that computes a preceding RMSNorm in its prologue; taller ones get the norm as
   * a dispatch of its own (default 16384, from the H200 measurements in docs/PERF.md; 0: never fuse).
   */
  readonly normPrologueMaxRows?: number;
  /**
   * TEAM/ROWS of the expert mat-vecs (gate·up and down), overriding `moeMatvecConstants`' defaults: a
   * benchmark knob (bench/moe.ts finds candidates, bench/decode.ts --moe-* measures them in a whole step).
   */
  readonly moeTuning?: {
    readonly gateUp?: { readonly team: number; readonly rows: number };
    readonly down?: { readonly team: number; readonly rows: number };
  };
  /**
   * TEAM/ROWS of the batch-1 (decode) mat-vecs, overriding `matvecConstants`' defaults: a benchmark knob
   * (bench/matvec.ts finds candidates, bench/decode.ts --matvec measures them in a whole step). A TEAM other
   * than the default changes the rows' summation order, so batched steps no longer give their solo bits.
   */
  readonly matvecTuning?: { readonly team?: number; readonly rows?: number };
  /**
   * Decode (one token) routes the experts in the prologue of the routed gate·up pass (moe_matvec ROUTE)
   * instead of in a moe_route dispatch of its own. Default off: every gate·up workgroup then repeats the
   * ranking, and the whole step measured slower on the H200 (191.0-191.6 against 196.1 tok/s, docs/PERF.md).
   */
  readonly fuseDecodeRoute?: boolean;
  /**
   * Prefill chunks wider than 8 tokens run the routed experts (and the packed shared one) as one grouped
   * matmul per pass: moe_group lists each expert's columns, and matmul GROUPED reads each expert's weights
   * once per tile of its tokens instead of once per column (moe_matvec). Default off until measured on the
   * H200 (docs/ARCHITECTURE.md); the results differ from moe_matvec's by f32 summation order only.
   */
  readonly groupedExperts?: boolean;
  /**
   * Mat-vec chunks (at most 8 columns: decode, batched decode, short prefill chunks) of Q8_0, Q4_K, Q5_K, Q6_K and IQ4_XS
   * weights take x rounded to int8 per 32 elements (quantize_q8, then matvec_q8's integer dot products, as
   * llama.cpp's quantized mat-vecs do) instead of f32; the router's mat-vecs keep f32. Expert passes of such
   * weights take int8 x too (moe_matvec_q8; moe_route rounds the experts' input, the down pass its own x),
   * except with fuseDecodeRoute. Wider (prefill) chunks round x the same way (quantize_q8 ROUND) and feed the
   * rounded f32 values to the f32 matmul and moe_matvec, so every chunk width rounds alike. On the H200 the whole decode step
   * measured 212.7 / 214.3 against 196.6 / 198.1 tok/s without it (docs/PERF.md, tenth session). It is still off by
   * default: it changes the default numerics, which is a step of its own. The rounding is a different one: `RefModelOptions.int8Activations` in tests/ref/forward.ts mirrors it, and checks the
   * decisions this stage logs with `int8Log`. Each column is its own dispatch (matvec_q8_fused, which
   * quantizes x in its prologue), so batched steps keep their solo bits. Default off.
   */
  readonly int8Activations?: boolean;
  /**
   * Test hook for int8Activations: every quantize_q8 of a graph writes a region of its own in one log buffer
   * (the mat-vecs after it read from there), and {@linkcode Stage.int8Log} returns the last `run()`'s
   * rounding decisions, so that a reference can check them and continue with the same ones.
   */
  readonly int8Log?: boolean;
  /** Upload progress. */
  readonly onProgress?: (p: UploadProgress) => void;
}

/** Input of one chunk: token ids (first stage) or hidden rows ne=[nEmbd, nTokens] (later stages). */
export type StageInput = { readonly tokens: readonly number[] } | {
  readonly hidden: Float32Array<ArrayBuffer>;
  readonly nTokens: number;
};

/** What a run returns: logits of the last stage, or hidden rows for the next stage. */
export interface StageOutput {
  /** `logits` ne=[nVocab, rows] (last stage) or `hidden` ne=[nEmbd, rows]. */
  readonly kind: "logits" | "hidden";
  /** Values, f32. */
  readonly data: Float32Array<ArrayBuffer>;
  /** Rows in `data`: every input token, or only the last one. */
  readonly rows: number;
}

/** Options of {@linkcode Stage.generate}. */
export interface GenerateOptions {
  /** Tokens to generate (≥ 1). */
  readonly nNew: number;
  /** Also return the `top` highest logits of every step (1..64; 0 = none). */
  readonly top?: number;
  /** Token ids that end generation (included in the output); later tokens are dropped. */
  readonly stopIds?: readonly number[];
  /**
   * Sampling on the GPU (penalties → top-k → top-p → min-p → temperature → seeded draw); absent or greedy
   * (temperature 0, top_k 1): the argmax path, ties to the lowest id.
   */
  readonly sampling?: SamplingParams;
  /** Sampler RNG step to start at (a request continued over several calls keeps one random stream). */
  readonly samplerStep?: number;
  /** Ids the penalties look back on (default: the prompt); the last 256 are kept. */
  readonly samplerHistory?: readonly number[];
  /** Decode steps per readback (ids stream back in batches of this many; default 8). */
  readonly batch?: number;
  /** Called with each batch of new ids as they land. */
  readonly onTokens?: (ids: readonly number[]) => void;
  /**
   * Continue the slot's sequence: `prompt` is appended at this position, which must equal the slot's length
   * (default 0: the slot is reset and `prompt` is the whole sequence).
   */
  readonly base?: number;
  /**
   * Ends generation after the batch that is landing when it fires (a stop string matched, a client left);
   * the tokens emitted so far are kept and the slot state is rewound to match them exactly.
   */
  readonly signal?: AbortSignal;
}

/** Result of {@linkcode Stage.generate}. */
export interface GenerateResult {
  /** Generated ids (greedy), ending at a stop id when one was hit. */
  readonly tokens: number[];
  /** Per generated token, the `top` highest `[id, logit]` pairs of its step, highest first. */
  readonly top: [number, number][][];
  /** Why generation ended. */
  readonly reason: "length" | "stop" | "context" | "cancelled";
  /** Decode steps run (≥ tokens − 1: steps past a stop are dropped and the state is rewound). */
  readonly steps: number;
}

/** Buffer usage of every activation and state buffer. */
const STORAGE = GPUBufferUsage.STORAGE | GPUBufferUsage.COPY_SRC | GPUBufferUsage.COPY_DST;
/** Widest chunk the mat-vec kernel takes (its batch limit); wider chunks use the tiled matmul. */
const MATVEC_MAX_COLS = 8;
/** Size of the int8Log buffer (the tiny test models log a few hundred KiB per chunk). */
const INT8_LOG_BYTES = 16 << 20;

/** Where one quantize_q8 of a graph logged its output (StageOptions.int8Log). */
interface Int8LogEntry {
  readonly label: string;
  readonly col: number;
  readonly k: number;
  readonly type: GgmlTypeName;
  readonly offset: number;
}

/** One logged rounding: the mat-vec it fed, the column, x's int8 values (element order) and scales. */
export interface Int8Logged {
  /** The mat-vec's label (`L<layer>.<tensor>...` or `output`). */
  readonly label: string;
  /** The column (token of the chunk, or slot of a batched step). */
  readonly col: number;
  /** int8 values in element order. */
  readonly q: Int8Array;
  /** Per 32 elements, the scale d (x ≈ d·q). */
  readonly d: Float32Array;
}
/** Most slots one batched decode step takes (the mat-vec's column limit: one weight read for all). */
export const MAX_BATCH_SLOTS: number = MATVEC_MAX_COLS;
/** Splits of the decode attention: enough workgroups to fill a GPU at long context, a fixed grid. */
const ATTN_SPLITS = 32;

interface LayerWeights {
  readonly attention: boolean;
  readonly layout: DeltaNetLayout | undefined;
  readonly t: (id: TensorId) => GpuTensor;
}

/** The GPU forward pass of one layer range; see the module doc. */
export class Stage {
  /** Hyper-parameters of the whole model. */
  readonly hp: Hparams;
  /** Decoder layers `[a, b)` this stage runs. */
  readonly layers: readonly [number, number];
  /** Whether this stage embeds tokens (a == 0). */
  readonly first: boolean;
  /** Whether this stage produces logits (b == nLayer). */
  readonly last: boolean;
  /** Positions per slot. */
  readonly nCtx: number;
  /** Tokens per chunk. */
  readonly maxChunk: number;
  /** See {@linkcode StageOptions.normPrologueMaxRows}. */
  readonly normPrologueMaxRows: number;
  /** See {@linkcode StageOptions.int8Activations}. */
  readonly int8Activations: boolean;
  /** Slot state buffers (KV caches, conv rings, recurrent states) and snapshots. */
  readonly states: SlotStates;
  /** Bytes of weights on the GPU. */
  readonly weightBytes: number;
  /**
   * Whether {@linkcode Stage.generateBatch} can run several slots in one step: every per-slot activation row
   * (hidden, q/k/v, DeltaNet input and output) starts at a bindable (256-byte) offset. True for the published
   * shapes and the tiny presets.
   */
  readonly canBatch: boolean;

  readonly #gpu: Gpu;
  readonly #cache: PipelineCache;
  readonly #weights: ReadonlyMap<string, GpuTensor>;
  readonly #layers: readonly LayerWeights[];
  readonly #tiedOutput: boolean;
  readonly #act: Record<string, GPUBuffer>;
  readonly #posParams: readonly GPUBuffer[];
  readonly #zeroIds: GPUBuffer;
  readonly #graphs = new Map<string, Op[]>();
  readonly #moeTuning: StageOptions["moeTuning"];
  readonly #matvecTuning: StageOptions["matvecTuning"];
  readonly #fuseDecodeRoute: boolean;
  readonly #groupedExperts: boolean;
  /** int8Log: the log buffer, each graph's entries, and the graph of the last run() chunk. */
  readonly #int8Log: { buffer: GPUBuffer; entries: Map<string, Int8LogEntry[]>; last?: string } | undefined;
  readonly #decoders = new Map<string, Decoder>();
  readonly #selectors = new Map<string, Selector>();
  readonly #batchGraphs = new Map<string, { ops: Op[]; pos: GPUBuffer[] }>();
  /** Per slot: the id its batched steps embed (written by its selector). */
  readonly #slotTok: readonly GPUBuffer[];
  /** Small buffers the cached graphs and decoders own (params, rings, scratch): destroyed with the stage. */
  readonly #owned: GPUBuffer[] = [];
  /** Sampler mask words (UNUSED token types and padding rows), when the file has token types. */
  readonly #unusedMask: Uint32Array<ArrayBuffer> | undefined;
  readonly #length: number[];
  #destroyed = false;

  private constructor(init: {
    gpu: Gpu;
    hp: Hparams;
    layers: readonly [number, number];
    nCtx: number;
    maxChunk: number;
    normPrologueMaxRows: number;
    moeTuning: StageOptions["moeTuning"];
    matvecTuning: StageOptions["matvecTuning"];
    fuseDecodeRoute: boolean;
    groupedExperts: boolean;
    int8Activations: boolean;
    int8Log: boolean;
    weights: Map<string, GpuTensor>;
    check: TensorCheck;
    nSlots: number;
    tokenTypes?: ArrayLike<number>;
  }) {
    const { gpu, hp } = init;
    this.#gpu = gpu;
    this.#cache = new PipelineCache(gpu.device, { f16: gpu.f16 });
    this.hp = hp;
    this.layers = init.layers;
    this.first = init.layers[0] === 0;
    this.last = init.layers[1] === hp.nLayer;
    this.nCtx = init.nCtx;
    this.maxChunk = init.maxChunk;
    this.normPrologueMaxRows = init.normPrologueMaxRows;
    this.#moeTuning = init.moeTuning;
    this.#matvecTuning = init.matvecTuning;
    this.#fuseDecodeRoute = init.fuseDecodeRoute;
    this.#groupedExperts = init.groupedExperts;
    this.int8Activations = init.int8Activations;
    this.#int8Log = init.int8Log
      ? {
        buffer: gpu.device.createBuffer({
          label: "int8 log",
          size: INT8_LOG_BYTES,
          usage: GPUBufferUsage.STORAGE | GPUBufferUsage.COPY_SRC,
        }),
        entries: new Map(),
      }
      : undefined;
    if (this.#int8Log) this.#owned.push(this.#int8Log.buffer);
    this.#weights = init.weights;
    this.#tiedOutput = init.check.tiedOutput;
    let wb = 0;
    const seen = new Set<GPUBuffer>();
    for (const t of init.weights.values()) {
      for (const p of t.parts) {
        if (!seen.has(p.buffer)) wb += p.buffer.size;
        seen.add(p.buffer);
      }
    }
    this.weightBytes = wb;
    const ls: LayerWeights[] = [];
    for (let l = init.layers[0]; l < init.layers[1]; l++) {
      ls.push({
        attention: hp.isAttention[l]!,
        layout: init.check.layouts[l],
        t: (id) => this.#tensor(tensorName(id, l)),
      });
    }
    this.#layers = ls;
    this.states = new SlotStates(gpu.device, { specs: this.#stateSpecs(), nSlots: init.nSlots });
    this.#act = this.#allocActivations();
    this.#posParams = Array.from(
      { length: init.nSlots },
      (_, s) => gpu.device.createBuffer({ label: `slot${s}.pos`, size: 16, usage: STORAGE }),
    );
    this.#zeroIds = gpu.device.createBuffer({
      label: "zero_ids",
      size: 4 * Math.max(this.maxChunk, MAX_BATCH_SLOTS),
      usage: STORAGE,
    });
    this.#slotTok = Array.from(
      { length: init.nSlots },
      (_, s) => gpu.device.createBuffer({ label: `slot${s}.tok`, size: 16, usage: STORAGE }),
    );
    this.canBatch = batchable(hp, init.layers);
    this.#length = new Array(init.nSlots).fill(0);
    this.#unusedMask = init.tokenTypes && unusedTokenMask(init.tokenTypes, hp.nVocab);
  }

  /**
   * Validates the file against its architecture, uploads the weights of `opts.layers` and allocates the
   * state of `opts.nSlots` slots of `opts.nCtx` positions.
   * @throws {GgufError} when the file does not match its architecture
   * @throws {RangeError} on a layer range, context or chunk size out of range, or a tensor the GPU cannot bind
   */
  static async load(gpu: Gpu, file: GgufFile, opts: StageOptions): Promise<Stage> {
    const arch = archOf(file.metadata);
    const hp = arch.readHparams(file.metadata);
    const check = arch.checkTensors(file, hp);
    const [a, b] = opts.layers ?? [0, hp.nLayer];
    if (!Number.isInteger(a) || !Number.isInteger(b) || a < 0 || b > hp.nLayer || a >= b) {
      throw new RangeError(
        `Layer range ${a}:${b} is not within 0:${hp.nLayer} of ${file.path} (a < b required): pass --layers a:b`,
      );
    }
    if (!Number.isInteger(opts.nCtx) || opts.nCtx < 1 || opts.nCtx > 2 ** 24) {
      throw new RangeError(`Context of ${opts.nCtx} positions is out of range 1..${2 ** 24}`);
    }
    const maxChunk = opts.maxChunk ?? 64;
    if (!Number.isInteger(maxChunk) || maxChunk < 1 || maxChunk > 4096) {
      throw new RangeError(`Chunk size ${maxChunk} is out of range 1..4096`);
    }
    const npr = opts.normPrologueMaxRows;
    if (npr !== undefined && !(Number.isInteger(npr) && npr >= 0)) {
      throw new RangeError(`normPrologueMaxRows must be an integer ≥ 0 (0: never fuse), got ${npr}`);
    }
    const names: string[] = [];
    const packs: string[][] = [];
    const rowOrder = new Map<string, Uint32Array>();
    if (a === 0) names.push(tensorName("token_embd"));
    for (let l = a; l < b; l++) {
      for (const [name, spec] of check.specs) {
        if (spec.layer === l && !spec.mtp) names.push(name);
      }
      const [gate, up, down] = (["ffn_gate_exps", "ffn_up_exps", "ffn_down_exps"] as const).map((id) =>
        tensorName(id, l)
      );
      const [sGate, sUp, sDown] = (["ffn_gate_shexp", "ffn_up_shexp", "ffn_down_shexp"] as const).map((id) =>
        tensorName(id, l)
      );
      if (sharedFusable(file, hp, [gate!, up!, down!], [sGate!, sUp!, sDown!])) {
        // The shared expert as expert index nExpert of each routed tensor: one dispatch runs both.
        packs.push([gate!, sGate!, up!, sUp!], [down!, sDown!]);
      } else {
        packs.push([gate!, up!], [sGate!, sUp!]);
      }
      if (check.layouts[l] === "ssm_in") rowOrder.set(tensorName("ssm_in", l), legacyRowOrder(hp));
      // In-projections that read the same normed input, back to back: one decode mat-vec for the group.
      const group = hp.isAttention[l]
        ? inProjGroup(file, l, ["attn_q", "attn_k", "attn_v"])
        : inProjGroup(file, l, ["ssm_in", "attn_qkv", "attn_gate", "ssm_ba", "ssm_beta", "ssm_alpha"]);
      if (group.length > 1) packs.push(group);
      // The router and the shared expert's gate row: one decode mat-vec, logits then the gate logit.
      const router = inProjGroup(file, l, ["ffn_gate_inp", "ffn_gate_inp_shexp"]);
      if (router.length > 1) packs.push(router);
    }
    if (b === hp.nLayer) {
      names.push(tensorName("output_norm"));
      if (!check.tiedOutput) names.push(tensorName("output"));
      else if (a !== 0) names.push(tensorName("token_embd"));
    }
    for (const pack of packs) {
      const [g, ...rest] = pack.map((n) => file.tensor(n));
      for (const u of rest) {
        if (g!.type.id !== u.type.id) {
          throw new RangeError(
            `Tensors ${g!.name} (${
              g!.type.name
            }) and ${u.name} (${u.type.name}) differ in type; this engine ` +
              `reads them through one kernel and needs one type: re-quantize them alike`,
          );
        }
      }
    }
    const weights = await uploadTensors(gpu.device, file, {
      names: [...new Set(names)],
      packs,
      rowOrder,
      onProgress: opts.onProgress,
    });
    const tokenTypes = file.metadata.has(KEYS.tokTypes)
      ? file.metadata.getIntArray(KEYS.tokTypes)
      : undefined;
    return new Stage({
      tokenTypes,
      gpu,
      hp,
      layers: [a, b],
      nCtx: opts.nCtx,
      maxChunk,
      normPrologueMaxRows: opts.normPrologueMaxRows ?? NORM_PROLOGUE_MAX_ROWS,
      moeTuning: opts.moeTuning,
      matvecTuning: opts.matvecTuning,
      fuseDecodeRoute: opts.fuseDecodeRoute ?? false,
      groupedExperts: opts.groupedExperts ?? false,
      int8Activations: opts.int8Activations ?? false,
      int8Log: (opts.int8Activations ?? false) && (opts.int8Log ?? false),
      weights,
      check,
      nSlots: opts.nSlots,
    });
  }

  /** Tokens held by `slot`. */
  length(slot: number): number {
    this.#slotCheck(slot);
    return this.#length[slot]!;
  }

  /**
   * Runs `input` through the stage for `slot`, continuing its sequence at position `base` (`base == 0`
   * resets the slot). Prefill runs in chunks of `maxChunk`. Returns logits (last stage) or hidden rows of
   * every position (`all`) or only the last (`last`, the default).
   * @throws {RangeError} on a base other than the slot's length (restore a snapshot first), a sequence
   *   longer than the context, token ids out of the vocabulary, or an input of the wrong kind
   */
  async run(
    slot: number,
    input: StageInput,
    base: number,
    opts: { rows?: "all" | "last" } = {},
  ): Promise<StageOutput> {
    const { device } = this.#gpu;
    this.#slotCheck(slot);
    const nTokens = "tokens" in input ? input.tokens.length : input.nTokens;
    this.#inputCheck(slot, input, base, nTokens);
    const rows = opts.rows ?? "last";
    const width = this.last ? this.hp.nVocab : this.hp.nEmbd;
    const out = new Float32Array(width * (rows === "all" ? nTokens : 1));
    if (base === 0) {
      const enc = device.createCommandEncoder();
      this.states.reset(enc, slot);
      device.queue.submit([enc.finish()]);
      this.#length[slot] = 0;
    }
    const staging = device.createBuffer({
      size: out.byteLength,
      usage: GPUBufferUsage.MAP_READ | GPUBufferUsage.COPY_DST,
    });
    for (let at = 0; at < nTokens; at += this.maxChunk) {
      const n = Math.min(this.maxChunk, nTokens - at);
      const lastChunk = at + n === nTokens;
      const outRows = rows === "all" ? "all" : lastChunk ? "last" : "none";
      device.queue.writeBuffer(this.#posParams[slot]!, 0, Uint32Array.of(base + at, n));
      if ("tokens" in input) {
        device.queue.writeBuffer(this.#act.tokens!, 0, Uint32Array.from(input.tokens.slice(at, at + n)));
      } else {
        device.queue.writeBuffer(this.#act.h!, 0, input.hidden, at * this.hp.nEmbd, n * this.hp.nEmbd);
      }
      const ops = await this.#graph(slot, n, outRows);
      const enc = device.createCommandEncoder();
      const pass = enc.beginComputePass();
      encodeOps(pass, ops);
      pass.end();
      if (outRows !== "none") {
        const src = this.last ? this.#act.logits! : this.#act.h!;
        const srcOff = !this.last && outRows === "last" ? (n - 1) * width * 4 : 0;
        const size = (outRows === "all" ? n : 1) * width * 4;
        const dstOff = outRows === "all" ? at * width * 4 : 0;
        enc.copyBufferToBuffer(src, srcOff, staging, dstOff, size);
      }
      device.queue.submit([enc.finish()]);
      this.#length[slot] = base + at + n;
    }
    await staging.mapAsync(GPUMapMode.READ);
    out.set(new Float32Array(staging.getMappedRange()));
    staging.unmap();
    staging.destroy();
    return { kind: this.last ? "logits" : "hidden", data: out, rows: rows === "all" ? nTokens : 1 };
  }

  /**
   * The rounding decisions of the last `run()` chunk (StageOptions.int8Log): per quantize_q8 in graph order,
   * its mat-vec's label, the column, and x's int8 values (element order) and per-32 scales.
   * @throws {Error} when the stage was loaded without int8Log or has not run
   */
  async int8Log(): Promise<Int8Logged[]> {
    const log = this.#int8Log;
    const entries = log?.last === undefined ? undefined : log.entries.get(log.last);
    if (!log || !entries) {
      throw new Error("int8Log: load the stage with int8Activations and int8Log, then run()");
    }
    const { device } = this.#gpu;
    const end = entries.reduce((m, e) => Math.max(m, e.offset + q8xBytes(e.k)), 16);
    const size = Math.ceil(end / 4) * 4;
    const staging = device.createBuffer({ size, usage: GPUBufferUsage.MAP_READ | GPUBufferUsage.COPY_DST });
    const enc = device.createCommandEncoder();
    enc.copyBufferToBuffer(log.buffer, 0, staging, 0, size);
    device.queue.submit([enc.finish()]);
    await staging.mapAsync(GPUMapMode.READ);
    const bytes = new Uint8Array(staging.getMappedRange().slice(0));
    staging.unmap();
    staging.destroy();
    return entries.map((e) => ({
      label: e.label,
      col: e.col,
      ...decodeQ8x(e.type, e.k, bytes.subarray(e.offset, e.offset + q8xBytes(e.k))),
    }));
  }

  /**
   * Greedy generation on one slot without an awaited readback between decode steps: the prompt is
   * prefilled, then each step is one compute pass whose argmax writes the next id straight into the next
   * step's token buffer and into a GPU id ring; ids come back every `batch` steps through the readback
   * ring while the next batch, encoded beforehand, runs. A stop id found late is exact: the slot is rewound
   * to a snapshot taken at the start of that batch and re-fed only the accepted tokens.
   * The slot afterwards holds `base` tokens, the prompt and every generated token but the last (not yet fed).
   * @throws {RangeError} as {@linkcode Stage.run}, and when the stage is not a whole model
   */
  async generate(slot: number, prompt: readonly number[], opts: GenerateOptions): Promise<GenerateResult> {
    if (!this.first || !this.last) {
      throw new RangeError(
        `Layers ${this.layers.join(":")} are a partial stage: generation needs the whole model`,
      );
    }
    const { device } = this.#gpu;
    const { top, sampling } = this.#genCheck(opts);
    const S = opts.batch ?? 8;
    if (!Number.isInteger(S) || S < 1 || S > 64) throw new RangeError(`Batch must be in 1..64, got ${S}`);
    const stops = new Set(opts.stopIds ?? []);
    const base = opts.base ?? 0;
    const first = await this.run(slot, { tokens: prompt }, base);
    const start = base + prompt.length;
    const dec = await this.#decoder(slot, S, top, sampling);
    const firstId = await this.#firstId(first, prompt, opts, dec);
    const tokens = [firstId];
    const tops: [number, number][][] = top > 0 ? [topCpu(first.data, top)] : [];
    opts.onTokens?.([tokens[0]!]);
    const room = this.nCtx - start;
    let nNew = Math.min(opts.nNew, room + 1);
    const early = stops.has(tokens[0]!) ? "stop" : opts.signal?.aborted ? "cancelled" : undefined;
    if (early) nNew = 1;
    const steps = nNew - 1;
    if (steps === 0) {
      return { tokens, top: tops, reason: early ?? (nNew < opts.nNew ? "context" : "length"), steps: 0 };
    }
    device.queue.writeBuffer(this.#act.tokens!, 0, Uint32Array.of(tokens[0]!));
    const ring = new ReadbackRing(device, { slots: 2, slotBytes: S * 4 * (1 + 2 * top) });
    const batchParams = [0, 1].map(() =>
      device.createBuffer({ size: S * 16, usage: GPUBufferUsage.COPY_SRC | GPUBufferUsage.COPY_DST })
    );
    const snaps: number[] = [];
    const encodeBatch = (b: number): { cbs: GPUCommandBuffer[]; slot: number; n: number } => {
      const n = Math.min(S, steps - b * S);
      const params = new Uint32Array(S * 4);
      for (let j = 0; j < n; j++) params.set([start + b * S + j, 1, j, 0], j * 4);
      const pb = batchParams[b % 2]!;
      device.queue.writeBuffer(pb, 0, params);
      const cbs: GPUCommandBuffer[] = [];
      if (stops.size > 0 || opts.signal) {
        const enc = device.createCommandEncoder();
        snaps.push(this.states.snapshot(enc, slot, start + b * S));
        cbs.push(enc.finish());
      }
      let ringSlot = -1;
      for (let j = 0; j < n; j++) {
        const enc = device.createCommandEncoder();
        enc.copyBufferToBuffer(pb, j * 16, this.#posParams[slot]!, 0, 8);
        enc.copyBufferToBuffer(pb, j * 16 + 8, dec.argmaxParams, 0, 4);
        const pass = enc.beginComputePass();
        encodeOps(pass, dec.ops);
        pass.end();
        if (top > 0) enc.copyBufferToBuffer(dec.topResult, 0, dec.topBatch, j * 8 * top, 8 * top);
        if (j === n - 1) {
          const copies = [{ src: dec.idRing, srcOffsetBytes: 0, sizeBytes: 4 * S }];
          if (top > 0) copies.push({ src: dec.topBatch, srcOffsetBytes: 0, sizeBytes: 8 * top * S });
          ringSlot = ring.record(enc, copies) ?? -1;
          assert(ringSlot >= 0, "a readback slot is free for each batch");
        }
        cbs.push(enc.finish());
      }
      return { cbs, slot: ringSlot, n };
    };
    const nBatches = Math.ceil(steps / S);
    let cur = encodeBatch(0);
    device.queue.submit(cur.cbs);
    let reason: GenerateResult["reason"] = nNew < opts.nNew ? "context" : "length";
    let ended = false;
    let ran = 0;
    for (let b = 0; b < nBatches; b++) {
      const next = b + 1 < nBatches ? encodeBatch(b + 1) : undefined;
      // mapAsync blocks until the queue is idle: the next batch is encoded already and goes in right after.
      const landed = ring.map(cur.slot);
      if (next) device.queue.submit(next.cbs);
      const bytes = await landed;
      ran += cur.n;
      const ids = new Uint32Array(bytes.buffer, 0, S);
      const pairs = top > 0 ? new Uint32Array(bytes.buffer, 4 * S, 2 * top * S) : undefined;
      const fresh: number[] = [];
      for (let j = 0; j < cur.n && !ended; j++) {
        const id = ids[j]!;
        tokens.push(id);
        fresh.push(id);
        if (pairs) tops.push(pairsToTop(pairs, j, top));
        if (stops.has(id)) {
          ended = true;
          reason = "stop";
        }
      }
      if (fresh.length > 0) opts.onTokens?.(fresh);
      if (!ended && opts.signal?.aborted && tokens.length < nNew) {
        ended = true;
        reason = "cancelled";
      }
      if (ended) {
        if (next) {
          await ring.map(next.slot);
          ran += next.n;
        }
        break;
      }
      cur = next ?? cur;
    }
    // Kept tokens are fed up to all but the last; steps past that ran ahead and are rewound: restore the
    // snapshot at the start of the batch holding the first unwanted step, re-feed the kept tokens of it.
    const fed = tokens.length - 1;
    let length = start + steps;
    if (ended && ran > fed) {
      const b = Math.min(Math.floor(fed / S), snaps.length - 1);
      this.restore(snaps[b]!, slot);
      const refeed = tokens.slice(b * S, fed);
      if (refeed.length > 0) {
        await this.run(slot, { tokens: refeed }, start + b * S, { rows: "last" });
      }
    }
    if (ended) length = start + fed;
    for (const id of snaps) this.states.drop(id);
    this.#length[slot] = length;
    ring.destroy();
    for (const pb of batchParams) pb.destroy();
    return { tokens, top: tops, reason, steps: ran };
  }

  /**
   * Generation on several slots at once. Each prompt is prefilled on its slot and its first id selected as
   * {@linkcode Stage.generate} does; then every decode step runs all the slots still generating in ONE
   * compute pass: the projections, experts and LM head read their weights once for all columns, attention
   * and DeltaNet run per slot on its own state and position, and each slot's argmax or sampler writes its own
   * next id. Ids come back every `batch` steps for all slots together; a slot that stops or is cancelled
   * leaves the set at the next batch (its run-ahead is rewound exactly, as in generate) and the others go on.
   * Each slot's result equals its own generate: the mat-vecs sum every column in the same order.
   * @throws {RangeError} as {@linkcode Stage.generate}, on a repeated slot, more than MAX_BATCH_SLOTS items,
   *   or a model whose activation rows cannot be bound per slot ({@linkcode Stage.canBatch})
   */
  async generateBatch(items: readonly BatchItem[], opts: { batch?: number } = {}): Promise<GenerateResult[]> {
    if (items.length === 1) {
      const it = items[0]!;
      return [await this.generate(it.slot, it.prompt, { ...it.opts, batch: opts.batch ?? it.opts.batch })];
    }
    if (!this.first || !this.last) {
      throw new RangeError(
        `Layers ${this.layers.join(":")} are a partial stage: generation needs the whole model`,
      );
    }
    if (!this.canBatch) {
      throw new RangeError("This model's activation rows cannot be bound per slot: no batching");
    }
    if (items.length < 1 || items.length > MAX_BATCH_SLOTS) {
      throw new RangeError(`A batched step takes 1..${MAX_BATCH_SLOTS} slots, got ${items.length}`);
    }
    const slots = items.map((it) => it.slot);
    for (const s of slots) this.#slotCheck(s);
    if (new Set(slots).size !== slots.length) throw new RangeError(`Slots ${slots.join(",")} repeat`);
    const S = opts.batch ?? 8;
    if (!Number.isInteger(S) || S < 1 || S > 64) throw new RangeError(`Batch must be in 1..64, got ${S}`);
    const { device } = this.#gpu;
    const checked = items.map((it) => {
      const c = this.#genCheck(it.opts);
      this.#inputCheck(it.slot, { tokens: it.prompt }, it.opts.base ?? 0, it.prompt.length);
      return c;
    });
    const seqs: BatchSeq[] = [];
    for (const [i, it] of items.entries()) {
      const o = it.opts;
      const { top, sampling } = checked[i]!;
      const base = o.base ?? 0;
      const first = await this.run(it.slot, { tokens: it.prompt }, base);
      const start = base + it.prompt.length;
      // The first id goes to the slot's id buffer, which its first batched step embeds.
      const sel = await this.#slotSelector(it.slot, -1, S, top, sampling);
      const id = await this.#firstId(first, it.prompt, o, sel);
      if (!sel.sampler) device.queue.writeBuffer(this.#slotTok[it.slot]!, 0, Uint32Array.of(id));
      o.onTokens?.([id]);
      const stops = new Set(o.stopIds ?? []);
      const nNew = Math.min(o.nNew, this.nCtx - start + 1);
      const early = stops.has(id) ? "stop" : o.signal?.aborted ? "cancelled" : undefined;
      seqs.push({
        slot: it.slot,
        o,
        top,
        sampling,
        stops,
        start,
        steps: early ? 0 : nNew - 1,
        tokens: [id],
        tops: top > 0 ? [topCpu(first.data, top)] : [],
        reason: early ?? (nNew < o.nNew ? "context" : "length"),
        ended: early !== undefined,
        sched: 0,
        ran: 0,
        snaps: [],
        sel,
        tok: this.#slotTok[it.slot]!,
      });
    }
    const maxTop = Math.max(...seqs.map((q) => q.top));
    const ring = new ReadbackRing(device, { slots: 2, slotBytes: seqs.length * S * 4 * (1 + 2 * maxTop) });
    const batchParams = [0, 1].map(() =>
      device.createBuffer({
        size: S * seqs.length * 16,
        usage: GPUBufferUsage.COPY_SRC | GPUBufferUsage.COPY_DST,
      })
    );
    let nBatch = 0;
    type Batch = { cbs: GPUCommandBuffer[]; ringSlot: number; n: number; set: BatchSeq[] };
    const encodeBatch = async (): Promise<Batch | undefined> => {
      const set = seqs.filter((q) => !q.ended && q.sched < q.steps);
      if (set.length === 0) return undefined;
      const n = Math.min(S, ...set.map((q) => q.steps - q.sched));
      // The set's graph: the batched one, or the slot's own decode step when one slot is left.
      let ops: readonly Op[];
      let pos: readonly GPUBuffer[];
      const sels: Selector[] = [];
      const toks: GPUBuffer[] = [];
      if (set.length === 1) {
        const q = set[0]!;
        const dec = await this.#decoder(q.slot, S, q.top, q.sampling);
        ops = dec.ops;
        pos = [this.#posParams[q.slot]!];
        sels.push(dec);
        toks.push(this.#act.tokens!);
      } else {
        const g = await this.#batchGraph(set.map((q) => q.slot));
        const all: Op[] = [...g.ops];
        for (const [b, q] of set.entries()) {
          const sel = await this.#slotSelector(q.slot, b, S, q.top, q.sampling);
          all.push(...sel.stepOps);
          sels.push(sel);
          toks.push(this.#slotTok[q.slot]!);
        }
        ops = all;
        pos = g.pos;
      }
      const cbs: GPUCommandBuffer[] = [];
      const enc0 = device.createCommandEncoder();
      for (const [b, q] of set.entries()) {
        // A slot that changed column (or went solo) carries its next id and sampler state over.
        const sel = sels[b]!;
        if (sel !== q.sel) {
          if (toks[b] !== q.tok) enc0.copyBufferToBuffer(q.tok, 0, toks[b]!, 0, 4);
          if (q.sampling) {
            enc0.copyBufferToBuffer(
              q.sel.sampler!.state,
              0,
              sel.sampler!.state,
              0,
              q.sel.sampler!.state.size,
            );
            enc0.copyBufferToBuffer(
              q.sel.sampler!.params,
              0,
              sel.sampler!.params,
              0,
              q.sel.sampler!.params.size,
            );
          }
          q.sel = sel;
          q.tok = toks[b]!;
        }
        if (q.stops.size > 0 || q.o.signal) {
          q.snaps.push({ at: q.sched, id: this.states.snapshot(enc0, q.slot, q.start + q.sched) });
        }
      }
      cbs.push(enc0.finish());
      const words = new Uint32Array(S * set.length * 4);
      for (let j = 0; j < n; j++) {
        for (const [b, q] of set.entries()) {
          words.set([q.start + q.sched + j, 1, j, 0], (j * set.length + b) * 4);
        }
      }
      const pb = batchParams[nBatch++ % 2]!;
      device.queue.writeBuffer(pb, 0, words);
      let ringSlot = -1;
      for (let j = 0; j < n; j++) {
        const enc = device.createCommandEncoder();
        for (const [b, q] of set.entries()) {
          const at = (j * set.length + b) * 16;
          enc.copyBufferToBuffer(pb, at, pos[b]!, 0, 8);
          enc.copyBufferToBuffer(pb, at + 8, q.sel.argmaxParams, 0, 4);
        }
        const pass = enc.beginComputePass();
        encodeOps(pass, ops);
        pass.end();
        for (const q of set) {
          if (q.top > 0) enc.copyBufferToBuffer(q.sel.topResult, 0, q.sel.topBatch, j * 8 * q.top, 8 * q.top);
        }
        if (j === n - 1) {
          const copies = set.map((q) => ({ src: q.sel.idRing, srcOffsetBytes: 0, sizeBytes: 4 * S }));
          for (const q of set) {
            if (q.top > 0) copies.push({ src: q.sel.topBatch, srcOffsetBytes: 0, sizeBytes: 8 * q.top * S });
          }
          ringSlot = ring.record(enc, copies) ?? -1;
          assert(ringSlot >= 0, "a readback slot is free for each batch");
        }
        cbs.push(enc.finish());
      }
      for (const q of set) q.sched += n;
      return { cbs, ringSlot, n, set };
    };
    try {
      let cur = await encodeBatch();
      if (cur) device.queue.submit(cur.cbs);
      while (cur) {
        const next = await encodeBatch();
        // mapAsync blocks until the queue is idle: the next batch is encoded already and goes in right after.
        const landed = ring.map(cur.ringSlot);
        if (next) device.queue.submit(next.cbs);
        const bytes = await landed;
        const u32 = new Uint32Array(bytes.buffer, bytes.byteOffset, bytes.byteLength / 4);
        let pairsAt = cur.set.length * S;
        for (const [b, q] of cur.set.entries()) {
          q.ran += cur.n;
          const pairs = q.top > 0 ? u32.subarray(pairsAt, pairsAt + 2 * q.top * S) : undefined;
          if (q.top > 0) pairsAt += 2 * q.top * S;
          if (q.ended) continue; // ran ahead of a stop found in the previous batch
          const fresh: number[] = [];
          for (let j = 0; j < cur.n && !q.ended; j++) {
            const id = u32[b * S + j]!;
            q.tokens.push(id);
            fresh.push(id);
            if (pairs) q.tops.push(pairsToTop(pairs, j, q.top));
            if (q.stops.has(id)) {
              q.ended = true;
              q.reason = "stop";
            }
          }
          if (fresh.length > 0) q.o.onTokens?.(fresh);
          if (!q.ended && q.o.signal?.aborted && q.tokens.length < q.steps + 1) {
            q.ended = true;
            q.reason = "cancelled";
          }
        }
        cur = next;
      }
      const out: GenerateResult[] = [];
      for (const q of seqs) {
        // Kept tokens are fed up to all but the last; steps past that ran ahead: restore the snapshot at the
        // start of the batch holding the first unwanted step and re-feed the kept tokens after it.
        const fed = q.tokens.length - 1;
        if (q.ran > fed) {
          const snap = q.snaps.filter((x) => x.at <= fed).at(-1);
          assert(snap, `slot ${q.slot}: a snapshot before step ${fed}`);
          this.restore(snap.id, q.slot);
          const refeed = q.tokens.slice(snap.at, fed);
          if (refeed.length > 0) {
            await this.run(q.slot, { tokens: refeed }, q.start + snap.at, { rows: "last" });
          }
        }
        this.#length[q.slot] = q.start + Math.min(fed, q.ran);
        out.push({ tokens: q.tokens, top: q.tops, reason: q.reason, steps: q.ran });
      }
      return out;
    } finally {
      for (const q of seqs) for (const x of q.snaps) this.states.drop(x.id);
      ring.destroy();
      for (const pb of batchParams) pb.destroy();
    }
  }

  /** Checks the options every generation shares; returns the top-k count and whether the sampler runs. */
  #genCheck(opts: GenerateOptions): { top: number; sampling: boolean } {
    const top = opts.top ?? 0;
    if (!Number.isInteger(opts.nNew) || opts.nNew < 1) {
      throw new RangeError(`--n must be >= 1, got ${opts.nNew}`);
    }
    if (!Number.isInteger(top) || top < 0 || top > 64) {
      throw new RangeError(`--top must be in 0..64, got ${top}`);
    }
    // Plain greedy (no penalties) takes the argmax path; anything else runs the sampler, penalties included.
    const p = opts.sampling;
    const sampling = p !== undefined &&
      !(isGreedy(p) && p.repeatPenalty === 1 && p.presencePenalty === 0 && p.frequencyPenalty === 0);
    return { top, sampling };
  }

  /**
   * The first id after a prefill whose last logits are `first` (still in logits row 0): the argmax on the
   * CPU, or a draw of `sel`'s sampler, which first gets the request's settings, a fresh RNG step and penalty
   * history (and writes the id to its next-token buffer itself).
   */
  async #firstId(first: StageOutput, prompt: readonly number[], opts: GenerateOptions, sel: Selector) {
    if (!sel.sampler) return argmaxCpu(first.data);
    const { device } = this.#gpu;
    device.queue.writeBuffer(
      sel.sampler.params,
      0,
      sampleParamWords(opts.sampling!, { maskUnused: !!this.#unusedMask }),
    );
    device.queue.writeBuffer(
      sel.sampler.state,
      0,
      packSampleState(SAMPLE_HIST, {
        step: opts.samplerStep ?? 0,
        history: (opts.samplerHistory ?? prompt).slice(-SAMPLE_HIST),
      }),
    );
    const enc = device.createCommandEncoder();
    const pass = enc.beginComputePass();
    encodeOps(pass, sel.firstOps);
    pass.end();
    const read = device.createBuffer({ size: 4, usage: GPUBufferUsage.MAP_READ | GPUBufferUsage.COPY_DST });
    enc.copyBufferToBuffer(sel.idRing, 0, read, 0, 4);
    device.queue.submit([enc.finish()]);
    await read.mapAsync(GPUMapMode.READ);
    const id = new Uint32Array(read.getMappedRange())[0]!;
    read.unmap();
    read.destroy();
    if (id >= this.hp.nVocab) {
      throw new Error(`Internal error: the sampler drew no id (all logits masked or NaN)`);
    }
    return id;
  }

  /**
   * Saves `slot`'s full state (as of the work submitted so far) to a new snapshot; returns its number.
   */
  snapshot(slot: number): number {
    this.#slotCheck(slot);
    const enc = this.#gpu.device.createCommandEncoder();
    const id = this.states.snapshot(enc, slot, this.#length[slot]!);
    this.#gpu.device.queue.submit([enc.finish()]);
    return id;
  }

  /** Restores snapshot `id` into `slot`; the slot then holds the snapshot's tokens. */
  restore(id: number, slot: number): void {
    this.#slotCheck(slot);
    const enc = this.#gpu.device.createCommandEncoder();
    this.states.restore(enc, id, slot);
    this.#gpu.device.queue.submit([enc.finish()]);
    this.#length[slot] = this.states.snapshotLength(id);
  }

  /** Dispatches of one chunk of `n` tokens (for counting and benchmarks). */
  graph(slot: number, n: number, rows: "all" | "last" | "none"): Promise<readonly Op[]> {
    this.#slotCheck(slot);
    return this.#graph(slot, n, rows);
  }

  /** Dispatches of one batched decode step of `slots` (for counting and benchmarks). */
  async batchGraph(slots: readonly number[]): Promise<readonly Op[]> {
    for (const s of slots) this.#slotCheck(s);
    if (slots.length < 2 || slots.length > MAX_BATCH_SLOTS || new Set(slots).size !== slots.length) {
      throw new RangeError(
        `A batched step takes 2..${MAX_BATCH_SLOTS} distinct slots, got ${slots.join(",")}`,
      );
    }
    return (await this.#batchGraph(slots)).ops;
  }

  /** Releases every GPU buffer of the stage. */
  destroy(): void {
    if (this.#destroyed) return;
    this.#destroyed = true;
    this.states.destroy();
    for (const b of Object.values(this.#act)) b.destroy();
    for (const b of this.#posParams) b.destroy();
    for (const b of this.#slotTok) b.destroy();
    this.#zeroIds.destroy();
    for (const b of this.#owned) b.destroy();
    const seen = new Set<GPUBuffer>();
    for (const t of this.#weights.values()) for (const p of t.parts) seen.add(p.buffer);
    for (const b of seen) b.destroy();
  }

  async #decoder(slot: number, S: number, top: number, sampling: boolean): Promise<Decoder> {
    const key = `${slot}/${S}/${top}/${sampling}`;
    const hit = this.#decoders.get(key);
    if (hit) return hit;
    const graph = await this.#graph(slot, 1, "last");
    const sel = await this.#selector({ row: 0, nextToken: this.#act.tokens!, S, top, sampling });
    const dec: Decoder = { ...sel, ops: [...graph, ...sel.stepOps] };
    this.#decoders.set(key, dec);
    return dec;
  }

  /**
   * The selection of one sequence's next id: argmax or the sampler on logits row `row` (the row's id goes to
   * word 0 of `nextToken` and to the id ring), then the top-k pairs when `top` > 0. Its buffers are its own.
   */
  async #selector(
    o: { row: number; nextToken: GPUBuffer; S: number; top: number; sampling: boolean },
  ): Promise<Selector> {
    const { device } = this.#gpu;
    const { S, top, sampling } = o;
    const V = this.hp.nVocab;
    const buf = (label: string, bytes: number) => {
      const b = device.createBuffer({ label, size: Math.max(16, bytes), usage: STORAGE });
      this.#owned.push(b);
      return b;
    };
    const idRing = buf("id_ring", 4 * S);
    const logitsRow = (row: number) => ({
      buffer: this.#act.logits!,
      offset: 4 * row * padWords(V),
      size: 4 * V,
    });
    const logits = logitsRow(o.row);
    let argmaxParams: GPUBuffer;
    let sampler: Selector["sampler"];
    // The selection on `logits` (a second set for row 0 when the step's row is another).
    let select: (logits: Binding) => Op[];
    if (sampling) {
      // The sampler's params start with the ring slot like ArgmaxParams, so the per-step copy is the same.
      const sc = sampleConstantsFor(V);
      const sv = sampleVariants(sc);
      const sp = {
        partial: await this.#cache.get(SAMPLE, sv.partial),
        final: await this.#cache.get(SAMPLE, sv.final),
      };
      const mask = buf("sample_mask", 4 * Math.ceil(V / 32));
      if (this.#unusedMask) device.queue.writeBuffer(mask, 0, this.#unusedMask);
      const s = {
        params: buf("sample_params", 48),
        state: buf("sample_state", 4 * packSampleState(sc.HIST).length),
      };
      sampler = s;
      argmaxParams = s.params;
      const pairs = buf("sample_pairs", 8 * (sc.K + 1) * sc.N_BLOCK);
      const result = buf("sample_result", 8 * (sc.K + 1));
      const sg = sampleGrids(sc);
      select = (logits) => {
        const sb = sampleBindGroups(device, {
          pipelines: sp,
          constants: sc,
          buffers: {
            logits,
            pairs,
            result,
            params: s.params,
            mask,
            state: s.state,
            nextToken: o.nextToken,
            ring: idRing,
          },
        });
        return [
          { label: "sample.partial", pipeline: sp.partial, bindGroup: sb.partial, grid: sg.partial },
          { label: "sample.final", pipeline: sp.final, bindGroup: sb.final, grid: sg.final },
        ];
      };
    } else {
      const params = buf("argmax_params", 16);
      argmaxParams = params;
      const ac: ArgmaxConstants = {
        N_VOCAB: V,
        N_BLOCK: Math.min(256, Math.ceil(V / 1024)),
        WG: 256,
        WRITE_IDS: true,
      };
      const av = argmaxVariants(ac);
      const ap = {
        partial: await this.#cache.get(ARGMAX, av.partial),
        final: await this.#cache.get(ARGMAX, av.final),
      };
      const pairs = buf("argmax_pairs", 8 * ac.N_BLOCK);
      const result = buf("argmax_result", 8);
      const ag = argmaxGrids(ac);
      select = (logits) => {
        const ab = argmaxBindGroups(device, {
          pipelines: ap,
          constants: ac,
          buffers: { logits, pairs, result, params, nextToken: o.nextToken, ring: idRing },
        });
        return [
          { label: "argmax.partial", pipeline: ap.partial, bindGroup: ab.partial, grid: ag.partial },
          { label: "argmax.final", pipeline: ap.final, bindGroup: ab.final, grid: ag.final },
        ];
      };
    }
    const stepOps = select(logits);
    const firstOps = o.row === 0 ? stepOps : select(logitsRow(0));
    const topResult = buf("top_result", 8 * Math.max(1, top));
    const topBatch = buf("top_batch", 8 * Math.max(1, top) * S);
    if (top > 0) {
      const tc: ArgmaxTopkConstants = {
        N_VOCAB: V,
        K: top,
        N_BLOCK: Math.min(64, Math.max(1, Math.ceil(V / 4096))),
        WG: 256,
        BUF: 2048,
      };
      const tv = argmaxTopkVariants(tc);
      const tp = {
        partial: await this.#cache.get(ARGMAX_TOPK, tv.partial),
        final: await this.#cache.get(ARGMAX_TOPK, tv.final),
      };
      const tb = argmaxTopkBindGroups(device, {
        pipelines: tp,
        constants: tc,
        buffers: { logits, pairs: buf("top_pairs", 8 * top * tc.N_BLOCK), result: topResult },
      });
      const tg = argmaxTopkGrids(tc);
      stepOps.push({ label: "topk.partial", pipeline: tp.partial, bindGroup: tb.partial, grid: tg.partial });
      stepOps.push({ label: "topk.final", pipeline: tp.final, bindGroup: tb.final, grid: tg.final });
    }
    return { stepOps, firstOps: firstOps.slice(0, 2), idRing, argmaxParams, topResult, topBatch, sampler };
  }

  /**
   * Selector of `slot` in a batched step at column `col` (-1: the prefill's first id only), writing the
   * slot's id buffer. Cached: a slot's selector per column keeps its buffers across calls.
   */
  async #slotSelector(
    slot: number,
    col: number,
    S: number,
    top: number,
    sampling: boolean,
  ): Promise<Selector> {
    const key = `${slot}/${col}/${S}/${top}/${sampling}`;
    const hit = this.#selectors.get(key);
    if (hit) return hit;
    const sel = await this.#selector({
      row: Math.max(0, col),
      nextToken: this.#slotTok[slot]!,
      S,
      top,
      sampling,
    });
    this.#selectors.set(key, sel);
    return sel;
  }

  /** The dispatches of one batched decode step of `slots` and its per-slot position buffers (cached). */
  async #batchGraph(slots: readonly number[]): Promise<{ ops: Op[]; pos: GPUBuffer[] }> {
    const key = slots.join(",");
    const hit = this.#batchGraphs.get(key);
    if (hit) return hit;
    const pos = slots.map((s) => {
      const b = this.#gpu.device.createBuffer({
        label: `batch${key}.slot${s}.pos`,
        size: 16,
        usage: STORAGE,
      });
      this.#owned.push(b);
      return b;
    });
    const ops = await new GraphBuilder(this.#gpu.device, this.#cache, this.hp, slots.length, this.#owned, {
      normPrologueMaxRows: this.normPrologueMaxRows,
      moeTuning: this.#moeTuning,
      matvecTuning: this.#matvecTuning,
      fuseDecodeRoute: this.#fuseDecodeRoute,
      groupedExperts: this.#groupedExperts,
      int8Activations: this.int8Activations,
    }).build({
      stage: this,
      slot: slots[0]!,
      rows: "all",
      act: this.#act,
      pos: pos[0]!,
      zeroIds: this.#zeroIds,
      layers: this.#layers,
      firstLayer: this.layers[0],
      gdn: (layout) => this.#gdnConstants(layout),
      embd: this.#tensor(tensorName("token_embd")),
      outNorm: this.#tensor(tensorName("output_norm")),
      lmHead: this.#tensor(tensorName(this.#tiedOutput ? "token_embd" : "output")),
      batch: { slots, pos, tok: slots.map((s) => this.#slotTok[s]!) },
    });
    const g = { ops, pos };
    this.#batchGraphs.set(key, g);
    return g;
  }

  #slotCheck(slot: number): void {
    if (!Number.isInteger(slot) || slot < 0 || slot >= this.#length.length) {
      throw new RangeError(`Slot ${slot} does not exist: this stage has ${this.#length.length} slots`);
    }
  }

  #inputCheck(slot: number, input: StageInput, base: number, nTokens: number): void {
    if (nTokens < 1) throw new RangeError("Input has no tokens: give at least one");
    if (base !== 0 && base !== this.#length[slot]) {
      throw new RangeError(
        `Slot ${slot} holds ${this.#length[slot]} tokens but the run continues at position ${base}: ` +
          `start at 0, continue at ${this.#length[slot]}, or restore a snapshot of length ${base} first`,
      );
    }
    if (base + nTokens > this.nCtx) {
      throw new RangeError(
        `Sequence of ${
          base + nTokens
        } tokens does not fit the context of ${this.nCtx}: raise --ctx or shorten it`,
      );
    }
    if ("tokens" in input) {
      if (!this.first) {
        throw new RangeError(`Layers ${this.layers.join(":")} take hidden rows, not token ids`);
      }
      for (const t of input.tokens) {
        if (!Number.isInteger(t) || t < 0 || t >= this.hp.nVocab) {
          throw new RangeError(`Token id ${t} is outside the vocabulary 0..${this.hp.nVocab - 1}`);
        }
      }
    } else {
      if (this.first) throw new RangeError(`Layers ${this.layers.join(":")} start at 0 and take token ids`);
      if (input.hidden.length !== nTokens * this.hp.nEmbd) {
        throw new RangeError(
          `Hidden input has ${input.hidden.length} values but ${nTokens} rows of ${this.hp.nEmbd} need ` +
            `${nTokens * this.hp.nEmbd}`,
        );
      }
    }
  }

  #tensor(name: string): GpuTensor {
    const t = this.#weights.get(name);
    assert(t, `tensor ${name} was not uploaded`);
    return t;
  }

  #stateSpecs(): StateSpec[] {
    const hp = this.hp;
    const specs: StateSpec[] = [];
    const posBytes = hp.headDim * 4;
    for (let l = this.layers[0]; l < this.layers[1]; l++) {
      if (hp.isAttention[l]) {
        const size = hp.nHeadKv * this.nCtx * posBytes;
        const liveRanges = (nPos: number) =>
          Array.from({ length: hp.nHeadKv }, (_, h) => ({
            offsetBytes: h * this.nCtx * posBytes,
            sizeBytes: nPos * posBytes,
          }));
        specs.push({ layer: l, name: "k_cache", sizeBytes: size, liveRanges });
        specs.push({ layer: l, name: "v_cache", sizeBytes: size, liveRanges });
      } else {
        const d = gdnDims(this.#gdnConstants(undefined));
        specs.push({ layer: l, name: "conv", sizeBytes: d.convRing * 4 });
        specs.push({ layer: l, name: "ssm", sizeBytes: d.state * 4 });
      }
    }
    return specs;
  }

  #gdnConstants(layout: DeltaNetLayout | undefined): GdnStepConstants {
    const hp = this.hp;
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
    };
  }

  #allocActivations(): Record<string, GPUBuffer> {
    const hp = this.hp;
    // Rows of every activation: a prefill chunk or a batched decode step, whichever is wider.
    const T = Math.max(this.maxChunk, MAX_BATCH_SLOTS);
    const d = gdnDims(this.#gdnConstants(undefined));
    const K = hp.nExpertUsed;
    const sizes: Record<string, number> = {
      tokens: T,
      h: hp.nEmbd * T,
      a: hp.nEmbd * T,
      t: hp.nEmbd * T,
      m: hp.nEmbd * T,
      xqkv: d.convCh * T,
      z: d.inner * T,
      ba: Math.max(2 * hp.ssmDtRank * T, padWords(2 * hp.ssmDtRank) * MAX_BATCH_SLOTS),
      alpha: Math.max(hp.ssmDtRank * T, padWords(hp.ssmDtRank) * MAX_BATCH_SLOTS),
      y: d.inner * T,
      inproj: Math.max(
        d.convCh + d.inner + 2 * hp.ssmDtRank,
        2 * hp.nHead * hp.headDim + 2 * hp.nHeadKv * hp.headDim,
      ),
      qf: 2 * hp.nHead * hp.headDim * T,
      k: hp.nHeadKv * hp.headDim * T,
      v: hp.nHeadKv * hp.headDim * T,
      q: hp.nHead * hp.headDim * T,
      o: hp.nHead * hp.headDim * T,
      partO: hp.headDim * hp.nHead * ATTN_SPLITS,
      partMl: 2 * hp.nHead * ATTN_SPLITS,
      router: (hp.nExpert + 1) * T,
      ids: K * T,
      wts: K * T,
      act: Math.max(hp.nFfExp, hp.nFfShexp) * (K + 1) * T,
      eo: hp.nEmbd * (K + 1) * T,
      sact: hp.nFfShexp * T,
      sho: hp.nEmbd * T,
      gam: T,
    };
    if (this.maxChunk > MATVEC_MAX_COLS && this.#layers.some((lw) => !lw.attention)) {
      const sb = gdnChunkScratchBytes(this.#gdnConstants(undefined), this.maxChunk);
      sizes.gdnQkw = sb.wsQkw / 4;
      sizes.gdnUp = sb.wsUp / 4;
    }
    if (this.last) sizes.logits = Math.max(hp.nVocab * T, padWords(hp.nVocab) * MAX_BATCH_SLOTS);
    const out: Record<string, GPUBuffer> = {};
    for (const [name, words] of Object.entries(sizes)) {
      out[name] = this.#gpu.device.createBuffer({
        label: name,
        size: Math.max(16, words * 4),
        usage: STORAGE,
      });
    }
    return out;
  }

  async #graph(slot: number, n: number, rows: "all" | "last" | "none"): Promise<Op[]> {
    const key = `${slot}/${n}/${rows}`;
    if (this.#int8Log) this.#int8Log.last = key;
    const hit = this.#graphs.get(key);
    if (hit) return hit;
    const entries: Int8LogEntry[] = [];
    this.#int8Log?.entries.set(key, entries);
    const ops = await new GraphBuilder(this.#gpu.device, this.#cache, this.hp, n, this.#owned, {
      normPrologueMaxRows: this.normPrologueMaxRows,
      moeTuning: this.#moeTuning,
      matvecTuning: this.#matvecTuning,
      fuseDecodeRoute: this.#fuseDecodeRoute,
      groupedExperts: this.#groupedExperts,
      int8Activations: this.int8Activations,
      int8Log: this.#int8Log ? { buffer: this.#int8Log.buffer, entries } : undefined,
    }).build({
      stage: this,
      slot,
      rows,
      act: this.#act,
      pos: this.#posParams[slot]!,
      zeroIds: this.#zeroIds,
      layers: this.#layers,
      firstLayer: this.layers[0],
      gdn: (layout) => this.#gdnConstants(layout),
      embd: this.first ? this.#tensor(tensorName("token_embd")) : undefined,
      outNorm: this.last ? this.#tensor(tensorName("output_norm")) : undefined,
      lmHead: this.last ? this.#tensor(tensorName(this.#tiedOutput ? "token_embd" : "output")) : undefined,
    });
    this.#graphs.set(key, ops);
    return ops;
  }
}

/** The selection of one sequence's next id (see `Stage.#selector`) and the buffers it feeds. */
interface Selector {
  /** Argmax or sampler on the step's logits row, then the top-k pairs when asked. */
  readonly stepOps: Op[];
  /** u32 ne=[batch]: the argmax's id of step j of a batch at word j. */
  readonly idRing: GPUBuffer;
  /** ArgmaxParams: the ring word of the current step (copied in at each step's start). */
  readonly argmaxParams: GPUBuffer;
  /** u32 ne=[2, top]: (value bits, id) pairs of the current step. */
  readonly topResult: GPUBuffer;
  /** u32 ne=[2, top, batch]: each step's pairs, copied out of `topResult` after its pass. */
  readonly topBatch: GPUBuffer;
  /** The selection dispatches alone (argmax or sampler) on logits row 0: the first id after a prefill. */
  readonly firstOps: readonly Op[];
  /** Sampler params (word 0: ring slot, like ArgmaxParams) and state (RNG step, penalty history), if sampling. */
  readonly sampler?: { readonly params: GPUBuffer; readonly state: GPUBuffer };
}

/** The decode step of one slot: its graph followed by its selector's step dispatches. */
interface Decoder extends Selector {
  readonly ops: readonly Op[];
}

/** One slot's request in {@linkcode Stage.generateBatch}. */
export interface BatchItem {
  /** The slot it runs on (distinct per call). */
  readonly slot: number;
  /** Tokens appended at `opts.base` (the whole sequence when base is 0). */
  readonly prompt: readonly number[];
  /** As for {@linkcode Stage.generate}; `batch` is the call's. */
  readonly opts: GenerateOptions;
}

/** A sequence in flight in generateBatch. */
interface BatchSeq {
  readonly slot: number;
  readonly o: GenerateOptions;
  readonly top: number;
  readonly sampling: boolean;
  readonly stops: ReadonlySet<number>;
  /** Position of the first decode step (base + prompt). */
  readonly start: number;
  /** Decode steps wanted (ids after the first). */
  readonly steps: number;
  readonly tokens: number[];
  readonly tops: [number, number][][];
  reason: GenerateResult["reason"];
  ended: boolean;
  /** Steps encoded so far. */
  sched: number;
  /** Steps whose ids landed. */
  ran: number;
  /** Snapshots at batch starts: step index and snapshot id. */
  readonly snaps: { at: number; id: number }[];
  /** The selector of its latest batch and the id buffer it writes. */
  sel: Selector;
  tok: GPUBuffer;
}

/** Whether every per-slot row of a batched step of layers `[a, b)` starts 256-byte aligned (see canBatch). */
function batchable(hp: Hparams, layers: readonly [number, number]): boolean {
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

/** Index of the largest value, ties to the lowest index (as the GPU argmax). */
export function argmaxCpu(v: ArrayLike<number>): number {
  let best = 0;
  for (let i = 1; i < v.length; i++) if (v[i]! > v[best]!) best = i;
  return best;
}

/** The `k` largest `[index, value]` pairs, highest first, ties to the lowest index. */
export function topCpu(v: ArrayLike<number>, k: number): [number, number][] {
  const idx = Array.from({ length: v.length }, (_, i) => i);
  idx.sort((a, b) => (v[b]! - v[a]!) || a - b);
  return idx.slice(0, k).map((i) => [i, v[i]!]);
}

function pairsToTop(pairs: Uint32Array, step: number, top: number): [number, number][] {
  const f = new Float32Array(pairs.buffer, pairs.byteOffset, pairs.length);
  const out: [number, number][] = [];
  for (let i = 0; i < top; i++) {
    const at = (step * top + i) * 2;
    out.push([pairs[at + 1]!, f[at]!]);
  }
  return out;
}

/**
 * The longest leading run of the present tensors `ids` of layer `l` that can be packed back to back for one
 * mat-vec: one type and row length, every tensor before the last a whole number of 256-byte units (no padding
 * between them) and of rows whose outputs land at 256-byte aligned offsets (bindable sub-ranges).
 */
function inProjGroup(file: GgufFile, l: number, ids: readonly TensorId[]): string[] {
  const names = ids.map((id) => tensorName(id, l)).filter((n) => file.tensors.has(n));
  const out: string[] = [];
  let rows = 0;
  for (const name of names) {
    const t = file.tensor(name);
    const first = out.length === 0 ? t : file.tensor(out[0]!);
    const prev = out.length === 0 ? undefined : file.tensor(out.at(-1)!);
    if (t.type.id !== first.type.id || t.ne[0] !== first.ne[0]) break;
    // ssm_alpha is read through ssm_beta's output range (gdn_step A_OFF), so its start need not be aligned.
    const joined = name === tensorName("ssm_alpha", l);
    if (prev && (prev.nbytes % PACK_ALIGN_BYTES !== 0 || (!joined && (rows * 4) % PACK_ALIGN_BYTES !== 0))) {
      break;
    }
    out.push(name);
    rows += t.nElems / (t.ne[0] ?? 1);
  }
  return out;
}

/**
 * Whether the shared expert can run as expert index nExpert of the routed tensors: same types, same FFN
 * width, and each routed tensor a whole number of 256-byte units so the packed shared matrix follows it
 * with no padding.
 */
function sharedFusable(
  file: GgufFile,
  hp: Hparams,
  routed: readonly string[],
  shared: readonly string[],
): boolean {
  if (hp.nFfExp !== hp.nFfShexp) return false;
  return routed.every((name, i) => {
    const r = file.tensor(name);
    const s = file.tensor(shared[i]!);
    return r.type.id === s.type.id && r.nbytes % PACK_ALIGN_BYTES === 0;
  });
}

/**
 * Workgroups per v-head of `gdn_step` (its SPLIT): 4 where the head dim allows (D_V a multiple of 64), else 2 or
 * 1. H200, bench/gdn_chunk.ts at 35B-A3B dims, one decode step with the gated norm: 20.3 µs at 1, 16.9 at 2,
 * 14.9 at 4, 15.0 at 8 (docs/PERF.md).
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

interface BuildContext {
  readonly stage: Stage;
  readonly slot: number;
  readonly rows: "all" | "last" | "none";
  readonly act: Record<string, GPUBuffer>;
  readonly pos: GPUBuffer;
  readonly zeroIds: GPUBuffer;
  readonly layers: readonly LayerWeights[];
  readonly firstLayer: number;
  readonly gdn: (layout: DeltaNetLayout | undefined) => GdnStepConstants;
  readonly embd: GpuTensor | undefined;
  readonly outNorm: GpuTensor | undefined;
  readonly lmHead: GpuTensor | undefined;
  /**
   * A batched decode step: one token of each of these slots (n = slots.length ≥ 2, column b = slots[b]), each
   * with its own position params [pos, 1] and id buffer (the previous step's id, read by its embedding).
   * Shared projections and experts take all columns; attention and DeltaNet run per slot on their state.
   */
  readonly batch?: BatchSlots;
}

/** The per-slot buffers of a batched decode graph (see {@linkcode BuildContext.batch}). */
interface BatchSlots {
  readonly slots: readonly number[];
  readonly pos: readonly GPUBuffer[];
  readonly tok: readonly GPUBuffer[];
}

/**
 * Default tallest mat-vec that takes a deferred norm in its prologue. Measured on the H200 (docs/PERF.md): the
 * router (257 rows) gains; the LM head (248k rows, ~31k workgroups each re-summing the norm) went from 483 to
 * 627 µs against ~10 µs for the norm's own dispatch (1eed379); the in-projections (~9-12k rows) with their
 * norm as a dispatch of its own made the whole step 1.5% faster (149.3 against 147 tok/s, limits 1024 and
 * 8192 alike, third session) while they ran one row per team; with 4 rows per team (a quarter of the
 * workgroups) the prologue wins: 191.1 against 185.4 tok/s at limit 16384 (fifth session).
 */
const NORM_PROLOGUE_MAX_ROWS = 16384;

/** A norm fused into the residual add before it: weight and output rows. */
interface FusedNorm {
  readonly w: GpuTensor;
  readonly y: GPUBuffer;
}

/** Builds the dispatch list of one chunk of `n` tokens. */
class GraphBuilder {
  readonly #device: GPUDevice;
  readonly #cache: PipelineCache;
  readonly #hp: Hparams;
  readonly #n: number;
  readonly #ops: Op[] = [];
  readonly #owned: GPUBuffer[];
  #unused: GPUBuffer | undefined;
  /** The x the last prefill matmul under int8Activations rounded, and the op count after it (see #matvec). */
  #lastRound:
    | { from: GPUBuffer; k: number; cols: number; out: GPUBuffer; at: number }
    | undefined;
  /** Buffers of this graph by purpose (#grown). */
  readonly #grownBufs = new Map<string, GPUBuffer>();
  readonly #normPrologueMaxRows: number;
  readonly #matvecTuning: StageOptions["matvecTuning"];
  readonly #moeTuning: StageOptions["moeTuning"];
  readonly #fuseDecodeRoute: boolean;
  readonly #groupedExperts: boolean;
  readonly #int8Activations: boolean;
  /** int8 x buffers (quantize_q8's output) by K, created on first use. */
  readonly #xq = new Map<number, GPUBuffer>();
  /** The x the last int8 mat-vec quantized, and the op count after it (see #matvecQ8). */
  #lastQ8:
    | { x: GPUBuffer; k: number; layout: number; cols: number; regions: Binding[]; at: number }
    | undefined;
  /** Stage int8Log: the log buffer, the entries of this graph, and the next free byte. */
  readonly #int8Log: { buffer: GPUBuffer; entries: Int8LogEntry[] } | undefined;
  #logAt = 0;
  /** A decode norm not pushed yet (see #norm). */
  #pending: { label: string; x: GPUBuffer; w: GpuTensor; y: GPUBuffer } | undefined;

  /** @param owned receives every buffer the graph creates (its owner destroys them) */
  constructor(
    device: GPUDevice,
    cache: PipelineCache,
    hp: Hparams,
    n: number,
    owned: GPUBuffer[],
    opts: {
      normPrologueMaxRows: number;
      moeTuning: StageOptions["moeTuning"];
      matvecTuning: StageOptions["matvecTuning"];
      fuseDecodeRoute: boolean;
      groupedExperts: boolean;
      int8Activations: boolean;
      int8Log?: { buffer: GPUBuffer; entries: Int8LogEntry[] };
    },
  ) {
    this.#normPrologueMaxRows = opts.normPrologueMaxRows;
    this.#fuseDecodeRoute = opts.fuseDecodeRoute;
    this.#groupedExperts = opts.groupedExperts;
    this.#int8Activations = opts.int8Activations;
    this.#int8Log = opts.int8Log;
    this.#moeTuning = opts.moeTuning;
    this.#matvecTuning = opts.matvecTuning;
    this.#device = device;
    this.#cache = cache;
    this.#hp = hp;
    this.#n = n;
    this.#owned = owned;
  }

  async build(cx: BuildContext): Promise<Op[]> {
    const hp = this.#hp;
    const n = this.#n;
    const A = cx.act;
    if (cx.embd && cx.batch) {
      // One row per slot, from the id its previous step's argmax or sampler wrote.
      const shape = { type: typeName(cx.embd), k: hp.nEmbd, n: hp.nVocab, nTokens: 1 };
      const c = getRowsConstants(shape);
      const params = this.#storage(getRowsParams(shape));
      for (const [b, tok] of cx.batch.tok.entries()) {
        await this.#push(`get_rows.${b}`, GET_ROWS, c, [
          params,
          tok,
          part0(cx.embd),
          sub(A.h!, b * hp.nEmbd, hp.nEmbd),
        ], getRowsGrid(shape));
      }
    } else if (cx.embd) {
      const shape = { type: typeName(cx.embd), k: hp.nEmbd, n: hp.nVocab, nTokens: n };
      const c = getRowsConstants(shape);
      await this.#push("get_rows", GET_ROWS, c, [
        this.#storage(getRowsParams(shape)),
        A.tokens!,
        part0(cx.embd),
        A.h!,
      ], getRowsGrid(shape));
    }
    // Decode (n = 1): every norm rides on the mat-vec that reads it (matvec NORM: x = h, the normed rows
    // written for the block's other readers) and each output projection adds into h itself (ACC), so no norm
    // and no residual add has a dispatch of its own. Prefill: each norm but the stage's first rides on the
    // residual add before it (residual_add NORM).
    const decode = n === 1;
    const head = cx.outNorm !== undefined && cx.lmHead !== undefined && cx.rows !== "none";
    // The fused output norm writes every row in place; the LM head reads from row 0, so fuse it only when
    // that is the row it wants.
    const fuseOutNorm = head && !decode && cx.rows === "all";
    for (const [i, lw] of cx.layers.entries()) {
      const l = cx.firstLayer + i;
      if (i === 0 || decode) await this.#norm(`L${l}.attn_norm`, A.h!, lw.t("attn_norm"), A.a!);
      if (lw.attention) await this.#attention(cx, l, lw);
      else await this.#deltaNet(cx, l, lw);
      if (decode) {
        await this.#norm(`L${l}.post_attention_norm`, A.h!, lw.t("post_attention_norm"), A.m!);
      } else {
        await this.#residual(`L${l}.residual_mixer+post_attention_norm`, A.t!, A.h!, {
          w: lw.t("post_attention_norm"),
          y: A.m!,
        });
      }
      const next = cx.layers[i + 1];
      const norm = decode
        ? undefined
        : next
        ? { w: next.t("attn_norm"), y: A.a! }
        : fuseOutNorm
        ? { w: cx.outNorm!, y: A.a! }
        : undefined;
      await this.#moe(cx, l, lw, norm);
    }
    if (head && decode) await this.#norm("output_norm", A.h!, cx.outNorm!, A.a!);
    if (head && !decode && !fuseOutNorm) {
      const first = cx.rows === "all" ? 0 : n - 1;
      const rows = cx.rows === "all" ? n : 1;
      await this.#rmsNorm(
        "output_norm",
        sub(A.h!, first * hp.nEmbd, rows * hp.nEmbd),
        cx.outNorm!,
        A.a!,
        rows,
      );
    }
    if (head) {
      // A batched step's logits rows start 256-byte aligned: each slot's sampler binds its own row.
      await this.#matvec("output", cx.lmHead!, A.a!, A.logits!, cx.rows === "all" ? n : 1, {
        yStride: cx.batch ? padWords(hp.nVocab) : undefined,
      });
    }
    return this.#ops;
  }

  /** Pushes one dispatch whose twin checks the buffers while building the bind group (`bindGroupOf`). */
  async #checked(
    label: string,
    spec: KernelSpec,
    c: ConstValues,
    bindGroupOf: (pipeline: GPUComputePipeline) => GPUBindGroup,
    grid: readonly number[],
  ) {
    if (this.#pending && spec !== MATVEC) await this.#flushNorm();
    const pipeline = await this.#cache.get(spec, c);
    this.#ops.push({
      label,
      pipeline,
      bindGroup: bindGroupOf(pipeline),
      grid: [grid[0] ?? 1, grid[1] ?? 1, grid[2] ?? 1],
    });
  }

  /** Pushes one dispatch with bindings in binding order (checked by the caller). */
  #push(
    label: string,
    spec: KernelSpec,
    c: ConstValues,
    bindings: readonly Binding[],
    grid: readonly number[],
  ) {
    return this.#checked(label, spec, c, (p) => bindGroup(this.#device, p, bindings), grid);
  }

  /** A small constant params buffer (storage and uniform: mat-vec params bind as uniform, others as storage). */
  #storage(words: Uint32Array): GPUBuffer {
    const buf = this.#device.createBuffer({
      size: Math.max(16, words.byteLength),
      usage: GPUBufferUsage.STORAGE | GPUBufferUsage.UNIFORM | GPUBufferUsage.COPY_DST,
      mappedAtCreation: true,
    });
    new Uint32Array(buf.getMappedRange()).set(words);
    buf.unmap();
    this.#owned.push(buf);
    return buf;
  }

  async #rmsNorm(label: string, x: Binding, w: GpuTensor, y: GPUBuffer, rows: number) {
    const c: RmsNormConstants = { N: this.#hp.nEmbd, EPS: this.#hp.rmsEps, WG: 256 };
    await this.#checked(
      label,
      RMS_NORM,
      c,
      (pipeline) =>
        rmsNormBindGroup(this.#device, {
          pipeline,
          constants: c,
          nRows: rows,
          buffers: { x, w: part0(w), y },
        }),
      rmsNormGrid(rows),
    );
  }

  /**
   * y = RMSNorm(x)·w, one row per token. Decode defers it: the next mat-vec that reads y computes it in its
   * prologue (matvec NORM) and writes y; any other kernel pushed first gets it as its own dispatch.
   */
  async #norm(label: string, x: GPUBuffer, w: GpuTensor, y: GPUBuffer) {
    await this.#flushNorm();
    // A deferred norm writes y later without an op now: no int8 x quantized before it may be reused.
    this.#lastQ8 = undefined;
    if (this.#n === 1) this.#pending = { label, x, w, y };
    else await this.#rmsNorm(label, x, w, y, this.#n);
  }

  /** Pushes a deferred norm as its own dispatch. */
  async #flushNorm() {
    const p = this.#pending;
    if (!p) return;
    this.#pending = undefined;
    await this.#rmsNorm(p.label, p.x, p.w, p.y, 1);
  }

  /** y[col][r] = W·x[col] for `cols` columns of x (stride K) into y (stride N), rows [rowStart, rowStart+rows). */
  async #matvec(
    label: string,
    w: GpuTensor,
    x: GPUBuffer,
    y: GPUBuffer,
    cols: number,
    opts: { rowStart?: number; rows?: number; acc?: boolean; yStride?: number; f32?: boolean } = {},
  ) {
    if (
      this.#int8Activations && !opts.f32 && cols <= MATVEC_MAX_COLS && MATVEC_Q8_TYPES.includes(typeName(w))
    ) {
      return await this.#matvecQ8(label, w, x, y, cols, opts);
    }
    // A deferred norm whose output this mat-vec reads: computed in its prologue (every dispatch below),
    // unless the mat-vec is so tall that its workgroups re-summing the norm cost more than a dispatch.
    const allRows = opts.rows ?? (w.parts.reduce((s, p) => s + p.nRows, 0) - (opts.rowStart ?? 0));
    const norm = this.#pending && this.#pending.y === x && cols === 1 && allRows <= this.#normPrologueMaxRows
      ? this.#pending
      : undefined;
    // A mat-vec that writes the deferred norm's input or output (or reads its output with several columns)
    // must come after it: push the norm first.
    if (!norm && this.#pending && (y === this.#pending.x || y === this.#pending.y || x === this.#pending.y)) {
      await this.#flushNorm();
    }
    if (norm) {
      this.#pending = undefined;
      label = `${label}+${norm.label.replace(/^L\d+\./, "")}`;
      x = norm.x;
    }
    const k = w.ne[0]!;
    let roundedFrom: GPUBuffer | undefined;
    if (
      this.#int8Activations && !opts.f32 && cols > MATVEC_MAX_COLS && MATVEC_Q8_TYPES.includes(typeName(w))
    ) {
      // The rounded x of the matmul pushed last when it read the same x and nothing was pushed since
      // (attn_qkv, attn_gate, ssm_beta, ssm_alpha of a chunk), else rounded here. The values d·q do not
      // depend on the weight type (only the logged byte order does).
      const last = this.#lastRound;
      const reuse = last !== undefined && last.from === x && last.k === k && last.cols === cols &&
        last.at === this.#ops.length;
      roundedFrom = x;
      x = reuse ? last.out : await this.#roundX(label, x, k, cols, typeName(w), "dense");
    }
    const rowStart = opts.rowStart ?? 0;
    const nRows = opts.rows ?? (w.parts.reduce((s, p) => s + p.nRows, 0) - rowStart);
    for (const p of w.parts) {
      const lo = Math.max(rowStart, p.firstRow);
      const hi = Math.min(rowStart + nRows, p.firstRow + p.nRows);
      if (lo >= hi) continue;
      if (cols > MATVEC_MAX_COLS) {
        assert(opts.yStride === undefined, `${label}: a padded column stride is for mat-vecs only`);
        if (opts.acc || norm) {
          throw new Error(`${label}: NORM and ACC are decode-only (matvec), not for ${cols} columns`);
        }
        // Prefill: the register-tiled matmul reads each weight tile once per tile of tokens.
        const shape: MatmulShape = {
          type: typeName(w),
          k,
          n: hi - lo,
          m: cols,
          wOffsetBytes: p.offsetBytes + (lo - p.firstRow) * w.rowBytes,
          xStride: k,
          yOffset: lo - rowStart,
          yStride: nRows,
        };
        const plan = matmulPlan(shape, this.#device.limits.maxComputeWorkgroupStorageSize);
        // Small N: runs of K in workgroups of their own into a scratch binding, added by matmul_splits.
        const part = plan.sum && this.#splitPart(plan.sum.partBytes);
        await this.#push(
          label,
          MATMUL,
          plan.constants,
          [this.#storage(plan.params), p.buffer, x, part ?? y, x],
          plan.grid,
        );
        if (plan.sum) {
          await this.#push(
            `${label}.splits`,
            MATMUL_SPLITS,
            {},
            [this.#storage(plan.sum.params), part!, y],
            plan.sum.grid,
          );
        }
        continue;
      }
      for (let c0 = 0; c0 < cols; c0 += 8) {
        const batch = Math.min(8, cols - c0);
        const shape: MatvecShape = {
          type: typeName(w),
          k,
          n: hi - lo,
          batch,
          wOffsetBytes: p.offsetBytes + (lo - p.firstRow) * w.rowBytes,
          xOffset: c0 * k,
          xStride: k,
          yOffset: c0 * (opts.yStride ?? nRows) + (lo - rowStart),
          yStride: opts.yStride ?? nRows,
        };
        const c = matvecConstants(shape, {
          norm: norm ? { eps: this.#hp.rmsEps } : undefined,
          acc: opts.acc,
          ...(batch === 1 ? this.#matvecTuning : undefined),
        });
        const params = this.#storage(matvecParams(shape));
        await this.#push(label, MATVEC, c, [
          params,
          p.buffer,
          x,
          y,
          norm ? part0(norm.w) : x,
          norm ? norm.y : this.#scratch(),
        ], [...matvecGrid(shape, c), 1]);
      }
    }
    if (roundedFrom) this.#lastRound = { from: roundedFrom, k, cols, out: x, at: this.#ops.length };
  }

  /**
   * `#matvec` with int8 x (StageOptions.int8Activations): per column, matvec_q8_fused on the first part of W
   * (quantizing x in its prologue, with a deferred norm of x, whose normed rows it also writes for the block's
   * other readers; it leaves the int8 x in the graph's int8 buffer for K), then matvec_q8 on the other parts.
   * Where that part is taller than normPrologueMaxRows or the fused kernel's workgroup memory does not fit the
   * device, a quantize_q8 dispatch comes first and every part runs matvec_q8.
   */
  async #matvecQ8(
    label: string,
    w: GpuTensor,
    x: GPUBuffer,
    y: GPUBuffer,
    cols: number,
    opts: { rowStart?: number; rows?: number; acc?: boolean; yStride?: number },
  ) {
    const p = this.#pending;
    const norm = p && p.y === x && cols === 1 ? p : undefined;
    if (norm) {
      this.#pending = undefined;
      label = `${label}+${norm.label.replace(/^L\d+\./, "")}`;
    }
    const type = typeName(w);
    const k = w.ne[0]!;
    const layout = q8Layout(type);
    const rowStart = opts.rowStart ?? 0;
    const nRows = opts.rows ?? (w.parts.reduce((s, q) => s + q.nRows, 0) - rowStart);
    // The int8 x of every column: quantized by the int8 mat-vec pushed last when it read the same x and
    // nothing was pushed since (attn_qkv, attn_gate, ssm_beta, ... of a chunk; unfused attn_q/k/v), else here.
    const last = this.#lastQ8;
    const reuse = !norm && last !== undefined && last.x === x && last.k === k && last.layout === layout &&
      last.cols === cols && last.at === this.#ops.length;
    const regions: Binding[] = reuse ? last.regions : [];
    const parts = w.parts.flatMap((part) => {
      const lo = Math.max(rowStart, part.firstRow);
      const hi = Math.min(rowStart + nRows, part.firstRow + part.nRows);
      return lo < hi ? [{ part, lo, hi }] : [];
    });
    const shapeOf = (col: number, { part, lo, hi }: (typeof parts)[number]): MatvecQ8Shape => ({
      type,
      k,
      n: hi - lo,
      wOffsetBytes: part.offsetBytes + (lo - part.firstRow) * w.rowBytes,
      yOffset: col * (opts.yStride ?? nRows) + (lo - rowStart),
    });
    // Each column's int8 x in a region of its own of the graph's buffer for K (or of the int8 log).
    const stride = Math.ceil(q8xBytes(k) / 256) * 256;
    let shared = this.#xq.get(k);
    if (!reuse && !shared) {
      shared = this.#device.createBuffer({
        label: `int8 x K=${k}`,
        size: MATVEC_MAX_COLS * stride,
        usage: GPUBufferUsage.STORAGE,
      });
      this.#owned.push(shared);
      this.#xq.set(k, shared);
    }
    for (let col = 0; col < cols; col++) {
      let first = 0; // the parts before it took this column's x from a fused mat-vec
      if (!reuse) {
        let xq: Binding = { buffer: shared!, offset: col * stride, size: q8xBytes(k) };
        const log = this.#int8Log;
        if (log) {
          const offset = this.#logAt;
          this.#logAt = Math.ceil((offset + q8xBytes(k)) / 256) * 256;
          assert(this.#logAt <= log.buffer.size, `int8 log of ${log.buffer.size} bytes is full at ${label}`);
          log.entries.push({ label, col, k, type, offset });
          xq = { buffer: log.buffer, offset, size: q8xBytes(k) };
        }
        regions.push(xq);
        const xOffset = norm ? 0 : col * k;
        const normOpt = norm ? { eps: this.#hp.rmsEps } : undefined;
        const xBind = norm ? norm.x : x;
        const [nw, xn] = normBindings(this.#device, {
          x: xBind,
          nw: norm ? part0(norm.w) : undefined,
          xn: norm ? norm.y : undefined,
        });
        // The first part's mat-vec quantizes x in its prologue (matvec_q8_fused) and leaves the int8 x in the
        // region for the other parts and the mat-vecs after it. A quantize_q8 dispatch of its own does it
        // where the part is taller than normPrologueMaxRows (every workgroup repeats the prologue: on the H200
        // 0.100 against 0.088 ms for the pair at 131072 rows, 0.0155 against 0.0158 at 8192, docs/PERF.md) or
        // the fused kernel's workgroup memory does not fit the device.
        const fs: MatvecQ8FusedShape | undefined = parts.length > 0
          ? { ...shapeOf(col, parts[0]!), xOffset, norm: normOpt }
          : undefined;
        const fc = fs && matvecQ8FusedConstants(fs, { acc: opts.acc });
        if (
          fs && fc && fs.n <= this.#normPrologueMaxRows &&
          matvecQ8FusedWorkgroupBytes(fc) <= this.#device.limits.maxComputeWorkgroupStorageSize
        ) {
          const part = parts[0]!.part;
          const b: MatvecQ8FusedBindings = {
            params: this.#storage(matvecQ8Params(fs)),
            weights: part.buffer,
            x: xBind,
            nw,
            xn,
            xo: xq,
            y,
          };
          checkMatvecQ8Fused(fs, fc, b);
          await this.#push(label, MATVEC_Q8_FUSED, fc, [
            b.params,
            part.buffer,
            part.buffer,
            xBind,
            nw,
            xn,
            xq,
            y,
          ], [
            ...matvecQ8Grid(fs, fc),
            1,
          ]);
          first = 1;
        } else {
          const qs: QuantizeQ8Shape = { type, k, xOffset, norm: normOpt };
          const qb: QuantizeQ8Bindings = {
            params: this.#storage(quantizeQ8Params(qs)),
            x: xBind,
            xq,
            nw,
            xn,
          };
          checkQuantizeQ8(qs, qb);
          // A deferred norm this quantize does not take is pushed first (#checked), before anything reads x.
          await this.#push(`${label}.q8`, QUANTIZE_Q8, quantizeQ8Constants(qs), [
            qb.params,
            xBind,
            xq,
            nw,
            xn,
          ], [
            ...quantizeQ8Grid(qs),
            1,
          ]);
        }
      }
      const xq = regions[col]!;
      for (const at of parts.slice(first)) {
        const shape = shapeOf(col, at);
        const c = matvecQ8Constants(shape, { acc: opts.acc });
        const b: MatvecQ8Bindings = {
          params: this.#storage(matvecQ8Params(shape)),
          weights: at.part.buffer,
          xq,
          y,
        };
        checkMatvecQ8(shape, c, b);
        await this.#push(label, MATVEC_Q8, c, [b.params, at.part.buffer, at.part.buffer, xq, xq, y], [
          ...matvecQ8Grid(shape, c),
          1,
        ]);
      }
    }
    this.#lastQ8 = { x, k, layout, cols, regions, at: this.#ops.length };
  }

  /**
   * Decode (n = 1) of the longest leading run (≥ 2) of `ws` packed back to back in one buffer, as ONE
   * mat-vec into `out`; returns the output row offset of each fused tensor (empty when nothing was fused).
   * Every fused tensor's output must start 256-byte aligned (a bindable range) unless it is `joined`: read
   * through the previous tensor's range.
   */
  async #fusedMatvec(
    label: string,
    ws: readonly GpuTensor[],
    x: GPUBuffer,
    out: GPUBuffer,
    opts: { joined?: GpuTensor; f32?: boolean } = {},
  ): Promise<number[]> {
    if (this.#n !== 1) return [];
    const first = ws[0]!;
    const p0 = first.parts[0]!;
    let end = 0;
    const offsets: number[] = [];
    for (const w of ws) {
      const p = w.parts[0]!;
      const contiguous = w.parts.length === 1 && p.buffer === p0.buffer && w.type.id === first.type.id &&
        w.ne[0] === first.ne[0] && p.offsetBytes === p0.offsetBytes + end * first.rowBytes;
      const aligned = (end * 4) % 256 === 0 || w === opts.joined;
      if (!contiguous || !aligned) break;
      offsets.push(end);
      end += p.nRows;
    }
    if (offsets.length < 2) return [];
    const whole: GpuTensor = {
      name: ws.slice(0, offsets.length).map((w) => w.name).join("+"),
      type: first.type,
      ne: [first.ne[0]!, end],
      rowBytes: first.rowBytes,
      parts: [{
        buffer: p0.buffer,
        offsetBytes: p0.offsetBytes,
        firstRow: 0,
        nRows: end,
        sizeBytes: end * first.rowBytes,
      }],
    };
    await this.#matvec(label, whole, x, out, 1, { f32: opts.f32 });
    return offsets;
  }

  /** A mixer's output projection: decode adds W·x into h (ACC); prefill writes t for the residual add. */
  /** After a split `gdn_step` (SPLIT > 1, y holds o): the gated norm of its n tokens in place (spec §8.7). */
  async #gdnStepNorm(label: string, c: GdnStepConstants, b: GdnStepBindings, n: number) {
    if (!gdnStepNeedsNorm(c)) return;
    await this.#push(
      label,
      GDN_CHUNK_NORM,
      { N_V: c.N_V, D_V: c.D_V, EPS: c.EPS },
      GDN_CHUNK_NORM_BINDINGS.map((k) => b[k]),
      [c.N_V, n, 1],
    );
  }

  async #outProj(label: string, w: GpuTensor, x: GPUBuffer, t: GPUBuffer, h: GPUBuffer) {
    if (this.#n === 1) await this.#matvec(`${label}+residual`, w, x, h, 1, { acc: true });
    else await this.#matvec(label, w, x, t, this.#n);
  }

  /** h += t, and with `norm` y = RMSNorm(h)·w in the same dispatch. */
  async #residual(label: string, t: GPUBuffer, h: GPUBuffer, norm?: FusedNorm) {
    const c: ResidualAddConstants = {
      D: this.#hp.nEmbd,
      N_TERMS: 1,
      WEIGHTED: false,
      SHARED: false,
      ...this.#normConstants(norm),
    };
    const params = this.#storage(Uint32Array.of(this.#n, 0));
    await this.#push(label, RESIDUAL_ADD, c, [
      params,
      t,
      t,
      t,
      t,
      h,
      norm ? part0(norm.w) : t,
      norm?.y ?? this.#scratch(),
    ], residualAddGrid(c, this.#n));
  }

  /** The NORM and EPS constants of residual_add for an optional fused norm. */
  #normConstants(norm: FusedNorm | undefined): { NORM: boolean; EPS: number } {
    return norm ? { NORM: true, EPS: this.#hp.rmsEps } : { NORM: false, EPS: 0 };
  }

  /**
   * int8Activations in a prefill chunk (wider than the int8 mat-vecs take): x's `cols` columns of K rounded
   * to int8 per 32 elements as the mat-vecs round them (quantize_q8 ROUND), written back as f32 (d·q, exact)
   * into a buffer of the graph for `use`, which the f32 matmul or moe_matvec then reads instead of x. So a
   * prompt rounds alike in every chunk width, and the products differ from the int8 mat-vecs' only in f32
   * summation order. Logged like the mat-vecs' roundings (int8Log), in `type`'s byte order.
   */
  async #roundX(
    label: string,
    x: GPUBuffer,
    k: number,
    cols: number,
    type: GgmlTypeName,
    use: "dense" | "moe_in" | "moe_act",
  ): Promise<GPUBuffer> {
    const out = this.#grown(`int8-rounded x (${use})`, 4 * k * cols);
    const xq = this.#q8Region(label, k, type, cols, "prefill");
    const qs: QuantizeQ8Shape = { type, k, cols, round: true };
    const qb: QuantizeQ8Bindings = { params: this.#storage(quantizeQ8Params(qs)), x, xq, xn: out };
    checkQuantizeQ8(qs, qb);
    await this.#push(`${label}.q8`, QUANTIZE_Q8, quantizeQ8Constants(qs), [
      qb.params,
      x,
      xq,
      x,
      out,
    ], [...quantizeQ8Grid(qs), 1]);
    return out;
  }

  /** A buffer of the graph for `name`, at least `bytes` long (created or replaced by a bigger one). */
  #grown(name: string, bytes: number): GPUBuffer {
    let buf = this.#grownBufs.get(name);
    if (!buf || buf.size < bytes) {
      buf = this.#device.createBuffer({
        label: name,
        size: Math.ceil(bytes / 256) * 256,
        usage: GPUBufferUsage.STORAGE,
      });
      this.#owned.push(buf);
      this.#grownBufs.set(name, buf);
    }
    return buf;
  }

  /** The split-K matmuls' partial products: one buffer per graph, grown as needed (`bytes` of it). */
  #splitPart(bytes: number): Binding {
    return { buffer: this.#grown("matmul split partials", bytes), offset: 0, size: bytes };
  }

  /** A 16-byte buffer for writable bindings a variant does not use (one per graph). */
  #scratch(): GPUBuffer {
    if (!this.#unused) {
      this.#unused = this.#device.createBuffer({ size: 16, usage: GPUBufferUsage.STORAGE });
      this.#owned.push(this.#unused);
    }
    return this.#unused;
  }

  async #attention(cx: BuildContext, l: number, lw: LayerWeights) {
    const hp = this.#hp;
    const n = this.#n;
    const A = cx.act;
    let qf: Binding = A.qf!;
    let k: Binding = A.k!;
    let v: Binding = A.v!;
    const nQf = 2 * hp.nHead * hp.headDim;
    const nKv = hp.nHeadKv * hp.headDim;
    const qkv = [lw.t("attn_q"), lw.t("attn_k"), lw.t("attn_v")];
    const fused = await this.#fusedMatvec(`L${l}.attn_in_proj`, qkv, A.a!, A.inproj!);
    if (fused.length >= 2) {
      qf = sub(A.inproj!, 0, nQf);
      k = sub(A.inproj!, nQf, nKv);
    } else {
      await this.#matvec(`L${l}.attn_q`, qkv[0]!, A.a!, A.qf!, n);
      await this.#matvec(`L${l}.attn_k`, qkv[1]!, A.a!, A.k!, n);
    }
    if (fused.length === 3) v = sub(A.inproj!, nQf + nKv, nKv);
    else await this.#matvec(`L${l}.attn_v`, qkv[2]!, A.a!, A.v!, n);
    if (cx.batch) {
      // Per slot: its column of q/k/v, its KV cache and position.
      const nQ = hp.nHead * hp.headDim;
      for (const [b, slot] of cx.batch.slots.entries()) {
        const kCache = cx.stage.states.buffer(slot, l, "k_cache");
        const vCache = cx.stage.states.buffer(slot, l, "v_cache");
        const qfB = sub(A.qf!, b * nQf, nQf);
        const qB = sub(A.q!, b * nQ, nQ);
        const pos = cx.batch.pos[b]!;
        await this.#qkRope(`L${l}.attn_qk_rope.${b}`, lw, cx, 1, {
          params: pos,
          qf: qfB,
          k: sub(A.k!, b * nKv, nKv),
          v: sub(A.v!, b * nKv, nKv),
          qOut: qB,
          kCache,
          vCache,
        });
        await this.#attnDecode(`L${l}`, `.${b}`, cx, {
          pos,
          q: qB,
          kCache,
          vCache,
          qf: qfB,
          o: sub(A.o!, b * nQ, nQ),
        });
      }
    } else {
      const kCache = cx.stage.states.buffer(cx.slot, l, "k_cache");
      const vCache = cx.stage.states.buffer(cx.slot, l, "v_cache");
      await this.#qkRope(`L${l}.attn_qk_rope`, lw, cx, n, {
        params: cx.pos,
        qf,
        k,
        v,
        qOut: A.q!,
        kCache,
        vCache,
      });
      if (n === 1) {
        await this.#attnDecode(`L${l}`, "", cx, { pos: cx.pos, q: A.q!, kCache, vCache, qf, o: A.o! });
      } else {
        const pc: AttnPrefillConstants = {
          H_Q: hp.nHead,
          H_KV: hp.nHeadKv,
          D_H: hp.headDim,
          P_MAX: cx.stage.nCtx,
          BQ: 1,
          TILE: 8,
          WG: 256,
          SCALE: hp.attnScale,
          KV_F16: false,
        };
        await this.#checked(
          `L${l}.attn_prefill`,
          ATTN_PREFILL,
          pc,
          (pipeline) =>
            attnPrefillBindGroup(this.#device, {
              pipeline,
              constants: pc,
              nTokens: n,
              buffers: { params: cx.pos, q: A.q!, qf, kCache, vCache, o: A.o! },
            }),
          attnPrefillGrid(pc, n),
        );
      }
    }
    await this.#outProj(`L${l}.attn_output`, lw.t("attn_output"), A.o!, A.t!, A.h!);
  }

  /** q/k norms, RoPE and the KV cache write of `nTokens` tokens. */
  async #qkRope(
    label: string,
    lw: LayerWeights,
    cx: BuildContext,
    nTokens: number,
    buffers: {
      params: Binding;
      qf: Binding;
      k: Binding;
      v: Binding;
      qOut: Binding;
      kCache: GPUBuffer;
      vCache: GPUBuffer;
    },
  ) {
    const hp = this.#hp;
    const rope: AttnQkRopeConstants = {
      H_Q: hp.nHead,
      H_KV: hp.nHeadKv,
      D_H: hp.headDim,
      N_ROT: hp.ropeDim,
      P_MAX: cx.stage.nCtx,
      WG: 64,
      ROPE_THETA: hp.ropeBase,
      EPS: hp.rmsEps,
      KV_F16: false,
    };
    await this.#checked(
      label,
      ATTN_QK_ROPE,
      rope,
      (pipeline) =>
        attnQkRopeBindGroup(this.#device, {
          pipeline,
          constants: rope,
          nTokens,
          buffers: {
            ...buffers,
            qNorm: part0(lw.t("attn_q_norm")),
            kNorm: part0(lw.t("attn_k_norm")),
          },
        }),
      attnQkRopeGrid(rope, nTokens),
    );
  }

  /** Split-K decode attention of one token and the combine of its splits (with the output gate). */
  async #attnDecode(
    label: string,
    suffix: string,
    cx: BuildContext,
    x: { pos: Binding; q: Binding; kCache: GPUBuffer; vCache: GPUBuffer; qf: Binding; o: Binding },
  ) {
    const hp = this.#hp;
    const A = cx.act;
    const dc: AttnDecodeConstants = {
      H_Q: hp.nHead,
      H_KV: hp.nHeadKv,
      D_H: hp.headDim,
      P_MAX: cx.stage.nCtx,
      N_SPLIT: ATTN_SPLITS,
      TILE: 16,
      WG: 256,
      SCALE: hp.attnScale,
      KV_F16: false,
    };
    await this.#checked(
      `${label}.attn_decode${suffix}`,
      ATTN_DECODE,
      dc,
      (pipeline) =>
        attnDecodeBindGroup(this.#device, {
          pipeline,
          constants: dc,
          buffers: {
            params: x.pos,
            q: x.q,
            kCache: x.kCache,
            vCache: x.vCache,
            partO: A.partO!,
            partMl: A.partMl!,
          },
        }),
      attnDecodeGrid(dc),
    );
    const cc: AttnCombineConstants = { H_Q: hp.nHead, D_H: hp.headDim, N_SPLIT: ATTN_SPLITS, WG: 64 };
    await this.#checked(
      `${label}.attn_combine${suffix}`,
      ATTN_COMBINE,
      cc,
      (pipeline) =>
        attnCombineBindGroup(this.#device, {
          pipeline,
          constants: cc,
          buffers: { partO: A.partO!, partMl: A.partMl!, qf: x.qf, o: x.o },
        }),
      attnCombineGrid(cc),
    );
  }

  async #deltaNet(cx: BuildContext, l: number, lw: LayerWeights) {
    const n = this.#n;
    const A = cx.act;
    const c0 = cx.gdn(lw.layout);
    const d = gdnDims(c0);
    const nV = c0.N_V;
    const legacy = lw.layout === "ssm_in";
    // Decode: the in-projections as one mat-vec over their packed rows, outputs back to back in `inproj`
    // ([qkv | z | b (| a)]); whatever is not packed runs on its own.
    const ws = legacy
      ? [lw.t("ssm_in"), lw.t("ssm_ba")]
      : c0.BA_GROUPED
      ? [lw.t("attn_qkv"), lw.t("attn_gate"), lw.t("ssm_ba")]
      : [lw.t("attn_qkv"), lw.t("attn_gate"), lw.t("ssm_beta"), lw.t("ssm_alpha")];
    const fused = await this.#fusedMatvec(`L${l}.in_proj`, ws, A.a!, A.inproj!, {
      joined: c0.BA_GROUPED ? undefined : ws[3],
    });
    const nQkvz = legacy ? 1 : 2; // tensors holding qkv and z
    let xQkv: Binding = A.xqkv!;
    let z: Binding = A.z!;
    if (fused.length >= nQkvz) {
      xQkv = sub(A.inproj!, 0, d.convCh);
      z = sub(A.inproj!, d.convCh, d.inner);
    } else if (legacy) {
      const w = ws[0]!;
      await this.#matvec(`L${l}.ssm_in.qkv`, w, A.a!, A.xqkv!, n, { rowStart: 0, rows: d.convCh });
      await this.#matvec(`L${l}.ssm_in.z`, w, A.a!, A.z!, n, { rowStart: d.convCh, rows: d.inner });
    } else {
      await this.#matvec(`L${l}.attn_qkv`, ws[0]!, A.a!, A.xqkv!, n);
      await this.#matvec(`L${l}.attn_gate`, ws[1]!, A.a!, A.z!, n);
    }
    const baAt = d.convCh + d.inner;
    let b: Binding = A.ba!;
    let a: Binding = A.ba!;
    let aOff = 0;
    // A batched step binds each slot's column of b and a: columns padded to 256-byte offsets.
    const baStride = cx.batch ? padWords(c0.BA_GROUPED ? 2 * nV : nV) : undefined;
    if (c0.BA_GROUPED) {
      if (fused.length > nQkvz) {
        b = a = sub(A.inproj!, baAt, 2 * nV);
      } else {
        await this.#matvec(`L${l}.ssm_ba`, ws[nQkvz]!, A.a!, A.ba!, n, { yStride: baStride });
      }
    } else if (fused.length === 4) {
      // a right after b: both bindings take the [b | a] range, the kernel reads a at word N_V of it.
      b = a = sub(A.inproj!, baAt, 2 * nV);
      aOff = nV;
    } else {
      if (fused.length === 3) b = sub(A.inproj!, baAt, nV);
      else await this.#matvec(`L${l}.ssm_beta`, ws[2]!, A.a!, A.ba!, n, { yStride: baStride });
      await this.#matvec(`L${l}.ssm_alpha`, ws[3]!, A.a!, A.alpha!, n, { yStride: baStride });
      a = A.alpha!;
    }
    const c: GdnStepConstants = { ...c0, A_OFF: aOff };
    if (cx.batch) {
      const nBa = c0.BA_GROUPED ? 2 * nV : nV;
      for (const [col, slot] of cx.batch.slots.entries()) {
        const bindings = {
          params: cx.batch.pos[col]!,
          xQkv: sub(A.xqkv!, col * d.convCh, d.convCh),
          z: sub(A.z!, col * d.inner, d.inner),
          b: sub(A.ba!, col * baStride!, nBa),
          a: c0.BA_GROUPED ? sub(A.ba!, col * baStride!, nBa) : sub(A.alpha!, col * baStride!, nV),
          convW: part0(lw.t("ssm_conv1d")),
          dtBias: part0(lw.t("ssm_dt")),
          ssmA: part0(lw.t("ssm_a")),
          normW: part0(lw.t("ssm_norm")),
          convRing: cx.stage.states.buffer(slot, l, "conv"),
          state: cx.stage.states.buffer(slot, l, "ssm"),
          y: sub(A.y!, col * d.inner, d.inner),
        };
        checkGdnStep(c, { bindings, maxTokens: 1 });
        await this.#push(
          `L${l}.gdn_step.${col}`,
          GDN_STEP,
          c,
          GDN_STEP_BINDINGS.map((k) => bindings[k]),
          gdnStepGrid(c),
        );
        await this.#gdnStepNorm(`L${l}.gdn_norm.${col}`, c, bindings, 1);
      }
      await this.#outProj(`L${l}.ssm_out`, lw.t("ssm_out"), A.y!, A.t!, A.h!);
      return;
    }
    const convRing = cx.stage.states.buffer(cx.slot, l, "conv");
    const state = cx.stage.states.buffer(cx.slot, l, "ssm");
    const bindings = {
      params: cx.pos,
      xQkv,
      z,
      b,
      a,
      convW: part0(lw.t("ssm_conv1d")),
      dtBias: part0(lw.t("ssm_dt")),
      ssmA: part0(lw.t("ssm_a")),
      normW: part0(lw.t("ssm_norm")),
      convRing,
      state,
      y: A.y!,
    };
    if (n > MATVEC_MAX_COLS) {
      // Prefill: the chunked (WY) form, parallel within each 64-token block (spec §8.6); equal to the
      // recurrence up to f32 rounding. Short pieces keep the exact recurrence.
      const scratch = { wsQkw: A.gdnQkw!, wsUp: A.gdnUp! };
      for (const dd of gdnChunkDispatches(c, { bindings, scratch, maxTokens: n })) {
        await this.#push(`L${l}.${dd.spec.name}`, dd.spec, dd.constants, dd.bindings, dd.grid);
      }
    } else {
      checkGdnStep(c, { bindings, maxTokens: n });
      await this.#push(
        `L${l}.gdn_step`,
        GDN_STEP,
        c,
        GDN_STEP_BINDINGS.map((k) => bindings[k]),
        gdnStepGrid(c),
      );
      await this.#gdnStepNorm(`L${l}.gdn_norm`, c, bindings, n);
    }
    if (n > 1) {
      const rc: GdnConvRingConstants = { CONV_CH: d.convCh, K_CONV: c.K_CONV };
      const rb = { params: cx.pos, xQkv, convRing };
      checkGdnConvRing(rc, { bindings: rb, maxTokens: n });
      await this.#push(
        `L${l}.gdn_conv_ring`,
        GDN_CONV_RING,
        rc,
        GDN_CONV_RING_BINDINGS.map((k) => rb[k]),
        gdnConvRingGrid(rc),
      );
    }
    await this.#outProj(`L${l}.ssm_out`, lw.t("ssm_out"), A.y!, A.t!, A.h!);
  }

  /** The MoE block of layer l; `norm`: the next block's norm, written by the combine. */
  async #moe(cx: BuildContext, l: number, lw: LayerWeights, norm: FusedNorm | undefined) {
    const hp = this.#hp;
    const n = this.#n;
    const A = cx.act;
    const K = hp.nExpertUsed;
    const routerWs = [lw.t("ffn_gate_inp"), lw.t("ffn_gate_inp_shexp")];
    // The router keeps f32 x under int8Activations: a deferred norm rides on this mat-vec, and the expert
    // passes round A.m themselves (moe_matvec_q8 XIN).
    const routerFused = await this.#fusedMatvec(`L${l}.ffn_gate_inp+shexp`, routerWs, A.m!, A.router!, {
      f32: true,
    });
    if (routerFused.length === 0) {
      await this.#matvec(`L${l}.ffn_gate_inp`, routerWs[0]!, A.m!, A.router!, n, { f32: true });
    }
    // The shared expert's gate logit: row nExpert of the fused router output, or its own mat-vec.
    const gam: Binding = routerFused.length === 2 ? sub(A.router!, hp.nExpert, 1) : A.gam!;
    // The routing (softmax, top-k, weights) runs in a moe_route dispatch of its own. With fuseDecodeRoute,
    // decode runs it in the prologue of the routed gate·up pass instead (moe_matvec ROUTE, which writes ids and
    // weights for the down pass and the combine): one dispatch less, but every gate·up workgroup repeats the
    // ranking (measured slower on the H200, StageOptions.fuseDecodeRoute). Prefill never fuses: every workgroup
    // of the n·K columns would repeat it (route+gate·up 6.0 ms per layer for a 256-token chunk, docs/PERF.md).
    const route = {
      logits: A.router!,
      weights: A.wts!,
      nExpert: hp.nExpert,
      nExpertUsed: K,
      wScale: moeWeightsScale(hp.expertWeightsScale),
    };
    const fuseRoute = n === 1 && this.#fuseDecodeRoute;
    const exps = { gate: lw.t("ffn_gate_exps"), up: lw.t("ffn_up_exps"), down: lw.t("ffn_down_exps") };
    // int8Activations: moe_route also rounds each token's x for the gate·up passes that read int8 x (once,
    // instead of in every gate·up workgroup's prologue), where its workgroup memory holds the token's x.
    const xqBytes = moeRouteWorkgroupBytes({ N_EXPERT: hp.nExpert, N_EXPERT_USED: K, KC: hp.nEmbd / 32 });
    const xq8 = this.#int8Activations && n <= MATVEC_MAX_COLS && !fuseRoute &&
        xqBytes <= this.#device.limits.maxComputeWorkgroupStorageSize &&
        moeMatvecQ8Fits(this.#gateUpShape(exps, K, n, hp.nExpert, false))
      ? {
        type: typeName(exps.gate),
        binding: this.#q8Region(`L${l}.ffn_exps.gate_up`, hp.nEmbd, typeName(exps.gate), n, "in"),
      }
      : undefined;
    if (!fuseRoute) {
      const rc: MoeRouteConstants = {
        N_EXPERT: hp.nExpert,
        N_EXPERT_USED: K,
        WG: 256, // one expert per invocation: the rank count is a serial loop over all experts
        W_SCALE: route.wScale,
        XQ: xq8 !== undefined,
        KC: xq8 ? hp.nEmbd / 32 : 1,
        LAYOUT: xq8 ? q8Layout(xq8.type) : 0,
      };
      await this.#checked(`L${l}.moe_route`, MOE_ROUTE, rc, (pipeline) =>
        moeRouteBindGroup(this.#device, {
          pipeline,
          constants: rc,
          nTokens: n,
          buffers: {
            logits: A.router!,
            ids: A.ids!,
            weights: A.wts!,
            x: xq8 ? A.m! : A.router!,
            xq: xq8?.binding ?? this.#scratch(),
          },
        }), moeRouteGrid(n));
    }
    const shexp = { gate: lw.t("ffn_gate_shexp"), up: lw.t("ffn_up_shexp"), down: lw.t("ffn_down_shexp") };
    const follows = (a: GpuTensor, b: GpuTensor) =>
      a.parts.length === 1 && b.parts.length === 1 && a.parts[0]!.buffer === b.parts[0]!.buffer &&
      b.parts[0]!.offsetBytes === a.parts[0]!.offsetBytes + a.parts[0]!.sizeBytes;
    const fused = follows(exps.gate, shexp.gate) && follows(exps.up, shexp.up) &&
      follows(exps.down, shexp.down);
    // Shared activations and outputs follow the routed ones: columns [K·n, (K+1)·n) of act and eo.
    let sho: Binding = { buffer: A.eo!, offset: 4 * hp.nEmbd * K * n, size: 4 * hp.nEmbd * n };
    if (fused) {
      await this.#experts(`L${l}.ffn_exps+shexp`, {
        ...exps,
        ids: A.ids!,
        used: K,
        act: A.act!,
        out: A.eo!,
        nFf: hp.nFfExp,
        nExpert: hp.nExpert,
        shared: true,
        route: fuseRoute ? route : undefined,
        xq8,
      }, cx);
    } else {
      await this.#experts(`L${l}.ffn_exps`, {
        ...exps,
        ids: A.ids!,
        used: K,
        act: A.act!,
        out: A.eo!,
        nFf: hp.nFfExp,
        nExpert: hp.nExpert,
        shared: false,
        route: fuseRoute ? route : undefined,
        xq8,
      }, cx);
      await this.#experts(`L${l}.ffn_shexp`, {
        ...shexp,
        ids: cx.zeroIds,
        used: 1,
        act: A.sact!,
        out: A.sho!,
        nFf: hp.nFfShexp,
        nExpert: 1,
        shared: false,
        xq8,
      }, cx);
      sho = A.sho!;
    }
    if (routerFused.length !== 2) {
      await this.#matvec(`L${l}.ffn_gate_inp_shexp`, routerWs[1]!, A.m!, A.gam!, n, { f32: true });
    }
    const c: ResidualAddConstants = {
      D: hp.nEmbd,
      N_TERMS: K,
      WEIGHTED: true,
      SHARED: true,
      ...this.#normConstants(norm),
    };
    const params = this.#storage(Uint32Array.of(n, 0));
    await this.#push(
      norm ? `L${l}.moe_combine+norm` : `L${l}.moe_combine`,
      RESIDUAL_ADD,
      c,
      [params, A.eo!, A.wts!, sho, gam, A.h!, norm ? part0(norm.w) : A.eo!, norm?.y ?? this.#scratch()],
      residualAddGrid(c, n),
    );
  }

  async #experts(
    label: string,
    e: {
      gate: GpuTensor;
      up: GpuTensor;
      down: GpuTensor;
      ids: GPUBuffer;
      used: number;
      act: GPUBuffer;
      out: GPUBuffer;
      nFf: number;
      nExpert: number;
      /** Run the shared expert (packed right after the routed ones) as n extra columns. */
      shared: boolean;
      /** Route in the gate·up prologue: logits in, weights out (ids go to `ids`). */
      route?: { logits: GPUBuffer; weights: GPUBuffer; nExpert: number; nExpertUsed: number; wScale: number };
      /** The tokens' x rounded to int8 by moe_route, in the byte order of weights of `type`. */
      xq8?: { type: GgmlTypeName; binding: Binding };
    },
    cx: BuildContext,
  ) {
    const hp = this.#hp;
    const n = this.#n;
    const g = e.gate.parts[0]!;
    const u = e.up.parts[0]!;
    assert(
      g.buffer === u.buffer && e.gate.parts.length === 1 && e.up.parts.length === 1,
      `${label}: gate and up packed`,
    );
    const gu: MoeMatvecShape = {
      type: typeName(e.gate),
      k: hp.nEmbd,
      n: e.nFf,
      nExpert: e.nExpert,
      nCols: e.used * n,
      xDiv: e.used,
      offGateBytes: g.offsetBytes,
      offUpBytes: u.offsetBytes,
      gateUp: true,
      sharedCols: e.shared ? n : 0,
    };
    // int8Activations: the expert passes take int8 x where their weights allow it (moe_matvec_q8 XIN: every
    // workgroup rounds its f32 x column in its prologue), up to the mat-vec chunk width as the dense ones.
    const int8 = this.#int8Activations && n <= MATVEC_MAX_COLS && !e.route;
    // Prefill chunks under int8Activations: the f32 passes read x and the activations rounded as the int8
    // passes would (#roundX).
    const round = (t: GgmlTypeName) =>
      this.#int8Activations && n > MATVEC_MAX_COLS && !e.route && MATVEC_Q8_TYPES.includes(t);
    // groupedExperts: prefill chunks group the columns by expert once, for both passes.
    const wgBytes = Math.max(
      groupedMatmulWorkgroupBytes(typeName(e.gate)),
      groupedMatmulWorkgroupBytes(typeName(e.down)),
    );
    const groups = this.#groupedExperts && n > MATVEC_MAX_COLS && !e.route &&
        wgBytes <= this.#device.limits.maxComputeWorkgroupStorageSize
      ? await this.#moeGroup(`${label}.group`, e.ids, e.used * n, e.nExpert, e.shared)
      : undefined;
    const grouped = (
      m: GpuTensor,
      more: { upOffsetBytes?: number; xDiv: number; sharedX0: number },
    ): GroupedMatmulShape => ({
      type: typeName(m),
      k: m.ne[0]!,
      n: m.ne[1]!,
      nGroups: e.nExpert + (e.shared ? 1 : 0),
      shared: e.shared,
      cap: n,
      nRouted: e.used * n,
      wOffsetBytes: m.parts[0]!.offsetBytes,
      expertBytes: m.ne[1]! * m.rowBytes,
      xStride: m.ne[0]!,
      yStride: m.ne[1]!,
      ...more,
    });
    if (int8 && moeMatvecQ8Fits(gu)) {
      const xq8 = e.xq8 && q8Layout(e.xq8.type) === q8Layout(gu.type) ? e.xq8.binding : undefined;
      await this.#expertsQ8(`${label}.gate_up`, gu, g.buffer, e.ids, cx.act.m!, e.act, n, xq8);
    } else {
      const x = round(gu.type)
        ? await this.#roundX(`${label}.gate_up`, cx.act.m!, hp.nEmbd, n, gu.type, "moe_in")
        : cx.act.m!;
      if (groups) {
        const shape = grouped(e.gate, { upOffsetBytes: u.offsetBytes, xDiv: e.used, sharedX0: 0 });
        await this.#expertsGrouped(`${label}.gate_up`, shape, g.buffer, x, e.act, groups);
      } else {
        await this.#expertsF32(label, gu, e, g.buffer, x, e.act, e.route);
      }
    }
    const dp = e.down.parts[0]!;
    assert(e.down.parts.length === 1, `${label}: down in one binding`);
    const dn: MoeMatvecShape = {
      type: typeName(e.down),
      k: e.nFf,
      n: hp.nEmbd,
      nExpert: e.nExpert,
      nCols: e.used * n,
      xDiv: 1,
      offGateBytes: dp.offsetBytes,
      gateUp: false,
      sharedCols: e.shared ? n : 0,
    };
    if (int8 && moeMatvecQ8Fits(dn)) {
      await this.#expertsQ8(
        `${label}.down`,
        dn,
        dp.buffer,
        e.ids,
        e.act,
        e.out,
        e.used * n + (e.shared ? n : 0),
      );
    } else {
      const cols = e.used * n + (e.shared ? n : 0);
      const act = round(dn.type)
        ? await this.#roundX(`${label}.down`, e.act, e.nFf, cols, dn.type, "moe_act")
        : e.act;
      if (groups) {
        const shape = grouped(e.down, { xDiv: 1, sharedX0: e.used * n });
        await this.#expertsGrouped(`${label}.down`, shape, dp.buffer, act, e.out, groups);
      } else {
        await this.#expertsF32(label, dn, e, dp.buffer, act, e.out);
      }
    }
  }

  /**
   * moe_group: the chunk's `nRouted` columns grouped by their expert in `ids` (and the shared expert's
   * columns as group nExpert), into a buffer of the graph that every layer's experts reuse in turn.
   */
  async #moeGroup(label: string, ids: GPUBuffer, nRouted: number, nExpert: number, shared: boolean) {
    const shape: MoeGroupShape = { nRouted, nTokens: this.#n, nExpert, shared };
    const groups = this.#grown("moe groups", 4 * moeGroupWords(shape));
    const params = this.#storage(moeGroupParams(shape));
    checkMoeGroup(shape, { params, ids, groups });
    await this.#push(label, MOE_GROUP, {}, [params, ids, groups], moeGroupGrid(shape));
    return groups;
  }

  /** One expert pass of a prefill chunk as a grouped matmul over moe_group's lists. */
  async #expertsGrouped(
    label: string,
    shape: GroupedMatmulShape,
    weights: GPUBuffer,
    x: Binding,
    y: GPUBuffer,
    groups: GPUBuffer,
  ) {
    const c = groupedMatmulConstants(shape);
    const b = { params: this.#storage(groupedMatmulParams(shape)), weights, x, y, groups };
    checkGroupedMatmul(shape, c, b);
    await this.#push(
      label,
      MATMUL,
      c,
      [b.params, b.weights, b.x, b.y, b.groups],
      groupedMatmulGrid(shape, c),
    );
  }

  /** The gate·up pass of packed gate and up expert tensors over n tokens (used experts each). */
  #gateUpShape(
    e: { gate: GpuTensor; up: GpuTensor },
    used: number,
    n: number,
    nExpert: number,
    shared: boolean,
  ): MoeMatvecShape {
    return {
      type: typeName(e.gate),
      k: this.#hp.nEmbd,
      n: e.gate.ne[1]!,
      nExpert,
      nCols: used * n,
      xDiv: used,
      offGateBytes: e.gate.parts[0]!.offsetBytes,
      offUpBytes: e.up.parts[0]!.offsetBytes,
      gateUp: true,
      sharedCols: shared ? n : 0,
    };
  }

  /**
   * Where an expert-side rounding leaves `cols` columns of int8 x (K elements each, quantize_q8's format): a
   * region of the int8 log (each column logged under `label`, the pass that reads it) or, when nothing logs,
   * the graph's scratch buffer `scratch` (grown as needed; "in": moe_route's output, read by gate·up;
   * "act": the down pass's own log, read by nobody; "prefill": #roundX's, read by nobody).
   */
  #q8Region(
    label: string,
    k: number,
    type: GgmlTypeName,
    cols: number,
    scratch: "in" | "act" | "prefill",
  ): Binding {
    const bytes = cols * q8xBytes(k);
    const size = Math.ceil(bytes / 4) * 4;
    const log = this.#int8Log;
    if (log) {
      const offset = this.#logAt;
      this.#logAt = Math.ceil((offset + bytes) / 256) * 256;
      assert(this.#logAt <= log.buffer.size, `int8 log of ${log.buffer.size} bytes is full at ${label}`);
      for (let col = 0; col < cols; col++) {
        log.entries.push({ label, col, k, type, offset: offset + col * q8xBytes(k) });
      }
      return { buffer: log.buffer, offset, size };
    }
    return { buffer: this.#grown(`int8 x (${scratch})`, bytes), offset: 0, size };
  }

  /** One expert pass through moe_matvec (f32 x); `route`: the gate·up pass routes in its prologue. */
  async #expertsF32(
    label: string,
    shape: MoeMatvecShape,
    e: { ids: GPUBuffer },
    weights: GPUBuffer,
    x: GPUBuffer,
    y: GPUBuffer,
    route?: { logits: GPUBuffer; weights: GPUBuffer; nExpert: number; nExpertUsed: number; wScale: number },
  ) {
    // Prefill chunks (wider than the mat-vec's 8 columns) take moe_matvec's prefill constants; batched decode
    // keeps the solo step's, so that its slots equal their solo runs bit for bit.
    const prefill = this.#n > MATVEC_MAX_COLS;
    if (!shape.gateUp) {
      const c = moeMatvecConstants(shape, undefined, this.#moeTuning?.down, prefill);
      await this.#push(
        `${label}.down`,
        MOE_MATVEC,
        c,
        [this.#storage(moeMatvecParams(shape)), e.ids, weights, x, y, x, this.#scratch()],
        moeMatvecGrid(shape, c),
      );
      return;
    }
    const c = moeMatvecConstants(shape, route, this.#moeTuning?.gateUp, prefill);
    await this.#push(
      route ? `${label}.route+gate_up` : `${label}.gate_up`,
      MOE_MATVEC,
      c,
      [
        this.#storage(moeMatvecParams(shape)),
        e.ids,
        weights,
        x,
        y,
        route?.logits ?? x,
        route?.weights ?? this.#scratch(),
      ],
      moeMatvecGrid(shape, c),
    );
  }

  /**
   * One expert pass through moe_matvec_q8: int8 x given (`xq8`), or with XIN f32 x (xCols columns) rounded to
   * int8 in every workgroup's prologue, the rounded x written to the int8 log (int8Log) or to a scratch buffer.
   */
  async #expertsQ8(
    label: string,
    shape: MoeMatvecShape,
    weights: GPUBuffer,
    ids: GPUBuffer,
    x: GPUBuffer,
    y: GPUBuffer,
    xCols: number,
    xq8?: Binding,
  ) {
    // x already rounded (moe_route XQ): read it as it is; otherwise XIN rounds it in every workgroup and
    // workgroups (0, col) log it.
    const c = xq8 ? moeMatvecQ8Constants(shape) : moeMatvecQ8Constants(shape, undefined, { xin: true });
    const b: MoeMatvecQ8Bindings = {
      params: this.#storage(moeMatvecParams(shape)),
      ids,
      weights,
      weights2: weights,
      xq: xq8 ?? x,
      y,
      yq: xq8 ? this.#scratch() : this.#q8Region(label, shape.k, shape.type, xCols, "act"),
    };
    checkMoeMatvecQ8(shape, c, b);
    await this.#push(
      label,
      MOE_MATVEC_Q8,
      c,
      [b.params, ids, weights, weights, b.xq, y, b.yq],
      moeMatvecQ8Grid(shape, c),
    );
  }
}

function typeName(t: GpuTensor): GgmlTypeName {
  return t.type.name as GgmlTypeName;
}

/** The single binding of a small tensor (norm weights, conv taps): its one part. */
function part0(t: GpuTensor): Binding {
  assert(t.parts.length === 1, `tensor ${t.name} is in one part`);
  const p = t.parts[0]!;
  return { buffer: p.buffer, offset: p.offsetBytes, size: Math.ceil(p.sizeBytes / 4) * 4 };
}

/** Words of a batched activation column of `words` values: the next multiple of 64 (256-byte offsets). */
function padWords(words: number): number {
  return Math.ceil(words / 64) * 64;
}

/** A sub-range of `words` f32 words of a buffer from word `at` (a multiple of 64: 256-byte offsets). */
function sub(buf: GPUBuffer, at: number, words: number): Binding {
  return { buffer: buf, offset: at * 4, size: words * 4 };
}
