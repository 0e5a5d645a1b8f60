/**
 * Elementwise comparison of kernel output against a float64 reference (STYLE.md "Testing a kernel").
 * @module
 */

/** Tolerances: an element passes when `|got - ref| <= atol + rtol * |ref|`. */
export interface Tolerance {
  /** Absolute part. */
  readonly atol: number;
  /** Relative part. */
  readonly rtol: number;
}

/**
 * Throws with variant, shape, seed, first bad index, got/ref, max error and bad count when any element of
 * `got` is NaN/Inf or outside tolerance of `ref`.
 */
export function assertClose(
  got: ArrayLike<number>,
  ref: ArrayLike<number>,
  tol: Tolerance,
  ctx: { what: string; seed: number },
): void {
  if (got.length !== ref.length) {
    throw new Error(`${ctx.what} (seed ${ctx.seed}): length ${got.length} but reference has ${ref.length}`);
  }
  let bad = 0;
  let first = -1;
  let maxErr = 0;
  for (let i = 0; i < ref.length; i++) {
    const g = got[i]!;
    const r = ref[i]!;
    const err = Math.abs(g - r);
    if (!Number.isFinite(g) || !(err <= tol.atol + tol.rtol * Math.abs(r))) {
      bad++;
      if (first < 0) first = i;
    }
    if (Number.isFinite(err) && err > maxErr) maxErr = err;
  }
  if (bad > 0) {
    throw new Error(
      `${ctx.what} (seed ${ctx.seed}): ${bad}/${ref.length} elements out of tolerance ` +
        `(atol ${tol.atol}, rtol ${tol.rtol}); first at [${first}]: got ${got[first]} ref ${ref[first]}; ` +
        `max finite error ${maxErr}`,
    );
  }
}

/** Throws when a guard band of u32 words does not still hold the poison pattern. */
export function assertPoisoned(words: Uint32Array, poison: number, what: string): void {
  for (let i = 0; i < words.length; i++) {
    if (words[i] !== poison >>> 0) {
      throw new Error(
        `${what}: guard word ${i} past the output end was overwritten (0x${words[i]!.toString(16)})`,
      );
    }
  }
}
