/**
 * Host twin of `attn_prefill.wgsl`: causal gated GQA flash attention (online softmax over key tiles) for a
 * chunk of `nTokens` new tokens over the KV cache, which already holds the chunk (written by `attn_qk_rope`).
 * A workgroup keeps the queries of BQ tokens times the G heads of one KV head in workgroup memory and walks
 * the keys in tiles of TILE, so the tile sizes follow the device's workgroup memory
 * ({@linkcode attnPrefillConstants}).
 * @module
 */
import { bindGroup, type Binding, type KernelSpec } from "./kernel.ts";
import { ATTN_PARAMS_WORDS, kvCacheWords } from "./attn_params.ts";
import { checkBinding, checkInt, checkShape, isPow2, MAX_WORKGROUPS_PER_DIM } from "./_twin.ts";

/**
 * Constants of `attn_prefill.wgsl`: heads, headDim, cache capacity, query tokens per workgroup (BQ), key
 * positions per tile (TILE), K dims staged at once (DC), V rows staged at once (TV), keys per invocation's
 * score block (SK), dims per invocation's output block (OD), workgroup size, score scale, f16 KV cache.
 */
export type AttnPrefillConstants = {
  readonly H_Q: number;
  readonly H_KV: number;
  readonly D_H: number;
  readonly P_MAX: number;
  readonly BQ: number;
  readonly TILE: number;
  readonly DC: number;
  readonly TV: number;
  readonly SK: number;
  readonly OD: number;
  readonly WG: number;
  readonly SCALE: number;
  readonly KV_F16: boolean;
};

