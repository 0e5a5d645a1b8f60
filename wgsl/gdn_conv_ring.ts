/**
 * Host twin of `gdn_conv_ring.wgsl`: after a multi-token `gdn_step`, stores the last K_CONV-1 pre-conv
 * inputs in the conv ring (spec qwen3next.md §8.3, ring layout in `gdn_step.wgsl`).
 * @module
 */
import { bindGroup, type Binding, type KernelSpec } from "./kernel.ts";
import { bindingBytes, GDN_PARAMS_WORDS } from "./gdn_step.ts";

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

/** Binding order of `gdn_conv_ring` (binding i = entry i). */
export const GDN_CONV_RING_BINDINGS = ["params", "xQkv", "convRing"] as const;

/** The buffers of one `gdn_conv_ring` dispatch: the same params, x_qkv and ring as the `gdn_step` before it. */
export type GdnConvRingBindings = Readonly<Record<(typeof GDN_CONV_RING_BINDINGS)[number], Binding>>;

/** Invocations per workgroup (one channel each). */
const WG = 64;

/** Dispatch grid of `gdn_conv_ring`: one invocation per channel. */
export function gdnConvRingGrid(c: GdnConvRingConstants): [number, number, number] {
  return [Math.ceil(c.CONV_CH / WG), 1, 1];
}

/**
 * Checks constants and binding sizes for dispatches of up to `maxTokens` tokens.
 * @throws {RangeError} naming the constant or binding, what it has and what it needs
 */
export function checkGdnConvRing(
  c: GdnConvRingConstants,
  opts: { bindings: GdnConvRingBindings; maxTokens: number },
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
  const need: Record<(typeof GDN_CONV_RING_BINDINGS)[number], [number, string]> = {
    params: [GDN_PARAMS_WORDS, "u32 ne=[2]"],
    xQkv: [(n - 1) * xT + c.CONV_CH, `ne=[${c.CONV_CH}, ${n}] at ${xT} words a token`],
    convRing: [c.CONV_CH * c.K_CONV, `ne=[${c.CONV_CH}, ${c.K_CONV}]`],
  };
  for (const name of GDN_CONV_RING_BINDINGS) {
    const [words, ne] = need[name];
    const got = bindingBytes(opts.bindings[name]);
    if (got < words * 4) {
      throw new RangeError(
        `gdn_conv_ring binding ${name} has ${got} bytes but needs ${words * 4} (${ne}, 4-byte elements): ` +
          `allocate it for ${n} token(s)`,
      );
    }
  }
}

/**
 * Records one `gdn_conv_ring` dispatch into a caller-supplied compute pass; record it after the `gdn_step`
 * dispatch that read the ring, with the same params, x_qkv and ring.
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
  },
): void {
  checkGdnConvRing(opts.constants, opts);
  const group = bindGroup(opts.device, opts.pipeline, GDN_CONV_RING_BINDINGS.map((k) => opts.bindings[k]));
  pass.setPipeline(opts.pipeline);
  pass.setBindGroup(0, group);
  pass.dispatchWorkgroups(...gdnConvRingGrid(opts.constants));
}
