/**
 * Test helpers of the weight-reading kernels (private; tests only): random weights of a type, the float64
 * reference product with its magnitude, and the comparison rule.
 * @module
 */
import { dequantize } from "../engine/quant/dequant.ts";
import { randomBlocks } from "../engine/quant/random.ts";
import { type GgmlTypeName, typeInfo } from "../engine/quant/types.ts";
import type { Rng } from "../tests/util/rng.ts";

/**
 * Relative tolerance of an f32-accumulated dot product, relative to Σ_k |W[n][k]·x[k]| (not to |y|): the
 * f32 rounding error of a sum of K products is bounded by about K·2⁻²⁴·Σ|terms| in the worst case and grows
 * like √K·2⁻²⁴ in practice, ≈ 2e-6 for K = 4096; 1e-4 leaves room for the kernel's summation order (chunk
 * partials, the s·Σq·x − m·Σx split) while a wrong weight (one element off by a quant step) is far larger.
 */
export const DOT_RTOL = 1e-4;
/** Absolute floor for dot products whose terms are all tiny. */
export const DOT_ATOL = 1e-30;

/** `n` random rows of `k` elements of `type` (valid scale fields; magnitudes about `scale`). */
export function randomWeights(rng: Rng, type: GgmlTypeName, k: number, n: number, scale = 0.02): Uint8Array {
  const info = typeInfo(type);
  return randomBlocks(type, (k * n) / info.blockElems, { scale, seed: rng.u32() });
}

/**
 * Float64 reference `y[b][r] = Σ_k W[r][k]·x[b][k]` and `mag[b][r] = Σ_k |W[r][k]·x[b][k]|`, both ne=[n, cols].
 * @param x ne=[k, cols]
 */
export function refProduct(
  type: GgmlTypeName,
  bytes: Uint8Array,
  opts: { k: number; n: number; cols: number; x: Float32Array },
): { ref: Float64Array; mag: Float64Array } {
  const { k, n, cols, x } = opts;
  const w = dequantize(type, bytes, k * n);
  const ref = new Float64Array(n * cols);
  const mag = new Float64Array(n * cols);
  for (let b = 0; b < cols; b++) {
    for (let r = 0; r < n; r++) {
      let s = 0;
      let m = 0;
      for (let i = 0; i < k; i++) {
        const p = w[r * k + i]! * x[b * k + i]!;
        s += p;
        m += Math.abs(p);
      }
      ref[b * n + r] = s;
      mag[b * n + r] = m;
    }
  }
  return { ref, mag };
}

/**
 * Throws unless every `got[i]` is finite and `|got[i] − ref[i]| ≤ DOT_ATOL + DOT_RTOL·mag[i]`; the message
 * names the case, seed, first bad index, got, ref, max error and bad count.
 */
export function assertDotClose(
  got: ArrayLike<number>,
  ref: Float64Array,
  mag: Float64Array,
  ctx: { what: string; seed: number },
): void {
  let bad = 0;
  let first = -1;
  let maxRel = 0;
  for (let i = 0; i < ref.length; i++) {
    const g = got[i]!;
    const err = Math.abs(g - ref[i]!);
    const lim = DOT_ATOL + DOT_RTOL * mag[i]!;
    if (!Number.isFinite(g) || !(err <= lim)) {
      bad++;
      if (first < 0) first = i;
    }
    if (Number.isFinite(err) && mag[i]! > 0) maxRel = Math.max(maxRel, err / mag[i]!);
  }
  if (bad > 0) {
    throw new Error(
      `${ctx.what} (seed ${ctx.seed}): ${bad}/${ref.length} outputs out of tolerance (rtol ${DOT_RTOL} of ` +
        `Σ|w·x|); first at [${first}]: got ${got[first]} ref ${ref[first]} (Σ|w·x| ${mag[first]}); ` +
        `max finite error / Σ|w·x| ${maxRel.toExponential(2)}`,
    );
  }
}
