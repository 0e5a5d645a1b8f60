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
};

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
 * Checks constants and the token count (the grid's second dimension) against the kernel's limits.
 * @throws {RangeError} naming the offending value
 */
export function checkAttnQkRope(c: AttnQkRopeConstants, nTokens: number): void {
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
}

/**
 * The bind group of one dispatch, after checking every buffer against its `ne`.
 * @throws {RangeError} when a buffer is too small for the constants and `nTokens`
 */
export function attnQkRopeBindGroup(
  device: GPUDevice,
  opts: {
    pipeline: GPUComputePipeline;
    constants: AttnQkRopeConstants;
    nTokens: number;
    buffers: AttnQkRopeBuffers;
  },
): GPUBindGroup {
  const { constants: c, nTokens: n, buffers: b } = opts;
  checkAttnQkRope(c, n);
  const k = "attn_qk_rope";
  checkBinding(k, "params", b.params, [ATTN_PARAMS_WORDS]);
  checkBinding(k, "qf", b.qf, [2 * c.D_H, c.H_Q, n]);
  checkBinding(k, "k", b.k, [c.D_H, c.H_KV, n]);
  checkBinding(k, "v", b.v, [c.D_H, c.H_KV, n]);
  checkBinding(k, "qNorm", b.qNorm, [c.D_H]);
  checkBinding(k, "kNorm", b.kNorm, [c.D_H]);
  checkBinding(k, "qOut", b.qOut, [c.D_H, c.H_Q, n]);
  checkBinding(k, "kCache", b.kCache, [kvCacheWords(c)]);
  checkBinding(k, "vCache", b.vCache, [kvCacheWords(c)]);
  return bindGroup(device, opts.pipeline, ATTN_QK_ROPE_BINDINGS.map((name) => b[name]));
}

/** Dispatch grid: (H_Q + H_KV) heads by `nTokens` tokens. */
export function attnQkRopeGrid(c: AttnQkRopeConstants, nTokens: number): [number, number, number] {
  return [c.H_Q + c.H_KV, nTokens, 1];
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
