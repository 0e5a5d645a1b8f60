/**
 * The gated DeltaNet block (spec §8): after the architecture's input projections, the conv + gated delta
 * rule step per token on the slot's conv ring and recurrent state (or the chunked form for prefill), the
 * gated norm, and the output projection into the residual stream.
 * @module
 */
import type { Binding } from "../../wgsl/kernel.ts";
import {
  BATCH_TABLE_WORDS,
  type BuildContext,
  column,
  GraphBuilder,
  type LayerWeights,
  MATVEC_MAX_COLS,
  padWords,
  part0,
  sub,
} from "../graph/builder.ts";
import type { GpuTensor } from "../gpu/weights.ts";
import { assert } from "../errors.ts";
import { columnProjections, outProj, outProjQ8, q8Given, type Q8Target } from "./linear.ts";
import {
  checkGdnStep,
  GDN_STEP,
  GDN_STEP_BINDINGS,
  gdnDims,
  type GdnStepBindings,
  type GdnStepConstants,
  gdnStepGrid,
  gdnStepNeedsNorm,
} from "../../wgsl/gdn_step.ts";
import {
  GDN_CHUNK_NORM,
  GDN_CHUNK_NORM_BINDINGS,
  gdnChunkDispatches,
  gdnNormConstants,
} from "../../wgsl/gdn_chunk.ts";
import {
  checkGdnConvRing,
  GDN_CONV_RING,
  GDN_CONV_RING_BINDINGS,
  GDN_CONV_RING_TAP,
  GDN_CONV_RING_TAP_BINDINGS,
  type GdnConvRingConstants,
  gdnConvRingGrid,
} from "../../wgsl/gdn_conv_ring.ts";

/**
 * Where a DeltaNet layer's input projections left their outputs for the step: the conv input (q, k, v
 * channels), the output gate z, and the b and a logits (`aOff`: a's word offset inside the `a` binding).
 */
export interface DeltaNetInputs {
  readonly xQkv: Binding;
  readonly z: Binding;
  readonly b: Binding;
  readonly a: Binding;
  readonly aOff: number;
  /**
   * A batched step or a short chunk ({@linkcode batchedInputs}): column (slot or token) c of each binding at
   * word c·colStride from its offset (each column one [qkv | z | b | a] output of the in-projections; a
   * multiple of 64 words).
   */
  readonly colStride?: number;
}

/**
 * A batched step's DeltaNet input projections `ws` of layer l, whose rows form [qkv | z | b | a] in order
 * (`names` label the ones run alone): every column's outputs in one column of `inproj` ({@linkcode
 * columnProjections}), columns padded to 256-byte offsets, which gdn_step reads at that stride. `aOff`: a's
 * word past b (N_V when b and a are separate tensors, 0 for qwen3next's grouped ba). `split`: where a first
 * tensor that runs alone is cut in two mat-vecs, as the one-token step cuts qwen3next's legacy ssm_in (qkv | z).
 */
export async function batchedInputs(
  g: GraphBuilder,
  cx: BuildContext,
  l: number,
  ws: readonly GpuTensor[],
  names: readonly string[],
  c: GdnStepConstants,
  opts: { joined?: GpuTensor; aOff: number; split?: number },
): Promise<DeltaNetInputs> {
  const A = cx.act;
  const d = gdnDims(c);
  const baAt = d.convCh + d.inner;
  const stride = padWords(baAt + 2 * c.N_V);
  const at = await columnProjections(g, l, "in_proj", ws, names, A.a!, A.inproj!, stride, opts);
  assert(at === baAt + 2 * c.N_V, `L${l}: the in-projections' rows make one [qkv | z | b | a] column`);
  const n = g.n;
  return {
    xQkv: sub(A.inproj!, 0, n * stride),
    z: sub(A.inproj!, d.convCh, n * stride - d.convCh),
    b: sub(A.inproj!, baAt, n * stride - baAt),
    a: sub(A.inproj!, baAt, n * stride - baAt),
    aOff: opts.aOff,
    colStride: stride,
  };
}

/** An architecture's DeltaNet input projections of layer l (its file owns the tensor layout). */
export type DeltaNetInputsOf = (
  g: GraphBuilder,
  cx: BuildContext,
  l: number,
  lw: LayerWeights,
  c0: GdnStepConstants,
) => Promise<DeltaNetInputs>;

/**
 * The gated DeltaNet block of layer l: the architecture's input projections (`inputs`), then per token the
 * causal conv, the gated delta rule on the slot's recurrent state and the gated norm (the chunked form for
 * prefill chunks over 8 tokens), the conv ring update, and the output projection.
 */
