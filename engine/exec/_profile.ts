/**
 * Where a stage's frames spend their time (issue #19): per phase of `Stage.run` / `Stage.runBatch` (graph
 * lookup, writeBuffer, encode, submit, the blocking `mapAsync` call, the wait for its promise, the copy out)
 * and of a worker's RUN (CPU argmax and top-k, the GPU sampler), milliseconds summed since the stage loaded.
 * Always on (a few `performance.now()` calls per frame); `head` and `worker` print it as one JSON line on
 * SIGUSR1 when started with `LLM_STAGE_PROFILE=1` (bench/split.ts reads it).
 * @module
 */

/** Milliseconds and count of one phase. */
export interface PhaseTotal {
  /** Milliseconds summed. */
  ms: number;
  /** Times the phase ran. */
  count: number;
}

/** Summed phase times of a stage (see the module doc). */
export class RunProfile {
  /** Phase name → total. */
  readonly phases: Record<string, PhaseTotal> = {};
  #t = 0;

  /** Starts timing (the next `lap` measures from here). */
  start(): void {
    this.#t = performance.now();
  }

  /** Adds the time since the last `start` or `lap` to `phase` and restarts the clock. */
  lap(phase: string): void {
    const now = performance.now();
    this.add(phase, now - this.#t);
    this.#t = now;
  }

  /** Adds `ms` to `phase`. */
  add(phase: string, ms: number): void {
    const p = this.phases[phase] ??= { ms: 0, count: 0 };
    p.ms += ms;
    p.count++;
  }

  /** A copy of the totals (ms rounded to microseconds). */
  snapshot(): Record<string, PhaseTotal> {
    return Object.fromEntries(
      Object.entries(this.phases).map((
        [k, v],
      ) => [k, { ms: Math.round(v.ms * 1000) / 1000, count: v.count }]),
    );
  }
}

/**
 * With `LLM_STAGE_PROFILE=1`: prints `stage profile: {JSON}` (label and phases) to stderr on each SIGUSR1.
 * Does nothing otherwise (or where signals are not available).
 */
export function printProfileOnSignal(label: string, profile: RunProfile): void {
  try {
    if (Deno.env.get("LLM_STAGE_PROFILE") !== "1") return;
    Deno.addSignalListener("SIGUSR1", () => {
      console.error(`stage profile: ${JSON.stringify({ label, phases: profile.snapshot() })}`);
    });
  } catch {
    // No env access or no signals here: no profile lines.
  }
}
