/**
 * Host twin of `moe_route.wgsl`: router logits → softmax → top-k expert ids (ties to the lower index) and
 * renormalised weights (spec §10), left in GPU buffers for the expert matvecs.
 * @module
 */
import { bindGroup, type Binding, type KernelSpec } from "./kernel.ts";
import {
  checkBinding,
  checkInt,
  checkShape,
  checkWorkgroupBytes,
  isPow2,
  MAX_WORKGROUPS_PER_DIM,
} from "./_twin.ts";

/**
 * Constants of `moe_route.wgsl`: nExpert, nExpertUsed, workgroup size, weights scale (1 when the model has
 * no `expert_weights_scale` or it is 0; see {@linkcode moeWeightsScale}).
 */
export type MoeRouteConstants = {
  readonly N_EXPERT: number;
  readonly N_EXPERT_USED: number;
  readonly WG: number;
  readonly W_SCALE: number;
  /** Also round each token's x to int8 for the gate·up pass (moe_matvec_q8 reading int8 x). */
  readonly XQ: boolean;
  /** XQ: the chunks of x (K / 32); 1 otherwise. */
  readonly KC: number;
  /** XQ: the byte order of the experts' weight type (`q8Layout`); 0 otherwise. */
  readonly LAYOUT: number;
  /**
   * With XQ: x is the post-attention RMSNorm's input and the logits the router's W·(x ⊙ nw) (matvec NORM 2):
   * the kernel scales the logits by each token's norm scale (those past N_EXPERT in place) and rounds the
   * normed row.
   */
  readonly NORM: boolean;
  /** NORM: the norm's epsilon (0 otherwise). */
  readonly EPS: number;
  /**
   * The logits' stride per token (≥ N_EXPERT): N_EXPERT, or more where one mat-vec wrote each token's expert
   * logits and the shared expert's gate logit after them.
   */
  readonly LOGITS_COL: number;
};

/** Kernel spec of `moe_route.wgsl`. */
export const MOE_ROUTE: KernelSpec = {
  name: "moe_route",
  url: new URL("./moe_route.wgsl", import.meta.url),
  lib: ["route", "q8pack", "rms"],
  constants: {
    N_EXPERT: "u32",
    N_EXPERT_USED: "u32",
    WG: "u32",
    W_SCALE: "f32",
    XQ: "bool",
    KC: "u32",
    LAYOUT: "u32",
    NORM: "bool",
    EPS: "f32",
    LOGITS_COL: "u32",
  },
};

/**
 * Binding order: logits f32 ne=[LOGITS_COL, nTokens] (read_write); ids u32 ne=[N_EXPERT_USED, nTokens];
 * weights f32 ne=[N_EXPERT_USED, nTokens]; x f32 ne=[32·KC, nTokens] and xq u32 ne=[9·KC, nTokens] (XQ;
 * otherwise any buffer not bound elsewhere); nw f32 ne=[32·KC] (NORM; otherwise any buffer of ≥ 16 bytes).
 */
export const MOE_ROUTE_BINDINGS = ["logits", "ids", "weights", "x", "xq", "nw"] as const;

/** Buffers of one `moe_route` dispatch, by binding name. */
export type MoeRouteBuffers = Readonly<Record<(typeof MOE_ROUTE_BINDINGS)[number], Binding>>;

/** The W_SCALE constant for a model's optional `expert_weights_scale` (absent or 0 means no scaling). */
export function moeWeightsScale(expertWeightsScale: number | undefined): number {
  return expertWeightsScale === undefined || expertWeightsScale === 0 ? 1 : expertWeightsScale;
}

/**
 * Checks constants and the token count against the kernel's limits.
 * @throws {RangeError} naming the offending value
 */
