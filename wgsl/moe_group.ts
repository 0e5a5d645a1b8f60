/**
 * Twin of `moe_group.wgsl`: a prefill chunk's routed columns grouped by expert (ascending columns per
 * expert), and the shared expert's columns as one more group, for the grouped expert matmul
 * (`moe_matmul.wgsl`, {@linkcode groupedMatmulParams} in `moe_matmul.ts`).
 * @module
 */
import type { Binding, KernelSpec } from "./kernel.ts";
import { checkBinding, checkInt, MAX_WORKGROUPS_PER_DIM } from "./_twin.ts";

/** Kernel description of `moe_group.wgsl`. */
export const MOE_GROUP: KernelSpec = {
  name: "moe_group",
  url: new URL("./moe_group.wgsl", import.meta.url),
  lib: [],
  constants: {},
};

/** One grouping: `nRouted` columns with an expert id each, and optionally the shared expert's `nTokens`. */
export interface MoeGroupShape {
  /** Routed columns (tokens × experts used). */
  readonly nRouted: number;
  /** Tokens of the chunk: the shared group's length and every group's capacity. */
  readonly nTokens: number;
  /** Routed experts. */
  readonly nExpert: number;
  /** Whether the shared expert is group nExpert (its columns nRouted + t). */
  readonly shared: boolean;
}

/** Groups written: the routed experts, plus the shared one. */
export function moeGroupCount(shape: MoeGroupShape): number {
  return shape.nExpert + (shape.shared ? 1 : 0);
}

/** u32 words of the groups binding: the counts, then a list of nTokens entries per group. */
export function moeGroupWords(shape: MoeGroupShape): number {
  return moeGroupCount(shape) * (1 + shape.nTokens);
}

/** The params words (storage, 5 × u32). */
export function moeGroupParams(shape: MoeGroupShape): Uint32Array<ArrayBuffer> {
  return Uint32Array.of(shape.nRouted, shape.nTokens, shape.nExpert, shape.shared ? 1 : 0, shape.nTokens);
}

/** One workgroup per group. */
export function moeGroupGrid(shape: MoeGroupShape): [number, number, number] {
  return [moeGroupCount(shape), 1, 1];
}

/**
 * Throws before encoding when the shape or the bindings do not fit.
 * @throws {RangeError} naming the value or binding and what it needs
 */
export function checkMoeGroup(
  shape: MoeGroupShape,
  b: { params: Binding; ids: Binding; groups: Binding },
): void {
  checkInt("Kernel moe_group: nTokens", shape.nTokens, 1, 2 ** 24);
  checkInt("Kernel moe_group: nRouted", shape.nRouted, 1, 2 ** 30);
  checkInt("Kernel moe_group: nExpert", shape.nExpert, 1, MAX_WORKGROUPS_PER_DIM - 1);
  checkBinding("moe_group", "params", b.params, [5]);
  checkBinding("moe_group", "ids", b.ids, [shape.nRouted]);
  checkBinding("moe_group", "groups", b.groups, [moeGroupWords(shape)]);
}
