/**
 * Benchmark: single-stream decode and prefill of a whole model on the GPU, beside the bandwidth roofline
 * measured in the same run (a streaming-read kernel over the model's largest weight buffer).
 *
 * Usage: `deno run -A bench/decode.ts [--model F.gguf] [--prompt 512] [--n 256] [--prefill 2048] [--chunk 256]
 * [--slots 1,2,4,8,16] [--moe-gate-up TEAM,ROWS[,BLOCKS,UNROLL[,WG]]] [--moe-down TEAM,ROWS[,BLOCKS,UNROLL[,WG]]] [--matvec TEAM,ROWS] [--fuse-route] [--int8-experts] [--f32-experts] [--per-column] [--gmv-max N]`: `--slots`
 * also measures batched decode (Stage.generateBatch) of that many slots at once; `--moe-*` overrides the expert
 * mat-vecs' constants, `--batched-q8-rows G[,D]` the ROWS of the int8-x expert passes (gate·up, down) of
 * batched steps (StageOptions.moeTuning.batchedQ8Rows: the same bits as the default), `--q8b-rows R` the
 * ROWS of the batched int8 mat-vecs (StageOptions.matvecTuning.q8bRows, the same bits), `--gdn-split S` the
 * SPLIT of the batched steps' gdn_step (StageOptions.gdnBatchedSplit: 2, 4 or 8, the same bits),
 * `--router-norm off` StageOptions.routerTakesNorm false (the post-attention norm's own dispatch or the
 * one-token router's prologue, as before the router took it; other bits), `--stop-points` gives each
 * batched item an abort signal, as the service does (a rewind point per slot at each readback batch's start), `--matvec` those of the batch-1 mat-vecs, `--norm-max-rows N`
 * StageOptions.normPrologueMaxRows, `--combine-norm-min-rows N` StageOptions.combineNormMinRows (default 17: batched
 * steps of up to 16 slots add over many workgroups and norm in a dispatch of their own; 2: they fuse), `--fuse-route` sets StageOptions.fuseDecodeRoute; the
 * numerics as the serving commands take them (cli/experts.ts): int8 x for every mat-vec by default
 * (StageOptions.int8Activations; `--int8` names it), `--int8-experts` int8 x for the expert passes alone,
 * `--f32-experts` f32 x everywhere,
 * `--per-column` StageOptions.groupedExperts false (prefill experts as per-column mat-vecs, not grouped matmuls),
 * `--gmv-max N` StageOptions.groupedMatvecMaxTokensPerExpert (thin chunks' experts as grouped mat-vecs up to N
 * routed tokens per expert on average; 0: off, the grouped matmul or per column as before),
 * `--temp T` samples every decode step at temperature T (top-k 40, top-p 0.95, min-p 0.05, seed 1: the GPU
 * sampler's cost against the argmax's; default 0, greedy), `--batch N` the decode steps per readback of the decode and batched-decode runs (default 8: ids stream
 * back 8 at a time; with early reads, engine/gpu/readback.ts, a readback costs ~1 ms, so 2-4 may cost nothing),
 * `--state-pool-max-bytes N` StageOptions.maxStatePoolBytes (1: every slot state a buffer of its own, so the
 * batched step runs gdn_step, attn_qk_rope and attn_decode per slot as before the pools).
 * Each level of 2 slots or more also prints `decode_batched_ablation`: the batched step back to back without
 * each class of dispatches (the batched-only quantizes and norms, moe_route, gdn_step, the experts), what each
 * costs in the stream rather than in a timed pass of its own.
 * With no `--model` it synthesizes a full-size 35B-A3B-shaped IQ4_XS model to `--synth-out` (default
 * `/tmp/bench-35b-a3b-iq4_xs.gguf`, reused when present). Prints one JSON line per measurement, never
 * asserts. No npm imports: it runs on the lent GPU machine with nothing but Deno.
 * @module
 */
