/**
 * Fast generators of valid random blocks of every supported type, for full-size synthetic models and
 * kernel tests. All bits come from an xorshift128 stream written a u32 word at a time; then only the scale
 * fields of each block are patched so that magnitudes stay near the requested `scale`:
 *
 * | type | patched fields (f = a factor in [0.5, 1] picked by the field's own random low byte) | bound |
 * |---|---|---|
 * | Q8_0, Q4_0, IQ4_NL | `d = ±scale·f` (sign from the field's random sign bit) | 128, 8, 127 ·scale |
 * | IQ4_XS | `d = ±scale·f`; the 6-bit sub-scales stay random, so `ls − 32` spans −32..31 | 32·127·scale |
 * | Q6_K | `d = ±scale·f`; the int8 sub-scales stay random (negative ones included) | 128·32·scale |
 * | Q4_K, Q5_K | `d = scale·f`, `dmin = c·d` (c = 7.5, 15.5) and each min code `m = sc + δ`, δ in −2..1 (clamped to 0..63), so sub-blocks are nearly centred: w ≈ d·sc·(q − c) | 65·c·scale |
 * | F32, F16, BF16 | values ≈ normal with std `scale` (sum of 4 uniform bytes, |w| <= 3.46·scale) | |
 *
 * Since patches are computed from each block's own random bytes, a stream filled in chunks whose byte
 * lengths are multiples of 8 is identical to one filled in one call, whatever the buffers' alignment.
 * @module
 */

import { f16ToF32, f32ToBf16, f32ToF16 } from "./f16.ts";
import { type GgmlTypeName, typeInfo } from "./types.ts";

/** Bytes per chunk when `dst` is not 4-byte aligned (filled through an aligned scratch buffer). */
const SCRATCH_BYTES = 1 << 16;

/** True on little-endian hosts, where a Uint16Array view reads the LE f16 fields directly. */
const LITTLE_ENDIAN = new Uint8Array(new Uint16Array([1]).buffer)[0] === 1;

/** Standard deviation of the sum of 4 independent uniform bytes: sqrt(4·(256² − 1)/12). */
const SUM4_STD = Math.sqrt((4 * (256 * 256 - 1)) / 12);

/** Centre code offset c of the K-quant mins (dmin = c·d): half of the largest code. */
const K_CENTRE = { Q4_K: 7.5, Q5_K: 15.5 } as const;

/** A fast xorshift128 random stream (Marsaglia 2003); not cryptographic. */
export class RandomState {
  #x: number;
  #y: number;
  #z: number;
  #w: number;

  /** Starts a stream from `seed` (any 32-bit integer), expanded to the 128-bit state by SplitMix32 steps. */
  constructor(seed: number) {
    let s = seed >>> 0;
    const next = (): number => {
      s = (s + 0x9e3779b9) | 0;
      let z = s;
      z = Math.imul(z ^ (z >>> 16), 0x85ebca6b);
      z = Math.imul(z ^ (z >>> 13), 0xc2b2ae35);
      return z ^ (z >>> 16);
    };
    this.#x = next();
    this.#y = next();
    this.#z = next();
    this.#w = next() | 1; // never the all-zero state
  }

  /** Next uniform u32. */
  nextU32(): number {
    const t = this.#x ^ (this.#x << 11);
    this.#x = this.#y;
    this.#y = this.#z;
    this.#z = this.#w;
    this.#w = this.#w ^ (this.#w >>> 19) ^ t ^ (t >>> 8);
    return this.#w >>> 0;
  }

  /**
   * Fills `words[from..to)` with the next u32s of the stream: the hot loop, with the state in locals. For
   * speed each xorshift step yields two words, the new state word `w` and `mix(w) ^ previous w` (a
   * multiply-xorshift of `w`), plus one plain step for an odd last word.
   */
  fillWords(words: Uint32Array, from = 0, to = words.length): void {
    // An Int32Array view stores the int32 results without a conversion per element.
    const a = new Int32Array(words.buffer, words.byteOffset + 4 * from, to - from);
    const n = a.length;
    let x = this.#x, y = this.#y, z = this.#z, w = this.#w;
    let i = 0;
    for (; i + 1 < n; i += 2) {
      const t = x ^ (x << 11);
      x = y;
      y = z;
      z = w;
      w = w ^ (w >>> 19) ^ t ^ (t >>> 8);
      a[i] = w;
      a[i + 1] = Math.imul(w ^ (w >>> 15), 0x2c1b3c6d) ^ z;
    }
    if (i < n) {
      const t = x ^ (x << 11);
      x = y;
      y = z;
      z = w;
      w = w ^ (w >>> 19) ^ t ^ (t >>> 8);
      a[i] = w;
    }
    this.#x = x;
    this.#y = y;
    this.#z = z;
    this.#w = w;
  }
}

