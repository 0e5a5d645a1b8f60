/**
 * IEEE 754 binary16 conversions for hidden rows sent as f16 (docs/WIRE.md "Hidden rows"): f32 → f16 rounds
 * to nearest, ties to even, overflows to ±Inf, keeps NaN a NaN; f16 → f32 is exact.
 * @module
 */

const F32 = new Float32Array(1);
const U32 = new Uint32Array(F32.buffer);

/** The binary16 bits nearest to `x` (as f32 first), ties to even. */
export function f32ToF16Bits(x: number): number {
  F32[0] = x;
  const bits = U32[0]!;
  const sign = (bits >>> 16) & 0x8000;
  const exp = (bits >>> 23) & 0xff;
  const mant = bits & 0x7fffff;
  if (exp === 0xff) return sign | 0x7c00 | (mant !== 0 ? 0x200 : 0);
  // Unbiased exponent; f16 normals cover [-14, 15].
  const e = exp - 127;
  if (e > 15) return sign | 0x7c00;
  if (e >= -14) {
    // Normal: keep 10 of 23 mantissa bits, round on the 13 dropped.
    let h = ((e + 15) << 10) | (mant >>> 13);
    const rest = mant & 0x1fff;
    if (rest > 0x1000 || (rest === 0x1000 && (h & 1) === 1)) h++; // a carry into the exponent is correct
    return sign | h;
  }
  if (e < -25) return sign; // below half the smallest subnormal: ±0
  // Subnormal: value = m × 2^-24 with the implicit bit made explicit.
  const full = mant | 0x800000;
  const shift = -e - 1; // 14..24 bits dropped from the 24-bit significand
  let h = full >>> shift;
  const rest = full & ((1 << shift) - 1);
  const half = 1 << (shift - 1);
  if (rest > half || (rest === half && (h & 1) === 1)) h++;
  return sign | h;
}

/** The f32 value of binary16 bits `h` (exact). */
export function f16BitsToF32(h: number): number {
  const sign = h & 0x8000 ? -1 : 1;
  const exp = (h >>> 10) & 0x1f;
  const mant = h & 0x3ff;
  if (exp === 0) return sign * mant * 2 ** -24;
  if (exp === 0x1f) return mant === 0 ? sign * Infinity : NaN;
  return sign * (1 + mant / 1024) * 2 ** (exp - 15);
}
