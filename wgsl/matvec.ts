/**
 * Twin of `matvec.wgsl`: `y[b][n] = Σ_k W[n][k]·x[b][k]` for 1..16 columns (9..16 with XR = 2 only), reading packed weights of any
 * supported type straight from their GGUF block bytes, accumulating in f32.
 *
 * Weight layout decision: raw GGUF blocks, no repacking at upload, so there is no `repackWeights` and the
 * loader uploads bytes as they are. Misaligned blocks (Q8_0's 34 bytes, Q6_K's 210) are read through a
 * two-word funnel shift (`lib/common.wgsl`). Measured on the H200 (docs/PERF.md, "matvec v2"): time tracks
 * the weight count, not the bytes or their alignment, and the misaligned Q8_0 is the fastest quantized type,
 * so an aligned repack would not buy anything until the per-weight instruction cost comes down.
 *
 * Uniform `Params` (32 bytes, 8 × u32, in struct order): 0 k, 4 n, 8 row_bytes, 12 w_off (bytes),
 * 16 x_off, 20 y_off, 24 x_stride, 28 y_stride (elements). Bindings: 0 params, 1 weights, 2 x, 3 y, 4 nw
 * (norm weight), 5 xn (normed x out); 4 and 5 matter only with NORM.
 * @module
 */
import { bindGroup, type Binding, type KernelSpec, PipelineCache } from "./kernel.ts";
import { type GgmlTypeName, TYPE_ID } from "../engine/quant/types.ts";
import { bindingBytes, checkInt, checkShape, isPow2, MAX_WORKGROUPS_PER_DIM } from "./_twin.ts";
import { checkWeightRows, QUANT_LIBS } from "./_quant.ts";

/** Kernel description of `matvec.wgsl`. */
export const MATVEC: KernelSpec = {
  name: "matvec",
  url: new URL("./matvec.wgsl", import.meta.url),
  lib: [...QUANT_LIBS, "rows", "rms"],
  constants: {
    TYPE: "u32",
    TEAM: "u32",
    ROWS: "u32",
    BATCH: "u32",
    UNROLL: "u32",
    XR: "u32",
    SR: "u32",
    NORM: "u32",
    ACC: "u32",
    EPS: "f32",
  },
};

/** Constants of one matvec variant. */
export interface MatvecConstants {
  /** ggml type id of the weights. */
  readonly TYPE: number;
  /** Invocations per row team (power of two, 1..256). */
  readonly TEAM: number;
  /** Rows per team (1..8; 1..4 with XR = 2). */
  readonly ROWS: number;
  /** Input columns (1..8; 1..16 with XR = 2). */
  readonly BATCH: number;
  /** Units per loop step (1 or 2; with SR 1, 2, 4 or 8): more keeps more loads in flight. */
  readonly UNROLL: number;
  /**
   * Batched path (BATCH > 1 or ROWS > 4) only: 0 loads each unit's x quads of all columns once and holds them
   * for all rows in arrays; 1 reloads them per row (fewer registers, more L1 reads); 2 the named path (no
   * arrays: sums in named vec4s per row and group of 4 columns, each group's x loaded once per unit for all
   * ROWS ≤ 4 rows; up to 16 columns, reduced in passes). Same bits in every case.
   */
  readonly XR: number;
  /**
   * 1: the strength-reduced batch-1 loop (per-invocation block offsets computed once, UNROLL units' loads
   * issued before their math); needs TYPE IQ4_XS (23) or Q8_0 (8), TEAM a multiple of 32 and
   * ROWS = BATCH = 1. Equal to SR = 0 bit for bit at the same TEAM. 0: the general code.
   */
  readonly SR: number;
  /**
   * 1: x is RMSNorm-ed first (batch 1) and workgroup 0 writes the normed x to `xn`; 2 (any batch): x times the
   * norm weight alone (y = W·(x ⊙ nw)), the norm's scale left to the reader of y; 0: x as it is.
   */
  readonly NORM: number;
  /** 1: y += W·x (a residual add); 0: y = W·x. */
  readonly ACC: number;
  /** The norm's epsilon (0 unless NORM 1). */
  readonly EPS: number;
  /** Index signature: the constants object is a `ConstValues` for the kernel loader. */
  [key: string]: number;
}

