/**
 * Host twin of `attn_prefill.wgsl`: causal gated GQA attention (flash form, online softmax) for a chunk of
 * `nTokens` new tokens over the KV cache, which already holds the chunk (written by `attn_qk_rope`).
 * @module
 */
import { bindGroup, type Binding, type KernelSpec } from "./kernel.ts";
import { ATTN_PARAMS_WORDS, kvCacheWords } from "./attn_params.ts";
import { checkBinding, checkInt, checkShape, isPow2, MAX_WORKGROUPS_PER_DIM } from "./_twin.ts";

/**
 * Constants of `attn_prefill.wgsl`: heads, headDim, cache capacity, query tokens per workgroup, key
 * positions per tile, workgroup size, score scale.
 */
export type AttnPrefillConstants = {
  readonly H_Q: number;
  readonly H_KV: number;
  readonly D_H: number;
  readonly P_MAX: number;
  readonly BQ: number;
  readonly TILE: number;
  readonly WG: number;
  readonly SCALE: number;
  readonly KV_F16: boolean;
};

/** Kernel spec of `attn_prefill.wgsl`. */
export const ATTN_PREFILL: KernelSpec = {
  name: "attn_prefill",
  url: new URL("./attn_prefill.wgsl", import.meta.url),
  lib: ["attn"],
  constants: {
    H_Q: "u32",
    H_KV: "u32",
    D_H: "u32",
    P_MAX: "u32",
    BQ: "u32",
    TILE: "u32",
    WG: "u32",
    SCALE: "f32",
    KV_F16: "bool",
  },
};

/**
 * Binding order: params AttnParams; q f32 ne=[D_H, H_Q, nTokens]; qf f32 ne=[2*D_H, H_Q, nTokens];
 * kCache, vCache u32 words
 * of ne=[D_H, P_MAX, H_KV] ({@linkcode kvCacheWords}: f32, or f16 pairs with KV_F16); o f32 ne=[D_H, H_Q, nTokens].
 */
export const ATTN_PREFILL_BINDINGS = ["params", "q", "qf", "kCache", "vCache", "o"] as const;

/** Buffers of one `attn_prefill` dispatch, by binding name. */
export type AttnPrefillBuffers = Readonly<Record<(typeof ATTN_PREFILL_BINDINGS)[number], Binding>>;

/** Workgroup memory of one variant in bytes (must fit the device's maxComputeWorkgroupStorageSize). */
export function attnPrefillWorkgroupBytes(c: AttnPrefillConstants): number {
  const r = c.BQ * c.H_Q / c.H_KV;
  return 4 * ((r + c.TILE) * (c.D_H + 4) + r * c.TILE + 3 * r);
}

/**
 * Checks constants and the chunk's token capacity against the kernel's limits.
 * @throws {RangeError} naming the offending value
 */
export function checkAttnPrefill(c: AttnPrefillConstants, nTokens: number, maxWorkgroupBytes: number): void {
  checkInt("attn_prefill: H_KV", c.H_KV, 1, MAX_WORKGROUPS_PER_DIM);
  checkShape(
    Number.isInteger(c.H_Q) && c.H_Q >= c.H_KV && c.H_Q % c.H_KV === 0,
    `attn_prefill: H_Q (${c.H_Q}) must be a multiple of H_KV (${c.H_KV})`,
  );
  checkInt("attn_prefill: D_H", c.D_H, 1, 4096);
  checkShape(c.D_H % 4 === 0, `attn_prefill: D_H (${c.D_H}) must be a multiple of 4 (vec4 rows)`);
  checkInt("attn_prefill: P_MAX", c.P_MAX, 1, 2 ** 24);
  checkInt("attn_prefill: BQ", c.BQ, 1, 256);
  checkInt("attn_prefill: TILE", c.TILE, 1, 256);
  checkShape(isPow2(c.WG) && c.WG <= 256, `attn_prefill: WG must be a power of two <= 256, got ${c.WG}`);
  const rows = c.BQ * c.H_Q / c.H_KV;
  checkShape(
    (rows * c.D_H) % c.WG === 0,
    `attn_prefill: BQ * G * D_H (${rows} * ${c.D_H}) must be a multiple of WG (${c.WG})`,
  );
  checkShape(c.SCALE > 0, `attn_prefill: SCALE must be > 0, got ${c.SCALE}`);
  const bytes = attnPrefillWorkgroupBytes(c);
  checkShape(
    bytes <= maxWorkgroupBytes,
    `attn_prefill: workgroup memory ${bytes} bytes exceeds the device's ${maxWorkgroupBytes}: lower BQ or TILE`,
  );
  checkInt("attn_prefill: nTokens", nTokens, 1, c.BQ * MAX_WORKGROUPS_PER_DIM);
}

/**
 * The bind group of one dispatch, after checking constants and every buffer against its `ne`.
 * @throws {RangeError} when a constant is out of range or a buffer too small
 */
export function attnPrefillBindGroup(
  device: GPUDevice,
  opts: {
    pipeline: GPUComputePipeline;
    constants: AttnPrefillConstants;
    nTokens: number;
    buffers: AttnPrefillBuffers;
  },
): GPUBindGroup {
  const { constants: c, nTokens: n, buffers: b } = opts;
  checkAttnPrefill(c, n, device.limits.maxComputeWorkgroupStorageSize);
  const k = "attn_prefill";
  checkBinding(k, "params", b.params, [ATTN_PARAMS_WORDS]);
  checkBinding(k, "q", b.q, [c.D_H, c.H_Q, n]);
  checkBinding(k, "qf", b.qf, [2 * c.D_H, c.H_Q, n]);
  checkBinding(k, "kCache", b.kCache, [kvCacheWords(c)]);
  checkBinding(k, "vCache", b.vCache, [kvCacheWords(c)]);
  checkBinding(k, "o", b.o, [c.D_H, c.H_Q, n]);
  return bindGroup(device, opts.pipeline, ATTN_PREFILL_BINDINGS.map((name) => b[name]));
}

/** Dispatch grid: ceil(nTokens / BQ) query blocks by H_KV KV heads. */
export function attnPrefillGrid(c: AttnPrefillConstants, nTokens: number): [number, number, number] {
  return [Math.ceil(nTokens / c.BQ), c.H_KV, 1];
}

/**
 * Records one `attn_prefill` dispatch into `pass`; `nTokens` is the capacity the grid covers (the
 * AttnParams buffer's `n_tokens` may be smaller).
 * @throws {RangeError} on a token count the kernel cannot handle
 */
export function encodeAttnPrefill(
  pass: GPUComputePassEncoder,
  opts: {
    pipeline: GPUComputePipeline;
    bindGroup: GPUBindGroup;
    constants: AttnPrefillConstants;
    nTokens: number;
  },
): void {
  checkInt("attn_prefill: nTokens", opts.nTokens, 1, opts.constants.BQ * MAX_WORKGROUPS_PER_DIM);
  pass.setPipeline(opts.pipeline);
  pass.setBindGroup(0, opts.bindGroup);
  pass.dispatchWorkgroups(...attnPrefillGrid(opts.constants, opts.nTokens));
}
