/**
 * Host twin of `attn_combine.wgsl`: merges the split partials `attn_decode` used at the step's position and
 * applies the sigmoid output gate (spec §7 steps 6-7) for one query token.
 * @module
 */
import { bindGroup, type Binding, type KernelSpec } from "./kernel.ts";
import { ATTN_PARAMS_WORDS } from "./attn_params.ts";
import { checkBinding, checkInt, checkShape, isPow2 } from "./_twin.ts";

/**
 * Constants of `attn_combine.wgsl`: query heads, headDim, split count, tile and shortest split (N_SPLIT,
 * TILE and PER_MIN as in attn_decode, which set the splits it used), workgroup size, dims per workgroup.
 */
export type AttnCombineConstants = {
  readonly H_Q: number;
  readonly D_H: number;
  readonly N_SPLIT: number;
  readonly TILE: number;
  readonly PER_MIN: number;
  readonly WG: number;
  readonly CD: number;
  /** Words between columns of qf: 2·D_H·H_Q (packed by token), or a fused in-projection's column stride. */
  readonly QF_COL: number;
  /** Also round o to int8 per 32 dims into xq (a workgroup per chunk; the same bits of o). */
  readonly QX: boolean;
  /** The byte order of xq (`q8Layout` of the weights reading it; 0 without QX). */
  readonly LAYOUT: number;
};

/** The constants of a variant without the int8 output. */
export const ATTN_COMBINE_NO_QX = { QX: false, LAYOUT: 0 } as const;

/** Kernel spec of `attn_combine.wgsl`. */
export const ATTN_COMBINE: KernelSpec = {
  name: "attn_combine",
  url: new URL("./attn_combine.wgsl", import.meta.url),
  lib: ["q8pack"],
  constants: {
    H_Q: "u32",
    D_H: "u32",
    N_SPLIT: "u32",
    TILE: "u32",
    PER_MIN: "u32",
    WG: "u32",
    CD: "u32",
    QF_COL: "u32",
    QX: "bool",
    LAYOUT: "u32",
  },
};

/**
 * Binding order: params AttnParams (pos0 = the token's position); partO f32 ne=[D_H, H_Q, N_SPLIT];
 * partMl f32 ne=[2, H_Q, N_SPLIT]; qf f32 ne=[2*D_H, H_Q] (gates); o f32 ne=[D_H, H_Q]; per column when
 * there are several ({@linkcode attnCombineColumnWords}); xq (QX) quantize_q8's format for K = H_Q·D_H per
 * column.
 */
export const ATTN_COMBINE_BINDINGS = ["params", "partO", "partMl", "qf", "o", "xq"] as const;

/**
 * Buffers of one `attn_combine` dispatch, by binding name (xq without QX: any buffer of 4 bytes or more bound
 * nowhere else).
 */
export type AttnCombineBuffers = Readonly<Record<(typeof ATTN_COMBINE_BINDINGS)[number], Binding>>;

/**
 * Checks constants against the kernel's limits.
 * @throws {RangeError} naming the offending value
 */
export function checkAttnCombine(c: AttnCombineConstants): void {
  checkInt("attn_combine: H_Q", c.H_Q, 1, 65535);
  checkInt("attn_combine: D_H", c.D_H, 1, 4096);
  checkInt("attn_combine: N_SPLIT", c.N_SPLIT, 1, 4096);
  checkInt("attn_combine: TILE", c.TILE, 1, 256);
  checkInt("attn_combine: PER_MIN", c.PER_MIN, 1, 2 ** 24);
  checkShape(isPow2(c.WG) && c.WG <= 256, `attn_combine: WG must be a power of two <= 256, got ${c.WG}`);
  checkShape(
    isPow2(c.CD) && c.CD <= c.WG,
    `attn_combine: CD (${c.CD}) must be a power of two <= WG (${c.WG})`,
  );
  checkShape(
    Number.isInteger(c.QF_COL) && c.QF_COL >= 2 * c.D_H * c.H_Q,
    `attn_combine: QF_COL (${c.QF_COL}) must be at least one column of qf (2·D_H·H_Q = ${2 * c.D_H * c.H_Q})`,
  );
  checkInt("attn_combine: LAYOUT", c.LAYOUT, 0, 1);
  checkShape(
    !c.QX || (32 % c.CD === 0 && c.D_H % 32 === 0),
    `attn_combine: QX rounds 32-dim chunks: CD (${c.CD}) must divide 32 and 32 divide D_H (${c.D_H})`,
  );
}