export async function deltaNet(
  g: GraphBuilder,
  cx: BuildContext,
  l: number,
  lw: LayerWeights,
  inputs: DeltaNetInputsOf,
) {
  const n = g.n;
  const A = cx.act;
  const c0 = cx.gdn(lw.layout);
  const d = gdnDims(c0);
  // The input projections differ per architecture (packed rows, legacy row order): its own file runs them.
  const inp = await inputs(g, cx, l, lw, c0);
  const { xQkv, z, b, a, aOff } = inp;
  // A short chunk's fused in-projections: one [qkv | z | b | a] output per token, colStride words apart.
  const tCol = cx.batch ? 0 : inp.colStride ?? 0;
  // A batched step's SPLIT may differ from the solo step's (StageOptions.gdnBatchedSplit, always > 1: the
  // same sums, the gated norm after it).
  const split = cx.batch ? g.opts.gdnBatchedSplit ?? c0.SPLIT : c0.SPLIT;
  const c: GdnStepConstants = { ...c0, A_OFF: aOff, T_COL: tCol, SPLIT: split };
  // Where the gated norm runs as a dispatch of its own, it also writes ssm_out's int8 x (QX) when ssm_out
  // would round it in a quantize_q8 of its own (a batched step, a short chunk).
  const ssmOutQ8 = () =>
    gdnStepNeedsNorm(c) ? outProjQ8(g, `L${l}.ssm_out`, lw.t("ssm_out"), A.y!) : undefined;
  if (cx.batch) {
    const stride = inp.colStride;
    assert(stride !== undefined, `L${l}: a batched step's in-projections come from batchedInputs`);
    await batchedStep(g, cx, l, lw, c, inp, stride);
    // A split step leaves o in y: one gated norm over every column (column t of y at t·N_V·D_V, the layout
    // gdn_chunk_norm reads for n tokens, and of z at t·Z_COL; each (head, column) alone, so the bits equal
    // per-slot norms).
    const nCol = cx.batch.slots.length;
    const qx = ssmOutQ8();
    await gdnStepNorm(
      g,
      `L${l}.gdn_norm`,
      c,
      {
        params: g.storage(Uint32Array.of(0, nCol)),
        z,
        normW: part0(lw.t("ssm_norm")),
        y: sub(A.y!, 0, nCol * d.inner),
      },
      nCol,
      stride,
      qx,
    );
    if (qx) q8Given(g, A.y!, lw.t("ssm_out"), qx);
    await outProj(g, `L${l}.ssm_out`, lw.t("ssm_out"), A.y!, A.t!, A.h!);
    return;
  }
  const convRing = cx.states.binding(cx.slot, l, "conv");
  const state = cx.states.binding(cx.slot, l, "ssm");
  const bindings = {
    params: cx.pos,
    xQkv,
    z,
    b,
    a,
    convW: part0(lw.t("ssm_conv1d")),
    dtBias: part0(lw.t("ssm_dt")),
    ssmA: part0(lw.t("ssm_a")),
    normW: part0(lw.t("ssm_norm")),
    convRing,
    state,
    y: A.y!,
  };
  let qx: Q8Target | undefined;
  if (n > MATVEC_MAX_COLS) {
    assert(tCol === 0, `L${l}: a prefill chunk's in-projections are the matmul's, one binding each`);
    // Prefill: the chunked (WY) form, parallel within each 64-token block (spec §8.6); equal to the
    // recurrence up to f32 rounding. Short pieces keep the exact recurrence.
    // A cut in the chunk's params (writeChunkPos) writes the state after it to the layer's taps: the scan's
    // state here, the conv ring's in a dispatch of its own before the ring's update below.
    const scratch = { wsQkw: A.gdnQkw!, wsUp: A.gdnUp! };
    const tap = cx.states.tap(l, "ssm");
    const compactSolve = g.opts.gdnCompactSolve;
    for (const dd of gdnChunkDispatches(c, { bindings, scratch, maxTokens: n, tap, compactSolve })) {
      await g.push(`L${l}.${dd.spec.name}`, dd.spec, dd.constants, dd.bindings, dd.grid);
    }
  } else {
    checkGdnStep(c, { bindings, maxTokens: n });
    await g.push(
      `L${l}.gdn_step`,
      GDN_STEP,
      c,
      GDN_STEP_BINDINGS.map((k) => bindings[k]),
      gdnStepGrid(c),
    );
    qx = ssmOutQ8();
    await gdnStepNorm(g, `L${l}.gdn_norm`, c, bindings, n, tCol || undefined, qx);
  }
  if (n > 1) {
    const rc: GdnConvRingConstants = { CONV_CH: d.convCh, K_CONV: c.K_CONV, T_COL: tCol };
    const rb = { params: cx.pos, xQkv, convRing };
    if (n > MATVEC_MAX_COLS) {
      const tb = { ...rb, tap: cx.states.tap(l, "conv") };
      checkGdnConvRing(rc, { bindings: tb, maxTokens: n, tap: true });
      await g.push(
        `L${l}.gdn_conv_ring_tap`,
        GDN_CONV_RING_TAP,
        rc,
        GDN_CONV_RING_TAP_BINDINGS.map((k) => tb[k]),
        gdnConvRingGrid(rc),
      );
    }
    checkGdnConvRing(rc, { bindings: rb, maxTokens: n });
    await g.push(
      `L${l}.gdn_conv_ring`,
      GDN_CONV_RING,
      rc,
      GDN_CONV_RING_BINDINGS.map((k) => rb[k]),
      gdnConvRingGrid(rc),
    );
  }
  // The conv ring's dispatch between the norm and ssm_out does not touch y.
  if (qx) q8Given(g, A.y!, lw.t("ssm_out"), qx);
  await outProj(g, `L${l}.ssm_out`, lw.t("ssm_out"), A.y!, A.t!, A.h!);
}

