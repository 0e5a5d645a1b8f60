/**
 * The options and input/output types of a stage: what `Stage.load` takes, what a chunk is
 * fed and what it returns.
 * @module
 */
import type { UploadProgress } from "../gpu/weights.ts";
import type { MoeMatvecTuning } from "../../wgsl/moe_matvec.ts";
import type { SamplingParams } from "../sampling.ts";

/**
 * Default {@linkcode StageOptions.combineNormMinRows}: residual adds of 17 or more rows (prefill chunks) write
 * the next norm; batched decode steps (at most 16 slots) add over many workgroups and norm on their own.
 */
export const COMBINE_NORM_MIN_ROWS = 17;

/**
 * Default {@linkcode StageOptions.groupedMinTokensPerExpert}: 8, 256-token chunks on the 35B-A3B (8 of 256
 * experts). On the H200 a 64-token chunk (2 per expert) prefilled at 943 tok/s per column against 516
 * grouped, a 256-token chunk at 1,290 grouped against 1,176 (docs/PERF.md, 2026-12-05).
 */
export const GROUPED_MIN_TOKENS_PER_EXPERT = 8;

/**
 * Default {@linkcode StageOptions.groupedMatvecMaxTokensPerExpert}: 16, prefill chunks up to 512 tokens on the
 * 35B-A3B (16 of 256 experts' tokens each), where the grouped matmul's 16- to 32-token tiles stay mostly empty
 * (on the H200 a 64-token chunk's grouped experts took 64.3 + 27.6 ms, a 256-token one's 87.1 + 37.8:
 * docs/PERF.md, 2026-12-05).
 */
export const GROUPED_MATVEC_MAX_TOKENS_PER_EXPERT = 16;

/** Whether the expert passes take int8 x: StageOptions.int8Experts, or int8Activations (which rounds them too). */
export function int8ExpertsOf(
  o: { readonly int8Activations?: boolean; readonly int8Experts?: boolean },
): boolean {
  return (o.int8Activations ?? false) || (o.int8Experts ?? false);
}

