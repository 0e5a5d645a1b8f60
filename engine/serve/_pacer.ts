/**
 * Prompt pieces sized by time (#20's fairness goals): while requests stream, a long prompt is prefilled in
 * pieces, each followed by one short decode turn of the streams, so their gap between id batches grows from
 * the steady `batch` steps to a piece plus `pieceSteps` steps. Fixed pieces cannot serve both goals on every
 * machine: small ones keep the gap short but prefill slowly (a 256-token chunk ran at 0.42× the rate of a
 * 2,048-token one on the H200, and every piece adds a turn to the prompt's time to first token), large ones
 * freeze the streams. The pacer measures both sides as the scheduler runs, the decode step (the time between
 * batches of ids landing in one decode call) and the pieces' time (a round's time less its turn's steps), and
 * sizes the next round's pieces so that a round takes about `gap` times the streams' steady gap:
 *
 *   piece time  = gap · batch · step − pieceSteps · step
 *   piece       = the most tokens whose predicted time fits, rounded down to the grain (`minPiece`, at most
 *                 128: the matmul's token tile), within minPiece..maxPiece
 *
 * A piece's time is predicted by the line a + b·n through the pieces measured at different widths (least
 * squares over the latest few): on the H200 a narrow piece is mostly fixed cost (a 256-token chunk of the
 * 35B-A3B took 198 ms, a 2,048-token one 662: about 132 ms + 0.26 ms per token), so a rate taken from one
 * narrow piece alone would keep every piece narrow. Until two widths are measured (or when the line has no
 * positive slope and non-negative intercept) the prediction is proportional to the latest piece, which
 * overestimates wider pieces' time whenever a ≥ 0: the first rounds stay within the budget and grow it.
 * Until a step and a piece are measured a round takes `minPiece` tokens (the fixed piece of before).
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

/** Widths remembered for the line fit. */
const POINTS = 6;
/** The finest grain of a piece: the prefill matmul's token tile (docs/PERF.md). */
const MAX_GRAIN = 128;

/** Sizes the prompt pieces of the rounds between decode turns; see the module doc. */
export class PiecePacer {
  readonly #o: PacerOptions;
  readonly #grain: number;
  /** Wall ms per decode step, from the latest batch that landed after another in one call. */
  #stepMs: number | undefined;
  /** Piece tokens → wall ms of its round less the turn's steps (latest per width, oldest first). */
  readonly #points = new Map<number, number>();

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

  /** What it has measured: ms per decode step and ms per piece width (undefined or empty: not yet). */
  get measured(): { stepMs?: number; pieces: [number, number][] } {
    return { stepMs: this.#stepMs, pieces: [...this.#points] };
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
    this.#points.delete(tokens);
    this.#points.set(tokens, pieceMs);
    if (this.#points.size > POINTS) this.#points.delete(this.#points.keys().next().value!);
  }

  /** Prompt tokens for the next round's pieces while requests stream. */
  budget(): number {
    const { gap, minPiece, maxPiece, batch, pieceSteps } = this.#o;
    if (gap === 0 || !Number.isFinite(minPiece) || this.#stepMs === undefined || this.#points.size === 0) {
      return minPiece;
    }
    const n = this.#fits((gap * batch - pieceSteps) * this.#stepMs);
    return Math.min(maxPiece, Math.max(minPiece, Math.floor(n / this.#grain) * this.#grain));
  }

  /** The most tokens a piece of `ms` holds, by the line through the measured widths (see the module doc). */
  #fits(ms: number): number {
    const pts = [...this.#points];
    const [n0, t0] = pts.at(-1)!;
    const proportional = (n0 / t0) * ms;
    if (pts.length < 2) return proportional;
    const k = pts.length;
    const mx = pts.reduce((s, [n]) => s + n, 0) / k;
    const my = pts.reduce((s, [, t]) => s + t, 0) / k;
    const sxx = pts.reduce((s, [n]) => s + (n - mx) ** 2, 0);
    const sxy = pts.reduce((s, [n, t]) => s + (n - mx) * (t - my), 0);
    const b = sxy / sxx;
    const a = my - b * mx;
    return b > 0 && a >= 0 ? (ms - a) / b : proportional;
  }
}
