/**
 * Host twin of `attn_decode.wgsl`: split-K GQA attention of one query token over the KV cache, writing
 * per-split partials (O, m, l) that `attn_combine` merges. The grid is constant (`N_SPLIT` by `H_KV` by the
 * columns) whatever the positions, so a decode step can be pre-encoded; a batched step's columns (one token of
 * each of several slots, caches pooled) run in one dispatch, each with its solo dispatch's arithmetic.
 * @module
 */
import { bindGroup, type Binding, type KernelSpec } from "./kernel.ts";
import { ATTN_PARAMS_WORDS, kvCacheWords } from "./attn_params.ts";
import { checkBinding, checkInt, checkShape, isPow2, MAX_WORKGROUPS_PER_DIM } from "./_twin.ts";

/**
 * Constants of `attn_decode.wgsl`: heads, headDim, cache capacity, split count, positions per tile (per three
 * barriers), shortest split (a multiple of TILE), workgroup size, score scale (1/sqrt(headDim) unless the
 * model gives one), f16 cache, keys per invocation in the q·k phase (1 or 2: 2 reuses each q block).
 */
export type AttnDecodeConstants = {
  readonly H_Q: number;
  readonly H_KV: number;
  readonly D_H: number;
  readonly P_MAX: number;
  readonly N_SPLIT: number;
  readonly TILE: number;
  readonly PER_MIN: number;
  readonly WG: number;
  readonly SCALE: number;
  readonly KV_F16: boolean;
  readonly KPT: number;
  /**
   * Words between columns' params (a batched step's table: column c's [pos0, n_tokens, slot] at word c·P_COL);
   * 0 for one column (AttnParams, slot 0).
   */
  readonly P_COL: number;
  /** Words between slots in the KV cache bindings (pooled caches of every slot); 0 for one column. */
  readonly KV_COL: number;
};

/** The column constants of a dispatch of one column (its own params and its slot's own caches). */
export const ATTN_DECODE_ONE_COLUMN = { P_COL: 0, KV_COL: 0 } as const;

/** Kernel spec of `attn_decode.wgsl`. */
export const ATTN_DECODE: KernelSpec = {
  name: "attn_decode",
  url: new URL("./attn_decode.wgsl", import.meta.url),
  lib: [],
  constants: {
    H_Q: "u32",
    H_KV: "u32",
    D_H: "u32",
    P_MAX: "u32",
    N_SPLIT: "u32",
    TILE: "u32",
    PER_MIN: "u32",
    WG: "u32",
    SCALE: "f32",
    KV_F16: "bool",
    KPT: "u32",
    P_COL: "u32",
    KV_COL: "u32",
  },
};

/**
 * Binding order: params AttnParams (several columns: the column table); q f32 ne=[D_H, H_Q, columns];
 * kCache, vCache u32 words of ne=[D_H, P_MAX, H_KV] ({@linkcode kvCacheWords}: f32, or f16 pairs with KV_F16),
 * per slot at KV_COL words when pooled; partO f32 ne=[D_H, H_Q, N_SPLIT]; partMl f32 ne=[2, H_Q, N_SPLIT],
 * per column at the words {@linkcode attnDecodeColumnWords} gives.
 */
export const ATTN_DECODE_BINDINGS = ["params", "q", "kCache", "vCache", "partO", "partMl"] as const;

/** Buffers of one `attn_decode` dispatch, by binding name. */
export type AttnDecodeBuffers = Readonly<Record<(typeof ATTN_DECODE_BINDINGS)[number], Binding>>;

/** Workgroup memory of one variant in bytes (must fit the device's maxComputeWorkgroupStorageSize). */
export function attnDecodeWorkgroupBytes(c: AttnDecodeConstants): number {
  const g = c.H_Q / c.H_KV;
  const g4 = Math.ceil(g / 4);
  // qs (4x4 blocks of head quads), part, sc, p_s and corr_s (head quads).
  return 16 * g4 * c.D_H + 4 * g * c.WG * c.KPT + 4 * g * c.TILE + 16 * g4 * c.TILE + 16 * g4;
}

/**
 * Positions per split and the splits used at position `pos` (context pos + 1, at most P_MAX): the kernel's
 * and attn_combine's formula, `per = max(PER_MIN, roundup(ceil(ctx / N_SPLIT), TILE))`, `used = ceil(ctx / per)`.
 */