/**
 * The bind group of one dispatch, after checking every buffer against its `ne`: one column, or `cols` columns
 * laid out as {@linkcode attnCombineColumnWords} says (params: a batched step's column table).
 * @throws {RangeError} when a constant is out of range or a buffer too small
 */
export function attnCombineBindGroup(
  device: GPUDevice,
  opts: {
    pipeline: GPUComputePipeline;
    constants: AttnCombineConstants;
    buffers: AttnCombineBuffers;
    cols?: number;
  },
): GPUBindGroup {
  const { constants: c, buffers: b } = opts;
  const cols = opts.cols ?? 1;
  checkAttnCombine(c);
  checkInt("attn_combine: cols", cols, 1, 65535);
  const k = "attn_combine";
  const w = attnCombineColumnWords(c);
  checkBinding(k, "params", b.params, [
    cols > 1 ? (cols - 1) * w.params + ATTN_PARAMS_WORDS : ATTN_PARAMS_WORDS,
  ]);
  // One column: the shapes as such; several: the words up to the last column's end.
  const many = (
    words: number,
    ne: number[],
  ) => (cols > 1 ? [(cols - 1) * words + ne.reduce((a, x) => a * x)] : ne);
  checkBinding(k, "partO", b.partO, many(w.partO, [c.D_H, c.H_Q, c.N_SPLIT]));
  checkBinding(k, "partMl", b.partMl, many(w.partMl, [2, c.H_Q, c.N_SPLIT]));
  checkBinding(k, "qf", b.qf, [(cols - 1) * c.QF_COL + 2 * c.D_H * c.H_Q]);
  checkBinding(k, "o", b.o, [c.D_H, c.H_Q, cols]);
  const K = c.H_Q * c.D_H;
  checkBinding(k, "xq", b.xq, c.QX ? [cols * (K / 4 + K / 32)] : [1]);
  return bindGroup(device, opts.pipeline, ATTN_COMBINE_BINDINGS.map((name) => b[name]));
}

/**
 * Dispatch grid: query heads by dim slices (ceil(D_H / CD), or with QX one per 32 dims) by `cols` columns
 * (default 1).
 */
export function attnCombineGrid(c: AttnCombineConstants, cols = 1): [number, number, number] {
  return [c.H_Q, c.QX ? c.D_H / 32 : Math.ceil(c.D_H / c.CD), cols];
}

/**
 * Words between columns of a dispatch over several (a batched step): `params` in the column table (64, 256
 * bytes), `partO` and `partMl` in the partials, each column's padded to 256 bytes; qf and o hold the columns
 * as tokens.
 */
export function attnCombineColumnWords(
  c: AttnCombineConstants,
): { readonly params: number; readonly partO: number; readonly partMl: number } {
  const pad = (w: number) => Math.ceil(w / 64) * 64;
  return { params: 64, partO: pad(c.D_H * c.H_Q * c.N_SPLIT), partMl: pad(2 * c.H_Q * c.N_SPLIT) };
}

/**
 * Records one `attn_combine` dispatch of `cols` columns (default 1) into `pass` (the bind group was checked
 * when it was built).
 */
export function encodeAttnCombine(
  pass: GPUComputePassEncoder,
  opts: {
    pipeline: GPUComputePipeline;
    bindGroup: GPUBindGroup;
    constants: AttnCombineConstants;
    cols?: number;
  },
): void {
  pass.setPipeline(opts.pipeline);
  pass.setBindGroup(0, opts.bindGroup);
  pass.dispatchWorkgroups(...attnCombineGrid(opts.constants, opts.cols));
}
