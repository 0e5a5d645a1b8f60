/**
 * Reference quantizers for every supported ggml type: turn real values into block bytes for test data and
 * small synthetic models. They follow ggml's reference quantization in spirit (scale choice per block, then
 * the nearest code for the stored scale), not bit for bit. Every element gets the code whose decoded value
 * (with the scales as stored, f16 rounding included) is nearest to it.
 * @module
 */

import { KVALUES_IQ4NL } from "./dequant.ts";
import { f16ToF32, f32ToBf16, f32ToF16 } from "./f16.ts";
import { type GgmlTypeName, typeInfo } from "./types.ts";

const fr = Math.fround;

/** Candidate offsets tried around the max-maps-to-end-of-codebook scale (ggml's `ntry = 7`). */
const IQ4_NTRY = 7;

/**
 * Quantizes `values` (ne=[n], n a whole number of blocks) to `type` block bytes.
 * @throws {RangeError} when `values.length` is not a whole number of blocks, a quantized type gets a
 *   non-finite value, a block's scale overflows f16, or a finite value overflows F16/BF16
 * @example
 * ```ts
 * const bytes = quantize("Q8_0", new Float32Array(64).fill(1)); // 2 blocks, 68 bytes
 * ```
 */
export function quantize(type: GgmlTypeName, values: Float32Array): Uint8Array {
  const info = typeInfo(type);
  if (values.length % info.blockElems !== 0) {
    throw new RangeError(
      `${type}: ${values.length} values is not a whole number of blocks of ${info.blockElems} elements`,
    );
  }
  const nBlocks = values.length / info.blockElems;
  const out = new Uint8Array(nBlocks * info.blockBytes);
  switch (type) {
    case "F32":
      out.set(new Uint8Array(values.buffer, values.byteOffset, values.byteLength));
      return out;
    case "F16":
    case "BF16":
      for (let i = 0; i < values.length; i++) {
        const bits = type === "F16" ? f32ToF16(values[i]!) : f32ToBf16(values[i]!);
        // Inf and NaN inputs are kept; a finite value that rounds to inf is an error, not a silent inf.
        if ((bits & 0x7fff) === (type === "F16" ? 0x7c00 : 0x7f80) && Number.isFinite(values[i]!)) {
          throw new RangeError(
            `${type}: value ${values[i]} at index ${i} overflows ${type}: scale the values down`,
          );
        }
        putU16(out, 2 * i, bits);
      }
      return out;
    default:
      break;
  }
  for (let i = 0; i < values.length; i++) {
    if (!Number.isFinite(values[i]!)) {
      throw new RangeError(`${type}: value ${values[i]} at index ${i} is not finite and cannot be quantized`);
    }
  }
  for (let b = 0; b < nBlocks; b++) {
    const x = values.subarray(b * info.blockElems, (b + 1) * info.blockElems);
    const o = b * info.blockBytes;
    switch (type) {
      case "Q8_0":
        quantQ8_0(x, out, o);
        break;
      case "Q4_0":
        quantQ4_0(x, out, o);
        break;
      case "IQ4_NL":
        quantIq4Nl(x, out, o);
        break;
      case "IQ4_XS":
        quantIq4Xs(x, out, o);
        break;
      case "Q4_K":
      case "Q5_K":
        quantQ45K(type, x, out, o);
        break;
      case "Q6_K":
        quantQ6K(x, out, o);
        break;
      default: {
        const never: never = type;
        throw new TypeError(`Unsupported ggml type ${String(never)}`);
      }
    }
  }
  return out;
}

/** Q8_0: d = amax/127, q = round(x/d) with the f16-rounded d. */
function quantQ8_0(x: Float32Array, out: Uint8Array, o: number): void {
  const d = f16Scale("Q8_0", absMax(x) / 127);
  putU16(out, o, d.bits);
  for (let j = 0; j < 32; j++) {
    const q = d.value === 0 ? 0 : clamp(roundAway(x[j]! / d.value), -128, 127);
    out[o + 2 + j] = q & 0xff;
  }
}

/** Q4_0: d = max/-8 (max = the element of largest magnitude, signed), so it decodes exactly to code 0. */
function quantQ4_0(x: Float32Array, out: Uint8Array, o: number): void {
  const d = f16Scale("Q4_0", signedMax(x) / -8);
  putU16(out, o, d.bits);
  for (let j = 0; j < 16; j++) {
    const lo = d.value === 0 ? 8 : clamp(Math.floor(x[j]! / d.value + 8.5), 0, 15);
    const hi = d.value === 0 ? 8 : clamp(Math.floor(x[j + 16]! / d.value + 8.5), 0, 15);
    out[o + 2 + j] = lo | (hi << 4);
  }
}

