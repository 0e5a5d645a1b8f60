/**
 * Sampling parameters: their typed form, defaults, validation, the server-side temperature policy, and
 * their packing into the words of the `sample` kernel's params (see `wgsl/sample.ts`). The kernel applies
 * llama.cpp's default chain on the GPU: penalties → top_k → top_p → min_p → temperature → draw.
 *
 * Limits the kernel sets, on purpose:
 * - at most {@linkcode SAMPLE_CANDIDATES} (64) candidates reach top_p/min_p and the draw: top_k 0 ("all")
 *   and top_k > 64 draw from the 64 best. top_p's probabilities are then still normalised over the whole
 *   vocabulary, as llama.cpp does for top_k 0; a top_p that the 64 best do not reach keeps all 64.
 * - the penalty window holds at most {@linkcode SAMPLE_HIST} (256) recent ids; penalty_last_n -1 means all
 *   of them (llama.cpp: the whole context).
 * @module
 */
import { TOKEN_TYPE } from "./text/tokenizer.ts";
import {
  checkSample,
  packSampleParams,
  type SampleConstants,
  sampleMaskWords,
  sampleWorkgroupBytes,
} from "../wgsl/sample.ts";

/** One request's sampling parameters (llama.cpp names in snake_case in error messages). */
export interface SamplingParams {
  /** Softmax temperature; 0 = greedy (the argmax, ties to the lowest id). */
  readonly temperature: number;
  /** Keep the k most likely ids; 0 = all (capped at 64 candidates). */
  readonly topK: number;
  /** Keep the most likely ids whose probabilities sum to at least this; 1 = off. */
  readonly topP: number;
  /** Keep ids with probability >= minP × the top probability; 0 = off. */
  readonly minP: number;
  /** Divide positive (multiply non-positive) logits of recent ids by this; 1 = off. */
  readonly repeatPenalty: number;
  /** Subtract from the logits of recent ids once; 0 = off. */
  readonly presencePenalty: number;
  /** Subtract from the logits of recent ids once per occurrence; 0 = off. */
  readonly frequencyPenalty: number;
  /** How many recent ids the penalties look at: 0 = none, -1 = all kept (256). */
  readonly penaltyLastN: number;
  /** Seed of the request's random stream (integer in [0, 2^53)): same seed and params, same ids. */
  readonly seed: number;
}

/** Most candidates the kernel keeps after its top-k stage (its `K`). */
export const SAMPLE_CANDIDATES = 64;

/** History ring of the kernel (its `HIST`): the longest penalty window. */
export const SAMPLE_HIST = 256;

/** Defaults of llama.cpp's `common_params_sampling` (the seed has none: a fresh one is drawn). */
export const SAMPLING_DEFAULTS: Readonly<Omit<SamplingParams, "seed">> = {
  temperature: 0.8,
  topK: 40,
  topP: 0.95,
  minP: 0.05,
  repeatPenalty: 1,
  presencePenalty: 0,
  frequencyPenalty: 0,
  penaltyLastN: 64,
};

/** Highest temperature accepted (beyond it every candidate is about equally likely anyway). */
export const MAX_TEMPERATURE = 100;

function checkRange(name: string, v: number, lo: number, hi: number): void {
  if (typeof v !== "number" || !(v >= lo && v <= hi)) {
    throw new RangeError(`${name} ${v} is outside [${lo}, ${hi}]`);
  }
}

function checkInteger(name: string, v: number, lo: number, hi: number): void {
  if (typeof v !== "number" || !Number.isInteger(v) || v < lo || v > hi) {
    throw new RangeError(`${name} ${v} must be an integer in [${lo}, ${hi}]`);
  }
}

/**
 * Checks every field against the range the kernel and llama.cpp's formulas accept.
 * @throws {RangeError} naming the field (snake_case, as APIs spell it), its value and the range, e.g.
 * `top_p 1.5 is outside [0, 1]`
 */
export function checkSampling(p: SamplingParams): void {
  checkRange("temperature", p.temperature, 0, MAX_TEMPERATURE);
  checkInteger("top_k", p.topK, 0, 2 ** 31 - 1);
  checkRange("top_p", p.topP, 0, 1);
  checkRange("min_p", p.minP, 0, 1);
  if (typeof p.repeatPenalty !== "number" || !(p.repeatPenalty > 0 && p.repeatPenalty <= 10)) {
    throw new RangeError(
      `repeat_penalty ${p.repeatPenalty} is outside (0, 10]: 1 is off, above 1 discourages repeats`,
    );
  }
  checkRange("presence_penalty", p.presencePenalty, -2, 2);
  checkRange("frequency_penalty", p.frequencyPenalty, -2, 2);
  checkInteger("penalty_last_n", p.penaltyLastN, -1, SAMPLE_HIST);
  checkInteger("seed", p.seed, 0, Number.MAX_SAFE_INTEGER);
}

/**
 * Complete, validated parameters: `given` over {@linkcode SAMPLING_DEFAULTS}, with a fresh random seed
 * when none is given. Fields that are present but `undefined` take the default too.
 * @throws {RangeError} as {@linkcode checkSampling}
 * @example
 * ```ts
 * const p = samplingParams({ temperature: 0.7, topP: 0.8, topK: 20, seed: 42 });
 * ```
 */
