/**
 * Host twin of `gdn_conv_ring.wgsl`: after a multi-token `gdn_step`, stores the last K_CONV-1 pre-conv
 * inputs in the conv ring (spec qwen3next.md §8.3, ring layout in `gdn_step.wgsl`); its tap entry point
 * (`gdn_conv_ring_tap`) copies the ring as it stands after a dispatch's first `cut` tokens elsewhere, for a
 * snapshot inside a chunked prefill (`gdn_chunk`'s cut).
 * @module
 */
import { bindGroup, type Binding, type KernelSpec } from "./kernel.ts";
import { bindingBytes, GDN_PARAMS_WORDS } from "./gdn_step.ts";
import { bindingsOverlap } from "./gdn_chunk.ts";

/** Specialisation constants of `gdn_conv_ring` (a type alias, so it is assignable to `ConstValues`). */
export type GdnConvRingConstants = {
  /** Conv channels C = 2·n_k·d_k + n_v·d_v (see `gdnDims`). */
  readonly CONV_CH: number;
  /** Conv taps (`ssm.conv_kernel`); the ring has K_CONV slots. */
  readonly K_CONV: number;
  /** Words between tokens of x_qkv (gdn_step's T_COL: a fused in-projection output per token); 0: CONV_CH. */
  readonly T_COL: number;
};

/** Kernel spec of `gdn_conv_ring`. */
export const GDN_CONV_RING: KernelSpec = {
  name: "gdn_conv_ring",
  url: new URL("./gdn_conv_ring.wgsl", import.meta.url),
  lib: [],
  constants: { CONV_CH: "u32", K_CONV: "u32", T_COL: "u32" },
};

/**
 * Kernel spec of the tap `gdn_conv_ring_tap` (entry point `main_tap` of `gdn_conv_ring.wgsl`, the same
 * constants): into `tap`, the ring after the dispatch's first min(cut, n) tokens (params word 2, as
 * `gdn_chunk`'s), the ring itself left as it is; nothing written when cut is 0. Record it BEFORE the
 * ordinary {@linkcode GDN_CONV_RING} dispatch of the same tokens, which updates the ring in place. Its own
 * entry point rather than a constant: WebGPU's automatic layout keeps a binding that code under a false
 * constant names, which would make every ordinary dispatch bind a tap.
 */
export const GDN_CONV_RING_TAP: KernelSpec = {
  name: "gdn_conv_ring_tap",
  url: new URL("./gdn_conv_ring.wgsl", import.meta.url),
  lib: [],
  constants: GDN_CONV_RING.constants,
  entry: "main_tap",
};

/** Binding order of `gdn_conv_ring` (binding i = entry i). */
export const GDN_CONV_RING_BINDINGS = ["params", "xQkv", "convRing"] as const;

/** Binding order of `gdn_conv_ring_tap`: the ordinary bindings, then `tap`. */
export const GDN_CONV_RING_TAP_BINDINGS = [...GDN_CONV_RING_BINDINGS, "tap"] as const;

/**
 * The buffers of one `gdn_conv_ring` dispatch: the same params, x_qkv and ring as the `gdn_step` before it;
 * `tap` (ring-sized, the ring's layout) for `gdn_conv_ring_tap` only, whose params must hold the cut word.
 */
export type GdnConvRingBindings =
  & Readonly<Record<(typeof GDN_CONV_RING_BINDINGS)[number], Binding>>
  & { readonly tap?: Binding };

/** Words of the params binding `gdn_conv_ring_tap` reads: [pos0, n, cut] (`gdn_chunk`'s params). */
const TAP_PARAMS_WORDS = 3;

/** Invocations per workgroup (one channel each). */
const WG = 64;

/** Dispatch grid of `gdn_conv_ring`: one invocation per channel. */
export function gdnConvRingGrid(c: GdnConvRingConstants): [number, number, number] {
  return [Math.ceil(c.CONV_CH / WG), 1, 1];
}

/**
 * Checks constants and binding sizes for dispatches of up to `maxTokens` tokens; with `tap`, those of
 * `gdn_conv_ring_tap` (a ring-sized `tap` binding, given exactly then and sharing no bytes with the others,
 * and params of 3 words).
 * @throws {RangeError} naming the constant or binding, what it has and what it needs
 */
