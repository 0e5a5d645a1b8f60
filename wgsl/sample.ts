/**
 * Host twin of `sample.wgsl`: one token id drawn on the GPU from the logits with llama.cpp's default chain
 * (penalties → top_k → top_p → min_p → temperature → draw) and a counter-based RNG of (seed, step), in two
 * dispatches: a partial pass of `N_BLOCK` workgroups (penalties, mask, the K best per block, log-sum-exp
 * partials) and a final one-workgroup pass (merge, chain, draw, id to the next step's token buffer and the
 * output ring, history append, step advance).
 * @module
 */
import { bindGroup, type Binding, type ConstValues, type KernelSpec } from "./kernel.ts";
import {
  checkBinding,
  checkInt,
  checkShape,
  checkWorkgroupBytes,
  isPow2,
  MAX_WORKGROUPS_PER_DIM,
} from "./_twin.ts";

/**
 * Settings of one sampler: vocabulary size, candidate cap `K` (<= 64), partial workgroups, workgroup size,
 * sort buffer (power of two >= 2K; 8*BUF bytes of workgroup memory) and the history ring `HIST` (power of
 * two; the longest penalty window).
 */
export type SampleConstants = {
  readonly N_VOCAB: number;
  readonly K: number;
  readonly N_BLOCK: number;
  readonly WG: number;
  readonly BUF: number;
  readonly HIST: number;
};

/** Kernel spec of `sample.wgsl` (both passes; see {@linkcode sampleVariants}). */
export const SAMPLE: KernelSpec = {
  name: "sample",
  url: new URL("./sample.wgsl", import.meta.url),
  lib: [],
  constants: { N_VOCAB: "u32", N_BLOCK: "u32", K: "u32", WG: "u32", BUF: "u32", HIST: "u32", FINAL: "bool" },
};

/**
 * Binding order of both passes: src u32 (logits ne=[nVocab] or pairs ne=[2, K+1, N_BLOCK]); dst u32
 * (pairs ne=[2, K+1, N_BLOCK] or result ne=[2, K+1]); params SampleParams; mask u32 ne=[ceil(nVocab/32)];
 * state SampleState; nextToken u32 ne=[1]; ring u32 ne=[ring_slot + 1].
 */
export const SAMPLE_BINDINGS = ["src", "dst", "params", "mask", "state", "nextToken", "ring"] as const;

/**
 * Word offsets of SampleParams (struct order; all 32-bit). `ringSlot` is word 0, as in ArgmaxParams, so the
 * engine's per-step copy of the ring slot works for both kernels.
 */
export const SAMPLE_PARAMS = {
  ringSlot: 0,
  flags: 1,
  temperature: 2,
  topK: 3,
  topP: 4,
  minP: 5,
  repeatPenalty: 6,
  presencePenalty: 7,
  frequencyPenalty: 8,
  penaltyLastN: 9,
  seedLo: 10,
  seedHi: 11,
} as const;

/** Words of SampleParams. */
export const SAMPLE_PARAMS_WORDS = 12;

/** Bit of SampleParams.flags: skip ids whose bit is set in the `mask` binding. */
export const SAMPLE_FLAG_MASK = 1;

/** The id written when no candidate exists (every id masked). */
export const SAMPLE_NONE = 0xffffffff;

/**
 * The id written for a row holding a NaN or +Inf logit (masked or not), as the argmax kernel's
 * `ARGMAX_NONFINITE`: broken weights or numerics, which the host refuses instead of drawing from the rest.
 */
export const SAMPLE_NONFINITE = 0xfffffffe;

/** Values of SampleParams, already validated and resolved (see `engine/sampling.ts`). */
export type SampleParamValues = {
  readonly ringSlot: number;
  readonly maskUnused: boolean;
  readonly temperature: number;
  readonly topK: number;
  readonly topP: number;
  readonly minP: number;
  readonly repeatPenalty: number;
  readonly presencePenalty: number;
  readonly frequencyPenalty: number;
  /** Window length in ids, 0..HIST (0: penalties off). */
  readonly penaltyLastN: number;
  /** u32 halves of the seed. */
  readonly seedLo: number;
  readonly seedHi: number;
};