export function attnDecodeSplits(
  c: { readonly N_SPLIT: number; readonly TILE: number; readonly PER_MIN: number; readonly P_MAX: number },
  pos: number,
): { per: number; used: number } {
  const ctx = Math.min(pos + 1, c.P_MAX);
  const per = Math.max(c.PER_MIN, Math.ceil(Math.ceil(ctx / c.N_SPLIT) / c.TILE) * c.TILE);
  return { per, used: Math.ceil(ctx / per) };
}

/**
 * Checks constants against the kernel's limits; `maxWorkgroupBytes` is the device's workgroup storage.
 * @throws {RangeError} naming the offending value
 */
export function checkAttnDecode(c: AttnDecodeConstants, maxWorkgroupBytes: number): void {
  checkInt("attn_decode: H_KV", c.H_KV, 1, MAX_WORKGROUPS_PER_DIM);
  checkShape(
    Number.isInteger(c.H_Q) && c.H_Q >= c.H_KV && c.H_Q % c.H_KV === 0,
    `attn_decode: H_Q (${c.H_Q}) must be a multiple of H_KV (${c.H_KV})`,
  );
  checkInt("attn_decode: D_H", c.D_H, 1, 4096);
  checkShape(c.D_H % 8 === 0, `attn_decode: D_H (${c.D_H}) must be a multiple of 8 (16-byte cache loads)`);
  checkInt("attn_decode: P_MAX", c.P_MAX, 1, 2 ** 24);
  checkInt("attn_decode: N_SPLIT", c.N_SPLIT, 1, MAX_WORKGROUPS_PER_DIM);
  checkShape(isPow2(c.WG) && c.WG <= 256, `attn_decode: WG must be a power of two <= 256, got ${c.WG}`);
  const g = c.H_Q / c.H_KV;
  checkShape(
    g <= 8,
    `attn_decode: H_Q / H_KV (${g}) must be <= 8 (named accumulators for 8 heads)`,
  );
  checkShape(c.KPT === 1 || c.KPT === 2, `attn_decode: KPT must be 1 or 2, got ${c.KPT}`);
  checkShape(
    isPow2(c.TILE) && c.TILE >= 4 && c.TILE * 4 <= c.WG * c.KPT,
    `attn_decode: TILE must be a power of two in [4, WG * KPT / 4] (${c.WG * c.KPT / 4}), got ${c.TILE}`,
  );
  const slices = c.WG * c.KPT / c.TILE;
  checkShape(
    (c.D_H / 8) % slices === 0,
    `attn_decode: D_H / 8 (${c.D_H / 8}) must be a multiple of WG * KPT / TILE (${slices}): raise TILE`,
  );
  checkShape(
    g * c.TILE <= 2 * c.WG,
    `attn_decode: G * TILE (${g} * ${c.TILE}) must be <= 2 * WG (${2 * c.WG}): two scores per invocation`,
  );
  checkShape(
    c.D_H / 4 <= c.WG && c.WG % (c.D_H / 4) === 0,
    `attn_decode: WG (${c.WG}) must be a multiple of D_H / 4 (${c.D_H / 4})`,
  );
  const kq = c.WG / (c.D_H / 4);
  checkShape(
    c.TILE % kq === 0,
    `attn_decode: TILE (${c.TILE}) must be a multiple of WG / (D_H / 4) (${kq}): raise TILE`,
  );
  checkShape(
    Number.isInteger(c.PER_MIN) && c.PER_MIN >= c.TILE && c.PER_MIN % c.TILE === 0,
    `attn_decode: PER_MIN (${c.PER_MIN}) must be a positive multiple of TILE (${c.TILE})`,
  );
  checkShape(c.SCALE > 0, `attn_decode: SCALE must be > 0, got ${c.SCALE}`);
  checkShape(
    c.P_COL === 0 || (Number.isInteger(c.P_COL) && c.P_COL >= 3),
    `attn_decode: P_COL must be 0 or >= 3 words ([pos0, n_tokens, slot]), got ${c.P_COL}`,
  );
  checkShape(
    c.KV_COL === 0 || (Number.isInteger(c.KV_COL) && c.KV_COL % 4 === 0 && c.KV_COL >= kvCacheWords(c)),
    `attn_decode: KV_COL must be 0 or a multiple of 4 words (16-byte loads) of at least ${
      kvCacheWords(c)
    } (one slot's cache), got ${c.KV_COL}`,
  );
  const bytes = attnDecodeWorkgroupBytes(c);
  checkShape(
    bytes <= maxWorkgroupBytes,
    `attn_decode: workgroup memory ${bytes} bytes exceeds the device's ${maxWorkgroupBytes}: lower WG or TILE`,
  );
}

