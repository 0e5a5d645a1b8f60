/**
 * Benchmark: the expert passes of one MoE layer over a prefill chunk at 35B-A3B shapes (full-size IQ4_XS expert
 * tensors, 8 of 256 experts per token plus the shared one), per-column `moe_matvec` (the default) beside the
 * grouped path (`moe_group`, then `moe_matmul` for gate·up and for down: StageOptions.groupedExperts), in
 * the same run, the grouped passes also at every token-tile width (`tileUs`: TT 16 / 32 / 64; the engine's
 * choice is `tt`), and the grouped mat-vecs over the same lists (`moe_gmv`: `gmvUs` with the default
 * constants, `gmvSweep` over TEAM × ROWS × CT). Routing is uniform at random over the experts, each token's 8
 * distinct.
 *
 * Usage: `deno run -A bench/moe_prefill.ts [--tokens 256,1024] [--quick]` (`--quick`: 16 experts and 32
 * tokens, for lavapipe; `--probe`: also time variants of the grouped kernel's source with parts switched off
 * at run time, to see which part costs the time). One JSON line per measurement (µs per pass and per layer),
 * never asserts. No npm imports.
 * @module
 */
import { parseArgs } from "node:util";
import { PassTimer } from "./_pass_timer.ts";
import { randomBuffer } from "./_buffers.ts";
import { acquireGpu } from "../engine/gpu/device.ts";
import { bindGroup, PipelineCache } from "../wgsl/kernel.ts";
import { rowBytes } from "../engine/quant/types.ts";
import {
  checkMoeMatvec,
  MOE_MATVEC,
  MOE_MATVEC_BINDINGS,
  moeMatvecConstants,
  moeMatvecGrid,
  moeMatvecParams,
  type MoeMatvecShape,
} from "../wgsl/moe_matvec.ts";
import {
  encodeGroupedMatmul,
  GROUPED_MATMUL_PARAMS_BYTES,
  GROUPED_MATMUL_TILE_TOKENS,
  type GroupedMatmulBindings,
  groupedMatmulConstants,
  type GroupedMatmulOp,
  groupedMatmulParams,
  type GroupedMatmulShape,
  MOE_MATMUL,
  prepareGroupedMatmul,
} from "../wgsl/moe_matmul.ts";
import {
  checkMoeGroup,
  MOE_GROUP,
  moeGroupGrid,
  moeGroupParams,
  type MoeGroupShape,
  moeGroupWords,
} from "../wgsl/moe_group.ts";
import {
  type GroupedMatvecConstants,
  groupedMatvecConstants,
  prepareGroupedMatvec,
} from "../wgsl/moe_gmv.ts";

const { values: args } = parseArgs({
  options: {
    tokens: { type: "string" },
    quick: { type: "boolean", default: false },
    probe: { type: "boolean", default: false },
  },
});
const QUICK = args.quick ?? false;
const N_EXPERT = QUICK ? 16 : 256;
const USED = 8;
const EMBD = 2048;
const FF = 512;
const TOKENS = (args.tokens ?? (QUICK ? "32" : "256,1024")).split(",").map(Number);
const REPS = QUICK ? 1 : 8;

const gpu = await acquireGpu();
const { device } = gpu;
const cache = new PipelineCache(device, { f16: gpu.f16 });
const STORAGE = GPUBufferUsage.STORAGE | GPUBufferUsage.COPY_DST;
const timer = new PassTimer(device, gpu.timestamps);

// Gate and up (the routed experts, then the shared one at index N_EXPERT) back to back; down likewise.
const guRow = rowBytes("IQ4_XS", EMBD);
const dnRow = rowBytes("IQ4_XS", FF);
const gateBytes = guRow * FF * (N_EXPERT + 1);
const gateUp = randomBuffer(device, 2 * gateBytes);
const down = randomBuffer(device, dnRow * EMBD * (N_EXPERT + 1));