/** Size of the uniform params block in bytes. */
export const MATVEC_PARAMS_BYTES = 32;

/**
 * Largest batch: accumulators are ROWS·BATCH registers per invocation. 9..16 columns take XR = 2 (the other
 * batched paths hold BATCH·ROWS partials in workgroup memory at once). The engine's batched decode steps take
 * up to this many slots (BATCH_MAX_COLS in engine/graph/builder.ts), one dispatch for all of them.
 */
export const MATVEC_MAX_BATCH = 16;

/** Largest batch of the XR = 0 and 1 batched paths. */
export const MATVEC_MAX_BATCH_ARRAYS = 8;

/** One matvec problem: W ne=[k, n] of `type`, x ne=[k, batch], y ne=[n, batch], as slices of bindings. */
export interface MatvecShape {
  /** Weight type. */
  readonly type: GgmlTypeName;
  /** Row length K (a multiple of 32 and of the type's block). */
  readonly k: number;
  /** Rows N. */
  readonly n: number;
  /** Columns (1..16; above 8 with XR = 2). */
  readonly batch: number;
  /** Byte offset of row 0 in the weight binding (multiple of 4; default 0). */
  readonly wOffsetBytes?: number;
  /** Element offset of x[0][0] in the x binding (multiple of 4; default 0). */
  readonly xOffset?: number;
  /** Element offset of y[0][0] in the y binding (default 0). */
  readonly yOffset?: number;
  /** Elements between x columns (multiple of 4, ≥ k; default k). */
  readonly xStride?: number;
  /** Elements between y columns (≥ n; default n). */
  readonly yStride?: number;
  /**
   * Columns as grid z (batch 1; default 1): column z runs the code of a dispatch of its own with x (and
   * NORM's xn) at xOffset + z·xStride and y at yOffset + z·yStride, so each has that dispatch's bits.
   */
  readonly zCols?: number;
}

/** The four bindings in binding order. */
export interface MatvecBindings {
  /** Uniform params (MATVEC_PARAMS_BYTES, from {@linkcode matvecParams}); offset a multiple of 256. */
  readonly params: Binding;
  /** Weight bytes (storage, read). */
  readonly weights: Binding;
  /** Input columns, f32 (storage, read). */
  readonly x: Binding;
  /** Output columns, f32 (storage, read_write). */
  readonly y: Binding;
  /** NORM 1 or 2: the norm weight, K f32 (storage, read). Without NORM any buffer (default: x). */
  readonly nw?: Binding;
  /** NORM 1: receives the normed x at x's offset (storage, read_write); without NORM any buffer not bound
   * elsewhere (default: a 16-byte scratch buffer). */
  readonly xn?: Binding;
}

/** A checked, ready-to-encode matvec: pipeline, bind group and grid. */
export interface MatvecOp {
  /** The variant's pipeline. */
  readonly pipeline: GPUComputePipeline;
  /** Bind group 0. */
  readonly bindGroup: GPUBindGroup;
  /** Workgroups in x, y and z. */
  readonly grid: readonly [number, number, number];
}

/**
 * The default variant for a shape, from the H200 sweeps in docs/PERF.md ("matvec v2", "array-free path",
 * "rows in vec4 components"): TEAM = the largest power of two ≤ K/8 (units per row) and ≤ 32, or 64 from
 * K = 4096; batch 1 uses ROWS = 4 with UNROLL 1 from N = 8192 (rows share x quads), else ROWS = 1 from
 * K = 2048 (more workgroups) and ROWS = 4 below (short rows need more rows per workgroup); batches use
 * the named path XR = 2 with UNROLL = 1 and ROWS = 4 from N = 4096 below 65,536 (above 8 columns from N =
 * 2048 on), else 2; UNROLL = 2 elsewhere.
 */
