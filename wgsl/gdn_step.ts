/**
 * Host twin of `gdn_step.wgsl`: one gated DeltaNet layer over n tokens of one sequence (decode: n = 1), from
 * the in-projection outputs to the gated-RMSNorm output ô (spec qwen3next.md §8.2-§8.5, §8.7).
 * @module
 */
import { bindGroup, type Binding, type KernelSpec } from "./kernel.ts";

/** Specialisation constants of `gdn_step`: GDN hyper-parameters (a type alias, so it is assignable to `ConstValues`). */
export type GdnStepConstants = {
  /** Key heads n_k (`ssm.group_count`). */
  readonly N_K: number;
  /** Value heads n_v (`ssm.time_step_rank`), a multiple of N_K. */
  readonly N_V: number;
  /** Key head dim d_k (`ssm.state_size`), a multiple of 64, at most 256. */
  readonly D_K: number;
  /** Value head dim d_v (`ssm.inner_size / n_v`), a multiple of 16, at most 128. */
  readonly D_V: number;
  /** Conv taps (`ssm.conv_kernel`), 1 to 4 (`gdn_step` keeps taps and window in vec4s). */
  readonly K_CONV: number;
  /** RMS eps; also the floor of the q/k L2 norms (spec §8.4). */
  readonly EPS: number;
  /** κ(h) = h mod N_K (`qwen35moe`) when true, floor(h / (N_V/N_K)) (`qwen3next`) when false (spec §9). */
  readonly KAPPA_TILED: boolean;
  /** b and a are both the raw `ssm_ba` output in qwen3next's grouped order (spec §8.1). */
  readonly BA_GROUPED: boolean;
  /** Word offset of a in its binding when not grouped (N_V: a right after b in one buffer, decode only). */
  readonly A_OFF: number;
  /**
   * Workgroups per v-head (1, or a divisor of D_V/16), each owning D_V/SPLIT state columns: more workgroups for
   * decode. Above 1, y receives o before the gated norm and `gdn_chunk_norm` must run after the dispatch
   * ({@linkcode gdnStepNeedsNorm}). `gdn_chunk_prep` ignores it.
   */
  readonly SPLIT: number;
  /**
   * Words between columns' params (a batched step's table: column c's [pos0, n, slot] at word c·P_COL); 0 for
   * one column, whose params are [pos0, n] and whose slot is 0. The strides below are 0 for one column too.
   */
  readonly P_COL: number;
  /** Words between columns of x_qkv (C: columns back to back; a fused in-projection's column stride). */
  readonly X_COL: number;
  /** Words between columns of z (N_V·D_V: back to back; a fused in-projection's column stride). */
  readonly Z_COL: number;
  /** Words between columns of b and a (the batched in-projection's padded columns). */
  readonly BA_COL: number;
  /** Words between slots in the conv ring binding (a pool of every slot's ring). */
  readonly RING_COL: number;
  /** Words between slots in the state binding (a pool of every slot's state), a multiple of 4. */
  readonly STATE_COL: number;
  /**
   * Words between the tokens of one column's x_qkv, z, b and a: a short chunk's fused in-projections, one
   * [qkv | z | b | a] output per token; 0: each binding's tokens back to back.
   */
  readonly T_COL: number;
};

/** The column constants of a dispatch of one column (its own params, its slot's own state bindings). */
export const GDN_ONE_COLUMN = {
  P_COL: 0,
  X_COL: 0,
  Z_COL: 0,
  BA_COL: 0,
  RING_COL: 0,
  STATE_COL: 0,
  T_COL: 0,
} as const;

/** Kernel spec of `gdn_step`. */
export const GDN_STEP: KernelSpec = {
  name: "gdn_step",
  url: new URL("./gdn_step.wgsl", import.meta.url),
  lib: ["gdn"],
  constants: {
    N_K: "u32",
    N_V: "u32",
    D_K: "u32",
    D_V: "u32",
    K_CONV: "u32",
    EPS: "f32",
    KAPPA_TILED: "bool",
    BA_GROUPED: "bool",
    A_OFF: "u32",
    SPLIT: "u32",
    P_COL: "u32",
    X_COL: "u32",
    Z_COL: "u32",
    BA_COL: "u32",
    RING_COL: "u32",
    STATE_COL: "u32",
    T_COL: "u32",
  },
};

