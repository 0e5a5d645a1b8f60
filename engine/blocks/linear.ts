/**
 * Linear layers: the decode mat-vec (f32 x, or int8 x under int8Activations) with a deferred norm in its
 * prologue, the prefill matmul (split K for small N), packed projections run as one mat-vec, and the output
 * projection that adds into the residual stream.
 * @module
 */
import type { Binding } from "../../wgsl/kernel.ts";
import type { GpuTensor } from "../gpu/weights.ts";
import type { GgmlTypeName } from "../quant/types.ts";
import { assert } from "../errors.ts";
import { GraphBuilder, MATVEC_MAX_COLS, part0, type PendingNorm, typeName } from "../graph/builder.ts";
import {
  MATVEC,
  MATVEC_MAX_BATCH,
  matvecConstants,
  matvecGrid,
  matvecParams,
  type MatvecShape,
  normBindings,
} from "../../wgsl/matvec.ts";
import { MATMUL, MATMUL_SPLITS, matmulPlan, type MatmulShape } from "../../wgsl/matmul.ts";
import {
  checkMatvecQ8,
  checkMatvecQ8Fused,
  checkQuantizeQ8,
  MATVEC_Q8,
  MATVEC_Q8_FUSED,
  MATVEC_Q8_TYPES,
  type MatvecQ8Bindings,
  matvecQ8Constants,
  type MatvecQ8FusedBindings,
  matvecQ8FusedConstants,
  type MatvecQ8FusedShape,
  matvecQ8FusedWorkgroupBytes,
  matvecQ8Grid,
  matvecQ8Params,
  type MatvecQ8Shape,
  q8Layout,
  q8xBytes,
  QUANTIZE_Q8,
  type QuantizeQ8Bindings,
  quantizeQ8Constants,
  quantizeQ8Grid,
  quantizeQ8Params,
  type QuantizeQ8Shape,
} from "../../wgsl/matvec_q8.ts";
import {
  checkMatvecQ8b,
  MATVEC_Q8B,
  MATVEC_Q8B_MAX_BATCH,
  type MatvecQ8bBindings,
  matvecQ8bConstants,
  matvecQ8bGrid,
  matvecQ8bParams,
  type MatvecQ8bShape,
} from "../../wgsl/matvec_q8b.ts";

/** Options of {@linkcode matvec}. */
export interface MatvecOptions {
  rowStart?: number;
  rows?: number;
  acc?: boolean;
  yStride?: number;
  /** Word of y where column 0's rows start (mat-vecs only; default 0). */
  yAt?: number;
  f32?: boolean;
  /** How the mat-vec sums, where it must sum like another dispatch ({@linkcode soloSum}). */
  sum?: SoloSum;
  /**
   * Mat-vec columns reading a deferred norm's output (f32 x, one weight part): the columns as grid z,
   * each with the norm in its prologue, the one-token step's dispatch per column (its bits; no norm
   * dispatch of its own).
   */
  zNorm?: boolean;
  /**
   * The RMSNorm weight that x (the norm's input, not its output) is multiplied by, the norm's scale left to
   * the reader of y (matvec NORM 2, f32 x, mat-vec columns): the MoE router's form (engine/blocks/moe.ts).
   */
  weightNorm?: GpuTensor;
  /**
   * int8 x over 2 to 16 columns: quantize x in both byte orders, for a later mat-vec of the same x whose
   * weights read the other (attention's v after q and k).
   */
  q8Both?: boolean;
}

