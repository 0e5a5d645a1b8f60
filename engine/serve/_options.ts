/**
 * The engine service's options ({@linkcode EngineOptions}), their defaults, and their checks: the scheduling
 * fields resolved as the worker's `init` message carries them (the main thread does not load the engine's
 * modules: limits such as MAX_BATCH_SLOTS are restated here).
 * @module
 */
import type { ChainClient } from "../exec/split.ts";

/** Options of `startEngine` (engine/serve/service.ts). */
export interface EngineOptions {
  /** GGUF path (first part of a split set); absent: a tiny synthetic qwen35moe written to a temp folder. */
  readonly model?: string;
  /** Positions per slot. */
  readonly nCtx: number;
  /** Slots: requests admitted at once, and cached conversations. */
  readonly nSlots: number;
  /** Requests that may wait for a slot; one more is refused with {@linkcode QueueFullError}. */
  readonly queueSize: number;
  /** Decode steps per readback: ids stream back in batches of this many, and a cancel lands within one (default 8). */
  readonly batch?: number;
  /**
   * Decode steps per readback in the turns between a long prompt's pieces, and when a newcomer waits
   * (default {@linkcode DEFAULT_PIECE_STEPS}, 1..`batch`): the streams' gap per piece and the prompt's wait per
   * piece both grow with it.
   */
  readonly pieceSteps?: number;
  /**
   * Most ids a request makes per decode call while other generating requests wait for a place in the step
   * (default 64; 0: no limit): only when more requests generate than one step holds (more than 8, fewer than
   * `batchMin`, or a model that cannot batch). Each such call after a request's first costs a readback.
   */
  readonly turnTokens?: number;
  /**
   * Each slot keeps a snapshot of its state this many tokens before the end of its last prompt (default 8;
   * 0: none), so a next turn whose template re-renders the previous reply (thinking dropped), or a regenerate,
   * reuses everything before the generation cue. Costs one snapshot per slot in GPU memory and, per prompt
   * longer than that, one more prefill readback.
   */
  readonly snapshotBack?: number;
  /**
   * Most prompt tokens prefilled per piece while other requests generate (default
   * {@linkcode DEFAULT_PREFILL_TURN} or `maxChunk` if less; 0: a whole prompt at once). A long prompt is
   * prefilled piece by piece, each followed by one decode turn (a readback's `pieceSteps` steps) of the
   * requests generating meanwhile, so their streams pause for one piece at a time. Each piece costs one
   * readback.
   */
  readonly prefillTurn?: number;
  /**
   * Pieces sized by time (default {@linkcode DEFAULT_PIECE_GAP}; 0: every piece `prefillTurn` tokens): while
   * requests stream, each round of a long prompt's pieces and the decode turn after it takes about this many
   * times the streams' steady gap between id batches, in multiples of `prefillTurn` up to `prefillAlone`,
   * sized from the decode steps and pieces measured so far (engine/serve/_pacer.ts). Larger: the prompt's
   * first token sooner, the streams' pause per piece longer.
   */
  readonly pieceGap?: number;
  /**
   * Pieces split by depth (default true): while requests stream, a long prompt goes in wide pieces (up to
   * `maxChunk` tokens), each run a few layers at a time, one part per round before the streams' decode turn,
   * as many parts as the round's budget of thin pieces asks for (a wide piece prefills at several times a
   * thin one's rate: the prompt's first token comes sooner for the same pause of the streams). False: whole
   * pieces of the round's budget.
   */
  readonly pieceParts?: boolean;
  /**
   * Most prompt tokens prefilled per round while no request generates (default
   * {@linkcode DEFAULT_PREFILL_ALONE}; 0: a whole prompt at once; never below `prefillTurn`): a lone long
   * prompt goes in a few wide rounds, and a request arriving meanwhile waits at most one round.
   */
  readonly prefillAlone?: number;
  /**
   * Fewest generating requests that share one batched GPU step (default {@linkcode DEFAULT_BATCH_MIN}: all
   * of them, always; 0: never batch; at most 16). Fewer take turns of `turnTokens` ids, one request per call:
   * a comparison point while a batched step of B slots costs about B solo steps on the H200 (docs/PERF.md).
   */
  readonly batchMin?: number;
  /**
   * Tokens per prefill chunk (default {@linkcode DEFAULT_MAX_CHUNK}, 1..4096): wider chunks read each weight
   * once for more tokens; activation memory grows with it (the logits rows: vocabulary × chunk × 4 bytes).
   */
  readonly maxChunk?: number;
  /**
   * Round x to int8 before quantized mat-vecs (StageOptions.int8Activations; default false, while `head`
   * turns it on unless `--int8-experts` or `--f32-experts`): faster decode, single-stream and batched.
   * Prefill chunks round x alike, so prefix reuse and snapshots differ from a cold run only by f32 order.
   */
  readonly int8Activations?: boolean;
  /**
   * Round x to int8 for the expert passes alone (StageOptions.int8Experts; default false, while `head` turns
   * it on unless `--f32-experts`; implied by int8Activations).
   */
  readonly int8Experts?: boolean;
  /** KV cache in f16 (StageOptions.kvF16; default false): half the memory per position. */
  readonly kvF16?: boolean;
  /**
   * Split serving: the head runs `layers` (0:a) of the model and the chain `next` (wire/chain.ts, given by
   * cli/head.ts) runs the rest; both or neither. Requests while the chain is down get {@linkcode QueueFullError}.
   */
  readonly split?: {
    readonly layers: readonly [number, number];
    readonly next: ChainClient;
    /** Pipeline groups of a multi-slot generate (SplitDecoder's `groups`; default 2, 0: one slot at a time). */
    readonly groups?: number;
    /** n-grams of the cross-request draft cache (engine/exec/draft_cache.ts); absent or 0: none. */
    readonly draftCache?: number;
  };
  /**
   * Drafted frames in the unsplit engine (engine/exec/drafting.ts; the same output): `k` most guesses per frame
   * (1..7), `cache` n-grams of the draft cache (absent or 0: none), `min` fewest guesses per frame (1..k;
   * default 4 or k). Refused with `split`: a split head drafts through its chain (`split.next`).
   */
  readonly draft?: { readonly k: number; readonly cache?: number; readonly min?: number };
  /**
   * Run the warm-up at load (default true): a short prefill and decode on the first slots and a graph of
   * every prefill width class, so no request compiles pipelines inside its time to first token. false
   * (`head --no-warm-up`, llama.cpp's `--no-warmup`): ready sooner, the first requests of each shape compile
   * theirs.
   */
  readonly warmUp?: boolean;
  /** Log lines (model chosen, GPU, load summary); default `console.error`. */
  readonly onLog?: (line: string) => void;
}

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
/**
 * A round of prompt pieces and its decode turn while requests stream: 2.5 times their steady gap (#20: the
 * streams' gap under 3x while a 2,048-token prompt arrives, its TTFT under 2x its solo one). The H200's rounds
 * of fixed 256-token pieces took ~260 ms against a steady gap of 169 ms at 7 streams (1.5x), and the prompt's
 * TTFT was 3.01x its solo one: each narrow piece prefills at about half the rate of a wide chunk.
 */
