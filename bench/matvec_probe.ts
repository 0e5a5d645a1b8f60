/**
 * Diagnostic benchmark: what limits the IQ4_XS mat-vec. One kernel with the production loop shape (a warp per
 * row, lane t takes 8-weight units t, t + 32, ...; wgsl/matvec.wgsl's ROWS = 1 path) whose parts can be taken
 * out one at a time by constant flags, timed on the same bytes beside `stream_read`, plus the number of
 * workgroups resident at once (an atomic counter). Prints one JSON line per case; never asserts.
 *
 * Round 2 (this version): R rows per warp share each x quad (code generated per variant, no arrays), vec2 qs loads
 * (VEC 1: 16 weights per unit), unroll; with `--quick` (lavapipe) the value-computing modes are checked against a
 * float64 reference (maxRelErr). Round 1 (commit 11b351a) took the parts out of the ROWS = 1 loop one by one.
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
import { dequantize, randomBlocks } from "../engine/quant/mod.ts";
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
  rows: number;
}

const NOX = 1, NOTAB = 2, NOHDR = 4, NOMATH = 8, TAB32 = 16;

/** `f(i)` for i < n, joined by newlines (the generated code is unrolled over rows and units). */
function each(n: number, f: (i: number) => string): string {
  return Array.from({ length: n }, (_, i) => f(i)).join("\n");
}

/** wgsl/lib/common.wgsl (the codebook arithmetic and the byte-to-f32 trick), included in every variant. */
const COMMON = await Deno.readTextFile(new URL("../wgsl/lib/common.wgsl", import.meta.url));

