/**
 * Diagnostic benchmark: what limits the IQ4_XS mat-vec. One kernel with the production loop shape (a warp per
 * row, lane t takes 8-weight units t, t + 32, ...; wgsl/matvec.wgsl's ROWS = 1 path) whose parts can be taken
 * out one at a time by constant flags, timed on the same bytes beside `stream_read`, plus the number of
 * workgroups resident at once (an atomic counter). Prints one JSON line per case; never asserts.
 *
 * Rounds: 1 (11b351a) took the parts out of the ROWS = 1 loop one by one; 2 (4583cf3) R rows per warp sharing
 * each x quad (code generated per variant, no arrays), vec2 qs loads (VEC 1: 16 weights per unit), unroll; 3
 * (0143b45) int8 x with dot4I8Packed (Q8X); 4 (this version's variant list) a whole 32-weight sub-block per lane
 * step with int8 x (Q8S), run at 37228b9 with round 5 (conflict-free codebook tables TAB16/TABW, Q8_0 with int8 x);
 * 6 (`--round 6`, the default; `--round 5` runs rounds 4 and 5): matvec_q8's dense x layout (DX) in those loops.
 * With `--quick` (lavapipe) the value-computing modes are checked against a float64 reference (maxRelErr).
 *
 * Flags (MODE bits): 1 NOX (x quads from the unit index instead of loads), 2 NOTAB (nibbles to f32 by
 * arithmetic instead of the workgroup codebook; with Q8X the raw nibbles, timing only), 4 NOHDR (no block
 * head/scale loads), 8 NOMATH (fold the raw word instead of decoding), 16 TAB32 (the codebook replicated once
 * per bank: lane l reads entry e at e·32 + l, conflict-free), 32 Q8X (x as int8 per 32-element chunk, the
 * codebook as int8 bytes, dot4I8Packed), 64 Q8S (with Q8X: one sub-block per lane step). Other knobs: WG
 * (invocations per workgroup), UNROLL (units per loop step), VEC (1: each lane loads two adjacent qs words as one
 * vec2, i.e. 16 weights per unit).
 *
 * Usage: `deno run -A bench/matvec_probe.ts [--quick] [--round 5|6]`. No npm imports (runs on the lent GPU machine).
 * @module
 */
import { parseArgs } from "node:util";
import { PassTimer } from "./_pass_timer.ts";
import { acquireGpu } from "../engine/gpu/device.ts";
import { PipelineCache } from "../wgsl/kernel.ts";
import { dequantize, randomBlocks } from "../engine/quant/mod.ts";
import {
  encodeStreamRead,
  prepareStreamRead,
  STREAM_READ_PARAMS_BYTES,
  type StreamReadOp,
  streamReadParams,
} from "../wgsl/stream_read.ts";

const { values: args } = parseArgs({
  options: { quick: { type: "boolean", default: false }, round: { type: "string", default: "6" } },
});
const QUICK = args.quick ?? false;

interface Variant {
  mode: number;
  wg: number;
  unroll: number;
  vec: number;
  rows: number;
  /** Workgroups per SM-sized slice (132 of them) in a grid-stride loop over row groups; 0: one per group. */
  persist?: number;
}

const NOX = 1,
  NOTAB = 2,
  NOHDR = 4,
  NOMATH = 8,
  TAB32 = 16,
  Q8X = 32,
  Q8S = 64,
  TABW = 128,
  TAB16 = 256,
  Q80 = 512,
  DX = 1024;

/** `f(i)` for i < n, joined by newlines (the generated code is unrolled over rows and units). */
function each(n: number, f: (i: number) => string): string {
  return Array.from({ length: n }, (_, i) => f(i)).join("\n");
}

/** wgsl/lib/common.wgsl (the codebook arithmetic and the byte-to-f32 trick), included in every variant. */
const COMMON = await Deno.readTextFile(new URL("../wgsl/lib/common.wgsl", import.meta.url));

