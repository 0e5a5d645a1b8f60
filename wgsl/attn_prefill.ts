/**
 * Host twin of `attn_prefill.wgsl`: causal gated GQA flash attention (online softmax over key tiles) for a
 * chunk of `nTokens` new tokens over the KV cache, which already holds the chunk (written by `attn_qk_rope`).
 * A workgroup keeps the queries of BQ tokens times the G heads of one KV head in workgroup memory and walks
 * the keys in tiles of TILE: scores and outputs are register blocks of each invocation, K and V stream
 * through one staging buffer a stage ahead. The variant follows the device's workgroup memory
 * ({@linkcode attnPrefillConstants}).
 * @module
 */
import { bindGroup, type Binding, type KernelSpec } from "./kernel.ts";
import { ATTN_PARAMS_WORDS, kvCacheWords } from "./attn_params.ts";
import { checkBinding, checkInt, checkShape, isPow2, MAX_WORKGROUPS_PER_DIM } from "./_twin.ts";

/**
 * Constants of `attn_prefill.wgsl`: heads, headDim, cache capacity, query tokens per workgroup (BQ), key
 * positions per tile (TILE), K dims per stage (DC; a V stage is TILE * DC / D_H rows), keys per
 * invocation's score block (SK), dims per invocation's output block (OD), workgroup size, score scale, f16
 * KV cache.
 */
export type AttnPrefillConstants = {
  readonly H_Q: number;
  readonly H_KV: number;
  readonly D_H: number;
  readonly P_MAX: number;
  readonly BQ: number;
  readonly TILE: number;
  readonly DC: number;
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
  const tv = c.TILE * c.DC / c.D_H;
  const kvQuads = Math.max(c.TILE * (c.DC / 4 + 1), tv * dq);
  return 16 * (r * (dq + 1) + kvQuads) + 4 * (c.TILE * (r + 1) + r * c.TILE / c.SK + r);
}

/**
 * Query block, key tile and K stage width the engine tries in order, the first that fits the device's
 * workgroup memory winning: 2 tokens of 8 heads (16 rows) by 64 keys, staged 32 dims at a time, fits 32 KiB.
 */
const PREFERRED: readonly { bq: number; tile: number; dc: number }[] = [
  { bq: 2, tile: 64, dc: 32 },
  { bq: 2, tile: 32, dc: 32 },
  { bq: 1, tile: 32, dc: 32 },
  { bq: 1, tile: 16, dc: 16 },
];

/**
 * Constants for `shape`: BQ query tokens per workgroup, TILE keys per tile, DC K dims per stage (defaults
 * from {@linkcode PREFERRED}, the first whose workgroup memory fits `maxWorkgroupBytes`), a workgroup of
 * one invocation per 64 outputs (WG = R * D_H / 64, 16..256), and the register blocks: SK keys per score
 * block (SR >= SK where possible: the SR q quads are broadcast loads, the SK K quads are not), OD dims per
 * output block (16 where it splits). Overrides (tests, benchmarks) are checked like the defaults.
 * @throws {RangeError} when no variant fits the device or an override breaks a limit
 */
export function attnPrefillConstants(
  shape: AttnPrefillShape,
  opts: {
    maxWorkgroupBytes: number;
    bq?: number;
    tile?: number;
    dc?: number;
    wg?: number;
    sk?: number;
    od?: number;
  },
): AttnPrefillConstants {
  const g = shape.H_Q / shape.H_KV;
  const build = (bq: number, tile: number, dc: number): AttnPrefillConstants => {
    const r = bq * g;
    let wg = opts.wg ?? 2 ** Math.round(Math.log2(r * shape.D_H / 64));
    wg = Math.min(256, Math.max(16, wg));
    // Score block: SK keys by SR rows; the split must be even (KQ = TILE / SK lanes divide WG, RQ divide R).
    const skOk = (sk: number) => {
      const kq = tile / sk;
      return Number.isInteger(kq) && wg % kq === 0 && r % (wg / kq) === 0;
    };
    let sk = opts.sk;
    if (sk === undefined) {
      const ok = [1, 2, 4, 8, 16, 32].filter(skOk);
      const sr = (k: number) => r / (wg / (tile / k));
      sk = ok.filter((k) => sr(k) >= k).pop() ?? ok[0] ?? 1;
    }
    const odOk = (od: number) => {
      const dg = shape.D_H / od;
      return od % 4 === 0 && Number.isInteger(dg) && wg % dg === 0 && r % (wg / dg) === 0;
    };
    const od = opts.od ?? [16, 8, 32, 4, 64].find(odOk) ?? 4;
    return { ...shape, BQ: bq, TILE: tile, DC: dc, SK: sk, OD: od, WG: wg };
  };
  let c: AttnPrefillConstants | undefined;
  if (opts.bq !== undefined || opts.tile !== undefined || opts.dc !== undefined) {
    const p = PREFERRED[0]!;
    c = build(opts.bq ?? p.bq, opts.tile ?? p.tile, opts.dc ?? Math.min(p.dc, shape.D_H));
  } else {
    for (const p of PREFERRED) {
      const t = build(p.bq, p.tile, Math.min(p.dc, shape.D_H));
      if (attnPrefillWorkgroupBytes(t) <= opts.maxWorkgroupBytes) {
        c = t;
        break;
      }
    }
    const last = PREFERRED[PREFERRED.length - 1]!;
    c ??= build(last.bq, last.tile, Math.min(last.dc, shape.D_H));
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
    c.DC % 8 === 0 && c.D_H % c.DC === 0 && (c.TILE * c.DC) % c.D_H === 0,
    `attn_prefill: DC (${c.DC}) must be a multiple of 8 dividing D_H (${c.D_H}) with TILE * DC ` +
      `(${c.TILE} * ${c.DC}) a multiple of D_H (a V stage holds TILE * DC / D_H whole rows)`,
  );
  checkShape(isPow2(c.WG) && c.WG <= 256, `attn_prefill: WG must be a power of two <= 256, got ${c.WG}`);
  const r = c.BQ * c.H_Q / c.H_KV;
  const kq = c.TILE / c.SK;
  checkShape(
    Number.isInteger(c.SK) && c.SK >= 1 && Number.isInteger(kq) && c.WG % kq === 0 && r % (c.WG / kq) === 0,
    `attn_prefill: scores BQ * G * TILE (${r} * ${c.TILE}) over WG (${c.WG}) with SK (${c.SK}) keys per ` +
      `invocation do not split evenly: pick BQ, TILE, WG, SK from attnPrefillConstants`,
  );
  const dg = c.D_H / c.OD;
  checkShape(
    Number.isInteger(c.OD) && c.OD % 4 === 0 && Number.isInteger(dg) && c.WG % dg === 0 &&
      r % (c.WG / dg) === 0,
    `attn_prefill: outputs BQ * G * D_H (${r} * ${c.D_H}) over WG (${c.WG}) in blocks of OD (${c.OD}) dims ` +
      `do not split evenly: pick OD from attnPrefillConstants`,
  );
  checkShape(c.SCALE > 0, `attn_prefill: SCALE must be > 0, got ${c.SCALE}`);
  const bytes = attnPrefillWorkgroupBytes(c);
  checkShape(
    bytes <= maxWorkgroupBytes,
    `attn_prefill: workgroup memory ${bytes} bytes exceeds the device's ${maxWorkgroupBytes}: lower BQ, TILE or DC`,
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
