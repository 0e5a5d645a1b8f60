/**
 * Stop strings over streamed text: finds a user stop string across token boundaries, holds back only the
 * text that could still begin one, and never emits the matched text (spec/chat.md §7).
 *
 * @example
 * ```ts
 * import { StopMatcher } from "./stop.ts";
 * const m = new StopMatcher(["\n\nUser:"]);
 * m.push("Hello\n"); // { text: "Hello" }  ("\n" is held: it may start the stop)
 * m.push("\nUser: hi"); // { text: "", stop: "\n\nUser:" }
 * ```
 * @module
 */

/**
 * Why generation ended: `eos` an end-of-generation token, `stop` a stop string, `max_tokens` the request's
 * limit, `context` the context window is full, `tool_use` the output ended with a tool call.
 */
export type StopReason = "eos" | "stop" | "max_tokens" | "context" | "tool_use";

/** All values of {@linkcode StopReason}, for validation and exhaustive tables. */
export const STOP_REASONS: readonly StopReason[] = ["eos", "stop", "max_tokens", "context", "tool_use"];

/** What one {@linkcode StopMatcher.push} releases. */
export interface StopPush {
  /** Text that is now certain not to be part of a stop string (may be `""`). */
  text: string;
  /** The stop string that matched; set once, after which the matcher takes no more text. */
  stop?: string;
}

/**
 * Matches stop strings in a stream of text pieces. The reported match is the one that ends first in the
 * whole text (ties: the longest, i.e. the one starting first), so the result does not depend on how the
 * text was split into pieces; the text before the match is emitted, the match and anything after it never.
 */
export class StopMatcher {
  /** The stop strings, as given. */
  readonly stops: readonly string[];
  #held = "";
  #stop: string | undefined;
  #maxLen: number;

  /**
   * Creates a matcher for `stops` (none: every piece passes through at once).
   * @throws {RangeError} when a stop string is empty
   */
  constructor(stops: readonly string[]) {
    const i = stops.indexOf("");
    if (i >= 0) throw new RangeError(`Stop string #${i} is empty: remove it or give at least one character`);
    this.stops = [...stops];
    this.#maxLen = Math.max(0, ...stops.map((s) => s.length));
  }

  /** The stop string that matched, if any. */
  get stopped(): string | undefined {
    return this.#stop;
  }

  /**
   * Feeds the next piece of generated text.
   * @throws {Error} when called after a stop matched
   */
  push(piece: string): StopPush {
    if (this.#stop !== undefined) {
      throw new Error(
        `StopMatcher.push after stop ${JSON.stringify(this.#stop)} matched: end the generation`,
      );
    }
    const buf = this.#held + piece;
    let best: { start: number; end: number; stop: string } | undefined;
    // The held text contains no complete stop (it was searched before), so only matches ending inside
    // `piece` are new; searching `buf` whole keeps the code simple at the cost of re-scanning < maxLen chars.
    for (const s of this.stops) {
      const start = buf.indexOf(s);
      if (start < 0) continue;
      const end = start + s.length;
      if (best === undefined || end < best.end || (end === best.end && start < best.start)) {
        best = { start, end, stop: s };
      }
    }
    if (best !== undefined) {
      this.#stop = best.stop;
      this.#held = "";
      return { text: buf.slice(0, best.start), stop: best.stop };
    }
    const keep = this.#partialLength(buf);
    this.#held = buf.slice(buf.length - keep);
    return { text: buf.slice(0, buf.length - keep) };
  }

  /** Ends the stream: returns the held text (none after a stop matched). */
  flush(): string {
    const out = this.#stop === undefined ? this.#held : "";
    this.#held = "";
    return out;
  }

  /** Length of the longest suffix of `buf` that is a proper prefix of some stop string. */
  #partialLength(buf: string): number {
    for (let k = Math.min(this.#maxLen - 1, buf.length); k > 0; k--) {
      const tail = buf.slice(buf.length - k);
      if (this.stops.some((s) => s.length > k && s.startsWith(tail))) return k;
    }
    return 0;
  }
}
