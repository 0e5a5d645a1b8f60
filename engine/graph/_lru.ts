/**
 * A Map with a size limit that forgets its least recently used entries: a stage's caches of graphs and
 * pre-encoded runs are keyed by slot and chunk width, which a server meets in endless variety.
 * @module
 */

/** Map subset a bounded cache offers (`get` counts as a use). */
export class LruMap<K, V> {
  readonly #map = new Map<K, V>();
  readonly #limit: number;
  readonly #onEvict: ((value: V, key: K) => void) | undefined;

  /**
   * @param limit most entries kept (≥ 1)
   * @param onEvict called with each entry the limit pushes out (not with those deleted or replaced by `set`)
   */
  constructor(limit: number, onEvict?: (value: V, key: K) => void) {
    if (!Number.isInteger(limit) || limit < 1) {
      throw new RangeError(`An LRU limit is an integer ≥ 1, got ${limit}`);
    }
    this.#limit = limit;
    this.#onEvict = onEvict;
  }

  /** Entries held. */
  get size(): number {
    return this.#map.size;
  }

  /** The value of `key`, now the most recently used; undefined when absent. */
  get(key: K): V | undefined {
    const v = this.#map.get(key);
    if (v === undefined) return undefined;
    this.#map.delete(key);
    this.#map.set(key, v);
    return v;
  }

  /** Whether `key` is held (not a use). */
  has(key: K): boolean {
    return this.#map.has(key);
  }

  /** Sets `key` as the most recently used entry, evicting the least recently used ones beyond the limit. */
  set(key: K, value: V): this {
    this.#map.delete(key);
    this.#map.set(key, value);
    for (const [k, v] of this.#map) {
      if (this.#map.size <= this.#limit) break;
      this.#map.delete(k);
      this.#onEvict?.(v, k);
    }
    return this;
  }

  /** Removes `key`; whether it was there. */
  delete(key: K): boolean {
    return this.#map.delete(key);
  }

  /** The values, least recently used first. */
  values(): IterableIterator<V> {
    return this.#map.values();
  }
}