/** Kernel spec of `attn_prefill.wgsl`. */
export const ATTN_PREFILL: KernelSpec = {
  name: "attn_prefill",
  url: new URL("./attn_prefill.wgsl", import.meta.url),
  lib: [],
  constants: {
    H_Q: "u32",
    H_KV: "u32",
    D_H: "u32",
    P_MAX: "u32",
    BQ: "u32",
    TILE: "u32",
    DC: "u32",
    TV: "u32",
    SK: "u32",
    OD: "u32",
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

/** The model's attention shape, as the kernel sees it. */
export type AttnPrefillShape = {
  readonly H_Q: number;
  readonly H_KV: number;
  readonly D_H: number;
  readonly P_MAX: number;
  readonly SCALE: number;
  readonly KV_F16: boolean;
};

/** Workgroup memory of one variant in bytes (must fit the device's maxComputeWorkgroupStorageSize). */
export function attnPrefillWorkgroupBytes(c: AttnPrefillConstants): number {
  const r = c.BQ * c.H_Q / c.H_KV;
  const dq = c.D_H / 4;
  const kvQuads = Math.max(c.TILE * (c.DC / 4 + 1), c.TV * dq);
  return 16 * (r * dq + kvQuads) + 4 * (c.TILE * (r + 1) + r * c.TILE / c.SK + r);
}

/**
 * Constants for `shape`: the largest query block (BQ tokens, at most 64 query rows) whose workgroup memory
 * fits `maxWorkgroupBytes` with tiles of TILE keys (default 32), the score and output register blocks that
 * split its work over the workgroup. `bq` and `tile` override the choice (tests, benchmarks); the result is
 * checked either way.
 * @throws {RangeError} when no variant fits the device or an override breaks a limit
 */
export function attnPrefillConstants(
  shape: AttnPrefillShape,
  opts: { maxWorkgroupBytes: number; bq?: number; tile?: number; dc?: number; wg?: number },
): AttnPrefillConstants {
  const g = shape.H_Q / shape.H_KV;
  const tile = opts.tile ?? 32;
  const dc = opts.dc ?? Math.min(64, shape.D_H);
  const build = (bq: number): AttnPrefillConstants => {
    const r = bq * g;
    // The largest power-of-two workgroup (<= 256) that splits both the scores and the outputs evenly.
    let wg = opts.wg ?? 256;
    while (opts.wg === undefined && wg > 1 && ((r * tile) % wg !== 0 || (r * shape.D_H / 4) % wg !== 0)) {
      wg /= 2;
    }
    const spi = r * tile / wg;
    // Score block SR x SK near square, SK <= SR; output block of 8 dims where it divides, else 4.
    let sk = 1;
    for (let k = 1; k * k <= spi; k++) if (spi % k === 0 && tile % k === 0 && wg % (tile / k) === 0) sk = k;
    const opi = r * shape.D_H / wg;
    const od = opi % 8 === 0 && wg % (shape.D_H / 8) === 0 && r % (wg / (shape.D_H / 8)) === 0 ? 8 : 4;
    // V rows per staging: as many as the K chunk's buffer holds, dividing TILE.
    let tv = 1;
    for (let t = 1; t <= tile; t++) if (tile % t === 0 && t * shape.D_H / 4 <= tile * (dc / 4 + 1)) tv = t;
    return { ...shape, BQ: bq, TILE: tile, DC: dc, TV: tv, SK: sk, OD: od, WG: wg };
  };
  let c: AttnPrefillConstants | undefined;
  if (opts.bq !== undefined) {
    c = build(opts.bq);
  } else {
    for (let bq = Math.max(1, Math.floor(64 / g)); bq >= 1; bq = Math.floor(bq / 2)) {
      const t = build(bq);
      if (attnPrefillWorkgroupBytes(t) <= opts.maxWorkgroupBytes) {
        c = t;
        break;
      }
    }
    if (c === undefined) c = build(1);
  }
  checkAttnPrefill(c, 1, opts.maxWorkgroupBytes);
  return c;
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
  checkInt("attn_prefill: D_H", c.D_H, 8, 4096);
  checkInt("attn_prefill: P_MAX", c.P_MAX, 1, 2 ** 24);
  checkInt("attn_prefill: BQ", c.BQ, 1, 256);
  checkInt("attn_prefill: TILE", c.TILE, 1, 256);
  checkInt("attn_prefill: DC", c.DC, 8, c.D_H);
  checkShape(
    c.DC % 8 === 0 && c.D_H % c.DC === 0,
    `attn_prefill: DC (${c.DC}) must be a multiple of 8 dividing D_H (${c.D_H})`,
  );
  checkShape(
    Number.isInteger(c.TV) && c.TV >= 1 && c.TILE % c.TV === 0,
    `attn_prefill: TV (${c.TV}) must divide TILE (${c.TILE})`,
  );
  checkShape(isPow2(c.WG) && c.WG <= 256, `attn_prefill: WG must be a power of two <= 256, got ${c.WG}`);
  const r = c.BQ * c.H_Q / c.H_KV;
  const spi = r * c.TILE / c.WG;
  checkShape(
    Number.isInteger(spi) && Number.isInteger(c.SK) && c.SK >= 1 && spi % c.SK === 0 && c.TILE % c.SK === 0 &&
      c.WG % (c.TILE / c.SK) === 0,
    `attn_prefill: scores BQ * G * TILE (${r} * ${c.TILE}) over WG (${c.WG}) with SK (${c.SK}) keys per ` +
      `invocation do not split evenly: pick BQ, TILE, WG, SK from attnPrefillConstants`,
  );
  const opi = r * c.D_H / c.WG;
  const dg = c.D_H / c.OD;
  checkShape(
    c.OD % 4 === 0 && Number.isInteger(opi) && opi % c.OD === 0 && Number.isInteger(dg) && c.WG % dg === 0 &&
      r % (c.WG / dg) === 0,
    `attn_prefill: outputs BQ * G * D_H (${r} * ${c.D_H}) over WG (${c.WG}) in blocks of OD (${c.OD}) dims ` +
      `do not split evenly: pick OD from attnPrefillConstants`,
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
