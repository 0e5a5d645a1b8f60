/**
 * Benchmark: the attention kernels on the 35B-A3B shape (16 query heads, 2 KV heads, head dim 256), one
 * layer's dispatch at a time, at cache depths 0, 2k, 8k and 32k, f32 and f16 KV caches:
 * - prefill of each `--chunk` (512; a list, e.g. 512,2048) token chunk after `depth` cached positions: the
 *   pre-flash kernel (`bench/_attn_prefill_v1.wgsl`, BQ=1 TILE=8 as the engine ran it), the register-blocked
 *   `attn_prefill` the engine runs now ("engine": NS key splits from the chunk's workgroups, then
 *   attn_prefill_combine), the same without key splits ("default", the engine's before them), NS 1-8 of
 *   the preferred query blocks ("split"), q read from its binding (Q_GLOBAL) with 4- and 8-token blocks
 *   and 16-64-dim stages ("qglobal"); with `--sweep` also the first flash kernel
 *   (`bench/_attn_prefill_v2.wgsl`: the engine's variant then and the best of its H200 sweep) and more
 *   query blocks and K stage widths ("sweep"); ms and TFLOP/s (4·D_H FLOPs per query head and visible key:
 *   q·k and p·v);
 * - decode of one token at position `depth`: attn_decode + attn_combine as the engine runs them ("engine"),
 *   the kernel before the per-key-lane rewrite (`bench/_attn_decode_v1.wgsl` with its split policy then:
 *   "v1"), plus a sweep of the current kernel's N_SPLIT, TILE (= PER_MIN), WG and KPT; ms and GB/s of K
 *   and V read (where the cache fits the 50 MB L2, repeated reps may read it from there: an upper bound).
 * Every pipeline is built first; ROUNDS rounds over all jobs, every other one in reverse, keep each job's best
 * (the H200's SM clock drifts within a run, docs/PERF.md). One JSON line per measurement, never asserts.
 *
 * Usage: `deno run -A bench/attention.ts [--quick] [--kv f32,f16] [--depths 0,2048,8192,32768] [--chunk 512]
 * [--no-v1] [--prefill-only] [--decode-only] [--sweep]` (`--quick`: depths 0 and 256, chunk 64, one round,
 * no sweep: for lavapipe; `--prefill-only`: no decode jobs; `--decode-only`: no prefill jobs). Pass BENCH_COMMIT on
 * machines without git. No npm imports: it runs on the lent GPU machine with nothing but Deno.
 * @module
 */
import { parseArgs } from "node:util";
import { PassTimer } from "./_pass_timer.ts";
import { acquireGpu } from "../engine/gpu/device.ts";
import { bindGroup, type KernelSpec, PipelineCache, variantKey } from "../wgsl/kernel.ts";
import {
  ATTN_PREFILL,
  attnPrefillBindGroup,
  type AttnPrefillConstants,
  attnPrefillConstants,
  attnPrefillGrid,
  attnPrefillOutNe,
  attnPrefillSplits,
  attnPrefillWorkgroupBytes,
  checkAttnPrefill,
} from "../wgsl/attn_prefill.ts";
import {
  ATTN_PREFILL_COMBINE,
  attnPrefillCombineBindGroup,
  type AttnPrefillCombineConstants,
  attnPrefillCombineGrid,
} from "../wgsl/attn_prefill_combine.ts";
import {
  ATTN_DECODE,
  ATTN_DECODE_ONE_COLUMN,
  attnDecodeBindGroup,
  type AttnDecodeConstants,
  attnDecodeGrid,
  attnDecodeSplits,
  attnDecodeWorkgroupBytes,
  checkAttnDecode,
} from "../wgsl/attn_decode.ts";
import {
  ATTN_COMBINE,
  ATTN_COMBINE_NO_QX,
  attnCombineBindGroup,
  type AttnCombineConstants,
  attnCombineGrid,
} from "../wgsl/attn_combine.ts";
import { kvCacheWords, packAttnParams } from "../wgsl/attn_params.ts";
import { ATTN_PREFILL_V2, attnPrefillV2Constants, attnPrefillV2WorkgroupBytes } from "./_attn_prefill_v2.ts";
import {
  ATTN_DECODE_KPT,
  ATTN_DECODE_TILE,
  ATTN_SPLIT_MIN,
  ATTN_SPLITS,
  attnSplits,
} from "../engine/blocks/attention.ts";

