/**
 * Prompt pieces sized by time (#20's fairness goals): while requests stream, a long prompt is prefilled in
 * pieces, each followed by one short decode turn of the streams, so their gap between id batches grows from
 * the steady `batch` steps to a piece plus `pieceSteps` steps. Fixed pieces cannot serve both goals on every
 * machine: small ones keep the gap short but prefill slowly (a 256-token chunk ran at 0.42× the rate of a
 * 2,048-token one on the H200, and every piece adds a turn to the prompt's time to first token), large ones
 * freeze the streams. The pacer measures both sides as the scheduler runs, the decode step (the time between
 * batches of ids landing in one decode call) and the pieces' time (a round's time less its turn's steps), and
 * sizes the next round's pieces by feedback, so that a round takes about `gap` times the streams' steady gap:
 *
 *   piece time  = gap · batch · step − pieceSteps · step
 *   next piece  = last piece · piece time / last piece's time (proportional), or, once two rounds of
 *                 different widths are measured, last piece + (piece time − last piece's time) / slope, the
 *                 slope of the line through those two (the secant; at most twice the last piece); rounded
 *                 down to the grain (`minPiece`, at most 128: the matmul's token tile), within
 *                 minPiece..maxPiece
 *
 * Proportional scaling never overshoots a piece cost of the form a + b·n with a ≥ 0, but with a large fixed
 * cost a it stops far short of the budget: a 256-token chunk of the 35B-A3B took 198 ms on the H200, a 2,048-
 * token one 662, and on the H100 (steps of 12.4 ms, 223 ms of pieces per round) proportional growth never
 * got past 256 (256 · 223 / 197 = 290 rounds down to 256; docs/PERF.md, 2026-12-05). So a round that used at
 * most 90% of its time while the proportional piece stays put tries one grain more, and from two widths the
 * secant takes the pieces to the budget (exact for a + b·n). A round that took longer than its budget (the
 * prompt's attention grows with its depth; on lavapipe piece time grows faster than width, where a line
 * fitted through every width measured overshot round after round) shrinks the next in proportion, and the
 * secant of the two latest widths, steeper there than the line from the origin, keeps the next growth below
 * the proportional one. Until a step and a piece are measured a round takes `minPiece` tokens.
 * @module
 */

/** Options of {@linkcode PiecePacer}. */
export interface PacerOptions {
  /** Target round time as a multiple of the streams' steady gap (`batch` steps); 0: fixed `minPiece` pieces. */
  readonly gap: number;
  /** Smallest piece and the grain of every piece (prompt tokens; Infinity: whole prompts). */
  readonly minPiece: number;
  /** Largest piece (≥ minPiece; Infinity: no cap). */
  readonly maxPiece: number;
  /** Decode steps per readback of a steady turn: the streams' steady gap is this many steps. */
  readonly batch: number;
  /** Decode steps of the turn after a round's pieces. */
  readonly pieceSteps: number;
}

/** The finest grain of a piece: the prefill matmul's token tile (docs/PERF.md). */
const MAX_GRAIN = 128;

/** Sizes the prompt pieces of the rounds between decode turns; see the module doc. */
export class PiecePacer {
  readonly #o: PacerOptions;
  readonly #grain: number;
  /** Wall ms per decode step, from the latest batch that landed after another in one call. */
  #stepMs: number | undefined;
  /** The latest round's prompt tokens and their time (its time less the turn's steps). */
  #last: { tokens: number; ms: number } | undefined;
  /** The latest round before it of another width (the secant's other point). */
  #prev: { tokens: number; ms: number } | undefined;

  constructor(opts: PacerOptions) {
    if (!(opts.gap >= 0)) throw new RangeError(`The pacer's gap must be >= 0, got ${opts.gap}`);
    if (!(opts.minPiece >= 1) || !(opts.maxPiece >= opts.minPiece)) {
      throw new RangeError(
        `The pacer's pieces must be 1 <= min <= max, got ${opts.minPiece}..${opts.maxPiece}`,
      );
    }
    this.#o = opts;
    this.#grain = Math.min(opts.minPiece, MAX_GRAIN);
  }

  /** What it has measured: ms per decode step, the latest round's tokens and ms (undefined: not yet). */
  get measured(): { stepMs?: number; last?: { tokens: number; ms: number } } {
    return { stepMs: this.#stepMs, last: this.#last };
  }

  /** A batch of `steps` decode steps landed `ms` after the batch before it in the same decode call. */
  steady(steps: number, ms: number): void {
    if (steps >= 1 && ms > 0) this.#stepMs = ms / steps;
  }

  /**
   * A round: `tokens` prompt tokens prefilled (pieces, or the rests of requests joining the turn), then a
   * decode turn of `steps` steps, `ms` in all. The steps' share comes off with the latest step time.
   */
  round(tokens: number, steps: number, ms: number): void {
    if (tokens < 1 || this.#stepMs === undefined) return;
    const pieceMs = ms - Math.max(0, steps) * this.#stepMs;
    // A round no longer than its steps says nothing about the prompt's time (timer noise, a tiny rest).
    if (!(pieceMs > 0.05 * ms)) return;
    if (this.#last && this.#last.tokens !== tokens) this.#prev = this.#last;
    this.#last = { tokens, ms: pieceMs };
  }

  /** Prompt tokens for the next round's pieces while requests stream. */
  budget(): number {
    const { gap, minPiece, maxPiece, batch, pieceSteps } = this.#o;
    const last = this.#last;
    if (gap === 0 || !Number.isFinite(minPiece) || this.#stepMs === undefined || last === undefined) {
      return minPiece;
    }
    const pieceMs = (gap * batch - pieceSteps) * this.#stepMs;
    const grain = this.#grain;
    let n = last.tokens * pieceMs / last.ms;
    const prev = this.#prev;
    const slope = prev ? (last.ms - prev.ms) / (last.tokens - prev.tokens) : 0;
    if (slope > 0) {
      // The secant, where a round fits its budget (an overshoot shrinks in proportion). Where piece time
      // grows faster than width the secant is below the proportional piece, which would overshoot again.
      const secant = last.tokens + (pieceMs - last.ms) / slope;
      if (last.ms <= pieceMs) n = Math.min(secant, 2 * last.tokens);
    } else if (Math.floor(n / grain) * grain <= last.tokens && last.ms <= 0.9 * pieceMs) {
      n = last.tokens + grain; // one grain more, to measure a second width
    }
    return Math.min(maxPiece, Math.max(minPiece, Math.floor(n / grain) * grain));
  }
}
