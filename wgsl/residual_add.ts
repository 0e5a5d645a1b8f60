/**
 * Twin of `residual_add.wgsl`: `h += Σ w_s·e_s (+ sigmoid(g)·sh)`, the residual add and the MoE combine,
 * optionally followed by the RMSNorm of the new rows (`NORM`: the next block's input, no separate dispatch).
 * @module
 */
import type { Binding, KernelSpec } from "./kernel.ts";
import { checkBinding, checkInt, MAX_WORKGROUPS_PER_DIM } from "./_twin.ts";

/** Kernel description of `residual_add.wgsl`. */
export const RESIDUAL_ADD: KernelSpec = {
  name: "residual_add",
  url: new URL("./residual_add.wgsl", import.meta.url),
  lib: ["rms"],
  constants: { D: "u32", N_TERMS: "u32", WEIGHTED: "bool", SHARED: "bool", NORM: "bool", EPS: "f32" },
};

/**
 * Constants: row length, number of terms, whether terms are weighted and a gated shared term exists, and
 * whether the normed rows are written too (with the norm's epsilon; 0 without NORM).
 */
export type ResidualAddConstants = {
  readonly D: number;
  readonly N_TERMS: number;
  readonly WEIGHTED: boolean;
  readonly SHARED: boolean;
  readonly NORM: boolean;
  readonly EPS: number;
};

/** Binding order of `residual_add.wgsl`. */
export const RESIDUAL_ADD_BINDINGS = ["params", "e", "weights", "sh", "g", "h", "nw", "y"] as const;

/** Buffers of one dispatch by binding name (unused ones may be any buffer of at least 4 bytes). */
export type ResidualAddBindings = Readonly<Record<(typeof RESIDUAL_ADD_BINDINGS)[number], Binding>>;

/**
 * Throws before encoding when the bindings cannot hold `maxTokens` tokens.
 * @throws {RangeError} naming the binding and the bytes it needs
 */
export function checkResidualAdd(c: ResidualAddConstants, b: ResidualAddBindings, maxTokens: number): void {
  checkInt("Kernel residual_add: D", c.D, 1, 256 * MAX_WORKGROUPS_PER_DIM);
  checkInt("Kernel residual_add: N_TERMS", c.N_TERMS, 1, 1024);
  checkInt("Kernel residual_add: maxTokens", maxTokens, 1, MAX_WORKGROUPS_PER_DIM);
  checkBinding("residual_add", "params", b.params, [2]);
  checkBinding("residual_add", "e", b.e, [c.D, c.N_TERMS, maxTokens]);
  checkBinding("residual_add", "weights", b.weights, c.WEIGHTED ? [c.N_TERMS, maxTokens] : [1]);
  checkBinding("residual_add", "sh", b.sh, c.SHARED ? [c.D, maxTokens] : [1]);
  checkBinding("residual_add", "g", b.g, c.SHARED ? [maxTokens] : [1]);
  checkBinding("residual_add", "h", b.h, [c.D, maxTokens]);
  checkBinding("residual_add", "nw", b.nw, c.NORM ? [c.D] : [1]);
  checkBinding("residual_add", "y", b.y, c.NORM ? [c.D, maxTokens] : [1]);
}

/** Dispatch grid for up to `maxTokens` tokens (tokens past params[0] return at once). */
export function residualAddGrid(c: ResidualAddConstants, maxTokens: number): [number, number, number] {
  return [c.NORM ? 1 : Math.ceil(c.D / 256), maxTokens, 1];
}
