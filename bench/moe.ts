/**
 * Benchmark: the expert mat-vecs of one decode step (`moe_matvec`: routed gate·up and down of 8 experts plus
 * the shared expert as a 9th column) at 35B-A3B shapes, over full-size IQ4_XS expert tensors, for a sweep of
 * TEAM/ROWS, then the same passes with int8 x (`moe_matvec_q8`: int8 x read, or rounded in the prologue (XIN); the gate·up pass also with QOUT).
 * Each dispatch takes another random expert set (64 sets), so the experts come from memory as in a real step,
 * not from L2. Each line gives the GB/s of the 9 experts' matrices read.
 *
 * `--tokens T` (T > 1) instead times the experts of a batched decode step of T slots (T·8 routed columns, each
 * slot's 8 picks distinct, plus T shared columns; 64 id sets): the default constants beside the variants at
 * the default TEAM (ROWS, BLOCKS, UNROLL, WG: `sameBits` where the sums keep the default's bits, so a batched
 * step may take them alone) and other TEAMs (other bits: the solo step would have to take them too).
 * `gbPerSecond` counts every column's matrices, `distinctGbPerSecond` each distinct expert of the step once
 * (what DRAM must deliver at least); lines with `"ids": "one"` put every routed column on one expert.
 *
 * Usage: `deno run -A bench/moe.ts [--quick] [--tokens 8] [--q8-only]` (`--quick`: 16 experts and few repetitions, for
 * lavapipe; `--tokens` up to MAX_BATCH_SLOTS, 16, without the `sharedOnce` lines above 8: SHARED_T takes <= 8). One JSON line per measurement, never asserts. No npm imports.
 * @module
 */
import { parseArgs } from "node:util";
import { PassTimer } from "./_pass_timer.ts";
import { randomBuffer } from "./_buffers.ts";
import { acquireGpu } from "../engine/gpu/device.ts";
import { bindGroup, PipelineCache } from "../wgsl/kernel.ts";
import { rowBytes } from "../engine/quant/types.ts";
import { MAX_BATCH_SLOTS } from "../engine/exec/activations.ts";
import {
  checkMoeMatvec,
  MOE_MATVEC,
  MOE_MATVEC_BINDINGS,
  type MoeMatvecBindings,
  moeMatvecConstants,
  moeMatvecGrid,
  moeMatvecParams,
  moeMatvecSameBits,
  type MoeMatvecShape,
  type MoeMatvecTuning,
} from "../wgsl/moe_matvec.ts";
import {
  checkMoeMatvecQ8,
  MOE_MATVEC_Q8,
  MOE_MATVEC_Q8_BINDINGS,
  type MoeMatvecQ8Bindings,
  moeMatvecQ8Constants,
  moeMatvecQ8Grid,
  q8ColumnWords,
} from "../wgsl/moe_matvec_q8.ts";

const { values: args } = parseArgs({
  options: {
    quick: { type: "boolean", default: false },
    tokens: { type: "string", default: "1" },
    "q8-only": { type: "boolean", default: false },
  },
});
/** `--q8-only` (with `--tokens`): the int8-x passes alone (moe_matvec_q8, the engine's default for the experts). */
const Q8_ONLY = args["q8-only"] ?? false;
const QUICK = args.quick ?? false;
const TOKENS = Number(args.tokens);
if (!Number.isInteger(TOKENS) || TOKENS < 1 || TOKENS > MAX_BATCH_SLOTS) {
  throw new RangeError(`--tokens ${args.tokens}: give a slot count from 1 to ${MAX_BATCH_SLOTS}`);
}
const N_EXPERT = QUICK ? 16 : 256;
const USED = 8;
const EMBD = 2048;
const FF = 512;
const SETS = 64;
const REPS = QUICK ? 64 : 640;

const gpu = await acquireGpu();
const { device } = gpu;
const cache = new PipelineCache(device, { f16: gpu.f16 });
const STORAGE = GPUBufferUsage.STORAGE | GPUBufferUsage.COPY_DST;