/** Binding order of `gdn_step` (binding i = entry i). */
export const GDN_STEP_BINDINGS = [
  "params",
  "xQkv",
  "z",
  "b",
  "a",
  "convW",
  "dtBias",
  "ssmA",
  "normW",
  "convRing",
  "state",
  "y",
] as const;

/** The buffers of one `gdn_step` dispatch, named as in {@linkcode GDN_STEP_BINDINGS}. */
export type GdnStepBindings = Readonly<Record<(typeof GDN_STEP_BINDINGS)[number], Binding>>;

/** Words of the params buffer shared by `gdn_step` and `gdn_conv_ring`: u32 ne=[2]. */
export const GDN_PARAMS_WORDS = 2;

/**
 * Packs the params words: word 0 = position of the dispatch's first token (`pos0`), word 1 = token count.
 * @throws {RangeError} on a negative or non-integer position, or a token count below 1
 */
export function packGdnParams(pos0: number, nTokens: number): Uint32Array {
  if (!Number.isInteger(pos0) || pos0 < 0 || pos0 > 0xffffffff) {
    throw new RangeError(`GDN position must be a u32, got ${pos0}`);
  }
  if (!Number.isInteger(nTokens) || nTokens < 1) {
    throw new RangeError(`GDN token count must be a positive integer, got ${nTokens}`);
  }
  return new Uint32Array([pos0, nTokens]);
}

/** Derived sizes of one GDN layer, in f32 elements. */
export interface GdnDims {
  /** Conv channels C = 2·N_K·D_K + N_V·D_V (length of one x_qkv vector). */
  readonly convCh: number;
  /** Elements of one token's z and y: N_V·D_V. */
  readonly inner: number;
  /** Elements of the conv ring: ne=[C, K_CONV]. */
  readonly convRing: number;
  /** Elements of the recurrent state: ne=[D_K, D_V, N_V]. */
  readonly state: number;
}

/** Sizes derived from the constants (the engine allocates conv ring and state per slot and layer from these). */
export function gdnDims(c: GdnStepConstants): GdnDims {
  const convCh = 2 * c.N_K * c.D_K + c.N_V * c.D_V;
  return {
    convCh,
    inner: c.N_V * c.D_V,
    convRing: convCh * c.K_CONV,
    state: c.N_V * c.D_V * c.D_K,
  };
}

/** Bytes of a binding: its explicit size, else the rest of the buffer after its offset. */
export function bindingBytes(b: Binding): number {
  if (b instanceof GPUBuffer) return b.size;
  return b.size ?? b.buffer.size - (b.offset ?? 0);
}

/**
 * Checks the constants against the kernel's limits.
 * @throws {RangeError} naming the constant, its value and the limit
 */
