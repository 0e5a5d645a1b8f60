/**
 * Twin of `moe_matmul.wgsl`: the expert passes of a prefill chunk as grouped matmuls over the lists
 * `moe_group.wgsl` writes, each expert's weights read once per tile of TT (16, 32 or 64) of its tokens instead
 * of once per token column (moe_matvec). Tiles are 256 weight rows (gate·up: 128 gate rows and the same up
 * rows, written as silu(gate)·up) × TT tokens; grid y runs over every group's token tiles in group order.
 *
 * Uniform `Params` (64 bytes, 16 × u32, in struct order): 0 k, 4 n, 8 row_bytes, 12 w_off, 16 w_off_up,
 * 20 expert_bytes (bytes), 24 x_stride, 28 y_stride (elements), 32 cap, 36 x_div, 40 n_groups, 44 n_routed,
 * 48 shared_x0, then padding. Bindings: 0 params, 1 weights, 2 x, 3 y, 4 groups.
 * @module
 */
import { bindGroup, type Binding, type KernelSpec, type PipelineCache } from "./kernel.ts";
import { type GgmlTypeName, TYPE_ID } from "../engine/quant/types.ts";
import { bindingBytes, checkInt, checkShape, checkWorkgroupBytes, MAX_WORKGROUPS_PER_DIM } from "./_twin.ts";
import { checkWeightRows, QUANT_LIBS } from "./_quant.ts";

/** Kernel description of `moe_matmul.wgsl`. */
export const MOE_MATMUL: KernelSpec = {
  name: "moe_matmul",
  url: new URL("./moe_matmul.wgsl", import.meta.url),
  lib: [...QUANT_LIBS, "group_tiles"],
  constants: { TYPE: "u32", GATE_UP: "bool", UNITS: "u32", TT: "u32" },
};

/** Constants of one grouped-matmul variant. */
export type GroupedMatmulConstants = {
  /** ggml type id of the weights. */
  readonly TYPE: number;
  /** Gate·up: 128 gate and 128 up rows per tile, Y = silu(gate)·up. */
  readonly GATE_UP: boolean;
  /** Units of 8 row positions staged per step: 4 (a whole 32-element chunk) or 2 (half the memory). */
  readonly UNITS: number;
  /** Tokens per tile: 16, 32 or 64 ({@linkcode GROUPED_MATMUL_TILE_TOKENS}). */
  readonly TT: number;
};

/** Bytes of the uniform params. */
export const GROUPED_MATMUL_PARAMS_BYTES = 64;

/** The token-tile widths the kernel takes. */
export const GROUPED_MATMUL_TILE_TOKENS: readonly number[] = [16, 32, 64];

/** Most groups one pass takes (each of the 256 invocations sums four groups' tile counts). */
export const GROUPED_MATMUL_MAX_GROUPS = 1024;

/**
 * The experts of one MoE pass over a prefill chunk, grouped by `moe_group.wgsl`: for group e,
 * Y[col] = W_e · x[xc] for each column col of its list, where W_e starts at byte `wOffsetBytes` +
 * e·`expertBytes` and xc = col / `xDiv` for routed columns (col < `nRouted`), col − nRouted + `sharedX0`
 * for the shared expert's (group nExpert, packed right after the routed experts). With `upOffsetBytes`
 * the pass is gate·up: W_e is the gate and Y gets silu(gate·x)·(up·x).
 */
export interface GroupedMatmulShape {
  /** Weight type. */
  readonly type: GgmlTypeName;
  /** Row length K (a multiple of 32). */
  readonly k: number;
  /** Rows N per expert (gate rows for gate·up). */
  readonly n: number;
  /** Groups: the routed experts, plus one for the shared expert. */
  readonly nGroups: number;
  /** Whether the last group is the shared expert's (columns nRouted + t, t < cap). */
  readonly shared: boolean;
  /** Most columns in a group: the chunk's tokens. */
  readonly cap: number;
  /** Routed columns (tokens × experts used). */
  readonly nRouted: number;
  /** Routed column col reads x row col / xDiv. */
  readonly xDiv: number;
  /** The shared expert's column nRouted + t reads x row sharedX0 + t. */
  readonly sharedX0: number;
  /** Byte offset of expert 0's matrix (its gate with upOffsetBytes). */
  readonly wOffsetBytes: number;
  /** Gate·up: byte offset of expert 0's up matrix. */
  readonly upOffsetBytes?: number;
  /** Bytes from one expert's matrix to the next. */
  readonly expertBytes: number;
  /** Elements between x rows (multiple of 4, ≥ k). */
  readonly xStride: number;
  /** Elements between Y columns (≥ n). */
  readonly yStride: number;
}