// Gate and up (routed experts, then the shared one at index N_EXPERT) back to back; down likewise.
const guRow = rowBytes("IQ4_XS", EMBD);
const gateBytes = guRow * FF * (N_EXPERT + 1);
const gateUp = randomBuffer(device, 2 * gateBytes);
const down = randomBuffer(device, rowBytes("IQ4_XS", FF) * EMBD * (N_EXPERT + 1));
const ids = device.createBuffer({ size: 256 * SETS, usage: STORAGE });
for (let s = 0; s < SETS; s++) {
  const set = new Set<number>();
  while (set.size < USED) set.add(Math.floor(Math.random() * N_EXPERT));
  device.queue.writeBuffer(ids, 256 * s, Uint32Array.from(set));
}
const x = device.createBuffer({ size: 4 * EMBD * (USED + 1), usage: STORAGE });
device.queue.writeBuffer(x, 0, new Float32Array(EMBD * (USED + 1)).map(() => Math.random() - 0.5));
const y = device.createBuffer({ size: 4 * EMBD * (USED + 1), usage: STORAGE });
// int8 x for moe_matvec_q8 (random int8 values, scales 1.0: timing does not depend on them) and the int8 y
// that QOUT writes.
const xqWords = q8ColumnWords(EMBD) * (USED + 1);
const xqData = new Uint32Array(xqWords).map(() => (Math.random() * 2 ** 32) >>> 0);
for (let col = 0; col <= USED; col++) {
  for (const k of [EMBD, FF]) {
    for (let c = 0; c < k / 32; c++) {
      const at = col * q8ColumnWords(k) + k / 4 + c;
      if (at < xqWords) xqData[at] = 0x3F800000;
    }
  }
}
const xq = device.createBuffer({ size: 4 * xqWords, usage: STORAGE });
device.queue.writeBuffer(xq, 0, xqData);
const yq = device.createBuffer({ size: 4 * q8ColumnWords(FF) * (USED + 1), usage: STORAGE });
const scratch = device.createBuffer({ size: 256, usage: STORAGE });
const timer = new PassTimer(device, gpu.timestamps);

/**
 * Seconds per dispatch of `pipeline` over `grid`, dispatch i binding `groups[i % groups.length]`: REPS
 * dispatches in one timed pass after a warm-up; `batched` (a batched step's passes, several times longer): REPS
 * / 4, and with --quick one pass of one dispatch without a warm-up.
 */
function timeDispatches(
  pipeline: GPUComputePipeline,
  groups: readonly GPUBindGroup[],
  grid: readonly [number, number, number],
  batched = false,
): Promise<number> {
  const encode = (pass: GPUComputePassEncoder, i: number) => {
    pass.setPipeline(pipeline);
    pass.setBindGroup(0, groups[i % groups.length]!);
    pass.dispatchWorkgroups(grid[0], grid[1], grid[2]);
  };
  if (!batched) return timer.perRep(encode, REPS);
  return timer.perRep(encode, QUICK ? 1 : REPS / 4, QUICK ? { warmMs: 0, timed: 1 } : {});
}

const shapes: Record<string, { shape: MoeMatvecShape; weights: GPUBuffer; bytes: number }> = {
  gate_up: {
    shape: {
      type: "IQ4_XS",
      k: EMBD,
      n: FF,
      nExpert: N_EXPERT,
      nCols: USED,
      xDiv: USED,
      offGateBytes: 0,
      offUpBytes: gateBytes,
      gateUp: true,
      sharedCols: 1,
    },
    weights: gateUp,
    bytes: 2 * (USED + 1) * FF * guRow,
  },
  down: {
    shape: {
      type: "IQ4_XS",
      k: FF,
      n: EMBD,
      nExpert: N_EXPERT,
      nCols: USED,
      xDiv: 1,
      offGateBytes: 0,
      gateUp: false,
      sharedCols: 1,
    },
    weights: down,
    bytes: (USED + 1) * EMBD * rowBytes("IQ4_XS", FF),
  },
};

