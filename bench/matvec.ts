/**
 * Benchmark: matvec on 35B-A3B weight shapes against the streaming-read ceiling of the same bytes, in one run.
 * Prints one JSON line per measurement (never asserts). Each timing is many dispatches inside one compute pass,
 * timed with timestamp queries when the adapter has them (else wall clock around one submit), rotating over
 * enough copies of the tensor that the set exceeds the GPU's L2 cache.
 *
 * Usage: `deno run -A bench/matvec.ts [--quick] [--sweep [--sr] | --q8 | --tables]` (`--quick`: small sizes, for lavapipe;
 * `--sweep`: also TEAM/ROWS/UNROLL variants at batch 1; `--sr`: and the SR = 1 loop at TEAM 32
 * and 64 with UNROLL 1, 2, 4, 8). Batch-1 IQ4_XS, Q8_0 and Q6_K cases also run matvec_q8 (int8 x; its quantize_q8
 * dispatch is timed on its own; with `--sweep` TEAM/ROWS variants; `--q8`: only those cases, matvec_q8 over
 * TEAM 8-64, ROWS 1/2/4, both team reductions and PF 0/1, and table copies / row groups per workgroup; `--tables`: IQ4_XS on the tall shapes only, over table
 * copies × row groups; `--type T`: only the cases of weight type T, e.g. `--q8 --type Q6_K` for the LM head's
 * int8 mat-vec; `--batch-sweep`: only batched decode shapes at 8 and 16 columns, the old default (XR 1, ROWS 1,
 * UNROLL 1; 16 columns as two 8-column dispatches, as the engine runs them) beside the named path XR 2 at
 * ROWS 1, 2, 4 and UNROLL 1, 2, each line with `vsOld`, the old time over its own; and the int8-x path of
 * `--int8`: quantize_q8 over the columns, then matvec_q8b at ROWS 1 and 2, and over one column alone; with
 * `--q8b-only` matvec_q8b alone at ROWS 1 to 4, the K-quants with and without XSUM). No npm
 * imports: it runs on the lent GPU machine with nothing but Deno.
 * @module
 */
import { randomBuffer } from "./_buffers.ts";
import { parseArgs } from "node:util";
import {
  MATVEC_Q8B_PARAMS_BYTES,
  type MatvecQ8bConstants,
  matvecQ8bConstants,
  matvecQ8bParams,
  type MatvecQ8bShape,
  prepareMatvecQ8b,
} from "../wgsl/matvec_q8b.ts";
import { PassTimer } from "./_pass_timer.ts";
import { acquireGpu } from "../engine/gpu/device.ts";
import { PipelineCache } from "../wgsl/kernel.ts";
import { type GgmlTypeName, rowBytes } from "../engine/quant/types.ts";
import {
  encodeMatvec,
  MATVEC_PARAMS_BYTES,
  type MatvecConstants,
  matvecConstants,
  type MatvecOp,
  matvecParams,
  type MatvecShape,
  prepareMatvec,
} from "../wgsl/matvec.ts";
import {
  encodeMatmul,
  MATMUL_PARAMS_BYTES,
  matmulParams,
  type MatmulShape,
  prepareMatmul,
} from "../wgsl/matmul.ts";
import {
  encodeStreamRead,
  prepareStreamRead,
  STREAM_READ_PARAMS_BYTES,
  type StreamReadOp,
  streamReadParams,
} from "../wgsl/stream_read.ts";
import {
  encodeQ8,
  MATVEC_Q8_PARAMS_BYTES,
  MATVEC_Q8_TYPES,
  type MatvecQ8Constants,
  matvecQ8Constants,
  type MatvecQ8FusedConstants,
  matvecQ8FusedConstants,
  type MatvecQ8FusedShape,
  matvecQ8Params,
  type MatvecQ8Shape,
  matvecQ8WorkgroupBytes,
  prepareMatvecQ8,
  prepareMatvecQ8Fused,
  prepareQuantizeQ8,
  type Q8Op,
  q8xBytes,
  QUANTIZE_Q8_PARAMS_BYTES,
  quantizeQ8Params,
} from "../wgsl/matvec_q8.ts";