/** The bindings in binding order. */
export interface GroupedMatmulBindings {
  /** Uniform params ({@linkcode groupedMatmulParams}); offset a multiple of 256. */
  readonly params: Binding;
  /** Weight bytes (storage, read). */
  readonly weights: Binding;
  /** Input rows, f32 (storage, read). */
  readonly x: Binding;
  /** Output, f32 (storage, read_write). */
  readonly y: Binding;
  /** moe_group's counts and lists (u32, storage, read). */
  readonly groups: Binding;
}

/** A checked, ready-to-encode grouped matmul: pipeline, bind group and grid. */
export interface GroupedMatmulOp {
  /** The variant's pipeline. */
  readonly pipeline: GPUComputePipeline;
  /** Bind group 0. */
  readonly bindGroup: GPUBindGroup;
  /** Workgroups in x (row tiles) and y (a bound on the groups' token tiles). */
  readonly grid: readonly [number, number, number];
}

/** Workgroup memory of a variant in bytes: the f32 tiles, the prefix sum, and the IQ4 codebook table. */
export function groupedMatmulWorkgroupBytes(c: GroupedMatmulConstants): number {
  const iq4 = c.TYPE === TYPE_ID.IQ4_XS || c.TYPE === TYPE_ID.IQ4_NL;
  return 8192 * c.UNITS + 32 * c.TT * c.UNITS + 1032 + (iq4 ? 2048 : 0);
}

/** Whether some variant of `type` fits `maxWorkgroupBytes` of workgroup memory (UNITS 2: 20 KiB at most). */
export function groupedMatmulFits(type: GgmlTypeName, maxWorkgroupBytes: number): boolean {
  return groupedMatmulWorkgroupBytes({ TYPE: TYPE_ID[type], GATE_UP: false, UNITS: 2, TT: 16 }) <=
    maxWorkgroupBytes;
}

/**
 * The variant of a pass: half chunks per step (UNITS 2). Whole chunks (UNITS 4, 37 KiB) are slower on the
 * H200 at 35B-A3B shapes (docs/PERF.md): twice the workgroup memory halves the workgroups an SM holds.
 * Token tiles by the routed experts' mean column count: 16 up to 8 columns, 32 below 32, else 64. On the
 * H200 (docs/PERF.md) 32-token tiles beat 16 even at 16 columns per expert (512-token chunks), and 64 wins
 * from 32 columns on (2x the 16-token tiles at 2,048-token chunks).
 */
export function groupedMatmulConstants(shape: GroupedMatmulShape): GroupedMatmulConstants {
  const routedGroups = Math.max(1, shape.nGroups - (shape.shared ? 1 : 0));
  const mean = shape.nRouted / routedGroups;
  const TT = mean <= 8 ? 16 : mean < 32 ? 32 : 64;
  return { TYPE: TYPE_ID[shape.type], GATE_UP: shape.upOffsetBytes !== undefined, UNITS: 2, TT };
}

/** The uniform params of a pass (write them at a 256-byte-aligned offset of a uniform buffer). */
export function groupedMatmulParams(shape: GroupedMatmulShape): Uint32Array<ArrayBuffer> {
  const rowBytes = checkWeightRows("moe_matmul", shape.type, shape.k, shape.wOffsetBytes);
  return new Uint32Array([
    shape.k,
    shape.n,
    rowBytes,
    shape.wOffsetBytes,
    shape.upOffsetBytes ?? 0,
    shape.expertBytes,
    shape.xStride,
    shape.yStride,
    shape.cap,
    shape.xDiv,
    shape.nGroups,
    shape.nRouted,
    shape.sharedX0,
    0,
    0,
    0,
  ]);
}

/**
 * Grid: row tiles in x; in y a bound on the groups' TT-token tiles, Σ ceil(count_e / TT) ≤ columns / TT +
 * groups (workgroups past the last tile return at once).
 */
export function groupedMatmulGrid(
  shape: GroupedMatmulShape,
  c: GroupedMatmulConstants,
): [number, number, number] {
  const cols = shape.nRouted + (shape.shared ? shape.cap : 0);
  return [Math.ceil(shape.n / (c.GATE_UP ? 128 : 256)), Math.floor(cols / c.TT) + shape.nGroups, 1];
}

/**
 * Throws before encoding when a pass and its bindings do not fit together.
 * @throws {RangeError} naming the value or binding and what it needs
 */
export function checkGroupedMatmul(
  shape: GroupedMatmulShape,
  c: GroupedMatmulConstants,
  b: GroupedMatmulBindings,
): void {
  checkShape(c.TYPE === TYPE_ID[shape.type], `Kernel moe_matmul: TYPE=${c.TYPE} is not ${shape.type}`);
  checkShape(
    c.GATE_UP === (shape.upOffsetBytes !== undefined),
    "Kernel moe_matmul: GATE_UP goes with upOffsetBytes",
  );
  checkShape(c.UNITS === 2 || c.UNITS === 4, `Kernel moe_matmul: UNITS=${c.UNITS} must be 2 or 4`);
  checkShape(
    GROUPED_MATMUL_TILE_TOKENS.includes(c.TT),
    `Kernel moe_matmul: TT=${c.TT} must be one of ${GROUPED_MATMUL_TILE_TOKENS.join(", ")}`,
  );
  checkGroupedPass("moe_matmul", shape, b);
  const grid = groupedMatmulGrid(shape, c);
  checkShape(
    grid[1] <= MAX_WORKGROUPS_PER_DIM,
    `Kernel moe_matmul: ${
      grid[1]
    } token tiles exceed ${MAX_WORKGROUPS_PER_DIM} workgroups: use a smaller chunk`,
  );
}