export function checkMoeRoute(c: MoeRouteConstants, nTokens: number): void {
  checkInt("moe_route: N_EXPERT", c.N_EXPERT, 1, 4096);
  checkInt("moe_route: N_EXPERT_USED", c.N_EXPERT_USED, 1, Math.min(c.N_EXPERT, 256));
  checkShape(isPow2(c.WG) && c.WG <= 256, `moe_route: WG must be a power of two <= 256, got ${c.WG}`);
  checkShape(Number.isFinite(c.W_SCALE) && c.W_SCALE !== 0, `moe_route: W_SCALE must be finite and non-zero`);
  checkInt("moe_route: nTokens", nTokens, 1, MAX_WORKGROUPS_PER_DIM);
  checkInt("moe_route: LOGITS_COL", c.LOGITS_COL, c.N_EXPERT, 1 << 20);
  if (c.XQ) {
    checkInt("moe_route: KC (K / 32 with XQ)", c.KC, 1, 1 << 20);
    checkInt("moe_route: LAYOUT", c.LAYOUT, 0, 1);
  }
  checkShape(
    !c.NORM || (c.XQ && Number.isFinite(c.EPS) && c.EPS > 0),
    `moe_route: NORM needs XQ (the token's row in workgroup memory) and the norm's EPS > 0`,
  );
}

/**
 * The bind group of one dispatch, after checking every buffer against its `ne`.
 * @throws {RangeError} when a constant is out of range or a buffer too small
 */
export function moeRouteBindGroup(
  device: GPUDevice,
  opts: {
    pipeline: GPUComputePipeline;
    constants: MoeRouteConstants;
    nTokens: number;
    buffers: MoeRouteBuffers;
  },
): GPUBindGroup {
  const { constants: c, nTokens: n, buffers: b } = opts;
  checkMoeRoute(c, n);
  checkWorkgroupBytes(
    device,
    `moe_route: N_EXPERT=${c.N_EXPERT}, N_EXPERT_USED=${c.N_EXPERT_USED}, KC=${c.KC}`,
    moeRouteWorkgroupBytes(c),
    "route without XQ (the expert passes then round x themselves)",
  );
  checkBinding("moe_route", "logits", b.logits, [c.LOGITS_COL, n]);
  checkBinding("moe_route", "ids", b.ids, [c.N_EXPERT_USED, n]);
  checkBinding("moe_route", "weights", b.weights, [c.N_EXPERT_USED, n]);
  if (c.XQ) {
    checkBinding("moe_route", "x", b.x, [32 * c.KC, n]);
    checkBinding("moe_route", "xq", b.xq, [9 * c.KC, n]);
  }
  if (c.NORM) checkBinding("moe_route", "nw", b.nw, [32 * c.KC]);
  return bindGroup(device, opts.pipeline, MOE_ROUTE_BINDINGS.map((name) => b[name]));
}

/**
 * Workgroup memory of a moe_route variant in bytes: the logits, the selection, (XQ) the token's x and (NORM)
 * the norm's partial sums.
 */
export function moeRouteWorkgroupBytes(
  c: Pick<MoeRouteConstants, "N_EXPERT" | "N_EXPERT_USED" | "KC" | "NORM" | "WG">,
): number {
  return 4 * c.N_EXPERT + 8 * c.N_EXPERT_USED + 128 * c.KC + (c.NORM ? 4 * c.WG : 0);
}

/** Dispatch grid: one workgroup per token. */
export function moeRouteGrid(nTokens: number): [number, number, number] {
  return [nTokens, 1, 1];
}

/**
 * Records one `moe_route` dispatch into `pass`.
 * @throws {RangeError} on constants or a token count the kernel cannot handle
 */
export function encodeMoeRoute(
  pass: GPUComputePassEncoder,
  opts: {
    pipeline: GPUComputePipeline;
    bindGroup: GPUBindGroup;
    constants: MoeRouteConstants;
    nTokens: number;
  },
): void {
  checkMoeRoute(opts.constants, opts.nTokens);
  pass.setPipeline(opts.pipeline);
  pass.setBindGroup(0, opts.bindGroup);
  pass.dispatchWorkgroups(...moeRouteGrid(opts.nTokens));
}
