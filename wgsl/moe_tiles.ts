/**
 * Twin of `moe_tiles.wgsl`: an expert pass's columns grouped by expert in tiles of up to CT columns, the table
 * moe_gmv_q8 reads (one per layer: gate·up and down share the ids and the columns).
 * @module
 */
import type { Binding, KernelSpec } from "./kernel.ts";
import { checkBinding, checkInt } from "./_twin.ts";
import type { MoeMatvecShape } from "./moe_matvec.ts";

/** Kernel description of `moe_tiles.wgsl`. */
export const MOE_TILES: KernelSpec = {
  name: "moe_tiles",
  url: new URL("./moe_tiles.wgsl", import.meta.url),
  lib: [],
  constants: { CT: "u32" },
};

/** Most routed columns one table groups (one per invocation). */
export const MOE_TILES_MAX_ROUTED = 256;

/** Most tiles of a pass: every routed column its own, then the shared columns' tiles. */
export function moeTilesMax(shape: Pick<MoeMatvecShape, "nCols" | "sharedCols">, ct: number): number {
  return shape.nCols + Math.ceil((shape.sharedCols ?? 0) / ct);
}

/** u32 words of the table: the count, then 2 + CT words per tile. */
export function moeTilesWords(shape: Pick<MoeMatvecShape, "nCols" | "sharedCols">, ct: number): number {
  return 1 + moeTilesMax(shape, ct) * (2 + ct);
}

/**
 * Throws before encoding when the pass or the bindings do not fit (params: moe_matvec's words).
 * @throws {RangeError} naming the value or binding and what it needs
 */
export function checkMoeTiles(
  shape: MoeMatvecShape,
  ct: number,
  b: { params: Binding; ids: Binding; tiles: Binding },
): void {
  checkInt("Kernel moe_tiles: CT", ct, 1, 8);
  checkInt("Kernel moe_tiles: routed columns", shape.nCols, 1, MOE_TILES_MAX_ROUTED);
  checkBinding("moe_tiles", "params", b.params, [11]);
  checkBinding("moe_tiles", "ids", b.ids, [shape.nCols]);
  checkBinding("moe_tiles", "tiles", b.tiles, [moeTilesWords(shape, ct)]);
}