/** y[col][r] = W·x[col] for `cols` columns of x (stride K) into y (stride N), rows [rowStart, rowStart+rows). */
export async function matvec(
  g: GraphBuilder,
  label: string,
  w: GpuTensor,
  x: GPUBuffer,
  y: GPUBuffer,
  cols: number,
  opts: MatvecOptions = {},
) {
  if (
    g.opts.int8Activations && !opts.f32 && cols <= g.maxCols && MATVEC_Q8_TYPES.includes(typeName(w))
  ) {
    return await matvecQ8(g, label, w, x, y, cols, opts);
  }
  // A deferred norm whose output this mat-vec reads: computed in its prologue (every dispatch below),
  // unless the mat-vec is so tall that its workgroups re-summing the norm cost more than a dispatch.
  const allRows = opts.rows ?? (w.parts.reduce((s, p) => s + p.nRows, 0) - (opts.rowStart ?? 0));
  assert(
    opts.weightNorm === undefined || (opts.f32 === true && cols <= g.maxCols && !opts.acc),
    `${label}: a norm weight alone (NORM 2) is for f32 mat-vec columns`,
  );
  const zOk = opts.zNorm === true && cols >= 2 && cols <= g.maxCols && w.parts.length === 1 && !opts.acc;
  const norm = !opts.weightNorm && g.pending && g.pending.y === x && (cols === 1 || zOk) &&
      allRows <= g.opts.normPrologueMaxRows
    ? g.pending
    : undefined;
  // The columns in grid z, each a batch-1 dispatch's code with the norm in its prologue.
  const inZ = norm !== undefined && zOk;
  // A mat-vec that writes the deferred norm's input or output (or reads its output with several columns)
  // must come after it: push the norm first.
  if (!norm && g.pending && (y === g.pending.x || y === g.pending.y || x === g.pending.y)) {
    await g.flushNorm();
  }
  if (norm) {
    g.pending = undefined;
    label = `${label}+${norm.label.replace(/^L\d+\./, "")}`;
    x = norm.x;
  }
  const k = w.ne[0]!;
  let roundedFrom: GPUBuffer | undefined;
  if (
    g.opts.int8Activations && !opts.f32 && cols > g.maxCols && MATVEC_Q8_TYPES.includes(typeName(w))
  ) {
    // The rounded x of the matmul pushed last when it read the same x and nothing was pushed since
    // (attn_qkv, attn_gate, ssm_beta, ssm_alpha of a chunk), else rounded here. The values d·q do not
    // depend on the weight type (only the logged byte order does).
    const last = g.lastRound;
    const reuse = last !== undefined && last.from === x && last.k === k && last.cols === cols &&
      last.at === g.ops.length;
    roundedFrom = x;
    x = reuse ? last.out : await roundX(g, label, x, k, cols, typeName(w), "dense");
  }
  const rowStart = opts.rowStart ?? 0;
  const nRows = opts.rows ?? (w.parts.reduce((s, p) => s + p.nRows, 0) - rowStart);
  for (const p of w.parts) {
    const lo = Math.max(rowStart, p.firstRow);
    const hi = Math.min(rowStart + nRows, p.firstRow + p.nRows);
    if (lo >= hi) continue;
    if (cols > g.maxCols) {
      assert(
        opts.yStride === undefined && opts.yAt === undefined,
        `${label}: a padded column stride or a column start is for mat-vecs only`,
      );
      if (opts.acc || norm) {
        throw new Error(`${label}: NORM and ACC are decode-only (matvec), not for ${cols} columns`);
      }
      // Prefill: the register-tiled matmul reads each weight tile once per tile of tokens.
      const shape: MatmulShape = {
        type: typeName(w),
        k,
        n: hi - lo,
        m: cols,
        wOffsetBytes: p.offsetBytes + (lo - p.firstRow) * w.rowBytes,
        xStride: k,
        yOffset: lo - rowStart,
        yStride: nRows,
      };
      const plan = matmulPlan(shape, g.device.limits.maxComputeWorkgroupStorageSize);
      // Small N: runs of K in workgroups of their own into a scratch binding, added by matmul_splits.
      const part = plan.sum && g.splitPart(plan.sum.partBytes);
      await g.push(
        label,
        MATMUL,
        plan.constants,
        [g.storage(plan.params), p.buffer, x, part ?? y],
        plan.grid,
      );
      if (plan.sum) {
        await g.push(
          `${label}.splits`,
          MATMUL_SPLITS,
          {},
          [g.storage(plan.sum.params), part!, y],
          plan.sum.grid,
        );
      }
      continue;
    }
    for (let c0 = 0; c0 < cols; c0 += inZ ? cols : MATVEC_MAX_BATCH) {
      const batch = inZ ? 1 : Math.min(MATVEC_MAX_BATCH, cols - c0);
      const shape: MatvecShape = {
        type: typeName(w),
        k,
        n: hi - lo,
        batch,
        wOffsetBytes: p.offsetBytes + (lo - p.firstRow) * w.rowBytes,
        xOffset: c0 * k,
        xStride: k,
        yOffset: (opts.yAt ?? 0) + c0 * (opts.yStride ?? nRows) + (lo - rowStart),
        yStride: opts.yStride ?? nRows,
        ...(inZ ? { zCols: cols } : undefined),
      };
      const c = matvecConstants(shape, {
        norm: norm ? { eps: g.hp.rmsEps } : undefined,
        weightNorm: opts.weightNorm !== undefined,
        acc: opts.acc,
        ...(batch === 1 ? { team: g.opts.matvecTuning?.team, rows: g.opts.matvecTuning?.rows } : undefined),
        ...(opts.sum === undefined ? undefined : { team: opts.sum.team }),
      });
      const params = g.storage(matvecParams(shape));
      await g.push(label, MATVEC, c, [
        params,
        p.buffer,
        x,
        y,
        norm ? part0(norm.w) : opts.weightNorm ? part0(opts.weightNorm) : x,
        norm ? norm.y : g.scratch(),
      ], matvecGrid(shape, c));
    }
  }
  if (roundedFrom) g.lastRound = { from: roundedFrom, k, cols, out: x, at: g.ops.length };
}

