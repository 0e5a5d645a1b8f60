/**
 * Byte-level BPE over vocabulary ids (spec `chat.md` §4.1 steps 4-5).
 *
 * Symbols are integers: vocabulary ids, plus "virtual" ids past the vocabulary for merge operands or
 * results that are not tokens themselves (none in the Qwen vocabularies, but the merge list alone defines
 * BPE, so they are kept). An open-addressing table over typed arrays maps the pair (left, right) to (rank,
 * result), so merging never builds strings. Each word is merged with a binary heap over the pairs of a doubly linked list of its
 * symbols, keyed by rank then position (ties: leftmost first), O(n log n) per word; results are cached per
 * pre-token string.
 * @module
 */
import { BYTE_TO_CODE_POINT } from "./_byte_level.ts";

/** Symbol ids (vocabulary plus virtual) must stay below this (they are stored in Int32Array slots). */
const MAX_SYMBOLS = 2 ** 30;
/** Heap keys are rank * POS_STRIDE + left position. */
const POS_STRIDE = 2 ** 32;
/** The per-word cache is cleared when it reaches this many entries, bounding memory on endless input. */
const CACHE_LIMIT = 200_000;
/** Longer pre-tokens (whitespace runs, long scripts without spaces) are not cached: they rarely repeat. */
const CACHE_MAX_WORD = 256;

/** Byte-level BPE model: merge table, byte symbols and a word cache. */
export class Bpe {
  readonly #nVocab: number;
  /** Texts of virtual symbols; symbol `nVocab + i` is `#virtualText[i]`. */
  readonly #virtualText: string[] = [];
  /** The merge table: open addressing over (left, right) with linear probing; see #lookup. */
  readonly #mergeTable: MergeTable;
  /** Symbol of each byte value; ne=[256]. */
  readonly #byteSym = new Int32Array(256);
  readonly #tokenIds: ReadonlyMap<string, number>;
  readonly #cache = new Map<string, Int32Array>();

  // Scratch space reused across words (grown on demand).
  #bytes = new Uint8Array(256);
  #sym = new Int32Array(256);
  #prev = new Int32Array(256);
  #next = new Int32Array(256);
  #heap = new Float64Array(256);

  /**
   * @param tokenIds token text -> id for the whole vocabulary
   * @param nVocab number of tokens
   * @param merges `"left right"` strings, rank = index
   * @throws RangeError when a byte has no token or a merge string has no separating space
   */
  constructor(tokenIds: ReadonlyMap<string, number>, nVocab: number, merges: readonly string[]) {
    this.#nVocab = nVocab;
    this.#tokenIds = tokenIds;
    for (let b = 0; b < 256; b++) {
      const id = tokenIds.get(String.fromCharCode(BYTE_TO_CODE_POINT[b]!));
      if (id === undefined) {
        throw new RangeError(
          `Vocabulary has no token for byte 0x${b.toString(16).padStart(2, "0")} ` +
            `(text "${String.fromCharCode(BYTE_TO_CODE_POINT[b]!)}"): not a GPT-2 byte-level BPE vocabulary`,
        );
      }
      this.#byteSym[b] = id;
    }
    const virtualIds = new Map<string, number>();
    const table = newMergeTable(merges.length);
    const intern = (text: string): number => {
      const id = tokenIds.get(text) ?? virtualIds.get(text);
      if (id !== undefined) return id;
      const v = nVocab + this.#virtualText.length;
      this.#virtualText.push(text);
      virtualIds.set(text, v);
      return v;
    };
    for (let rank = 0; rank < merges.length; rank++) {
      const m = merges[rank]!;
      // Byte-level token texts never contain a space (it is "Ġ"), so the first space after the first
      // character separates the operands.
      const sp = m.indexOf(" ", 1);
      if (sp < 0) {
        throw new RangeError(
          `Merge ${rank} "${m}" has no space between its two parts: expected "left right"`,
        );
      }
      const left = m.slice(0, sp);
      const right = m.slice(sp + 1);
      // A repeated pair keeps its first (lowest) rank.
      insertMerge(table, intern(left), intern(right), rank, intern(left + right));
    }
    this.#mergeTable = table;
    if (nVocab + this.#virtualText.length >= MAX_SYMBOLS) {
      throw new RangeError(
        `Vocabulary of ${nVocab} tokens plus ${this.#virtualText.length} merge-only symbols exceeds ` +
          `${MAX_SYMBOLS} symbols this BPE supports`,
      );
    }
  }