export function checkGdnConvRing(
  c: GdnConvRingConstants,
  opts: { bindings: GdnConvRingBindings; maxTokens: number; tap?: boolean },
): void {
  if (!Number.isInteger(c.CONV_CH) || c.CONV_CH < 1 || Math.ceil(c.CONV_CH / WG) > 65535) {
    throw new RangeError(`gdn_conv_ring: CONV_CH must be in 1..${65535 * WG}, got ${c.CONV_CH}`);
  }
  if (!Number.isInteger(c.K_CONV) || c.K_CONV < 1) {
    throw new RangeError(`gdn_conv_ring: K_CONV must be a positive integer, got ${c.K_CONV}`);
  }
  if (!Number.isInteger(c.T_COL) || (c.T_COL !== 0 && c.T_COL < c.CONV_CH)) {
    throw new RangeError(
      `gdn_conv_ring: T_COL=${c.T_COL} must be 0 or a stride of at least CONV_CH=${c.CONV_CH}`,
    );
  }
  const n = opts.maxTokens;
  if (!Number.isInteger(n) || n < 1) throw new RangeError(`gdn_conv_ring: maxTokens must be >= 1, got ${n}`);
  const xT = c.T_COL || c.CONV_CH;
  const tap = opts.tap ?? false;
  if (tap !== (opts.bindings.tap !== undefined)) {
    throw new RangeError(
      tap
        ? "gdn_conv_ring_tap: the tap binding is missing (a ring-sized buffer for the ring after the cut)"
        : "gdn_conv_ring: a tap binding is given to the ordinary dispatch (gdn_conv_ring_tap writes taps)",
    );
  }
  const ring: [number, string] = [c.CONV_CH * c.K_CONV, `ne=[${c.CONV_CH}, ${c.K_CONV}]`];
  const need: Record<(typeof GDN_CONV_RING_TAP_BINDINGS)[number], [number, string]> = {
    params: tap ? [TAP_PARAMS_WORDS, "u32 ne=[3]: [pos0, n, cut]"] : [GDN_PARAMS_WORDS, "u32 ne=[2]"],
    xQkv: [(n - 1) * xT + c.CONV_CH, `ne=[${c.CONV_CH}, ${n}] at ${xT} words a token`],
    convRing: ring,
    tap: ring,
  };
  const kernel = tap ? "gdn_conv_ring_tap" : "gdn_conv_ring";
  for (const name of tap ? GDN_CONV_RING_TAP_BINDINGS : GDN_CONV_RING_BINDINGS) {
    const [words, ne] = need[name];
    const got = bindingBytes(opts.bindings[name]!);
    if (got < words * 4) {
      throw new RangeError(
        `${kernel} binding ${name} has ${got} bytes but needs ${words * 4} (${ne}, 4-byte elements): ` +
          `allocate it for ${n} token(s)`,
      );
    }
  }
  for (const name of tap ? GDN_CONV_RING_BINDINGS : []) {
    if (bindingsOverlap(opts.bindings.tap!, opts.bindings[name])) {
      throw new RangeError(
        `gdn_conv_ring_tap binding tap overlaps binding ${name}: the tap is written, give it its own bytes`,
      );
    }
  }
}

/**
 * Records one `gdn_conv_ring` dispatch into a caller-supplied compute pass; record it after the `gdn_step`
 * dispatch that read the ring, with the same params, x_qkv and ring. With `tap` (and `pipeline` then
 * {@linkcode GDN_CONV_RING_TAP}'s, `bindings.tap` given): the tap dispatch instead, recorded before the
 * ordinary one.
 * @throws {RangeError} from {@linkcode checkGdnConvRing}, before anything is recorded
 */
export function encodeGdnConvRing(
  pass: GPUComputePassEncoder,
  opts: {
    device: GPUDevice;
    pipeline: GPUComputePipeline;
    constants: GdnConvRingConstants;
    bindings: GdnConvRingBindings;
    maxTokens: number;
    tap?: boolean;
  },
): void {
  checkGdnConvRing(opts.constants, opts);
  const order = opts.tap ? GDN_CONV_RING_TAP_BINDINGS : GDN_CONV_RING_BINDINGS;
  const group = bindGroup(opts.device, opts.pipeline, order.map((k) => opts.bindings[k]!));
  pass.setPipeline(opts.pipeline);
  pass.setBindGroup(0, group);
  pass.dispatchWorkgroups(...gdnConvRingGrid(opts.constants));
}
