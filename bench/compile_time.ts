/**
 * Benchmark: how long a kernel variant's first dispatch takes against a second one, where a driver compiles at
 * first use (lavapipe: LLVM at the first dispatch, most of the test suite's time; docs/PERF.md). Kernels: the
 * chunked DeltaNet prefill's `gdn_chunk_prep` (its forward substitution written out and as loops, COMPACT_SOLVE)
 * and scan, and `gdn_step`, at tiny, real and odd dims. Run with
 * `MESA_SHADER_CACHE_DISABLE=true` on lavapipe, or Mesa's shader cache answers a variant seen before.
 *
 * Usage: `deno run -A bench/compile_time.ts`. Prints one JSON line per variant (ms to create the pipeline, for
 * its first dispatch and for the same dispatch again, on bindings of 16 MiB buffers), never asserts.
 * @module
 */
import { acquireGpu } from "../engine/gpu/device.ts";
import { type KernelSpec, PipelineCache } from "../wgsl/kernel.ts";
import { GDN_STEP, type GdnStepConstants } from "../wgsl/gdn_step.ts";
import { ODD_A, REAL_35, TINY_35 } from "../wgsl/_gdn_testing.ts";
import { GDN_CHUNK, GDN_CHUNK_PREP, gdnChunkScan } from "../wgsl/gdn_chunk.ts";
import { buildInfo } from "../version.ts";

const gpu = await acquireGpu();
const device = gpu.device;
const commit = buildInfo().commit;
const cache = new PipelineCache(device);
const buffers = Array.from(
  { length: 12 },
  () => device.createBuffer({ size: 1 << 24, usage: GPUBufferUsage.STORAGE }),
);

/** A variant's create, first-dispatch and second-dispatch times (ms). */
async function time(spec: KernelSpec, c: Record<string, number | boolean>, grid: [number, number, number]) {
  const t0 = performance.now();
  const pipeline = await cache.get(spec, c);
  const createMs = performance.now() - t0;
  const layout = pipeline.getBindGroupLayout(0);
  const n = await bindingCount(layout);
  const group = device.createBindGroup({
    layout,
    entries: buffers.slice(0, n).map((buffer, binding) => ({ binding, resource: { buffer } })),
  });
  const run = async () => {
    const t = performance.now();
    const enc = device.createCommandEncoder();
    const pass = enc.beginComputePass();
    pass.setPipeline(pipeline);
    pass.setBindGroup(0, group);
    pass.dispatchWorkgroups(...grid);
    pass.end();
    device.queue.submit([enc.finish()]);
    await device.queue.onSubmittedWorkDone();
    return performance.now() - t;
  };
  const firstMs = await run();
  return { createMs, firstMs, againMs: await run() };
}

/** The number of bindings of an auto layout: the largest n whose bind group validates. */
async function bindingCount(layout: GPUBindGroupLayout): Promise<number> {
  for (let n = buffers.length; n > 0; n--) {
    device.pushErrorScope("validation");
    device.createBindGroup({
      layout,
      entries: buffers.slice(0, n).map((buffer, binding) => ({ binding, resource: { buffer } })),
    });
    if (!(await device.popErrorScope())) return n;
  }
  return 0;
}

// The test models' dims: tiny and real qwen35moe, and odd (D_K 256, D_V 16, a 2-slot ring, grouped b/a).
const dims: [string, GdnStepConstants][] = [["tiny", TINY_35.c], ["real", REAL_35.c], ["odd", ODD_A.c]];
const emit = (what: Record<string, unknown>) =>
  console.log(JSON.stringify({ bench: "compile_time", commit, adapter: gpu.summary, ...what }));
for (const [name, c] of dims) {
  for (const compact of [false, true]) {
    const pc = { ...c, COMPACT_SOLVE: compact };
    emit({
      kernel: "gdn_chunk_prep",
      dims: name,
      compact,
      ...(await time(GDN_CHUNK_PREP, pc, [c.N_V, 1, 1])),
    });
  }
  const s = gdnChunkScan(c, { BJ: 16, CJ: 2 });
  const scan = { N_V: c.N_V, D_K: c.D_K, D_V: c.D_V, ...s };
  emit({ kernel: "gdn_chunk", dims: name, ...(await time(GDN_CHUNK, scan, [c.N_V, c.D_V / s.BJ, 1])) });
  for (const split of [1, 4]) {
    if (c.D_V % (16 * split) !== 0) continue;
    const step = { ...c, SPLIT: split };
    emit({ kernel: "gdn_step", dims: name, split, ...(await time(GDN_STEP, step, [c.N_V, split, 1])) });
  }
}
