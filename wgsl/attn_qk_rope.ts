/**
 * Host twin of `attn_qk_rope.wgsl`: per-head q/k RMSNorm, partial NeoX RoPE and the KV append (spec §7
 * steps 3-5) for `nTokens` tokens at positions `pos0 + t` read from the `AttnParams` buffer.
 * @module
 */
import { bindGroup, type Binding, type KernelSpec } from "./kernel.ts";
import { ATTN_PARAMS_WORDS, kvCacheWords } from "./attn_params.ts";
import { checkBinding, checkInt, checkShape, isPow2, MAX_WORKGROUPS_PER_DIM } from "./_twin.ts";

/**
 * Constants of `attn_qk_rope.wgsl`: heads (nHead, nHeadKv), headDim, rotated dims, cache capacity in
 * positions, workgroup size, rope base and norm epsilon.
 */
export type AttnQkRopeConstants = {
  readonly H_Q: number;
  readonly H_KV: number;
  readonly D_H: number;
  readonly N_ROT: number;
  readonly P_MAX: number;
  readonly WG: number;
  readonly ROPE_THETA: number;
  readonly EPS: number;
  readonly KV_F16: boolean;
  /**
   * Words between columns' params (a batched step's table: column c's [pos0, n_tokens, slot] at word c·P_COL);
   * 0 for one column (AttnParams, slot 0).
   */
  readonly P_COL: number;
  /** Words between slots in the KV cache bindings (pooled caches of every slot); 0 for one column. */
  readonly KV_COL: number;
  /**
   * Words between columns of qf, k and v (a batched step whose in-projections wrote one [qf | k | v] column per
   * slot, each binding at its part); 0: qf, k and v each packed by token.
   */
  readonly IN_COL: number;
};

/** The column constants of a dispatch of one column (its own params and its slot's own caches). */
export const QK_ROPE_ONE_COLUMN = { P_COL: 0, KV_COL: 0, IN_COL: 0 } as const;

/** Kernel spec of `attn_qk_rope.wgsl`. */
export const ATTN_QK_ROPE: KernelSpec = {
  name: "attn_qk_rope",
  url: new URL("./attn_qk_rope.wgsl", import.meta.url),
  lib: ["rms"],
  constants: {
    H_Q: "u32",
    H_KV: "u32",
    D_H: "u32",
    N_ROT: "u32",
    P_MAX: "u32",
    WG: "u32",
    ROPE_THETA: "f32",
    EPS: "f32",
    KV_F16: "bool",
    P_COL: "u32",
    KV_COL: "u32",
    IN_COL: "u32",
  },
};

/**
 * Binding order: params AttnParams; qf f32 ne=[2*D_H, H_Q, nTokens]; k, v f32 ne=[D_H, H_KV, nTokens];
 * qNorm, kNorm f32 ne=[D_H]; qOut f32 ne=[D_H, H_Q, nTokens]; kCache, vCache u32 words
 * of ne=[D_H, P_MAX, H_KV] ({@linkcode kvCacheWords}: f32, or f16 pairs with KV_F16).
 */
export const ATTN_QK_ROPE_BINDINGS = [
  "params",
  "qf",
  "k",
  "v",
  "qNorm",
  "kNorm",
  "qOut",
  "kCache",
  "vCache",
] as const;

/** Buffers of one `attn_qk_rope` dispatch, by binding name. */
export type AttnQkRopeBuffers = Readonly<Record<(typeof ATTN_QK_ROPE_BINDINGS)[number], Binding>>;

/**
 * Checks constants, the token count (the grid's second dimension) and the column count (its third) against
 * the kernel's limits.
 * @throws {RangeError} naming the offending value
 */
export function checkAttnQkRope(c: AttnQkRopeConstants, nTokens: number, cols = 1): void {
  checkInt("attn_qk_rope: H_KV", c.H_KV, 1, 1024);
  checkShape(
    Number.isInteger(c.H_Q) && c.H_Q >= c.H_KV && c.H_Q % c.H_KV === 0,
    `attn_qk_rope: H_Q (${c.H_Q}) must be a multiple of H_KV (${c.H_KV})`,
  );
  checkShape(
    Number.isInteger(c.D_H) && c.D_H >= 2 && c.D_H <= 4096 && c.D_H % 2 === 0,
    `attn_qk_rope: D_H must be even and in [2, 4096], got ${c.D_H}`,
  );
  checkShape(
    Number.isInteger(c.N_ROT) && c.N_ROT >= 2 && c.N_ROT % 2 === 0 && c.N_ROT <= c.D_H,
    `attn_qk_rope: N_ROT must be even and in [2, D_H=${c.D_H}], got ${c.N_ROT}`,
  );
  checkInt("attn_qk_rope: P_MAX", c.P_MAX, 1, 2 ** 24);
  checkShape(isPow2(c.WG) && c.WG <= 256, `attn_qk_rope: WG must be a power of two <= 256, got ${c.WG}`);
  checkShape(c.ROPE_THETA > 1, `attn_qk_rope: ROPE_THETA must be > 1, got ${c.ROPE_THETA}`);
  checkShape(c.EPS > 0, `attn_qk_rope: EPS must be > 0, got ${c.EPS}`);
  checkInt("attn_qk_rope: nTokens", nTokens, 1, MAX_WORKGROUPS_PER_DIM);
  checkInt("attn_qk_rope: cols", cols, 1, MAX_WORKGROUPS_PER_DIM);
  checkShape(
    c.P_COL === 0 || (Number.isInteger(c.P_COL) && c.P_COL >= 3),
    `attn_qk_rope: P_COL must be 0 or >= 3 words ([pos0, n_tokens, slot]), got ${c.P_COL}`,
  );
  checkShape(
    c.KV_COL === 0 || (Number.isInteger(c.KV_COL) && c.KV_COL >= kvCacheWords(c)),
    `attn_qk_rope: KV_COL must be 0 or a stride of at least ${
      kvCacheWords(c)
    } words (one slot's cache), got ${c.KV_COL}`,
  );
  checkShape(
    c.IN_COL === 0 || (Number.isInteger(c.IN_COL) && c.IN_COL >= 2 * c.D_H * c.H_Q && nTokens === 1),
    `attn_qk_rope: IN_COL must be 0 or a column stride of at least qf's ${
      2 * c.D_H * c.H_Q
    } words with one ` +
      `token per column, got ${c.IN_COL} (${nTokens} tokens)`,
  );
  checkShape(
    cols === 1 || (nTokens === 1 && c.P_COL > 0),
    `attn_qk_rope: ${cols} columns need one token each (got ${nTokens}) and a P_COL stride (got ${c.P_COL})`,
  );
}