/**
 * The checks of a grouped pass's shape and bindings that do not depend on the kernel's constants (moe_matmul
 * and moe_gmv take the same params, bindings and output).
 * @throws {RangeError} naming the kernel, the value or binding and what it needs
 */
export function checkGroupedPass(kernel: string, shape: GroupedMatmulShape, b: GroupedMatmulBindings): void {
  const rowBytes = checkWeightRows(kernel, shape.type, shape.k, shape.wOffsetBytes);
  checkInt(`Kernel ${kernel}: n`, shape.n, 1, 2 ** 24);
  checkInt(`Kernel ${kernel}: cap`, shape.cap, 1, 2 ** 24);
  checkInt(`Kernel ${kernel}: nGroups`, shape.nGroups, 1, GROUPED_MATMUL_MAX_GROUPS);
  checkInt(`Kernel ${kernel}: xDiv`, shape.xDiv, 1, 2 ** 16);
  checkShape(
    shape.xStride >= shape.k && shape.xStride % 4 === 0 && shape.yStride >= shape.n,
    `Kernel ${kernel}: x stride ${shape.xStride} must be a multiple of 4 ≥ K=${shape.k}, y stride ` +
      `${shape.yStride} ≥ N`,
  );
  checkShape(
    Number.isInteger(shape.expertBytes) && shape.expertBytes >= shape.n * rowBytes &&
      (shape.upOffsetBytes ?? 0) % 4 === 0,
    `Kernel ${kernel}: expertBytes ${shape.expertBytes} must hold N=${shape.n} rows of ${rowBytes} bytes, ` +
      `and the up offset be a multiple of 4`,
  );
  const cols = shape.nRouted + (shape.shared ? shape.cap : 0);
  const xRows = Math.max(
    Math.ceil(shape.nRouted / shape.xDiv),
    shape.shared ? shape.sharedX0 + shape.cap : 0,
  );
  const need = (what: string, bind: Binding | undefined, bytes: number) =>
    checkShape(
      bind !== undefined && bindingBytes(bind) >= bytes,
      `Kernel ${kernel}: binding ${what} holds ${bind ? bindingBytes(bind) : 0} bytes but needs ${bytes}`,
    );
  need("params", b.params, GROUPED_MATMUL_PARAMS_BYTES);
  const wEnd = Math.max(shape.wOffsetBytes, shape.upOffsetBytes ?? 0) + shape.nGroups * shape.expertBytes;
  need("weights", b.weights, wEnd);
  need("x", b.x, 4 * (xRows - 1) * shape.xStride + 4 * shape.k);
  need("y", b.y, 4 * ((cols - 1) * shape.yStride + shape.n));
  need("groups", b.groups, 4 * shape.nGroups * (1 + shape.cap));
}

/**
 * Checks a pass, compiles (or reuses) its variant and builds its bind group.
 * @throws {RangeError} from {@linkcode checkGroupedMatmul}, or when the variant's workgroup memory exceeds
 *   the device's
 */
export async function prepareGroupedMatmul(
  cache: PipelineCache,
  opts: {
    device: GPUDevice;
    shape: GroupedMatmulShape;
    bindings: GroupedMatmulBindings;
    constants?: GroupedMatmulConstants;
  },
): Promise<GroupedMatmulOp> {
  const c = opts.constants ?? groupedMatmulConstants(opts.shape);
  checkGroupedMatmul(opts.shape, c, opts.bindings);
  checkWorkgroupBytes(
    opts.device,
    `Kernel moe_matmul UNITS=${c.UNITS} TT=${c.TT}`,
    groupedMatmulWorkgroupBytes(c),
    "take UNITS=2 or use moe_matvec",
  );
  const pipeline = await cache.get(MOE_MATMUL, c);
  const b = opts.bindings;
  return {
    pipeline,
    bindGroup: bindGroup(opts.device, pipeline, [b.params, b.weights, b.x, b.y, b.groups]),
    grid: groupedMatmulGrid(opts.shape, c),
  };
}

/** Records one grouped matmul dispatch into a caller-owned compute pass. */
export function encodeGroupedMatmul(pass: GPUComputePassEncoder, op: GroupedMatmulOp): void {
  pass.setPipeline(op.pipeline);
  pass.setBindGroup(0, op.bindGroup);
  pass.dispatchWorkgroups(op.grid[0], op.grid[1], op.grid[2]);
}
