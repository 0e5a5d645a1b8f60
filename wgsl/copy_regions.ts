/**
 * Twin of `copy_regions.wgsl`: listed slots' regions of a state pool copied into another buffer of the same
 * layout, one dispatch for all of them (the decode loop's rewind points, engine/exec/_rewind.ts).
 * @module
 */
import type { Binding, KernelSpec } from "./kernel.ts";
import { checkBinding, checkInt, checkShape, MAX_WORKGROUPS_PER_DIM } from "./_twin.ts";

/** Kernel description of `copy_regions.wgsl`. */
export const COPY_REGIONS: KernelSpec = {
  name: "copy_regions",
  url: new URL("./copy_regions.wgsl", import.meta.url),
  lib: [],
  constants: { PER: "u32" },
};

/** Words each invocation copies (workgroups of 256 copy 256·PER words). */
export const COPY_REGIONS_PER = 4;

/** Binding order of `copy_regions.wgsl`. */
export const COPY_REGIONS_BINDINGS = ["params", "src", "dst"] as const;

/** One dispatch's layout: region length and stride in bytes (multiples of 4), the slots copied. */
export interface CopyRegionsShape {
  readonly lenBytes: number;
  readonly strideBytes: number;
  readonly slots: readonly number[];
}

/** The params words of a dispatch. */
export function copyRegionsParams(s: CopyRegionsShape): Uint32Array<ArrayBuffer> {
  return Uint32Array.from([s.lenBytes / 4, s.strideBytes / 4, s.slots.length, ...s.slots]);
}

/** Dispatch grid: blocks of 256·PER words × slots. */
export function copyRegionsGrid(s: CopyRegionsShape): [number, number, number] {
  return [Math.ceil(s.lenBytes / 4 / (256 * COPY_REGIONS_PER)), s.slots.length, 1];
}

/**
 * Throws before encoding when the shape or the bindings do not fit.
 * @throws {RangeError} naming the value and what to change
 */
export function checkCopyRegions(
  s: CopyRegionsShape,
  b: Readonly<Record<(typeof COPY_REGIONS_BINDINGS)[number], Binding>>,
): void {
  checkShape(
    s.lenBytes > 0 && s.lenBytes % 4 === 0 && s.strideBytes % 4 === 0 && s.strideBytes >= s.lenBytes,
    `Kernel copy_regions: regions of ${s.lenBytes} bytes at a stride of ${s.strideBytes} must be positive ` +
      `multiples of 4 within their stride`,
  );
  checkShape(
    s.slots.length >= 1 && new Set(s.slots).size === s.slots.length,
    `Kernel copy_regions: 1 or more distinct slots, got ${s.slots.join(",")}`,
  );
  for (const slot of s.slots) checkInt("Kernel copy_regions: slot", slot, 0, 2 ** 24);
  checkShape(
    copyRegionsGrid(s)[0] <= MAX_WORKGROUPS_PER_DIM,
    `Kernel copy_regions: regions of ${s.lenBytes} bytes take too many workgroups`,
  );
  const words = (Math.max(...s.slots) * s.strideBytes + s.lenBytes) / 4;
  checkBinding("copy_regions", "params", b.params, [3 + s.slots.length]);
  checkBinding("copy_regions", "src", b.src, [words]);
  checkBinding("copy_regions", "dst", b.dst, [words]);
}