/** Q8X: one unit step (8 weights of R rows against one int8 x quad pair), suffix-free (scoped block). */
function stepQ8x(v: Variant, u: string): string {
  const R = v.rows;
  return `
    {
      let c = (${u}) >> 2u;
      let j = (${u}) & 3u;
      let ib = c & 7u;
      let boff = 136u * (c >> 3u);
      let xv = xq8[${u}];
      let dx = bitcast<f32>(xv.z);
      ${
    each(R, (r) =>
      `let blk${r} = (rb${r} + boff) >> 2u;
      let s${r} = scale(blk${r}, ib) * dx;
      let p${r} = pack8(weights[blk${r} + 2u + 4u * ib + j]);`)
  }
      ${each(R, (r) => `a${r} += s${r} * f32(dot4I8Packed(p${r}.x, xv.x) + dot4I8Packed(p${r}.y, xv.y));`)}
    }`;
}

/**
 * Q8S: chunk c's int8 x as four quad pairs x0..x3 (.x, .y) and its scale dx: from the unit layout (a vec4 per
 * 8-weight unit, scale in .z), or with DX from the dense layout of matvec_q8 (two vec4 per chunk, the scales
 * after the K/4 quad words).
 */
function xChunk(v: Variant): string {
  if ((v.mode & DX) !== 0) {
    return `let xa = xq8[2u * c];
      let xb = xq8[2u * c + 1u];
      let x0 = xa.xyxy;
      let x1 = xa.zwzw;
      let x2 = xb.xyxy;
      let x3 = xb.zwzw;
      let dx = bitcast<f32>(xsd[params.k / 4u + c]);`;
  }
  return `let x0 = xq8[4u * c];
      let x1 = xq8[4u * c + 1u];
      let x2 = xq8[4u * c + 2u];
      let x3 = xq8[4u * c + 3u];
      let dx = bitcast<f32>(x0.z);`;
}

/**
 * Q8X|Q8S: one 32-weight sub-block (chunk `u`) of R rows per lane step: the chunk's four int8 x quads pairs
 * (Q8X layout, one vec4 per 8-weight unit), per row two 8-byte qs loads and eight dot4I8Packed.
 */
function stepQ8s(v: Variant, u: string): string {
  const R = v.rows;
  return `
    {
      let c = ${u};
      let ib = c & 7u;
      let boff = 136u * (c >> 3u);
      ${xChunk(v)}
      ${
    each(R, (r) =>
      `let blk${r} = (rb${r} + boff) >> 2u;
      let s${r} = scale(blk${r}, ib) * dx;
      let qa${r} = weights2[(blk${r} + 2u + 4u * ib) >> 1u];
      let qb${r} = weights2[((blk${r} + 2u + 4u * ib) >> 1u) + 1u];`)
  }
      ${
    each(R, (r) =>
      `{
        let p0 = pack8(qa${r}.x);
        let p1 = pack8(qa${r}.y);
        let p2 = pack8(qb${r}.x);
        let p3 = pack8(qb${r}.y);
        let isum = dot4I8Packed(p0.x, x0.x) + dot4I8Packed(p0.y, x0.y) + dot4I8Packed(p1.x, x1.x) +
          dot4I8Packed(p1.y, x1.y) + dot4I8Packed(p2.x, x2.x) + dot4I8Packed(p2.y, x2.y) +
          dot4I8Packed(p3.x, x3.x) + dot4I8Packed(p3.y, x3.y);
        a${r} += s${r} * f32(isum);
      }`)
  }
    }`;
}