/**
 * `nBlocks` random blocks of `type` whose element magnitudes are about `scale` (see the module table; for
 * plain float types, `nBlocks` elements of std `scale`).
 * @throws {RangeError} on a negative or fractional `nBlocks`, or a `scale` that f16 cannot hold
 * @example
 * ```ts
 * const w = randomBlocks("IQ4_XS", 16, { scale: 2e-5, seed: 1 }); // 16·136 bytes
 * ```
 */
export function randomBlocks(
  type: GgmlTypeName,
  nBlocks: number,
  opts: { scale: number; seed: number },
): Uint8Array {
  if (!Number.isInteger(nBlocks) || nBlocks < 0) {
    throw new RangeError(`${type}: block count must be a non-negative integer, got ${nBlocks}`);
  }
  const out = new Uint8Array(nBlocks * typeInfo(type).blockBytes);
  fillRandomBlocks(type, out, { scale: opts.scale, state: new RandomState(opts.seed) });
  return out;
}

/**
 * Fills `dst` (whole blocks of `type`) with random blocks as {@linkcode randomBlocks} does, continuing
 * the stream in `opts.state`: for chunked streaming writes.
 * @throws {RangeError} when `dst` is not a whole number of blocks or `scale` is not usable
 */
export function fillRandomBlocks(
  type: GgmlTypeName,
  dst: Uint8Array,
  opts: { scale: number; state: RandomState },
): void {
  const info = typeInfo(type);
  if (dst.length % info.blockBytes !== 0) {
    throw new RangeError(
      `${type}: random fill of ${dst.length} bytes is not a whole number of ${info.blockBytes}-byte blocks`,
    );
  }
  const { scale, state } = opts;
  if (!(scale > 0) || !Number.isFinite(scale)) {
    throw new RangeError(`${type}: random block scale must be a positive finite number, got ${scale}`);
  }
  switch (type) {
    case "F32":
    case "F16":
    case "BF16":
      fillFloats(type, dst, scale, state);
      return;
    default:
      break;
  }
  fillBytes(dst, state);
  switch (type) {
    case "Q8_0":
      patchD(dst, 34, 0, scaleTable(type, scale, 1));
      return;
    case "Q4_0":
    case "IQ4_NL":
      patchD(dst, 18, 0, scaleTable(type, scale, 1));
      return;
    case "IQ4_XS":
      patchD(dst, 136, 0, scaleTable(type, scale, 1));
      return;
    case "Q6_K":
      patchD(dst, 210, 208, scaleTable(type, scale, 1));
      return;
    case "Q4_K":
    case "Q5_K":
      patchK(type, dst, scaleTable(type, scale, 1), scaleTable(type, scale, K_CENTRE[type]));
      return;
    default: {
      const never: never = type;
      throw new TypeError(`Unsupported ggml type ${String(never)}`);
    }
  }
}

/** f16 bit patterns of `mul·scale·(0.5 + 0.5·k/255)`, k = 0..255 (positive; callers add the sign). */
function scaleTable(type: GgmlTypeName, scale: number, mul: number): Uint16Array {
  const t = new Uint16Array(256);
  for (let k = 0; k < 256; k++) t[k] = f32ToF16(mul * scale * (0.5 + (0.5 * k) / 255));
  const lo = f16ToF32(t[0]!);
  const hi = f16ToF32(t[255]!);
  if (lo === 0 || !Number.isFinite(hi)) {
    throw new RangeError(
      `${type}: random block scale ${scale} gives f16 scale fields from ${lo} to ${hi}: ` +
        `use a scale between about 1.2e-7 and ${(65504 / mul).toPrecision(5)}`,
    );
  }
  return t;
}

/** Sets the f16 `d` at byte `at` of every `bs`-byte block from its own random low byte and sign bit. */
function patchD(dst: Uint8Array, bs: number, at: number, table: Uint16Array): void {
  if (LITTLE_ENDIAN && (dst.byteOffset & 1) === 0) {
    // Block sizes and `at` are even, so every d is one aligned little-endian u16: one load, one store.
    const h = new Uint16Array(dst.buffer, dst.byteOffset, dst.length >> 1);
    const step = bs >> 1;
    for (let i = at >> 1; i < h.length; i += step) {
      const v = h[i]!;
      h[i] = table[v & 0xff]! | (v & 0x8000);
    }
    return;
  }
  for (let o = at; o < dst.length; o += bs) {
    const bits = table[dst[o]!]! | ((dst[o + 1]! & 0x80) << 8);
    dst[o] = bits;
    dst[o + 1] = bits >> 8;
  }
}

