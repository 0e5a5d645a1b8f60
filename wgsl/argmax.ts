/**
 * Host twin of `argmax.wgsl`: greedy argmax over the vocabulary (ties to the lowest index) in two
 * dispatches, a partial pass of `N_BLOCK` workgroups and a final one-workgroup pass that can write the id
 * into the next step's token buffer and a slot of the output ring.
 * @module
 */
import { bindGroup, type Binding, type ConstValues, type KernelSpec } from "./kernel.ts";
import { checkBinding, checkInt, checkShape, isPow2, MAX_WORKGROUPS_PER_DIM } from "./_twin.ts";

/**
 * Settings of one argmax: vocabulary size (nVocab logits), partial workgroups, workgroup size, and whether
 * the final pass writes the id to `nextToken` and `ring`.
 */
export type ArgmaxConstants = {
  readonly N_VOCAB: number;
  readonly N_BLOCK: number;
  readonly WG: number;
  readonly WRITE_IDS: boolean;
};

/** Kernel spec of `argmax.wgsl` (both passes; see {@linkcode argmaxVariants}). */
export const ARGMAX: KernelSpec = {
  name: "argmax",
  url: new URL("./argmax.wgsl", import.meta.url),
  lib: [],
  constants: { N: "u32", N_BLOCK: "u32", WG: "u32", PAIRS: "bool", FINAL: "bool" },
};

/**
 * The id argmax writes for a row holding a NaN or +Inf logit: never a token id, so the host refuses it instead
 * of emitting a token (-Inf logits are excluded ids and never win).
 */
export const ARGMAX_NONFINITE = 0xfffffffe;

/**
 * Binding order of both passes: src u32 (logits ne=[nVocab] or pairs ne=[2, N_BLOCK]); dst u32 pairs;
 * params ArgmaxParams { ring_slot: u32 }; nextToken u32 ne=[1]; ring u32 ne=[ring_slot + 1].
 */
export const ARGMAX_BINDINGS = ["src", "dst", "params", "nextToken", "ring"] as const;

/** Word layout of ArgmaxParams: `ring_slot` at word 0 (offset 0). */
export const ARGMAX_PARAMS_WORDS = 1;

/**
 * Buffers of one argmax: `logits` f32 ne=[nVocab]; `pairs` u32 ne=[2, N_BLOCK] scratch; `result` u32 ne=[2]
 * (value bits, id); `params` ArgmaxParams; `nextToken` u32 ne=[1]; `ring` u32, holding the slot `params`
 * names (the kernel cannot check that slot: it lives on the GPU).
 */
export type ArgmaxBuffers = Readonly<
  Record<"logits" | "pairs" | "result" | "params" | "nextToken" | "ring", Binding>
>;

/** The pipelines of the two passes, from `PipelineCache.get(ARGMAX, argmaxVariants(c).partial/final)`. */
export type ArgmaxPipelines = { readonly partial: GPUComputePipeline; readonly final: GPUComputePipeline };

/** The bind groups of the two passes, from {@linkcode argmaxBindGroups}. */
export type ArgmaxBindGroups = { readonly partial: GPUBindGroup; readonly final: GPUBindGroup };

/**
 * Checks settings against the kernel's limits.
 * @throws {RangeError} naming the offending value
 */
export function checkArgmax(c: ArgmaxConstants): void {
  checkInt("argmax: N_VOCAB", c.N_VOCAB, 1, 2 ** 31);
  checkInt("argmax: N_BLOCK", c.N_BLOCK, 1, MAX_WORKGROUPS_PER_DIM);
  checkShape(isPow2(c.WG) && c.WG <= 256, `argmax: WG must be a power of two <= 256, got ${c.WG}`);
}

/** Constant values of the partial and final passes. */
export function argmaxVariants(c: ArgmaxConstants): { partial: ConstValues; final: ConstValues } {
  checkArgmax(c);
  return {
    partial: { N: c.N_VOCAB, N_BLOCK: c.N_BLOCK, WG: c.WG, PAIRS: false, FINAL: false },
    final: { N: c.N_BLOCK, N_BLOCK: 1, WG: c.WG, PAIRS: true, FINAL: c.WRITE_IDS },
  };
}

/**
 * The bind groups of both passes, after checking every buffer against its `ne`.
 * @throws {RangeError} when a setting is out of range or a buffer too small
 */
export function argmaxBindGroups(
  device: GPUDevice,
  opts: { pipelines: ArgmaxPipelines; constants: ArgmaxConstants; buffers: ArgmaxBuffers },
): ArgmaxBindGroups {
  const { constants: c, buffers: b } = opts;
  checkArgmax(c);
  checkBinding("argmax", "logits", b.logits, [c.N_VOCAB]);
  checkBinding("argmax", "pairs", b.pairs, [2, c.N_BLOCK]);
  checkBinding("argmax", "result", b.result, [2]);
  checkBinding("argmax", "params", b.params, [ARGMAX_PARAMS_WORDS]);
  checkBinding("argmax", "nextToken", b.nextToken, [1]);
  checkBinding("argmax", "ring", b.ring, [1]);
  return {
    partial: bindGroup(device, opts.pipelines.partial, [b.logits, b.pairs, b.params, b.nextToken, b.ring]),
    final: bindGroup(device, opts.pipelines.final, [b.pairs, b.result, b.params, b.nextToken, b.ring]),
  };
}

/** Dispatch grids of the two passes. */
export function argmaxGrids(
  c: ArgmaxConstants,
): { partial: [number, number, number]; final: [number, number, number] } {
  return { partial: [c.N_BLOCK, 1, 1], final: [1, 1, 1] };
}

/** Records both passes into `pass` (the second reads the first's pairs; one pass orders them). */
export function encodeArgmax(
  pass: GPUComputePassEncoder,
  opts: { pipelines: ArgmaxPipelines; bindGroups: ArgmaxBindGroups; constants: ArgmaxConstants },
): void {
  const grids = argmaxGrids(opts.constants);
  pass.setPipeline(opts.pipelines.partial);
  pass.setBindGroup(0, opts.bindGroups.partial);
  pass.dispatchWorkgroups(...grids.partial);
  pass.setPipeline(opts.pipelines.final);
  pass.setBindGroup(0, opts.bindGroups.final);
  pass.dispatchWorkgroups(...grids.final);
}