import { expertsConflict, int8ActivationsFlag, int8ExpertsFlag } from "../cli/experts.ts";
import { parseArgs } from "node:util";
import { acquireGpu } from "../engine/gpu/device.ts";
import { PipelineCache } from "../wgsl/kernel.ts";
import { openGguf } from "../engine/gguf.ts";
import { parseTensorName } from "../engine/names.ts";
import { Stage } from "../engine/exec/stage.ts";
import type { Op } from "../engine/graph/builder.ts";
import { planModel, synthesize } from "../engine/synth.ts";
import { encodeStreamRead, prepareStreamRead, streamReadParams } from "../wgsl/stream_read.ts";
import { PassTimer } from "./_pass_timer.ts";
import { samplingParams } from "../engine/sampling.ts";

const { values: args } = parseArgs({
  options: {
    model: { type: "string" },
    "synth-out": { type: "string", default: "/tmp/bench-35b-a3b-iq4_xs.gguf" },
    prompt: { type: "string", default: "512" },
    n: { type: "string", default: "256" },
    prefill: { type: "string", default: "2048" },
    chunk: { type: "string", default: "256" },
    slots: { type: "string", default: "" },
    "moe-gate-up": { type: "string" },
    "moe-down": { type: "string" },
    "batched-q8-rows": { type: "string" },
    "q8b-rows": { type: "string" },
    "gdn-split": { type: "string" },
    "router-norm": { type: "string" },
    "q8b-xsum": { type: "string" },
    "stop-points": { type: "boolean", default: false },
    "norm-max-rows": { type: "string" },
    "combine-norm-min-rows": { type: "string" },
    matvec: { type: "string" },
    "fuse-route": { type: "boolean", default: false },
    "per-column": { type: "boolean", default: false },
    "gmv-max": { type: "string" },
    int8: { type: "boolean", default: false },
    "int8-experts": { type: "boolean", default: false },
    "f32-experts": { type: "boolean", default: false },
    "state-pool-max-bytes": { type: "string" },
    batch: { type: "string", default: "8" },
    temp: { type: "string", default: "0" },
  },
});

const conflict = expertsConflict(args);
if (conflict) throw new RangeError(conflict);

function emit(what: string, result: Record<string, unknown>): void {
  console.log(JSON.stringify({ bench: "decode", what, adapter: gpu.summary, ...result }));
}

const gpu = await acquireGpu();
let path = args.model;
if (!path) {
  path = args["synth-out"]!;
  const exists = await Deno.stat(path).then(() => true, () => false);
  if (!exists) {
    const r = await synthesize(
      planModel({ arch: "qwen35moe", preset: "35b-a3b", quant: "iq4_xs", seed: 7 }),
      {
        out: path,
      },
    );
    emit("synth", { path, dataBytes: r.dataBytes, seconds: r.seconds, mbPerSecond: r.mbPerSecond });
  }
}
const nPrompt = Number(args.prompt);
const nNew = Number(args.n);
const nPrefill = Number(args.prefill);
const maxChunk = Number(args.chunk);
const readbackBatch = Number(args.batch);
const temp = Number(args.temp);
if (!(temp >= 0 && temp <= 2)) throw new RangeError(`--temp ${args.temp} must be in 0..2`);
// Sampled decode (`--temp` > 0): the GPU sampler in every step instead of the argmax.
const sampling = temp > 0
  ? { sampling: samplingParams({ temperature: temp, topK: 40, topP: 0.95, minP: 0.05, seed: 1 }) }
  : {};
if (!Number.isInteger(readbackBatch) || readbackBatch < 1) {
  throw new RangeError(`--batch ${args.batch} must be >= 1`);
}
const batchSizes = args.slots ? args.slots.split(",").map(Number) : [];
const statePoolMax = args["state-pool-max-bytes"] === undefined
  ? undefined
  : Number(args["state-pool-max-bytes"]);
