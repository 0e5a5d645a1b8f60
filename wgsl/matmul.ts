/**
 * Twin of `matmul.wgsl`: prefill product `Y[m][n] = Σ_k W[n][k]·X[m][k]` for any M ≥ 1 tokens and any N,
 * reading packed weights of any supported type straight from their GGUF block bytes (same raw layout as
 * `matvec.ts`, no repacking): tiles of 16·TR rows × 16·TT tokens, TR × TT per invocation, weights
 * dequantized into f32 workgroup memory per 32-element chunk, f32 accumulation.
 *
 * Uniform `Params` (48 bytes, 12 × u32, in struct order): 0 k, 4 n, 8 m, 12 row_bytes, 16 w_off (bytes),
 * 20 x_off, 24 y_off, 28 x_stride, 32 y_stride (elements), 36 chunks_per_split, 40 split_stride, 44 padding.
 * Bindings: 0 params, 1 weights, 2 x, 3 y.
 *
 * Split K (`splits` > 1): grid z workgroups each sum a run of the K / 32 chunks into a partial product, and
 * `matmul_splits.wgsl` ({@linkcode MATMUL_SPLITS}) adds them into Y. It is for small N, where a few
 * workgroups would each step through every chunk in turn (docs/PERF.md: 0.27-0.34 ms for N ≤ 257 unsplit).
 *
 * The grouped expert passes of a prefill chunk have a kernel of their own (`moe_matmul.ts`).
 * @module
 */
import { bindGroup, type Binding, type KernelSpec, type PipelineCache } from "./kernel.ts";
import { type GgmlTypeName, TYPE_ID } from "../engine/quant/types.ts";
import { bindingBytes, checkInt, checkShape, checkWorkgroupBytes, MAX_WORKGROUPS_PER_DIM } from "./_twin.ts";
import { checkWeightRows, QUANT_LIBS } from "./_quant.ts";

/** Kernel description of `matmul.wgsl`. */
export const MATMUL: KernelSpec = {
  name: "matmul",
  url: new URL("./matmul.wgsl", import.meta.url),
  lib: QUANT_LIBS,
  constants: { TYPE: "u32", TR: "u32", TT: "u32" },
};

/** Constants of one matmul variant. */
export type MatmulConstants = {
  /** ggml type id of the weights. */
  readonly TYPE: number;
  /** Rows per invocation (4 or 8): the tile has 16·TR rows. */
  readonly TR: number;
  /** Tokens per invocation (4 or 8): the tile has 16·TT tokens. */
  readonly TT: number;
};

/** Size of the uniform params block in bytes. */
export const MATMUL_PARAMS_BYTES = 48;

/** Rows or tokens per invocation a variant may take. */
export const MATMUL_THREAD_TILES: readonly number[] = [4, 8];

/** One matmul problem: W ne=[k, n] of `type`, X ne=[k, m], Y ne=[n, m], as slices of bindings. */
export interface MatmulShape {
  /** Weight type. */
  readonly type: GgmlTypeName;
  /** Row length K (a multiple of 32 and of the type's block). */
  readonly k: number;
  /** Rows N. */
  readonly n: number;
  /** Tokens M. */
  readonly m: number;
  /** Byte offset of row 0 in the weight binding (multiple of 4; default 0). */
  readonly wOffsetBytes?: number;
  /** Element offset of X[0][0] in the x binding (multiple of 4; default 0). */
  readonly xOffset?: number;
  /** Element offset of Y[0][0] in the y binding (default 0). */
  readonly yOffset?: number;
  /** Elements between tokens in x (multiple of 4, ≥ k; default k). */
  readonly xStride?: number;
  /** Elements between tokens in y (≥ n; default n). */
  readonly yStride?: number;
  /**
   * Runs of K to sum apart (default 1). Above 1, binding y is the dense partial product [N, M, splits] (see
   * {@linkcode matmulSplits}), and `yOffset`/`yStride` are not allowed: they belong to matmul_splits' Y.
   */
  readonly splits?: number;
}

/** Workgroups from which 8 × 8 per invocation beats 4 × 4 (H200, 132 SMs: docs/PERF.md). */
export const MATMUL_WIDE_MIN_WORKGROUPS = 128;