export function checkGdnConstants(c: GdnStepConstants): void {
  const ints: Array<[string, number]> = [
    ["N_K", c.N_K],
    ["N_V", c.N_V],
    ["D_K", c.D_K],
    ["D_V", c.D_V],
    ["K_CONV", c.K_CONV],
  ];
  for (const [name, v] of ints) {
    if (!Number.isInteger(v) || v < 1) {
      throw new RangeError(`gdn_step: ${name} must be a positive integer, got ${v}`);
    }
  }
  if (c.K_CONV > 4) {
    throw new RangeError(
      `gdn_step: K_CONV=${c.K_CONV} exceeds 4 (the kernel keeps each channel's taps and window in one vec4): ` +
        `this model's ssm.conv_kernel is not supported`,
    );
  }
  if (c.N_V % c.N_K !== 0) {
    throw new RangeError(`gdn_step: N_V=${c.N_V} is not a multiple of N_K=${c.N_K}`);
  }
  if (c.D_K % 64 !== 0 || c.D_K > 256) {
    throw new RangeError(`gdn_step: D_K=${c.D_K} must be a multiple of 64 and at most 256`);
  }
  if (c.D_V % 16 !== 0 || c.D_V > 128) {
    throw new RangeError(
      `gdn_step: D_V=${c.D_V} must be a multiple of 16 and at most 128 (workgroup storage)`,
    );
  }
  if (!Number.isInteger(c.SPLIT) || c.SPLIT < 1 || c.D_V % (16 * c.SPLIT) !== 0) {
    throw new RangeError(
      `gdn_step: SPLIT=${c.SPLIT} must be a positive integer with D_V=${c.D_V} a multiple of 16·SPLIT ` +
        `(16 state columns per workgroup at least)`,
    );
  }
  if (c.N_V > 65535) throw new RangeError(`gdn_step: N_V=${c.N_V} exceeds 65535 workgroups`);
  if (!(c.EPS > 0)) throw new RangeError(`gdn_step: EPS must be positive, got ${c.EPS}`);
  if (!Number.isInteger(c.A_OFF) || c.A_OFF < 0 || (c.BA_GROUPED && c.A_OFF !== 0)) {
    throw new RangeError(`gdn_step: A_OFF=${c.A_OFF} must be a non-negative integer, and 0 when BA_GROUPED`);
  }
  const d = gdnDims(c);
  const ba = (c.BA_GROUPED ? 2 * c.N_V : c.N_V) + c.A_OFF;
  const cols: Array<[string, number, number]> = [
    ["P_COL", c.P_COL, 3],
    ["X_COL", c.X_COL, d.convCh],
    ["Z_COL", c.Z_COL, d.inner],
    ["BA_COL", c.BA_COL, ba],
    ["RING_COL", c.RING_COL, d.convRing],
    ["STATE_COL", c.STATE_COL, d.state],
    ["T_COL", c.T_COL, Math.max(d.convCh, d.inner, ba)],
  ];
  for (const [name, v, min] of cols) {
    if (!Number.isInteger(v) || v < 0 || (v > 0 && v < min)) {
      throw new RangeError(
        `gdn_step: ${name}=${v} must be 0 (one column) or a stride of at least ${min} words (one column's data)`,
      );
    }
  }
  if (c.STATE_COL % 4 !== 0) {
    throw new RangeError(`gdn_step: STATE_COL=${c.STATE_COL} is not a multiple of 4`);
  }
}

/**
 * Checks constants and every binding's size for dispatches of up to `maxTokens` tokens in each of `cols`
 * columns (default 1; several need n = 1 and the column strides) whose table names slots below `slots`
 * (default 1).
 * @throws {RangeError} naming the binding, its bytes, the bytes it needs and its `ne`
 */
