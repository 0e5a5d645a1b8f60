/**
 * Running aggregates of a split chain's per-stage times, kept by the head's link ({@linkcode ChainLink}):
 * per stage its own compute per RUN frame (the head's as the split decoder measured it, the workers' from
 * the RUN_RESULT's stage times) and the wire time (round trip minus the compute behind it). Adding a sample
 * is O(1) with no allocation; a view costs a pass over the recent window.
 * @module
 */

/** Samples in the recent window of a {@linkcode RunningTime}. */
export const RECENT_WINDOW = 32;

/** A view of a {@linkcode RunningTime}, in ms. */
export interface RunningTimeView {
  /** Samples added since start. */
  readonly count: number;
  /** Their sum. */
  readonly totalMs: number;
  /** The latest (0 before any). */
  readonly lastMs: number;
  /** Mean of the latest {@linkcode RECENT_WINDOW} samples (0 before any). */
  readonly recentMs: number;
}

/** One measured time's aggregates: count, total, latest, and the mean of a recent window. */
export class RunningTime {
  #count = 0;
  #totalMs = 0;
  #lastMs = 0;
  readonly #ring = new Float64Array(RECENT_WINDOW);

  /**
   * Adds one sample.
   * @throws {RangeError} on a negative or non-finite time (a bug in the caller's clock arithmetic)
   */
  add(ms: number): void {
    if (!(ms >= 0 && Number.isFinite(ms))) {
      throw new RangeError(`Internal error: a stage time must be a finite number >= 0 ms, got ${ms}`);
    }
    this.#ring[this.#count % RECENT_WINDOW] = ms;
    this.#count++;
    this.#totalMs += ms;
    this.#lastMs = ms;
  }

  /** Samples added so far. */
  get count(): number {
    return this.#count;
  }

  /** The aggregates now. */
  view(): RunningTimeView {
    const n = Math.min(this.#count, RECENT_WINDOW);
    let sum = 0;
    for (let i = 0; i < n; i++) sum += this.#ring[i]!;
    return {
      count: this.#count,
      totalMs: this.#totalMs,
      lastMs: this.#lastMs,
      recentMs: n > 0 ? sum / n : 0,
    };
  }
}

/**
 * The times of a chain: stage 0 is the head, stage `i ≥ 1` the i-th worker behind it. Stages appear as they
 * first report (a chain's length is known from its replies).
 */
export class ChainTimes {
  readonly #compute: RunningTime[] = [];
  readonly #wire: RunningTime[] = [];

  /**
   * Adds one RUN frame.
   * @param r `headUs`: the head's compute for the frame's rows (absent: not measured, e.g. a later piece of a
   *   long prompt); `timesUs`: each worker's own compute, nearest first (docs/WIRE.md RUN_RESULT); `roundTripUs`:
   *   the head's round trip of the RUN on the link. The wire time of the hop into stage 1 is the round trip
   *   minus every worker's compute (at least 0): with more than one worker it holds every hop's wire time,
   *   since a middle worker reports only its compute.
   */
  record(r: { headUs?: number; timesUs: readonly number[]; roundTripUs: number }): void {
    if (r.headUs !== undefined) this.#at(this.#compute, 0).add(r.headUs / 1000);
    let sum = 0;
    r.timesUs.forEach((us, i) => {
      this.#at(this.#compute, i + 1).add(us / 1000);
      sum += us;
    });
    this.#at(this.#wire, 1).add(Math.max(0, r.roundTripUs - sum) / 1000);
  }

  /** Stage `i`'s compute aggregates (undefined before it reported). */
  compute(i: number): RunningTimeView | undefined {
    return this.#compute[i]?.view();
  }

  /** The wire aggregates of the hop into stage `i` (undefined when not measured). */
  wire(i: number): RunningTimeView | undefined {
    const w = this.#wire[i];
    return w && w.count > 0 ? w.view() : undefined;
  }

  #at(list: RunningTime[], i: number): RunningTime {
    while (list.length <= i) list.push(new RunningTime());
    return list[i]!;
  }
}