/**
 * The split of a shape: chunks per run and the runs (grid z). Every run has at least one chunk, so the runs
 * may be fewer than `shape.splits`.
 */
export function matmulSplits(shape: MatmulShape): { chunksPerSplit: number; splits: number } {
  const chunks = shape.k / 32;
  const chunksPerSplit = Math.ceil(chunks / Math.max(1, Math.min(shape.splits ?? 1, chunks)));
  return { chunksPerSplit, splits: Math.ceil(chunks / chunksPerSplit) };
}

/**
 * Workgroups of 4 × 4 tiles from which a shape runs unsplit. H100, 2026-12-05 (`bench/matmul.ts --m 256
 * --splits 2,4,8`, docs/PERF.md): ssm_out [4096, 2048] at 256 tokens (128 tiles) 0.467 ms unsplit against
 * 0.321 in 2 runs of K; attn_gate [2048, 4096] (256 tiles) 0.320 unsplit against 0.343 in 2.
 */
export const MATMUL_SPLIT_BELOW_TILES = 256;

/** Splits the engine takes: enough runs for 256 workgroups where the 4 × 4 tiles give fewer. */
export function matmulDefaultSplits(shape: MatmulShape): number {
  const tiles = Math.ceil(shape.n / 64) * Math.ceil(shape.m / 64);
  return tiles >= MATMUL_SPLIT_BELOW_TILES ? 1 : Math.min(shape.k / 32, Math.ceil(256 / tiles));
}

/** The bindings in binding order. */
export interface MatmulBindings {
  /** Uniform params (MATMUL_PARAMS_BYTES, from {@linkcode matmulParams}); offset a multiple of 256. */
  readonly params: Binding;
  /** Weight bytes (storage, read). */
  readonly weights: Binding;
  /** Input tokens, f32 (storage, read). */
  readonly x: Binding;
  /** Output, f32 (storage, read_write). */
  readonly y: Binding;
}

/** A checked, ready-to-encode matmul: pipeline, bind group and grid. */
export interface MatmulOp {
  /** The variant's pipeline. */
  readonly pipeline: GPUComputePipeline;
  /** Bind group 0. */
  readonly bindGroup: GPUBindGroup;
  /** Workgroups in x (row tiles), y (token tiles) and z (runs of K). */
  readonly grid: readonly [number, number, number];
}

/** Workgroup memory of a variant in bytes: the f32 tiles, and the IQ4 codebook table. */
export function matmulWorkgroupBytes(c: MatmulConstants): number {
  const iq4 = c.TYPE === TYPE_ID.IQ4_XS || c.TYPE === TYPE_ID.IQ4_NL;
  return 2048 * (c.TR + c.TT) + (iq4 ? 2048 : 0);
}

/**
 * The variant of a shape: TR × TT per invocation, `tile` where given. Else 8 × 8 where that still gives
 * {@linkcode MATMUL_WIDE_MIN_WORKGROUPS} workgroups and fits in `maxWorkgroupBytes` (the device's
 * `maxComputeWorkgroupStorageSize`; WebGPU's guaranteed 16384 if omitted), and 4 × 4 otherwise: on the H200
 * 8 × 8 took 0.48 against 0.63 ms for attn_qkv (128 workgroups) and 0.45 against 0.32 ms for attn_gate
 * (64); 4 × 8 and 8 × 4 were never the fastest.
 */
export function matmulConstants(
  shape: MatmulShape,
  opts: { maxWorkgroupBytes?: number; tile?: readonly [number, number] } = {},
): MatmulConstants {
  const TYPE = TYPE_ID[shape.type];
  if (opts.tile) return { TYPE, TR: opts.tile[0], TT: opts.tile[1] };
  const wide = { TYPE, TR: 8, TT: 8 };
  const workgroups = Math.ceil(shape.n / 128) * Math.ceil(shape.m / 128);
  if (
    workgroups >= MATMUL_WIDE_MIN_WORKGROUPS &&
    matmulWorkgroupBytes(wide) <= (opts.maxWorkgroupBytes ?? 16384)
  ) {
    return wide;
  }
  return { TYPE, TR: 4, TT: 4 };
}