/** Q80 (Q8_0 weights): one 8-weight unit per lane step, f32 x or (Q8X) int8 x in natural order. */
function stepQ80(v: Variant, u: string): string {
  const R = v.rows;
  const q8 = (v.mode & Q8X) !== 0;
  return `
    {
      let c = (${u}) >> 2u;
      let j = (${u}) & 3u;
      ${
    q8
      ? `let xv = xq8[${u}];\n      let dx = bitcast<f32>(xv.z);`
      : `let xl = x[8u * c + 2u * j];\n      let xh = x[8u * c + 2u * j + 1u];`
  }
      ${
    each(R, (r) =>
      `let hb${r} = rb${r} + 34u * c;
      let hw${r} = unpack2x16float(weights[hb${r} >> 2u]);
      let d${r} = select(hw${r}.x, hw${r}.y, (hb${r} & 2u) != 0u);
      let i${r} = (hb${r} + 2u + 8u * j) >> 2u;
      let sh${r} = ((hb${r} + 2u) & 3u) * 8u;
      let w${r}_0 = weights[i${r}];
      let w${r}_1 = weights[i${r} + 1u];
      let w${r}_2 = weights[i${r} + 2u];`)
  }
      ${
    each(R, (r) =>
      `{
        let lo = select((w${r}_0 >> sh${r}) | (w${r}_1 << (32u - sh${r})), w${r}_0, sh${r} == 0u);
        let hi = select((w${r}_1 >> sh${r}) | (w${r}_2 << (32u - sh${r})), w${r}_1, sh${r} == 0u);
        ${
        q8
          ? `a${r} += d${r} * dx * f32(dot4I8Packed(lo, xv.x) + dot4I8Packed(hi, xv.y));`
          : `a${r} += d${r} * (dot(common_i8x4(lo), xl) + dot(common_i8x4(hi), xh));`
      }
      }`)
  }
    }`;
}

