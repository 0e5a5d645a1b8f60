/**
 * Host twin of `argmax_topk.wgsl`: the K <= 64 largest logits with their ids (for `--top`), sorted, ties to
 * the lowest index, in two dispatches: a partial pass of `N_BLOCK` workgroups and a final one-workgroup
 * merge of their `N_BLOCK * K` candidates.
 * @module
 */
import { bindGroup, type Binding, type ConstValues, type KernelSpec } from "./kernel.ts";
import {
  checkBinding,
  checkInt,
  checkShape,
  checkWorkgroupBytes,
  isPow2,
  MAX_WORKGROUPS_PER_DIM,
} from "./_twin.ts";

/**
 * Settings of one top-k: vocabulary size, K, partial workgroups, workgroup size and the sort buffer
 * (power of two >= 2K; 8*BUF bytes of workgroup memory, 2048 fits lavapipe's 32 KiB).
 */
export type ArgmaxTopkConstants = {
  readonly N_VOCAB: number;
  readonly K: number;
  readonly N_BLOCK: number;
  readonly WG: number;
  readonly BUF: number;
};

/** Kernel spec of `argmax_topk.wgsl` (both passes; see {@linkcode argmaxTopkVariants}). */
export const ARGMAX_TOPK: KernelSpec = {
  name: "argmax_topk",
  url: new URL("./argmax_topk.wgsl", import.meta.url),
  lib: [],
  constants: { N: "u32", N_BLOCK: "u32", K: "u32", WG: "u32", BUF: "u32", PAIRS: "bool" },
};

/** Binding order of both passes: src u32 (logits ne=[nVocab] or pairs ne=[2, K, N_BLOCK]); dst u32 pairs. */
export const ARGMAX_TOPK_BINDINGS = ["src", "dst"] as const;

/**
 * Buffers of one top-k: `logits` f32 ne=[nVocab]; `pairs` u32 ne=[2, K, N_BLOCK] scratch; `result` u32
 * ne=[2, K]: (value bits, id), best first.
 */
export type ArgmaxTopkBuffers = Readonly<Record<"logits" | "pairs" | "result", Binding>>;

/** The pipelines of the two passes, from `PipelineCache.get(ARGMAX_TOPK, argmaxTopkVariants(c).…)`. */
export type ArgmaxTopkPipelines = {
  readonly partial: GPUComputePipeline;
  readonly final: GPUComputePipeline;
};

/** The bind groups of the two passes, from {@linkcode argmaxTopkBindGroups}. */
export type ArgmaxTopkBindGroups = { readonly partial: GPUBindGroup; readonly final: GPUBindGroup };

/**
 * Checks settings against the kernel's limits.
 * @throws {RangeError} naming the offending value
 */
export function checkArgmaxTopk(c: ArgmaxTopkConstants): void {
  checkInt("argmax_topk: N_VOCAB", c.N_VOCAB, 1, 2 ** 31);
  checkInt("argmax_topk: K", c.K, 1, Math.min(64, c.N_VOCAB));
  checkInt("argmax_topk: N_BLOCK", c.N_BLOCK, 1, MAX_WORKGROUPS_PER_DIM);
  checkShape(isPow2(c.WG) && c.WG <= 256, `argmax_topk: WG must be a power of two <= 256, got ${c.WG}`);
  checkShape(
    isPow2(c.BUF) && c.BUF >= 2 * c.K,
    `argmax_topk: BUF must be a power of two >= 2K (${2 * c.K}), got ${c.BUF}`,
  );
}

/** Constant values of the partial and final passes. */
export function argmaxTopkVariants(c: ArgmaxTopkConstants): { partial: ConstValues; final: ConstValues } {
  checkArgmaxTopk(c);
  const common = { K: c.K, WG: c.WG, BUF: c.BUF };
  return {
    partial: { ...common, N: c.N_VOCAB, N_BLOCK: c.N_BLOCK, PAIRS: false },
    final: { ...common, N: c.N_BLOCK * c.K, N_BLOCK: 1, PAIRS: true },
  };
}

/**
 * The bind groups of both passes, after checking every buffer against its `ne`.
 * @throws {RangeError} when a setting is out of range or a buffer too small
 */
export function argmaxTopkBindGroups(
  device: GPUDevice,
  opts: { pipelines: ArgmaxTopkPipelines; constants: ArgmaxTopkConstants; buffers: ArgmaxTopkBuffers },
): ArgmaxTopkBindGroups {
  const { constants: c, buffers: b } = opts;
  checkArgmaxTopk(c);
  const bytes = 8 * c.BUF;
  checkWorkgroupBytes(device, `argmax_topk: BUF=${c.BUF}`, bytes, "lower BUF");
  checkBinding("argmax_topk", "logits", b.logits, [c.N_VOCAB]);
  checkBinding("argmax_topk", "pairs", b.pairs, [2, c.K, c.N_BLOCK]);
  checkBinding("argmax_topk", "result", b.result, [2, c.K]);
  return {
    partial: bindGroup(device, opts.pipelines.partial, [b.logits, b.pairs]),
    final: bindGroup(device, opts.pipelines.final, [b.pairs, b.result]),
  };
}

/** Dispatch grids of the two passes. */
export function argmaxTopkGrids(
  c: ArgmaxTopkConstants,
): { partial: [number, number, number]; final: [number, number, number] } {
  return { partial: [c.N_BLOCK, 1, 1], final: [1, 1, 1] };
}

/** Records both passes into `pass` (the second reads the first's pairs; one pass orders them). */
export function encodeArgmaxTopk(
  pass: GPUComputePassEncoder,
  opts: { pipelines: ArgmaxTopkPipelines; bindGroups: ArgmaxTopkBindGroups; constants: ArgmaxTopkConstants },
): void {
  const grids = argmaxTopkGrids(opts.constants);
  pass.setPipeline(opts.pipelines.partial);
  pass.setBindGroup(0, opts.bindGroups.partial);
  pass.dispatchWorkgroups(...grids.partial);
  pass.setPipeline(opts.pipelines.final);
  pass.setBindGroup(0, opts.bindGroups.final);
  pass.dispatchWorkgroups(...grids.final);
}
