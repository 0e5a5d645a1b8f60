/**
 * Host twin of `attn_prefill.wgsl`: causal gated GQA flash attention (online softmax over key tiles) for a
 * chunk of `nTokens` new tokens over the KV cache, which already holds the chunk (written by `attn_qk_rope`).
 * A workgroup keeps the queries of BQ tokens times the G heads of one KV head in workgroup memory and walks
 * the keys in tiles of TILE: scores and outputs are register blocks of each invocation, K and V stream
 * through one staging buffer a stage ahead. The variant follows the device's workgroup memory
 * ({@linkcode attnPrefillConstants}). With NS > 1 key splits (grid z) the kernel leaves per-split partials
 * that `attn_prefill_combine` merges and gates.
 * @module
 */
import { bindGroup, type Binding, type KernelSpec } from "./kernel.ts";
import { ATTN_PARAMS_WORDS, kvCacheWords } from "./attn_params.ts";
import { checkBinding, checkInt, checkShape, isPow2, MAX_WORKGROUPS_PER_DIM } from "./_twin.ts";

/**
 * Constants of `attn_prefill.wgsl`: heads, headDim, cache capacity, query tokens per workgroup (BQ), key
 * positions per tile (TILE = D_H / 4), K dims per stage (DC; a V stage is TILE * DC / D_H rows), workgroup
 * size (WG = R * D_H / 64: one invocation per 4 x 4 scores and 4 x 16 outputs), key splits per query block
 * (NS; 1: the kernel writes the gated output itself) and the fewest tiles a split walks (SPLIT_MIN), score
 * scale, f16 KV cache, q read from its binding at each use instead of held in workgroup memory (Q_GLOBAL).
 */
export type AttnPrefillConstants = {
  readonly H_Q: number;
  readonly H_KV: number;
  readonly D_H: number;
  readonly P_MAX: number;
  readonly BQ: number;
  readonly TILE: number;
  readonly DC: number;
  readonly WG: number;
  readonly NS: number;
  readonly SPLIT_MIN: number;
  readonly SCALE: number;
  readonly KV_F16: boolean;
  readonly Q_GLOBAL: boolean;
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
    WG: "u32",
    NS: "u32",
    SPLIT_MIN: "u32",
    SCALE: "f32",
    KV_F16: "bool",
    Q_GLOBAL: "bool",
  },
};

/**
 * Binding order: params AttnParams; q f32 ne=[D_H, H_Q, nTokens]; qf f32 ne=[2*D_H, H_Q, nTokens];
 * kCache, vCache u32 words
 * of ne=[D_H, P_MAX, H_KV] ({@linkcode kvCacheWords}: f32, or f16 pairs with KV_F16); o f32 ne=[D_H, H_Q, nTokens]
 * (NS > 1: the partials, ne=[D_H + 4, NS, H_Q, nTokens], {@linkcode attnPrefillOutNe}).
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

/** `ne` of the `o` binding: the output, or with NS > 1 each split's O row then its (m, l, 0, 0). */
export function attnPrefillOutNe(c: AttnPrefillConstants, nTokens: number): number[] {
  return c.NS > 1 ? [c.D_H + 4, c.NS, c.H_Q, nTokens] : [c.D_H, c.H_Q, nTokens];
}

/**
 * Fewest key tiles (TILE = D_H / 4 positions) a split walks: near the diagonal and at shallow depths a block
 * uses fewer splits (the rest only mark themselves empty) rather than splitting a few tiles NS ways.
 */
export const ATTN_PREFILL_SPLIT_MIN = 4;

/**
 * Workgroups the key splits aim for: NS = ceil(this / (ceil(nTokens / BQ) * H_KV)), at most
 * {@linkcode ATTN_PREFILL_MAX_SPLITS}. A 512-token chunk of the 35B-A3B shape is 256 workgroups of 128
 * invocations on the H200's 132 SMs without splits (NS 4); 2,048-token chunks already have 1,024 (NS 1); a
 * 64-token turn after a long history has 32 (NS 32).
 */
export const ATTN_PREFILL_TARGET_WORKGROUPS = 1024;

/** Most key splits (the combine reads every split's (m, l) per row; SPLIT_MIN keeps shallow ones unused). */
export const ATTN_PREFILL_MAX_SPLITS = 32;