/** Q80|Q8S: one whole 34-byte block (32 weights, nine word loads) per lane step, int8 x. */
function stepQ80s(v: Variant, u: string): string {
  const R = v.rows;
  return `
    {
      let c = ${u};
      ${xChunk(v)}
      ${
    each(R, (r) =>
      `let hb${r} = rb${r} + 34u * c;
      let i${r} = hb${r} >> 2u;
      let al${r} = (hb${r} & 2u) != 0u;
      ${each(9, (k) => `let w${r}_${k} = weights[i${r} + ${k}u];`)}`)
  }
      ${
    each(R, (r) =>
      `{
        let hw = unpack2x16float(w${r}_0);
        let d = select(hw.x, hw.y, al${r});
        ${
        each(
          8,
          (k) => `let q${k} = select((w${r}_${k} >> 16u) | (w${r}_${k + 1} << 16u), w${r}_${k + 1}, al${r});`,
        )
      }
        let isum = dot4I8Packed(q0, x0.x) + dot4I8Packed(q1, x0.y) + dot4I8Packed(q2, x1.x) +
          dot4I8Packed(q3, x1.y) + dot4I8Packed(q4, x2.x) + dot4I8Packed(q5, x2.y) + dot4I8Packed(q6, x3.x) +
          dot4I8Packed(q7, x3.y);
        a${r} += d * dx * f32(isum);
      }`)
  }
    }`;
}

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
  const q8 = (v.mode & Q8X) !== 0;
  const q8s = (v.mode & Q8S) !== 0;
  const q80 = (v.mode & Q80) !== 0;
  const upu = q8s ? 32 : v.vec === 1 ? 16 : 8;
  const unitStep = (u: string) =>
    q80 ? (q8s ? stepQ80s(v, u) : stepQ80(v, u)) : q8s ? stepQ8s(v, u) : q8 ? stepQ8x(v, u) : step(u);
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
${q8 ? "@group(0) @binding(6) var<storage, read> xq8: array<vec4<u32>>;" : ""}
${(v.mode & DX) !== 0 ? "@group(0) @binding(7) var<storage, read> xsd: array<u32>;" : ""}
// Q8X: the codebook as int8 bytes: tab8[b] = kv[b & 15] in byte 0, kv[b >> 4] in byte 2 (shared table), or
// tab8b[n·32 + lane] = kv[n] in byte 0 (TAB32: one copy per bank).
var<workgroup> tab8: array<u32, 256>;
var<workgroup> tab8b: array<u32, 512>;
// TABW: the byte-pair table once per bank (entry b for lane l at b·32 + l); TAB16: four 16-entry tables, table p
// holding kv[n] in byte p (a warp's lookups into one 16-word table never conflict).
var<workgroup> tabw: array<u32, ${(v.mode & TABW) !== 0 ? 8192 : 1}>;
var<workgroup> tab16: array<u32, 64>;
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
// Q8X: the 8 codebook values of qs word w as two int8x4 words: [lo b0, lo b1, hi b0, hi b1], [lo b2, lo b3, hi b2,
// hi b3] (the int8 x is stored in the same order). NOTAB: the raw nibbles (timing only).
fn pack8(w: u32) -> vec2<u32> {
  if ((MODE & ${NOTAB}u) != 0u) {
    return vec2<u32>(w & 0x0F0F0F0Fu, (w >> 4u) & 0x0F0F0F0Fu);
  }
  if ((MODE & ${TABW}u) != 0u) {
    let t0 = tabw[(w & 0xFFu) * 32u + lane];
    let t1 = tabw[((w >> 8u) & 0xFFu) * 32u + lane];
    let t2 = tabw[((w >> 16u) & 0xFFu) * 32u + lane];
    let t3 = tabw[(w >> 24u) * 32u + lane];
    return vec2<u32>(t0 + t1 * 256u, t2 + t3 * 256u);
  }
  if ((MODE & ${TAB16}u) != 0u) {
    return vec2<u32>(
      tab16[extractBits(w, 0u, 4u)] | tab16[16u + extractBits(w, 8u, 4u)] | tab16[32u + extractBits(w, 4u, 4u)] |
        tab16[48u + extractBits(w, 12u, 4u)],
      tab16[extractBits(w, 16u, 4u)] | tab16[16u + extractBits(w, 24u, 4u)] | tab16[32u + extractBits(w, 20u, 4u)] |
        tab16[48u + (w >> 28u)],
    );
  }
  if ((MODE & ${TAB32}u) != 0u) {
    let lo = (vec4<u32>(w, w >> 8u, w >> 16u, w >> 24u) & vec4<u32>(0xFu)) * 32u + lane;
    let hi = (vec4<u32>(w >> 4u, w >> 12u, w >> 20u, w >> 28u) & vec4<u32>(0xFu)) * 32u + lane;
    return vec2<u32>(
      tab8b[lo.x] | (tab8b[lo.y] << 8u) | (tab8b[hi.x] << 16u) | (tab8b[hi.y] << 24u),
      tab8b[lo.z] | (tab8b[lo.w] << 8u) | (tab8b[hi.z] << 16u) | (tab8b[hi.w] << 24u),
    );
  }
  let t0 = tab8[w & 0xFFu];
  let t1 = tab8[(w >> 8u) & 0xFFu];
  let t2 = tab8[(w >> 16u) & 0xFFu];
  let t3 = tab8[w >> 24u];
  return vec2<u32>(t0 | (t1 << 8u), t2 | (t3 << 8u));
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
  if ((MODE & ${TABW}u) != 0u) {
    for (var i = lid; i < 8192u; i += WG) {
      let kv = vec2<i32>(common_kvalues(vec4<u32>((i >> 5u) & 15u, i >> 9u, 0u, 0u)).xy);
      tabw[i] = (u32(kv.x) & 0xFFu) | ((u32(kv.y) & 0xFFu) << 16u);
    }
    workgroupBarrier();
  } else if ((MODE & ${TAB16}u) != 0u) {
    for (var i = lid; i < 64u; i += WG) {
      tab16[i] = (u32(i32(common_kvalues(vec4<u32>(i & 15u)).x)) & 0xFFu) << (8u * (i >> 4u));
    }
    workgroupBarrier();
  } else if (${q8} && (MODE & ${TAB32}u) != 0u) {
    for (var i = lid; i < 512u; i += WG) {
      tab8b[i] = u32(i32(common_kvalues(vec4<u32>(i >> 5u)).x)) & 0xFFu;
    }
    workgroupBarrier();
  } else if (${q8} && (MODE & ${NOTAB}u) == 0u) {
    for (var i = lid; i < 256u; i += WG) {
      let kv = vec2<i32>(common_kvalues(vec4<u32>(i & 15u, i >> 4u, 0u, 0u)).xy);
      tab8[i] = (u32(kv.x) & 0xFFu) | ((u32(kv.y) & 0xFFu) << 16u);
    }
    workgroupBarrier();
  } else if ((MODE & ${TAB32}u) != 0u) {
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
  let n_groups = (params.n + WG / 32u * ROWS - 1u) / (WG / 32u * ROWS);
  for (var g = wg; g < n_groups; g += ${v.persist ? "nwg.x * nwg.y" : "n_groups"}) {
  let row0 = (g * (WG / 32u) + team) * ROWS;
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
    ${each(v.unroll, (i) => unitStep(`u + ${32 * i}u`))}
  }`
      : ""
  }
  for (; u < n_units; u += 32u) {
    ${unitStep("u")}
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
  workgroupBarrier();
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
const xq8Buf = device.createBuffer({
  size: 2 * 8192,
  usage: GPUBufferUsage.STORAGE | GPUBufferUsage.COPY_DST,
});
const xdBuf = device.createBuffer({
  size: 8192 + 1024,
  usage: GPUBufferUsage.STORAGE | GPUBufferUsage.COPY_DST,
});

/** DX: the unit layout of quantizeX rewritten densely (matvec_q8's layout): quad words 8c + 2j, 8c + 2j + 1,
 * scales at K/4 + c. */
function denseX(words: Uint32Array, k: number): Uint32Array<ArrayBuffer> {
  const out = new Uint32Array(k / 4 + k / 32);
  for (let u = 0; u < k / 8; u++) {
    out[2 * u] = words[4 * u]!;
    out[2 * u + 1] = words[4 * u + 1]!;
  }
  for (let c = 0; c < k / 32; c++) out[k / 4 + c] = words[4 * (4 * c) + 2]!;
  return out;
}

/**
 * Q8X: x quantized to int8 per 32-element chunk (d = max|x| / 127, q = round(x / d)), stored per 8-weight unit
 * u = 4c + j as vec4<u32>(X0, X1, d, 0) with X0 = q at chunk positions [4j, 4j+1, 16+4j, 16+4j+1] and
 * X1 = [4j+2, 4j+3, 16+4j+2, 16+4j+3] (the order pack8 puts the codebook bytes in); also the dequantized x.
 */
function quantizeX(
  xs: Float32Array,
  natural = false,
): { words: Uint32Array<ArrayBuffer>; deq: Float64Array } {
  const words = new Uint32Array(xs.length / 2);
  const f = new Float32Array(words.buffer);
  const deq = new Float64Array(xs.length);
  for (let c = 0; c < xs.length / 32; c++) {
    let amax = 0;
    for (let i = 0; i < 32; i++) amax = Math.max(amax, Math.abs(xs[32 * c + i]!));
    const d = Math.fround(amax / 127);
    const q = (i: number) => (d === 0 ? 0 : Math.round(xs[32 * c + i]! / d));
    for (let i = 0; i < 32; i++) deq[32 * c + i] = d * q(i);
    const pack = (a: number[]) => a.reduce((w, i, b) => w | ((q(i) & 0xff) << (8 * b)), 0) >>> 0;
    for (let j = 0; j < 4; j++) {
      const u = 4 * c + j;
      if (natural) { // Q8_0: unit j = chunk elements 8j..8j+7
        words[4 * u] = pack([8 * j, 8 * j + 1, 8 * j + 2, 8 * j + 3]);
        words[4 * u + 1] = pack([8 * j + 4, 8 * j + 5, 8 * j + 6, 8 * j + 7]);
      } else {
        words[4 * u] = pack([4 * j, 4 * j + 1, 16 + 4 * j, 17 + 4 * j]);
        words[4 * u + 1] = pack([4 * j + 2, 4 * j + 3, 18 + 4 * j, 19 + 4 * j]);
      }
      f[4 * u + 2] = d;
    }
  }
  return { words, deq };
}
const params = device.createBuffer({
  size: 256 * 17,
  usage: GPUBufferUsage.UNIFORM | GPUBufferUsage.COPY_DST,
});

const SHAPES: { name: string; k: number; n: number; type: "IQ4_XS" | "Q8_0" }[] = QUICK
  ? [{ name: "small", k: 2048, n: 8192, type: "IQ4_XS" }, { name: "small", k: 2048, n: 8192, type: "Q8_0" }]
  : [
    { name: "ffn_up_exps", k: 2048, n: 131072, type: "IQ4_XS" },
    { name: "output", k: 2048, n: 248320, type: "IQ4_XS" },
    { name: "ffn_down_exps", k: 512, n: 524288, type: "IQ4_XS" },
    { name: "ffn_up_exps", k: 2048, n: 131072, type: "Q8_0" },
    { name: "output", k: 2048, n: 248320, type: "Q8_0" },
  ];
const VARIANTS: Variant[] = [
  // Round 4: the engine's shape (shared table, ROWS 4), round 3's best (Q8X, 8 weights per lane step), and Q8S:
  // int8 x with a whole 32-weight sub-block per lane step (two 8-byte qs loads).
  { mode: 0, wg: 256, unroll: 1, vec: 0, rows: 4 },
  { mode: Q8X, wg: 256, unroll: 2, vec: 0, rows: 4 },
  { mode: Q8X | Q8S, wg: 256, unroll: 1, vec: 0, rows: 1 },
  { mode: Q8X | Q8S, wg: 256, unroll: 1, vec: 0, rows: 2 },
  { mode: Q8X | Q8S, wg: 256, unroll: 1, vec: 0, rows: 4 },
  { mode: Q8X | Q8S, wg: 256, unroll: 2, vec: 0, rows: 2 },
  { mode: Q8X | Q8S | NOTAB, wg: 256, unroll: 1, vec: 0, rows: 2 },
  { mode: Q8X | Q8S | NOTAB | NOHDR, wg: 256, unroll: 1, vec: 0, rows: 2 },
  // Round 5: codebook tables without bank conflicts: TAB16 (four 16-entry tables, one lookup per weight), TABW
  // (the byte-pair table once per bank, 32 KiB, with a persistent grid so that its set-up is paid rarely).
  { mode: Q8X | Q8S | TAB16, wg: 256, unroll: 1, vec: 0, rows: 2 },
  { mode: Q8X | Q8S | TAB16, wg: 256, unroll: 1, vec: 0, rows: 4 },
  { mode: Q8X | TAB16, wg: 256, unroll: 2, vec: 0, rows: 4 },
  { mode: Q8X | Q8S | TABW, wg: 256, unroll: 1, vec: 0, rows: 2, persist: 6 },
  { mode: Q8X | Q8S | TABW, wg: 256, unroll: 1, vec: 0, rows: 4, persist: 6 },
  { mode: Q8X | Q8S, wg: 256, unroll: 1, vec: 0, rows: 2, persist: 8 },
  // Q8_0: the engine's unit mapping with f32 x (the production arithmetic) and with int8 x; a block per lane.
  { mode: Q80, wg: 256, unroll: 1, vec: 0, rows: 4 },
  { mode: Q80 | Q8X, wg: 256, unroll: 1, vec: 0, rows: 2 },
  { mode: Q80 | Q8X, wg: 256, unroll: 1, vec: 0, rows: 4 },
  { mode: Q80 | Q8X, wg: 256, unroll: 2, vec: 0, rows: 2 },
  { mode: Q80 | Q8X | Q8S, wg: 256, unroll: 1, vec: 0, rows: 1 },
  { mode: Q80 | Q8X | Q8S, wg: 256, unroll: 1, vec: 0, rows: 2 },
  { mode: Q80 | Q8X | Q8S, wg: 256, unroll: 1, vec: 0, rows: 4 },
];

// Round 6: matvec_q8's dense x layout (DX) in the Q8S loops, with the unit layout beside it.
const ROUND6: Variant[] = [
  { mode: 0, wg: 256, unroll: 1, vec: 0, rows: 4 },
  { mode: Q8X | Q8S, wg: 256, unroll: 1, vec: 0, rows: 4 },
  { mode: Q8X | Q8S | DX, wg: 256, unroll: 1, vec: 0, rows: 2 },
  { mode: Q8X | Q8S | DX, wg: 256, unroll: 1, vec: 0, rows: 4 },
  { mode: Q8X | Q8S | DX | NOTAB, wg: 256, unroll: 1, vec: 0, rows: 4 },
  { mode: Q8X | Q8S | DX | NOTAB | NOHDR, wg: 256, unroll: 1, vec: 0, rows: 4 },
  { mode: Q80 | Q8X | Q8S, wg: 256, unroll: 1, vec: 0, rows: 4 },
  { mode: Q80 | Q8X | Q8S | DX, wg: 256, unroll: 1, vec: 0, rows: 4 },
  { mode: Q80 | Q8X | Q8S | DX, wg: 256, unroll: 1, vec: 0, rows: 2 },
];
const CHOSEN = args.round === "6" ? ROUND6 : VARIANTS;

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
  const q80Shape = s.type === "Q8_0";
  const rowBytes = q80Shape ? (s.k / 32) * 34 : (s.k / 256) * 136;
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
  let ref8: Float64Array | undefined;
  const xs = new Float32Array(s.k).map(() => Math.random() - 0.5);
  const x8 = quantizeX(xs, q80Shape);
  device.queue.writeBuffer(xq8Buf, 0, x8.words);
  device.queue.writeBuffer(xdBuf, 0, denseX(x8.words, s.k));
  if (QUICK) {
    const blocks = randomBlocks(s.type, (rowBytes / (q80Shape ? 34 : 136)) * s.n, { scale: 0.05, seed: 3 });
    device.queue.writeBuffer(weights, 0, blocks as Uint8Array<ArrayBuffer>);
    device.queue.writeBuffer(xBuf, 0, xs);
    const w = dequantize(s.type, blocks, s.k * s.n);
    ref = new Float64Array(s.n);
    ref8 = new Float64Array(s.n);
    for (let r = 0; r < s.n; r++) {
      let a = 0, a8 = 0;
      for (let k = 0; k < s.k; k++) {
        a += w[r * s.k + k]! * xs[k]!;
        a8 += w[r * s.k + k]! * x8.deq[k]!;
      }
      ref[r] = a;
      ref8[r] = a8;
    }
  }
  for (const v of CHOSEN.filter((v) => ((v.mode & Q80) !== 0) === q80Shape)) {
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
          { binding: 6, resource: { buffer: (v.mode & DX) !== 0 ? xdBuf : xq8Buf } },
          { binding: 7, resource: { buffer: xdBuf } },
        ].filter((e) =>
          (e.binding !== 5 || v.vec === 1 || (v.mode & (Q8S | Q80)) === Q8S) &&
          (e.binding !== 6 || (v.mode & Q8X) !== 0) &&
          (e.binding !== 7 || (v.mode & DX) !== 0) &&
          (e.binding !== 2 || (v.mode & Q8X) === 0)
        ),
      }));
    }
    const bindErr = await device.popErrorScope();
    if (bindErr) throw new Error(`probe ${JSON.stringify(v)} bind group: ${bindErr.message}`);
    const wgs = v.persist
      ? Math.min(132 * v.persist, Math.ceil(s.n / (v.wg / 32) / v.rows))
      : Math.ceil(s.n / (v.wg / 32) / v.rows);
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
    const want = (v.mode & Q8X) !== 0 ? ref8 : ref;
    if (want && (v.mode & (NOX | NOTAB | NOHDR | NOMATH)) === 0) {
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
        maxErr = Math.max(maxErr, Math.abs(got[r]! - want[r]!) / (Math.abs(want[r]!) + 1e-3));
      }
    }
    const gbps = tBytes / t / 1e9;
    line({
      kernel: "probe",
      case: s.name,
      type: s.type,
      ...v,
      flags: [
        ["NOX", NOX],
        ["NOTAB", NOTAB],
        ["NOHDR", NOHDR],
        ["NOMATH", NOMATH],
        ["TAB32", TAB32],
        ["Q8X", Q8X],
        ["Q8S", Q8S],
        ["TABW", TABW],
        ["TAB16", TAB16],
        ["Q80", Q80],
        ["DX", DX],
      ]
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