const { values: args } = parseArgs({
  options: {
    quick: { type: "boolean", default: false },
    kv: { type: "string", default: "f32,f16" },
    depths: { type: "string" },
    chunk: { type: "string" },
    sweep: { type: "boolean", default: false },
    "no-v1": { type: "boolean", default: false },
    "prefill-only": { type: "boolean", default: false },
    "decode-only": { type: "boolean", default: false },
  },
});
const QUICK = args.quick ?? false;
const DEPTHS = (args.depths ?? (QUICK ? "0,256" : "0,2048,8192,32768")).split(",").map(Number);
const CHUNKS = (args.chunk ?? (QUICK ? "64" : "512")).split(",").map(Number);
/** The largest chunk (buffer sizes). */
const CHUNK = Math.max(...CHUNKS);
const KVS = args.kv!.split(",").map((k) => {
  if (k !== "f32" && k !== "f16") throw new RangeError(`--kv takes f32 and/or f16, got ${k}`);
  return k === "f16";
});
const ROUNDS = QUICK ? 1 : 2;
const PREFILL_ONLY = args["prefill-only"] ?? false;
const DECODE_ONLY = args["decode-only"] ?? false;
/** Whether to time the variants beside the engine's and the old ones (off with --quick: lavapipe is slow). */
const SWEEP = !QUICK;
/** Whether to time the prefill sweep of query blocks and stage widths and the first flash kernel. */
const PREFILL_SWEEP = args.sweep ?? false;
const H_Q = 16;
const H_KV = 2;
const D_H = 256;
const SCALE = 1 / Math.sqrt(D_H);