export const DEFAULT_PIECE_GAP = 2.5;
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
  /** Decode steps per readback (ids stream back in batches of this many). */
  readonly batch: number;
  /** Decode steps per readback in a turn that other work waits for. */
  readonly pieceSteps: number;
  /** Most ids a request makes per turn before the next active request runs (0: the whole request). */
  readonly turnTokens: number;
  /** Prompt-boundary snapshots this many tokens before a prompt's end (0: none). */
  readonly snapshotBack: number;
  /** Most prompt tokens prefilled per turn (0: a whole prompt). */
  readonly prefillTurn: number;
  /** Target round time while requests stream, in steady gaps (0: fixed `prefillTurn` pieces). */
  readonly pieceGap: number;
  /** Pieces split by depth while requests stream. */
  readonly pieceParts: boolean;
  /** Most prompt tokens prefilled per round while no request generates (0: a whole prompt). */
  readonly prefillAlone: number;
  /** Fewest generating requests batched into one GPU step (0: never). */
  readonly batchMin: number;
  /** Tokens per prefill chunk. */
  readonly maxChunk: number;
  /** Whether the worker runs the warm-up at load. */
  readonly warmUp: boolean;
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
    pieceGap: gapCheck(opts.pieceGap ?? DEFAULT_PIECE_GAP),
    pieceParts: opts.pieceParts ?? true,
    prefillAlone: int("prefillAlone", opts.prefillAlone ?? DEFAULT_PREFILL_ALONE, 0),
    batchMin,
    maxChunk,
    warmUp: opts.warmUp ?? true,
  };
}

/** Checks EngineOptions.pieceGap: 0 (fixed pieces) or a round of 1..64 steady gaps. */
function gapCheck(g: number): number {
  if (!(g === 0 || (g >= 1 && g <= 64))) {
    throw new RangeError(
      `Engine option pieceGap must be 0 (fixed pieces of prefillTurn) or a number in 1..64 (a round of ` +
        `pieces and its decode turn in steady gaps of the streams), got ${g}`,
    );
  }
  return g;
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