/** IQ4_NL: one f16 scale chosen by a small search (see {@linkcode fitIq4}), then nearest codebook entries. */
function quantIq4Nl(x: Float32Array, out: Uint8Array, o: number): void {
  const d = f16Scale("IQ4_NL", fitIq4(x, (v) => f16ToF32(f32ToF16(v))));
  putU16(out, o, d.bits);
  for (let j = 0; j < 16; j++) {
    out[o + 2 + j] = nearestIq4(x[j]!, d.value) | (nearestIq4(x[j + 16]!, d.value) << 4);
  }
}

/**
 * IQ4_XS: each 32-element sub-block gets its best real scale (as IQ4_NL); the super-block d maps the
 * largest of them to the 6-bit code -32 and the others round to d·(ls-32); codes are then picked for the
 * stored sub-scales.
 */
function quantIq4Xs(x: Float32Array, out: Uint8Array, o: number): void {
  const s = new Float64Array(8);
  for (let ib = 0; ib < 8; ib++) s[ib] = fitIq4(x.subarray(32 * ib, 32 * ib + 32), (v) => v);
  const d = f16Scale("IQ4_XS", signedMax(s) / -32);
  putU16(out, o, d.bits);
  let scalesH = 0;
  for (let ib = 0; ib < 8; ib++) {
    const l = d.value === 0 ? 0 : clamp(Math.round(s[ib]! / d.value), -32, 31);
    const ls = l + 32;
    scalesH |= (ls >> 4) << (2 * ib);
    out[o + 4 + (ib >> 1)]! |= (ls & 0xf) << (4 * (ib & 1));
    const dl = fr(d.value * l);
    for (let j = 0; j < 16; j++) {
      const lo = nearestIq4(x[32 * ib + j]!, dl);
      const hi = nearestIq4(x[32 * ib + 16 + j]!, dl);
      out[o + 8 + 16 * ib + j] = lo | (hi << 4);
    }
  }
  putU16(out, o + 2, scalesH);
}

/**
 * Q4_K / Q5_K: each 32-element sub-block gets an affine fit x ≈ s·q − m (m ≥ 0, the range always includes
 * 0 as in ggml), refined once by least squares; d and dmin map the largest s and m to the 6-bit code 63.
 */
function quantQ45K(type: "Q4_K" | "Q5_K", x: Float32Array, out: Uint8Array, o: number): void {
  const nmax = type === "Q5_K" ? 31 : 15;
  const s = new Float64Array(8);
  const m = new Float64Array(8);
  for (let j = 0; j < 8; j++) {
    const fit = fitAffine(x.subarray(32 * j, 32 * j + 32), nmax);
    s[j] = fit.scale;
    m[j] = fit.min;
  }
  const d = f16Scale(type, Math.max(...s) / 63);
  const dmin = f16Scale(type, Math.max(...m) / 63);
  putU16(out, o, d.bits);
  putU16(out, o + 2, dmin.bits);
  const sc = new Uint8Array(8);
  const mc = new Uint8Array(8);
  for (let j = 0; j < 8; j++) {
    sc[j] = d.value === 0 ? 0 : clamp(Math.round(s[j]! / d.value), 0, 63);
    mc[j] = dmin.value === 0 ? 0 : clamp(Math.round(m[j]! / dmin.value), 0, 63);
  }
  packScaleMinK4(sc, mc, out, o + 4);
  const qh = o + 16;
  const qs = o + (type === "Q5_K" ? 48 : 16);
  for (let j = 0; j < 8; j++) {
    const d1 = fr(d.value * sc[j]!);
    const m1 = fr(dmin.value * mc[j]!);
    for (let l = 0; l < 32; l++) {
      const q = d1 === 0 ? 0 : clamp(Math.round((x[32 * j + l]! + m1) / d1), 0, nmax);
      // Sub-block j = 2c + h lives in chunk c: low nibbles for h = 0, high nibbles for h = 1.
      const c = j >> 1;
      const h = j & 1;
      out[qs + 32 * c + l]! |= (q & 0xf) << (4 * h);
      if (q & 16) out[qh + l]! |= 1 << j;
    }
  }
}