/**
 * {@linkcode matvec} with int8 x (StageOptions.int8Activations): per column, matvec_q8_fused on the first part of W
 * (quantizing x in its prologue, with a deferred norm of x, whose normed rows it also writes for the block's
 * other readers; it leaves the int8 x in the graph's int8 buffer for K), then matvec_q8 on the other parts.
 * Where that part is taller than normPrologueMaxRows or the fused kernel's workgroup memory does not fit the
 * device, a quantize_q8 dispatch comes first and every part runs matvec_q8.
 */
export async function matvecQ8(
  g: GraphBuilder,
  label: string,
  w: GpuTensor,
  x: GPUBuffer,
  y: GPUBuffer,
  cols: number,
  opts: Omit<MatvecOptions, "f32" | "zNorm">,
) {
  const type = typeName(w);
  const k = w.ne[0]!;
  // 2 to 16 columns: one quantize_q8 over the columns and a matvec_q8b per part (matvecQ8Cols).
  const together = cols >= 2 && cols <= MATVEC_Q8B_MAX_BATCH && q8xBytes(k) % 16 === 0;
  const p = g.pending;
  const norm = p && p.y === x && (cols === 1 || together) ? p : undefined;
  if (norm) {
    g.pending = undefined;
    label = `${label}+${norm.label.replace(/^L\d+\./, "")}`;
  }
  const layout = q8Layout(type);
  const rowStart = opts.rowStart ?? 0;
  const nRows = opts.rows ?? (w.parts.reduce((s, q) => s + q.nRows, 0) - rowStart);
  // The int8 x of every column: quantized by the int8 mat-vec pushed last when it read the same x and
  // nothing was pushed since (attn_qkv, attn_gate, ssm_beta, ... of a chunk; unfused attn_q/k/v), else here.
  const last = g.lastQ8;
  const lastRegions = last?.layout === layout
    ? last.regions
    : last?.alt?.layout === layout
    ? [last.alt.region]
    : undefined;
  const reuse = !norm && last !== undefined && lastRegions !== undefined && last.x === x && last.k === k &&
    last.cols === cols && last.at === g.ops.length;
  const regions: Binding[] = reuse ? lastRegions! : [];
  const parts = w.parts.flatMap((part) => {
    const lo = Math.max(rowStart, part.firstRow);
    const hi = Math.min(rowStart + nRows, part.firstRow + part.nRows);
    return lo < hi ? [{ part, lo, hi }] : [];
  });
  const shapeOf = (col: number, { part, lo, hi }: (typeof parts)[number]): MatvecQ8Shape => ({
    type,
    k,
    n: hi - lo,
    wOffsetBytes: part.offsetBytes + (lo - part.firstRow) * w.rowBytes,
    yOffset: (opts.yAt ?? 0) + col * (opts.yStride ?? nRows) + (lo - rowStart),
  });
  if (together) {
    const mvs = parts.map((at) => ({ shape: shapeOf(0, at), weights: at.part.buffer }));
    const given = reuse ? regions[0]! : undefined;
    const a = { type, k, cols, x, y, acc: opts.acc, sum: opts.sum, norm, both: opts.q8Both };
    await matvecQ8Cols(g, label, a, given, mvs, opts.yStride ?? nRows);
    return;
  }
  // Each column's int8 x in a region of its own of the graph's buffer for K (or of the int8 log).
  const stride = q8Stride(k);
  const shared = reuse ? undefined : sharedXq(g, k);
  for (let col = 0; col < cols; col++) {
    let first = 0; // the parts before it took this column's x from a fused mat-vec
    if (!reuse) {
      const xq: Binding = g.logRegion(label, k, type, 1, col) ??
        { buffer: shared!, offset: col * stride, size: q8xBytes(k) };
      regions.push(xq);
      const xOffset = norm ? 0 : col * k;
      const normOpt = norm ? { eps: g.hp.rmsEps } : undefined;
      const xBind = norm ? norm.x : x;
      const [nw, xn] = normBindings(g.device, {
        x: xBind,
        nw: norm ? part0(norm.w) : undefined,
        xn: norm ? norm.y : undefined,
      });
      // The first part's mat-vec quantizes x in its prologue (matvec_q8_fused) and leaves the int8 x in the
      // region for the other parts and the mat-vecs after it. A quantize_q8 dispatch of its own does it
      // where the part is taller than normPrologueMaxRows (every workgroup repeats the prologue, which costs
      // more than a dispatch of its own on tall matrices: docs/PERF.md) or the fused kernel's workgroup memory
      // does not fit the device.
      const fs: MatvecQ8FusedShape | undefined = parts.length > 0
        ? { ...shapeOf(col, parts[0]!), xOffset, norm: normOpt }
        : undefined;
      const fc = fs && matvecQ8FusedConstants(fs, { acc: opts.acc, ...opts.sum });
      if (
        fs && fc && fs.n <= g.opts.normPrologueMaxRows &&
        matvecQ8FusedWorkgroupBytes(fc) <= g.device.limits.maxComputeWorkgroupStorageSize
      ) {
        const part = parts[0]!.part;
        const b: MatvecQ8FusedBindings = {
          params: g.storage(matvecQ8Params(fs)),
          weights: part.buffer,
          x: xBind,
          nw,
          xn,
          xo: xq,
          y,
        };
        checkMatvecQ8Fused(fs, fc, b);
        await g.push(label, MATVEC_Q8_FUSED, fc, [
          b.params,
          part.buffer,
          part.buffer,
          xBind,
          nw,
          xn,
          xq,
          y,
        ], [
          ...matvecQ8Grid(fs, fc),
          1,
        ]);
        first = 1;
      } else {
        const qs: QuantizeQ8Shape = { type, k, xOffset, norm: normOpt };
        const qb: QuantizeQ8Bindings = {
          params: g.storage(quantizeQ8Params(qs)),
          x: xBind,
          xq,
          nw,
          xn,
        };
        checkQuantizeQ8(qs, qb);
        // A deferred norm this quantize does not take is pushed first (GraphBuilder.checked), before anything reads x.
        await g.push(`${label}.q8`, QUANTIZE_Q8, quantizeQ8Constants(qs), [
          qb.params,
          xBind,
          xq,
          nw,
          xn,
        ], [
          ...quantizeQ8Grid(qs),
          1,
        ]);
      }
    }
    const xq = regions[col]!;
    for (const at of parts.slice(first)) {
      const shape = shapeOf(col, at);
      const c = matvecQ8Constants(shape, { acc: opts.acc, ...opts.sum });
      const b: MatvecQ8Bindings = {
        params: g.storage(matvecQ8Params(shape)),
        weights: at.part.buffer,
        xq,
        y,
      };
      checkMatvecQ8(shape, c, b);
      await g.push(label, MATVEC_Q8, c, [b.params, at.part.buffer, at.part.buffer, xq, xq, y], [
        ...matvecQ8Grid(shape, c),
        1,
      ]);
    }
  }
  g.lastQ8 = { x, k, layout, cols, regions, at: g.ops.length };
}