const tuning = (v: string | undefined) => {
  if (!v) return undefined;
  const [team, rows, blocks, unroll, wg] = v.split(",").map(Number);
  return { team: team!, rows: rows!, blocks, unroll, wg };
};
const q8Rows = args["batched-q8-rows"]?.split(",").map(Number);
const xsumArg = args["q8b-xsum"];
if (xsumArg !== undefined && xsumArg !== "0" && xsumArg !== "1") {
  throw new RangeError(`--q8b-xsum ${xsumArg} must be 0 or 1`);
}
const matvecTuning = args["q8b-rows"] === undefined && xsumArg === undefined ? tuning(args.matvec) : {
  ...tuning(args.matvec),
  ...(args["q8b-rows"] === undefined ? {} : { q8bRows: Number(args["q8b-rows"]) }),
  ...(xsumArg === undefined ? {} : { q8bXsum: xsumArg === "1" }),
};
const moeTuning = {
  gateUp: tuning(args["moe-gate-up"]),
  down: tuning(args["moe-down"]),
  ...(q8Rows ? { batchedQ8Rows: { gateUp: q8Rows[0], down: q8Rows[1] ?? q8Rows[0] } } : {}),
};
using file = await openGguf(path);

let t0 = performance.now();
const stage = await Stage.load(gpu, file, {
  nCtx: Math.max(nPrompt + nNew, nPrefill) + 8,
  nSlots: Math.max(1, ...batchSizes),
  maxChunk,
  moeTuning,
  matvecTuning,
  fuseDecodeRoute: args["fuse-route"],
  groupedExperts: !args["per-column"],
  groupedMatvecMaxTokensPerExpert: args["gmv-max"] === undefined ? undefined : Number(args["gmv-max"]),
  // The serving commands' numerics (cli/experts.ts).
  int8Activations: int8ActivationsFlag(args),
  int8Experts: int8ExpertsFlag(args),
  normPrologueMaxRows: args["norm-max-rows"] === undefined ? undefined : Number(args["norm-max-rows"]),
  combineNormMinRows: args["combine-norm-min-rows"] === undefined
    ? undefined
    : Number(args["combine-norm-min-rows"]),
  maxStatePoolBytes: statePoolMax,
  gdnBatchedSplit: args["gdn-split"] === undefined ? undefined : Number(args["gdn-split"]),
  routerTakesNorm: args["router-norm"] === undefined ? undefined : args["router-norm"] !== "off",
});
emit("load", {
  path,
  seconds: (performance.now() - t0) / 1000,
  weightBytes: stage.weightBytes,
  moeTuning,
  matvecTuning,
  fuseDecodeRoute: args["fuse-route"],
  groupedExperts: !args["per-column"],
  gmvMax: args["gmv-max"] ?? "default",
  int8Activations: stage.int8Activations,
  int8Experts: stage.int8Experts,
  maxStatePoolBytes: statePoolMax ?? null,
});
const hp = stage.hp;

// Active bytes per decoded token: every weight the step reads (experts: k of E; embedding: one row).
let activeBytes = 0;
for (const t of file.tensors.values()) {
  const id = parseTensorName(t.name);
  if (id === undefined || t.name.includes("nextn")) continue;
  if (id.id === "token_embd") activeBytes += t.nbytes / hp.nVocab;
  else if (id.id.endsWith("_exps")) activeBytes += (t.nbytes * hp.nExpertUsed) / hp.nExpert;
  else activeBytes += t.nbytes;
}

// Streaming ceiling over the same kind of buffer the kernels read (largest weight buffer, many passes).
const { device } = gpu;
const ceilingBytes = Math.min(1 << 30, Math.floor(device.limits.maxStorageBufferBindingSize / 65536) * 65536);
const src = device.createBuffer({ size: ceilingBytes, usage: GPUBufferUsage.STORAGE });
const out = device.createBuffer({ size: 256, usage: GPUBufferUsage.STORAGE | GPUBufferUsage.COPY_SRC });
const params = device.createBuffer({ size: 16, usage: GPUBufferUsage.UNIFORM | GPUBufferUsage.COPY_DST });
device.queue.writeBuffer(params, 0, streamReadParams({ offsetBytes: 0, sizeBytes: ceilingBytes }));
const sr = await prepareStreamRead(new PipelineCache(device), {
  device,
  shape: { offsetBytes: 0, sizeBytes: ceilingBytes },
  bindings: { params, src, out },
});
const rb = device.createBuffer({ size: 16, usage: GPUBufferUsage.MAP_READ | GPUBufferUsage.COPY_DST });
/** Wall ms from submit to a landed 16-byte readback of what `record` encodes (the readback floor included). */
async function wallMs(record: (enc: GPUCommandEncoder) => void): Promise<number> {
  const enc = device.createCommandEncoder();
  record(enc);
  enc.copyBufferToBuffer(out, 0, rb, 0, 16);
  const t = performance.now();
  device.queue.submit([enc.finish()]);
  await rb.mapAsync(GPUMapMode.READ);
  rb.unmap();
  return performance.now() - t;
}
// The ceiling: 16 reads of the buffer in one pass, timed like the kernel benchmarks (bench/_pass_timer.ts:
// timestamp queries, warm-up, best of 3). The wall-clock difference of two submits used before read as low
// as 1938 GB/s right after loading (4233-4500 in bench/matvec.ts in the same call, docs/PERF.md).
const ceilingTimer = new PassTimer(device, gpu.timestamps);
const ceilingGBs = ceilingBytes / await ceilingTimer.perRep((pass) => encodeStreamRead(pass, sr), 16) / 1e9;
emit("stream_ceiling", { gbPerSecond: ceilingGBs, bytesPerPass: ceilingBytes });
src.destroy();