export function matvecConstants(
  shape: MatvecShape,
  opts: {
    team?: number;
    rows?: number;
    unroll?: number;
    /** The strength-reduced batch-1 loop (SR = 1; see {@linkcode MatvecConstants.SR}); default off. */
    sr?: boolean;
    /** The batched path's x handling ({@linkcode MatvecConstants.XR}): 0, 1 or 2 (named). */
    xr?: number;
    norm?: { eps: number };
    /** NORM 2: x times the norm weight alone (not with `norm`). */
    weightNorm?: boolean;
    acc?: boolean;
  } = {},
): MatvecConstants {
  const units = Math.floor(shape.k / 8);
  const cap = shape.k >= 4096 ? 64 : 32;
  let team = 1;
  while (team * 2 <= Math.min(cap, units)) team *= 2;
  // Batch 1: 4 rows per team share each x quad on tall matrices (N ≥ 8192 still gives ≥ 256 workgroups),
  // one unit per step there (Q8_0 loses 10-15% at 2, IQ4_XS and Q6_K gain ≤ 2%); shorter ones keep more
  // workgroups with ROWS 1 from K = 2048.
  const tall = shape.batch === 1 && shape.n >= 8192;
  // Batches: ROWS 1 with the x quads reloaded per row (XR 1) and UNROLL 1: H200, bench/matvec.ts --batch-sweep
  // at 8 columns attn_qkv 0.059 against 0.140 ms (ROWS 2, XR 0), ssm_out 0.032 against 0.074, the Q6_K LM head
  // 1.82 against 4.74; at 4 columns 0.039 / 0.020 / 1.00 against 0.055 / 0.033 / 2.10 (docs/PERF.md): holding
  // every column's x for the rows costs more (registers) than reading it again from L1.
  // From the sixteenth session: the named batched path (XR 2) for every batch, ROWS 4 on matrices of 4,096 to
  // 65,535 rows and 2 elsewhere (H200, bench/matvec.ts --batch-sweep at 8 columns, ms against XR 1 ROWS 1:
  // attn_qkv [2048, 8192] 0.0245 / 0.0592, attn_gate [2048, 4096] 0.0171 / 0.0323, ssm_out [4096, 2048] ROWS 2
  // 0.0185 / 0.0318, shexp gate·up 0.0090 / 0.0155, the Q6_K LM head ROWS 2 0.926 / 1.845; docs/PERF.md).
  // From the twenty-sixth session: ROWS 4 from N = 2,048 above 8 columns too (H100, --batch-sweep at 16
  // columns: ssm_out [4096, 2048] 0.028 ms against 0.039 at ROWS 2, the Q6_K LM head 1.56 against 2.03; at 8
  // columns ROWS 2 keeps them: 0.018 either way, 0.93 against 0.98).
  const batched = shape.batch > 1;
  const xr = opts.xr ?? (batched ? 2 : 0);
  const fourRows = (shape.n >= 4096 && shape.n < 65536) || (shape.batch > 8 && shape.n >= 2048);
  const batchRows = xr === 2 ? (fourRows ? 4 : 2) : 1;
  const rows = opts.rows ?? (opts.sr ? 1 : !batched ? (tall || shape.k < 2048 ? 4 : 1) : batchRows);
  // Short matrices (a router, a k/v projection): a wider team, up to 128, until one row per team gives 256
  // workgroups, so that a few dozen workgroups do not leave the SMs idle (H200, batch 1: router [2048, 257]
  // F32 8.7 µs at TEAM 32, 4.9 at 128, 5.3-6.4 at 256; attn_v [2048, 512] Q5_K 11.8, 6.1, 6.1; docs/PERF.md).
  // TEAM depends on K and N only, never on the batch: it fixes each row's summation order, and a batched
  // decode step must give every slot the bits of its solo step.
  if (opts.team === undefined) {
    while (team < 128 && team * 2 <= units && Math.ceil(shape.n / (256 / team)) < 256) team *= 2;
  }
  const c: MatvecConstants = {
    TYPE: TYPE_ID[shape.type],
    TEAM: opts.team ?? team,
    ROWS: rows,
    BATCH: shape.batch,
    UNROLL: opts.unroll ?? (tall || batched ? 1 : 2),
    XR: xr,
    SR: opts.sr ? 1 : 0,
    NORM: opts.norm ? 1 : opts.weightNorm ? 2 : 0,
    ACC: opts.acc ? 1 : 0,
    EPS: opts.norm?.eps ?? 0,
  };
  checkMatvecSr(c);
  return c;
}

