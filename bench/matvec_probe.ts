/**
 * Diagnostic benchmark: what limits the IQ4_XS mat-vec. One kernel with the production loop shape (a warp per
 * row, lane t takes 8-weight units t, t + 32, ...; wgsl/matvec.wgsl's ROWS = 1 path) whose parts can be taken
 * out one at a time by constant flags, timed on the same bytes beside `stream_read`, plus the number of
 * workgroups resident at once (an atomic counter). Prints one JSON line per case; never asserts.
 *
 * Flags (MODE bits): 1 NOX (x quads from the unit index instead of loads), 2 NOTAB (nibbles to f32 by
 * arithmetic instead of the workgroup codebook), 4 NOHDR (no block head/scale loads), 8 NOMATH (fold the raw
 * word instead of decoding), 16 TAB32 (the codebook as 16 f32 replicated once per bank: lane l reads entry e at
 * e·32 + l, conflict-free). Other knobs: WG (invocations per workgroup), UNROLL (units per loop step),
 * VEC (1: each lane loads two adjacent qs words as one vec2, i.e. 16 weights per unit).
 *
 * Usage: `deno run -A bench/matvec_probe.ts [--quick]`. No npm imports (runs on the lent GPU machine).
 * @module
 */
import { parseArgs } from "node:util";
import { PassTimer } from "./_pass_timer.ts";
import { acquireGpu } from "../engine/gpu/device.ts";
import { PipelineCache } from "../engine/gpu/kernel.ts";
import {
  encodeStreamRead,
  prepareStreamRead,
  STREAM_READ_PARAMS_BYTES,
  type StreamReadOp,
  streamReadParams,
} from "../wgsl/stream_read.ts";

const { values: args } = parseArgs({ options: { quick: { type: "boolean", default: false } } });
const QUICK = args.quick ?? false;

interface Variant {
  mode: number;
  wg: number;
  unroll: number;
  vec: number;
}

const NOX = 1, NOTAB = 2, NOHDR = 4, NOMATH = 8, TAB32 = 16;