console.log(
  JSON.stringify({ bench: "moe_prefill", event: "start", adapter: gpu.summary, experts: N_EXPERT }),
);
for (const T of TOKENS) {
  const nRouted = USED * T;
  const cols = nRouted + T;
  const ids = new Uint32Array(nRouted);
  for (let t = 0; t < T; t++) {
    const set = new Set<number>();
    while (set.size < USED) set.add(Math.floor(Math.random() * N_EXPERT));
    ids.set([...set], t * USED);
  }
  const idsBuf = device.createBuffer({ size: 4 * nRouted, usage: STORAGE });
  device.queue.writeBuffer(idsBuf, 0, ids);
  const x = randomBuffer(device, 4 * EMBD * T, { f32: true });
  const act = randomBuffer(device, 4 * FF * cols, { f32: true });
  const out = device.createBuffer({ size: 4 * EMBD * cols, usage: STORAGE });
  const scratch = device.createBuffer({ size: 256, usage: STORAGE });

  // Per-column moe_matvec with the prefill constants, as the stage runs it.
  const perColumn = async (shape: MoeMatvecShape, weights: GPUBuffer, xb: GPUBuffer, y: GPUBuffer) => {
    const params = device.createBuffer({ size: 64, usage: STORAGE });
    device.queue.writeBuffer(params, 0, moeMatvecParams(shape));
    const c = moeMatvecConstants(shape, undefined, undefined, true);
    const b = { params, ids: idsBuf, weights, x: xb, y, logits: xb, routeWeights: scratch };
    checkMoeMatvec(shape, c, b);
    const pipeline = await cache.get(MOE_MATVEC, c);
    const group = bindGroup(device, pipeline, MOE_MATVEC_BINDINGS.map((n) => b[n]));
    const grid = moeMatvecGrid(shape, c);
    return (pass: GPUComputePassEncoder) => {
      pass.setPipeline(pipeline);
      pass.setBindGroup(0, group);
      pass.dispatchWorkgroups(grid[0], grid[1], grid[2]);
    };
  };
  const common = {
    type: "IQ4_XS" as const,
    nExpert: N_EXPERT,
    nCols: nRouted,
    sharedCols: T,
    offGateBytes: 0,
  };
  const guCol = await perColumn(
    { ...common, k: EMBD, n: FF, xDiv: USED, offUpBytes: gateBytes, gateUp: true },
    gateUp,
    x,
    act,
  );
  const dnCol = await perColumn({ ...common, k: FF, n: EMBD, xDiv: 1, gateUp: false }, down, act, out);

  // Grouped: moe_group, then the two grouped matmuls.
  const gShape: MoeGroupShape = { nRouted, nTokens: T, nExpert: N_EXPERT, shared: true };
  const groups = device.createBuffer({ size: 4 * moeGroupWords(gShape), usage: STORAGE });
  const gParams = device.createBuffer({ size: 32, usage: STORAGE });
  device.queue.writeBuffer(gParams, 0, moeGroupParams(gShape));
  checkMoeGroup(gShape, { params: gParams, ids: idsBuf, groups });
  const groupPipeline = await cache.get(MOE_GROUP, {});
  const groupBind = bindGroup(device, groupPipeline, [gParams, idsBuf, groups]);
  const grouped = async (shape: GroupedMatmulShape, weights: GPUBuffer, xb: GPUBuffer, y: GPUBuffer) => {
    const params = device.createBuffer({
      size: GROUPED_MATMUL_PARAMS_BYTES,
      usage: GPUBufferUsage.UNIFORM | GPUBufferUsage.COPY_DST,
    });
    device.queue.writeBuffer(params, 0, groupedMatmulParams(shape));
    const bindings = { params, weights, x: xb, y, groups };
    probeInputs.push({ shape, bindings });
    const ops: Record<number, GroupedMatmulOp> = {};
    for (const TT of GROUPED_MATMUL_TILE_TOKENS) {
      const constants = { ...groupedMatmulConstants(shape), TT };
      ops[TT] = await prepareGroupedMatmul(cache, { device, shape, bindings, constants });
    }
    tileOps.push(ops);
    const d = groupedMatvecConstants(shape);
    const gmv: { c: GroupedMatvecConstants; op: GroupedMatmulOp }[] = [];
    for (const TEAM of [16, 32, 64]) {
      for (const ROWS of [1, 2, 4]) {
        for (const CT of [4, 8]) {
          const c = { ...d, TEAM, ROWS, CT };
          gmv.push({ c, op: await prepareGroupedMatvec(cache, { device, shape, bindings, constants: c }) });
        }
      }
    }
    gmvOps.push({ d: await prepareGroupedMatvec(cache, { device, shape, bindings }), sweep: gmv });
    return await prepareGroupedMatmul(cache, { device, shape, bindings });
  };
  const tileOps: Record<number, GroupedMatmulOp>[] = [];
  const gmvOps: { d: GroupedMatmulOp; sweep: { c: GroupedMatvecConstants; op: GroupedMatmulOp }[] }[] = [];
  const probeInputs: { shape: GroupedMatmulShape; bindings: GroupedMatmulBindings }[] = [];
  const gcommon = {
    type: "IQ4_XS" as const,
    nGroups: N_EXPERT + 1,
    shared: true,
    cap: T,
    nRouted,
    wOffsetBytes: 0,
  };
  const guOp: GroupedMatmulOp = await grouped(
    {
      ...gcommon,
      k: EMBD,
      n: FF,
      xDiv: USED,
      sharedX0: 0,
      upOffsetBytes: gateBytes,
      expertBytes: guRow * FF,
      xStride: EMBD,
      yStride: FF,
    },
    gateUp,
    x,
    act,
  );
  const dnOp: GroupedMatmulOp = await grouped(
    {
      ...gcommon,
      k: FF,
      n: EMBD,
      xDiv: 1,
      sharedX0: nRouted,
      expertBytes: dnRow * EMBD,
      xStride: FF,
      yStride: EMBD,
    },
    down,
    act,
    out,
  );
  const group = (pass: GPUComputePassEncoder) => {
    pass.setPipeline(groupPipeline);
    pass.setBindGroup(0, groupBind);
    pass.dispatchWorkgroups(...moeGroupGrid(gShape));
  };

  const us = async (encode: (pass: GPUComputePassEncoder) => void) =>
    1e6 * await timer.perRep((pass) => encode(pass), REPS, { timed: QUICK ? 1 : 3 });
  const r = {
    perColumnGateUp: await us(guCol),
    perColumnDown: await us(dnCol),
    group: await us(group),
    groupedGateUp: await us((p) => encodeGroupedMatmul(p, guOp)),
    groupedDown: await us((p) => encodeGroupedMatmul(p, dnOp)),
  };
  const tileUs: Record<number, { gateUp: number; down: number }> = {};
  for (const TT of GROUPED_MATMUL_TILE_TOKENS) {
    tileUs[TT] = {
      gateUp: await us((p) => encodeGroupedMatmul(p, tileOps[0]![TT]!)),
      down: await us((p) => encodeGroupedMatmul(p, tileOps[1]![TT]!)),
    };
  }
  const gmvUs = {
    gateUp: await us((p) => encodeGroupedMatmul(p, gmvOps[0]!.d)),
    down: await us((p) => encodeGroupedMatmul(p, gmvOps[1]!.d)),
  };
  const gmvSweep: Record<string, number | string>[] = [];
  for (const [i, { c }] of gmvOps[0]!.sweep.entries()) {
    gmvSweep.push({
      variant: `T${c.TEAM} R${c.ROWS} C${c.CT}`,
      gateUp: await us((p) => encodeGroupedMatmul(p, gmvOps[0]!.sweep[i]!.op)),
      down: await us((p) => encodeGroupedMatmul(p, gmvOps[1]!.sweep[i]!.op)),
    });
  }
  if (args.probe) await probe(T, probeInputs, us);
  const columnSum = r.perColumnGateUp + r.perColumnDown;
  const groupedSum = r.group + r.groupedGateUp + r.groupedDown;
  console.log(JSON.stringify({
    bench: "moe_prefill",
    tokens: T,
    experts: N_EXPERT,
    us: r,
    tt: groupedMatmulConstants(probeInputs[0]!.shape).TT,
    tileUs,
    perColumnUs: columnSum,
    groupedUs: groupedSum,
    speedup: columnSum / groupedSum,
    gmv: groupedMatvecConstants(probeInputs[0]!.shape),
    gmvUs,
    gmvSumUs: r.group + gmvUs.gateUp + gmvUs.down,
    gmvSweep,
  }));
  for (const b of [idsBuf, x, act, out, scratch, groups, gParams]) b.destroy();
}