// Decode: prompt, then nNew greedy tokens; time from the first id (prefill done) to the last.
const rng = (i: number) => (Math.imul(i + 1, 2654435761) >>> 8) % (hp.nVocab - 300);
const prompt = Array.from({ length: nPrompt }, (_, i) => rng(i));
const ops = await stage.graph(0, 1, "last");
await stage.generate(0, prompt.slice(0, 8), { nNew: 16, ...sampling });
let tFirst = 0;
t0 = performance.now();
const g = await stage.generate(0, prompt, {
  nNew,
  batch: readbackBatch,
  ...sampling,
  onTokens: () => {
    if (tFirst === 0) tFirst = performance.now();
  },
});
const tEnd = performance.now();
const decodeTokS = (g.tokens.length - 1) / ((tEnd - tFirst) / 1000);
const rooflineTokS = (ceilingGBs * 1e9) / activeBytes;
emit("decode", {
  prompt: nPrompt,
  readbackBatch,
  temperature: temp,
  newTokens: g.tokens.length,
  tokPerSecond: decodeTokS,
  msPerToken: 1000 / decodeTokS,
  dispatchesPerStep: ops.length + 2,
  activeBytesPerToken: activeBytes,
  rooflineTokPerSecond: rooflineTokS,
  fractionOfRoofline: decodeTokS / rooflineTokS,
  prefillMs: tFirst - t0,
  gpuBytes: stage.weightBytes + stage.states.totalBytes,
});

// Profile: each dispatch of a graph in its own pass with timestamps, summed by kernel (null without
// timestamp queries).
async function profile(
  ops: readonly Op[],
): Promise<{ gpuMs: number; kernels: Record<string, unknown>[] } | null> {
  if (!gpu.timestamps) return null;
  const qs = device.createQuerySet({ type: "timestamp", count: 2 * ops.length });
  const res = device.createBuffer({
    size: 16 * ops.length,
    usage: GPUBufferUsage.QUERY_RESOLVE | GPUBufferUsage.COPY_SRC,
  });
  const read = device.createBuffer({
    size: 16 * ops.length,
    usage: GPUBufferUsage.MAP_READ | GPUBufferUsage.COPY_DST,
  });
  const byKernel = new Map<string, { ms: number; count: number }>();
  for (let rep = 0; rep < 3; rep++) {
    const enc = device.createCommandEncoder();
    ops.forEach((op, i) => {
      const pass = enc.beginComputePass({
        timestampWrites: { querySet: qs, beginningOfPassWriteIndex: 2 * i, endOfPassWriteIndex: 2 * i + 1 },
      });
      pass.setPipeline(op.pipeline);
      pass.setBindGroup(0, op.bindGroup);
      pass.dispatchWorkgroups(op.grid[0], op.grid[1], op.grid[2]);
      pass.end();
    });
    enc.resolveQuerySet(qs, 0, 2 * ops.length, res, 0);
    enc.copyBufferToBuffer(res, 0, read, 0, 16 * ops.length);
    device.queue.submit([enc.finish()]);
    await read.mapAsync(GPUMapMode.READ);
    const t = new BigInt64Array(read.getMappedRange().slice(0));
    read.unmap();
    if (rep === 0) continue;
    ops.forEach((op, i) => {
      // Per-slot dispatches of a batched step (`gdn_step.3`) count under their kernel.
      const kernel = op.label.replace(/^L\d+\./, "").replace(/\.\d+$/, "").replace(
        /^(attn_q|attn_k|attn_v|attn_qkv|attn_gate|ssm_beta|ssm_alpha|ssm_ba|ssm_in\.\w+)$/,
        "in_proj:$1",
      );
      const e = byKernel.get(kernel) ?? { ms: 0, count: 0 };
      e.ms += Number(t[2 * i + 1]! - t[2 * i]!) / 1e6 / 2;
      e.count += 1 / 2;
      byKernel.set(kernel, e);
    });
  }
  qs.destroy();
  res.destroy();
  read.destroy();
  const total = [...byKernel.values()].reduce((a, e) => a + e.ms, 0);
  const kernels = [...byKernel.entries()].sort((a, b) => b[1].ms - a[1].ms).map(([k, e]) => ({
    kernel: k,
    ms: Number(e.ms.toFixed(4)),
    dispatches: e.count,
    share: Number((e.ms / total).toFixed(3)),
  }));
  return { gpuMs: total, kernels };
}

