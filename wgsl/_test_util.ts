/**
 * Test helpers shared by the kernel tests in this folder (private): output checks with guard bands and
 * small float64 references for ops that `tests/ref/ops.ts` does not cover.
 * @module
 */
import { assertClose, assertPoisoned, type Tolerance } from "../tests/util/close.ts";
import { GUARD_WORDS, POISON_F32 } from "../tests/util/gpu.ts";

/**
 * Checks the first `ref.length` f32 values of `buf` (starting at word `offsetWords`) against `ref`, and that
 * the `GUARD_WORDS` words after them are still poisoned when `guard` is set.
 */
export function checkF32(
  buf: ArrayBuffer,
  ref: ArrayLike<number>,
  tol: Tolerance,
  ctx: { what: string; seed: number; offsetWords?: number; guard?: boolean },
): void {
  const off = ctx.offsetWords ?? 0;
  const got = new Float32Array(buf, off * 4, ref.length);
  assertClose(got, ref, tol, ctx);
  if (ctx.guard ?? true) {
    assertPoisoned(
      new Uint32Array(buf, (off + ref.length) * 4, GUARD_WORDS),
      POISON_F32,
      `${ctx.what} (seed ${ctx.seed})`,
    );
  }
}

/** Rounds every element to f32 (what the kernel reads) and returns it as a Float32Array. */
export function f32(values: ArrayLike<number>): Float32Array {
  return Float32Array.from(values);
}

/**
 * Like `assertClose`, with a per-element allowance: element i passes when
 * `|got[i] - ref[i]| <= atol + rtol * |ref[i]| + extra[i]`. Prints seed, first bad index and the count.
 */
export function assertCloseEach(
  got: ArrayLike<number>,
  ref: ArrayLike<number>,
  extra: ArrayLike<number>,
  tol: Tolerance,
  ctx: { what: string; seed: number },
): void {
  let bad = 0;
  let first = -1;
  for (let i = 0; i < ref.length; i++) {
    const g = got[i]!;
    const r = ref[i]!;
    if (!Number.isFinite(g) || !(Math.abs(g - r) <= tol.atol + tol.rtol * Math.abs(r) + extra[i]!)) {
      bad++;
      if (first < 0) first = i;
    }
  }
  if (bad > 0) {
    throw new Error(
      `${ctx.what} (seed ${ctx.seed}): ${bad}/${ref.length} elements out of tolerance; first at [${first}]: ` +
        `got ${got[first]} ref ${ref[first]} allowed ${
          tol.atol + tol.rtol * Math.abs(ref[first]!) + extra[first]!
        }`,
    );
  }
}

/**
 * Runs `check` on every case and then throws one error that lists every case that failed, so a run shows
 * the whole pattern of failures (one type, one tile, one shape) rather than the first.
 */
export function checkEach<T>(cases: readonly T[], check: (c: T, i: number) => void): void {
  const failures: string[] = [];
  cases.forEach((c, i) => {
    try {
      check(c, i);
    } catch (e) {
      failures.push((e as Error).message);
    }
  });
  if (failures.length > 0) {
    throw new Error(`${failures.length} of ${cases.length} cases failed:\n${failures.join("\n")}`);
  }
}