/** Packs SampleParams into its 12 words (f32 fields as their bits). */
export function packSampleParams(p: SampleParamValues): Uint32Array<ArrayBuffer> {
  const w = new Uint32Array(SAMPLE_PARAMS_WORDS);
  const f = new Float32Array(w.buffer);
  const o = SAMPLE_PARAMS;
  w[o.ringSlot] = p.ringSlot;
  w[o.flags] = p.maskUnused ? SAMPLE_FLAG_MASK : 0;
  f[o.temperature] = p.temperature;
  w[o.topK] = p.topK;
  f[o.topP] = p.topP;
  f[o.minP] = p.minP;
  f[o.repeatPenalty] = p.repeatPenalty;
  f[o.presencePenalty] = p.presencePenalty;
  f[o.frequencyPenalty] = p.frequencyPenalty;
  w[o.penaltyLastN] = p.penaltyLastN;
  w[o.seedLo] = p.seedLo;
  w[o.seedHi] = p.seedHi;
  return w;
}

/** Words of SampleState for a history ring of `hist` ids: step, count, hist[hist]. */
export function sampleStateWords(hist: number): number {
  return 2 + hist;
}

/**
 * Initial SampleState: RNG step `step` (0 for a fresh request) and the history seeded with `history` (the
 * recent ids the penalties see, e.g. the prompt's tail; only the last `hist` are kept).
 */
export function packSampleState(
  hist: number,
  opts: { step?: number; history?: readonly number[] } = {},
): Uint32Array<ArrayBuffer> {
  const w = new Uint32Array(sampleStateWords(hist));
  const h = opts.history ?? [];
  w[0] = opts.step ?? 0;
  w[1] = h.length;
  for (let k = Math.max(0, h.length - hist); k < h.length; k++) w[2 + (k % hist)] = h[k]!;
  return w;
}

/** lowbias32 (C. Wellons), as `mix32` in the kernel. */
function mix32(x: number): number {
  let z = x >>> 0;
  z = Math.imul(z ^ (z >>> 16), 0x7feb352d);
  z = Math.imul(z ^ (z >>> 15), 0x846ca68b);
  return (z ^ (z >>> 16)) >>> 0;
}

/** The kernel's RNG: the 32-bit hash of (seed halves, step), bit-exact with `rng_hash` in the WGSL. */
export function sampleHash(seedLo: number, seedHi: number, step: number): number {
  return mix32((mix32((mix32((step ^ 0x85ebca6b) >>> 0) ^ seedLo) >>> 0) ^ seedHi ^ 0x27d4eb2f) >>> 0);
}

/** The uniform value u in [0, 1) (24 bits) the kernel draws with at `step`. */
export function sampleUniform(seedLo: number, seedHi: number, step: number): number {
  return (sampleHash(seedLo, seedHi, step) >>> 8) / 2 ** 24;
}

/**
 * Buffers of one sampler: `logits` f32 ne=[nVocab] (read only); `pairs` u32 ne=[2, K+1, N_BLOCK] scratch;
 * `result` u32 ne=[2, K+1] (final candidates and whole-vocabulary log-sum-exp, for tests and debugging);
 * `params` SampleParams; `mask` u32 ne=[ceil(nVocab/32)]; `state` SampleState (step, count, hist[HIST]);
 * `nextToken` u32 ne=[1]; `ring` u32 holding the slot `params` names (unchecked: it lives on the GPU).
 */
export type SampleBuffers = Readonly<
  Record<"logits" | "pairs" | "result" | "params" | "mask" | "state" | "nextToken" | "ring", Binding>
>;

/** The pipelines of the two passes, from `PipelineCache.get(SAMPLE, sampleVariants(c).partial/final)`. */
export type SamplePipelines = { readonly partial: GPUComputePipeline; readonly final: GPUComputePipeline };

/** The bind groups of the two passes, from {@linkcode sampleBindGroups}. */
export type SampleBindGroups = { readonly partial: GPUBindGroup; readonly final: GPUBindGroup };

/** Bytes of workgroup memory one pass of `c` uses. */
export function sampleWorkgroupBytes(c: SampleConstants): number {
  const chunk = Math.ceil(c.N_VOCAB / c.N_BLOCK);
  return 8 * c.BUF + 4 * c.HIST + 4 * Math.ceil(chunk / 32) + 8 * c.WG + 12;
}

/**
 * Checks settings against the kernel's limits.
 * @throws {RangeError} naming the offending value
 */
