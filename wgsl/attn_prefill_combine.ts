/**
 * Host twin of `attn_prefill_combine.wgsl`: merges the per-split partials `attn_prefill` leaves with NS > 1
 * key splits (max-rescaled sums of O and l) and applies the output gate.
 * @module
 */
import { bindGroup, type Binding, type KernelSpec } from "./kernel.ts";
import { ATTN_PARAMS_WORDS } from "./attn_params.ts";
import { checkBinding, checkInt, checkShape, isPow2, MAX_WORKGROUPS_PER_DIM } from "./_twin.ts";

/** Constants of `attn_prefill_combine.wgsl`: query heads, head dim, key splits (attn_prefill's NS), workgroup size. */
export type AttnPrefillCombineConstants = {
  readonly H_Q: number;
  readonly D_H: number;
  readonly NS: number;
  readonly WG: number;
};

/** Kernel spec of `attn_prefill_combine.wgsl`. */
export const ATTN_PREFILL_COMBINE: KernelSpec = {
  name: "attn_prefill_combine",
  url: new URL("./attn_prefill_combine.wgsl", import.meta.url),
  lib: [],
  constants: { H_Q: "u32", D_H: "u32", NS: "u32", WG: "u32" },
};

/**
 * Binding order: params AttnParams (n_tokens read); part f32 ne=[D_H + 4, NS, H_Q, nTokens] (attn_prefill's
 * o with NS > 1); qf f32 ne=[2*D_H, H_Q, nTokens]; o f32 ne=[D_H, H_Q, nTokens].
 */
export const ATTN_PREFILL_COMBINE_BINDINGS = ["params", "part", "qf", "o"] as const;

/** Buffers of one `attn_prefill_combine` dispatch, by binding name. */
export type AttnPrefillCombineBuffers = Readonly<
  Record<(typeof ATTN_PREFILL_COMBINE_BINDINGS)[number], Binding>
>;

/**
 * Checks constants and the token capacity against the kernel's limits.
 * @throws {RangeError} naming the offending value
 */
export function checkAttnPrefillCombine(c: AttnPrefillCombineConstants, nTokens: number): void {
  const k = "attn_prefill_combine";
  checkInt(`${k}: H_Q`, c.H_Q, 1, 1024);
  checkInt(`${k}: D_H`, c.D_H, 4, 1024);
  checkShape(c.D_H % 4 === 0, `${k}: D_H must be a multiple of 4, got ${c.D_H}`);
  checkInt(`${k}: NS`, c.NS, 1, 64);
  checkShape(
    isPow2(c.WG) && c.WG >= 32 && c.WG <= 256,
    `${k}: WG must be a power of two in [32, 256], got ${c.WG}`,
  );
  checkInt(`${k}: nTokens`, nTokens, 1, MAX_WORKGROUPS_PER_DIM);
}

/**
 * The bind group of one dispatch, after checking constants and every buffer against its `ne`.
 * @throws {RangeError} when a constant is out of range or a buffer too small
 */
export function attnPrefillCombineBindGroup(
  device: GPUDevice,
  opts: {
    pipeline: GPUComputePipeline;
    constants: AttnPrefillCombineConstants;
    nTokens: number;
    buffers: AttnPrefillCombineBuffers;
  },
): GPUBindGroup {
  const { constants: c, nTokens: n, buffers: b } = opts;
  checkAttnPrefillCombine(c, n);
  const k = "attn_prefill_combine";
  checkBinding(k, "params", b.params, [ATTN_PARAMS_WORDS]);
  checkBinding(k, "part", b.part, [c.D_H + 4, c.NS, c.H_Q, n]);
  checkBinding(k, "qf", b.qf, [2 * c.D_H, c.H_Q, n]);
  checkBinding(k, "o", b.o, [c.D_H, c.H_Q, n]);
  return bindGroup(device, opts.pipeline, ATTN_PREFILL_COMBINE_BINDINGS.map((name) => b[name]));
}

/** Dispatch grid: nTokens tokens by ceil(H_Q * D_H / 4 / WG) groups of quads. */
export function attnPrefillCombineGrid(
  c: AttnPrefillCombineConstants,
  nTokens: number,
): [number, number, number] {
  return [nTokens, Math.ceil(c.H_Q * c.D_H / 4 / c.WG), 1];
}

/**
 * Records one `attn_prefill_combine` dispatch into `pass`; `nTokens` is the capacity the grid covers.
 * @throws {RangeError} on a token count the kernel cannot handle
 */
export function encodeAttnPrefillCombine(
  pass: GPUComputePassEncoder,
  opts: {
    pipeline: GPUComputePipeline;
    bindGroup: GPUBindGroup;
    constants: AttnPrefillCombineConstants;
    nTokens: number;
  },
): void {
  checkAttnPrefillCombine(opts.constants, opts.nTokens);
  pass.setPipeline(opts.pipeline);
  pass.setBindGroup(0, opts.bindGroup);
  pass.dispatchWorkgroups(...attnPrefillCombineGrid(opts.constants, opts.nTokens));
}
