/**
 * Benchmark: the prefill matmul's TR × TT variants on 35B-A3B prefill shapes, in one run. Prints one JSON line
 * per measurement (never asserts): ms per dispatch and GFLOP/s (2·K·N·M / time). Shapes the engine splits
 * (small N) are also timed split, the matmul and matmul_splits together. Every pipeline is built
 * first; then ROUNDS rounds over all variants, every other one in reverse, keep each variant's best (the
 * H200's SM clock drifts within a run, docs/PERF.md).
 *
 * Usage: `deno run -A bench/matmul.ts [--quick] [--m 256] [--type IQ4_XS]` (`--quick`: small sizes, for
 * lavapipe). Pass BENCH_COMMIT on machines without git. No npm imports: it runs on the lent GPU machine with
 * nothing but Deno.
 * @module
 */
import { parseArgs } from "node:util";
import { PassTimer } from "./_pass_timer.ts";
import { acquireGpu } from "../engine/gpu/device.ts";
import { PipelineCache } from "../wgsl/kernel.ts";
import { type GgmlTypeName, rowBytes } from "../engine/quant/types.ts";
import {
  encodeMatmul,
  MATMUL_PARAMS_BYTES,
  MATMUL_SPLITS,
  MATMUL_THREAD_TILES,
  matmulConstants,
  matmulDefaultSplits,
  type MatmulOp,
  matmulParams,
  type MatmulShape,
  matmulSplitsGrid,
  matmulSplitsParams,
  matmulWorkgroupBytes,
  prepareMatmul,
} from "../wgsl/matmul.ts";

const { values: args } = parseArgs({
  options: {
    quick: { type: "boolean", default: false },
    m: { type: "string" },
    type: { type: "string" },
    splits: { type: "string" },
  },
});
const QUICK = args.quick ?? false;
const M = Number(args.m ?? (QUICK ? 64 : 256));
// `--splits 2,4,8`: also each shape split into that many runs of K (4 × 4 tiles, with matmul_splits).
const EXTRA_SPLITS = args.splits ? args.splits.split(",").map(Number) : [];
const TYPES = (args.type ? [args.type] : ["IQ4_XS", "Q8_0", "Q6_K", "F32"]) as GgmlTypeName[];
const SHAPES = QUICK ? [{ name: "small", k: 512, n: 1024 }] : [
  { name: "attn_qkv", k: 2048, n: 8192 },
  { name: "attn_gate", k: 2048, n: 4096 },
  { name: "ssm_out", k: 4096, n: 2048 },
  { name: "shexp_gate_up", k: 2048, n: 1024 },
  { name: "router", k: 2048, n: 256 },
  { name: "ssm_alpha", k: 2048, n: 32 },
];
const ROUNDS = 4;

const gpu = await acquireGpu();
const { device } = gpu;
const cache = new PipelineCache(device, { f16: gpu.f16 });
const adapter = gpu.adapter.info.description || gpu.adapter.info.device || "unknown";
const commit = Deno.env.get("BENCH_COMMIT") ?? "unknown";
const timer = new PassTimer(device, gpu.timestamps);
// A validation error skips the pass it is in: a timing after one would be stale, so stop at the first.
device.addEventListener("uncapturederror", (e) => {
  console.error(`bench/matmul.ts: WebGPU error: ${(e as GPUUncapturedErrorEvent).error.message}`);
  Deno.exit(1);
});
const max = device.limits.maxComputeWorkgroupStorageSize;

const maxW = Math.max(...SHAPES.flatMap((s) => TYPES.map((t) => s.n * rowBytes(t, s.k))));
const weights = device.createBuffer({ size: maxW, usage: GPUBufferUsage.STORAGE | GPUBufferUsage.COPY_DST });
{
  // Random bytes (scales included): timing does not depend on the values.
  const chunk = new Uint8Array(Math.min(maxW, 16 << 20));
  for (let o = 0; o < chunk.length; o += 65536) crypto.getRandomValues(chunk.subarray(o, o + 65536));
  for (let o = 0; o < maxW; o += chunk.length) {
    device.queue.writeBuffer(weights, o, chunk, 0, Math.min(chunk.length, maxW - o));
  }
}
const maxK = Math.max(...SHAPES.map((s) => s.k));
const maxN = Math.max(...SHAPES.map((s) => s.n));
const x = device.createBuffer({
  size: 4 * maxK * M,
  usage: GPUBufferUsage.STORAGE | GPUBufferUsage.COPY_DST,
});
device.queue.writeBuffer(x, 0, new Float32Array(maxK * M).map(() => Math.random() - 0.5));
const y = device.createBuffer({ size: 4 * maxN * M, usage: GPUBufferUsage.STORAGE });

