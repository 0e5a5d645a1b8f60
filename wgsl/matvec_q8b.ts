/**
 * Twin of `matvec_q8b.wgsl`: matvec_q8 over up to 16 columns of int8 x (a batched decode step's int8
 * mat-vec), each weight chunk decoded once for all of them. Every column equals matvec_q8's output for that
 * column alone, bit for bit, given the same TEAM and RED ({@linkcode matvecQ8bConstants} takes them from
 * {@linkcode matvecQ8Constants} of the same rows); the x of all columns comes from one quantize_q8 dispatch
 * over the columns (column col at byte col·{@linkcode q8xBytes}(K)).
 *
 * Uniform params: 32 bytes (k, n, row_bytes, w_off, y_off, y_stride, x_stride, 0).
 * @module
 */
import { bindGroup, type Binding, type KernelSpec, type PipelineCache } from "./kernel.ts";
import { bindingBytes, checkInt, checkShape, checkWorkgroupBytes, MAX_WORKGROUPS_PER_DIM } from "./_twin.ts";
import { checkWeightRows } from "./_quant.ts";
import {
  checkQ8Rows,
  MATVEC_Q8_PARAMS_BYTES,
  matvecQ8Constants,
  type MatvecQ8Shape,
  type Q8Op,
  q8xBytes,
} from "./matvec_q8.ts";

/** Kernel description of `matvec_q8b.wgsl`. */
export const MATVEC_Q8B: KernelSpec = {
  name: "matvec_q8b",
  url: new URL("./matvec_q8b.wgsl", import.meta.url),
  lib: ["common", "iq4_xs", "q4_k", "q8chunk"],
  constants: { TYPE: "u32", TEAM: "u32", ROWS: "u32", BATCH: "u32", ACC: "u32", RED: "u32", XSUM: "u32" },
};

/** Most columns of one matvec_q8b dispatch. */
export const MATVEC_Q8B_MAX_BATCH = 16;

/** Size of matvec_q8b's uniform params in bytes. */
export const MATVEC_Q8B_PARAMS_BYTES = MATVEC_Q8_PARAMS_BYTES;

/** One matvec_q8b problem: matvec_q8's rows for `cols` columns. */
export interface MatvecQ8bShape extends MatvecQ8Shape {
  /** Columns (1..16). */
  readonly cols: number;
  /** Elements of y between columns (default N). */
  readonly yStride?: number;
  /** Bytes of xq between columns (a multiple of 16; default q8xBytes(K), quantize_q8's packing: a multiple of
   * 16 where K % 128 == 0). */
  readonly xStrideBytes?: number;
}

/** Constants of one matvec_q8b variant. */
export interface MatvecQ8bConstants {
  /** ggml type id of the weights (8, 12, 13, 14 or 23). */
  readonly TYPE: number;
  /** Invocations per row team (power of two, 1..256). */
  readonly TEAM: number;
  /** Rows per team (1 or 2). */
  readonly ROWS: number;
  /** Columns (1..16). */
  readonly BATCH: number;
  /** 1: y += W·x̂; 0: y = W·x̂. */
  readonly ACC: number;
  /** Team reduction, as matvec_q8's RED. */
  readonly RED: number;
  /** K-quants: 0, or K/32 (each column's x sums per chunk, once per workgroup; the same bits). */
  readonly XSUM: number;
  /** Index signature: the constants object is a `ConstValues` for the kernel loader. */
  [key: string]: number;
}

/** Bindings of matvec_q8b (the weight and xq buffers are bound twice by {@linkcode prepareMatvecQ8b}). */
export interface MatvecQ8bBindings {
  /** Uniform params ({@linkcode matvecQ8bParams}); offset a multiple of 256. */
  readonly params: Binding;
  /** Weight bytes (storage, read). */
  readonly weights: Binding;
  /** quantize_q8's output of every column for this type (storage, read). */
  readonly xq: Binding;
  /** Output, f32 (storage, read_write). */
  readonly y: Binding;
}

/**
 * ROWS where no shape rule below applies: 2 (H100, 2026-12-06, docs/PERF.md: 8 / 16 slots 924.4 / 1,163.5
 * tok/s against 866.6 / 1,076.3 at ROWS 1, the same bits).
 */
export const MATVEC_Q8B_ROWS = 2;