const { values: args } = parseArgs({
  options: {
    quick: { type: "boolean", default: false },
    sweep: { type: "boolean", default: false },
    sr: { type: "boolean", default: false },
    q8: { type: "boolean", default: false },
    tables: { type: "boolean", default: false },
    "batch-sweep": { type: "boolean", default: false },
    "q8b-only": { type: "boolean", default: false },
    type: { type: "string" },
  },
});
const QUICK = args.quick ?? false;
/** `--q8`: only the batch-1 IQ4_XS and Q8_0 shapes, matvec_q8 swept over TEAM, ROWS, RED and PF (matvec at its default). */
/**
 * `--tables`: only IQ4_XS on the tall shapes (ffn_up_exps, output), matvec_q8 at its default TEAM and ROWS
 * over table copies × row groups per workgroup (copies without enough groups pay the table's build per
 * workgroup; too many groups leave SMs idle).
 */
const TABLES = args.tables ?? false;
const Q8 = (args.q8 ?? false) || TABLES;

/** Bytes the rotation set must exceed (H200 L2 is 50 MiB; lavapipe: a CPU's last-level cache). */
const MIN_SET_BYTES = QUICK ? 64 << 20 : 256 << 20;
/** Bytes each timed pass reads in all (several ms on the H200). */
const PASS_BYTES = QUICK ? 256 << 20 : 16e9;

interface Case {
  name: string;
  type: GgmlTypeName;
  k: number;
  n: number;
  batch: number;
}

const TYPES_MAIN: GgmlTypeName[] = ["IQ4_XS", "Q8_0"];
const SHAPES = QUICK ? [{ name: "small", k: 2048, n: 4096 }] : [
  { name: "ffn_up_exps", k: 2048, n: 512 * 256 },
  { name: "ffn_down_exps", k: 512, n: 2048 * 256 },
  { name: "attn_qkv", k: 2048, n: 8192 },
  { name: "attn_gate", k: 2048, n: 4096 },
  { name: "ssm_out", k: 4096, n: 2048 },
  { name: "output", k: 2048, n: 248320 },
];
const CASES: Case[] = [];
for (const s of SHAPES) {
  for (const type of TYPES_MAIN) {
    if (!TABLES || (type === "IQ4_XS" && (s.name === "ffn_up_exps" || s.name === "output"))) {
      CASES.push({ ...s, type, batch: 1 });
    }
  }
}
// The LM head's type in the real IQ4_XS files (matvec_q8 reads it too).
if (!TABLES) CASES.push({ ...SHAPES[SHAPES.length - 1]!, type: "Q6_K", batch: 1 });
// Short decode matrices: the router with the shared expert's gate row (F32) and attn_v (Q5_K).
if (!QUICK && !Q8) {
  CASES.push({ name: "router", k: 2048, n: 257, type: "F32", batch: 1 });
  CASES.push({ name: "attn_v", k: 2048, n: 512, type: "Q5_K", batch: 1 });
}
for (const type of Q8 ? [] : ["Q4_K", "Q5_K", "IQ4_NL", "Q4_0", "F16"] as GgmlTypeName[]) {
  CASES.push({ ...SHAPES[0]!, name: SHAPES[0]!.name, type, batch: 1 });
}
for (const batch of Q8 ? [] : [2, 4, 8]) CASES.push({ ...SHAPES[QUICK ? 0 : 2]!, type: "IQ4_XS", batch });
// `--batch-sweep`: only the dense mat-vecs of a batched decode step (8 and 16 columns), the old default beside
// XR 2 over ROWS and UNROLL at the default TEAM (TEAM fixes each row's summation order: a batched step must keep
// its slots' solo bits). attn_q (full-attention layers: q and its gate) has attn_qkv's shape.
const BATCH_SWEEP = args["batch-sweep"] ?? false;
/** `--batch-sweep --q8b-only`: matvec_q8b alone, at ROWS 1 to 4 and, for the K-quants, with XSUM off too. */
const Q8B_ONLY = BATCH_SWEEP && (args["q8b-only"] ?? false);
if (BATCH_SWEEP) {
  const dense: Omit<Case, "batch">[] = QUICK ? [{ ...SHAPES[0]!, type: "IQ4_XS" }] : [
    { name: "attn_qkv", k: 2048, n: 8192, type: "IQ4_XS" },
    { name: "attn_gate", k: 2048, n: 4096, type: "IQ4_XS" },
    { name: "ssm_out", k: 4096, n: 2048, type: "IQ4_XS" },
    { name: "attn_q", k: 2048, n: 8192, type: "IQ4_XS" },
    { name: "shexp_gate_up", k: 2048, n: 1024, type: "IQ4_XS" },
    { name: "output", k: 2048, n: 248320, type: "Q6_K" },
    { name: "attn_v", k: 2048, n: 512, type: "Q5_K" },
  ];
  CASES.splice(0, CASES.length, ...[8, 16].flatMap((batch) => dense.map((s) => ({ ...s, batch }))));
}
if (args.type !== undefined) CASES.splice(0, CASES.length, ...CASES.filter((c) => c.type === args.type));

