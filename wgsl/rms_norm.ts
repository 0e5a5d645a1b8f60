/**
 * Host twin of `rms_norm.wgsl`: RMSNorm of `nRows` rows of `N` f32 values (spec §5).
 * @module
 */
import { bindGroup, type Binding, type KernelSpec } from "./kernel.ts";
import { checkBinding, checkInt, checkShape, isPow2, MAX_WORKGROUPS_PER_DIM } from "./_twin.ts";

/** Constants of `rms_norm.wgsl`: row length, epsilon, workgroup size (power of two, <= 256). */
export type RmsNormConstants = { readonly N: number; readonly EPS: number; readonly WG: number };

/** Kernel spec of `rms_norm.wgsl`. */
export const RMS_NORM: KernelSpec = {
  name: "rms_norm",
  url: new URL("./rms_norm.wgsl", import.meta.url),
  lib: ["rms"],
  constants: { N: "u32", EPS: "f32", WG: "u32" },
};

/** Binding order of `rms_norm.wgsl`: x f32 ne=[N, nRows], w f32 ne=[N], y f32 ne=[N, nRows]. */
export const RMS_NORM_BINDINGS = ["x", "w", "y"] as const;

/** Buffers of one `rms_norm` dispatch, by binding name. */
export type RmsNormBuffers = Readonly<Record<(typeof RMS_NORM_BINDINGS)[number], Binding>>;

/**
 * Checks constants and row count against the kernel's limits.
 * @throws {RangeError} naming the offending value
 */
export function checkRmsNorm(c: RmsNormConstants, nRows: number): void {
  checkInt("rms_norm: N", c.N, 1, 2 ** 24);
  checkShape(isPow2(c.WG) && c.WG <= 256, `rms_norm: WG must be a power of two <= 256, got ${c.WG}`);
  checkShape(c.EPS > 0, `rms_norm: EPS must be > 0, got ${c.EPS}`);
  checkInt("rms_norm: nRows", nRows, 1, MAX_WORKGROUPS_PER_DIM);
}

/**
 * The bind group of one dispatch, after checking every buffer against its `ne`.
 * @throws {RangeError} when a buffer is too small for `nRows` rows of `N`
 */
export function rmsNormBindGroup(
  device: GPUDevice,
  opts: { pipeline: GPUComputePipeline; constants: RmsNormConstants; nRows: number; buffers: RmsNormBuffers },
): GPUBindGroup {
  const { constants: c, nRows, buffers: b } = opts;
  checkRmsNorm(c, nRows);
  checkBinding("rms_norm", "x", b.x, [c.N, nRows]);
  checkBinding("rms_norm", "w", b.w, [c.N]);
  checkBinding("rms_norm", "y", b.y, [c.N, nRows]);
  return bindGroup(device, opts.pipeline, RMS_NORM_BINDINGS.map((n) => b[n]));
}

/** Dispatch grid: one workgroup per row. */
export function rmsNormGrid(nRows: number): [number, number, number] {
  return [nRows, 1, 1];
}

/**
 * Records one `rms_norm` dispatch into `pass`.
 * @throws {RangeError} on constants or a row count the kernel cannot handle
 */
export function encodeRmsNorm(
  pass: GPUComputePassEncoder,
  opts: { pipeline: GPUComputePipeline; bindGroup: GPUBindGroup; constants: RmsNormConstants; nRows: number },
): void {
  checkRmsNorm(opts.constants, opts.nRows);
  pass.setPipeline(opts.pipeline);
  pass.setBindGroup(0, opts.bindGroup);
  pass.dispatchWorkgroups(...rmsNormGrid(opts.nRows));
}
