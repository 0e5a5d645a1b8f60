/**
 * IEEE-754 binary16 (f16) and bfloat16 (bf16) <-> f32 conversions on raw 16-bit patterns (spec `quants.md`
 * "F16", "BF16"). Encoders round to nearest, ties to even, like ggml's `GGML_FP32_TO_FP16` and
 * `ggml_compute_fp32_to_bf16`.
 * @module
 */

const F32 = new Float32Array(1);
const U32 = new Uint32Array(F32.buffer);

/**
 * Decodes an f16 bit pattern (low 16 bits of `bits`) to its exact value.
 * @example
 * ```ts
 * f16ToF32(0x3c00); // 1
 * f16ToF32(0x0001); // 2^-24, the smallest subnormal
 * ```
 */
export function f16ToF32(bits: number): number {
  const sign = bits & 0x8000 ? -1 : 1;
  const e = (bits >>> 10) & 0x1f;
  const m = bits & 0x3ff;
  if (e === 0) return sign * m * 2 ** -24;
  if (e === 31) return m === 0 ? sign * Infinity : NaN;
  return sign * (1024 + m) * 2 ** (e - 25);
}

/**
 * Encodes `x` as an f16 bit pattern: `x` is first rounded to f32 (ggml's input type), then to f16 with
 * round-to-nearest-even; subnormals are produced, overflow gives ±inf, NaN gives a quiet NaN (0x7e00 with
 * the sign of `x`).
 */
export function f32ToF16(x: number): number {
  F32[0] = x;
  const u = U32[0]!;
  const sign = (u >>> 16) & 0x8000;
  const e32 = (u >>> 23) & 0xff;
  const m32 = u & 0x7fffff;
  if (e32 === 0xff) return sign | (m32 === 0 ? 0x7c00 : 0x7e00);
  // Unbiased exponent of x; f16 normals cover -14..15, subnormals step 2^-24.
  const e = e32 - 127;
  if (e >= 16) return sign | 0x7c00;
  if (e >= -14) {
    // Normal: keep 10 of 23 mantissa bits, round the 13 dropped ones; a carry may bump the exponent
    // (up to inf), which the integer addition handles.
    const base = ((e + 15) << 10) | (m32 >>> 13);
    const rest = m32 & 0x1fff;
    const up = rest > 0x1000 || (rest === 0x1000 && (base & 1) === 1) ? 1 : 0;
    return sign | (base + up);
  }
  if (e < -25) return sign; // below half the smallest subnormal (also f32 zeros and subnormals)
  // Subnormal: value = (1.m32) * 2^e = q * 2^-24 with q = full significand >> shift.
  const sig = m32 | 0x800000;
  const shift = -e - 1; // 14..24 for e = -15..-25
  const q = sig >>> shift;
  const rest = sig & ((1 << shift) - 1);
  const half = 1 << (shift - 1);
  const up = rest > half || (rest === half && (q & 1) === 1) ? 1 : 0;
  return sign | (q + up);
}

/** Decodes a bf16 bit pattern (low 16 bits of `bits`): the f32 whose upper half is `bits`. */
export function bf16ToF32(bits: number): number {
  U32[0] = (bits & 0xffff) << 16;
  return F32[0]!;
}

/**
 * Encodes `x` as a bf16 bit pattern: `x` is first rounded to f32, then its upper 16 bits are kept with
 * round-to-nearest-even (overflow gives ±inf); NaN stays NaN (quiet bit set), like ggml.
 */
export function f32ToBf16(x: number): number {
  F32[0] = x;
  const u = U32[0]!;
  if ((u & 0x7fffffff) > 0x7f800000) return ((u >>> 16) | 0x40) & 0xffff;
  return ((u + 0x7fff + ((u >>> 16) & 1)) >>> 16) & 0xffff;
}