const gpu = await acquireGpu();
const { device } = gpu;
const cache = new PipelineCache(device, { f16: gpu.f16 });
const adapter = gpu.adapter.info.description || gpu.adapter.info.device || "unknown";
const commit = await gitCommit();

const BUF_BYTES = Math.min(QUICK ? 128 << 20 : 1 << 30, device.limits.maxStorageBufferBindingSize);
const weights = device.createBuffer({
  label: "bench weights",
  size: BUF_BYTES,
  usage: GPUBufferUsage.STORAGE | GPUBufferUsage.COPY_DST,
});
{
  // Random bytes (scales included): timing does not depend on the values.
  const chunk = new Uint8Array(16 << 20);
  for (let o = 0; o < chunk.length; o += 65536) crypto.getRandomValues(chunk.subarray(o, o + 65536));
  for (let o = 0; o < BUF_BYTES; o += chunk.length) {
    device.queue.writeBuffer(weights, o, chunk, 0, Math.min(chunk.length, BUF_BYTES - o));
  }
}
const maxK = Math.max(...CASES.map((c) => c.k));
const maxNB = Math.max(...CASES.map((c) => c.n * c.batch));
const maxBatch = Math.max(8, ...CASES.map((c) => c.batch));
const xBuf = device.createBuffer({
  size: 4 * maxK * maxBatch,
  usage: GPUBufferUsage.STORAGE | GPUBufferUsage.COPY_DST,
});
device.queue.writeBuffer(xBuf, 0, new Float32Array(maxK * maxBatch).map(() => Math.random() - 0.5));
const yBuf = device.createBuffer({ size: 4 * maxNB, usage: GPUBufferUsage.STORAGE });
const sink = device.createBuffer({ size: 16, usage: GPUBufferUsage.STORAGE });
const MAX_COPIES = 64;
const params = device.createBuffer({
  size: 256 * MAX_COPIES,
  usage: GPUBufferUsage.UNIFORM | GPUBufferUsage.COPY_DST,
});
// `--batch-sweep`: the second 8-column half of the old default at 16 columns.
const params2 = device.createBuffer({
  size: 256 * MAX_COPIES,
  usage: GPUBufferUsage.UNIFORM | GPUBufferUsage.COPY_DST,
});
const sparams = device.createBuffer({
  size: 256 * MAX_COPIES,
  usage: GPUBufferUsage.UNIFORM | GPUBufferUsage.COPY_DST,
});
const q8params = device.createBuffer({
  size: 256 * (MAX_COPIES + 2),
  usage: GPUBufferUsage.UNIFORM | GPUBufferUsage.COPY_DST,
});
// int8 x for up to maxBatch columns (matvec_q8b in `--batch-sweep`), random bytes: timing does not depend on them.
const xqBuf = randomBuffer(device, maxBatch * q8xBytes(maxK));
// The decode norm's weight and output (matvec_q8_fused and quantize_q8 with NORM).
const nwBuf = device.createBuffer({
  size: 4 * maxK,
  usage: GPUBufferUsage.STORAGE | GPUBufferUsage.COPY_DST,
});
device.queue.writeBuffer(nwBuf, 0, new Float32Array(maxK).map(() => 1 + 0.1 * Math.random()));
const xnBuf = device.createBuffer({ size: 4 * maxK, usage: GPUBufferUsage.STORAGE });
const timer = new PassTimer(device, gpu.timestamps);