const decodeProfile = await profile(ops);
if (decodeProfile) {
  emit("decode_profile", { gpuMsPerStep: decodeProfile.gpuMs, kernels: decodeProfile.kernels });
}

// Ablation: the decode graph run back to back (one pass per step, as generate records it) with one class of
// dispatches left out, and with every dispatch replaced by an empty one-workgroup kernel (the cost of the
// dispatches themselves). Marginal ms per step: the difference of a long and a short run, which cancels the
// readback floor. Left-out dispatches make the numbers wrong, not the timing.
const empty = await device.createComputePipelineAsync({
  layout: "auto",
  compute: { module: device.createShaderModule({ code: "@compute @workgroup_size(1) fn main() {}" }) },
});
async function stepMs(list: readonly Op[], nullKernels = false): Promise<number> {
  const run = (steps: number) =>
    wallMs((enc) => {
      for (let i = 0; i < steps; i++) {
        const pass = enc.beginComputePass();
        for (const op of list) {
          if (nullKernels) {
            pass.setPipeline(empty);
            pass.dispatchWorkgroups(1);
          } else {
            pass.setPipeline(op.pipeline);
            pass.setBindGroup(0, op.bindGroup);
            pass.dispatchWorkgroups(op.grid[0], op.grid[1], op.grid[2]);
          }
        }
        pass.end();
      }
    });
  await run(4);
  const short = Math.min(await run(8), await run(8));
  const long = Math.min(await run(40), await run(40));
  return (long - short) / 32;
}
const classes: Record<string, (label: string) => boolean> = {
  gdn_step: (l) => l.includes("gdn_step"),
  attention: (l) => /attn_(qk_rope|decode|combine)/.test(l),
  experts: (l) => l.includes("ffn_exps") || l.includes("ffn_shexp"),
  router: (l) => l.includes("ffn_gate_inp"),
  moe_combine: (l) => l.includes("moe_combine"),
  in_proj: (l) => l.includes("in_proj") || /attn_[qkv]$/.test(l),
  out_proj: (l) => l.includes("ssm_out") || l.includes("attn_output"),
  lm_head: (l) => l === "output" || l.startsWith("output"),
};
const full = await stepMs(ops);
const ablation: Record<string, unknown>[] = [];
for (const [name, match] of Object.entries(classes)) {
  const kept = ops.filter((op) => !match(op.label));
  const ms = await stepMs(kept);
  ablation.push({ without: name, dispatches: ops.length - kept.length, msPerStep: ms, savedMs: full - ms });
}
emit("decode_ablation", {
  msPerStep: full,
  emptyDispatchesMsPerStep: await stepMs(ops, true),
  dispatches: ops.length,
  ablation,
});