/**
 * Q6_K: each 16-element sub-block gets a signed scale (largest element to the code -32, or the opposite
 * end if that fits better); d maps the largest to the int8 scale -128 and the rest round to int8.
 */
function quantQ6K(x: Float32Array, out: Uint8Array, o: number): void {
  const s = new Float64Array(16);
  for (let k = 0; k < 16; k++) s[k] = fitQ6(x.subarray(16 * k, 16 * k + 16));
  const d = f16Scale("Q6_K", signedMax(s) / -128);
  putU16(out, o + 208, d.bits);
  for (let k = 0; k < 16; k++) {
    const l = d.value === 0 ? 0 : clamp(Math.round(s[k]! / d.value), -128, 127);
    out[o + 192 + k] = l & 0xff;
    const dl = fr(d.value * l);
    for (let i = 0; i < 16; i++) {
      const e = 16 * k + i;
      const q = (dl === 0 ? 0 : clamp(Math.round(x[e]! / dl), -32, 31)) + 32;
      // Element e = 128n + 32g + l: g selects (ql + 0 | ql + 32) and (low | high nibble), qh bits 2g.
      const n = e >> 7;
      const g = (e >> 5) & 3;
      const l32 = e & 31;
      out[o + 64 * n + l32 + 32 * (g & 1)]! |= (q & 0xf) << (4 * (g >> 1));
      out[o + 128 + 32 * n + l32]! |= (q >> 4) << (2 * g);
    }
  }
}

/**
 * Best real scale for IQ4 codebook fitting of `x`, as ggml searches: candidates map the largest element
 * near either end of the codebook (ids (t − 127)/max and (t + 113)/max, |t| <= 7), each refit by least
 * squares and ranked by that fit's error Σx² − (Σqx)²/Σq² (i.e. the largest (Σqx)²/Σq²). The winner and
 * d0 = max/−127 are then passed through `round` (f16 for a stored scale) and scored by the squared error
 * of nearest-code decoding; d0 wins ties, so the result is never worse than d0.
 */
function fitIq4(x: Float32Array, round: (d: number) => number): number {
  const max = signedMax(x);
  if (max === 0) return 0;
  let bestD = 0;
  let bestScore = -1;
  for (const end of [-127, 113]) {
    for (let t = -IQ4_NTRY; t <= IQ4_NTRY; t++) {
      const id = (end + t) / max;
      let sumQx = 0;
      let sumQ2 = 0;
      for (let j = 0; j < x.length; j++) {
        const q = KVALUES_IQ4NL[nearestIq4(x[j]! * id, 1)]!;
        sumQx += q * x[j]!;
        sumQ2 += q * q;
      }
      if (sumQ2 > 0 && (sumQx * sumQx) / sumQ2 > bestScore) {
        bestScore = (sumQx * sumQx) / sumQ2;
        bestD = sumQx / sumQ2;
      }
    }
  }
  const d0 = round(max / -127);
  const d1 = round(bestD);
  return sseIq4(x, d1) < sseIq4(x, d0) ? d1 : d0;
}

function sseIq4(x: Float32Array, d: number): number {
  let err = 0;
  for (let j = 0; j < x.length; j++) {
    const e = x[j]! - fr(d * KVALUES_IQ4NL[nearestIq4(x[j]!, d)]!);
    err += e * e;
  }
  return err;
}

/** Midpoints between consecutive codebook entries, for the nearest-entry search. */
const IQ4_MID: readonly number[] = KVALUES_IQ4NL.slice(1).map((v, i) => (v + KVALUES_IQ4NL[i]!) / 2);

/**
 * Nearest codebook index for v = x/d in half-unit buckets [h/2, (h+1)/2), h = floor(2v) in −231..202:
 * every midpoint is a multiple of 1/2, so no bucket straddles one (a v exactly on a midpoint, an exact tie,
 * goes to the upper entry). Outside (−115.5, 101] the answer is index 0 or 15.
 */
const IQ4_LUT: Uint8Array = (() => {
  const lut = new Uint8Array(434);
  for (let h = -231; h <= 202; h++) {
    const v = (h + 0.5) / 2;
    let k = 0;
    while (k < 15 && v > IQ4_MID[k]!) k++;
    lut[h + 231] = k;
  }
  return lut;
})();

