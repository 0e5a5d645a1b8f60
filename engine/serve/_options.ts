/**
 * The engine service's scheduling options, checked and with their defaults filled in, as the worker's `init`
 * message carries them (the main thread does not load the engine's modules: limits are restated here).
 * @module
 */
import type { EngineOptions } from "./service.ts";

/** Ids per turn when requests take turns: about 5% overhead per turn at a few ms per id (H200). */
const DEFAULT_TURN_TOKENS = 64;
/** Tokens before a prompt's end of the per-slot snapshot: covers a chat template's generation cue. */
const DEFAULT_SNAPSHOT_BACK = 8;
/**
 * Prefill chunk: wide chunks read each weight once for more tokens (H200, 35B-A3B: 2,612 tok/s at 2,048
 * against 1,067 at 256, docs/PERF.md); the activations grow with it (about 0.7 GB at 2,048 for 35B-A3B).
 */
export const DEFAULT_MAX_CHUNK = 2048;
/** Prompt tokens per piece while other requests stream: their pause per piece stays short. */
export const DEFAULT_PREFILL_TURN = 256;
/** Prompt tokens per prefill round while nothing generates: a few seconds of prefill on the H200 at most. */
export const DEFAULT_PREFILL_ALONE = 8192;
/** Generating requests from which they share one decode step: 2, every generating request joins every step. */
export const DEFAULT_BATCH_MIN = 2;
/**
 * Decode steps per readback between a long prompt's pieces: the streams' gap is a piece plus 2 steps and the
 * readback, and the prompt's time to first token grows by 2 steps per piece, not 8 (#20's fairness goals:
 * 8 pieces of a 2,048-token prompt each followed by 8 steps of 8 slots took 4.33x its solo TTFT on the H200).
 */
export const DEFAULT_PIECE_STEPS = 2;

/** The options the worker runs with (EngineOptions' scheduling fields, defaults filled in). */
export interface ResolvedOptions {
  readonly batch: number;
  readonly pieceSteps: number;
  readonly turnTokens: number;
  readonly snapshotBack: number;
  readonly prefillTurn: number;
  readonly prefillAlone: number;
  readonly batchMin: number;
  readonly maxChunk: number;
}

/**
 * Checks `opts` and fills in the defaults.
 * @throws {RangeError} naming the option that is out of range
 */
export function resolveOptions(opts: EngineOptions): ResolvedOptions {
  const int = (name: string, v: number, lo: number, hi = Infinity) => {
    if (!Number.isInteger(v) || v < lo || v > hi) {
      const range = hi === Infinity ? `>= ${lo}` : `in ${lo}..${hi}`;
      throw new RangeError(`Engine option ${name} must be an integer ${range}, got ${v}`);
    }
    return v;
  };
  int("nCtx", opts.nCtx, 2);
  int("nSlots", opts.nSlots, 1);
  int("queueSize", opts.queueSize, 0);
  const batch = int("batch", opts.batch ?? 8, 1, 64);
  const maxChunk = int("maxChunk", opts.maxChunk ?? DEFAULT_MAX_CHUNK, 1, 4096);
  // 16 = Stage's MAX_BATCH_SLOTS.
  const batchMin = opts.batchMin ?? DEFAULT_BATCH_MIN;
  if (!Number.isInteger(batchMin) || !(batchMin === 0 || (batchMin >= 2 && batchMin <= 16))) {
    throw new RangeError(`Engine option batchMin must be 0 (never) or an integer 2..16, got ${batchMin}`);
  }
  if (opts.draft) draftCheck(opts.draft, opts.split !== undefined);
  return {
    batch,
    pieceSteps: int("pieceSteps", opts.pieceSteps ?? Math.min(batch, DEFAULT_PIECE_STEPS), 1, batch),
    turnTokens: int("turnTokens", opts.turnTokens ?? DEFAULT_TURN_TOKENS, 0),
    snapshotBack: int("snapshotBack", opts.snapshotBack ?? DEFAULT_SNAPSHOT_BACK, 0),
    prefillTurn: int("prefillTurn", opts.prefillTurn ?? Math.min(maxChunk, DEFAULT_PREFILL_TURN), 0),
    prefillAlone: int("prefillAlone", opts.prefillAlone ?? DEFAULT_PREFILL_ALONE, 0),
    batchMin,
    maxChunk,
  };
}

/** Checks EngineOptions.draft (7 = MAX_DRAFT). */
function draftCheck(d: NonNullable<EngineOptions["draft"]>, split: boolean): void {
  const min = d.min ?? Math.min(4, d.k);
  const int = (v: number, lo: number, hi: number) => Number.isInteger(v) && v >= lo && v <= hi;
  const bad = split
    ? "a split head drafts through its chain (split.next)"
    : !int(d.k, 1, 7)
    ? `k must be an integer in 1..7, got ${d.k}`
    : !int(min, 1, d.k)
    ? `min must be an integer in 1..${d.k}, got ${d.min}`
    : !int(d.cache ?? 0, 0, Infinity)
    ? `cache must be an integer >= 0, got ${d.cache}`
    : undefined;
  if (bad) throw new RangeError(`Engine option draft: ${bad}`);
}