/** Seconds per dispatch of `ops` (rotated, `reps` in all) in one compute pass. */
function time(encode: (pass: GPUComputePassEncoder, i: number) => void, reps: number): Promise<number> {
  return timer.perRep(encode, reps);
}

/** One timing of a case: what it encodes, and the JSON line it prints given its seconds and the ceiling. */
interface Job {
  encode: (pass: GPUComputePassEncoder, i: number) => void;
  emit: (seconds: number, ceilingGbps: number) => void;
}

/**
 * Seconds per rep of each job (job 0 is the ceiling). Plain runs time the jobs one after another. `--q8` and
 * `--batch-sweep` build every pipeline first, then take ROUNDS rounds over all jobs, every other one in
 * reverse, and keep each job's best: the H200's SM clock drifts within a run (docs/PERF.md), and one job after
 * another let the later variants of a sweep run at a lower clock than the earlier ones.
 */
async function timeJobs(jobs: Job[], reps: number): Promise<number[]> {
  if (!Q8 && !BATCH_SWEEP) {
    const out: number[] = [];
    for (const j of jobs) out.push(await time(j.encode, reps));
    return out;
  }
  // `--quick` (lavapipe) checks that the jobs run, so one round.
  const ROUNDS = QUICK ? 1 : 4;
  const best = jobs.map(() => Infinity);
  for (let r = 0; r < ROUNDS; r++) {
    const order = jobs.map((_, i) => (r % 2 === 0 ? i : jobs.length - 1 - i));
    for (const i of order) {
      const t = await timer.perRep(jobs[i]!.encode, reps, { warmMs: r === 0 ? 50 : 0, timed: 1 });
      best[i] = Math.min(best[i]!, t);
    }
  }
  return best;
}

function line(o: Record<string, unknown>): void {
  console.log(JSON.stringify({ bench: "matvec", commit, adapter, ...o }));
}

line({ event: "start", summary: gpu.summary, timestamps: gpu.timestamps, quick: QUICK });

/** Times quantize_q8 of case c's x over `cols` columns (one line; batch only where given) into xqBuf. */
async function timeQuantize(c: Case, cols?: number): Promise<void> {
  const qshape = { type: c.type, k: c.k, cols };
  device.queue.writeBuffer(q8params, 256 * MAX_COPIES, quantizeQ8Params(qshape));
  const qop = await prepareQuantizeQ8(cache, {
    device,
    shape: qshape,
    bindings: {
      params: { buffer: q8params, offset: 256 * MAX_COPIES, size: QUANTIZE_Q8_PARAMS_BYTES },
      x: xBuf,
      xq: { buffer: xqBuf, offset: 0, size: (cols ?? 1) * q8xBytes(c.k) },
    },
  });
  const tq = await time((p) => encodeQ8(p, qop), 200);
  line({
    kernel: "quantize_q8",
    case: c.name,
    type: c.type,
    k: c.k,
    ...(cols ? { batch: cols } : {}),
    ms: tq * 1e3,
  });
}