export function samplingParams(
  given: Partial<SamplingParams> = {},
  opts: { randomSeed?: () => number } = {},
): SamplingParams {
  const pick = <K extends keyof Omit<SamplingParams, "seed">>(k: K): SamplingParams[K] =>
    given[k] ?? SAMPLING_DEFAULTS[k];
  const p: SamplingParams = {
    temperature: pick("temperature"),
    topK: pick("topK"),
    topP: pick("topP"),
    minP: pick("minP"),
    repeatPenalty: pick("repeatPenalty"),
    presencePenalty: pick("presencePenalty"),
    frequencyPenalty: pick("frequencyPenalty"),
    penaltyLastN: pick("penaltyLastN"),
    seed: given.seed ?? (opts.randomSeed ?? randomSeed)(),
  };
  checkSampling(p);
  return p;
}

/**
 * Plain greedy decoding: temperature 0, no filters, no penalties, seed 0 (the argmax; every field given, so
 * it does not depend on SAMPLING_DEFAULTS).
 */
export const GREEDY_SAMPLING: SamplingParams = Object.freeze({
  temperature: 0,
  topK: 0,
  topP: 1,
  minP: 0,
  repeatPenalty: 1,
  presencePenalty: 0,
  frequencyPenalty: 0,
  penaltyLastN: 64,
  seed: 0,
});

/** A fresh random seed in [0, 2^53). */
export function randomSeed(): number {
  const w = crypto.getRandomValues(new Uint32Array(2));
  return (w[0]! & 0x1fffff) * 2 ** 32 + w[1]!;
}

/**
 * The temperature a request runs at: `requested`, or the server's `default` when absent, capped at the
 * server's `cap` (a request above the cap runs at the cap).
 * @throws {RangeError} when `requested` is not a number in [0, 100], or the policy is inconsistent
 */
export function resolveTemperature(
  requested: number | undefined,
  policy: { readonly default: number; readonly cap: number },
): number {
  checkRange("server temperature cap", policy.cap, 0, MAX_TEMPERATURE);
  checkRange("server default temperature", policy.default, 0, policy.cap);
  if (requested === undefined) return policy.default;
  checkRange("temperature", requested, 0, MAX_TEMPERATURE);
  return Math.min(requested, policy.cap);
}

/** Whether `p` always picks the most likely id (temperature 0 or top_k 1), so no RNG is involved. */
export function isGreedy(p: SamplingParams): boolean {
  return p.temperature === 0 || p.topK === 1;
}

/**
 * The `sample` kernel's params words for `p` (SampleParams, `wgsl/sample.ts`): penalty_last_n -1 becomes
 * the whole history ring, the seed splits into two u32 halves. `ringSlot` (default 0) is word 0 and is
 * rewritten per step; `maskUnused` sets the flag that skips ids marked in the mask buffer.
 * @throws {RangeError} as {@linkcode checkSampling}
 */
export function sampleParamWords(
  p: SamplingParams,
  opts: { ringSlot?: number; maskUnused?: boolean; hist?: number } = {},
): Uint32Array<ArrayBuffer> {
  checkSampling(p);
  const hist = opts.hist ?? SAMPLE_HIST;
  return packSampleParams({
    ringSlot: opts.ringSlot ?? 0,
    maskUnused: opts.maskUnused ?? false,
    temperature: p.temperature,
    topK: p.topK,
    topP: p.topP,
    minP: p.minP,
    repeatPenalty: p.repeatPenalty,
    presencePenalty: p.presencePenalty,
    frequencyPenalty: p.frequencyPenalty,
    penaltyLastN: p.penaltyLastN < 0 ? hist : Math.min(p.penaltyLastN, hist),
    seedLo: p.seed >>> 0,
    seedHi: Math.floor(p.seed / 2 ** 32) >>> 0,
  });
}

/**
 * The kernel's mask words from `tokenizer.ggml.token_type` values: a set bit for every UNUSED id (and for
 * ids past the types array, up to `nVocab`: padding rows of the LM head that have no token).
 */
export function unusedTokenMask(types: ArrayLike<number>, nVocab: number): Uint32Array<ArrayBuffer> {
  return sampleMaskWords(nVocab, (id) => id >= types.length || types[id] === TOKEN_TYPE.unused);
}

/**
 * The `sample` kernel's settings for a vocabulary of `nVocab` logits, as measured fastest on the H200 at
 * nVocab 248320 on 2026-12-02 (0.10 ms per step greedy, 0.12 ms with the full chain and a 64-id penalty
 * window; the argmax kernel takes 0.035 ms): 32 blocks of ~7.8k logits (fewer for small vocabularies), 256
 * invocations, a 2048-entry sort buffer (about 20 KiB of workgroup memory, within lavapipe's 32 KiB).
 * @throws {RangeError} when nVocab is not an integer in [1, 2^31]
 */
export function sampleConstantsFor(nVocab: number): SampleConstants {
  const c: SampleConstants = {
    N_VOCAB: nVocab,
    K: SAMPLE_CANDIDATES,
    N_BLOCK: Math.max(1, Math.min(32, Math.ceil(nVocab / 1024)), Math.ceil(nVocab / 32768)),
    WG: 256,
    BUF: 2048,
    HIST: SAMPLE_HIST,
  };
  checkSample(c);
  if (sampleWorkgroupBytes(c) > 32768) {
    throw new RangeError(
      `Internal error: sample settings for nVocab ${nVocab} need ${
        sampleWorkgroupBytes(c)
      } bytes of workgroup memory`,
    );
  }
  return c;
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

/** Step `step`'s `top` [id, logit] pairs of a readback's pair words (logit bits, id), highest first. */
export function pairsToTop(pairs: Uint32Array, step: number, top: number): [number, number][] {
  const f = new Float32Array(pairs.buffer, pairs.byteOffset, pairs.length);
  const out: [number, number][] = [];
  for (let i = 0; i < top; i++) {
    const at = (step * top + i) * 2;
    out.push([pairs[at + 1]!, f[at]!]);
  }
  return out;
}
