/**
 * Benchmark: one gated DeltaNet layer's prefill of n tokens at qwen35moe/qwen3next dims (N_K=16, N_V=32,
 * D_K=D_V=128), the chunked kernels (`gdn_chunk_prep`, `gdn_chunk`, `gdn_chunk_norm`, each timed alone and the
 * three together) beside `gdn_step` over the same tokens.
 *
 * Usage: `deno run -A bench/gdn_chunk.ts [--n 256,512,1024,2048] [--reps 5] [--step-max 2048] [--tiled]
 * [--split 1,2,4,8]` (`--split`: `gdn_step` with those SPLIT values, plus `gdn_chunk_norm` above 1).
 * Timestamp queries around one compute pass of `reps` repetitions when the adapter has them, else wall clock;
 * the best of 5 such passes after 3 untimed ones.
 * Prints one JSON line per measurement, never asserts.
 * @module
 */
import { parseArgs } from "node:util";
import { PassTimer } from "./_pass_timer.ts";
import { acquireGpu } from "../engine/gpu/device.ts";
import { bindGroup, PipelineCache } from "../wgsl/kernel.ts";
import { gdnChunkDispatches, gdnChunkScratchBytes, prepareGdnChunk } from "../wgsl/gdn_chunk.ts";
import {
  GDN_STEP,
  GDN_STEP_BINDINGS,
  gdnDims,
  type GdnStepBindings,
  type GdnStepConstants,
  gdnStepGrid,
  gdnStepNeedsNorm,
  packGdnParams,
} from "../wgsl/gdn_step.ts";

const { values: args } = parseArgs({
  options: {
    n: { type: "string", default: "256,512,1024,2048" },
    reps: { type: "string", default: "5" },
    "step-max": { type: "string", default: "2048" },
    tiled: { type: "boolean", default: false },
    split: { type: "string", default: "1" },
  },
});
const ns = args.n!.split(",").map(Number);
const reps = Number(args.reps);
const stepMax = Number(args["step-max"]);
const splits = args.split!.split(",").map(Number);

const gpu = await acquireGpu();
const device = gpu.device;
const cache = new PipelineCache(device);
const commit = new TextDecoder().decode(
  (await new Deno.Command("git", { args: ["rev-parse", "--short", "HEAD"], stdout: "piped" }).output()
    .catch(() => ({ stdout: new Uint8Array() }))).stdout,
).trim();

function line(o: Record<string, unknown>): void {
  console.log(JSON.stringify({ bench: "gdn_chunk", commit, adapter: gpu.summary, ...o }));
}

const c: GdnStepConstants = {
  N_K: 16,
  N_V: 32,
  D_K: 128,
  D_V: 128,
  K_CONV: 4,
  EPS: 1e-6,
  KAPPA_TILED: args.tiled!,
  BA_GROUPED: !args.tiled,
  A_OFF: 0,
  SPLIT: 1,
};
const d = gdnDims(c);
const maxN = Math.max(...ns);

function buf(words: number, fill?: () => number): GPUBuffer {
  const b = device.createBuffer({
    size: Math.max(16, words * 4),
    usage: GPUBufferUsage.STORAGE | GPUBufferUsage.COPY_DST,
    mappedAtCreation: true,
  });
  if (fill) {
    const f = new Float32Array(b.getMappedRange());
    for (let i = 0; i < words; i++) f[i] = fill();
  }
  b.unmap();
  return b;
}
const rnd = () => Math.random() - 0.5;
const baW = c.BA_GROUPED ? 2 * c.N_V : c.N_V;
const ba = buf(baW * maxN, rnd);
const base = {
  xQkv: buf(d.convCh * maxN, rnd),
  z: buf(d.inner * maxN, rnd),
  b: ba,
  a: ba,
  convW: buf(c.K_CONV * d.convCh, rnd),
  dtBias: buf(c.N_V, rnd),
  ssmA: buf(c.N_V, () => -0.3),
  normW: buf(c.D_V, () => 1),
  convRing: buf(d.convRing, rnd),
  state: buf(d.state, () => 0.01 * rnd()),
  y: buf(d.inner * maxN),
};
const sb = gdnChunkScratchBytes(c, maxN);
const scratch = { wsQkw: buf(sb.wsQkw / 4), wsUp: buf(sb.wsUp / 4) };
line({ event: "start", summary: gpu.summary, timestamps: gpu.timestamps, scratchBytes: sb, constants: c });

const timer = new PassTimer(device, gpu.timestamps);

/** Seconds per repetition of `encode` in one compute pass: the best of 5 passes after 3 warm-ups. */
function time(encode: (pass: GPUComputePassEncoder) => void): Promise<number> {
  return timer.perRep((pass) => encode(pass), reps, { timed: 5 });
}

const pipes = await prepareGdnChunk(cache, c);
for (const n of ns) {
  const bindings: GdnStepBindings = { ...base, params: buf(2) };
  device.queue.writeBuffer(bindings.params as GPUBuffer, 0, new Uint32Array(packGdnParams(123, n)));
  const ds = gdnChunkDispatches(c, { bindings, scratch, maxTokens: n });
  const groups = ds.map((x, i) => bindGroup(device, pipes[i]!, x.bindings));
  const one = (i: number) => (pass: GPUComputePassEncoder) => {
    pass.setPipeline(pipes[i]!);
    pass.setBindGroup(0, groups[i]!);
    pass.dispatchWorkgroups(...ds[i]!.grid);
  };
  const us = (s: number) => Math.round(s * 1e7) / 10;
  const parts: Record<string, number> = {};
  for (let i = 0; i < ds.length; i++) parts[ds[i]!.spec.name] = us(await time(one(i)));
  const all = await time((pass) => [0, 1, 2].forEach((i) => one(i)(pass)));
  line({ what: "gdn_chunk", nTokens: n, us: us(all), usPerToken: us(all / n), parts });
  for (const split of n <= stepMax ? splits : []) {
    // SPLIT > 1: the step writes o before the gated norm, so gdn_chunk_norm (ds[2]) follows it.
    const cs = { ...c, SPLIT: split };
    const step = await cache.get(GDN_STEP, cs);
    const g = bindGroup(device, step, GDN_STEP_BINDINGS.map((k) => bindings[k]));
    const s = await time((pass) => {
      pass.setPipeline(step);
      pass.setBindGroup(0, g);
      pass.dispatchWorkgroups(...gdnStepGrid(cs));
      if (gdnStepNeedsNorm(cs)) one(2)(pass);
    });
    line({
      what: "gdn_step",
      split,
      nTokens: n,
      us: us(s),
      usPerToken: us(s / n),
      speedup: Math.round(s / all * 10) / 10,
    });
  }
}