console.log(
  JSON.stringify({ bench: "moe", event: "start", adapter: gpu.summary, experts: N_EXPERT, tokens: TOKENS }),
);
if (TOKENS > 1) {
  await batchedSweep(TOKENS);
  Deno.exit(0);
}
for (const [name, s] of Object.entries(shapes)) {
  const params = device.createBuffer({ size: 64, usage: STORAGE });
  device.queue.writeBuffer(params, 0, moeMatvecParams(s.shape));
  const def = moeMatvecConstants(s.shape);
  for (const team of [8, 16, 32, 64, 128, 256]) {
    for (const rows of [1, 2, 4]) {
      if (team > s.shape.k / 8) continue;
      const c = moeMatvecConstants(s.shape, undefined, { team, rows });
      const pipeline = await cache.get(MOE_MATVEC, c);
      const groups = Array.from({ length: SETS }, (_, set) => {
        const b: MoeMatvecBindings = {
          params,
          ids: { buffer: ids, offset: 256 * set, size: 4 * USED },
          weights: s.weights,
          x,
          y,
          logits: x,
          routeWeights: scratch,
        };
        checkMoeMatvec(s.shape, c, b);
        return bindGroup(device, pipeline, [
          b.params,
          b.ids,
          b.weights,
          b.x,
          b.y,
          b.logits,
          b.routeWeights,
        ]);
      });
      const grid = moeMatvecGrid(s.shape, c);
      const sec = await timeDispatches(pipeline, groups, grid);
      console.log(JSON.stringify({
        bench: "moe",
        pass: name,
        team,
        rows,
        isDefault: team === def.TEAM && rows === def.ROWS,
        workgroups: grid[0] * grid[1],
        us: sec * 1e6,
        gbPerSecond: s.bytes / sec / 1e9,
      }));
    }
  }
  // moe_matvec_q8 over TEAM × ROWS: int8 x read (xq); the gate·up pass also with QOUT (its output rounded to
  // int8 for the down pass) where whole 32-row chunks fit a workgroup; and f32 x rounded in every workgroup's
  // prologue (xin, its log into the xq buffer).
  for (const team of [4, 8, 16, 32, 64]) {
    for (const rows of [1, 2, 4]) {
      for (const mode of s.shape.gateUp ? ["xq", "qout", "xin"] : ["xq", "xin"]) {
        const qout = mode === "qout";
        const xin = mode === "xin";
        if (team > s.shape.k / 32 || (qout && ((256 / team) * rows) % 32 !== 0)) continue;
        const c = moeMatvecQ8Constants(s.shape, qout ? "IQ4_XS" : undefined, { team, rows, xin });
        const pipeline = await cache.get(MOE_MATVEC_Q8, c);
        const groups = Array.from({ length: SETS }, (_, set) => {
          const b: MoeMatvecQ8Bindings = {
            params,
            ids: { buffer: ids, offset: 256 * set, size: 4 * USED },
            weights: s.weights,
            weights2: s.weights,
            xq: xin ? x : xq,
            y,
            yq: qout ? yq : xin ? xq : scratch,
          };
          checkMoeMatvecQ8(s.shape, c, b);
          return bindGroup(device, pipeline, MOE_MATVEC_Q8_BINDINGS.map((n) => b[n]));
        });
        const grid = moeMatvecQ8Grid(s.shape, c);
        const sec = await timeDispatches(pipeline, groups, grid);
        const def = moeMatvecQ8Constants(s.shape, qout ? "IQ4_XS" : undefined);
        console.log(JSON.stringify({
          bench: "moe",
          kernel: "moe_matvec_q8",
          pass: name,
          team,
          rows,
          mode,
          isDefault: team === def.TEAM && rows === def.ROWS,
          workgroups: grid[0] * grid[1],
          us: sec * 1e6,
          gbPerSecond: s.bytes / sec / 1e9,
        }));
      }
    }
  }
}

/**
 * The expert passes of a batched decode step of `tokens` slots: moe_matvec with the default constants, with
 * ROWS × BLOCKS × UNROLL at the default TEAM (the same bits), and with the other TEAMs (other bits).
 */