/**
 * Throws when SR and UNROLL do not fit the other constants.
 * @throws {RangeError} naming the constant and what to change
 */
export function checkMatvecSr(c: MatvecConstants): void {
  if (c.SR === 0) {
    checkShape(
      c.UNROLL === 1 || c.UNROLL === 2,
      `Kernel matvec: UNROLL=${c.UNROLL} must be 1 or 2 without SR (4 and 8 need SR=1)`,
    );
    return;
  }
  checkShape(c.SR === 1, `Kernel matvec: SR=${c.SR} must be 0 or 1`);
  checkShape(
    c.TYPE === TYPE_ID.IQ4_XS || c.TYPE === TYPE_ID.Q8_0,
    `Kernel matvec: SR=1 takes IQ4_XS (23) or Q8_0 (8) weights, not TYPE=${c.TYPE}: use SR=0`,
  );
  checkShape(
    c.TEAM % 32 === 0,
    `Kernel matvec: SR=1 needs TEAM a multiple of 32 (a unit's place in its block is then the same at every ` +
      `step), not TEAM=${c.TEAM}: use TEAM ≥ 32 (K ≥ 256) or SR=0`,
  );
  checkShape(
    c.ROWS === 1 && c.BATCH === 1,
    `Kernel matvec: SR=1 is the batch-1 path: needs ROWS=1 and BATCH=1, not ROWS=${c.ROWS} BATCH=${c.BATCH}`,
  );
  checkShape(
    [1, 2, 4, 8].includes(c.UNROLL),
    `Kernel matvec: UNROLL=${c.UNROLL} with SR=1 must be 1, 2, 4 or 8`,
  );
}

/**
 * Columns whose partials workgroup memory holds at once: BATCH, or with XR = 2 the columns of one reduction
 * pass (NB_P in matvec.wgsl: whole groups of 4 columns within 30 KiB).
 */
export function matvecPassColumns(c: MatvecConstants): number {
  if (c.XR !== 2) return c.BATCH;
  return Math.min(4 * Math.ceil(c.BATCH / 4), Math.max(4, 4 * Math.floor(Math.floor(30 / c.ROWS) / 4)));
}

/** Workgroup memory of a variant in bytes (partials, the IQ4 table's 2 KiB, the norm's 1 KiB). */
export function matvecWorkgroupBytes(c: MatvecConstants): number {
  return 4 * 256 * c.ROWS * matvecPassColumns(c) + 2048 + (c.NORM === 1 ? 1024 : 0);
}

/** Rows one workgroup owns. */
export function matvecRowsPerWorkgroup(c: MatvecConstants): number {
  return (256 / c.TEAM) * c.ROWS;
}

/** The uniform params of `shape` (write them at a 256-byte-aligned offset of a uniform buffer). */
export function matvecParams(shape: MatvecShape): Uint32Array<ArrayBuffer> {
  const rowBytes = checkWeightRows("matvec", shape.type, shape.k, shape.wOffsetBytes ?? 0);
  return new Uint32Array([
    shape.k,
    shape.n,
    rowBytes,
    shape.wOffsetBytes ?? 0,
    shape.xOffset ?? 0,
    shape.yOffset ?? 0,
    shape.xStride ?? shape.k,
    shape.yStride ?? shape.n,
  ]);
}