/**
 * {@linkcode matvecQ8} of 2 to 16 columns: one quantize_q8 over the columns (unless `given`, the int8 x of the
 * mat-vec pushed just before; with `a.norm`, the deferred norm whose output x is, it norms each column first
 * and writes x, rms_norm's bits, for the block's other readers), then one matvec_q8b per part of W (`mvs`,
 * column 0's), each column with the bits of its own matvec_q8 (same TEAM and RED): a batched step's columns
 * equal their solo steps.
 */
async function matvecQ8Cols(
  g: GraphBuilder,
  label: string,
  a: {
    type: GgmlTypeName;
    k: number;
    cols: number;
    x: GPUBuffer;
    y: GPUBuffer;
    acc?: boolean;
    sum?: SoloSum;
    norm?: PendingNorm;
    /** Quantize x in both byte orders (not when `given`). */
    both?: boolean;
  },
  given: Binding | undefined,
  mvs: readonly { shape: MatvecQ8Shape; weights: GPUBuffer }[],
  yStride: number,
): Promise<void> {
  const { type, k, cols } = a;
  const layout = q8Layout(type);
  // The columns in this byte order, and what the dispatches bind (with both, the other order's copy too).
  let first = given;
  let xq = given;
  // The other byte order's copy: a given x's (kept for the mat-vecs after this one), or written here.
  let alt = given ? otherCopy(g.lastQ8!, layout) : undefined;
  if (!xq) {
    const bytes = cols * q8xBytes(k);
    // The copies (both: the other byte order's after the first, a bindable offset on): logged, each under
    // this mat-vec's label, or in the graph's buffer for K.
    const logged = g.logRegion(label, k, type, cols);
    const other: GgmlTypeName = layout === 0 ? "IQ4_XS" : "Q8_0";
    const loggedAlt = a.both && logged ? g.logRegion(label, k, other, cols) : undefined;
    const buffer = logged?.buffer ?? sharedXq(g, k);
    const at = logged?.offset ?? 0;
    const altAt = loggedAlt?.offset ?? g.maxCols * q8Stride(k);
    const both = a.both ? (altAt - at) / 4 : undefined;
    first = { buffer, offset: at, size: bytes };
    xq = { buffer, offset: at, size: 4 * (both ?? 0) + bytes };
    if (a.both) alt = { layout: 1 - layout, region: { buffer, offset: altAt, size: bytes } };
    const norm = a.norm;
    const qs: QuantizeQ8Shape = {
      type,
      k,
      cols,
      xStride: k,
      norm: norm ? { eps: g.hp.rmsEps } : undefined,
      both,
    };
    const xIn = norm ? norm.x : a.x;
    const [nw, xn] = normBindings(g.device, { x: xIn, nw: norm ? part0(norm.w) : undefined, xn: norm?.y });
    const qb: QuantizeQ8Bindings = { params: g.storage(quantizeQ8Params(qs)), x: xIn, xq, nw, xn };
    checkQuantizeQ8(qs, qb);
    // Another deferred norm is pushed first (GraphBuilder.checked), before anything reads x.
    await g.push(`${label}.q8`, QUANTIZE_Q8, quantizeQ8Constants(qs), [qb.params, xIn, xq, nw, xn], [
      ...quantizeQ8Grid(qs),
      1,
    ]);
  }
  for (const mv of mvs) {
    const shape: MatvecQ8bShape = { ...mv.shape, cols, yStride };
    const c = matvecQ8bConstants(shape, {
      acc: a.acc,
      ...a.sum,
      rows: g.opts.matvecTuning?.q8bRows,
      xsum: g.opts.matvecTuning?.q8bXsum,
      maxWorkgroupBytes: g.device.limits.maxComputeWorkgroupStorageSize,
    });
    const b: MatvecQ8bBindings = {
      params: g.storage(matvecQ8bParams(shape)),
      weights: mv.weights,
      xq,
      y: a.y,
    };
    checkMatvecQ8b(shape, c, b);
    await g.push(label, MATVEC_Q8B, c, [b.params, b.weights, b.weights, xq, xq, a.y], [
      ...matvecQ8bGrid(shape, c),
      1,
    ]);
  }
  g.lastQ8 = { x: a.x, k, layout, cols, regions: [first!], at: g.ops.length, alt };
}

