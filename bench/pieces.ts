/**
 * Benchmark: the time of one prompt piece by width, first run against warm runs, as the serving pacer sees
 * it (#20's late prompt). For each width W (`--widths`), on slot 0 after `--depth` tokens already prefilled:
 * a piece of W tokens with no readback (`rows: "none"`, a round's piece) run for the first time, then
 * `--reps` more (median), then a rest of W tokens that returns its last row's id (`rows: "last"`, a request
 * joining the streams), first and warm. A first run holds the graph build and any pipeline compiled for a
 * new width: a pacer that measures it takes the width for slower than it is, and the streams wait for it.
 * Prints one JSON line per width (never asserts).
 *
 * Usage: `deno run -A bench/pieces.ts [--model F.gguf] [--widths 128,256,384,512,768,1024] [--depth 1024]
 * [--reps 3] [--f32-experts]` (the model defaults to the 35B-A3B-shaped file bench/decode.ts writes).
 * @module
 */
import { parseArgs } from "node:util";
import { acquireGpu } from "../engine/gpu/device.ts";
import { openGguf } from "../engine/gguf.ts";
import { Stage } from "../engine/exec/stage.ts";
import { buildInfo } from "../version.ts";

const { values: args } = parseArgs({
  options: {
    model: { type: "string", default: "/tmp/bench-35b-a3b-iq4_xs.gguf" },
    widths: { type: "string", default: "128,256,384,512,768,1024" },
    depth: { type: "string", default: "1024" },
    reps: { type: "string", default: "3" },
    "f32-experts": { type: "boolean", default: false },
  },
});
const widths = args.widths!.split(",").map(Number);
const depth = Number(args.depth);
const reps = Number(args.reps);
if (widths.some((w) => !Number.isInteger(w) || w < 1) || !(depth >= 0) || !(reps >= 1)) {
  throw new RangeError(
    `--widths ${args.widths}, --depth ${args.depth}, --reps ${args.reps}: positive integers`,
  );
}
const gpu = await acquireGpu();
const commit = buildInfo().commit;
const emit = (o: Record<string, unknown>) =>
  console.log(JSON.stringify({ bench: "pieces", commit, adapter: gpu.summary, ...o }));
using file = await openGguf(args.model!);
const maxW = Math.max(...widths);
const stage = await Stage.load(gpu, file, {
  nCtx: depth + maxW + 8,
  nSlots: 1,
  maxChunk: Math.max(maxW, 256),
  int8Experts: !args["f32-experts"],
});
const tokens = (n: number, seed: number) =>
  Array.from({ length: n }, (_, i) => (i * 7919 + seed * 104729) % (stage.hp.nVocab - 10) + 10);
// The depth once, kept as a snapshot that every piece starts from (restored outside the timed run).
if (depth > 0) {
  await stage.run(0, { tokens: tokens(depth, 1) }, 0, {
    rows: "none",
    chunk: Math.min(depth, stage.maxChunk),
  });
}
const snap = depth > 0 ? stage.snapshot(0) : undefined;
const ms = async (w: number, rows: "none" | "last", seed: number) => {
  if (snap === undefined) stage.reset(0);
  else stage.restore(snap, 0);
  await gpu.device.queue.onSubmittedWorkDone();
  const t0 = performance.now();
  await stage.run(0, { tokens: tokens(w, seed) }, depth, { rows, chunk: w, ids: rows === "last" });
  // No rows: the run returns once submitted; the piece ends when the GPU does.
  await gpu.device.queue.onSubmittedWorkDone();
  return performance.now() - t0;
};
const median = (xs: number[]) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)]!;
for (const w of widths) {
  const firstNone = await ms(w, "none", 2);
  const none: number[] = [];
  for (let i = 0; i < reps; i++) none.push(await ms(w, "none", 3 + i));
  const firstLast = await ms(w, "last", 10);
  const last: number[] = [];
  for (let i = 0; i < reps; i++) last.push(await ms(w, "last", 11 + i));
  const warm = median(none);
  emit({
    width: w,
    depth,
    int8Experts: !args["f32-experts"],
    firstMs: firstNone,
    warmMs: warm,
    tokPerSecond: w / warm * 1000,
    joinFirstMs: firstLast,
    joinWarmMs: median(last),
    runsMs: none,
  });
}