/** Q4_K/Q5_K: positive d and dmin = c·d from one random byte; mins set near the scales (see module doc). */
function patchK(
  type: "Q4_K" | "Q5_K",
  dst: Uint8Array,
  dTable: Uint16Array,
  dminTable: Uint16Array,
): void {
  const bs = typeInfo(type).blockBytes;
  for (let o = 0; o < dst.length; o += bs) {
    const k = dst[o]!;
    dst[o] = dTable[k]!;
    dst[o + 1] = dTable[k]! >> 8;
    dst[o + 2] = dminTable[k]!;
    dst[o + 3] = dminTable[k]! >> 8;
    // Random scale codes sc[j] are the low 6 bits of bytes 4..7 (j < 4) and low 4 bits of bytes 12..15 plus
    // the top 2 bits of bytes 4..7 (j >= 4); each min code becomes sc + δ with δ from its own random bits.
    const s = o + 4;
    for (let j = 0; j < 4; j++) {
      const scLo = dst[s + j]! & 63;
      const scHi = (dst[s + j + 8]! & 0xf) | ((dst[s + j]! >> 6) << 4);
      const mLo = clamp63(scLo + (dst[s + j + 4]! & 3) - 2);
      const mHi = clamp63(scHi + ((dst[s + j + 8]! >> 4) & 3) - 2);
      dst[s + j + 4] = mLo | ((mHi >> 4) << 6);
      dst[s + j + 8] = (scHi & 0xf) | ((mHi & 0xf) << 4);
    }
  }
}

function clamp63(v: number): number {
  return v < 0 ? 0 : v > 63 ? 63 : v;
}

/**
 * Fills `dst` with the next words of the stream, in order, for any alignment: whole words from
 * `fillWords`, then one more word for a 1..3-byte tail.
 */
function fillBytes(dst: Uint8Array, state: RandomState): void {
  const nWords = dst.length >> 2;
  if ((dst.byteOffset & 3) === 0) {
    state.fillWords(new Uint32Array(dst.buffer, dst.byteOffset, nWords));
    const rest = dst.length & 3;
    if (rest > 0) {
      const w = state.nextU32();
      for (let i = 0; i < rest; i++) dst[4 * nWords + i] = w >>> (8 * i);
    }
    return;
  }
  const scratch = new Uint32Array(SCRATCH_BYTES >> 2);
  const scratchBytes = new Uint8Array(scratch.buffer);
  for (let pos = 0; pos < dst.length; pos += SCRATCH_BYTES) {
    const n = Math.min(SCRATCH_BYTES, dst.length - pos);
    state.fillWords(scratch, 0, n >> 2);
    if ((n & 3) !== 0) scratch[n >> 2] = state.nextU32();
    dst.set(scratchBytes.subarray(0, n), pos);
  }
}

/**
 * Normal-ish floats of std `scale`: (sum of a word's 4 bytes − 510) / SUM4_STD · scale, rounded to f32 and
 * then to the element type. The sum takes only 1021 values, so their encodings come from a table.
 */
function fillFloats(type: "F32" | "F16" | "BF16", dst: Uint8Array, scale: number, state: RandomState): void {
  const k = scale / SUM4_STD;
  const values = new Float32Array(1021);
  for (let v = 0; v < 1021; v++) values[v] = (v - 510) * k;
  const table = type === "F32" ? values : new Uint16Array(1021);
  if (table instanceof Uint16Array) {
    for (let v = 0; v < 1021; v++) table[v] = type === "F16" ? f32ToF16(values[v]!) : f32ToBf16(values[v]!);
  }
  const eb = type === "F32" ? 4 : 2;
  const n = dst.length / eb;
  const words = new Uint32Array(Math.min(n, SCRATCH_BYTES));
  const out = type === "F32" ? new Float32Array(words.length) : new Uint16Array(words.length);
  const outBytes = new Uint8Array(out.buffer);
  for (let pos = 0; pos < n; pos += words.length) {
    const m = Math.min(words.length, n - pos);
    state.fillWords(words, 0, m);
    for (let i = 0; i < m; i++) {
      const w = words[i]!;
      out[i] = table[(w & 255) + ((w >>> 8) & 255) + ((w >>> 16) & 255) + (w >>> 24)]!;
    }
    dst.set(outBytes.subarray(0, eb * m), eb * pos);
  }
}