function source(v: Variant): string {
  return `
const WG: u32 = ${v.wg}u;
const MODE: u32 = ${v.mode}u;
const UNROLL: u32 = ${v.unroll}u;
const VEC: u32 = ${v.vec}u;
struct Params { k: u32, n: u32, row_bytes: u32, w_off: u32 }
@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var<storage, read> weights: array<u32>;
@group(0) @binding(2) var<storage, read> x: array<vec4<f32>>;
@group(0) @binding(3) var<storage, read_write> y: array<f32>;
@group(0) @binding(4) var<storage, read_write> occ: array<atomic<u32>, 4>;
@group(0) @binding(5) var<storage, read> weights2: array<vec2<u32>>;
var<workgroup> tab: array<vec2<f32>, 256>;
var<workgroup> tab32: array<f32, 512>;
var<private> lane: u32;
var<workgroup> partial: array<f32, WG>;

fn kvalues(nib: vec4<u32>) -> vec4<f32> {
  let b0 = (nib & vec4<u32>(4u)) != vec4<u32>(0u);
  let b1 = nib >= vec4<u32>(8u);
  let lo = select(vec4<u32>(0xBFAD9881u), vec4<u32>(0xF6EADDCFu), b0);
  let hi = select(vec4<u32>(0x26190D01u), vec4<u32>(0x71594535u), b0);
  let word = select(lo, hi, b1);
  let sh = (vec4<u32>(3u) - (nib & vec4<u32>(3u))) * 8u;
  return vec4<f32>(bitcast<vec4<i32>>(word << sh) >> vec4<u32>(24u));
}
fn u8x4(w: u32) -> vec4<f32> {
  let b = vec4<u32>(w, w >> 8u, w >> 16u, w >> 24u) & vec4<u32>(0xFFu);
  return bitcast<vec4<f32>>(b | vec4<u32>(0x4B000000u)) - vec4<f32>(8388608.0);
}
fn decode(w: u32) -> array<vec4<f32>, 2> {
  if ((MODE & ${NOTAB}u) != 0u) {
    return array<vec4<f32>, 2>(u8x4(w & 0x0F0F0F0Fu), u8x4((w >> 4u) & 0x0F0F0F0Fu));
  }
  if ((MODE & ${TAB32}u) != 0u) {
    let lo = (vec4<u32>(w, w >> 8u, w >> 16u, w >> 24u) & vec4<u32>(0xFu)) * 32u + lane;
    let hi = (vec4<u32>(w >> 4u, w >> 12u, w >> 20u, w >> 28u) & vec4<u32>(0xFu)) * 32u + lane;
    return array<vec4<f32>, 2>(
      vec4<f32>(tab32[lo.x], tab32[lo.y], tab32[lo.z], tab32[lo.w]),
      vec4<f32>(tab32[hi.x], tab32[hi.y], tab32[hi.z], tab32[hi.w]),
    );
  }
  let p0 = tab[w & 0xFFu];
  let p1 = tab[(w >> 8u) & 0xFFu];
  let p2 = tab[(w >> 16u) & 0xFFu];
  let p3 = tab[w >> 24u];
  return array<vec4<f32>, 2>(vec4<f32>(p0.x, p1.x, p2.x, p3.x), vec4<f32>(p0.y, p1.y, p2.y, p3.y));
}
fn xq(i: u32, u: u32) -> vec4<f32> {
  if ((MODE & ${NOX}u) != 0u) {
    return vec4<f32>(f32(u & 7u), f32(i & 3u), 0.5, 0.25);
  }
  return x[i];
}
fn scale(blk: u32, ib: u32) -> f32 {
  if ((MODE & ${NOHDR}u) != 0u) {
    return 1.0;
  }
  let head = weights[blk];
  let sl = weights[blk + 1u];
  let d = unpack2x16float(head).x;
  let ls = ((sl >> (4u * ib)) & 0xFu) | (((head >> (16u + 2u * ib)) & 3u) << 4u);
  return d * (f32(ls) - 32.0);
}
// One unit: 8 weights (VEC 0) or 16 (VEC 1: units u are pairs of qs words).
fn unit(rb: u32, u: u32) -> f32 {
  if (VEC == 0u) {
    let c = u >> 2u;
    let j = u & 3u;
    let ib = c & 7u;
    let blk = (rb + 136u * (c >> 3u)) >> 2u;
    let w = weights[blk + 2u + 4u * ib + j];
    let e = (32u * c + 4u * j) >> 2u;
    let xl = xq(e, u);
    let xh = xq(e + 4u, u);
    let s = scale(blk, ib);
    if ((MODE & ${NOMATH}u) != 0u) {
      return bitcast<f32>(w ^ bitcast<u32>(xl.x + xh.y + s));
    }
    let q = decode(w);
    return s * dot(q[0], xl) + s * dot(q[1], xh);
  }
  // 16 weights: qs words 2h, 2h + 1 of sub-block ib (h = u & 1): elements 32ib + 8h .. +7 and +16.
  let c = u >> 1u;
  let h = u & 1u;
  let ib = c & 7u;
  let blk = (rb + 136u * (c >> 3u)) >> 2u;
  let ww = weights2[((blk + 2u + 4u * ib) >> 1u) + h];
  let e = (32u * c + 8u * h) >> 2u;
  let x0 = xq(e, u);
  let x1 = xq(e + 1u, u);
  let x2 = xq(e + 4u, u);
  let x3 = xq(e + 5u, u);
  let s = scale(blk, ib);
  if ((MODE & ${NOMATH}u) != 0u) {
    return bitcast<f32>(ww.x ^ ww.y ^ bitcast<u32>(x0.x + x1.y + x2.z + x3.w + s));
  }
  let qa = decode(ww.x);
  let qb = decode(ww.y);
  return s * (dot(qa[0], x0) + dot(qb[0], x1) + dot(qa[1], x2) + dot(qb[1], x3));
}

@compute @workgroup_size(WG)
fn main(
  @builtin(local_invocation_index) lid: u32,
  @builtin(workgroup_id) wid: vec3<u32>,
  @builtin(num_workgroups) nwg: vec3<u32>,
) {
  let wg = wid.y * nwg.x + wid.x;
  if (lid == 0u && params.w_off == 0xFFFFFFFFu) {
    let c = atomicAdd(&occ[0], 1u);
    atomicMax(&occ[1], c + 1u);
  }
  lane = lid & 31u;
  if ((MODE & ${TAB32}u) != 0u) {
    for (var i = lid; i < 512u; i += WG) {
      tab32[i] = kvalues(vec4<u32>(i >> 5u)).x;
    }
    workgroupBarrier();
  } else if ((MODE & ${NOTAB}u) == 0u) {
    for (var i = lid; i < 256u; i += WG) {
      tab[i] = kvalues(vec4<u32>(i & 15u, i >> 4u, 0u, 0u)).xy;
    }
    workgroupBarrier();
  }
  let team = lid / 32u;
  let t = lid % 32u;
  let row0 = wg * (WG / 32u) + team;
  let row = min(row0, params.n - 1u);
  let rb = (params.w_off & 0x7FFFFFFFu) + row * params.row_bytes;
  let n_units = params.k / select(8u, 16u, VEC == 1u);
  var a = 0.0;
  var u = t;
  if (UNROLL == 2u) {
    for (; u + 32u < n_units; u += 64u) {
      let a0 = unit(rb, u);
      let a1 = unit(rb, u + 32u);
      a += a0 + a1;
    }
  }
  if (UNROLL == 4u) {
    for (; u + 96u < n_units; u += 128u) {
      let a0 = unit(rb, u);
      let a1 = unit(rb, u + 32u);
      let a2 = unit(rb, u + 64u);
      let a3 = unit(rb, u + 96u);
      a += (a0 + a1) + (a2 + a3);
    }
  }
  for (; u < n_units; u += 32u) {
    a += unit(rb, u);
  }
  partial[lid] = a;
  workgroupBarrier();
  if ((t & 7u) == 0u) {
    var s = 0.0;
    for (var e = 0u; e < 8u; e++) {
      s += partial[lid + e];
    }
    partial[lid] = s;
  }
  workgroupBarrier();
  if (t == 0u) {
    let s = partial[lid] + partial[lid + 8u] + partial[lid + 16u] + partial[lid + 24u];
    if (row0 < params.n) {
      y[row] = s;
    }
    if (lid == 0u && params.w_off == 0xFFFFFFFFu) {
      atomicSub(&occ[0], 1u);
    }
  }
}
`;
}