async function batchedSweep(tokens: number): Promise<void> {
  const cols = USED * tokens + tokens;
  const idStride = Math.ceil((4 * USED * tokens) / 256) * 256;
  const ids = device.createBuffer({ size: idStride * SETS, usage: STORAGE });
  // Each slot picks USED distinct experts; the step's distinct experts (routed, and the shared one) bound what
  // DRAM must deliver.
  let distinct = 0;
  for (let s = 0; s < SETS; s++) {
    const picks: number[] = [];
    for (let t = 0; t < tokens; t++) {
      const set = new Set<number>();
      while (set.size < USED) set.add(Math.floor(Math.random() * N_EXPERT));
      picks.push(...set);
    }
    distinct += (new Set(picks).size + 1) / SETS;
    device.queue.writeBuffer(ids, idStride * s, Uint32Array.from(picks));
  }
  const idsOne = device.createBuffer({ size: 4 * USED * tokens, usage: STORAGE });
  const xb = randomBuffer(device, 4 * Math.max(EMBD * tokens, FF * cols), { f32: true });
  const yb = device.createBuffer({ size: 4 * Math.max(EMBD, FF) * cols, usage: STORAGE });
  const passes = {
    gate_up: { ...shapes.gate_up!, matBytes: 2 * FF * guRow },
    down: { ...shapes.down!, matBytes: EMBD * rowBytes("IQ4_XS", FF) },
  };
  for (const [name, p] of Object.entries(passes)) {
    const shape: MoeMatvecShape = {
      ...p.shape,
      nCols: USED * tokens,
      xDiv: p.shape.gateUp ? USED : 1,
      sharedCols: tokens,
    };
    const params = device.createBuffer({ size: 64, usage: STORAGE });
    device.queue.writeBuffer(params, 0, moeMatvecParams(shape));
    const def = moeMatvecConstants(shape);
    // The default first; at its TEAM every ROWS × BLOCKS × UNROLL × WG (quick: three), then the other TEAMs.
    const tunings: MoeMatvecTuning[] = [{ team: def.TEAM, rows: def.ROWS }];
    const isDef = (t: MoeMatvecTuning) =>
      t.team === def.TEAM && t.rows === def.ROWS && (t.blocks ?? 1) === 1 && (t.unroll ?? 2) === 2 &&
      (t.wg ?? 256) === 256 && !t.sharedOnce;
    if (QUICK) {
      tunings.push({ team: def.TEAM, rows: def.ROWS, blocks: 4, unroll: 4 });
      tunings.push({ team: def.TEAM, rows: def.ROWS, wg: 64 });
      tunings.push({ team: def.TEAM, rows: def.ROWS, sharedOnce: true });
    } else {
      // The shared columns in one workgroup column, each unit decoded once (other bits, sameBits false).
      for (const rows of [1, 2, 4]) {
        tunings.push({ team: def.TEAM, rows, sharedOnce: true });
        tunings.push({ team: def.TEAM, rows, blocks: 4, unroll: 4, sharedOnce: true });
      }
      for (const wg of [256, 128, 64]) {
        for (const rows of [1, 2, 4]) {
          for (const blocks of [1, 2, 4, 8]) {
            for (const unroll of [2, 4]) {
              const t = { team: def.TEAM, rows, blocks, unroll, wg };
              if (def.TEAM <= wg && !isDef(t)) tunings.push(t);
            }
          }
        }
      }
      for (const team of [8, 16, 32, 64, 128].filter((t) => t <= shape.k / 8 && t !== def.TEAM)) {
        for (const rows of [1, 2, 4]) tunings.push({ team, rows });
      }
    }
    // The default and BLOCKS 4 UNROLL 4 also run with every routed column on one expert ("ids": "one"): the
    // weights then come from L2, so the gap to the random sets shows how much of the pass is waiting on DRAM
    // (what grouping the columns by expert could save) and how much is per-workgroup work.
    // SHARED_T takes at most 8 shared columns: above 8 slots a sharedOnce tuning is the default's variant.
    const runs = tunings.filter((t) => !Q8_ONLY && (!t.sharedOnce || tokens <= 8)).flatMap((t) =>
      isDef(t) ||
        (t.team === def.TEAM && t.rows === def.ROWS && t.blocks === 4 && t.unroll === 4 &&
          (t.wg ?? 256) === 256 && !t.sharedOnce)
        ? [{ t, one: false }, { t, one: true }]
        : [{ t, one: false }]
    );
    for (const { t: tuning, one } of runs) {
      const c = moeMatvecConstants(shape, undefined, tuning);
      const pipeline = await cache.get(MOE_MATVEC, c);
      const groups = Array.from({ length: one ? 1 : SETS }, (_, set) => {
        const b: MoeMatvecBindings = {
          params,
          ids: one ? { buffer: idsOne, size: 4 * USED * tokens } : {
            buffer: ids,
            offset: idStride * set,
            size: 4 * USED * tokens,
          },
          weights: p.weights,
          x: xb,
          y: yb,
          logits: xb,
          routeWeights: scratch,
        };
        checkMoeMatvec(shape, c, b);
        return bindGroup(device, pipeline, MOE_MATVEC_BINDINGS.map((n) => b[n]));
      });
      const grid = moeMatvecGrid(shape, c);
      const sec = await timeDispatches(pipeline, groups, grid, true);
      const nDistinct = one ? 2 : distinct;
      console.log(JSON.stringify({
        bench: "moe",
        kernel: "moe_matvec",
        pass: name,
        tokens,
        ids: one ? "one" : "random",
        team: c.TEAM,
        rows: c.ROWS,
        blocks: c.BLOCKS,
        unroll: c.UNROLL,
        wg: c.WG,
        sharedOnce: c.SHARED_T > 0,
        isDefault: isDef(tuning) && !one,
        sameBits: moeMatvecSameBits(c, def),
        workgroups: grid[0] * grid[1],
        us: sec * 1e6,
        gbPerSecond: (cols * p.matBytes) / sec / 1e9,
        distinctGbPerSecond: (nDistinct * p.matBytes) / sec / 1e9,
      }));
    }
    await batchedQ8(name, p, shape, params, ids, idsOne, idStride, distinct, cols, xb, yb);
  }
}