/**
 * Default ROWS of a shape (the bits do not depend on ROWS). `bench/matvec.ts --batch-sweep --q8b-only` on an
 * H100 (2026-12-06, docs/PERF.md, µs a dispatch at 8 / 16 columns): up to 1,024 rows ROWS 1 (attn_v's Q5_K 512
 * rows 8.7 / 13.0 against 10.9 / 16.6 at ROWS 2; the shared expert's 1,024 rows 8.9 / 14.2 against 9.6 / 15.5),
 * the LM head over more than 8 columns ROWS 3 (494 against 572 µs at 16 columns; 315 at both at 8), else
 * {@linkcode MATVEC_Q8B_ROWS}. Not ROWS 4 for the 8,192-row in-projections, though the H100's sweep of the
 * kernel alone favoured it (24.4 against 25.6 µs at 16 columns): in whole steps on an H200 (2026-12-06) it
 * cost 16 slots 1,153-1,163 tok/s against 1,222-1,232 at ROWS 2 (in_proj 1.65 against 1.03 ms a step).
 */
export function matvecQ8bRows(shape: Pick<MatvecQ8bShape, "n" | "cols">): number {
  if (shape.n <= 1024) return 1;
  if (shape.n >= 65536 && shape.cols > 8) return 3;
  return MATVEC_Q8B_ROWS;
}

/** The ggml type ids whose chunks' dot products take x's sums (Q4_K, Q5_K, Q6_K): XSUM applies. */
const XSUM_TYPES = [12, 13, 14];

/**
 * The variant whose columns have matvec_q8's bits: TEAM and RED of matvec_q8's default for the same rows
 * (or `opts.team`, `opts.red`, the ones the solo dispatch took), ROWS {@linkcode matvecQ8bRows} unless asked
 * (fewer where its partials would not fit `opts.maxWorkgroupBytes`, the device's limit; default the WebGPU
 * default, 16,384), and for the K-quants XSUM where its sums fit too, or as `opts.xsum` says.
 */
export function matvecQ8bConstants(
  shape: MatvecQ8bShape,
  opts: {
    acc?: boolean;
    team?: number;
    red?: number;
    rows?: number;
    xsum?: boolean;
    maxWorkgroupBytes?: number;
  } = {},
): MatvecQ8bConstants {
  const solo = matvecQ8Constants(shape, { team: opts.team, red: opts.red });
  const limit = opts.maxWorkgroupBytes ?? 16384;
  const c = {
    TYPE: solo.TYPE,
    TEAM: solo.TEAM,
    ROWS: opts.rows ?? matvecQ8bRows(shape),
    BATCH: shape.cols,
    ACC: opts.acc ? 1 : 0,
    RED: solo.RED,
    XSUM: 0,
  };
  // The bits do not depend on ROWS: a device with less workgroup memory takes fewer.
  while (opts.rows === undefined && c.ROWS > 1 && matvecQ8bWorkgroupBytes(c) > limit) c.ROWS--;
  const xsum = { ...c, XSUM: shape.k / 32 };
  const fits = matvecQ8bWorkgroupBytes(xsum) <= limit;
  return XSUM_TYPES.includes(c.TYPE) && (opts.xsum ?? fits) ? xsum : c;
}

/**
 * Workgroup memory of a matvec_q8b variant in bytes (the codebook table, four columns' partials and the
 * columns' x sums).
 */
export function matvecQ8bWorkgroupBytes(c: MatvecQ8bConstants): number {
  return 1024 + 4096 * c.ROWS + 8 * (c.XSUM * c.BATCH + 1);
}

/** The uniform params of a matvec_q8b shape. */
export function matvecQ8bParams(shape: MatvecQ8bShape): Uint32Array<ArrayBuffer> {
  const rowBytes = checkWeightRows("matvec_q8b", shape.type, shape.k, shape.wOffsetBytes ?? 0);
  return new Uint32Array([
    shape.k,
    shape.n,
    rowBytes,
    shape.wOffsetBytes ?? 0,
    shape.yOffset ?? 0,
    shape.yStride ?? shape.n,
    (shape.xStrideBytes ?? q8xBytes(shape.k)) / 4,
    0,
  ]);
}

/** Workgroups in x and y: rows split into workgroups, the count folded into 2-D past 65535. */
export function matvecQ8bGrid(shape: MatvecQ8bShape, c: MatvecQ8bConstants): [number, number] {
  const wgs = Math.ceil(shape.n / ((256 / c.TEAM) * c.ROWS));
  const gx = Math.min(wgs, MAX_WORKGROUPS_PER_DIM);
  return [gx, Math.ceil(wgs / gx)];
}