const gpu = await acquireGpu();
const { device } = gpu;
const cache = new PipelineCache(device, { f16: gpu.f16 });
const timer = new PassTimer(device, gpu.timestamps);
const BUF = Math.min(QUICK ? 64 << 20 : 1 << 30, device.limits.maxStorageBufferBindingSize);
const weights = device.createBuffer({ size: BUF, usage: GPUBufferUsage.STORAGE | GPUBufferUsage.COPY_DST });
{
  const chunk = new Uint8Array(16 << 20);
  for (let o = 0; o < chunk.length; o += 65536) crypto.getRandomValues(chunk.subarray(o, o + 65536));
  for (let o = 0; o < BUF; o += chunk.length) {
    device.queue.writeBuffer(weights, o, chunk, 0, Math.min(chunk.length, BUF - o));
  }
}
const xBuf = device.createBuffer({ size: 4 * 8192, usage: GPUBufferUsage.STORAGE | GPUBufferUsage.COPY_DST });
device.queue.writeBuffer(xBuf, 0, new Float32Array(8192).map(() => Math.random() - 0.5));
const yBuf = device.createBuffer({ size: 4 << 20, usage: GPUBufferUsage.STORAGE });
const occ = device.createBuffer({
  size: 16,
  usage: GPUBufferUsage.STORAGE | GPUBufferUsage.COPY_SRC | GPUBufferUsage.COPY_DST,
});
const occRead = device.createBuffer({ size: 16, usage: GPUBufferUsage.COPY_DST | GPUBufferUsage.MAP_READ });
const sink = device.createBuffer({ size: 16, usage: GPUBufferUsage.STORAGE });
const params = device.createBuffer({
  size: 256 * 17,
  usage: GPUBufferUsage.UNIFORM | GPUBufferUsage.COPY_DST,
});

const SHAPES = QUICK ? [{ name: "small", k: 2048, n: 8192 }] : [
  { name: "ffn_up_exps", k: 2048, n: 131072 },
  { name: "ffn_down_exps", k: 512, n: 524288 },
  { name: "output", k: 2048, n: 248320 },
];
const VARIANTS: Variant[] = [];
for (const mode of [0, NOX, NOTAB, NOHDR, NOX | NOTAB, NOX | NOTAB | NOHDR, NOX | NOTAB | NOHDR | NOMATH]) {
  VARIANTS.push({ mode, wg: 256, unroll: 1, vec: 0 });
}
for (const mode of [TAB32, TAB32 | NOX]) VARIANTS.push({ mode, wg: 256, unroll: 1, vec: 0 });
for (const wg of [32, 64, 128]) VARIANTS.push({ mode: 0, wg, unroll: 1, vec: 0 });
for (const unroll of [2, 4]) {
  VARIANTS.push({ mode: 0, wg: 256, unroll, vec: 0 });
  VARIANTS.push({ mode: NOX | NOTAB | NOHDR | NOMATH, wg: 256, unroll, vec: 0 });
}
for (const mode of [0, NOX, NOTAB, NOX | NOTAB | NOHDR | NOMATH]) {
  VARIANTS.push({ mode, wg: 256, unroll: 1, vec: 1 });
}
VARIANTS.push({ mode: 0, wg: 64, unroll: 2, vec: 1 });

const pipes = new Map<string, GPUComputePipeline>();
async function pipeline(v: Variant): Promise<GPUComputePipeline> {
  const key = JSON.stringify(v);
  let p = pipes.get(key);
  if (!p) {
    device.pushErrorScope("validation");
    const module = device.createShaderModule({ code: source(v) });
    p = device.createComputePipeline({ layout: "auto", compute: { module, entryPoint: "main" } });
    const err = await device.popErrorScope();
    if (err) throw new Error(`probe ${key}: ${err.message}`);
    pipes.set(key, p);
  }
  return p;
}

