/**
 * Benchmark: the driver's compile time of every unique WGSL module that `bench/_shader_dump.ts` collected (for
 * instance from the whole test suite), each at its first dispatch on zeroed buffers, slowest first. On
 * lavapipe LLVM compiles at the first dispatch, and those compiles are most of the test suite's time
 * (docs/PERF.md); run with `MESA_SHADER_CACHE_DISABLE=true`, or Mesa's cache answers what it saw before.
 *
 * Usage:
 * ```
 * SHADER_DUMP_DIR=/tmp/shaders deno test -A --preload bench/_shader_dump.ts
 * MESA_SHADER_CACHE_DISABLE=true deno run -A bench/compile_all.ts /tmp/shaders [--top 40] [--shard 0/2]
 * ```
 * (`--shard i/n`: every n-th module from the i-th, for n processes side by side.)
 * Prints one JSON line per module (ms of the first dispatch, of the pipeline's creation, the label of its first
 * creation and how many creations the index counts), then a total line; never asserts.
 * @module
 */
import { parseArgs } from "node:util";
import { acquireGpu } from "../engine/gpu/device.ts";

const { values: args, positionals } = parseArgs({
  options: { top: { type: "string", default: "1000000" }, shard: { type: "string", default: "0/1" } },
  allowPositionals: true,
});
const dir = positionals[0];
if (!dir) throw new Error("Usage: deno run -A bench/compile_all.ts DUMP_DIR [--top N]");
const gpu = await acquireGpu();
const device = gpu.device;
const buffers = Array.from(
  { length: 16 },
  () => device.createBuffer({ size: 1 << 20, usage: GPUBufferUsage.STORAGE | GPUBufferUsage.UNIFORM }),
);
const index = new Map<string, { label: string; count: number; mains: Set<string> }>();
for (const line of Deno.readTextFileSync(`${dir}/index.jsonl`).split("\n")) {
  if (!line) continue;
  const { label, hash, main } = JSON.parse(line) as { label: string; hash: string; main: string };
  const e = index.get(hash) ?? { label, count: 0, mains: new Set<string>() };
  e.count++;
  e.mains.add(main.replace(/^.*\//, ""));
  index.set(hash, e);
}

/** The bind group of `n` bindings (64 KiB each) when it validates against the auto layout. */
async function group(layout: GPUBindGroupLayout, n: number): Promise<GPUBindGroup | undefined> {
  device.pushErrorScope("validation");
  const g = device.createBindGroup({
    layout,
    entries: buffers.slice(0, n).map((buffer, binding) => ({ binding, resource: { buffer, size: 65536 } })),
  });
  return (await device.popErrorScope()) ? undefined : g;
}

const rows: {
  hash: string;
  label: string;
  count: number;
  mains: string[];
  createMs: number;
  firstMs: number;
}[] = [];
const [shard, shards] = args.shard!.split("/").map(Number) as [number, number];
for (const [k, [hash, e]] of [...index].entries()) {
  if (k % shards !== shard) continue;
  const code = Deno.readTextFileSync(`${dir}/${hash}.wgsl`);
  // every entry point (a module may hold two), each its own pipeline and compile
  for (const [, entryPoint] of code.matchAll(/@compute[\s\S]{0,200}?fn\s+(\w+)/g)) {
    await time(hash, e, code, entryPoint!);
  }
}

async function time(
  hash: string,
  e: { label: string; count: number; mains: Set<string> },
  code: string,
  entryPoint: string,
): Promise<void> {
  const t0 = performance.now();
  const module = device.createShaderModule({ code, label: e.label });
  const pipeline = device.createComputePipeline({ layout: "auto", compute: { module, entryPoint } });
  const createMs = performance.now() - t0;
  const layout = pipeline.getBindGroupLayout(0);
  let g: GPUBindGroup | undefined;
  for (let n = buffers.length; n > 0 && !g; n--) g = await group(layout, n);
  if (!g) {
    console.error(`${e.label} ${entryPoint}: no bind group validates; skipped`);
    return;
  }
  const t1 = performance.now();
  const enc = device.createCommandEncoder();
  const pass = enc.beginComputePass();
  pass.setPipeline(pipeline);
  pass.setBindGroup(0, g);
  pass.dispatchWorkgroups(1, 1, 1);
  pass.end();
  device.queue.submit([enc.finish()]);
  await device.queue.onSubmittedWorkDone();
  const firstMs = performance.now() - t1;
  rows.push({
    hash,
    label: `${e.label} ${entryPoint}`,
    count: e.count,
    mains: [...e.mains],
    createMs,
    firstMs,
  });
}
rows.sort((a, b) => b.firstMs + b.createMs - a.firstMs - a.createMs);
for (const r of rows.slice(0, Number(args.top))) {
  console.log(JSON.stringify({
    bench: "compile_all",
    firstMs: Math.round(r.firstMs),
    createMs: Math.round(r.createMs),
    label: r.label,
    creations: r.count,
    tests: r.mains,
    hash: r.hash,
  }));
}
const sum = (f: (r: (typeof rows)[number]) => number) => Math.round(rows.reduce((s, r) => s + f(r), 0));
console.log(JSON.stringify({
  bench: "compile_all",
  adapter: gpu.summary,
  modules: rows.length,
  totalFirstMs: sum((r) => r.firstMs),
  totalCreateMs: sum((r) => r.createMs),
}));
