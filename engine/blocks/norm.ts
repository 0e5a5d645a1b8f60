/**
 * Norms: the RMSNorm before each block (deferred into the next mat-vec's prologue at decode) and the
 * residual add that carries the next norm in the same dispatch.
 * @module
 */
import type { GpuTensor } from "../gpu/weights.ts";
import { type FusedNorm, GraphBuilder, part0 } from "../graph/builder.ts";
import { RESIDUAL_ADD, type ResidualAddConstants, residualAddGrid } from "../../wgsl/residual_add.ts";
import { MATVEC_Q8B_MAX_BATCH } from "../../wgsl/matvec_q8b.ts";

/**
 * y = RMSNorm(x)·w, one row per token. Decode defers it: the next mat-vec that reads y computes it in its
 * prologue (matvec NORM) and writes y; any other kernel pushed first gets it as its own dispatch. Under
 * int8Activations the columns of a batched step (or a short chunk) defer it too: the int8 mat-vec that reads
 * y first takes it into its quantize_q8 over the columns (NORM).
 */
export async function norm(g: GraphBuilder, label: string, x: GPUBuffer, w: GpuTensor, y: GPUBuffer) {
  await g.flushNorm();
  // A deferred norm writes y later without an op now: no int8 x quantized before it may be reused.
  g.lastQ8 = undefined;
  const int8Cols = g.opts.int8Activations && g.n <= Math.min(g.maxCols, MATVEC_Q8B_MAX_BATCH);
  if (g.n === 1 || int8Cols) g.pending = { label, x, w, y };
  else await g.rmsNorm(label, x, w, y, g.n);
}

/** h += t, and with `norm` y = RMSNorm(h)·w in the same dispatch. */
export async function residual(
  g: GraphBuilder,
  label: string,
  t: GPUBuffer,
  h: GPUBuffer,
  fused?: FusedNorm,
) {
  const norm = fused;
  const c: ResidualAddConstants = {
    D: g.hp.nEmbd,
    N_TERMS: 1,
    WEIGHTED: false,
    SHARED: false,
    ...normConstants(g, norm),
  };
  const params = g.storage(Uint32Array.of(g.n, 0));
  await g.push(label, RESIDUAL_ADD, c, [
    params,
    t,
    t,
    t,
    t,
    h,
    norm ? part0(norm.w) : t,
    norm?.y ?? g.scratch(),
  ], residualAddGrid(c, g.n));
}

/** The NORM and EPS constants of residual_add for an optional fused norm. */
export function normConstants(g: GraphBuilder, norm: FusedNorm | undefined): { NORM: boolean; EPS: number } {
  return norm ? { NORM: true, EPS: g.hp.rmsEps } : { NORM: false, EPS: 0 };
}
