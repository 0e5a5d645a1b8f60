/**
 * Benchmark: one gated DeltaNet layer's prefill of n tokens at qwen35moe/qwen3next dims (N_K=16, N_V=32,
 * D_K=D_V=128), the chunked kernels (`gdn_chunk_prep`, `gdn_chunk`, `gdn_chunk_norm`, each timed alone and the
 * three together) beside `gdn_step` over the same tokens.
 *
 * Usage: `deno run -A bench/gdn_chunk.ts [--n 256,512,1024,2048] [--reps 5] [--step-max 2048] [--tiled]
 * [--split 1,2,4,8] [--cut 100] [--compact-solve]` (`--split`: `gdn_step` with those SPLIT values, plus
 * `gdn_chunk_norm` above 1; `--cut`: the chunked kernels cut at that token, with a state tap, as a
 * prompt-boundary snapshot does; `--compact-solve`: the prep's forward substitution as loops, COMPACT_SOLVE,
 * what CPU adapters run). `--scan [--scan-n 512,2048] [--quick]`: instead, `gdn_chunk_prep` beside its version
 * before phase 4's named registers (`bench/_gdn_chunk_prep_v1.wgsl`), the one before phases 1 and 5's (conv
 * window, substitution column: `bench/_gdn_chunk_prep_v2.wgsl`) and its other COMPACT_SOLVE, then the scan
 * `gdn_chunk` alone in every shape BJ × CJ beside
 * the kernel before its rewrite (`bench/_gdn_chunk_v1.wgsl`, "v1"), µs per dispatch (the scans on the same prep
 * output), each line with its max |difference| from v1's output after one dispatch from the same state
 * (`--quick`: n = 64, one repetition, for a check on lavapipe).
 * Timestamp queries around one compute pass of `reps` repetitions when the adapter has them, else wall clock;
 * the best of 5 such passes after 3 untimed ones.
 * Prints one JSON line per measurement, never asserts.
 * @module
 */
import { parseArgs } from "node:util";
import { PassTimer } from "./_pass_timer.ts";
import { acquireGpu } from "../engine/gpu/device.ts";
import { bindGroup, type KernelSpec, PipelineCache, variantKey } from "../wgsl/kernel.ts";
import {
  GDN_CHUNK,
  GDN_CHUNK_PREP,
  gdnChunkDispatches,
  type GdnChunkScan,
  gdnChunkScan,
  gdnChunkScratchBytes,
  packGdnChunkParams,
  prepareGdnChunk,
  scanConstants,
} from "../wgsl/gdn_chunk.ts";
import {
  GDN_ONE_COLUMN,
  GDN_STEP,
  GDN_STEP_BINDINGS,
  gdnDims,
  type GdnStepBindings,
  type GdnStepConstants,
  gdnStepGrid,
  gdnStepNeedsNorm,
} from "../wgsl/gdn_step.ts";

const { values: args } = parseArgs({
  options: {
    n: { type: "string", default: "256,512,1024,2048" },
    reps: { type: "string", default: "5" },
    "step-max": { type: "string", default: "2048" },
    tiled: { type: "boolean", default: false },
    split: { type: "string", default: "1" },
    scan: { type: "boolean", default: false },
    "scan-n": { type: "string", default: "512,2048" },
    quick: { type: "boolean", default: false },
    cut: { type: "string", default: "0" },
    "compact-solve": { type: "boolean", default: false },
  },
});
const ns = args.n!.split(",").map(Number);
const reps = args.quick ? 1 : Number(args.reps);
const stepMax = Number(args["step-max"]);
const splits = args.split!.split(",").map(Number);
const cut = Number(args.cut);

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
  ...GDN_ONE_COLUMN,
};
const d = gdnDims(c);
const scanNs = args.quick ? [64] : args["scan-n"]!.split(",").map(Number);
const maxN = Math.max(...(args.scan ? scanNs : ns));