/** Of the int8 x copies `last` holds (its regions and `alt`), the one not in byte order `layout`. */
function otherCopy(
  last: NonNullable<GraphBuilder["lastQ8"]>,
  layout: number,
): { layout: number; region: Binding } | undefined {
  return last.layout !== layout ? { layout: last.layout, region: last.regions[0]! } : last.alt;
}

/** Bytes between the columns of the per-column int8 x regions (a bindable offset apart). */
function q8Stride(k: number): number {
  return Math.ceil(q8xBytes(k) / 256) * 256;
}

/**
 * The graph's int8 x buffer for K, for maxCols columns at {@linkcode q8Stride}, twice (the second: the other
 * byte order's copy of a quantize over columns): the stage's graphs share it (a chunk's graph may have made it
 * for fewer columns than a batched step's).
 */
function sharedXq(g: GraphBuilder, k: number): GPUBuffer {
  let shared = g.xq.get(k);
  if (!shared || shared.size < 2 * g.maxCols * q8Stride(k)) {
    shared = g.device.createBuffer({
      label: `int8 x K=${k}`,
      size: 2 * g.maxCols * q8Stride(k),
      usage: GPUBufferUsage.STORAGE,
    });
    g.own(shared);
    g.xq.set(k, shared);
  }
  return shared;
}