/** The uniform params of `shape` (write them at a 256-byte-aligned offset of a uniform buffer). */
export function matmulParams(shape: MatmulShape): Uint32Array<ArrayBuffer> {
  const rowBytes = checkWeightRows("matmul", shape.type, shape.k, shape.wOffsetBytes ?? 0);
  return new Uint32Array([
    shape.k,
    shape.n,
    shape.m,
    rowBytes,
    shape.wOffsetBytes ?? 0,
    shape.xOffset ?? 0,
    shape.yOffset ?? 0,
    shape.xStride ?? shape.k,
    shape.yStride ?? shape.n,
    matmulSplits(shape).chunksPerSplit,
    shape.n * shape.m,
    0,
  ]);
}

/** Workgroups: row tiles in x, token tiles in y, runs of K in z. */
export function matmulGrid(shape: MatmulShape, c: MatmulConstants): [number, number, number] {
  return [Math.ceil(shape.n / (16 * c.TR)), Math.ceil(shape.m / (16 * c.TT)), matmulSplits(shape).splits];
}

/**
 * Throws before anything is encoded when the shape, constants and bindings do not fit together.
 * @throws {RangeError} naming the kernel, the value and what to change
 */
export function checkMatmul(shape: MatmulShape, c: MatmulConstants, b: MatmulBindings): void {
  const rowBytes = checkWeightRows("matmul", shape.type, shape.k, shape.wOffsetBytes ?? 0);
  checkShape(
    c.TYPE === TYPE_ID[shape.type],
    `Kernel matmul: TYPE=${c.TYPE} but the shape says ${shape.type}`,
  );
  for (const [name, v] of [["TR", c.TR], ["TT", c.TT]] as const) {
    checkShape(
      MATMUL_THREAD_TILES.includes(v),
      `Kernel matmul: ${name}=${v} must be one of ${MATMUL_THREAD_TILES.join(", ")}`,
    );
  }
  checkInt("Kernel matmul: n", shape.n, 1, 2 ** 31);
  checkInt("Kernel matmul: m", shape.m, 1, 2 ** 31);
  const xOff = shape.xOffset ?? 0;
  const xStride = shape.xStride ?? shape.k;
  const yOff = shape.yOffset ?? 0;
  const yStride = shape.yStride ?? shape.n;
  checkShape(
    Number.isInteger(xOff) && xOff >= 0 && xOff % 4 === 0 && Number.isInteger(xStride) &&
      xStride >= shape.k &&
      xStride % 4 === 0,
    `Kernel matmul: x offset ${xOff} and stride ${xStride} must be multiples of 4 (vec4 loads), stride ≥ K=${shape.k}`,
  );
  checkShape(
    Number.isInteger(yOff) && yOff >= 0 && Number.isInteger(yStride) && yStride >= shape.n,
    `Kernel matmul: y offset ${yOff} must be ≥ 0 and stride ${yStride} ≥ N=${shape.n}`,
  );
  const split = (shape.splits ?? 1) > 1;
  checkShape(
    !split || (shape.yOffset === undefined && shape.yStride === undefined),
    `Kernel matmul: with splits=${shape.splits} y is the dense partial product; give yOffset/yStride to ` +
      `matmul_splits instead`,
  );
  checkInt("Kernel matmul: splits", shape.splits ?? 1, 1, 65535);
  const [gx, gy] = matmulGrid(shape, c);
  checkShape(
    gx <= MAX_WORKGROUPS_PER_DIM && gy <= MAX_WORKGROUPS_PER_DIM,
    `Kernel matmul: N=${shape.n}, M=${shape.m} need ${gx}×${gy} workgroups (each ≤ 65535): split the problem`,
  );
  const need = (what: string, bind: Binding, bytes: number) =>
    checkShape(
      bindingBytes(bind) >= bytes,
      `Kernel matmul: binding ${what} holds ${bindingBytes(bind)} bytes but ${shape.type} ne=[${shape.k}, ` +
        `${shape.n}] with M=${shape.m} needs ${bytes}: allocate or slice it for this shape`,
    );
  need("params", b.params, MATMUL_PARAMS_BYTES);
  need("weights", b.weights, Math.ceil(((shape.wOffsetBytes ?? 0) + shape.n * rowBytes) / 4) * 4);
  need("x", b.x, 4 * (xOff + (shape.m - 1) * xStride + shape.k));
  need(
    "y",
    b.y,
    4 * (split ? matmulSplits(shape).splits * shape.m * shape.n : yOff + (shape.m - 1) * yStride + shape.n),
  );
}