/**
 * gdn_step of a batched decode step: one dispatch over every column (grid z), each on its slot's conv ring
 * and state in the layer's pools (slot and position from the column table); one dispatch per slot where a
 * state is not pooled. Either way a column runs the solo step's code, so its bits are the solo step's.
 */
async function batchedStep(
  g: GraphBuilder,
  cx: BuildContext,
  l: number,
  lw: LayerWeights,
  c: GdnStepConstants,
  inp: DeltaNetInputs,
  stride: number,
) {
  const A = cx.act;
  const batch = cx.batch!;
  const d = gdnDims(c);
  const nBa = c.BA_GROUPED ? 2 * c.N_V : c.N_V;
  const nCol = batch.slots.length;
  const weights = {
    convW: part0(lw.t("ssm_conv1d")),
    dtBias: part0(lw.t("ssm_dt")),
    ssmA: part0(lw.t("ssm_a")),
    normW: part0(lw.t("ssm_norm")),
  };
  const ring = cx.states.pool(l, "conv");
  const ssm = cx.states.pool(l, "ssm");
  if (ring && ssm) {
    const cc: GdnStepConstants = {
      ...c,
      P_COL: BATCH_TABLE_WORDS,
      X_COL: stride,
      Z_COL: stride,
      BA_COL: stride,
      RING_COL: ring.strideBytes / 4,
      STATE_COL: ssm.strideBytes / 4,
    };
    const slots = cx.states.nSlots;
    const bindings = {
      params: batch.table,
      xQkv: inp.xQkv,
      z: inp.z,
      b: inp.b,
      a: inp.a,
      ...weights,
      convRing: ring.buffer,
      state: ssm.buffer,
      y: sub(A.y!, 0, nCol * d.inner),
    };
    checkGdnStep(cc, { bindings, maxTokens: 1, cols: nCol, slots });
    await g.push(
      `L${l}.gdn_step`,
      GDN_STEP,
      cc,
      GDN_STEP_BINDINGS.map((k) => bindings[k]),
      gdnStepGrid(cc, nCol),
    );
    return;
  }
  for (const [col, slot] of batch.slots.entries()) {
    const bindings = {
      params: batch.pos[col]!,
      xQkv: column(inp.xQkv, col, stride, d.convCh),
      z: column(inp.z, col, stride, d.inner),
      b: column(inp.b, col, stride, nBa + c.A_OFF),
      a: column(inp.a, col, stride, nBa + c.A_OFF),
      ...weights,
      convRing: cx.states.binding(slot, l, "conv"),
      state: cx.states.binding(slot, l, "ssm"),
      y: sub(A.y!, col * d.inner, d.inner),
    };
    checkGdnStep(c, { bindings, maxTokens: 1 });
    await g.push(
      `L${l}.gdn_step.${col}`,
      GDN_STEP,
      c,
      GDN_STEP_BINDINGS.map((k) => bindings[k]),
      gdnStepGrid(c),
    );
  }
}

/**
 * After a split `gdn_step` (SPLIT > 1, y holds o): the gated norm of its n tokens (or a batched step's n
 * columns, z's `zCol` words apart) in place (spec §8.7); with `qx` also rounded to int8 there
 * ({@linkcode outProjQ8}).
 */
export async function gdnStepNorm(
  g: GraphBuilder,
  label: string,
  c: GdnStepConstants,
  b: Pick<GdnStepBindings, "params" | "z" | "normW" | "y">,
  n: number,
  zCol?: number,
  qx?: Q8Target,
) {
  if (!gdnStepNeedsNorm(c)) return;
  const all = { ...b, xq: qx?.binding ?? g.scratch() };
  await g.push(
    label,
    GDN_CHUNK_NORM,
    gdnNormConstants(c, zCol, qx),
    GDN_CHUNK_NORM_BINDINGS.map((k) => all[k]),
    [c.N_V, n, 1],
  );
}