/**
 * Key splits for a chunk of `nTokens` in query blocks of `bq` (see {@linkcode ATTN_PREFILL_TARGET_WORKGROUPS}),
 * rounded up to a power of two: NS is a constant of the kernel and of its combine, so every distinct value is
 * two pipelines to compile, on the first chunk of that width (a prompt's tail: on the H200 inside a request's
 * time to first token). Powers of two leave 6 variants where the exact quotient made one per few widths
 * (31 between 129 and 4,096 tokens); chunks of a power-of-two width keep their split.
 */
export function attnPrefillSplits(hKv: number, bq: number, nTokens: number): number {
  const wgs = Math.ceil(nTokens / bq) * hKv;
  const ns = Math.ceil(ATTN_PREFILL_TARGET_WORKGROUPS / wgs);
  return Math.min(ATTN_PREFILL_MAX_SPLITS, 2 ** Math.ceil(Math.log2(ns)));
}

/** Workgroup memory of one variant in bytes (must fit the device's maxComputeWorkgroupStorageSize). */
export function attnPrefillWorkgroupBytes(c: AttnPrefillConstants): number {
  const r = c.BQ * c.H_Q / c.H_KV;
  const dq = c.D_H / 4;
  const tv = c.TILE * c.DC / c.D_H;
  const kvQuads = Math.max(c.TILE * (c.DC / 4 + 1), tv * dq);
  // With Q_GLOBAL: one quad of q (unused), p in quads of 4 rows plus a padding quad per key (and one unused word).
  const qs = c.Q_GLOBAL ? 1 : r * (dq + 1);
  const ps = c.Q_GLOBAL ? c.TILE * (r + 4) + 1 : c.TILE * (r + 1);
  return 16 * (qs + kvQuads) + 4 * (ps + r * c.TILE / 4 + r);
}

/** Global loads per invocation per stage (the kernel holds at most 8 in named registers). */
function stageLoads(c: AttnPrefillConstants): number {
  return Math.ceil(c.TILE * c.DC / (c.KV_F16 ? 8 : 4) / c.WG);
}

/**
 * Query blocks and K stage widths the engine tries in order, the first that fits the device's workgroup
 * memory winning: 8 tokens of 8 heads (64 rows) with q read from its binding (Q_GLOBAL) and 64-dim stages
 * (the H200: 1.6-2.3x the resident-q 4-token blocks at depths 0-32k, 16-20 TFLOP/s, docs/PERF.md); then 4
 * tokens (32 rows) with resident q staged 16 dims at a time where 48 KiB allows (1.5x the 2-token blocks); 2
 * tokens (16 rows) staged 32 dims at a time fits 32 KiB.
 */
const PREFERRED: readonly { bq: number; dc: number; qGlobal?: boolean }[] = [
  { bq: 8, dc: 64, qGlobal: true },
  { bq: 4, dc: 16 },
  { bq: 2, dc: 32 },
  { bq: 1, dc: 16 },
];

/**
 * Constants for `shape`: BQ query tokens per workgroup and DC K dims per stage (defaults from
 * {@linkcode PREFERRED}, the first whose workgroup memory fits `maxWorkgroupBytes`); TILE = D_H / 4 keys and
 * WG = R * D_H / 64 invocations follow from the kernel's fixed 4 x 4 score and 4 x 16 output blocks. DC is
 * lowered (to 8 at least) until a stage is at most 8 loads per invocation. NS: `ns`, else from `nTokens`
 * ({@linkcode attnPrefillSplits}), else 1; SPLIT_MIN: `splitMin` or {@linkcode ATTN_PREFILL_SPLIT_MIN};
 * Q_GLOBAL: `qGlobal`, else the preferred entry's. Overrides (tests, benchmarks) are checked like the
 * defaults.
 * @throws {RangeError} when no variant fits the device or an override breaks a limit
 */
