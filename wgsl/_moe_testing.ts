/**
 * Test helpers of the expert mat-vec kernels (private; tests only): the float64 reference of a pass.
 * @module
 */
import { dequantize } from "../engine/quant/dequant.ts";
import { typeInfo } from "../engine/quant/types.ts";
import type { MoeMatvecShape } from "./moe_matvec.ts";
import { DOT_ATOL, DOT_RTOL } from "./_quant_testing.ts";

/**
 * Float64 reference of an expert pass (moe_matvec's column rule: routed columns by `ids`, shared columns
 * after them) on x columns ne=[K, ·], and a tolerance per element: DOT_RTOL on each dot product's Σ|terms|,
 * carried through silu and the product for gate·up.
 */
export function moeReference(
  c: { shape: MoeMatvecShape; ids: ArrayLike<number>; w: Uint8Array; x: ArrayLike<number> },
): { ref: Float64Array; tol: Float64Array } {
  const { type, k, n, nExpert, xDiv, gateUp } = c.shape;
  const shared = c.shape.sharedCols ?? 0;
  const nCols = c.shape.nCols + shared;
  const nMats = nExpert + (shared > 0 ? 1 : 0);
  const rb = (k / typeInfo(type).blockElems) * typeInfo(type).blockBytes;
  const mat = (off: number) => dequantize(type, c.w.subarray(off, off + rb * n * nMats), k * n * nMats);
  const g = mat(c.shape.offGateBytes);
  const u = gateUp ? mat(c.shape.offUpBytes!) : undefined;
  const ref = new Float64Array(n * nCols);
  const tol = new Float64Array(n * nCols);
  for (let col = 0; col < nCols; col++) {
    const routed = col < c.shape.nCols;
    const e = routed ? c.ids[col]! : nExpert;
    const xc = routed ? Math.floor(col / xDiv) : gateUp ? col - c.shape.nCols : col;
    for (let r = 0; r < n; r++) {
      let sg = 0, mg = 0, su = 0, mu = 0;
      for (let i = 0; i < k; i++) {
        const xv = c.x[xc * k + i]!;
        sg += g[(e * n + r) * k + i]! * xv;
        mg += Math.abs(g[(e * n + r) * k + i]! * xv);
        if (u) {
          su += u[(e * n + r) * k + i]! * xv;
          mu += Math.abs(u[(e * n + r) * k + i]! * xv);
        }
      }
      if (u) {
        const sig = 1 / (1 + Math.exp(-sg));
        ref[col * n + r] = sg * sig * su;
        // DOT_RTOL on each dot, carried through silu (derivative ≤ 1.1) and the product.
        tol[col * n + r] = DOT_RTOL * (1.1 * mg * Math.abs(su) + Math.abs(sg * sig) * mu) + DOT_ATOL;
      } else {
        ref[col * n + r] = sg;
        tol[col * n + r] = DOT_RTOL * mg + DOT_ATOL;
      }
    }
  }
  return { ref, tol };
}