/**
 * Decode (n = 1) of the longest leading run (≥ 2) of `ws` packed back to back in one buffer, as ONE
 * mat-vec into `out`; returns the output row offset of each fused tensor (empty when nothing was fused).
 * Every fused tensor's output must start 256-byte aligned (a bindable range) unless it is `joined`: read
 * through the previous tensor's range. With `yStride`, the graph's columns too (a batched step, or a chunk
 * of mat-vec columns): column c's fused rows at c·yStride of `out` (yStride ≥ the fused rows).
 */
export async function fusedMatvec(
  g: GraphBuilder,
  label: string,
  ws: readonly GpuTensor[],
  x: GPUBuffer,
  out: GPUBuffer,
  opts: {
    joined?: GpuTensor;
    f32?: boolean;
    yStride?: number;
    zNorm?: boolean;
    q8Both?: boolean;
    weightNorm?: GpuTensor;
  } = {},
): Promise<number[]> {
  const cols = g.n;
  if (cols !== 1 && (opts.yStride === undefined || cols > g.maxCols)) return [];
  const { offsets, end } = fusedRun(ws, opts.joined);
  const first = ws[0]!;
  const p0 = first.parts[0]!;
  if (offsets.length < 2 || (cols > 1 && opts.yStride! < end)) return [];
  const whole: GpuTensor = {
    name: ws.slice(0, offsets.length).map((w) => w.name).join("+"),
    type: first.type,
    ne: [first.ne[0]!, end],
    rowBytes: first.rowBytes,
    parts: [{
      buffer: p0.buffer,
      offsetBytes: p0.offsetBytes,
      firstRow: 0,
      nRows: end,
      sizeBytes: end * first.rowBytes,
    }],
  };
  await matvec(g, label, whole, x, out, cols, {
    f32: opts.f32,
    yStride: cols > 1 ? opts.yStride : undefined,
    zNorm: opts.zNorm,
    q8Both: opts.q8Both,
    weightNorm: opts.weightNorm,
  });
  return offsets;
}

/** Whether {@linkcode fusedMatvec} runs all of `ws` as one mat-vec (given a column stride that fits). */
export function fusesAll(ws: readonly GpuTensor[]): boolean {
  return fusedRun(ws, undefined).offsets.length === ws.length;
}

/** The leading run of `ws` that {@linkcode fusedMatvec} fuses: each tensor's first output row, and all its rows. */
function fusedRun(
  ws: readonly GpuTensor[],
  joined: GpuTensor | undefined,
): { offsets: number[]; end: number } {
  const first = ws[0]!;
  const p0 = first.parts[0]!;
  let end = 0;
  const offsets: number[] = [];
  for (const w of ws) {
    const p = w.parts[0]!;
    const contiguous = w.parts.length === 1 && p.buffer === p0.buffer && w.type.id === first.type.id &&
      w.ne[0] === first.ne[0] && p.offsetBytes === p0.offsetBytes + end * first.rowBytes;
    const aligned = (end * 4) % 256 === 0 || w === joined;
    if (!contiguous || !aligned) break;
    offsets.push(end);
    end += p.nRows;
  }
  return { offsets, end };
}

/** How a dispatch sums each row: its TEAM, and under int8 x its team reduction (matvec_q8's RED). */
export interface SoloSum {
  readonly team: number;
  readonly red?: number;
}

