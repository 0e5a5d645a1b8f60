/**
 * Twin of `moe_gmv_q8.wgsl`: moe_matvec_q8's expert pass (same shape, params, ids, weights, int8 x and output)
 * with the columns grouped by expert (moe_tiles' table), so that the columns on one expert (the shared
 * expert's, a routed expert that several tokens of a batched step picked) decode each weight chunk once for up
 * to CT of them. Each (row, column) keeps moe_matvec_q8's bits at the same TEAM: a batched step's columns stay
 * equal to their solo steps.
 * @module
 */
import type { Binding, KernelSpec } from "./kernel.ts";
import { TYPE_ID } from "../engine/quant/types.ts";
import { checkBinding, checkInt, checkShape, isPow2, MAX_WORKGROUPS_PER_DIM } from "./_twin.ts";
import { MOE_TILES_MAX_ROUTED, moeTilesMax, moeTilesWords } from "./moe_tiles.ts";
import type { MoeMatvecShape } from "./moe_matvec.ts";
import { checkMoeMatvecQ8, moeMatvecQ8Constants } from "./moe_matvec_q8.ts";

/** Kernel description of `moe_gmv_q8.wgsl`. */
export const MOE_GMV_Q8: KernelSpec = {
  name: "moe_gmv_q8",
  url: new URL("./moe_gmv_q8.wgsl", import.meta.url),
  lib: ["common", "iq4_xs", "q4_k", "q8chunk"],
  constants: { TYPE: "u32", TEAM: "u32", CT: "u32", GATE_UP: "bool" },
};

/** Constants of one variant. */
export type MoeGmvQ8Constants = {
  readonly TYPE: number;
  /** Invocations per row: moe_matvec_q8's TEAM of the pass, whose sum order each column keeps (≤ 16). */
  readonly TEAM: number;
  /** Columns per tile (1..8): a decoded chunk serves this many columns of one expert. */
  readonly CT: number;
  readonly GATE_UP: boolean;
};

/** Binding order of `moe_gmv_q8.wgsl`. */
export const MOE_GMV_Q8_BINDINGS = ["params", "weights", "weights2", "xq", "y", "tiles"] as const;

/** Buffers of one dispatch by binding name; `weights2` is `weights` again; `tiles`: moe_tiles' table. */
export type MoeGmvQ8Bindings = Readonly<Record<(typeof MOE_GMV_Q8_BINDINGS)[number], Binding>>;

/**
 * Constants of a pass: moe_matvec_q8's default TEAM for the shape (so each column has the bits of the
 * per-column pass the one-token step runs), `ct` columns per tile (default 8).
 */
export function moeGmvQ8Constants(shape: MoeMatvecShape, ct = 8): MoeGmvQ8Constants {
  return { TYPE: TYPE_ID[shape.type], TEAM: moeMatvecQ8Constants(shape).TEAM, CT: ct, GATE_UP: shape.gateUp };
}

/** Dispatch grid: row blocks × a bound on the tiles (every routed column its own, then the shared ones'). */
export function moeGmvQ8Grid(shape: MoeMatvecShape, c: MoeGmvQ8Constants): [number, number, number] {
  return [Math.ceil(shape.n / (256 / c.TEAM)), moeTilesMax(shape, c.CT), 1];
}

/**
 * Throws before encoding when shape, constants and bindings do not fit (moe_matvec_q8's checks at the same
 * TEAM, then the grouping's).
 * @throws {RangeError} naming the kernel, the value and what to change
 */
export function checkMoeGmvQ8(shape: MoeMatvecShape, c: MoeGmvQ8Constants, b: MoeGmvQ8Bindings): void {
  checkShape(
    isPow2(c.TEAM) && c.TEAM <= 16,
    `Kernel moe_gmv_q8: TEAM=${c.TEAM} must be a power of two up to 16 (a row's partials are added from its ` +
      `index mod TEAM on, as moe_matvec_q8 adds them)`,
  );
  checkInt("Kernel moe_gmv_q8: CT", c.CT, 1, 8);
  checkShape(
    shape.nCols <= MOE_TILES_MAX_ROUTED,
    `Kernel moe_gmv_q8: ${shape.nCols} routed columns exceed the ${MOE_TILES_MAX_ROUTED} that moe_tiles ` +
      `groups: use moe_matvec_q8`,
  );
  checkBinding("moe_gmv_q8", "tiles", b.tiles, [moeTilesWords(shape, c.CT)]);
  checkMoeMatvecQ8(
    shape,
    {
      TYPE: c.TYPE,
      TEAM: c.TEAM,
      ROWS: 1,
      OUT_LAYOUT: 0,
      GATE_UP: c.GATE_UP,
      QOUT: false,
      XIN: false,
      KC: 1,
    },
    // moe_matvec_q8's ids: the table holds them (as large as the routed columns, so its check passes).
    { ...b, ids: b.tiles, yq: b.y },
  );
  const grid = moeGmvQ8Grid(shape, c);
  checkShape(
    grid[0] <= MAX_WORKGROUPS_PER_DIM,
    `Kernel moe_gmv_q8: ${grid[0]} row blocks exceed ${MAX_WORKGROUPS_PER_DIM} workgroups`,
  );
}