/**
 * Words between columns' partials in a dispatch over several (a batched step): each column's padded to 256
 * bytes, the layout `attn_combine` reads (its `attnCombineColumnWords`).
 */
export function attnDecodeColumnWords(
  c: { readonly H_Q: number; readonly D_H: number; readonly N_SPLIT: number },
): { readonly partO: number; readonly partMl: number } {
  const pad = (w: number) => Math.ceil(w / 64) * 64;
  return { partO: pad(c.D_H * c.H_Q * c.N_SPLIT), partMl: pad(2 * c.H_Q * c.N_SPLIT) };
}

/**
 * The bind group of one dispatch, after checking constants and every buffer against its `ne`: one column, or
 * `cols` columns whose table names slots below `slots` (default 1).
 * @throws {RangeError} when a constant is out of range or a buffer too small
 */
export function attnDecodeBindGroup(
  device: GPUDevice,
  opts: {
    pipeline: GPUComputePipeline;
    constants: AttnDecodeConstants;
    buffers: AttnDecodeBuffers;
    cols?: number;
    slots?: number;
  },
): GPUBindGroup {
  const { constants: c, buffers: b } = opts;
  const cols = opts.cols ?? 1;
  const slots = opts.slots ?? 1;
  checkAttnDecode(c, device.limits.maxComputeWorkgroupStorageSize);
  const k = "attn_decode";
  checkInt("attn_decode: cols", cols, 1, MAX_WORKGROUPS_PER_DIM);
  checkShape(
    cols === 1 || c.P_COL > 0,
    `attn_decode: ${cols} columns need a P_COL stride (got ${c.P_COL})`,
  );
  checkShape(
    Number.isInteger(slots) && slots >= 1 && (slots === 1 || (c.P_COL > 0 && c.KV_COL > 0)),
    `attn_decode: ${slots} slots need P_COL and KV_COL strides`,
  );
  checkBinding(k, "params", b.params, [c.P_COL > 0 ? (cols - 1) * c.P_COL + 3 : ATTN_PARAMS_WORDS]);
  checkBinding(k, "q", b.q, [c.D_H, c.H_Q, cols]);
  checkBinding(k, "kCache", b.kCache, [(slots - 1) * c.KV_COL + kvCacheWords(c)]);
  checkBinding(k, "vCache", b.vCache, [(slots - 1) * c.KV_COL + kvCacheWords(c)]);
  // One column: the shapes as such; several: the words up to the last column's end.
  const w = attnDecodeColumnWords(c);
  const many = (
    words: number,
    ne: number[],
  ) => (cols > 1 ? [(cols - 1) * words + ne.reduce((a, x) => a * x)] : ne);
  checkBinding(k, "partO", b.partO, many(w.partO, [c.D_H, c.H_Q, c.N_SPLIT]));
  checkBinding(k, "partMl", b.partMl, many(w.partMl, [2, c.H_Q, c.N_SPLIT]));
  return bindGroup(device, opts.pipeline, ATTN_DECODE_BINDINGS.map((name) => b[name]));
}

/** Dispatch grid: N_SPLIT splits by H_KV KV heads by `cols` columns (default 1). */
export function attnDecodeGrid(c: AttnDecodeConstants, cols = 1): [number, number, number] {
  return [c.N_SPLIT, c.H_KV, cols];
}

/**
 * Records one `attn_decode` dispatch of `cols` columns (default 1) into `pass` (the bind group was checked
 * when it was built).
 */
export function encodeAttnDecode(
  pass: GPUComputePassEncoder,
  opts: {
    pipeline: GPUComputePipeline;
    bindGroup: GPUBindGroup;
    constants: AttnDecodeConstants;
    cols?: number;
  },
): void {
  pass.setPipeline(opts.pipeline);
  pass.setBindGroup(0, opts.bindGroup);
  pass.dispatchWorkgroups(...attnDecodeGrid(opts.constants, opts.cols));
}