/**
 * Checks the problem, compiles (or reuses) its variant and builds its bind group.
 * @throws {RangeError} from {@linkcode checkMatmul}
 */
export async function prepareMatmul(
  cache: PipelineCache,
  opts: { device: GPUDevice; shape: MatmulShape; bindings: MatmulBindings; constants?: MatmulConstants },
): Promise<MatmulOp> {
  const max = opts.device.limits.maxComputeWorkgroupStorageSize;
  const c = opts.constants ?? matmulConstants(opts.shape, { maxWorkgroupBytes: max });
  checkMatmul(opts.shape, c, opts.bindings);
  checkWorkgroupBytes(
    opts.device,
    `Kernel matmul TR=${c.TR} TT=${c.TT}`,
    matmulWorkgroupBytes(c),
    "take a smaller TR or TT",
  );
  const pipeline = await cache.get(MATMUL, c);
  const b = opts.bindings;
  return {
    pipeline,
    bindGroup: bindGroup(opts.device, pipeline, [b.params, b.weights, b.x, b.y]),
    grid: matmulGrid(opts.shape, c),
  };
}

/** Records one matmul dispatch into a caller-owned compute pass. */
export function encodeMatmul(pass: GPUComputePassEncoder, op: MatmulOp): void {
  pass.setPipeline(op.pipeline);
  pass.setBindGroup(0, op.bindGroup);
  pass.dispatchWorkgroups(op.grid[0], op.grid[1], op.grid[2]);
}

/** Kernel description of `matmul_splits.wgsl`: Y = the sum of a split-K matmul's partial products. */
export const MATMUL_SPLITS: KernelSpec = {
  name: "matmul_splits",
  url: new URL("./matmul_splits.wgsl", import.meta.url),
  lib: [],
  constants: {},
};

/** Size of matmul_splits' uniform params in bytes. */
export const MATMUL_SPLITS_PARAMS_BYTES = 32;

/** matmul_splits' params for `shape` (its N, M, runs, and the Y offset and stride). */
export function matmulSplitsParams(shape: MatmulShape): Uint32Array<ArrayBuffer> {
  return new Uint32Array([
    shape.n,
    shape.m,
    matmulSplits(shape).splits,
    shape.yOffset ?? 0,
    shape.yStride ?? shape.n,
    0,
    0,
    0,
  ]);
}

/**
 * How the engine runs one matmul: its constants, the matmul's params and grid, and for small N
 * ({@linkcode matmulDefaultSplits}) the split: the matmul then writes `sum.partBytes` of partial products
 * into a scratch binding, and matmul_splits (`sum.params`, `sum.grid`) adds them into Y at the shape's own
 * offset and stride.
 */
export function matmulPlan(shape: MatmulShape, maxWorkgroupBytes: number): {
  constants: MatmulConstants;
  params: Uint32Array<ArrayBuffer>;
  grid: [number, number, number];
  sum?: { params: Uint32Array<ArrayBuffer>; grid: [number, number, number]; partBytes: number };
} {
  const constants = matmulConstants(shape, { maxWorkgroupBytes });
  const splits = matmulDefaultSplits(shape);
  if (splits === 1) return { constants, params: matmulParams(shape), grid: matmulGrid(shape, constants) };
  const split: MatmulShape = { ...shape, yOffset: undefined, yStride: undefined, splits };
  const sum: MatmulShape = { ...shape, splits };
  return {
    constants,
    params: matmulParams(split),
    grid: matmulGrid(split, constants),
    sum: {
      params: matmulSplitsParams(sum),
      grid: matmulSplitsGrid(sum),
      partBytes: 4 * matmulSplits(split).splits * shape.n * shape.m,
    },
  };
}

/** matmul_splits' grid: one invocation per element of Y, 2-D past 65535 workgroups. */
export function matmulSplitsGrid(shape: MatmulShape): [number, number, number] {
  const wg = Math.ceil((shape.n * shape.m) / 256);
  return wg <= MAX_WORKGROUPS_PER_DIM
    ? [wg, 1, 1]
    : [MAX_WORKGROUPS_PER_DIM, Math.ceil(wg / MAX_WORKGROUPS_PER_DIM), 1];
}