for (const c of CASES) {
  const tBytes = c.n * rowBytes(c.type, c.k);
  const slot = Math.ceil(tBytes / 256) * 256;
  const copies = Math.max(
    1,
    Math.min(MAX_COPIES, Math.floor(BUF_BYTES / slot), Math.ceil(MIN_SET_BYTES / slot)),
  );
  if (slot > BUF_BYTES) {
    line({
      event: "skip",
      case: c.name,
      type: c.type,
      why: `tensor ${tBytes} B exceeds the ${BUF_BYTES} B buffer`,
    });
    continue;
  }
  const reps = Math.max(copies, Math.min(4000, Math.ceil(PASS_BYTES / tBytes)));
  // Ceiling: the same bytes (same copies, same rotation) read by the streaming kernel.
  const sops: StreamReadOp[] = [];
  for (let i = 0; i < copies; i++) {
    const shape = { offsetBytes: i * slot, sizeBytes: Math.floor(tBytes / 16) * 16 };
    device.queue.writeBuffer(sparams, 256 * i, streamReadParams(shape));
    sops.push(
      await prepareStreamRead(cache, {
        device,
        shape,
        bindings: {
          params: { buffer: sparams, offset: 256 * i, size: STREAM_READ_PARAMS_BYTES },
          src: weights,
          out: sink,
        },
      }),
    );
  }
  // `--batch-sweep`: seconds of the old default (job 1), for each line's vsOld.
  let oldSecs: number | undefined;
  /** A job timing `kernel` on this case's bytes, its line relative to the case's ceiling. */
  const kernelJob = (kernel: string, encode: Job["encode"], fields: Record<string, unknown>): Job => ({
    encode,
    emit: (t, ceiling) => {
      const gbps = tBytes / t / 1e9;
      line({
        kernel,
        case: c.name,
        type: c.type,
        ne: [c.k, c.n],
        ...fields,
        bytes: tBytes,
        copies,
        reps,
        ms: t * 1e3,
        gbps,
        ceilingGbps: ceiling,
        ofCeiling: gbps / ceiling,
        ...(oldSecs === undefined ? {} : { vsOld: oldSecs / t }),
      });
    },
  });
  const jobs: Job[] = [{
    encode: (p, i) => encodeStreamRead(p, sops[i % copies]!),
    emit: (t) =>
      line({
        kernel: "stream_read",
        case: c.name,
        type: c.type,
        bytes: tBytes,
        copies,
        reps,
        ms: t * 1e3,
        gbps: tBytes / t / 1e9,
      }),
  }];
  const variants: (MatvecConstants | undefined)[] = BATCH_SWEEP ? [] : [undefined];
  if (args.sweep && !Q8 && c.batch === 1) {
    // TEAM, ROWS, UNROLL: ROWS ≤ 4 is the array-free batch-1 path (rows share each x quad), 8 the general one.
    const sweep = [
      [32, 1, 1],
      [32, 1, 2],
      [32, 2, 2],
      [32, 4, 1],
      [32, 4, 2],
      [32, 8, 2],
      [64, 1, 2],
      [64, 2, 2],
      [64, 4, 2],
      [16, 4, 2],
      [128, 1, 2],
      [256, 1, 2],
    ] as const;
    const shape: MatvecShape = { type: c.type, k: c.k, n: c.n, batch: 1 };
    for (const [team, rows, unroll] of sweep) {
      if (team <= c.k / 8 && (c.n < 8192 || team < 256)) {
        variants.push(matvecConstants(shape, { team, rows, unroll }));
      }
    }
    // The strength-reduced loop (SR = 1) with `--sr`.
    for (const team of args.sr ? [32, 64] : []) {
      if (team > c.k / 8 || (c.type !== "IQ4_XS" && c.type !== "Q8_0")) continue;
      for (const unroll of [1, 2, 4, 8]) variants.push(matvecConstants(shape, { team, unroll, sr: true }));
    }
  }
  if (BATCH_SWEEP && !Q8B_ONLY) {
    // The old default, pinned (XR 1, ROWS 1, UNROLL 1: the default at 2..8 columns before XR 2), 8 columns per
    // dispatch as the engine runs it: 16 columns are two dispatches (x and y at the second half's offsets).
    const halves = Math.ceil(c.batch / 8);
    const oldOps: MatvecOp[][] = [];
    let oldConstants: MatvecConstants | undefined;
    for (let i = 0; i < copies; i++) {
      const per: MatvecOp[] = [];
      for (let h = 0; h < halves; h++) {
        const shape: MatvecShape = {
          type: c.type,
          k: c.k,
          n: c.n,
          batch: Math.min(8, c.batch - 8 * h),
          wOffsetBytes: i * slot,
          xOffset: 8 * h * c.k,
          yOffset: 8 * h * c.n,
        };
        oldConstants = matvecConstants(shape, { rows: 1, unroll: 1, xr: 1 });
        const buf = h === 0 ? params : params2;
        device.queue.writeBuffer(buf, 256 * i, matvecParams(shape));
        per.push(
          await prepareMatvec(cache, {
            device,
            shape,
            constants: oldConstants,
            bindings: {
              params: { buffer: buf, offset: 256 * i, size: MATVEC_PARAMS_BYTES },
              weights,
              x: xBuf,
              y: yBuf,
            },
          }),
        );
      }
      oldOps.push(per);
    }
    jobs.push(
      kernelJob("matvec", (p, i) => oldOps[i % copies]!.forEach((op) => encodeMatvec(p, op)), {
        batch: c.batch,
        variant: "old",
        dispatches: halves,
        constants: oldConstants,
      }),
    );
    const shape: MatvecShape = { type: c.type, k: c.k, n: c.n, batch: c.batch };
    for (const rows of [1, 2, 4]) {
      for (const unroll of [1, 2]) variants.push(matvecConstants(shape, { rows, unroll, xr: 2 }));
    }
  }
  for (const v of variants) {
    const ops: MatvecOp[] = [];
    let constants: MatvecConstants | undefined;
    for (let i = 0; i < copies; i++) {
      const shape: MatvecShape = { type: c.type, k: c.k, n: c.n, batch: c.batch, wOffsetBytes: i * slot };
      constants = v ?? matvecConstants(shape);
      device.queue.writeBuffer(params, 256 * i, matvecParams(shape));
      ops.push(
        await prepareMatvec(cache, {
          device,
          shape,
          constants,
          bindings: {
            params: { buffer: params, offset: 256 * i, size: MATVEC_PARAMS_BYTES },
            weights,
            x: xBuf,
            y: yBuf,
          },
        }),
      );
    }
    jobs.push(
      kernelJob("matvec", (p, i) => encodeMatvec(p, ops[i % copies]!), {
        batch: c.batch,
        ...(BATCH_SWEEP ? { variant: `xr2 rows ${constants!.ROWS} unroll ${constants!.UNROLL}` } : {}),
        constants,
      }),
    );
  }
  if (BATCH_SWEEP && MATVEC_Q8_TYPES.includes(c.type)) {
    // int8 x (`--int8`): one quantize_q8 over the columns (timed on its own), then matvec_q8b at ROWS 1, 2.
    await timeQuantize(c, c.batch);
    // The last variant runs one column: a column's own decode and dot (matvec_q8's work), so batch times it
    // is what the columns cost without decoding once for all.
    const maxWorkgroupBytes = device.limits.maxComputeWorkgroupStorageSize;
    const q8bRuns: { rows: number; cols: number; xsum?: boolean }[] = Q8B_ONLY
      ? [1, 2, 3, 4].flatMap((rows) => [
        { rows, cols: c.batch },
        ...(c.type.endsWith("_K") ? [{ rows, cols: c.batch, xsum: false }] : []),
      ])
      : [{ rows: 1, cols: c.batch }, { rows: 2, cols: c.batch }];
    for (const { rows, cols, xsum } of [...q8bRuns, { rows: 1, cols: 1 }]) {
      const ops: Q8Op[] = [];
      let constants: MatvecQ8bConstants | undefined;
      for (let i = 0; i < copies; i++) {
        const shape: MatvecQ8bShape = { type: c.type, k: c.k, n: c.n, cols, wOffsetBytes: i * slot };
        constants = matvecQ8bConstants(shape, { rows, xsum, maxWorkgroupBytes });
        device.queue.writeBuffer(q8params, 256 * i, matvecQ8bParams(shape));
        ops.push(
          await prepareMatvecQ8b(cache, {
            device,
            shape,
            constants,
            bindings: {
              params: { buffer: q8params, offset: 256 * i, size: MATVEC_Q8B_PARAMS_BYTES },
              weights,
              xq: { buffer: xqBuf, offset: 0, size: c.batch * q8xBytes(c.k) },
              y: yBuf,
            },
          }),
        );
      }
      jobs.push(
        kernelJob("matvec_q8b", (p, i) => encodeQ8(p, ops[i % copies]!), {
          batch: c.batch,
          variant: cols === 1 ? "q8b one column" : `q8b rows ${rows}${constants!.XSUM > 0 ? " xsum" : ""}`,
          constants,
        }),
      );
    }
  }
  if (c.batch === 1 && MATVEC_Q8_TYPES.includes(c.type)) {
    // int8 x: quantize_q8 once (timed on its own), then matvec_q8 on the same copies as matvec.
    await timeQuantize(c);
    const q8variants: (MatvecQ8Constants | undefined)[] = [undefined];
    const shape: MatvecQ8Shape = { type: c.type, k: c.k, n: c.n };
    if (TABLES) {
      const base = matvecQ8Constants(shape);
      for (const copies of [1, 16, 32]) {
        for (const groups of [1, 2, 3, 4, 6]) {
          const v = { ...base, COPIES: copies, GROUPS: groups };
          if (matvecQ8WorkgroupBytes(v) <= device.limits.maxComputeWorkgroupStorageSize) q8variants.push(v);
        }
      }
    } else if (Q8) {
      for (const team of [8, 16, 32, 64]) {
        for (const rows of [1, 2, 4]) {
          for (const red of [0, 1]) {
            for (const pf of [0, 1]) {
              if (team <= c.k / 32) q8variants.push(matvecQ8Constants(shape, { team, rows, red, pf }));
            }
          }
        }
      }
      // Table copies (IQ4_XS: fewer bank conflicts), several row groups per workgroup (the table built once
      // for all) and the next chunk's loads before this one's math (PF), at the defaults' TEAM and ROWS.
      const base = matvecQ8Constants(shape);
      const extra: [number, number, number][] = c.type === "IQ4_XS"
        ? [[1, 4, 0], [16, 4, 0], [1, 1, 1], [1, 4, 1], [16, 4, 1]]
        : [[1, 4, 0], [1, 1, 1]];
      for (const [copies, groups, pf] of extra) {
        const v = { ...base, COPIES: copies, GROUPS: groups, PF: pf };
        const bytes = matvecQ8WorkgroupBytes(v);
        if (bytes <= device.limits.maxComputeWorkgroupStorageSize) q8variants.push(v);
        else {line({
            event: "skip",
            case: c.name,
            type: c.type,
            constants: v,
            why: `${bytes} B of workgroup memory`,
          });}
      }
    } else if (args.sweep) {
      for (const [team, rows] of [[32, 1], [32, 2], [32, 4], [16, 4], [64, 4]] as const) {
        if (team <= c.k / 32) q8variants.push(matvecQ8Constants(shape, { team, rows }));
      }
    }
    for (const v of q8variants) {
      const ops: Q8Op[] = [];
      let constants: MatvecQ8Constants | undefined;
      for (let i = 0; i < copies; i++) {
        const shape: MatvecQ8Shape = { type: c.type, k: c.k, n: c.n, wOffsetBytes: i * slot };
        constants = v ?? matvecQ8Constants(shape);
        device.queue.writeBuffer(q8params, 256 * i, matvecQ8Params(shape));
        ops.push(
          await prepareMatvecQ8(cache, {
            device,
            shape,
            constants,
            bindings: {
              params: { buffer: q8params, offset: 256 * i, size: MATVEC_Q8_PARAMS_BYTES },
              weights,
              xq: { buffer: xqBuf, offset: 0, size: q8xBytes(c.k) },
              y: yBuf,
            },
          }),
        );
      }
      jobs.push(kernelJob("matvec_q8", (p, i) => encodeQ8(p, ops[i % copies]!), { constants }));
    }
    if (TABLES) {
      const secs = await timeJobs(jobs, reps);
      jobs.forEach((j, i) => j.emit(secs[i]!, tBytes / secs[0]! / 1e9));
      continue;
    }
    // With the decode norm (the engine's in-projections): quantize_q8 NORM then matvec_q8, two dispatches,
    // against matvec_q8_fused NORM, one.
    const norm = { eps: 1e-6 };
    const nshape = { type: c.type, k: c.k, norm };
    device.queue.writeBuffer(q8params, 256 * (MAX_COPIES + 1), quantizeQ8Params(nshape));
    const nqop = await prepareQuantizeQ8(cache, {
      device,
      shape: nshape,
      bindings: {
        params: { buffer: q8params, offset: 256 * (MAX_COPIES + 1), size: QUANTIZE_Q8_PARAMS_BYTES },
        x: xBuf,
        xq: { buffer: xqBuf, offset: 0, size: q8xBytes(c.k) },
        nw: nwBuf,
        xn: xnBuf,
      },
    });
    const pairOps: Q8Op[] = [];
    const fusedOps: Q8Op[] = [];
    let fusedConstants: MatvecQ8FusedConstants | undefined;
    for (let i = 0; i < copies; i++) {
      const shape: MatvecQ8FusedShape = { type: c.type, k: c.k, n: c.n, wOffsetBytes: i * slot, norm };
      const params = { buffer: q8params, offset: 256 * i, size: MATVEC_Q8_PARAMS_BYTES };
      pairOps.push(
        await prepareMatvecQ8(cache, {
          device,
          shape,
          bindings: { params, weights, xq: { buffer: xqBuf, offset: 0, size: q8xBytes(c.k) }, y: yBuf },
        }),
      );
      fusedConstants = matvecQ8FusedConstants(shape);
      fusedOps.push(
        await prepareMatvecQ8Fused(cache, {
          device,
          shape,
          constants: fusedConstants,
          bindings: {
            params,
            weights,
            x: xBuf,
            nw: nwBuf,
            xn: xnBuf,
            xo: { buffer: xqBuf, offset: 0, size: q8xBytes(c.k) },
            y: yBuf,
          },
        }),
      );
    }
    jobs.push(
      kernelJob("quantize_q8+matvec_q8", (p, i) => {
        encodeQ8(p, nqop);
        encodeQ8(p, pairOps[i % copies]!);
      }, { norm: true }),
      kernelJob("matvec_q8_fused", (p, i) => encodeQ8(p, fusedOps[i % copies]!), {
        norm: true,
        constants: fusedConstants,
      }),
    );
  }
  const secs = await timeJobs(jobs, reps);
  const ceiling = tBytes / secs[0]! / 1e9;
  if (BATCH_SWEEP && !Q8B_ONLY) oldSecs = secs[1];
  jobs.forEach((j, i) => j.emit(secs[i]!, ceiling));
}
// Prefill matmul: attn_qkv-shaped weights times M tokens (not bandwidth-bound: GFLOP/s = 2·K·N·M / time).
if (!Q8 && !BATCH_SWEEP) {
  const m = QUICK ? 64 : 512;
  const k = 2048;
  const n = QUICK ? 1024 : 8192;
  const xm = device.createBuffer({
    size: 4 * k * m,
    usage: GPUBufferUsage.STORAGE | GPUBufferUsage.COPY_DST,
  });
  device.queue.writeBuffer(xm, 0, new Float32Array(k * m).map(() => Math.random() - 0.5));
  const ym = device.createBuffer({ size: 4 * n * m, usage: GPUBufferUsage.STORAGE });
  for (const type of ["IQ4_XS", "Q8_0", "F16"] as GgmlTypeName[]) {
    const shape: MatmulShape = { type, k, n, m };
    device.queue.writeBuffer(params, 0, matmulParams(shape));
    const op = await prepareMatmul(cache, {
      device,
      shape,
      bindings: { params: { buffer: params, offset: 0, size: MATMUL_PARAMS_BYTES }, weights, x: xm, y: ym },
    });
    const reps = QUICK ? 2 : 20;
    const t = await time((p) => encodeMatmul(p, op), reps);
    line({ kernel: "matmul", type, ne: [k, n], m, reps, ms: t * 1e3, gflops: (2 * k * n * m) / t / 1e9 });
  }
  xm.destroy();
  ym.destroy();
}
// The marginal ceiling: one read of the whole buffer.
{
  device.queue.writeBuffer(sparams, 0, streamReadParams({ offsetBytes: 0, sizeBytes: BUF_BYTES }));
  const op = await prepareStreamRead(cache, {
    device,
    shape: { offsetBytes: 0, sizeBytes: BUF_BYTES },
    bindings: {
      params: { buffer: sparams, offset: 0, size: STREAM_READ_PARAMS_BYTES },
      src: weights,
      out: sink,
    },
  });
  const reps = Math.max(4, Math.ceil(PASS_BYTES / BUF_BYTES));
  const t = await time((p) => encodeStreamRead(p, op), reps);
  line({
    kernel: "stream_read",
    case: "whole_buffer",
    bytes: BUF_BYTES,
    reps,
    ms: t * 1e3,
    gbps: BUF_BYTES / t / 1e9,
  });
}
device.destroy();

async function gitCommit(): Promise<string> {
  const env = Deno.env.get("BENCH_COMMIT");
  if (env) return env;
  try {
    const out = await new Deno.Command("git", { args: ["rev-parse", "--short", "HEAD"], stderr: "null" })
      .output();
    return out.success ? new TextDecoder().decode(out.stdout).trim() : "unknown";
  } catch {
    return "unknown"; // no git on the machine (the lent GPU): pass BENCH_COMMIT
  }
}