export function checkGdnStep(
  c: GdnStepConstants,
  opts: { bindings: GdnStepBindings; maxTokens: number; cols?: number; slots?: number },
): void {
  checkGdnConstants(c);
  const n = opts.maxTokens;
  if (!Number.isInteger(n) || n < 1) throw new RangeError(`gdn_step: maxTokens must be >= 1, got ${n}`);
  const cols = opts.cols ?? 1;
  const slots = opts.slots ?? 1;
  if (!Number.isInteger(cols) || cols < 1 || cols > 65535 || !Number.isInteger(slots) || slots < 1) {
    throw new RangeError(`gdn_step: cols (${cols}) and slots (${slots}) must be positive integers`);
  }
  if (cols > 1 && (n !== 1 || [c.P_COL, c.X_COL, c.Z_COL, c.BA_COL].includes(0))) {
    throw new RangeError(
      `gdn_step: ${cols} columns need one token each (got maxTokens ${n}) and P_COL, X_COL, Z_COL, BA_COL ` +
        `strides (got ${c.P_COL}, ${c.X_COL}, ${c.Z_COL}, ${c.BA_COL})`,
    );
  }
  if (slots > 1 && (c.P_COL === 0 || c.RING_COL === 0 || c.STATE_COL === 0)) {
    throw new RangeError(`gdn_step: ${slots} slots need P_COL, RING_COL and STATE_COL strides`);
  }
  const d = gdnDims(c);
  const ba = c.BA_GROUPED ? 2 * c.N_V : c.N_V;
  const nc = n * cols;
  // Words of n tokens of `words` each: back to back, or T_COL apart.
  const tokens = (words: number) => c.T_COL > 0 ? (n - 1) * c.T_COL + words : n * words;
  const need: Record<(typeof GDN_STEP_BINDINGS)[number], [number, string]> = {
    params: c.P_COL > 0 ? [(cols - 1) * c.P_COL + 3, `u32 [pos0, n, slot] per ${c.P_COL} words`] : [
      GDN_PARAMS_WORDS,
      "u32 ne=[2]",
    ],
    xQkv: [(cols - 1) * c.X_COL + tokens(d.convCh), `ne=[${d.convCh}, ${n}] per column`],
    z: [(cols - 1) * c.Z_COL + tokens(d.inner), `ne=[${d.inner}, ${n}] per column`],
    b: [(cols - 1) * c.BA_COL + tokens(ba), `ne=[${ba}, ${n}] per column`],
    a: [(cols - 1) * c.BA_COL + tokens(ba) + c.A_OFF, `ne=[${ba}, ${n}] from word ${c.A_OFF} per column`],
    convW: [c.K_CONV * d.convCh, `ne=[${c.K_CONV}, ${d.convCh}]`],
    dtBias: [c.N_V, `ne=[${c.N_V}]`],
    ssmA: [c.N_V, `ne=[${c.N_V}]`],
    normW: [c.D_V, `ne=[${c.D_V}]`],
    convRing: [(slots - 1) * c.RING_COL + d.convRing, `ne=[${d.convCh}, ${c.K_CONV}] per slot`],
    state: [(slots - 1) * c.STATE_COL + d.state, `ne=[${c.D_K}, ${c.D_V}, ${c.N_V}] per slot`],
    y: [d.inner * nc, `ne=[${d.inner}, ${nc}]`],
  };
  for (const name of GDN_STEP_BINDINGS) {
    const [words, ne] = need[name];
    const got = bindingBytes(opts.bindings[name]);
    if (got < words * 4) {
      throw new RangeError(
        `gdn_step binding ${name} has ${got} bytes but needs ${words * 4} (${ne}, 4-byte elements): ` +
          `allocate it for ${n} token(s) in ${cols} column(s) of ${slots} slot(s)`,
      );
    }
  }
}

/** Dispatch grid of `gdn_step`: SPLIT workgroups per v-head, in each of `cols` columns (default 1). */
export function gdnStepGrid(c: GdnStepConstants, cols = 1): [number, number, number] {
  return [c.N_V, c.SPLIT, cols];
}

/** Whether `gdn_chunk_norm` must follow the dispatch (SPLIT > 1: y holds o before the gated norm). */
export function gdnStepNeedsNorm(c: GdnStepConstants): boolean {
  return c.SPLIT > 1;
}

/**
 * Records one `gdn_step` dispatch into a caller-supplied compute pass. The token count and position come from
 * the params buffer (GPU-side); `maxTokens` is what the bindings were sized for; `cols` columns (a batched
 * step) take their slots from the params table. When the params may say
 * n > 1, record `encodeGdnConvRing` right after it in the same pass.
 * @throws {RangeError} from {@linkcode checkGdnStep}, before anything is recorded
 */
export function encodeGdnStep(
  pass: GPUComputePassEncoder,
  opts: {
    device: GPUDevice;
    pipeline: GPUComputePipeline;
    constants: GdnStepConstants;
    bindings: GdnStepBindings;
    maxTokens: number;
    cols?: number;
    slots?: number;
  },
): void {
  checkGdnStep(opts.constants, opts);
  const group = bindGroup(opts.device, opts.pipeline, GDN_STEP_BINDINGS.map((k) => opts.bindings[k]));
  pass.setPipeline(opts.pipeline);
  pass.setBindGroup(0, group);
  pass.dispatchWorkgroups(...gdnStepGrid(opts.constants, opts.cols));
}