function source(v: Variant): string {
  const R = v.rows;
  const wpu = v.vec === 1 ? 2 : 1; // qs words per unit
  // One unit step for unit index expression `u` (suffix `s` names its values).
  const step = (u: string) => `
    {
      let c = (${u}) >> ${v.vec === 1 ? 1 : 2}u;
      let j = ${v.vec === 1 ? `2u * ((${u}) & 1u)` : `(${u}) & 3u`};
      let ib = c & 7u;
      let boff = 136u * (c >> 3u);
      let e = 8u * c + j;
      ${each(wpu, (h) => `let xl${h} = xq(e + ${h}u, ${u});\n      let xh${h} = xq(e + ${h + 4}u, ${u});`)}
      ${
    each(R, (r) =>
      `let blk${r} = (rb${r} + boff) >> 2u;
      let s${r} = scale(blk${r}, ib);
      ${
        v.vec === 1
          ? `let ww${r} = weights2[((blk${r} + 2u + 4u * ib + j) >> 1u)];\n      let w${r}_0 = ww${r}.x;\n      let w${r}_1 = ww${r}.y;`
          : `let w${r}_0 = weights[blk${r} + 2u + 4u * ib + j];`
      }`)
  }
      ${
    each(R, (r) =>
      each(wpu, (h) =>
        `if ((MODE & ${NOMATH}u) != 0u) {
        a${r} += bitcast<f32>(w${r}_${h} ^ bitcast<u32>(xl${h}.x + xh${h}.y + s${r}));
      } else {
        let q = decode(w${r}_${h});
        a${r} += s${r} * dot(q[0], xl${h}) + s${r} * dot(q[1], xh${h});
      }`))
  }
    }`;
  const upu = v.vec === 1 ? 16 : 8;
  return `
const WG: u32 = ${v.wg}u;
const MODE: u32 = ${v.mode}u;
const ROWS: u32 = ${R}u;
struct Params { k: u32, n: u32, row_bytes: u32, w_off: u32 }
@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var<storage, read> weights: array<u32>;
@group(0) @binding(2) var<storage, read> x: array<vec4<f32>>;
@group(0) @binding(3) var<storage, read_write> y: array<f32>;
@group(0) @binding(4) var<storage, read_write> occ: array<atomic<u32>, 4>;
@group(0) @binding(5) var<storage, read> weights2: array<vec2<u32>>;
var<workgroup> tab32: array<f32, 512>;
var<workgroup> partial: array<f32, ${v.wg * R}>;
var<private> lane: u32;

fn weight_word(i: u32) -> u32 {
  return weights[i];
}
${COMMON}
fn decode(w: u32) -> array<vec4<f32>, 2> {
  if ((MODE & ${NOTAB}u) != 0u) {
    return array<vec4<f32>, 2>(common_lo4(w), common_hi4(w));
  }
  if ((MODE & ${TAB32}u) != 0u) {
    let lo = (vec4<u32>(w, w >> 8u, w >> 16u, w >> 24u) & vec4<u32>(0xFu)) * 32u + lane;
    let hi = (vec4<u32>(w >> 4u, w >> 12u, w >> 20u, w >> 28u) & vec4<u32>(0xFu)) * 32u + lane;
    return array<vec4<f32>, 2>(
      vec4<f32>(tab32[lo.x], tab32[lo.y], tab32[lo.z], tab32[lo.w]),
      vec4<f32>(tab32[hi.x], tab32[hi.y], tab32[hi.z], tab32[hi.w]),
    );
  }
  return common_kv_word(w);
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
      tab32[i] = common_kvalues(vec4<u32>(i >> 5u)).x;
    }
    workgroupBarrier();
  } else if ((MODE & ${NOTAB}u) == 0u) {
    for (var i = lid; i < 256u; i += WG) {
      common_kv2_init(i);
    }
    workgroupBarrier();
  }
  let team = lid / 32u;
  let t = lid % 32u;
  let row0 = (wg * (WG / 32u) + team) * ROWS;
  let base = params.w_off & 0x7FFFFFFFu;
  ${
    each(R, (r) =>
      `let rb${r} = base + min(row0 + ${r}u, params.n - 1u) * params.row_bytes;
  var a${r} = 0.0;`)
  }
  let n_units = params.k / ${upu}u;
  var u = t;
  ${
    v.unroll > 1
      ? `for (; u + ${32 * (v.unroll - 1)}u < n_units; u += ${32 * v.unroll}u) {
    ${each(v.unroll, (i) => step(`u + ${32 * i}u`))}
  }`
      : ""
  }
  for (; u < n_units; u += 32u) {
    ${step("u")}
  }
  ${each(R, (r) => `partial[${r}u * WG + lid] = a${r};`)}
  workgroupBarrier();
  if ((t & 7u) == 0u) {
    for (var r = 0u; r < ROWS; r++) {
      var s = 0.0;
      for (var e = 0u; e < 8u; e++) {
        s += partial[r * WG + lid + e];
      }
      partial[r * WG + lid] = s;
    }
  }
  workgroupBarrier();
  if (t < ROWS) {
    let p = t * WG + team * 32u;
    let s = partial[p] + partial[p + 8u] + partial[p + 16u] + partial[p + 24u];
    if (row0 + t < params.n) {
      y[row0 + t] = s;
    }
  }
  if (lid == 0u && params.w_off == 0xFFFFFFFFu) {
    atomicSub(&occ[0], 1u);
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
const yBuf = device.createBuffer({ size: 4 << 20, usage: GPUBufferUsage.STORAGE | GPUBufferUsage.COPY_SRC });
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
const VARIANTS: Variant[] = [
  { mode: 0, wg: 256, unroll: 1, vec: 0, rows: 1 },
  { mode: TAB32, wg: 256, unroll: 1, vec: 0, rows: 1 },
  { mode: TAB32, wg: 256, unroll: 2, vec: 0, rows: 1 },
  { mode: TAB32, wg: 256, unroll: 1, vec: 0, rows: 2 },
  { mode: TAB32, wg: 256, unroll: 1, vec: 0, rows: 4 },
  { mode: TAB32, wg: 256, unroll: 2, vec: 0, rows: 2 },
  { mode: TAB32, wg: 256, unroll: 1, vec: 1, rows: 1 },
  { mode: TAB32, wg: 256, unroll: 2, vec: 1, rows: 1 },
  { mode: TAB32, wg: 256, unroll: 1, vec: 1, rows: 2 },
  { mode: TAB32, wg: 256, unroll: 1, vec: 1, rows: 4 },
  { mode: TAB32, wg: 128, unroll: 1, vec: 1, rows: 2 },
  { mode: 0, wg: 256, unroll: 1, vec: 0, rows: 4 },
  { mode: 0, wg: 256, unroll: 1, vec: 1, rows: 2 },
  { mode: NOTAB, wg: 256, unroll: 1, vec: 1, rows: 2 },
  { mode: NOTAB, wg: 256, unroll: 2, vec: 1, rows: 2 },
  { mode: NOX | NOTAB, wg: 256, unroll: 2, vec: 1, rows: 2 },
  { mode: NOX | NOTAB | NOHDR | NOMATH, wg: 256, unroll: 2, vec: 1, rows: 2 },
  { mode: NOX | NOTAB | NOHDR | NOMATH, wg: 256, unroll: 4, vec: 1, rows: 1 },
];

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
  // --quick: valid blocks in copy 0 and a float64 reference, to check the modes that compute real values.
  let ref: Float64Array | undefined;
  const xs = new Float32Array(s.k).map(() => Math.random() - 0.5);
  if (QUICK) {
    const blocks = randomBlocks("IQ4_XS", (s.k / 256) * s.n, { scale: 0.05, seed: 3 });
    device.queue.writeBuffer(weights, 0, blocks as Uint8Array<ArrayBuffer>);
    device.queue.writeBuffer(xBuf, 0, xs);
    const w = dequantize("IQ4_XS", blocks, s.k * s.n);
    ref = new Float64Array(s.n);
    for (let r = 0; r < s.n; r++) {
      let a = 0;
      for (let k = 0; k < s.k; k++) a += w[r * s.k + k]! * xs[k]!;
      ref[r] = a;
    }
  }
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
        ].filter((e) => e.binding !== 5 || v.vec === 1),
      }));
    }
    const bindErr = await device.popErrorScope();
    if (bindErr) throw new Error(`probe ${JSON.stringify(v)} bind group: ${bindErr.message}`);
    const wgs = Math.ceil(s.n / (v.wg / 32) / v.rows);
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
    let maxErr: number | undefined;
    if (ref && (v.mode & (NOX | NOTAB | NOHDR | NOMATH)) === 0) {
      const enc2 = device.createCommandEncoder();
      const pass2 = enc2.beginComputePass();
      pass2.setPipeline(pipe);
      pass2.setBindGroup(0, groups[0]!);
      pass2.dispatchWorkgroups(gx, gy);
      pass2.end();
      const rd = device.createBuffer({
        size: 4 * s.n,
        usage: GPUBufferUsage.COPY_DST | GPUBufferUsage.MAP_READ,
      });
      enc2.copyBufferToBuffer(yBuf, 0, rd, 0, 4 * s.n);
      device.queue.submit([enc2.finish()]);
      await rd.mapAsync(GPUMapMode.READ);
      const got = new Float32Array(rd.getMappedRange().slice(0));
      rd.destroy();
      maxErr = 0;
      for (let r = 0; r < s.n; r++) {
        maxErr = Math.max(maxErr, Math.abs(got[r]! - ref[r]!) / (Math.abs(ref[r]!) + 1e-3));
      }
    }
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
      maxRelErr: maxErr,
    });
  }
}
device.destroy();