/** The pre-flash prefill kernel, kept beside this script for comparison only. */
const ATTN_PREFILL_V1: KernelSpec = {
  name: "attn_prefill_v1",
  url: new URL("./_attn_prefill_v1.wgsl", import.meta.url),
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
 * The decode kernel before the per-key-lane rewrite (issue #24), kept beside this script for comparison
 * only: bindings, grid, constants and split formula as `attn_decode` then (attn_combine unchanged).
 */
const ATTN_DECODE_V1: KernelSpec = {
  name: "attn_decode_v1",
  url: new URL("./_attn_decode_v1.wgsl", import.meta.url),
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
  },
};

const gpu = await acquireGpu();
const { device } = gpu;
const cache = new PipelineCache(device, { f16: gpu.f16 });
const commit = Deno.env.get("BENCH_COMMIT") ?? "unknown";
const timer = new PassTimer(device, gpu.timestamps);
// A validation error skips the pass it is in: a timing after one would be stale, so stop at the first.
device.addEventListener("uncapturederror", (e) => {
  console.error(`bench/attention.ts: WebGPU error: ${(e as GPUUncapturedErrorEvent).error.message}`);
  Deno.exit(1);
});
const maxWg = device.limits.maxComputeWorkgroupStorageSize;
const P_MAX = Math.max(...DEPTHS) + CHUNK;
const STORAGE = GPUBufferUsage.STORAGE | GPUBufferUsage.COPY_DST;

/** A storage buffer of `words` random f32 in [-1, 1) (f16 caches read them as pairs of halves: finite). */
function randomBuffer(words: number, f16Pairs = false): GPUBuffer {
  const buf = device.createBuffer({ size: 4 * words, usage: STORAGE });
  const chunk = Math.min(words, 1 << 22);
  const data = new Float32Array(chunk);
  const halves = new Uint16Array(data.buffer);
  for (let i = 0; i < chunk; i++) data[i] = Math.random() * 2 - 1;
  if (f16Pairs) {
    // Random f16 bits of magnitude < 1: sign, exponent 0..14, any mantissa.
    for (let i = 0; i < halves.length; i++) {
      halves[i] = (Math.random() < 0.5 ? 0x8000 : 0) | (Math.floor(Math.random() * 15) << 10) |
        Math.floor(Math.random() * 1024);
    }
  }
  for (let o = 0; o < words; o += chunk) {
    device.queue.writeBuffer(buf, 4 * o, data, 0, Math.min(chunk, words - o));
  }
  return buf;
}

const caches = new Map<boolean, { k: GPUBuffer; v: GPUBuffer }>();
for (const f16 of KVS) {
  const words = kvCacheWords({ D_H, P_MAX, H_KV, KV_F16: f16 });
  caches.set(f16, { k: randomBuffer(words, f16), v: randomBuffer(words, f16) });
}
const q = randomBuffer(D_H * H_Q * CHUNK);
const qf = randomBuffer(2 * D_H * H_Q * CHUNK);
const o = device.createBuffer({ size: 4 * D_H * H_Q * CHUNK, usage: GPUBufferUsage.STORAGE });
/** Bytes of a variant's key-split partials for a chunk. */
const partBytes = (c: AttnPrefillConstants, chunk: number) =>
  4 * attnPrefillOutNe(c, chunk).reduce((a, x) => a * x, 1);
/**
 * attn_prefill's key-split partials: 8 splits or the most the engine's rule gives any query block (up to 8
 * tokens), within the device's binding limit (variants that need more are left out).
 */
const PART_BYTES = Math.min(
  device.limits.maxStorageBufferBindingSize,
  Math.max(...CHUNKS.map((c) => 4 * (D_H + 4) * H_Q * c * Math.max(8, attnPrefillSplits(H_KV, 8, c)))),
);
const part = device.createBuffer({ size: PART_BYTES, usage: GPUBufferUsage.STORAGE });
/** Split counts of the decode sweep (the v1 kernel used up to 256 too). */
const DECODE_SPLITS = [64, 128, 256];
const maxSplits = Math.max(ATTN_SPLITS, ...DECODE_SPLITS);
const partO = device.createBuffer({ size: 4 * D_H * H_Q * maxSplits, usage: GPUBufferUsage.STORAGE });
const partMl = device.createBuffer({ size: 4 * 2 * H_Q * maxSplits, usage: GPUBufferUsage.STORAGE });
/** attn_combine's int8 output, which the variant without QX leaves unwritten. */
const unusedXq = device.createBuffer({ size: 16, usage: GPUBufferUsage.STORAGE });
// AttnParams per depth i and chunk ci: prefill at 512·(ci·depths + i), decode at 512·i + 256 (storage
// offsets are multiples of 256).
const params = device.createBuffer({ size: 512 * DEPTHS.length * CHUNKS.length, usage: STORAGE });
DEPTHS.forEach((d, i) => {
  CHUNKS.forEach((c, ci) => {
    device.queue.writeBuffer(params, 512 * (ci * DEPTHS.length + i), Uint32Array.from(packAttnParams(d, c)));
  });
  device.queue.writeBuffer(params, 512 * i + 256, Uint32Array.from(packAttnParams(d, 1)));
});

interface Job {
  line: Record<string, unknown>;
  ops: { pipeline: GPUComputePipeline; bindGroup: GPUBindGroup; grid: [number, number, number] }[];
  reps: number;
  /** FLOPs (prefill) or bytes (decode) per repetition, for the rate. */
  work: number;
  best: number;
}
const jobs: Job[] = [];

// Prefill: q·k and p·v over every visible key of every query head.
const prefillFlops = (depth: number, chunk: number) =>
  4 * D_H * H_Q * (chunk * depth + (chunk * (chunk + 1)) / 2);
/** Repetitions per timed pass: about 20 ms of work at the rate given (FLOP/s or B/s). */
const repsFor = (work: number, rate: number) => Math.max(1, Math.min(20, Math.round(0.02 / (work / rate))));

/**
 * Decode jobs at position `depth` (AttnParams at 512·i + 256): the v1 kernel, the engine's variant and the
 * sweep, each followed by attn_combine; K and V rows 0..depth of both KV heads are the bytes.
 */
async function decodeJobs(
  i: number,
  depth: number,
  kv: { f16: boolean; k: GPUBuffer; v: GPUBuffer },
): Promise<void> {
  const f16 = kv.f16;
  const shape = { H_Q, H_KV, D_H, P_MAX, SCALE, KV_F16: f16 };
  const pd = { buffer: params, offset: 512 * i + 256, size: 8 };
  const bytes = 2 * (depth + 1) * H_KV * D_H * (f16 ? 2 : 4);
  const cb = { params: pd, partO, partMl, qf, o, xq: unusedXq };
  const push = async (
    line: Record<string, unknown>,
    decode: Job["ops"][number],
    split: { N_SPLIT: number; TILE: number; PER_MIN: number },
  ) => {
    const { N_SPLIT, TILE, PER_MIN } = split;
    const cc: AttnCombineConstants = {
      H_Q,
      D_H,
      N_SPLIT,
      TILE,
      PER_MIN,
      WG: 256,
      CD: 16,
      QF_COL: 2 * D_H * H_Q,
      ...ATTN_COMBINE_NO_QX,
    };
    const pCmb = await cache.get(ATTN_COMBINE, cc);
    const { used } = attnDecodeSplits({ ...split, P_MAX }, depth);
    jobs.push({
      line: { op: "decode", ...line, splitsUsed: used, depth, kvF16: f16 },
      ops: [
        decode,
        {
          pipeline: pCmb,
          bindGroup: attnCombineBindGroup(device, { pipeline: pCmb, constants: cc, buffers: cb }),
          grid: attnCombineGrid(cc),
        },
      ],
      reps: 20,
      work: bytes,
      best: Infinity,
    });
  };
  if (!args["no-v1"]) {
    // The split policy of then: up to 256 splits of at least one 16-position tile.
    const c = {
      ...shape,
      N_SPLIT: Math.min(256, Math.ceil(P_MAX / 16)),
      TILE: 16,
      PER_MIN: 16,
      WG: 256,
    };
    const pipeline = await cache.get(ATTN_DECODE_V1, c);
    const bg = bindGroup(device, pipeline, [pd, q, kv.k, kv.v, partO, partMl]);
    await push(
      { variant: "v1", key: variantKey(ATTN_DECODE_V1, c) },
      { pipeline, bindGroup: bg, grid: [c.N_SPLIT, H_KV, 1] },
      c,
    );
  }
  const engine: AttnDecodeConstants = {
    ...shape,
    N_SPLIT: attnSplits(P_MAX),
    TILE: ATTN_DECODE_TILE,
    PER_MIN: ATTN_SPLIT_MIN,
    WG: 256,
    KPT: ATTN_DECODE_KPT,
    ...ATTN_DECODE_ONE_COLUMN,
  };
  const variants: AttnDecodeConstants[] = [engine];
  for (const nSplit of SWEEP ? DECODE_SPLITS : []) {
    for (const tile of [16, 32, 64]) {
      for (const wg of [128, 256]) {
        for (const kpt of [1, 2]) {
          const c = {
            ...shape,
            N_SPLIT: nSplit,
            TILE: tile,
            PER_MIN: tile,
            WG: wg,
            KPT: kpt,
            ...ATTN_DECODE_ONE_COLUMN,
          };
          if (!variants.some((v) => variantKey(ATTN_DECODE, v) === variantKey(ATTN_DECODE, c))) {
            variants.push(c);
          }
        }
      }
    }
  }
  const db = { params: pd, q, kCache: kv.k, vCache: kv.v, partO, partMl };
  for (const c of variants) {
    try {
      checkAttnDecode(c, maxWg);
    } catch {
      continue; // does not fit this device
    }
    const pipeline = await cache.get(ATTN_DECODE, c);
    await push(
      {
        variant: c === engine ? "engine" : "sweep",
        key: variantKey(ATTN_DECODE, c),
        workgroupBytes: attnDecodeWorkgroupBytes(c),
      },
      {
        pipeline,
        bindGroup: attnDecodeBindGroup(device, { pipeline, constants: c, buffers: db }),
        grid: attnDecodeGrid(c),
      },
      c,
    );
  }
}

/** The prefill variant's line fields, its dispatches (attn_prefill, then attn_prefill_combine with NS > 1). */
async function prefillVariant(
  c: AttnPrefillConstants,
  chunk: number,
  buffers: { params: GPUBufferBinding; kCache: GPUBuffer; vCache: GPUBuffer },
): Promise<{ fields: Record<string, unknown>; ops: Job["ops"] }> {
  const pipeline = await cache.get(ATTN_PREFILL, c);
  const partB = { buffer: part, offset: 0, size: partBytes(c, chunk) };
  const b = { ...buffers, q, qf, o: c.NS > 1 ? partB : o };
  const ops: Job["ops"] = [{
    pipeline,
    bindGroup: attnPrefillBindGroup(device, { pipeline, constants: c, nTokens: chunk, buffers: b }),
    grid: attnPrefillGrid(c, chunk),
  }];
  if (c.NS > 1) {
    const cc: AttnPrefillCombineConstants = { H_Q, D_H, NS: c.NS, WG: 256 };
    const pc = await cache.get(ATTN_PREFILL_COMBINE, cc);
    ops.push({
      pipeline: pc,
      bindGroup: attnPrefillCombineBindGroup(device, {
        pipeline: pc,
        constants: cc,
        nTokens: chunk,
        buffers: { params: buffers.params, part: partB, qf, o },
      }),
      grid: attnPrefillCombineGrid(cc, chunk),
    });
  }
  const fields = {
    key: variantKey(ATTN_PREFILL, c),
    bq: c.BQ,
    dc: c.DC,
    ns: c.NS,
    qGlobal: c.Q_GLOBAL,
    workgroupBytes: attnPrefillWorkgroupBytes(c),
  };
  return { fields, ops };
}

/**
 * Prefill jobs of a `chunk`-token chunk after `depth` positions (AttnParams at 512·(ci·depths + i)): v1, the
 * first flash kernel (with --sweep), the engine's variant for this chunk ("engine": key splits from the
 * chunk's workgroups), the variant before key splits ("default": NS 1), NS 1-8 of the preferred query
 * blocks ("split"), Q_GLOBAL blocks ("qglobal") and with --sweep the BQ x DC list ("sweep").
 */
async function prefillJobs(
  ci: number,
  chunk: number,
  i: number,
  depth: number,
  kv: { f16: boolean; k: GPUBuffer; v: GPUBuffer },
): Promise<void> {
  const f16 = kv.f16;
  const p = { buffer: params, offset: 512 * (ci * DEPTHS.length + i), size: 8 };
  const shape = { H_Q, H_KV, D_H, P_MAX, SCALE, KV_F16: f16 };
  const flops = prefillFlops(depth, chunk);
  const base = { op: "prefill", depth, chunk, kvF16: f16 };
  if (!args["no-v1"]) {
    const c = { ...shape, BQ: 1, TILE: 8, WG: 256 };
    const pipeline = await cache.get(ATTN_PREFILL_V1, c);
    const bg = bindGroup(device, pipeline, [p, q, qf, kv.k, kv.v, o]);
    jobs.push({
      line: { ...base, variant: "v1", key: variantKey(ATTN_PREFILL_V1, c) },
      ops: [{ pipeline, bindGroup: bg, grid: [chunk, H_KV, 1] }],
      reps: repsFor(flops, 1e12),
      work: flops,
      best: Infinity,
    });
  }
  // The first flash kernel: the engine's choice for this device, and its best H200 sweep variant.
  for (const [name, ov] of [["v2-engine", {}], ["v2-best", { bq: 2, tile: 16, dc: 64 }]] as const) {
    const c = attnPrefillV2Constants(shape, { maxWorkgroupBytes: maxWg, ...ov });
    if (c === undefined || !PREFILL_SWEEP) continue;
    const pipeline = await cache.get(ATTN_PREFILL_V2, c);
    jobs.push({
      line: {
        ...base,
        variant: name,
        key: variantKey(ATTN_PREFILL_V2, c),
        workgroupBytes: attnPrefillV2WorkgroupBytes(c),
      },
      ops: [{
        pipeline,
        bindGroup: bindGroup(device, pipeline, [p, q, qf, kv.k, kv.v, o]),
        grid: [Math.ceil(chunk / c.BQ), H_KV, 1],
      }],
      reps: repsFor(flops, 1e12),
      work: flops,
      best: Infinity,
    });
  }
  const engine = attnPrefillConstants(shape, { maxWorkgroupBytes: maxWg, nTokens: chunk });
  const variants: { variant: string; c: AttnPrefillConstants }[] = [{ variant: "engine", c: engine }];
  const tries: { variant: string; ov: { bq?: number; dc?: number; ns?: number; qGlobal?: boolean } }[] = [
    { variant: "default", ov: {} },
  ];
  // Key splits of the preferred query blocks (the first is this device's; BQ 2 DC 32 fits 32 KiB).
  for (const ns of QUICK ? [3] : [1, 2, 3, 4, 8]) tries.push({ variant: "split", ov: { ns } });
  for (const ns of QUICK ? [] : [1, 2, 4]) tries.push({ variant: "split", ov: { bq: 2, dc: 32, ns } });
  // q read from its binding (Q_GLOBAL): the workgroup memory it frees allows wider stages and 8-token blocks;
  // each with no splits and with the engine's rule for its block.
  const qg = QUICK ? [{ bq: 4, dc: 32 }] : [16, 32, 64].flatMap((dc) => [{ bq: 4, dc }, { bq: 8, dc }]);
  for (const ov of qg) {
    for (const ns of new Set([1, attnPrefillSplits(H_KV, ov.bq, chunk)])) {
      tries.push({ variant: "qglobal", ov: { ...ov, ns, qGlobal: true } });
    }
  }
  // Query block (R = 8·BQ rows) and K stage width; TILE = D_H / 4 and WG = R·D_H / 64 follow from them.
  const sweep: { bq: number; dc: number }[] = [
    { bq: 1, dc: 16 },
    { bq: 2, dc: 16 },
    { bq: 2, dc: 64 },
    { bq: 4, dc: 32 },
    { bq: 4, dc: 64 },
    { bq: 8, dc: 16 },
  ];
  for (const ov of PREFILL_SWEEP ? sweep : []) {
    for (const ns of [1, attnPrefillSplits(H_KV, ov.bq, chunk)]) {
      tries.push({ variant: "sweep", ov: { ...ov, ns } });
    }
  }
  for (const t of tries) {
    let c: AttnPrefillConstants;
    try {
      c = attnPrefillConstants(shape, { maxWorkgroupBytes: maxWg, ...t.ov });
      checkAttnPrefill(c, chunk, maxWg);
      if (c.NS > 1 && partBytes(c, chunk) > PART_BYTES) continue;
    } catch {
      continue; // does not fit this device
    }
    if (!variants.some((v) => variantKey(ATTN_PREFILL, v.c) === variantKey(ATTN_PREFILL, c))) {
      variants.push({ variant: t.variant, c });
    }
  }
  for (const v of variants) {
    const { fields, ops } = await prefillVariant(v.c, chunk, { params: p, kCache: kv.k, vCache: kv.v });
    jobs.push({
      line: { ...base, variant: v.variant, ...fields },
      ops,
      reps: repsFor(flops, 1e13),
      work: flops,
      best: Infinity,
    });
  }
}

for (const [i, depth] of DEPTHS.entries()) {
  for (const f16 of KVS) {
    const kv = caches.get(f16)!;
    if (!PREFILL_ONLY) await decodeJobs(i, depth, { f16, ...kv });
    if (DECODE_ONLY) continue;
    for (const [ci, chunk] of CHUNKS.entries()) await prefillJobs(ci, chunk, i, depth, { f16, ...kv });
  }
}

for (let r = 0; r < ROUNDS; r++) {
  const order = r % 2 === 0 ? jobs : [...jobs].reverse();
  for (const j of order) {
    j.best = Math.min(
      j.best,
      await timer.perRep(
        (pass) => {
          for (const op of j.ops) {
            pass.setPipeline(op.pipeline);
            pass.setBindGroup(0, op.bindGroup);
            pass.dispatchWorkgroups(...op.grid);
          }
        },
        j.reps,
        { warmMs: 20, timed: 2 },
      ),
    );
  }
}
for (const j of jobs) {
  const rate = j.line.op === "prefill"
    ? { tflops: +(j.work / j.best / 1e12).toFixed(3) }
    : { gbps: Math.round(j.work / j.best / 1e9) };
  console.log(JSON.stringify({
    bench: "attention",
    commit,
    adapter: gpu.summary,
    ...j.line,
    ms: +(j.best * 1e3).toFixed(4),
    ...rate,
  }));
}
