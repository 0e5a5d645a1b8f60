/**
 * Benchmark: quantize_q8 alone, one invocation per chunk against one per quad word (QuantizeQ8Shape.quads:
 * the same bits), at the shapes a batched decode step rounds: K = 2,048 (the in-projections, with the
 * attention norm: NORM) and 4,096 (ssm_out's x, plain), over 1, 8 and 16 columns. Each line: µs per
 * dispatch, dispatches back to back in one pass (each writes the buffer the next writes: they run one after
 * another, as in a step), the variants alternating over rounds and the best kept (the H200's clock drifts
 * within a run, docs/PERF.md).
 *
 * Usage: `deno run -A bench/quantize.ts [--quick]` (`--quick`: few repetitions, one round, for lavapipe). No
 * npm imports.
 * @module
 */
import { parseArgs } from "node:util";
import { acquireGpu } from "../engine/gpu/device.ts";
import { PipelineCache } from "../wgsl/kernel.ts";
import {
  encodeQ8,
  prepareQuantizeQ8,
  type Q8Op,
  q8xBytes,
  QUANTIZE_Q8_PARAMS_BYTES,
  quantizeQ8Params,
  type QuantizeQ8Shape,
} from "../wgsl/matvec_q8.ts";
import { PassTimer } from "./_pass_timer.ts";
import { randomBuffer } from "./_buffers.ts";

const { values: args } = parseArgs({ options: { quick: { type: "boolean", default: false } }, strict: true });
const QUICK = args.quick ?? false;
const REPS = QUICK ? 4 : 400;
const ROUNDS = QUICK ? 1 : 4;

const gpu = await acquireGpu();
const device = gpu.device;
const cache = new PipelineCache(device);
const timer = new PassTimer(device, gpu.timestamps);
const STORAGE = GPUBufferUsage.STORAGE | GPUBufferUsage.COPY_DST;
const MAX_K = 4096;
const MAX_COLS = 16;
const x = randomBuffer(device, 4 * MAX_K * MAX_COLS, { f32: true });
const nw = randomBuffer(device, 4 * MAX_K, { f32: true });
const xq = device.createBuffer({ size: MAX_COLS * q8xBytes(MAX_K), usage: STORAGE });
const xn = device.createBuffer({ size: 4 * MAX_K * MAX_COLS, usage: STORAGE });

interface Job {
  readonly what: Record<string, unknown>;
  readonly op: Q8Op;
  best: number;
}
const jobs: Job[] = [];
for (const [k, norm] of [[2048, true], [4096, false]] as const) {
  for (const cols of [1, 8, 16]) {
    for (const quads of [false, true]) {
      const shape: QuantizeQ8Shape = {
        type: "IQ4_XS",
        k,
        cols,
        norm: norm ? { eps: 1e-6 } : undefined,
        quads,
      };
      const params = device.createBuffer({
        size: QUANTIZE_Q8_PARAMS_BYTES,
        usage: GPUBufferUsage.UNIFORM | GPUBufferUsage.COPY_DST,
      });
      device.queue.writeBuffer(params, 0, quantizeQ8Params(shape));
      const op = await prepareQuantizeQ8(cache, {
        device,
        shape,
        bindings: {
          params,
          x: { buffer: x, offset: 0, size: 4 * k * cols },
          xq: { buffer: xq, offset: 0, size: cols * q8xBytes(k) },
          nw: norm ? { buffer: nw, offset: 0, size: 4 * k } : undefined,
          xn: norm ? { buffer: xn, offset: 0, size: 4 * k * cols } : undefined,
        },
      });
      jobs.push({ what: { k, cols, norm, quads, workgroups: op.grid[0] * op.grid[1] }, op, best: Infinity });
    }
  }
}
for (let r = 0; r < ROUNDS; r++) {
  const order = r % 2 === 0 ? jobs : [...jobs].reverse();
  for (const j of order) {
    const s = await timer.perRep((pass) => encodeQ8(pass, j.op), REPS, QUICK ? { warmMs: 0, timed: 1 } : {});
    j.best = Math.min(j.best, s);
  }
}
for (const j of jobs) {
  console.log(JSON.stringify({ bench: "quantize", adapter: gpu.summary, ...j.what, us: j.best * 1e6 }));
}
