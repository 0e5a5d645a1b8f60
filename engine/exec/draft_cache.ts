/**
 * Drafts from earlier sequences: {@linkcode DraftCache} remembers, for every 3-id n-gram of the sequences the
 * decoder finished (prompt plus output), the ids that followed its latest occurrence, so a request that
 * repeats earlier text (a retried or regenerated request, an agent re-reading the same file, a follow-up that
 * quotes an earlier answer) gets drafts even where its own history has no match. llama.cpp's lookup decoding
 * keeps the same kind of "dynamic" n-gram cache across generations.
 *
 * Drafts never change output (the chain answers the real id for every drafted row; the head keeps ids up to
 * the first wrong guess), only speed. But a shared cache makes one request's speed depend on what other
 * requests produced, a timing side channel between users of one server: it is off unless the head is started
 * with `--draft-cache N`.
 * @module
 */
/** Longest n-gram {@linkcode lookupDrafts} matches. */
const DRAFT_NGRAM = 3;

/**
 * Prompt-lookup drafts: the `k` ids that followed the latest earlier occurrence of the longest suffix (3 ids
 * down to `minN`, default 1) of `seq`; empty when no such suffix occurred before.
 * @example
 * ```ts
 * lookupDrafts([5, 6, 7, 8, 5, 6], 3); // [7, 8, 5]
 * ```
 */
export function lookupDrafts(seq: readonly number[], k: number, minN = 1): number[] {
  if (k < 1) return [];
  for (let n = Math.min(DRAFT_NGRAM, seq.length - 1); n >= Math.max(1, minN); n--) {
    const tail = seq.length - n;
    for (let at = tail - 1; at >= 0; at--) {
      let j = 0;
      while (j < n && seq[at + j] === seq[tail + j]) j++;
      if (j === n) return seq.slice(at + n, at + n + k);
    }
  }
  return [];
}

/** Length of the n-grams the cache keys on. */
const CACHE_NGRAM = 3;

/** Where the ids after one n-gram continue: the sequence and the index after the n-gram. */
interface Next {
  readonly seq: readonly number[];
  readonly at: number;
}

/** A bounded map from 3-id n-grams to the ids that followed them last (see the module doc). */
export class DraftCache {
  readonly #max: number;
  /** n-gram key → continuation, in least-recently-written-first order (Map keeps insertion order). */
  readonly #next = new Map<string, Next>();
  /** Lookups that found a continuation. */
  hits = 0;
  /** All lookups. */
  lookups = 0;

  /**
   * An empty cache of at most `maxEntries` n-grams.
   * @param maxEntries most n-grams kept (the oldest written go first); each costs about 100 bytes plus the
   *   sequences still referenced
   * @throws {RangeError} unless `maxEntries` is a positive integer
   */
  constructor(maxEntries: number) {
    if (!Number.isInteger(maxEntries) || maxEntries < 1) {
      throw new RangeError(`A draft cache holds a positive integer of n-grams, got ${maxEntries}`);
    }
    this.#max = maxEntries;
  }

  /** n-grams held. */
  get size(): number {
    return this.#next.size;
  }

  /** Remembers every n-gram of `seq` (a finished sequence: prompt and output) with the ids after it. */
  add(seq: readonly number[]): void {
    const copy = seq.slice();
    for (let at = CACHE_NGRAM; at < copy.length; at++) {
      const key = copy.slice(at - CACHE_NGRAM, at).join(",");
      this.#next.delete(key);
      this.#next.set(key, { seq: copy, at });
    }
    for (const key of this.#next.keys()) {
      if (this.#next.size <= this.#max) break;
      this.#next.delete(key);
    }
  }

  /** Up to `k` ids that followed the last n-gram of `seq` in a remembered sequence; empty when none did. */
  lookup(seq: readonly number[], k: number): number[] {
    if (k < 1 || seq.length < CACHE_NGRAM) return [];
    this.lookups++;
    const hit = this.#next.get(seq.slice(-CACHE_NGRAM).join(","));
    if (!hit) return [];
    this.hits++;
    return hit.seq.slice(hit.at, hit.at + k);
  }

  /**
   * A drafter for SplitDecoder: the sequence's own history first ({@linkcode lookupDrafts} with a full
   * 3-id match), then this cache, then the own history's shorter matches.
   */
  drafter(): (seq: readonly number[], k: number) => number[] {
    return (seq, k) => {
      const own = lookupDrafts(seq, k, CACHE_NGRAM);
      if (own.length > 0) return own;
      const cached = this.lookup(seq, k);
      return cached.length > 0 ? cached : lookupDrafts(seq, k);
    };
  }
}