function buf(words: number, fill?: () => number): GPUBuffer {
  const b = device.createBuffer({
    size: Math.max(16, words * 4),
    usage: GPUBufferUsage.STORAGE | GPUBufferUsage.COPY_DST | GPUBufferUsage.COPY_SRC,
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

/** The scan before the named-register rewrite, its header as it was (grid N_V × D_V/16). */
const GDN_CHUNK_V1: KernelSpec = {
  name: "gdn_chunk_v1",
  url: new URL("./_gdn_chunk_v1.wgsl", import.meta.url),
  lib: [],
  constants: { N_V: "u32", D_K: "u32", D_V: "u32" },
};

/** The prep before phase 4's named registers, its header as it was. */
const GDN_CHUNK_PREP_V1: KernelSpec = {
  ...GDN_CHUNK_PREP,
  constants: GDN_STEP.constants,
  name: "gdn_chunk_prep_v1",
  url: new URL("./_gdn_chunk_prep_v1.wgsl", import.meta.url),
};

/** The prep before phases 1 and 5 left their loop-indexed private arrays, its header as it was. */
const GDN_CHUNK_PREP_V2: KernelSpec = {
  ...GDN_CHUNK_PREP,
  constants: GDN_STEP.constants,
  name: "gdn_chunk_prep_v2",
  url: new URL("./_gdn_chunk_prep_v2.wgsl", import.meta.url),
};

const pipes = await prepareGdnChunk(cache, c, { compactSolve: args["compact-solve"] });
const state0 = buf(d.state);
{
  const e = device.createCommandEncoder();
  e.copyBufferToBuffer(base.state, 0, state0, 0, d.state * 4);
  device.queue.submit([e.finish()]);
}
if (args.scan) await compareScans();
const tap = buf(d.state);
for (const n of args.scan ? [] : ns) {
  const bindings: GdnStepBindings = { ...base, params: buf(3) };
  const nCut = cut < n ? cut : 0;
  device.queue.writeBuffer(bindings.params as GPUBuffer, 0, packGdnChunkParams(123, n, nCut));
  const ds = gdnChunkDispatches(c, { bindings, scratch, maxTokens: n, tap: nCut > 0 ? tap : undefined });
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
  line({
    what: "gdn_chunk",
    compactSolve: args["compact-solve"],
    nTokens: n,
    cut: nCut,
    us: us(all),
    usPerToken: us(all / n),
    parts,
  });
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

/** Largest |a[i] − b[i]|. */
function maxDiff(a: Float32Array, b: Float32Array): number {
  let m = 0;
  for (let i = 0; i < a.length; i++) m = Math.max(m, Math.abs(a[i]! - b[i]!));
  return m;
}

/** Runs `encode` once (the state reset to its initial value first) and reads back the leading bytes of `outs`. */
async function readAfter(
  encode: (pass: GPUComputePassEncoder) => void,
  outs: readonly (readonly [GPUBuffer | { buffer: GPUBuffer }, number])[],
): Promise<Float32Array> {
  const total = outs.reduce((s, [, bytes]) => s + bytes, 0);
  const read = device.createBuffer({ size: total, usage: GPUBufferUsage.MAP_READ | GPUBufferUsage.COPY_DST });
  const e = device.createCommandEncoder();
  e.copyBufferToBuffer(state0, 0, base.state, 0, d.state * 4);
  const p = e.beginComputePass();
  encode(p);
  p.end();
  let at = 0;
  for (const [b, bytes] of outs) {
    e.copyBufferToBuffer("buffer" in b ? b.buffer : b, 0, read, at, bytes);
    at += bytes;
  }
  device.queue.submit([e.finish()]);
  await read.mapAsync(GPUMapMode.READ);
  const got = new Float32Array(read.getMappedRange().slice(0));
  read.unmap();
  read.destroy();
  return got;
}

/** `--scan`: v1 and every scan shape on one prep output per n; µs per dispatch and the difference from v1. */
async function compareScans(): Promise<void> {
  const engine = gdnChunkScan(c);
  const shapes: GdnChunkScan[] = [8, 16, 32].flatMap((BJ) => [1, 2].map((CJ) => ({ BJ, CJ })));
  const variants = [
    { variant: "v1", spec: GDN_CHUNK_V1, k: { N_V: c.N_V, D_K: c.D_K, D_V: c.D_V }, bj: 16 },
    ...shapes.map((s) => ({
      variant: `BJ${s.BJ}.CJ${s.CJ}`,
      spec: GDN_CHUNK,
      k: scanConstants(c, s),
      bj: s.BJ,
    })),
  ];
  const us = (s: number) => Math.round(s * 1e7) / 10;
  for (const n of scanNs) {
    const bindings: GdnStepBindings = { ...base, params: buf(3) };
    device.queue.writeBuffer(bindings.params as GPUBuffer, 0, packGdnChunkParams(123, n));
    const ds = gdnChunkDispatches(c, { bindings, scratch, maxTokens: n });
    // prep, v1, v2 then the engine's (whose output the scans read), each with its difference from v1's scratch
    const nb = gdnChunkScratchBytes(c, n);
    let prepRef: Float32Array | undefined;
    let prepV1Us = 0;
    let prepV2Us = 0;
    const preps = [
      ["v1", await cache.get(GDN_CHUNK_PREP_V1, c)],
      ["v2", await cache.get(GDN_CHUNK_PREP_V2, c)],
      ["engine", pipes[0]],
      // the engine's other form of the forward substitution (StageOptions.gdnCompactSolve)
      [
        args["compact-solve"] ? "unrolled" : "compact",
        await cache.get(GDN_CHUNK_PREP, { ...c, COMPACT_SOLVE: !args["compact-solve"] }),
      ],
    ] as const;
    for (const [variant, pipe] of preps) {
      const group = bindGroup(device, pipe, ds[0]!.bindings);
      const one = (p: GPUComputePassEncoder) => {
        p.setPipeline(pipe);
        p.setBindGroup(0, group);
        p.dispatchWorkgroups(...ds[0]!.grid);
      };
      const t = await time(one);
      const got = await readAfter(one, [[scratch.wsQkw, nb.wsQkw], [scratch.wsUp, nb.wsUp]]);
      prepRef ??= got;
      if (variant === "v1") prepV1Us = t;
      if (variant === "v2") prepV2Us = t;
      line({
        what: "gdn_chunk_prep",
        variant,
        nTokens: n,
        us: us(t),
        usPerToken: us(t / n),
        speedupVsV1: Math.round(prepV1Us / t * 100) / 100,
        speedupVsV2: variant === "v1" ? null : Math.round(prepV2Us / t * 100) / 100,
        maxDiffScratch: maxDiff(got, prepRef),
      });
    }
    let ref: { y: Float32Array; state: Float32Array } | undefined;
    let v1Us = 0;
    for (const v of variants) {
      const pipe = await cache.get(v.spec, v.k);
      // v1 predates the tap (binding 5)
      const group = bindGroup(
        device,
        pipe,
        v.spec === GDN_CHUNK ? ds[1]!.bindings : ds[1]!.bindings.slice(0, 5),
      );
      const grid = [c.N_V, c.D_V / v.bj, 1] as const;
      const one = (p: GPUComputePassEncoder) => {
        p.setPipeline(pipe);
        p.setBindGroup(0, group);
        p.dispatchWorkgroups(...grid);
      };
      const t = await time(one);
      // one dispatch from the initial state, read back
      const yWords = d.inner * n;
      const all = await readAfter(one, [[base.y, yWords * 4], [base.state, d.state * 4]]);
      const got = { y: all.subarray(0, yWords), state: all.subarray(yWords) };
      ref ??= got;
      if (v.variant === "v1") v1Us = t;
      line({
        what: "gdn_chunk_scan",
        variant: v.variant,
        key: variantKey(v.spec, v.k),
        engine: v.spec === GDN_CHUNK && v.k.BJ === engine.BJ && v.k.CJ === engine.CJ,
        nTokens: n,
        grid,
        us: us(t),
        usPerToken: us(t / n),
        speedupVsV1: Math.round(v1Us / t * 100) / 100,
        maxDiffY: maxDiff(got.y, ref.y),
        maxDiffState: maxDiff(got.state, ref.state),
      });
    }
  }
}