export function attnPrefillConstants(
  shape: AttnPrefillShape,
  opts: {
    maxWorkgroupBytes: number;
    bq?: number;
    dc?: number;
    nTokens?: number;
    ns?: number;
    splitMin?: number;
    qGlobal?: boolean;
  },
): AttnPrefillConstants {
  const g = shape.H_Q / shape.H_KV;
  const build = (bq: number, dc: number, qGlobal = false): AttnPrefillConstants => {
    const r = bq * g;
    const ns = opts.ns ?? (opts.nTokens === undefined ? 1 : attnPrefillSplits(shape.H_KV, bq, opts.nTokens));
    const c = {
      ...shape,
      BQ: bq,
      TILE: shape.D_H / 4,
      DC: Math.min(dc, shape.D_H),
      WG: r * shape.D_H / 64,
      NS: ns,
      SPLIT_MIN: opts.splitMin ?? ATTN_PREFILL_SPLIT_MIN,
      Q_GLOBAL: opts.qGlobal ?? qGlobal,
    };
    let d = c.DC;
    while (d > 8 && stageLoads({ ...c, DC: d }) > 8) d /= 2;
    return { ...c, DC: d };
  };
  let c: AttnPrefillConstants | undefined;
  if (opts.bq !== undefined || opts.dc !== undefined) {
    const p = PREFERRED.find((x) => x.bq === opts.bq) ?? PREFERRED[0]!;
    c = build(opts.bq ?? p.bq, opts.dc ?? p.dc, p.qGlobal);
  } else {
    for (const p of PREFERRED) {
      const t = build(p.bq, p.dc, p.qGlobal);
      if (attnPrefillWorkgroupBytes(t) <= opts.maxWorkgroupBytes) {
        c = t;
        break;
      }
    }
    const last = PREFERRED[PREFERRED.length - 1]!;
    c ??= build(last.bq, last.dc, last.qGlobal);
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
  checkInt("attn_prefill: D_H", c.D_H, 64, 1024);
  checkShape(c.D_H % 64 === 0, `attn_prefill: D_H must be a multiple of 64, got ${c.D_H}`);
  checkInt("attn_prefill: P_MAX", c.P_MAX, 1, 2 ** 24);
  checkInt("attn_prefill: BQ", c.BQ, 1, 256);
  const r = c.BQ * c.H_Q / c.H_KV;
  checkShape(
    r % 4 === 0 && c.TILE === c.D_H / 4 && c.WG === r * c.D_H / 64,
    `attn_prefill: the 4 x 4 score and 4 x 16 output blocks need R = BQ * G (${r}) a multiple of 4, ` +
      `TILE = D_H / 4 (got ${c.TILE}) and WG = R * D_H / 64 (got ${c.WG}): pick them with attnPrefillConstants`,
  );
  checkShape(isPow2(c.WG) && c.WG <= 256, `attn_prefill: WG must be a power of two <= 256, got ${c.WG}`);
  checkInt("attn_prefill: DC", c.DC, 8, c.D_H);
  checkShape(
    c.DC % 8 === 0 && c.D_H % c.DC === 0 && stageLoads(c) <= 8,
    `attn_prefill: DC (${c.DC}) must be a multiple of 8 dividing D_H (${c.D_H}) with at most 8 loads per ` +
      `invocation per stage (TILE * DC / (4 or 8) / WG = ${stageLoads(c)}): lower DC`,
  );
  checkInt("attn_prefill: NS", c.NS, 1, 64);
  checkInt("attn_prefill: SPLIT_MIN", c.SPLIT_MIN, 1, 2 ** 24);
  checkShape(c.SCALE > 0, `attn_prefill: SCALE must be > 0, got ${c.SCALE}`);
  const bytes = attnPrefillWorkgroupBytes(c);
  checkShape(
    bytes <= maxWorkgroupBytes,
    `attn_prefill: workgroup memory ${bytes} bytes exceeds the device's ${maxWorkgroupBytes}: lower BQ or DC`,
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
  checkBinding(k, "o", b.o, attnPrefillOutNe(c, n));
  return bindGroup(device, opts.pipeline, ATTN_PREFILL_BINDINGS.map((name) => b[name]));
}

/** Dispatch grid: ceil(nTokens / BQ) query blocks by H_KV KV heads by NS key splits. */
export function attnPrefillGrid(c: AttnPrefillConstants, nTokens: number): [number, number, number] {
  return [Math.ceil(nTokens / c.BQ), c.H_KV, c.NS];
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
