/**
 * Benchmark: the gated DeltaNet decode kernel `gdn_step` at qwen35moe dims (N_K=16, N_V=32, D_K=D_V=128,
 * K_CONV=4, κ tiled) for one token in each of 1 and 8 columns (a solo and an 8-slot batched decode step, each
 * column on its own slot of pooled state buffers, at its own position), beside the kernel before its
 * named-register rewrite (`bench/_gdn_step_v1.wgsl`, "v1": state, conv taps and window, q and k in
 * function-scope arrays indexed by loop counters). µs per dispatch of `gdn_step` alone (with SPLIT > 1 the
 * engine's `gdn_chunk_norm` follows it; it is the same for both and not timed), and each line's max |difference|
 * from v1's y, state and conv ring after one dispatch from the same inputs.
 *
 * Usage: `deno run -A bench/gdn_step.ts [--cols 1,8] [--split 4] [--reps 50] [--quick]` (`--split`: SPLIT
 * values, the engine's is 4 at D_V=128; `--quick`: 2 repetitions, for a check on lavapipe).
 * Timestamp queries around one compute pass of `reps` dispatches when the adapter has them, else wall clock;
 * the best of 5 such passes after warm-up ones. Prints one JSON line per measurement, never asserts.
 * @module
 */
import { parseArgs } from "node:util";
import { PassTimer } from "./_pass_timer.ts";
import { acquireGpu } from "../engine/gpu/device.ts";
import { bindGroup, type KernelSpec, PipelineCache, variantKey } from "../wgsl/kernel.ts";
import {
  GDN_ONE_COLUMN,
  GDN_STEP,
  GDN_STEP_BINDINGS,
  gdnDims,
  type GdnStepBindings,
  type GdnStepConstants,
  gdnStepGrid,
} from "../wgsl/gdn_step.ts";
import { buildInfo } from "../version.ts";

const { values: args } = parseArgs({
  options: {
    cols: { type: "string", default: "1,8" },
    split: { type: "string", default: "4" },
    reps: { type: "string", default: "50" },
    quick: { type: "boolean", default: false },
  },
});
const colsList = args.cols!.split(",").map(Number);
const splits = args.split!.split(",").map(Number);
const reps = args.quick ? 2 : Number(args.reps);

const gpu = await acquireGpu();
const device = gpu.device;
const cache = new PipelineCache(device);
const commit = buildInfo().commit;

function line(o: Record<string, unknown>): void {
  console.log(JSON.stringify({ bench: "gdn_step", commit, adapter: gpu.summary, ...o }));
}

/** The decode kernel before the named-register rewrite, its header as it was. */
const GDN_STEP_V1: KernelSpec = {
  ...GDN_STEP,
  name: "gdn_step_v1",
  url: new URL("./_gdn_step_v1.wgsl", import.meta.url),
};

/** Words rounded up to a 256-byte stride, as the engine pads batched columns and pooled slots. */
function pad64(words: number): number {
  return Math.ceil(words / 64) * 64;
}

// qwen35moe's layer: b and a from separate buffers (A_OFF 0); a batched step's params table has 64 words per
// column as the engine's (BATCH_TABLE_WORDS).
const base: GdnStepConstants = {
  N_K: 16,
  N_V: 32,
  D_K: 128,
  D_V: 128,
  K_CONV: 4,
  EPS: 1e-6,
  KAPPA_TILED: true,
  BA_GROUPED: false,
  A_OFF: 0,
  SPLIT: 1,
  ...GDN_ONE_COLUMN,
};
const d = gdnDims(base);
const maxCols = Math.max(...colsList);
const P_COL = 64;
const BA_COL = pad64(base.N_V);
const RING_COL = pad64(d.convRing);
const STATE_COL = pad64(d.state);
line({ event: "start", summary: gpu.summary, timestamps: gpu.timestamps, constants: base, reps });

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
// One pool slot per column; slot s holds a random ring and a small random state (|S| ~ 0.01 as after many
// decayed tokens).
const ring0 = buf(RING_COL * maxCols, rnd);
const state0 = buf(STATE_COL * maxCols, () => 0.01 * rnd());
const bufs = {
  xQkv: buf(d.convCh * maxCols, rnd),
  z: buf(d.inner * maxCols, rnd),
  b: buf(BA_COL * maxCols, rnd),
  a: buf(BA_COL * maxCols, rnd),
  convW: buf(base.K_CONV * d.convCh, rnd),
  dtBias: buf(base.N_V, rnd),
  ssmA: buf(base.N_V, () => -0.3),
  normW: buf(base.D_V, () => 1),
  convRing: buf(RING_COL * maxCols),
  state: buf(STATE_COL * maxCols),
  y: buf(d.inner * maxCols),
};