/** Options of `Stage.load`. */
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
   * a dispatch of its own (default 16384, see docs/PERF.md; 0: never fuse).
   */
  readonly normPrologueMaxRows?: number;
  /**
   * Fewest rows whose residual adds (the mixer's and the MoE combine) also write the next norm (residual_add
   * NORM: one workgroup per row); fewer rows get the add over many workgroups and the norm as a dispatch of
   * its own, the same bits (default {@linkcode COMBINE_NORM_MIN_ROWS}: chunks of 17 or more rows fuse, batched
   * decode steps do not). On the H200 an 8-slot step ran at 620 tok/s split against 587 fused (docs/PERF.md,
   * 2026-12-05); bench/decode.ts `--combine-norm-min-rows 2` measures the fused form.
   */
  readonly combineNormMinRows?: number;
  /**
   * SPLIT of the batched steps' `gdn_step` (workgroups per v-head: 2, 4 or 8, dividing D_V / 16; default the
   * solo step's, 4 at D_V = 128). Each leaves the gated norm to a `gdn_chunk_norm` dispatch after it, and the
   * recurrence's sums do not depend on SPLIT, so the bits stay the solo step's (SPLIT 1, the norm inside the
   * step, sums the norm in another order: not offered). A benchmark knob (bench/decode.ts `--gdn-split`,
   * bench/batch_bits.ts `--gdn-split` checks the bits). On an H100, 8 / 16 slots ran at 996 / 1,225 tok/s with 4
   * against 989 / 1,212 with 2 and 973 / 1,193 with 8 (docs/PERF.md, 2026-12-07).
   */
  readonly gdnBatchedSplit?: number;
  /**
   * The MoE router and routing take the post-attention norm where they can (`moeTakesNorm` in
   * engine/blocks/moe.ts: every gate·up pass reads moe_route's int8 x, the router is fused with the shared
   * expert's gate): the router reads h times the norm's weight, moe_route applies each token's scale, and the
   * norm has no dispatch or mat-vec prologue of its own in any step. Default on; false keeps the norm's own
   * dispatch (or the one-token router's prologue), whose logits differ by f32 rounding. A benchmark knob
   * (bench/decode.ts `--router-norm off`); every stage of a split keeps the default.
   */
  readonly routerTakesNorm?: boolean;
  /**
   * The chunked DeltaNet prefill's forward substitution (`gdn_chunk_prep`) as loops instead of written out:
   * the same sums in the same order, compiled in under 2 s instead of about 30 s by LLVM on a CPU adapter
   * (lavapipe). Default: true on CPU (fallback) adapters, false on GPUs. A benchmark knob elsewhere
   * (bench/gdn_chunk.ts `--compact-solve`).
   */
  readonly gdnCompactSolve?: boolean;
  /**
   * TEAM/ROWS (and optionally BLOCKS/UNROLL/WG) of the expert mat-vecs (gate·up and down), overriding
   * `moeMatvecConstants`' defaults: a benchmark knob (bench/moe.ts finds candidates, bench/decode.ts --moe-*
   * measures them in a whole step). Only TEAM changes the sums' bits (and WG where `moeMatvecSameBits` fails).
   * `batchedQ8Rows`: ROWS of the int8-x expert passes (moe_matvec_q8) of batched steps and short chunks, the
   * same bits as the solo step's ROWS at the default TEAM (≤ 16: each row sums its chunks and its team's
   * partials in the same order); bench/decode.ts
   * --batched-q8-rows.
   */
  readonly moeTuning?: {
    readonly gateUp?: MoeMatvecTuning;
    readonly down?: MoeMatvecTuning;
    readonly batchedQ8Rows?: { readonly gateUp?: number; readonly down?: number };
  };
  /**
   * TEAM/ROWS of the batch-1 (decode) mat-vecs, overriding `matvecConstants`' defaults: a benchmark knob
   * (bench/matvec.ts finds candidates, bench/decode.ts --matvec measures them in a whole step). A TEAM other
   * than the default changes the rows' summation order, so batched steps no longer give their solo bits.
   * `q8bRows`: ROWS of the batched int8 mat-vecs (matvec_q8b, 1 to 4; default `matvecQ8bRows` by shape: the
   * same bits at any ROWS), bench/decode.ts --q8b-rows (bench/batch_bits.ts --q8b-rows checks the bits).
   * `q8bXsum`: whether matvec_q8b sums each column's int8 x per chunk once per workgroup for the K-quants
   * (XSUM; default: where it fits the device's workgroup memory; the same bits either way).
   */
  readonly matvecTuning?: {
    readonly team?: number;
    readonly rows?: number;
    readonly q8bRows?: number;
    readonly q8bXsum?: boolean;
  };
  /**
   * Decode (one token) routes the experts in the prologue of the routed gate·up pass (moe_matvec ROUTE)
   * instead of in a moe_route dispatch of its own. Default off: every gate·up workgroup then repeats the
   * ranking, which measured slower (docs/PERF.md).
   */
  readonly fuseDecodeRoute?: boolean;
  /**
   * Prefill chunks wider than 8 tokens whose experts get {@linkcode StageOptions.groupedMinTokensPerExpert}
   * routed tokens or more on average run the routed experts (and the packed shared one) as one grouped
   * matmul per pass: moe_group lists each expert's columns, and moe_matmul reads each expert's weights
   * once per tile of its tokens instead of once per column (moe_matvec). Default on: long prefills are
   * faster so (docs/PERF.md); the results differ from moe_matvec's by f32 summation order only.
   */
  readonly groupedExperts?: boolean;
  /**
   * Fewest routed tokens per expert on average (chunk tokens × experts used / experts) at which a prefill
   * chunk groups its experts (with {@linkcode StageOptions.groupedExperts}); thinner chunks run them per
   * column. Default {@linkcode GROUPED_MIN_TOKENS_PER_EXPERT}.
   */
  readonly groupedMinTokensPerExpert?: number;
  /**
   * Most routed tokens per expert on average at which a prefill chunk wider than 8 tokens runs its experts as
   * grouped mat-vecs (with {@linkcode StageOptions.groupedExperts}; from 4 on average, thinner chunks keep
   * per-column mat-vecs): moe_group lists each expert's columns and
   * moe_gmv decodes each weight unit once for up to 8 of them, where the grouped matmul's token tiles would
   * stay mostly empty and the per-column mat-vecs decode every unit once per column. Takes precedence over
   * groupedMinTokensPerExpert; 0 turns it off. Default {@linkcode GROUPED_MATVEC_MAX_TOKENS_PER_EXPERT}.
   */
  readonly groupedMatvecMaxTokensPerExpert?: number;
  /**
   * Mat-vec columns (decode, batched decode up to 16, prefill chunks up to 8) of Q8_0, Q4_K, Q5_K, Q6_K
   * and IQ4_XS weights take x rounded to int8 per 32 elements (quantize_q8, then matvec_q8's integer dot
   * products, as llama.cpp's quantized mat-vecs do) instead of f32; the router's mat-vecs keep f32. Expert
   * passes of such weights take int8 x too (moe_matvec_q8; moe_route rounds the experts' input, the down pass
   * its own x), except with fuseDecodeRoute. Wider (prefill) chunks round x the same way (quantize_q8 ROUND)
   * and feed the rounded f32 values to the f32 matmul and moe_matvec, so every chunk width rounds alike.
   * Off by default: it changes the default numerics (docs/PERF.md has its speed). The rounding is a different
   * one: `RefModelOptions.int8Activations` in tests/ref/forward.ts mirrors it, and checks the decisions this
   * stage logs with `int8Log`. One column (decode) runs matvec_q8_fused, which quantizes x in its prologue;
   * 2 to 16 columns one quantize_q8 and one matvec_q8b per weight part, which decodes each weight chunk once
   * for all columns and gives each column matvec_q8's bits, so batched steps keep their solo bits.
   */
  readonly int8Activations?: boolean;
  /**
   * The expert passes alone take int8 x (moe_matvec_q8; prefill chunks round the experts' x alike), while the
   * projections, output projections and LM head keep f32 x: the one part of int8Activations that batched
   * steps gain from. On the H200 the int8 expert passes of an 8-slot step took 3.59 ms against 6.12 in f32,
   * while the int8 dense mat-vecs then ran a dispatch per column (docs/PERF.md, 2026-12-05; matvec_q8b has
   * replaced those since, not measured yet). Rounds like
   * int8Activations at the experts (`RefModelOptions.int8Experts` mirrors it). Default off (exact f32), though
   * the CLI commands and the benches turn it on unless `--f32-experts`; implied by int8Activations. Every
   * stage of a split must agree (the hello's `numerics.int8Experts`).
   */
  readonly int8Experts?: boolean;
  /**
   * KV caches in f16 (two per word) instead of f32: half the memory per position, so twice the context in
   * the same memory; K and V round to f16 when written (the attention kernels' KV_F16), so logits move by
   * that rounding (`RefModelOptions.kvF16` in tests/ref/forward.ts mirrors it). Default off.
   */
  readonly kvF16?: boolean;
  /**
   * Test hook for int8Activations and int8Experts: every quantize_q8 of a graph writes a region of its own in one log buffer
   * (the mat-vecs after it read from there), and `Stage.int8Log` returns the last `run()`'s
   * rounding decisions, so that a reference can check them and continue with the same ones.
   */
  readonly int8Log?: boolean;
  /**
   * Test and benchmark hook: the largest pool of one (layer, state) over every slot (`SlotStates`); a state
   * whose pool would be larger keeps a buffer per slot, and batched steps dispatch per slot for it. Default:
   * the device's storage binding limit (what it must be at most).
   */
  readonly maxStatePoolBytes?: number;
  /** Upload progress. */
  readonly onProgress?: (p: UploadProgress) => void;
  /** Where a note goes that the model fingerprint could not be cached beside the file (default `console.error`). */
  readonly onLog?: (line: string) => void;
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
  /**
   * With `ids` (a last stage's `submit` / `submitBatch`): each row's argmax id, drawn on the GPU by the decode
   * driver's argmax (ties to the lowest id; `ARGMAX_NONFINITE` for a row with NaN or +Inf); `data` is then empty.
   */
  readonly ids?: Uint32Array<ArrayBuffer>;
}