/**
 * The bind group of one dispatch, after checking every buffer against its `ne`: `nTokens` tokens in each of
 * `cols` columns (default 1) whose table names slots below `slots` (default 1).
 * @throws {RangeError} when a buffer is too small for the constants and `nTokens`
 */
export function attnQkRopeBindGroup(
  device: GPUDevice,
  opts: {
    pipeline: GPUComputePipeline;
    constants: AttnQkRopeConstants;
    nTokens: number;
    buffers: AttnQkRopeBuffers;
    cols?: number;
    slots?: number;
  },
): GPUBindGroup {
  const { constants: c, nTokens: n, buffers: b } = opts;
  const cols = opts.cols ?? 1;
  const slots = opts.slots ?? 1;
  checkAttnQkRope(c, n, cols);
  const k = "attn_qk_rope";
  checkShape(
    Number.isInteger(slots) && slots >= 1 && (slots === 1 || (c.P_COL > 0 && c.KV_COL > 0)),
    `attn_qk_rope: ${slots} slots need P_COL and KV_COL strides`,
  );
  const nc = n * cols;
  checkBinding(k, "params", b.params, [c.P_COL > 0 ? (cols - 1) * c.P_COL + 3 : ATTN_PARAMS_WORDS]);
  if (c.IN_COL > 0) {
    // Column c's qf, k and v from word c·IN_COL of their bindings.
    checkBinding(k, "qf", b.qf, [(cols - 1) * c.IN_COL + 2 * c.D_H * c.H_Q]);
    checkBinding(k, "k", b.k, [(cols - 1) * c.IN_COL + c.D_H * c.H_KV]);
    checkBinding(k, "v", b.v, [(cols - 1) * c.IN_COL + c.D_H * c.H_KV]);
  } else {
    checkBinding(k, "qf", b.qf, [2 * c.D_H, c.H_Q, nc]);
    checkBinding(k, "k", b.k, [c.D_H, c.H_KV, nc]);
    checkBinding(k, "v", b.v, [c.D_H, c.H_KV, nc]);
  }
  checkBinding(k, "qNorm", b.qNorm, [c.D_H]);
  checkBinding(k, "kNorm", b.kNorm, [c.D_H]);
  checkBinding(k, "qOut", b.qOut, [c.D_H, c.H_Q, nc]);
  checkBinding(k, "kCache", b.kCache, [(slots - 1) * c.KV_COL + kvCacheWords(c)]);
  checkBinding(k, "vCache", b.vCache, [(slots - 1) * c.KV_COL + kvCacheWords(c)]);
  return bindGroup(device, opts.pipeline, ATTN_QK_ROPE_BINDINGS.map((name) => b[name]));
}

/** Dispatch grid: (H_Q + H_KV) heads by `nTokens` tokens by `cols` columns (default 1). */
export function attnQkRopeGrid(c: AttnQkRopeConstants, nTokens: number, cols = 1): [number, number, number] {
  return [c.H_Q + c.H_KV, nTokens, cols];
}

/**
 * Records one `attn_qk_rope` dispatch into `pass`; `nTokens` is the capacity the grid covers (the
 * AttnParams buffer's `n_tokens` may be smaller).
 * @throws {RangeError} on constants or a token count the kernel cannot handle
 */
export function encodeAttnQkRope(
  pass: GPUComputePassEncoder,
  opts: {
    pipeline: GPUComputePipeline;
    bindGroup: GPUBindGroup;
    constants: AttnQkRopeConstants;
    nTokens: number;
  },
): void {
  checkAttnQkRope(opts.constants, opts.nTokens);
  pass.setPipeline(opts.pipeline);
  pass.setBindGroup(0, opts.bindGroup);
  pass.dispatchWorkgroups(...attnQkRopeGrid(opts.constants, opts.nTokens));
}