/** Index of the codebook entry k minimizing |x − d·kvalues[k]| (index 8, value d·1, when d = 0). */
function nearestIq4(x: number, d: number): number {
  if (d === 0) return 8;
  const v = x / d;
  if (v <= -115.5) return 0;
  if (v > 101) return 15;
  return IQ4_LUT[Math.floor(2 * v) + 231]!;
}

/** Affine fit x ≈ scale·q − min, q in 0..nmax, scale >= 0, min >= 0 (0 inside the range). */
function fitAffine(x: Float32Array, nmax: number): { scale: number; min: number } {
  let lo = 0;
  let hi = -Infinity;
  for (let j = 0; j < x.length; j++) {
    lo = Math.min(lo, x[j]!);
    hi = Math.max(hi, x[j]!);
  }
  if (hi <= lo) return { scale: 0, min: -lo };
  let scale = (hi - lo) / nmax;
  let min = -lo;
  let err = sseAffine(x, scale, min, nmax);
  // One least-squares refinement of (scale, min) for the codes of the min/max fit, kept only if better.
  let n = 0, sq = 0, sq2 = 0, sx = 0, sqx = 0;
  for (let j = 0; j < x.length; j++) {
    const q = clamp(Math.round((x[j]! + min) / scale), 0, nmax);
    n++;
    sq += q;
    sq2 += q * q;
    sx += x[j]!;
    sqx += q * x[j]!;
  }
  const det = n * sq2 - sq * sq;
  if (det > 0) {
    const a = (n * sqx - sq * sx) / det;
    const b = (sx - a * sq) / n;
    if (a > 0 && b <= 0) {
      const e2 = sseAffine(x, a, -b, nmax);
      if (e2 < err) {
        scale = a;
        min = -b;
        err = e2;
      }
    }
  }
  return { scale, min };
}

function sseAffine(x: Float32Array, scale: number, min: number, nmax: number): number {
  let err = 0;
  for (let j = 0; j < x.length; j++) {
    const q = clamp(Math.round((x[j]! + min) / scale), 0, nmax);
    const e = x[j]! - (scale * q - min);
    err += e * e;
  }
  return err;
}

/** Signed scale for Q6_K codes −32..31: the largest element maps to −32, or to +31 if that fits better. */
function fitQ6(x: Float32Array): number {
  const max = signedMax(x);
  if (max === 0) return 0;
  const a = max / -32;
  const b = max / 31;
  return sseQ6(x, b) < sseQ6(x, a) ? b : a;
}

function sseQ6(x: Float32Array, s: number): number {
  let err = 0;
  for (let j = 0; j < x.length; j++) {
    const e = x[j]! - s * clamp(Math.round(x[j]! / s), -32, 31);
    err += e * e;
  }
  return err;
}

/** Inverse of `get_scale_min_k4` (spec `quants.md` "K-quant scale/min packing"). */
function packScaleMinK4(sc: Uint8Array, m: Uint8Array, out: Uint8Array, o: number): void {
  for (let j = 0; j < 4; j++) {
    out[o + j] = sc[j]! | ((sc[j + 4]! >> 4) << 6);
    out[o + j + 4] = m[j]! | ((m[j + 4]! >> 4) << 6);
    out[o + j + 8] = (sc[j + 4]! & 0xf) | ((m[j + 4]! & 0xf) << 4);
  }
}

/** Rounds a scale to f16 and checks it stays finite. */
function f16Scale(type: GgmlTypeName, v: number): { bits: number; value: number } {
  const bits = f32ToF16(v);
  const value = f16ToF32(bits);
  if (!Number.isFinite(value)) {
    throw new RangeError(`${type}: block scale ${v} overflows f16 (max 65504): scale the values down`);
  }
  return { bits, value };
}

function absMax(x: ArrayLike<number>): number {
  let a = 0;
  for (let j = 0; j < x.length; j++) a = Math.max(a, Math.abs(x[j]!));
  return a;
}

/** The element of largest magnitude, with its sign (the first one on ties). */
function signedMax(x: ArrayLike<number>): number {
  let m = 0;
  for (let j = 0; j < x.length; j++) if (Math.abs(x[j]!) > Math.abs(m)) m = x[j]!;
  return m;
}

function roundAway(v: number): number {
  return Math.sign(v) * Math.round(Math.abs(v));
}

function clamp(v: number, lo: number, hi: number): number {
  return v < lo ? lo : v > hi ? hi : v;
}

function putU16(out: Uint8Array, o: number, v: number): void {
  out[o] = v & 0xff;
  out[o + 1] = (v >> 8) & 0xff;
}