/**
 * The int8-x passes of the same batched step (moe_matvec_q8, the engine's default for the experts): gate·up
 * reading x rounded by moe_route (xq), down rounding f32 x in every workgroup (XIN, its log written), as the
 * engine runs them. At the default TEAM every ROWS (each row's sum keeps its order: `sameBits`, so a batched
 * step may take them alone), then the other TEAMs (other bits); those at the default TEAM also with every
 * routed column on one expert ("ids": "one").
 */
async function batchedQ8(
  name: string,
  p: { weights: GPUBuffer; matBytes: number },
  shape: MoeMatvecShape,
  params: GPUBuffer,
  ids: GPUBuffer,
  idsOne: GPUBuffer,
  idStride: number,
  distinct: number,
  cols: number,
  xb: GPUBuffer,
  yb: GPUBuffer,
): Promise<void> {
  const tokens = shape.sharedCols!;
  const xin = !shape.gateUp;
  // x rounded to int8: one column per slot (gate·up), or the down pass's log of its f32 x per column.
  const xq = randomBuffer(device, 4 * q8ColumnWords(shape.k) * (xin ? cols : tokens));
  const def = moeMatvecQ8Constants(shape, undefined, { xin });
  const tunings: { team: number; rows: number }[] = [];
  for (const rows of [1, 2, 4]) tunings.push({ team: def.TEAM, rows });
  if (!QUICK) {
    for (const team of [4, 8, 16, 32, 64].filter((t) => t !== def.TEAM && t <= shape.k / 32)) {
      for (const rows of [1, 2, 4]) tunings.push({ team, rows });
    }
  }
  for (const t of tunings) {
    const c = moeMatvecQ8Constants(shape, undefined, { ...t, xin });
    const pipeline = await cache.get(MOE_MATVEC_Q8, c);
    for (const one of t.team === def.TEAM ? [false, true] : [false]) {
      const groups = Array.from({ length: one ? 1 : SETS }, (_, set) => {
        const b: MoeMatvecQ8Bindings = {
          params,
          ids: one
            ? { buffer: idsOne, size: 4 * USED * tokens }
            : { buffer: ids, offset: idStride * set, size: 4 * USED * tokens },
          weights: p.weights,
          weights2: p.weights,
          xq: xin ? xb : xq,
          y: yb,
          yq: xin ? xq : scratch,
        };
        checkMoeMatvecQ8(shape, c, b);
        return bindGroup(device, pipeline, MOE_MATVEC_Q8_BINDINGS.map((n) => b[n]));
      });
      const grid = moeMatvecQ8Grid(shape, c);
      const sec = await timeDispatches(pipeline, groups, grid, true);
      console.log(JSON.stringify({
        bench: "moe",
        kernel: "moe_matvec_q8",
        pass: name,
        tokens,
        mode: xin ? "xin" : "xq",
        ids: one ? "one" : "random",
        team: c.TEAM,
        rows: c.ROWS,
        isDefault: c.TEAM === def.TEAM && c.ROWS === def.ROWS && !one,
        sameBits: c.TEAM === def.TEAM,
        workgroups: grid[0] * grid[1],
        us: sec * 1e6,
        gbPerSecond: (cols * p.matBytes) / sec / 1e9,
        distinctGbPerSecond: ((one ? 2 : distinct) * p.matBytes) / sec / 1e9,
      }));
    }
  }
}
