/**
 * The head's prefill progress log (issue #24): while a request's prompt prefills for longer than `everyMs`,
 * one line per slot at most every `everyMs`, from the engine's per-slot view (`status().slots`, which follows
 * the GPU: the runner's prompt pieces are paced on their completion, engine/exec/decode.ts):
 *
 * ```
 * prefill slot=0 prompt_tokens=8192/32768 tok_s=1234.5 elapsed_ms=6634
 * ```
 *
 * `prompt_tokens` counts the prompt tokens the slot holds (a cached prefix included) of the prompt's total;
 * `tok_s` is the rate since the slot was first seen prefilling; short prompts print nothing.
 *
 * @example
 * ```ts
 * import { PrefillLog } from "./prefill_log.ts";
 * const progress = new PrefillLog(1000);
 * setInterval(() => progress.update(engine.status().slots ?? [], performance.now()).forEach((l) => console.error(l)), 250);
 * ```
 * @module
 */
import type { EngineStatus } from "../engine/mod.ts";

/** How far two readings of one request's admission time may differ (status() and the caller read the clock apart). */
const ADMITTED_SLACK_MS = 20;

/** One slot's view, as the engine reports it. */
type SlotView = NonNullable<EngineStatus["slots"]>[number];

/** Per-slot progress lines of long prefills; see the module doc. */
export class PrefillLog {
  readonly #everyMs: number;
  /** Per slot: the request seen prefilling there (its admission time), when and at what count, last line. */
  readonly #seen = new Map<number, { admittedMs: number; startMs: number; held: number; lineMs: number }>();

  /** Lines once a prefill has run `everyMs`, then at most one per `everyMs` per slot. */
  constructor(everyMs: number) {
    this.#everyMs = everyMs;
  }

  /** The lines due for the slots `slots` at `nowMs` (`performance.now()`, the clock of `ageMs`). */
  update(slots: readonly SlotView[], nowMs: number): string[] {
    const lines: string[] = [];
    for (const s of slots) {
      if (s.phase !== "prefilling") {
        this.#seen.delete(s.slot);
        continue;
      }
      // A request is known by its admission time: a new one on the same slot starts over.
      const admittedMs = nowMs - s.ageMs;
      let seen = this.#seen.get(s.slot);
      if (seen === undefined || Math.abs(seen.admittedMs - admittedMs) > ADMITTED_SLACK_MS) {
        seen = { admittedMs, startMs: nowMs, held: s.prefilledTokens, lineMs: -Infinity };
        this.#seen.set(s.slot, seen);
      }
      const ms = nowMs - seen.startMs;
      if (ms < this.#everyMs || nowMs - seen.lineMs < this.#everyMs) continue;
      seen.lineMs = nowMs;
      const rate = ms > 0 ? (((s.prefilledTokens - seen.held) * 1000) / ms).toFixed(1) : "-";
      lines.push(
        `prefill slot=${s.slot} prompt_tokens=${s.prefilledTokens}/${s.promptTokens} tok_s=${rate} ` +
          `elapsed_ms=${Math.round(ms)}`,
      );
    }
    return lines;
  }
}