/**
 * Options of `Stage.run` / `Stage.submit`: the rows returned (`last` by default), the tokens per chunk, and
 * `ids` (a last stage: each returned row's argmax id instead of its logits, see {@linkcode StageOutput.ids}).
 */
export interface RunOptions {
  /** Rows returned: every input token's, the last one's (default), or none (no readback). */
  readonly rows?: "all" | "last" | "none";
  /** Tokens per chunk (1..maxChunk; default maxChunk). */
  readonly chunk?: number;
  /** A last stage: each returned row's argmax id, drawn on the GPU, instead of its logits. */
  readonly ids?: boolean;
  /**
   * With `ids`: each row's id drawn by the GPU sampler in the run's pass instead of the argmax, the rows as
   * consecutive decode steps of one sequence (`Stage.sampleRows` on the same logits draws the same ids).
   */
  readonly sample?: RowSampleOptions;
}

/** How a sampled run draws its rows' ids (`RunOptions.sample`, `Stage.sampleRows`). */
export interface RowSampleOptions {
  /** The request's settings (not plain greedy: the sampler runs). */
  readonly sampling: SamplingParams;
  /** RNG step of the first row's draw. */
  readonly step: number;
  /** Ids the penalties look back on, oldest first (the last 256 count). */
  readonly history: readonly number[];
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
