/**
 * Benchmark: what building a stage's graphs costs on the CPU, the part of a request's time to first token that
 * is not GPU work. A graph is built once per (slot, chunk width, rows) and per batched slot set; a request pays
 * it on the first run of its slot and prompt-tail width (`bench/serve.ts` `ttftColdSlotMs` against `ttftMs`).
 *
 * Usage: `deno run -A bench/graph_build.ts [--model F.gguf] [--slots 8] [--chunk 512] [--widths 24]
 * [--f32-experts]` (default model: the tiny qwen35moe fixture; `--f32-experts`: the graphs of f32 x for the
 * expert passes, not the serving commands' default int8 x). After one warm-up graph per kind (its pipelines compiled), it
 * times and counts (`createBindGroup` calls, bytes of buffers created) per graph:
 * - `coldSlot`: width 64 on each slot but the first (the width built before on slot 0);
 * - `newWidth`: `--widths` fresh widths 65.. on slot 0;
 * - `decode`: the one-token graph on each slot but the first;
 * - `batched`: batched steps of slots [1..B] and [0..B-1] after [0..B-1]'s first build rotated (a new set).
 * One JSON line per kind; never asserts. No npm imports.
 * @module
 */
import { parseArgs } from "node:util";
import { acquireGpu } from "../engine/gpu/device.ts";
import { openGguf } from "../engine/gguf.ts";
import { Stage } from "../engine/exec/stage.ts";
import { MAX_BATCH_SLOTS } from "../engine/exec/activations.ts";

const { values: args } = parseArgs({
  options: {
    model: { type: "string" },
    slots: { type: "string", default: "8" },
    chunk: { type: "string", default: "512" },
    widths: { type: "string", default: "24" },
    "f32-experts": { type: "boolean", default: false },
  },
  strict: true,
});
const nSlots = Number(args.slots);
const nWidths = Number(args.widths);
if (!Number.isInteger(nSlots) || nSlots < 2) throw new RangeError(`--slots must be an integer >= 2`);

const gpu = await acquireGpu();
const proto = Object.getPrototypeOf(gpu.device) as GPUDevice;
const counts = { groups: 0, bytes: 0 };
const createBindGroup = proto.createBindGroup;
const createBuffer = proto.createBuffer;
proto.createBindGroup = function (this: GPUDevice, d: GPUBindGroupDescriptor) {
  counts.groups++;
  return createBindGroup.call(this, d);
};
proto.createBuffer = function (this: GPUDevice, d: GPUBufferDescriptor) {
  counts.bytes += d.size;
  return createBuffer.call(this, d);
};
const path = args.model ?? new URL("../tests/fixtures/tiny-qwen35moe.q8_0.gguf", import.meta.url).pathname;
using file = await openGguf(path);
const int8Experts = !args["f32-experts"];
const stage = await Stage.load(gpu, file, { nCtx: 4096, nSlots, maxChunk: Number(args.chunk), int8Experts });

async function timed(what: string, builds: (() => Promise<unknown>)[]): Promise<void> {
  counts.groups = counts.bytes = 0;
  const t0 = performance.now();
  for (const b of builds) await b();
  const n = builds.length;
  console.log(JSON.stringify({
    bench: "graph_build",
    what,
    graphs: n,
    msPerGraph: (performance.now() - t0) / n,
    bindGroupsPerGraph: counts.groups / n,
    bufferMiBPerGraph: counts.bytes / n / 2 ** 20,
    layers: stage.hp.nLayer,
    int8Experts,
    adapter: gpu.summary,
  }));
}

const B = Math.min(nSlots - 1, MAX_BATCH_SLOTS);
const set = (from: number) => Array.from({ length: B }, (_, i) => from + i);
// Warm-up: one graph of each kind, its pipelines compiled.
await stage.graph(0, 64, "last");
await stage.graph(0, 1, "last");
await stage.batchGraph(set(0));
const others = Array.from({ length: nSlots - 1 }, (_, i) => i + 1);
await timed("coldSlot", others.map((s) => () => stage.graph(s, 64, "last")));
await timed("newWidth", Array.from({ length: nWidths }, (_, i) => () => stage.graph(0, 65 + i, "last")));
await timed("decode", others.map((s) => () => stage.graph(s, 1, "last")));
await timed("batched", [() => stage.batchGraph(set(1)), () => stage.batchGraph([...set(0)].reverse())]);
stage.destroy();
