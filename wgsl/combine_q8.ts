/**
 * Twin of `combine_q8.wgsl`: the MoE combine of mat-vec columns (`h += Σ w_s·e_s + sigmoid(g)·sh`) with the
 * next block's RMSNorm and that row rounded to int8 in both byte orders, the batched step's replacement for
 * residual_add plus the next in-projections' quantize_q8 dispatches (each value with their bits).
 * @module
 */
import type { Binding, KernelSpec } from "./kernel.ts";
import { bindingBytes, checkBinding, checkInt, checkShape, MAX_WORKGROUPS_PER_DIM } from "./_twin.ts";
import { q8xBytes } from "./matvec_q8.ts";

/** Kernel description of `combine_q8.wgsl`. */
export const COMBINE_Q8: KernelSpec = {
  name: "combine_q8",
  url: new URL("./combine_q8.wgsl", import.meta.url),
  lib: ["rms", "q8pack"],
  constants: { D: "u32", N_TERMS: "u32", EPS: "f32" },
};

/** Constants: the row length (a multiple of 32), the routed terms, the norm's epsilon. */
export type CombineQ8Constants = {
  readonly D: number;
  readonly N_TERMS: number;
  readonly EPS: number;
};

/** Binding order of `combine_q8.wgsl`. */
export const COMBINE_Q8_BINDINGS = ["params", "e", "weights", "sh", "g", "h", "nw", "y", "xq"] as const;

/** Buffers of one dispatch by binding name. */
export type CombineQ8Bindings = Readonly<Record<(typeof COMBINE_Q8_BINDINGS)[number], Binding>>;

/** Bytes of the uniform params. */
export const COMBINE_Q8_PARAMS_BYTES = 16;

/**
 * The uniform params: `nTokens` rows, the gate logit's stride per token (`gCol`, 0 for 1), and `altWords`:
 * words from xq's byte order 0 copy to its byte order 1 copy (each `nTokens` columns of q8xBytes(D) bytes).
 */
export function combineQ8Params(nTokens: number, gCol: number, altWords: number): Uint32Array<ArrayBuffer> {
  return Uint32Array.of(nTokens, gCol, altWords, 0);
}

/** Workgroup memory of a variant: the new row. */
export function combineQ8WorkgroupBytes(c: CombineQ8Constants): number {
  return 4 * c.D + 4 * 256;
}

/**
 * Throws before encoding when the bindings cannot hold `nTokens` rows (the byte order 1 copy `altWords` words
 * after the byte order 0 one) or the constants are out of range.
 * @throws {RangeError} naming the binding or constant and what it needs
 */
export function checkCombineQ8(
  c: CombineQ8Constants,
  b: CombineQ8Bindings,
  nTokens: number,
  gCol: number,
  altWords: number,
): void {
  checkShape(
    Number.isInteger(c.D) && c.D >= 32 && c.D % 32 === 0,
    `Kernel combine_q8: D=${c.D} must be a positive multiple of 32 (whole int8 chunks)`,
  );
  checkInt("Kernel combine_q8: N_TERMS", c.N_TERMS, 1, 1024);
  checkInt("Kernel combine_q8: nTokens", nTokens, 1, MAX_WORKGROUPS_PER_DIM);
  checkShape(
    Number.isFinite(c.EPS) && c.EPS > 0,
    `Kernel combine_q8: EPS ${c.EPS} must be a positive number`,
  );
  const colWords = q8xBytes(c.D) / 4;
  checkShape(
    Number.isInteger(altWords) && altWords >= nTokens * colWords,
    `Kernel combine_q8: the byte order 1 copy starts ${altWords} words after the byte order 0 one, which ` +
      `takes ${nTokens * colWords}: put it after`,
  );
  checkShape(
    bindingBytes(b.params) >= COMBINE_Q8_PARAMS_BYTES,
    `Kernel combine_q8: binding params holds ${
      bindingBytes(b.params)
    } bytes, needs ${COMBINE_Q8_PARAMS_BYTES}`,
  );
  checkBinding("combine_q8", "e", b.e, [c.D, c.N_TERMS, nTokens]);
  checkBinding("combine_q8", "weights", b.weights, [c.N_TERMS, nTokens]);
  checkBinding("combine_q8", "sh", b.sh, [c.D, nTokens]);
  checkBinding("combine_q8", "g", b.g, [(nTokens - 1) * Math.max(gCol, 1) + 1]);
  checkBinding("combine_q8", "h", b.h, [c.D, nTokens]);
  checkBinding("combine_q8", "nw", b.nw, [c.D]);
  checkBinding("combine_q8", "y", b.y, [c.D, nTokens]);
  checkBinding("combine_q8", "xq", b.xq, [altWords + nTokens * colWords]);
}

/** Dispatch grid: one workgroup per row. */
export function combineQ8Grid(nTokens: number): [number, number, number] {
  return [1, nTokens, 1];
}