/**
 * `--probe`: the grouped passes built from variants of moe_matmul.wgsl's source, each with one part switched
 * off behind a run-time condition that never holds (params.pad0 is 0), so the compiler keeps the rest:
 * no_updates (the rank-1 updates), no_staging (decoding and the workgroup-memory writes), same_step (every
 * step loads step 0's weights again: cache-hot), and the UNITS 4 variant (twice the workgroup memory).
 */
async function probe(
  T: number,
  inputs: { shape: GroupedMatmulShape; bindings: GroupedMatmulBindings }[],
  us: (encode: (pass: GPUComputePassEncoder) => void) => Promise<number>,
) {
  const base = await Deno.readTextFile(MOE_MATMUL.url);
  const edit = (from: string, to: string) => {
    if (!base.includes(from)) throw new Error(`probe: the kernel no longer contains ${JSON.stringify(from)}`);
    return base.replace(from, to);
  };
  const variants: Record<string, string> = {
    base,
    no_updates: edit("kk < select(0u, KK, busy)", "kk < select(0u, KK, busy && params.pad0 == 7u)"),
    no_staging: edit("    stage_units(lid, s, f);", "    if (params.pad0 == 7u) { stage_units(lid, s, f); }"),
    same_step: edit("    f = fetch(rb, sn);", "    f = fetch(rb, select(sn, 0u, params.pad0 == 0u));"),
  };
  for (const [pass, { shape, bindings }] of ["gate_up", "down"].map((p, i) => [p, inputs[i]!] as const)) {
    const out: Record<string, number> = {};
    for (const [name, code] of [...Object.entries(variants), ["units4", base] as const]) {
      const file = await Deno.makeTempFile({ suffix: ".wgsl" });
      await Deno.writeTextFile(file, code);
      const spec = { ...MOE_MATMUL, name: `moe_matmul_${name}`, url: new URL(`file://${file}`) };
      const c0 = groupedMatmulConstants(shape);
      const c = name === "units4" ? { ...c0, UNITS: 4 } : c0;
      const pipeline = await cache.get(spec, c);
      const b = bindings;
      const bg = bindGroup(device, pipeline, [b.params, b.weights, b.x, b.y, b.groups]);
      const op = {
        pipeline,
        bindGroup: bg,
        grid: (await prepareGroupedMatmul(cache, { device, shape, bindings })).grid,
      };
      out[name] = await us((p) => encodeGroupedMatmul(p, op));
    }
    console.log(JSON.stringify({ bench: "moe_prefill", probe: pass, tokens: T, us: out }));
  }
}