/**
 * For mat-vec columns (a batched step, a chunk of up to 8 tokens) that run the tensors of `ws` one by one
 * where a one-token step fuses a leading run of them ({@linkcode fusedMatvec}): how that fused dispatch sums
 * (its TEAM; with int8 x, matvec_q8's TEAM and RED), for tensor `i` of the run, so that every column sums each
 * row in the order of its one-token step. Both follow K and the dispatch's rows: on the 35B-A3B a one-token
 * step's in_proj (12,352 rows) takes TEAM 32 and ssm_beta alone (32 rows) TEAM 128, so batched steps summed
 * beta, alpha and attention's k and v in another order than their solo steps (the tiny test models' K = 256
 * caps TEAM at 32 either way); with int8 x the fused in_proj is tall (TEAM 16, RED 0) and beta alone is not
 * (TEAM 32, RED 1). Undefined for one token, prefill chunks, tensors past the run, and runs of fewer than 2.
 */
export function soloSum(
  g: GraphBuilder,
  ws: readonly GpuTensor[],
  i: number,
  joined?: GpuTensor,
): SoloSum | undefined {
  if (g.n === 1 || g.n > g.maxCols) return undefined;
  const { offsets, end } = fusedRun(ws, joined);
  if (offsets.length < 2 || i >= offsets.length) return undefined;
  const w = ws[0]!;
  const type = typeName(w);
  if (g.opts.int8Activations && MATVEC_Q8_TYPES.includes(type)) {
    const c = matvecQ8Constants({ type, k: w.ne[0]!, n: end });
    return { team: c.TEAM, red: c.RED };
  }
  return { team: matvecConstants({ type, k: w.ne[0]!, n: end, batch: 1 }).TEAM };
}

/**
 * A batched step's projections `ws` of layer l on the columns of x, whose rows make one column [w0 | w1 | ...]
 * per slot: into `out`, columns `stride` words apart. The leading run that the one-token step fuses
 * ({@linkcode fusedMatvec}) runs as one mat-vec (`L${l}.${label}`, its TEAM), the rest one by one at their
 * rows of the column (`L${l}.${names[i]}`), as the one-token step runs them alone, so that every column sums
 * as its slot's solo step. `split`: where a first tensor run alone is cut in two mat-vecs (as the
 * one-token step cuts qwen3next's legacy ssm_in: qkv | z). Returns the rows of a column.
 */
export async function columnProjections(
  g: GraphBuilder,
  l: number,
  label: string,
  ws: readonly GpuTensor[],
  names: readonly string[],
  x: GPUBuffer,
  out: GPUBuffer,
  stride: number,
  opts: { joined?: GpuTensor; split?: number } = {},
): Promise<number> {
  // int8 x read in both byte orders (attention's v in another type than q and k): one quantize writes both.
  const layouts = new Set(
    ws.filter((w) => MATVEC_Q8_TYPES.includes(typeName(w))).map((w) => q8Layout(typeName(w))),
  );
  const q8Both = layouts.size > 1;
  const fused = await fusedMatvec(g, `L${l}.${label}`, ws, x, out, {
    joined: opts.joined,
    yStride: stride,
    q8Both,
  });
  let at = fused.length === 0 ? 0 : fused.at(-1)! + ws[fused.length - 1]!.ne[1]!;
  for (let i = fused.length; i < ws.length; i++) {
    const w = ws[i]!;
    // A first tensor run alone in two mat-vecs by the one-token step too (its TEAM follows its rows).
    const pieces = i === 0 && opts.split
      ? [[0, opts.split], [opts.split, w.ne[1]! - opts.split]]
      : [[0, w.ne[1]!]];
    for (const [rowStart, rows] of pieces) {
      const name = pieces.length > 1
        ? `L${l}.${names[i]}.${rowStart === 0 ? "qkv" : "z"}`
        : `L${l}.${names[i]}`;
      await matvec(g, name, w, x, out, g.n, { rowStart, rows, yStride: stride, yAt: at + rowStart!, q8Both });
    }
    at += w.ne[1]!;
  }
  assert(at <= stride, `L${l}.${label}: a column's ${at} rows exceed the stride ${stride}`);
  return at;
}

/**
 * Whether the graph's tokens run as mat-vec columns through the blocks' column projections: a chunk of 2 to
 * MATVEC_MAX_COLS tokens (a prompt's rest, drafts checked in one frame), as a batched step's slots do. Their
 * in-projections then run as the one-token step's fused mat-vec (each token keeps its bits): gdn_step reads
 * the tokens T_COL apart, attention (pooled caches) as a batched step's columns.
 */
export function matvecColumns(g: GraphBuilder): boolean {
  return g.n >= 2 && g.n <= Math.min(g.maxCols, MATVEC_MAX_COLS);
}