function line(o: Record<string, unknown>): void {
  console.log(JSON.stringify({ bench: "matvec_probe", ...o }));
}
line({ event: "start", summary: gpu.summary });

for (const s of SHAPES) {
  const rowBytes = (s.k / 256) * 136;
  const tBytes = rowBytes * s.n;
  const slot = Math.ceil(tBytes / 256) * 256;
  const copies = Math.max(
    1,
    Math.min(16, Math.floor(BUF / slot), Math.ceil((QUICK ? 32 << 20 : 256 << 20) / slot)),
  );
  const reps = Math.max(copies, Math.ceil((QUICK ? 128 << 20 : 8e9) / tBytes));
  for (let i = 0; i < copies; i++) {
    device.queue.writeBuffer(params, 256 * i, new Uint32Array([s.k, s.n, rowBytes, i * slot]));
  }
  // Occupancy probe: w_off = 0xFFFFFFFF (masked to copy 0's bytes) switches the counters on.
  device.queue.writeBuffer(params, 256 * 16, new Uint32Array([s.k, s.n, rowBytes, 0xFFFFFFFF]));
  const sops: StreamReadOp[] = [];
  for (let i = 0; i < copies; i++) {
    const shape = { offsetBytes: i * slot, sizeBytes: Math.floor(tBytes / 16) * 16 };
    const sp = device.createBuffer({ size: 256, usage: GPUBufferUsage.UNIFORM | GPUBufferUsage.COPY_DST });
    device.queue.writeBuffer(sp, 0, streamReadParams(shape));
    sops.push(
      await prepareStreamRead(cache, {
        device,
        shape,
        bindings: {
          params: { buffer: sp, offset: 0, size: STREAM_READ_PARAMS_BYTES },
          src: weights,
          out: sink,
        },
      }),
    );
  }
  const tStream = await timer.perRep((p, i) => encodeStreamRead(p, sops[i % copies]!), reps, { timed: 3 });
  const ceiling = tBytes / tStream / 1e9;
  line({ kernel: "stream_read", case: s.name, ms: tStream * 1e3, gbps: ceiling });
  for (const v of VARIANTS) {
    const pipe = await pipeline(v);
    const groups: GPUBindGroup[] = [];
    device.pushErrorScope("validation");
    for (let i = 0; i <= 16; i++) {
      groups.push(device.createBindGroup({
        layout: pipe.getBindGroupLayout(0),
        entries: [
          { binding: 0, resource: { buffer: params, offset: 256 * i, size: 16 } },
          { binding: 1, resource: { buffer: weights } },
          { binding: 2, resource: { buffer: xBuf } },
          { binding: 3, resource: { buffer: yBuf } },
          { binding: 4, resource: { buffer: occ } },
          { binding: 5, resource: { buffer: weights } },
        ],
      }));
    }
    const bindErr = await device.popErrorScope();
    if (bindErr) throw new Error(`probe ${JSON.stringify(v)} bind group: ${bindErr.message}`);
    const wgs = Math.ceil(s.n / (v.wg / 32));
    const gx = Math.min(wgs, 65535);
    const gy = Math.ceil(wgs / gx);
    const t = await timer.perRep(
      (p, i) => {
        p.setPipeline(pipe);
        p.setBindGroup(0, groups[i % copies]!);
        p.dispatchWorkgroups(gx, gy);
      },
      reps,
      { timed: 3 },
    );
    // Occupancy: one dispatch with the counters on.
    device.queue.writeBuffer(occ, 0, new Uint32Array(4));
    const enc = device.createCommandEncoder();
    const pass = enc.beginComputePass();
    pass.setPipeline(pipe);
    pass.setBindGroup(0, groups[16]!);
    pass.dispatchWorkgroups(gx, gy);
    pass.end();
    enc.copyBufferToBuffer(occ, 0, occRead, 0, 16);
    device.queue.submit([enc.finish()]);
    await occRead.mapAsync(GPUMapMode.READ);
    const o = new Uint32Array(occRead.getMappedRange().slice(0));
    occRead.unmap();
    const gbps = tBytes / t / 1e9;
    line({
      kernel: "probe",
      case: s.name,
      ...v,
      flags: [["NOX", NOX], ["NOTAB", NOTAB], ["NOHDR", NOHDR], ["NOMATH", NOMATH], ["TAB32", TAB32]]
        .filter(([, b]) => (v.mode & (b as number)) !== 0).map(([n]) => n).join("|") || "-",
      ms: t * 1e3,
      gbps,
      ofCeiling: gbps / ceiling,
      residentWorkgroups: o[1],
      residentWarps: o[1]! * v.wg / 32,
    });
  }
}
device.destroy();
