/**
 * Norms: the RMSNorm before each block (deferred into the next mat-vec's prologue at decode), the residual
 * add that carries the next norm in the same dispatch, and the MoE combine of mat-vec columns that also
 * rounds the next norm to int8 (combine_q8).
 * @module
 */
import type { Binding } from "../../wgsl/kernel.ts";
import type { GpuTensor } from "../gpu/weights.ts";
import { type FusedNorm, GraphBuilder, part0 } from "../graph/builder.ts";
import { RESIDUAL_ADD, type ResidualAddConstants, residualAddGrid } from "../../wgsl/residual_add.ts";
import { MATVEC_Q8B_MAX_BATCH } from "../../wgsl/matvec_q8b.ts";
import {
  checkCombineQ8,
  COMBINE_Q8,
  COMBINE_Q8_BINDINGS,
  type CombineQ8Bindings,
  type CombineQ8Constants,
  combineQ8Grid,
  combineQ8Params,
  combineQ8WorkgroupBytes,
} from "../../wgsl/combine_q8.ts";
import { q8xBytes } from "../../wgsl/matvec_q8.ts";

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
  if (g.n === 1 || int8Columns(g)) g.pending = { label, x, w, y };
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

/**
 * Whether the graph's columns take int8 x through quantize_q8 over the columns (int8Activations, 2 to 16
 * columns: a batched step, a short chunk): a deferred norm then rides on that quantize.
 */
export function int8Columns(g: GraphBuilder): boolean {
  return g.opts.int8Activations && g.n >= 2 && g.n <= Math.min(g.maxCols, MATVEC_Q8B_MAX_BATCH);
}

/** The next block's norm that a MoE combine of int8 columns writes and rounds (see {@linkcode combineNormQ8}). */
export interface NextNormQ8 extends FusedNorm {
  /** The norm's label (`L5.attn_norm`, `output_norm`): the int8 log's entries of the rounded rows. */
  readonly label: string;
}

/**
 * Whether the MoE combines of this graph round the next norm to int8 (combine_q8): int8 columns whose residual
 * adds do not norm (fewer rows than combineNormMinRows), a row of whole int8 chunks, and room for the row in
 * workgroup memory.
 */
export function combinesQ8(g: GraphBuilder): boolean {
  const c: CombineQ8Constants = { D: g.hp.nEmbd, N_TERMS: g.hp.nExpertUsed, EPS: g.hp.rmsEps };
  return int8Columns(g) && g.n < g.opts.combineNormMinRows && c.D % 32 === 0 &&
    combineQ8WorkgroupBytes(c) <= g.device.limits.maxComputeWorkgroupStorageSize;
}

/**
 * The MoE combine of int8 columns with the next block's norm (combine_q8): h += Σ w·e + sigmoid(g)·sh, y =
 * RMSNorm(h)·w, and y rounded to int8 in both byte orders, left as the int8 x of the next mat-vec reading y
 * (GraphBuilder.lastQ8 with `alt`), so the next in-projections (and attention's v, or the LM head) quantize
 * nothing themselves. Each value has the bits of the residual_add and quantize_q8 dispatches it replaces.
 */
export async function combineNormQ8(
  g: GraphBuilder,
  label: string,
  b: { e: Binding; weights: Binding; sh: Binding; g: Binding; gCol: number; h: GPUBuffer },
  next: NextNormQ8,
): Promise<void> {
  const cols = g.n;
  const k = g.hp.nEmbd;
  const c: CombineQ8Constants = { D: k, N_TERMS: g.hp.nExpertUsed, EPS: g.hp.rmsEps };
  // The two copies, byte order 0 then 1 (q8Layout of Q8_0 and IQ4_XS): logged (each under the norm's label)
  // or in a scratch buffer.
  const bytes = cols * q8xBytes(k);
  const logged = [g.logRegion(next.label, k, "Q8_0", cols), g.logRegion(next.label, k, "IQ4_XS", cols)];
  const stride = Math.ceil(bytes / 256) * 256;
  const buffer = logged[0]?.buffer ?? g.grown("int8 x (combine_q8)", stride + bytes);
  const at = logged[0] ? [logged[0].offset, logged[1]!.offset] : [0, stride];
  const alt = (at[1]! - at[0]!) / 4;
  const bind: CombineQ8Bindings = {
    params: g.storage(combineQ8Params(cols, b.gCol, alt)),
    e: b.e,
    weights: b.weights,
    sh: b.sh,
    g: b.g,
    h: b.h,
    nw: part0(next.w),
    y: next.y,
    xq: { buffer, offset: at[0], size: 4 * alt + bytes },
  };
  checkCombineQ8(c, bind, cols, b.gCol, alt);
  await g.push(label, COMBINE_Q8, c, COMBINE_Q8_BINDINGS.map((n) => bind[n]), combineQ8Grid(cols));
  const copy = (i: number): Binding => ({ buffer, offset: at[i], size: bytes });
  g.lastQ8 = {
    x: next.y,
    k,
    layout: 0,
    cols,
    regions: [copy(0)],
    at: g.ops.length,
    alt: { layout: 1, region: copy(1) },
  };
}
