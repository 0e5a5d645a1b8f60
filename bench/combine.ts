/**
 * Benchmark: a batched step's MoE combine with the next block's norm and int8 rounding, as combine_q8 (one
 * dispatch, a workgroup per column) against the dispatches it replaces: residual_add (the combine, over many
 * workgroups) then quantize_q8 with the norm (`pair`), plus the second quantize in the other byte order that an
 * attention layer's v takes (`pair+v`, one layer in four on the 35B-A3B). Also the first combine_q8
 * (`bench/_combine_q8_v1.wgsl`: loads and norm-weight reads inside its loops). The 35B-A3B's shape: D = 2,048, 8
 * routed terms, at 1, 8 and 16 columns. Each line: µs per rep, reps back to back in one pass (each rewrites h,
 * y and xq, so they run one after another as in a step), the variants alternating over rounds and the best
 * kept.
 *
 * Usage: `deno run -A bench/combine.ts [--quick]` (`--quick`: few repetitions, one round, for lavapipe). No npm
 * imports.
 * @module
 */
import { parseArgs } from "node:util";
import { acquireGpu } from "../engine/gpu/device.ts";
import { bindGroup, type KernelSpec, PipelineCache } from "../wgsl/kernel.ts";
import {
  COMBINE_Q8,
  COMBINE_Q8_BINDINGS,
  type CombineQ8Constants,
  combineQ8Params,
} from "../wgsl/combine_q8.ts";
import { RESIDUAL_ADD, RESIDUAL_ADD_BINDINGS, residualAddGrid } from "../wgsl/residual_add.ts";
import { encodeQ8, prepareQuantizeQ8, type Q8Op, q8xBytes, quantizeQ8Params } from "../wgsl/matvec_q8.ts";
import { PassTimer } from "./_pass_timer.ts";
import { randomBuffer } from "./_buffers.ts";

const { values: args } = parseArgs({ options: { quick: { type: "boolean", default: false } }, strict: true });
const QUICK = args.quick ?? false;
const REPS = QUICK ? 4 : 400;
const ROUNDS = QUICK ? 1 : 4;

/** The first combine_q8, kept beside this script for comparison only (same bindings and constants). */
const COMBINE_Q8_V1: KernelSpec = {
  ...COMBINE_Q8,
  name: "combine_q8_v1",
  url: new URL("./_combine_q8_v1.wgsl", import.meta.url),
};

const gpu = await acquireGpu();
const device = gpu.device;
const cache = new PipelineCache(device);
const timer = new PassTimer(device, gpu.timestamps);
const D = 2048;
const TERMS = 8;
const MAX_COLS = 16;
const GCOL = 257;
const f32 = (words: number) => randomBuffer(device, 4 * words, { f32: true });
const e = f32(D * TERMS * MAX_COLS);
const weights = f32(TERMS * MAX_COLS);
const sh = f32(D * MAX_COLS);
const g = f32(GCOL * MAX_COLS);
const h = f32(D * MAX_COLS);
const nw = f32(D);
const y = f32(D * MAX_COLS);
const colBytes = q8xBytes(D);
const alt = (Math.ceil((MAX_COLS * colBytes) / 256) * 256) / 4;
const xq = device.createBuffer({ size: 4 * alt + MAX_COLS * colBytes, usage: GPUBufferUsage.STORAGE });
const unused = device.createBuffer({ size: 16, usage: GPUBufferUsage.STORAGE });
const uniform = (words: Uint32Array<ArrayBuffer>) => {
  const b = device.createBuffer({
    size: 16,
    usage: GPUBufferUsage.UNIFORM | GPUBufferUsage.STORAGE | GPUBufferUsage.COPY_DST,
  });
  device.queue.writeBuffer(b, 0, words);
  return b;
};

interface Job {
  readonly what: Record<string, unknown>;
  readonly encode: (pass: GPUComputePassEncoder) => void;
  best: number;
}
const jobs: Job[] = [];
for (const cols of [1, 8, 16]) {
  const c: CombineQ8Constants = { D, N_TERMS: TERMS, EPS: 1e-6 };
  const b = { params: uniform(combineQ8Params(cols, GCOL, alt)), e, weights, sh, g, h, nw, y, xq };
  for (const [name, spec] of [["combine_q8", COMBINE_Q8], ["combine_q8 v1", COMBINE_Q8_V1]] as const) {
    const p = await cache.get(spec, c);
    const group = bindGroup(device, p, COMBINE_Q8_BINDINGS.map((k) => b[k]));
    jobs.push({
      what: { variant: name, cols, dispatches: 1 },
      encode: (pass) => {
        pass.setPipeline(p);
        pass.setBindGroup(0, group);
        pass.dispatchWorkgroups(1, cols);
      },
      best: Infinity,
    });
  }
  const rc = { D, N_TERMS: TERMS, WEIGHTED: true, SHARED: true, NORM: false, EPS: 0 };
  const rb = { params: uniform(Uint32Array.of(cols, GCOL, 0, 0)), e, weights, sh, g, h, nw: e, y: unused };
  const rp = await cache.get(RESIDUAL_ADD, rc);
  const rg = bindGroup(device, rp, RESIDUAL_ADD_BINDINGS.map((k) => rb[k]));
  const quantize = async (type: "IQ4_XS" | "Q8_0", norm: boolean, offset: number): Promise<Q8Op> => {
    const shape = { type, k: D, cols, xStride: D, norm: norm ? { eps: 1e-6 } : undefined };
    return await prepareQuantizeQ8(cache, {
      device,
      shape,
      bindings: {
        params: uniform(quantizeQ8Params(shape)),
        x: norm ? h : y,
        xq: { buffer: xq, offset, size: cols * colBytes },
        nw: norm ? nw : undefined,
        xn: norm ? y : undefined,
      },
    });
  };
  const q1 = await quantize("IQ4_XS", true, 0);
  const q0 = await quantize("Q8_0", false, 4 * alt);
  for (const withV of [false, true]) {
    jobs.push({
      what: { variant: withV ? "pair+v" : "pair", cols, dispatches: withV ? 3 : 2 },
      encode: (pass) => {
        pass.setPipeline(rp);
        pass.setBindGroup(0, rg);
        pass.dispatchWorkgroups(...residualAddGrid(rc, cols));
        encodeQ8(pass, q1);
        if (withV) encodeQ8(pass, q0);
      },
      best: Infinity,
    });
  }
}
for (let r = 0; r < ROUNDS; r++) {
  const order = r % 2 === 0 ? jobs : [...jobs].reverse();
  for (const j of order) {
    const s = await timer.perRep(j.encode, REPS, QUICK ? { warmMs: 0, timed: 1 } : {});
    j.best = Math.min(j.best, s);
  }
}
for (const j of jobs) {
  console.log(JSON.stringify({ bench: "combine", adapter: gpu.summary, ...j.what, us: j.best * 1e6 }));
}