/** Workgroups in x and y: rows split into workgroups, the count folded into 2-D past 65535. */
export function matvecGrid(shape: MatvecShape, c: MatvecConstants): [number, number, number] {
  const wgs = Math.ceil(shape.n / matvecRowsPerWorkgroup(c));
  const gx = Math.min(wgs, MAX_WORKGROUPS_PER_DIM);
  return [gx, Math.ceil(wgs / gx), shape.zCols ?? 1];
}

/**
 * Throws before anything is encoded when the shape, constants and bindings do not fit together.
 * @throws {RangeError} naming the kernel, the value and what to change
 */
export function checkMatvec(shape: MatvecShape, c: MatvecConstants, b: MatvecBindings): void {
  const rowBytes = checkWeightRows("matvec", shape.type, shape.k, shape.wOffsetBytes ?? 0);
  checkShape(
    c.TYPE === TYPE_ID[shape.type],
    `Kernel matvec: TYPE=${c.TYPE} but the shape says ${shape.type}`,
  );
  checkShape(isPow2(c.TEAM) && c.TEAM <= 256, `Kernel matvec: TEAM=${c.TEAM} must be a power of two ≤ 256`);
  checkInt("Kernel matvec: ROWS", c.ROWS, 1, 8);
  checkInt("Kernel matvec: BATCH", c.BATCH, 1, MATVEC_MAX_BATCH);
  checkInt("Kernel matvec: XR", c.XR, 0, 2);
  checkShape(
    c.XR === 2 || c.BATCH <= MATVEC_MAX_BATCH_ARRAYS,
    `Kernel matvec: BATCH=${c.BATCH} above ${MATVEC_MAX_BATCH_ARRAYS} needs XR=2, not XR=${c.XR}`,
  );
  checkShape(c.XR !== 2 || c.ROWS <= 4, `Kernel matvec: XR=2 takes ROWS 1..4, not ROWS=${c.ROWS}`);
  checkMatvecSr(c);
  checkInt("Kernel matvec: NORM", c.NORM, 0, 2);
  checkInt("Kernel matvec: ACC", c.ACC, 0, 1);
  checkShape(c.NORM !== 1 || c.BATCH === 1, `Kernel matvec: NORM=1 takes batch 1, not BATCH=${c.BATCH}`);
  checkShape(c.NORM !== 1 || c.EPS > 0, `Kernel matvec: NORM=1 needs the norm's EPS > 0, got ${c.EPS}`);
  checkShape(
    matvecWorkgroupBytes(c) <= 32768,
    `Kernel matvec: ROWS·BATCH=${c.ROWS * c.BATCH} needs more than 32 KiB of workgroup memory: lower ROWS ` +
      `or use XR=2`,
  );
  checkShape(shape.batch === c.BATCH, `Kernel matvec: shape batch ${shape.batch} but BATCH=${c.BATCH}`);
  const z = shape.zCols ?? 1;
  checkInt("Kernel matvec: zCols", z, 1, MAX_WORKGROUPS_PER_DIM);
  checkShape(
    z === 1 || shape.batch === 1,
    `Kernel matvec: columns in grid z (zCols ${z}) take batch 1, not batch ${shape.batch}: use one or the other`,
  );
  checkInt("Kernel matvec: n", shape.n, 1, 2 ** 31);
  const xOff = shape.xOffset ?? 0;
  const xStride = shape.xStride ?? shape.k;
  const yOff = shape.yOffset ?? 0;
  const yStride = shape.yStride ?? shape.n;
  checkShape(
    Number.isInteger(xOff) && xOff >= 0 && xOff % 4 === 0 && Number.isInteger(xStride) &&
      xStride >= shape.k &&
      xStride % 4 === 0,
    `Kernel matvec: x offset ${xOff} and stride ${xStride} must be multiples of 4 (vec4 loads), stride ≥ K=${shape.k}`,
  );
  checkShape(
    Number.isInteger(yOff) && yOff >= 0 && Number.isInteger(yStride) && yStride >= shape.n,
    `Kernel matvec: y offset ${yOff} must be ≥ 0 and stride ${yStride} ≥ N=${shape.n}`,
  );
  const [gx, gy] = matvecGrid(shape, c);
  checkShape(
    gy <= MAX_WORKGROUPS_PER_DIM,
    `Kernel matvec: N=${shape.n} needs ${gx}×${gy} workgroups: split it`,
  );
  const need = (what: string, bind: Binding, bytes: number) =>
    checkShape(
      bindingBytes(bind) >= bytes,
      `Kernel matvec: binding ${what} holds ${bindingBytes(bind)} bytes but ${shape.type} ne=[${shape.k}, ` +
        `${shape.n}] batch ${shape.batch} needs ${bytes}: allocate or slice it for this shape`,
    );
  need("params", b.params, MATVEC_PARAMS_BYTES);
  need("weights", b.weights, Math.ceil(((shape.wOffsetBytes ?? 0) + shape.n * rowBytes) / 4) * 4);
  const cols = Math.max(shape.batch, z);
  need("x", b.x, 4 * (xOff + (cols - 1) * xStride + shape.k));
  need("y", b.y, 4 * (yOff + (cols - 1) * yStride + shape.n));
  if (c.NORM === 1) {
    checkShape(
      b.nw !== undefined && b.xn !== undefined,
      "Kernel matvec: NORM=1 needs the nw and xn bindings",
    );
    need("nw", b.nw!, 4 * shape.k);
    need("xn", b.xn!, 4 * (xOff + (cols - 1) * xStride + shape.k));
  }
  if (c.NORM === 2) {
    checkShape(b.nw !== undefined, "Kernel matvec: NORM=2 needs the nw binding (the norm weight)");
    need("nw", b.nw!, 4 * shape.k);
  }
}