/**
 * A mixer's output projection: mat-vec columns (decode, a batched step, a short chunk) add W·x into h (ACC, the
 * residual add's rounding: h + W·x, so each column keeps its solo bits); prefill writes t for the residual add.
 */
export async function outProj(
  g: GraphBuilder,
  label: string,
  w: GpuTensor,
  x: GPUBuffer,
  t: GPUBuffer,
  h: GPUBuffer,
) {
  if (outProjAdds(g)) await matvec(g, `${label}+residual`, w, x, h, g.n, { acc: true });
  else await matvec(g, label, w, x, t, g.n);
}

/** Where a producer writes the int8 x of a mat-vec's columns (see {@linkcode outProjQ8}). */
export interface Q8Target {
  /** The region the mat-vec's own quantize_q8 would have written (the int8 log's, or the graph's buffer). */
  readonly binding: Binding;
  /** Its byte order (`q8Layout` of the weights). */
  readonly layout: number;
}

/**
 * Where {@linkcode outProj} of x through `w` would round its columns to int8 itself (int8 x, 2 to 16 columns:
 * one quantize_q8, then matvec_q8b), so that the kernel producing x can write that int8 x instead: call
 * {@linkcode q8Given} just before outProj and the mat-vec skips its quantize. Undefined where it takes another
 * path (f32 x, one column, a prefill chunk, a deferred norm of x). Takes the int8 log's region for the
 * mat-vec's label, as the mat-vec would: call it where the mat-vec's rounding is the next one logged.
 */
export function outProjQ8(g: GraphBuilder, label: string, w: GpuTensor, x: GPUBuffer): Q8Target | undefined {
  const type = typeName(w);
  const k = w.ne[0]!;
  const cols = g.n;
  if (
    !outProjAdds(g) || !g.opts.int8Activations || cols < 2 || cols > MATVEC_Q8B_MAX_BATCH ||
    !MATVEC_Q8_TYPES.includes(type) || q8xBytes(k) % 16 !== 0 || g.pending?.y === x
  ) {
    return undefined;
  }
  const bytes = cols * q8xBytes(k);
  const binding = g.logRegion(`${label}+residual`, k, type, cols) ??
    { buffer: sharedXq(g, k), offset: 0, size: bytes };
  return { binding, layout: q8Layout(type) };
}

/** After the pushes that wrote `t` (the int8 x of x's columns for `w`): the next mat-vec of x reads it. */
export function q8Given(g: GraphBuilder, x: GPUBuffer, w: GpuTensor, t: Q8Target): void {
  g.lastQ8 = { x, k: w.ne[0]!, layout: t.layout, cols: g.n, regions: [t.binding], at: g.ops.length };
}

/** Whether {@linkcode outProj} adds into h itself (mat-vec columns), so no residual add follows it. */
export function outProjAdds(g: GraphBuilder): boolean {
  return g.n <= g.maxCols;
}

/**
 * int8Activations in a prefill chunk (wider than the int8 mat-vecs take): x's `cols` columns of K rounded
 * to int8 per 32 elements as the mat-vecs round them (quantize_q8 ROUND), written back as f32 (d·q, exact)
 * into a buffer of the graph for `use`, which the f32 matmul or moe_matvec then reads instead of x. So a
 * prompt rounds alike in every chunk width, and the products differ from the int8 mat-vecs' only in f32
 * summation order. Logged like the mat-vecs' roundings (int8Log), in `type`'s byte order.
 */
export async function roundX(
  g: GraphBuilder,
  label: string,
  x: GPUBuffer,
  k: number,
  cols: number,
  type: GgmlTypeName,
  use: "dense" | "moe_in" | "moe_act",
): Promise<GPUBuffer> {
  const out = g.grown(`int8-rounded x (${use})`, 4 * k * cols);
  const xq = g.q8Region(label, k, type, cols, "prefill");
  const qs: QuantizeQ8Shape = { type, k, cols, round: true };
  const qb: QuantizeQ8Bindings = { params: g.storage(quantizeQ8Params(qs)), x, xq, xn: out };
  checkQuantizeQ8(qs, qb);
  await g.push(`${label}.q8`, QUANTIZE_Q8, quantizeQ8Constants(qs), [
    qb.params,
    x,
    xq,
    x,
    out,
  ], [...quantizeQ8Grid(qs), 1]);
  return out;
}