/**
 * Throws before anything is encoded when the shape, constants and bindings do not fit together.
 * @throws {RangeError} naming the kernel, the value and what to change
 */
export function checkMatvecQ8b(shape: MatvecQ8bShape, c: MatvecQ8bConstants, b: MatvecQ8bBindings): void {
  const kernel = "matvec_q8b";
  const rowBytes = checkQ8Rows(kernel, shape, c);
  const wOff = shape.wOffsetBytes ?? 0;
  checkInt(`Kernel ${kernel}: ROWS`, c.ROWS, 1, 4);
  checkInt(`Kernel ${kernel}: BATCH`, c.BATCH, 1, MATVEC_Q8B_MAX_BATCH);
  checkShape(
    c.XSUM === 0 || (XSUM_TYPES.includes(c.TYPE) && c.XSUM === shape.k / 32),
    `Kernel ${kernel}: XSUM=${c.XSUM} must be 0, or K/32 = ${shape.k / 32} with Q4_K, Q5_K or Q6_K weights`,
  );
  checkShape(
    c.BATCH === shape.cols,
    `Kernel ${kernel}: BATCH=${c.BATCH} but the shape has ${shape.cols} columns`,
  );
  const yOff = shape.yOffset ?? 0;
  const yStride = shape.yStride ?? shape.n;
  checkShape(
    Number.isInteger(yOff) && yOff >= 0 && Number.isInteger(yStride) && yStride >= shape.n,
    `Kernel ${kernel}: y offset ${yOff} must be ≥ 0 and the y stride ${yStride} ≥ N=${shape.n}`,
  );
  const xStride = shape.xStrideBytes ?? q8xBytes(shape.k);
  checkShape(
    Number.isInteger(xStride) && xStride % 16 === 0 && xStride >= q8xBytes(shape.k),
    `Kernel ${kernel}: x stride ${xStride} bytes must be a multiple of 16 (quad loads), ≥ ${
      q8xBytes(shape.k)
    } (K=${shape.k}; quantize_q8's packing has such a stride where K % 128 == 0): pad the columns`,
  );
  const [gx, gy] = matvecQ8bGrid(shape, c);
  checkShape(
    gy <= MAX_WORKGROUPS_PER_DIM,
    `Kernel ${kernel}: N=${shape.n} needs ${gx}×${gy} workgroups: split it`,
  );
  const need = (what: string, bind: Binding, bytes: number) =>
    checkShape(
      bindingBytes(bind) >= bytes,
      `Kernel ${kernel}: binding ${what} holds ${
        bindingBytes(bind)
      } bytes but ${shape.type} ne=[${shape.k}, ` +
        `${shape.n}] × ${shape.cols} columns needs ${bytes}: allocate or slice it for this shape`,
    );
  need("params", b.params, MATVEC_Q8B_PARAMS_BYTES);
  need("weights", b.weights, Math.ceil((wOff + shape.n * rowBytes) / 4) * 4);
  need("xq", b.xq, (shape.cols - 1) * xStride + q8xBytes(shape.k));
  need("y", b.y, 4 * (yOff + (shape.cols - 1) * yStride + shape.n));
}

/**
 * Checks the problem, compiles (or reuses) its variant and builds its bind group.
 * @throws {RangeError} from {@linkcode checkMatvecQ8b}
 */
export async function prepareMatvecQ8b(
  cache: PipelineCache,
  opts: {
    device: GPUDevice;
    shape: MatvecQ8bShape;
    bindings: MatvecQ8bBindings;
    constants?: MatvecQ8bConstants;
  },
): Promise<Q8Op> {
  const c = opts.constants ?? matvecQ8bConstants(opts.shape);
  checkMatvecQ8b(opts.shape, c, opts.bindings);
  checkWorkgroupBytes(
    opts.device,
    `Kernel matvec_q8b: ROWS=${c.ROWS}`,
    matvecQ8bWorkgroupBytes(c),
    "use ROWS 1, or XSUM 0",
  );
  const pipeline = await cache.get(MATVEC_Q8B, c);
  const b = opts.bindings;
  return {
    pipeline,
    bindGroup: bindGroup(opts.device, pipeline, [b.params, b.weights, b.weights, b.xq, b.xq, b.y]),
    grid: matvecQ8bGrid(opts.shape, c),
  };
}