// Prefill: one prompt of nPrefill tokens in chunks of maxChunk.
const long = Array.from({ length: nPrefill }, (_, i) => rng(i + 99));
await stage.run(0, { tokens: long.slice(0, maxChunk) }, 0);
t0 = performance.now();
await stage.run(0, { tokens: long }, 0);
const prefillS = (performance.now() - t0) / 1000;
emit("prefill", { tokens: nPrefill, chunk: maxChunk, tokPerSecond: nPrefill / prefillS, seconds: prefillS });
// Where a prefill chunk's time goes: the graph of one chunk of maxChunk tokens, profiled as the decode step.
const prefillProfile = await profile(await stage.graph(0, maxChunk, "last"));
if (prefillProfile) {
  emit("prefill_profile", {
    chunk: maxChunk,
    gpuMsPerChunk: prefillProfile.gpuMs,
    kernels: prefillProfile.kernels,
  });
}
// Batched decode (after the profiles: its prefills leave other positions and counts in slot 0's params,
// which the profiled decode graph reads): B slots with their own 64-token prompts stepped together; aggregate ids per second from
// the moment the last slot's first id exists (the prompts are prefilled one after another) to the end.
for (const B of batchSizes) {
  const slots = Array.from({ length: B }, (_, i) => i);
  let firsts = 0;
  let tStart = 0;
  const items = slots.map((s) => ({
    slot: s,
    prompt: Array.from({ length: 64 }, (_, i) => rng(i + 1000 * (s + 1))),
    opts: {
      nNew: Math.min(nNew, 128),
      ...sampling,
      // As the service runs every request: an abort signal, so each batch starts with a rewind point per slot.
      ...(args["stop-points"] ? { signal: new AbortController().signal } : {}),
      onTokens: (ids: readonly number[]) => {
        if (ids.length === 1 && ++firsts === B) tStart = performance.now();
      },
    },
  }));
  await stage.generateBatch(items.map((it) => ({ ...it, opts: { nNew: 9, ...sampling } })));
  const rs = await stage.generateBatch(items, { batch: readbackBatch });
  const tDone = performance.now();
  const ids = rs.reduce((a, r) => a + r.tokens.length - 1, 0);
  // One slot runs its solo decode graph (generateBatch of one item is Stage.generate).
  const bops = B === 1 ? await stage.graph(0, 1, "last") : await stage.batchGraph(slots);
  emit("decode_batched", {
    slots: B,
    readbackBatch,
    temperature: temp,
    stopPoints: args["stop-points"],
    maxStatePoolBytes: statePoolMax ?? null,
    newTokensPerSlot: rs[0]!.tokens.length,
    tokPerSecond: ids / ((tDone - tStart) / 1000),
    msPerStep: (tDone - tStart) / (ids / B),
    dispatchesPerStep: bops.length + 2 * B,
  });
  // Where a batched step's GPU time goes, kernel by kernel (each dispatch in a pass of its own).
  const bp = await profile(bops);
  if (bp) {
    emit("decode_batched_profile", { slots: B, gpuMsPerStep: bp.gpuMs, kernels: bp.kernels.slice(0, 14) });
  }
  // What the batched step's own dispatches cost back to back (the solo step fuses these): marginal ms per
  // step without each class, as the solo ablation above. No class that changes the routing (without the
  // embedding rows the hidden state runs away and every column picks the same experts, read from L2).
  if (B >= 2) {
    const bfull = await stepMs(bops);
    const batchedClasses: Record<string, (label: string) => boolean> = {
      q8: (l) => l.endsWith(".q8"),
      norms: (l) => /^L\d+\.post_attention_norm$/.test(l) || l === "output_norm",
      moe_route: (l) => l.includes("moe_route"),
      gdn_step: (l) => l.includes("gdn_step"),
      experts: (l) => l.includes("ffn_exps") || l.includes("ffn_shexp"),
    };
    const rows: Record<string, unknown>[] = [];
    for (const [name, match] of Object.entries(batchedClasses)) {
      const kept = bops.filter((op) => !match(op.label));
      const ms = await stepMs(kept);
      rows.push({ without: name, dispatches: bops.length - kept.length, msPerStep: ms, savedMs: bfull - ms });
    }
    emit("decode_batched_ablation", { slots: B, msPerStep: bfull, dispatches: bops.length, ablation: rows });
  }
}

stage.destroy();
