/**
 * Twin of `moe_gmv.wgsl`: the expert passes of a thin prefill chunk (a few tokens per expert) as grouped
 * mat-vecs over the lists `moe_group.wgsl` writes. Same shape, params, bindings and output as
 * `moe_matmul.ts` (so the engine picks either per chunk), but each workgroup takes CT ≤ 8 columns of one group
 * and decodes each weight unit once for all of them, where moe_matmul decodes into tiles of 16+ tokens that a
 * thin chunk leaves mostly empty.
 * @module
 */
import { bindGroup, type KernelSpec, type PipelineCache } from "./kernel.ts";
import { TYPE_ID } from "../engine/quant/types.ts";
import { checkInt, checkShape, checkWorkgroupBytes, isPow2, MAX_WORKGROUPS_PER_DIM } from "./_twin.ts";
import { QUANT_LIBS } from "./_quant.ts";
import {
  checkGroupedPass,
  type GroupedMatmulBindings,
  type GroupedMatmulOp,
  type GroupedMatmulShape,
} from "./moe_matmul.ts";

/** Kernel description of `moe_gmv.wgsl`. */
export const MOE_GMV: KernelSpec = {
  name: "moe_gmv",
  url: new URL("./moe_gmv.wgsl", import.meta.url),
  lib: [...QUANT_LIBS, "rows", "moe_cols", "group_tiles"],
  constants: { TYPE: "u32", GATE_UP: "bool", TEAM: "u32", ROWS: "u32", CT: "u32" },
};

/** Constants of one grouped mat-vec variant. */
export type GroupedMatvecConstants = {
  /** ggml type id of the weights. */
  readonly TYPE: number;
  /** Gate·up: Y = silu(gate·x)·(up·x). */
  readonly GATE_UP: boolean;
  /** Invocations per row team (a power of two, 4..64): a row's units are split over them. */
  readonly TEAM: number;
  /** Rows per team (1..4). */
  readonly ROWS: number;
  /** Columns per tile (1..8): each decoded unit serves this many columns. */
  readonly CT: number;
};

/**
 * The variant of a pass, from the H100's sweep at 35B-A3B shapes (`bench/moe_prefill.ts`, docs/PERF.md,
 * 2026-12-05; µs per layer at 64 / 256 tokens): TEAM 16 throughout; gate·up ROWS 2 with 8 columns per tile
 * from 6 routed tokens per expert on average (446 / 1,312 µs, against 572 / 2,020 at TEAM 32 ROWS 2), 4 below;
 * down ROWS 4 with 4 columns per tile (367 / 1,016, against 460 / 1,186).
 */
export function groupedMatvecConstants(shape: GroupedMatmulShape): GroupedMatvecConstants {
  const routedGroups = Math.max(1, shape.nGroups - (shape.shared ? 1 : 0));
  const mean = shape.nRouted / routedGroups;
  const gateUp = shape.upOffsetBytes !== undefined;
  return {
    TYPE: TYPE_ID[shape.type],
    GATE_UP: gateUp,
    TEAM: 16,
    ROWS: gateUp ? 2 : 4,
    CT: gateUp && mean >= 6 ? 8 : 4,
  };
}

/** Rows per workgroup of a variant. */
export function groupedMatvecRows(c: Pick<GroupedMatvecConstants, "TEAM" | "ROWS">): number {
  return (256 / c.TEAM) * c.ROWS;
}

/** Workgroup memory of a variant in bytes: the partial sums, the prefix sum and the IQ4 codebook table. */
export function groupedMatvecWorkgroupBytes(c: GroupedMatvecConstants): number {
  const iq4 = c.TYPE === TYPE_ID.IQ4_XS || c.TYPE === TYPE_ID.IQ4_NL;
  return 8 * groupedMatvecRows(c) * c.TEAM + 1032 + (iq4 ? 2048 : 0);
}

/**
 * Grid: row blocks in x; in y a bound on the groups' CT-column tiles, Σ ceil(count_e / CT) ≤ columns / CT +
 * groups (workgroups past the last tile return at once).
 */
export function groupedMatvecGrid(
  shape: GroupedMatmulShape,
  c: GroupedMatvecConstants,
): [number, number, number] {
  const cols = shape.nRouted + (shape.shared ? shape.cap : 0);
  return [Math.ceil(shape.n / groupedMatvecRows(c)), Math.floor(cols / c.CT) + shape.nGroups, 1];
}

/**
 * Throws before encoding when a pass, its constants and its bindings do not fit together.
 * @throws {RangeError} naming the value or binding and what it needs
 */
export function checkGroupedMatvec(
  shape: GroupedMatmulShape,
  c: GroupedMatvecConstants,
  b: GroupedMatmulBindings,
): void {
  checkShape(c.TYPE === TYPE_ID[shape.type], `Kernel moe_gmv: TYPE=${c.TYPE} is not ${shape.type}`);
  checkShape(
    c.GATE_UP === (shape.upOffsetBytes !== undefined),
    "Kernel moe_gmv: GATE_UP goes with upOffsetBytes",
  );
  checkShape(
    isPow2(c.TEAM) && c.TEAM >= 4 && c.TEAM <= 64,
    `Kernel moe_gmv: TEAM=${c.TEAM} must be 4, 8, .. 64`,
  );
  checkInt("Kernel moe_gmv: ROWS", c.ROWS, 1, 4);
  checkInt("Kernel moe_gmv: CT", c.CT, 1, 8);
  checkGroupedPass("moe_gmv", shape, b);
  const grid = groupedMatvecGrid(shape, c);
  checkShape(
    grid[1] <= MAX_WORKGROUPS_PER_DIM,
    `Kernel moe_gmv: ${
      grid[1]
    } column tiles exceed ${MAX_WORKGROUPS_PER_DIM} workgroups: use a smaller chunk`,
  );
}

/**
 * Checks a pass, compiles (or reuses) its variant and builds its bind group.
 * @throws {RangeError} from {@linkcode checkGroupedMatvec}, or when the variant's workgroup memory exceeds
 *   the device's
 */
export async function prepareGroupedMatvec(
  cache: PipelineCache,
  opts: {
    device: GPUDevice;
    shape: GroupedMatmulShape;
    bindings: GroupedMatmulBindings;
    constants?: GroupedMatvecConstants;
  },
): Promise<GroupedMatmulOp> {
  const c = opts.constants ?? groupedMatvecConstants(opts.shape);
  checkGroupedMatvec(opts.shape, c, opts.bindings);
  checkWorkgroupBytes(
    opts.device,
    `Kernel moe_gmv TEAM=${c.TEAM} ROWS=${c.ROWS}`,
    groupedMatvecWorkgroupBytes(c),
    "take a smaller TEAM or ROWS",
  );
  const pipeline = await cache.get(MOE_GMV, c);
  const b = opts.bindings;
  return {
    pipeline,
    bindGroup: bindGroup(opts.device, pipeline, [b.params, b.weights, b.x, b.y, b.groups]),
    grid: groupedMatvecGrid(opts.shape, c),
  };
}