const scratch = new WeakMap<GPUDevice, GPUBuffer>();

/** The nw and xn bindings to use: the given ones, or stand-ins for a variant without NORM. */
export function matvecNormBindings(device: GPUDevice, b: MatvecBindings): [Binding, Binding] {
  return normBindings(device, b);
}

/**
 * The nw and xn bindings of a kernel with an optional norm prologue (matvec, quantize_q8): the given ones, or
 * stand-ins (x itself, and one 16-byte buffer per device) for a variant without it.
 */
export function normBindings(
  device: GPUDevice,
  b: { readonly x: Binding; readonly nw?: Binding; readonly xn?: Binding },
): [Binding, Binding] {
  let s = scratch.get(device);
  if (!s) {
    s = device.createBuffer({ label: "unused xn", size: 16, usage: GPUBufferUsage.STORAGE });
    scratch.set(device, s);
  }
  return [b.nw ?? b.x, b.xn ?? s];
}

/**
 * Checks the problem, compiles (or reuses) its variant and builds its bind group.
 * @throws {RangeError} from {@linkcode checkMatvec}
 */
export async function prepareMatvec(
  cache: PipelineCache,
  opts: { device: GPUDevice; shape: MatvecShape; bindings: MatvecBindings; constants?: MatvecConstants },
): Promise<MatvecOp> {
  const c = opts.constants ?? matvecConstants(opts.shape);
  checkMatvec(opts.shape, c, opts.bindings);
  const pipeline = await cache.get(MATVEC, c);
  const b = opts.bindings;
  return {
    pipeline,
    bindGroup: bindGroup(opts.device, pipeline, [
      b.params,
      b.weights,
      b.x,
      b.y,
      ...matvecNormBindings(opts.device, b),
    ]),
    grid: matvecGrid(opts.shape, c),
  };
}

/** Records one matvec dispatch into a caller-owned compute pass. */
export function encodeMatvec(pass: GPUComputePassEncoder, op: MatvecOp): void {
  pass.setPipeline(op.pipeline);
  pass.setBindGroup(0, op.bindGroup);
  pass.dispatchWorkgroups(op.grid[0], op.grid[1], op.grid[2]);
}