export function checkSample(c: SampleConstants): void {
  checkInt("sample: N_VOCAB", c.N_VOCAB, 1, 2 ** 31);
  checkInt("sample: K", c.K, 1, 64);
  checkInt("sample: N_BLOCK", c.N_BLOCK, 1, MAX_WORKGROUPS_PER_DIM);
  checkShape(isPow2(c.WG) && c.WG <= 256, `sample: WG must be a power of two <= 256, got ${c.WG}`);
  checkShape(
    isPow2(c.BUF) && c.BUF >= 2 * c.K,
    `sample: BUF must be a power of two >= 2K (${2 * c.K}), got ${c.BUF}`,
  );
  checkShape(
    c.WG >= c.K && c.WG <= c.BUF,
    `sample: WG must lie in [K, BUF] = [${c.K}, ${c.BUF}] (the per-invocation maxima are sorted in the ` +
      `buffer), got ${c.WG}`,
  );
  checkShape(isPow2(c.HIST) && c.HIST <= 4096, `sample: HIST must be a power of two <= 4096, got ${c.HIST}`);
  const chunk = Math.ceil(c.N_VOCAB / c.N_BLOCK);
  checkShape(
    chunk <= 32768,
    `sample: each of the N_BLOCK=${c.N_BLOCK} blocks holds ${chunk} logits, more than 32768 (the penalty ` +
      `bitmask): raise N_BLOCK to at least ${Math.ceil(c.N_VOCAB / 32768)}`,
  );
}

/** Constant values of the partial and final passes. */
export function sampleVariants(c: SampleConstants): { partial: ConstValues; final: ConstValues } {
  checkSample(c);
  const common = { N_VOCAB: c.N_VOCAB, N_BLOCK: c.N_BLOCK, K: c.K, WG: c.WG, BUF: c.BUF, HIST: c.HIST };
  return { partial: { ...common, FINAL: false }, final: { ...common, FINAL: true } };
}

/**
 * The bind groups of both passes, after checking every buffer against its `ne` and the workgroup memory
 * against the device.
 * @throws {RangeError} when a setting is out of range or a buffer too small
 */
export function sampleBindGroups(
  device: GPUDevice,
  opts: { pipelines: SamplePipelines; constants: SampleConstants; buffers: SampleBuffers },
): SampleBindGroups {
  const { constants: c, buffers: b } = opts;
  checkSample(c);
  const bytes = sampleWorkgroupBytes(c);
  checkWorkgroupBytes(device, `sample: BUF=${c.BUF} HIST=${c.HIST} WG=${c.WG}`, bytes, "lower BUF");
  checkBinding("sample", "logits", b.logits, [c.N_VOCAB]);
  checkBinding("sample", "pairs", b.pairs, [2, c.K + 1, c.N_BLOCK]);
  checkBinding("sample", "result", b.result, [2, c.K + 1]);
  checkBinding("sample", "params", b.params, [SAMPLE_PARAMS_WORDS]);
  checkBinding("sample", "mask", b.mask, [Math.ceil(c.N_VOCAB / 32)]);
  checkBinding("sample", "state", b.state, [sampleStateWords(c.HIST)]);
  checkBinding("sample", "nextToken", b.nextToken, [1]);
  checkBinding("sample", "ring", b.ring, [1]);
  const rest = [b.params, b.mask, b.state, b.nextToken, b.ring];
  return {
    partial: bindGroup(device, opts.pipelines.partial, [b.logits, b.pairs, ...rest]),
    final: bindGroup(device, opts.pipelines.final, [b.pairs, b.result, ...rest]),
  };
}

/** Dispatch grids of the two passes. */
export function sampleGrids(
  c: SampleConstants,
): { partial: [number, number, number]; final: [number, number, number] } {
  return { partial: [c.N_BLOCK, 1, 1], final: [1, 1, 1] };
}

/** Records both passes into `pass` (the second reads the first's pairs; one pass orders them). */
export function encodeSample(
  pass: GPUComputePassEncoder,
  opts: { pipelines: SamplePipelines; bindGroups: SampleBindGroups; constants: SampleConstants },
): void {
  const grids = sampleGrids(opts.constants);
  pass.setPipeline(opts.pipelines.partial);
  pass.setBindGroup(0, opts.bindGroups.partial);
  pass.dispatchWorkgroups(...grids.partial);
  pass.setPipeline(opts.pipelines.final);
  pass.setBindGroup(0, opts.bindGroups.final);
  pass.dispatchWorkgroups(...grids.final);
}

/**
 * The mask binding's words: bit (id & 31) of word id >> 5 set for each id where `masked(id)` holds (e.g.
 * token type UNUSED).
 */
export function sampleMaskWords(nVocab: number, masked: (id: number) => boolean): Uint32Array<ArrayBuffer> {
  const w = new Uint32Array(Math.max(1, Math.ceil(nVocab / 32)));
  for (let id = 0; id < nVocab; id++) if (masked(id)) w[id >>> 5] = (w[id >>> 5]! | (1 << (id & 31))) >>> 0;
  return w;
}