const timer = new PassTimer(device, gpu.timestamps);
const us = (s: number) => Math.round(s * 1e7) / 10;

/** Largest |a[i] − b[i]| (NaN when either holds a NaN). */
function maxDiff(a: Float32Array, b: Float32Array): number {
  let m = 0;
  for (let i = 0; i < a.length; i++) {
    const e = Math.abs(a[i]! - b[i]!);
    if (!(e <= m)) m = e;
  }
  return m;
}

/** One dispatch from the initial ring and state (y cleared to NaN first); reads back y, state and ring. */
async function runOnce(
  encode: (pass: GPUComputePassEncoder) => void,
  cols: number,
): Promise<{ y: Float32Array; state: Float32Array; ring: Float32Array }> {
  const yB = d.inner * cols * 4;
  const sB = STATE_COL * cols * 4;
  const rB = RING_COL * cols * 4;
  const read = device.createBuffer({
    size: yB + sB + rB,
    usage: GPUBufferUsage.MAP_READ | GPUBufferUsage.COPY_DST,
  });
  device.queue.writeBuffer(bufs.y, 0, new Float32Array(d.inner * cols).fill(NaN));
  const e = device.createCommandEncoder();
  e.copyBufferToBuffer(state0, 0, bufs.state, 0, sB);
  e.copyBufferToBuffer(ring0, 0, bufs.convRing, 0, rB);
  const p = e.beginComputePass();
  encode(p);
  p.end();
  e.copyBufferToBuffer(bufs.y, 0, read, 0, yB);
  e.copyBufferToBuffer(bufs.state, 0, read, yB, sB);
  e.copyBufferToBuffer(bufs.convRing, 0, read, yB + sB, rB);
  device.queue.submit([e.finish()]);
  await read.mapAsync(GPUMapMode.READ);
  const all = new Float32Array(read.getMappedRange().slice(0));
  read.unmap();
  read.destroy();
  const y = all.subarray(0, yB / 4);
  return { y, state: all.subarray(yB / 4, (yB + sB) / 4), ring: all.subarray((yB + sB) / 4) };
}

for (const split of splits) {
  for (const cols of colsList) {
    // One column: its own params [pos0, n] and slot 0's state. Several: the table [pos0, n, slot] per 64
    // words, column c on slot c at position 1000 + 37·c (every ring phase), strides of the pooled buffers.
    const c: GdnStepConstants = cols === 1
      ? { ...base, SPLIT: split }
      : { ...base, SPLIT: split, P_COL, X_COL: d.convCh, Z_COL: d.inner, BA_COL, RING_COL, STATE_COL };
    const table = new Uint32Array(cols === 1 ? 2 : P_COL * cols);
    if (cols === 1) table.set([1000, 1]);
    for (let col = 0; cols > 1 && col < cols; col++) table.set([1000 + 37 * col, 1, col], col * P_COL);
    const params = buf(table.length);
    device.queue.writeBuffer(params, 0, table);
    const bindings: GdnStepBindings = { ...bufs, params };
    let ref: { y: Float32Array; state: Float32Array; ring: Float32Array } | undefined;
    let v1Us = 0;
    for (const [variant, spec] of [["v1", GDN_STEP_V1], ["engine", GDN_STEP]] as const) {
      const pipe = await cache.get(spec, c);
      const group = bindGroup(device, pipe, GDN_STEP_BINDINGS.map((k) => bindings[k]));
      const one = (pass: GPUComputePassEncoder) => {
        pass.setPipeline(pipe);
        pass.setBindGroup(0, group);
        pass.dispatchWorkgroups(...gdnStepGrid(c, cols));
      };
      const got = await runOnce(one, cols);
      ref ??= got;
      const t = await timer.perRep(one, reps, { timed: 5 });
      if (variant === "v1") v1Us = t;
      line({
        what: "gdn_step",
        variant,
        key: variantKey(spec, c),
        cols,
        split,
        grid: gdnStepGrid(c, cols),
        us: us(t),
        speedupVsV1: Math.round(v1Us / t * 100) / 100,
        maxDiffY: maxDiff(got.y, ref.y),
        maxDiffState: maxDiff(got.state, ref.state),
        maxDiffRing: maxDiff(got.ring, ref.ring),
      });
    }
    params.destroy();
  }
}
Object.values(bufs).forEach((b) => b.destroy());
ring0.destroy();
state0.destroy();