interface Job {
  shape: MatmulShape;
  name: string;
  tile: readonly [number, number];
  op: MatmulOp;
  /** Split K: matmul_splits' pipeline and bind group after the matmul. */
  sum?: { pipeline: GPUComputePipeline; bindGroup: GPUBindGroup; grid: [number, number, number] };
  best: number;
}
const jobs: Job[] = [];
const tiles = MATMUL_THREAD_TILES.flatMap((tr) => MATMUL_THREAD_TILES.map((tt) => [tr, tt] as const));
const params = device.createBuffer({
  size: 256 * SHAPES.length * TYPES.length,
  usage: GPUBufferUsage.UNIFORM | GPUBufferUsage.COPY_DST,
});
let slot = 0;
const sumPipe = await cache.get(MATMUL_SPLITS, {});
// The split runs' partial products: the largest split × N × M of any job below.
const partBytes = Math.max(
  ...SHAPES.flatMap((s) =>
    [matmulDefaultSplits({ type: "F32", k: s.k, n: s.n, m: M }), ...EXTRA_SPLITS].map((sp) =>
      4 * sp * s.n * M
    )
  ),
);
const part = device.createBuffer({ size: partBytes, usage: GPUBufferUsage.STORAGE });
// Per shape and type: the split matmul's params at 512·slot, matmul_splits' at 512·slot + 256 (uniform
// offsets must be multiples of 256).
const SPLIT_SLOTS = 1 + EXTRA_SPLITS.length;
const sparams = device.createBuffer({
  size: 512 * SHAPES.length * TYPES.length * SPLIT_SLOTS,
  usage: GPUBufferUsage.UNIFORM | GPUBufferUsage.COPY_DST,
});
for (const s of SHAPES) {
  for (const type of TYPES) {
    const shape: MatmulShape = { type, k: s.k, n: s.n, m: M };
    device.queue.writeBuffer(params, 256 * slot, matmulParams(shape));
    const p = { buffer: params, offset: 256 * slot++, size: MATMUL_PARAMS_BYTES };
    for (const tile of tiles) {
      const c = matmulConstants(shape, { tile });
      if (matmulWorkgroupBytes(c) > max) continue;
      const op = await prepareMatmul(cache, {
        device,
        shape,
        constants: c,
        bindings: { params: p, weights, x, y },
      });
      jobs.push({ shape, name: s.name, tile, op, best: Infinity });
    }
    // The engine's split of small N (4 × 4 tiles), the matmul and matmul_splits in one timing; and --splits.
    const engineSplits = matmulDefaultSplits(shape);
    const splitList = [...new Set([engineSplits, ...EXTRA_SPLITS])].filter((sp) => sp > 1 && sp <= s.k / 32);
    for (const [si, splits] of splitList.entries()) {
      const split: MatmulShape = { ...shape, splits };
      const c = matmulConstants(split, { tile: [4, 4] });
      const at = 512 * (slot - 1) * SPLIT_SLOTS + 512 * si;
      device.queue.writeBuffer(sparams, at, matmulParams(split));
      device.queue.writeBuffer(sparams, at + 256, matmulSplitsParams(split));
      const op = await prepareMatmul(cache, {
        device,
        shape: split,
        constants: c,
        bindings: {
          params: { buffer: sparams, offset: at, size: MATMUL_PARAMS_BYTES },
          weights,
          x,
          y: part,
        },
      });
      const bindGroup = device.createBindGroup({
        layout: sumPipe.getBindGroupLayout(0),
        entries: [
          { binding: 0, resource: { buffer: sparams, offset: at + 256, size: 32 } },
          { binding: 1, resource: { buffer: part } },
          { binding: 2, resource: { buffer: y } },
        ],
      });
      const sum = { pipeline: sumPipe, bindGroup, grid: matmulSplitsGrid(split) };
      jobs.push({ shape: split, name: s.name, tile: [4, 4], op, sum, best: Infinity });
    }
  }
}
const reps = QUICK ? 2 : 20;
for (let r = 0; r < ROUNDS; r++) {
  const order = r % 2 === 0 ? jobs : [...jobs].reverse();
  for (const j of order) {
    j.best = Math.min(
      j.best,
      await timer.perRep((pass) => {
        encodeMatmul(pass, j.op);
        if (j.sum) {
          pass.setPipeline(j.sum.pipeline);
          pass.setBindGroup(0, j.sum.bindGroup);
          pass.dispatchWorkgroups(...j.sum.grid);
        }
      }, reps),
    );
  }
}
/** The engine's choice per shape: its tile, split where matmulDefaultSplits says so. */
function isDefault(j: Job): boolean {
  const c = matmulConstants(j.shape, { maxWorkgroupBytes: max });
  const splits = matmulDefaultSplits({ ...j.shape, splits: undefined });
  return (j.shape.splits ?? 1) === splits && (splits > 1 || (c.TR === j.tile[0] && c.TT === j.tile[1]));
}
for (const j of jobs) {
  const { k, n, m, type } = j.shape;
  console.log(JSON.stringify({
    bench: "matmul",
    commit,
    adapter,
    name: j.name,
    type,
    ne: [k, n],
    m,
    tile: `${j.tile[0]}x${j.tile[1]}`,
    splits: j.shape.splits ?? 1,
    default: isDefault(j),
    ms: +(j.best * 1e3).toFixed(4),
    gflops: Math.round((2 * k * n * m) / j.best / 1e9),
  }));
}
