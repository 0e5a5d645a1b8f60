/**
 * Host twin of `swiglu.wgsl`: `y = silu(g) * u` elementwise over `nTokens` rows of `N`.
 * @module
 */
import { bindGroup, type Binding, type KernelSpec } from "../engine/gpu/kernel.ts";
import { checkBinding, checkInt, checkShape, isPow2, MAX_WORKGROUPS_PER_DIM } from "./_twin.ts";

/** Constants of `swiglu.wgsl`: row length (nFfExp or nFfShexp), workgroup size. */
export type SwigluConstants = { readonly N: number; readonly WG: number };

/** Kernel spec of `swiglu.wgsl`. */
export const SWIGLU: KernelSpec = {
  name: "swiglu",
  url: new URL("./swiglu.wgsl", import.meta.url),
  lib: [],
  constants: { N: "u32", WG: "u32" },
};

/** Binding order: g, u, y, each f32 ne=[N, nTokens]. */
export const SWIGLU_BINDINGS = ["g", "u", "y"] as const;

/** Buffers of one `swiglu` dispatch, by binding name. */
export type SwigluBuffers = Readonly<Record<(typeof SWIGLU_BINDINGS)[number], Binding>>;

/**
 * Checks constants and the token count against the kernel's limits.
 * @throws {RangeError} naming the offending value
 */
export function checkSwiglu(c: SwigluConstants, nTokens: number): void {
  checkShape(isPow2(c.WG) && c.WG <= 256, `swiglu: WG must be a power of two <= 256, got ${c.WG}`);
  checkInt("swiglu: N", c.N, 1, c.WG * MAX_WORKGROUPS_PER_DIM);
  checkInt("swiglu: nTokens", nTokens, 1, MAX_WORKGROUPS_PER_DIM);
}

/**
 * The bind group of one dispatch, after checking every buffer against its `ne`.
 * @throws {RangeError} when a constant is out of range or a buffer too small
 */
export function swigluBindGroup(
  device: GPUDevice,
  opts: { pipeline: GPUComputePipeline; constants: SwigluConstants; nTokens: number; buffers: SwigluBuffers },
): GPUBindGroup {
  const { constants: c, nTokens: n, buffers: b } = opts;
  checkSwiglu(c, n);
  for (const name of SWIGLU_BINDINGS) checkBinding("swiglu", name, b[name], [c.N, n]);
  return bindGroup(device, opts.pipeline, SWIGLU_BINDINGS.map((name) => b[name]));
}

/** Dispatch grid: ceil(N / WG) by nTokens. */
export function swigluGrid(c: SwigluConstants, nTokens: number): [number, number, number] {
  return [Math.ceil(c.N / c.WG), nTokens, 1];
}

/**
 * Records one `swiglu` dispatch into `pass`.
 * @throws {RangeError} on constants or a token count the kernel cannot handle
 */
export function encodeSwiglu(
  pass: GPUComputePassEncoder,
  opts: {
    pipeline: GPUComputePipeline;
    bindGroup: GPUBindGroup;
    constants: SwigluConstants;
    nTokens: number;
  },
): void {
  checkSwiglu(opts.constants, opts.nTokens);
  pass.setPipeline(opts.pipeline);
  pass.setBindGroup(0, opts.bindGroup);
  pass.dispatchWorkgroups(...swigluGrid(opts.constants, opts.nTokens));
}
