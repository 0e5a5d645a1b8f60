/**
 * Host twin of `add.wgsl`: in-place residual add `acc += x`, optionally scaled per token by
 * `sigmoid(gate[t])` (the shared-expert gate).
 * @module
 */
import { bindGroup, type Binding, type KernelSpec } from "../engine/gpu/kernel.ts";
import { checkBinding, checkInt, checkShape, isPow2, MAX_WORKGROUPS_PER_DIM } from "./_twin.ts";

/** Constants of `add.wgsl`: row length, workgroup size, whether x is scaled by sigmoid(gate[t]). */
export type AddConstants = { readonly N: number; readonly WG: number; readonly GATED: boolean };

/** Kernel spec of `add.wgsl`. */
export const ADD: KernelSpec = {
  name: "add",
  url: new URL("./add.wgsl", import.meta.url),
  lib: [],
  constants: { N: "u32", WG: "u32", GATED: "bool" },
};

/**
 * Binding order: acc f32 ne=[N, nTokens] (in place); x f32 ne=[N, nTokens]; gate f32 ne=[nTokens] (read
 * only when GATED: bind x again otherwise).
 */
export const ADD_BINDINGS = ["acc", "x", "gate"] as const;

/** Buffers of one `add` dispatch, by binding name. */
export type AddBuffers = Readonly<Record<(typeof ADD_BINDINGS)[number], Binding>>;

/**
 * Checks constants and the token count against the kernel's limits.
 * @throws {RangeError} naming the offending value
 */
export function checkAdd(c: AddConstants, nTokens: number): void {
  checkShape(isPow2(c.WG) && c.WG <= 256, `add: WG must be a power of two <= 256, got ${c.WG}`);
  checkInt("add: N", c.N, 1, c.WG * MAX_WORKGROUPS_PER_DIM);
  checkInt("add: nTokens", nTokens, 1, MAX_WORKGROUPS_PER_DIM);
}

/**
 * The bind group of one dispatch, after checking every buffer against its `ne`.
 * @throws {RangeError} when a constant is out of range or a buffer too small
 */
export function addBindGroup(
  device: GPUDevice,
  opts: { pipeline: GPUComputePipeline; constants: AddConstants; nTokens: number; buffers: AddBuffers },
): GPUBindGroup {
  const { constants: c, nTokens: n, buffers: b } = opts;
  checkAdd(c, n);
  checkBinding("add", "acc", b.acc, [c.N, n]);
  checkBinding("add", "x", b.x, [c.N, n]);
  if (c.GATED) checkBinding("add", "gate", b.gate, [n]);
  return bindGroup(device, opts.pipeline, ADD_BINDINGS.map((name) => b[name]));
}

/** Dispatch grid: ceil(N / WG) by nTokens. */
export function addGrid(c: AddConstants, nTokens: number): [number, number, number] {
  return [Math.ceil(c.N / c.WG), nTokens, 1];
}

/**
 * Records one `add` dispatch into `pass`.
 * @throws {RangeError} on constants or a token count the kernel cannot handle
 */
export function encodeAdd(
  pass: GPUComputePassEncoder,
  opts: { pipeline: GPUComputePipeline; bindGroup: GPUBindGroup; constants: AddConstants; nTokens: number },
): void {
  checkAdd(opts.constants, opts.nTokens);
  pass.setPipeline(opts.pipeline);
  pass.setBindGroup(0, opts.bindGroup);
  pass.dispatchWorkgroups(...addGrid(opts.constants, opts.nTokens));
}