  /** Number of merge-only symbols that are not vocabulary tokens. */
  get nVirtual(): number {
    return this.#virtualText.length;
  }

  /** Appends the ids of one pre-token to `out`. */
  encodeWord(word: string, out: number[]): void {
    let ids = this.#cache.get(word);
    if (ids === undefined) {
      ids = this.#bpe(word);
      if (word.length <= CACHE_MAX_WORD) {
        if (this.#cache.size >= CACHE_LIMIT) this.#cache.clear();
        this.#cache.set(word, ids);
      }
    }
    for (let i = 0; i < ids.length; i++) out.push(ids[i]!);
  }

  /** UTF-8 bytes of `word` into #bytes (lone surrogates become U+FFFD, as TextEncoder does); returns count. */
  #utf8(word: string): number {
    if (this.#bytes.length < word.length * 3) this.#bytes = new Uint8Array(word.length * 3);
    const b = this.#bytes;
    let n = 0;
    for (let i = 0; i < word.length; i++) {
      let c = word.charCodeAt(i);
      if (c < 0x80) {
        b[n++] = c;
      } else if (c < 0x800) {
        b[n++] = 0xc0 | (c >> 6);
        b[n++] = 0x80 | (c & 63);
      } else {
        if (c >= 0xd800 && c <= 0xdfff) {
          const d = i + 1 < word.length ? word.charCodeAt(i + 1) : 0;
          if (c <= 0xdbff && d >= 0xdc00 && d <= 0xdfff) {
            const cp = 0x10000 + ((c - 0xd800) << 10) + (d - 0xdc00);
            i++;
            b[n++] = 0xf0 | (cp >> 18);
            b[n++] = 0x80 | ((cp >> 12) & 63);
            b[n++] = 0x80 | ((cp >> 6) & 63);
            b[n++] = 0x80 | (cp & 63);
            continue;
          }
          c = 0xfffd;
        }
        b[n++] = 0xe0 | (c >> 12);
        b[n++] = 0x80 | ((c >> 6) & 63);
        b[n++] = 0x80 | (c & 63);
      }
    }
    return n;
  }

  #bpe(word: string): Int32Array {
    const n = this.#utf8(word);
    if (n === 0) return new Int32Array(0);
    if (this.#sym.length < n) {
      const size = Math.max(n, this.#sym.length * 2);
      this.#sym = new Int32Array(size);
      this.#prev = new Int32Array(size);
      this.#next = new Int32Array(size);
    }
    const sym = this.#sym, prev = this.#prev, next = this.#next, bytes = this.#bytes;
    for (let i = 0; i < n; i++) {
      sym[i] = this.#byteSym[bytes[i]!]!;
      prev[i] = i - 1;
      next[i] = i + 1 < n ? i + 1 : -1;
    }
    const t = this.#mergeTable;
    let heapSize = 0;
    for (let i = 0; i + 1 < n; i++) {
      const slot = lookupMerge(t, sym[i]!, sym[i + 1]!);
      if (slot >= 0) heapSize = this.#push(heapSize, t.rank[slot]! * POS_STRIDE + i);
    }
    while (heapSize > 0) {
      const heap = this.#heap;
      const top = heap[0]!;
      heapSize--;
      if (heapSize > 0) this.#siftDown(heap[heapSize]!, heapSize);
      const left = top % POS_STRIDE;
      const rank = (top - left) / POS_STRIDE;
      const sl = sym[left]!;
      if (sl < 0) continue;
      const right = next[left]!;
      if (right < 0) continue;
      // A popped entry is stale when either side has merged since it was pushed; the current pair at this
      // position is then merged only if it carries exactly this rank (otherwise its own entry handles it).
      const slot = lookupMerge(t, sl, sym[right]!);
      if (slot < 0 || t.rank[slot] !== rank) continue;
      const result = t.result[slot]!;
      sym[left] = result;
      sym[right] = -1;
      const after = next[right]!;
      next[left] = after;
      if (after >= 0) prev[after] = left;
      const before = prev[left]!;
      if (before >= 0) {
        const w = lookupMerge(t, sym[before]!, result);
        if (w >= 0) heapSize = this.#push(heapSize, t.rank[w]! * POS_STRIDE + before);
      }
      if (after >= 0) {
        const w = lookupMerge(t, result, sym[after]!);
        if (w >= 0) heapSize = this.#push(heapSize, t.rank[w]! * POS_STRIDE + left);
      }
    }
    const out: number[] = [];
    for (let i = 0; i >= 0; i = next[i]!) {
      const s = sym[i]!;
      if (s < this.#nVocab) {
        out.push(s);
      } else {
        // A merge-only symbol that is no token: emit the tokens of its characters. Every symbol in a word
        // descends from byte symbols, so each character is a byte character, which has a token.
        for (const ch of this.#virtualText[s - this.#nVocab]!) out.push(this.#tokenIds.get(ch)!);
      }
    }
    return Int32Array.from(out);
  }

  #push(size: number, key: number): number {
    if (size === this.#heap.length) {
      const grown = new Float64Array(size * 2);
      grown.set(this.#heap);
      this.#heap = grown;
    }
    const heap = this.#heap;
    let i = size;
    while (i > 0) {
      const parent = (i - 1) >> 1;
      const p = heap[parent]!;
      if (p <= key) break;
      heap[i] = p;
      i = parent;
    }
    heap[i] = key;
    return size + 1;
  }

  /** Places `key` starting at the root of a heap of `size` entries. */
  #siftDown(key: number, size: number): void {
    const heap = this.#heap;
    let i = 0;
    for (;;) {
      let c = 2 * i + 1;
      if (c >= size) break;
      const r = c + 1;
      if (r < size && heap[r]! < heap[c]!) c = r;
      if (heap[c]! >= key) break;
      heap[i] = heap[c]!;
      i = c;
    }
    heap[i] = key;
  }
}

/**
 * Merge table: open addressing with linear probing over (left, right) symbol pairs; `left` -1 marks an
 * empty slot. A typed-array table avoids hashing boxed doubles in a Map on the hot path.
 */
interface MergeTable {
  readonly mask: number;
  readonly left: Int32Array;
  readonly right: Int32Array;
  readonly rank: Int32Array;
  readonly result: Int32Array;
}

function newMergeTable(nMerges: number): MergeTable {
  // Load factor at most 1/2.
  let size = 16;
  while (size < nMerges * 2) size *= 2;
  return {
    mask: size - 1,
    left: new Int32Array(size).fill(-1),
    right: new Int32Array(size),
    rank: new Int32Array(size),
    result: new Int32Array(size),
  };
}

function hashPair(left: number, right: number): number {
  return Math.imul(left ^ Math.imul(right, 0x9e3779b1), 0x85ebca6b) ^ (right >>> 7);
}

/** Inserts (left, right) -> (rank, result) unless the pair is already present (an earlier rank wins). */
function insertMerge(t: MergeTable, left: number, right: number, rank: number, result: number): void {
  for (let i = hashPair(left, right) & t.mask;; i = (i + 1) & t.mask) {
    const l = t.left[i]!;
    if (l === -1) {
      t.left[i] = left;
      t.right[i] = right;
      t.rank[i] = rank;
      t.result[i] = result;
      return;
    }
    if (l === left && t.right[i] === right) return;
  }
}

/** The slot of pair (left, right), or -1 when it has no merge. */
function lookupMerge(t: MergeTable, left: number, right: number): number {
  for (let i = hashPair(left, right) & t.mask;; i = (i + 1) & t.mask) {
    const l = t.left[i]!;
    if (l === -1) return -1;
    if (l === left && t.right[i] === right) return i;
  }
}
