// moe_matmul: the expert passes of a prefill chunk as grouped matmuls over moe_group.wgsl's lists. For group
// e (a routed expert, or the shared expert as the last group), Y[col] = W_e · x[x_row(col)] for every column
// col of e's list; GATE_UP: Y[col] = silu(W_gate_e · x) · (W_up_e · x), row by row.
//   groups[e] = count_e,  groups[n_groups + e·cap + i] = column i of group e (ascending)
// Column col reads x row col / x_div for col < n_routed, else col − n_routed + shared_x0, and writes Y at
// col·y_stride + row. Expert e's matrix starts at byte w_off + e·expert_bytes (up: w_off_up + e·expert_bytes);
// row r at + r·row_bytes, raw GGUF blocks (lib/quant.wgsl).
//
// Tiles of TT tokens (16, 32 or 64): a chunk of 512 tokens with 8 of 256 experts each gives an expert 16
// tokens on average, so wider token tiles leave most of a workgroup idle there, while a 2,048-token chunk
// (64 per expert) reads each expert's weights 4 times with 16-token tiles; the engine picks TT from the
// chunk's columns per group. Each group's tokens are cut into tiles of TT; grid y runs over every group's
// tiles in group order (a bound: workgroups past the last tile return), and each workgroup finds its group
// and first token from a workgroup prefix sum over the groups' tile counts.
// A workgroup (256 invocations) owns 256 weight rows × TT tokens: rows n0 + r, r < 256 (GATE_UP: gate rows
// n0 + r for r < 128 and the same rows of up for r ≥ 128, grid x = ceil(N / 128)). Per step of 8·UNITS row
// positions (UNITS units of one 32-element chunk, lib/quant.wgsl), invocation lid dequantizes tile row lid's
// units into workgroup memory `wt` and invocations lid < TT·UNITS stage one unit of one token into `xt`
// (f32, transposed so that the inner loop reads vec4s), then every invocation runs 8·UNITS rank-1 updates
// (TPI = TT / 4 tokens per invocation plain, TT / 8 for GATE_UP):
//   plain:   rows 4·ty .. 4·ty + 3 (ty = lid % 64) × tokens TPI·tx .. + TPI − 1 (tx = lid / 64)
//   GATE_UP: gate rows 4·ty .. + 3 and the same up rows (ty = lid % 32) × tokens TPI·tx .. (tx = lid / 32)
// so every warp holds one token group: warps whose tokens are all past count_e skip the updates. The next
// step's weights and inputs load into registers during this step's updates. Rows ≥ N and tokens ≥ count_e are
// computed from clamped or zero inputs and never stored.
// Constants: const TYPE: u32 (ggml id); const GATE_UP: bool; const UNITS: u32 (2 or 4: units per step);
// const TT: u32 (16, 32 or 64: tokens per tile).
// Limits: K % 32 == 0; at most 1024 groups; TT·UNITS <= 256; workgroup memory 8192·UNITS + 32·TT·UNITS +
// 1032 bytes, plus 2 KiB for the IQ4 table (UNITS 2, TT 16: 20 KiB).

struct Params {
  k: u32,
  n: u32,
  row_bytes: u32,
  w_off: u32,
  w_off_up: u32,
  expert_bytes: u32,
  x_stride: u32,
  y_stride: u32,
  cap: u32,
  x_div: u32,
  n_groups: u32,
  n_routed: u32,
  shared_x0: u32,
  pad0: u32,
  pad1: u32,
  pad2: u32,
}

@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var<storage, read> weights: array<u32>;
@group(0) @binding(2) var<storage, read> x: array<vec4<f32>>;
@group(0) @binding(3) var<storage, read_write> y: array<f32>;
@group(0) @binding(4) var<storage, read> groups: array<u32>;

const KK: u32 = 8u * UNITS; // row positions per step
const STEPS_PER_CHUNK: u32 = 4u / UNITS;
// Token groups of 4 in a tile; tokens per invocation.
const TG: u32 = TT / 4u;
const TPI: u32 = select(TT / 4u, TT / 8u, GATE_UP);

// wt[kk · 64 + r / 4][r % 4] = tile row r at step position kk; xt[kk · TG + t / 4][t % 4] = tile token t.
var<workgroup> wt: array<vec4<f32>, 64u * KK>;
var<workgroup> xt: array<vec4<f32>, TG * KK>;

const GROUP_TILE: u32 = TT;

fn weight_word(i: u32) -> u32 {
  return weights[i];
}

fn silu(v: f32) -> f32 {
  return v / (1.0 + exp(-v));
}

// Stages unit u of the step (8 weights) of tile row `lid` into wt.
fn stage_w(lid: u32, u: u32, sc: vec4<f32>, q: array<vec4<f32>, 2>) {
  let lo = q[0] * sc.x - vec4<f32>(sc.z);
  let hi = q[1] * sc.y - vec4<f32>(sc.w);
  let g = lid / 4u;
  let comp = lid % 4u;
  for (var i = 0u; i < 4u; i++) {
    wt[(8u * u + i) * 64u + g][comp] = lo[i];
    wt[(8u * u + 4u + i) * 64u + g][comp] = hi[i];
  }
}

// One step's weights in registers. RAW (IQ4_XS): the block's head and scales_l words and the units' qs
// words, decoded at staging, so that the loads of step s + 1 are in flight during step s's updates (decoding
// at once would wait for them before the codebook lookups); other types: decoded at once.
const RAW: bool = TYPE == 23u;

struct Fetched {
  hw: vec2<u32>,
  qw: vec4<u32>,
  sc: vec4<f32>,
  q0: array<vec4<f32>, 2>,
  q1: array<vec4<f32>, 2>,
  q2: array<vec4<f32>, 2>,
  q3: array<vec4<f32>, 2>,
}

// Loads step s of the row at byte rb: chunk s / STEPS_PER_CHUNK, units UNITS·(s % STEPS_PER_CHUNK) ...
fn fetch(rb: u32, s: u32) -> Fetched {
  var f: Fetched;
  let c = s / STEPS_PER_CHUNK;
  let j0 = UNITS * (s % STEPS_PER_CHUNK);
  if (RAW) {
    let b = (rb + 136u * (c >> 3u)) >> 2u;
    f.hw = vec2<u32>(weight_word(b), weight_word(b + 1u));
    let qb = b + 2u + 4u * (c & 7u) + j0;
    f.qw.x = weight_word(qb);
    f.qw.y = weight_word(qb + 1u);
    if (UNITS == 4u) {
      f.qw.z = weight_word(qb + 2u);
      f.qw.w = weight_word(qb + 3u);
    }
    return f;
  }
  f.sc = quant_scales(rb, c);
  f.q0 = quant_q(rb, c, j0);
  f.q1 = quant_q(rb, c, j0 + 1u);
  if (UNITS == 4u) {
    f.q2 = quant_q(rb, c, j0 + 2u);
    f.q3 = quant_q(rb, c, j0 + 3u);
  }
  return f;
}

// Stages step s's units of tile row lid (decoding RAW words first).
fn stage_units(lid: u32, s: u32, f: Fetched) {
  var sc = f.sc;
  var q0 = f.q0;
  var q1 = f.q1;
  var q2 = f.q2;
  var q3 = f.q3;
  if (RAW) {
    let ib = (s / STEPS_PER_CHUNK) & 7u;
    let dl = iq4xs_scale(f.hw.x, f.hw.y, 4u * ib, 16u + 2u * ib);
    sc = vec4<f32>(dl, dl, 0.0, 0.0);
    q0 = common_kv_word(f.qw.x);
    q1 = common_kv_word(f.qw.y);
    if (UNITS == 4u) {
      q2 = common_kv_word(f.qw.z);
      q3 = common_kv_word(f.qw.w);
    }
  }
  stage_w(lid, 0u, sc, q0);
  stage_w(lid, 1u, sc, q1);
  if (UNITS == 4u) {
    stage_w(lid, 2u, sc, q2);
    stage_w(lid, 3u, sc, q3);
  }
}

// Writes entry m of group e (when m < count), rows r0 .. r0 + 3 below N: v, or with GATE_UP silu(v)·u.
fn store(e: u32, m: u32, count: u32, r0: u32, v: vec4<f32>, u: vec4<f32>) {
  if (m >= count) {
    return;
  }
  let col = token_col(e, m);
  for (var i = 0u; i < 4u; i++) {
    if (r0 + i < params.n) {
      if (GATE_UP) {
        y[col * params.y_stride + r0 + i] = silu(v[i]) * u[i];
      } else {
        y[col * params.y_stride + r0 + i] = v[i];
      }
    }
  }
}

@compute @workgroup_size(256)
fn main(@builtin(local_invocation_index) lid: u32, @builtin(workgroup_id) wid: vec3<u32>) {
  // This workgroup's tile: the wid.y-th TT-token tile over the groups in order (lib/group_tiles.wgsl).
  find_tile(lid, wid.y);
  let e = workgroupUniformLoad(&tile_group);
  if (e == NO_TILE) {
    return;
  }
  let m0 = workgroupUniformLoad(&tile_m0);
  let count = min(groups[e], params.cap);
  if (QUANT_NEEDS_INIT) {
    quant_init(lid);
    workgroupBarrier();
  }

  let n0 = wid.x * select(256u, 128u, GATE_UP);
  // Weight staging: tile row lid (GATE_UP: gate rows below 128, the same rows of up from 128).
  var row = n0 + lid;
  var base = params.w_off;
  if (GATE_UP) {
    row = n0 + lid % 128u;
    base = select(params.w_off, params.w_off_up, lid >= 128u);
  }
  let rb = base + e * params.expert_bytes + min(row, params.n - 1u) * params.row_bytes;
  // Input staging (lid < TT·UNITS): token xm of the tile, unit xu of the step.
  let xm = lid % TT;
  let xu = lid / TT;
  let stages_x = xu < UNITS;
  let xv = m0 + xm < count;
  let xb = params.x_stride * x_row(token_col(e, min(m0 + xm, count - 1u)));
  // The invocation's tokens: TPI·tx .. + TPI − 1 (tx is the same across a warp).
  let ty = select(lid % 64u, lid % 32u, GATE_UP);
  let tx = select(lid / 64u, lid / 32u, GATE_UP);
  let busy = m0 + TPI * tx < count;

  // The accumulators are named variables, never an array: naga's SPIR-V keeps a function-scope array that
  // a loop indexes in local memory on the H200 (3x slower, docs/PERF.md). Plain: a_j = rows 4·ty .. + 3 of
  // token TPI·tx + j. GATE_UP: TPI 2: gate a0, a1 and up a2, a3; TPI 4 or 8: gate a_j and up a_(8 + j).
  var a0 = vec4<f32>(0.0);
  var a1 = vec4<f32>(0.0);
  var a2 = vec4<f32>(0.0);
  var a3 = vec4<f32>(0.0);
  var a4 = vec4<f32>(0.0);
  var a5 = vec4<f32>(0.0);
  var a6 = vec4<f32>(0.0);
  var a7 = vec4<f32>(0.0);
  var a8 = vec4<f32>(0.0);
  var a9 = vec4<f32>(0.0);
  var a10 = vec4<f32>(0.0);
  var a11 = vec4<f32>(0.0);
  var a12 = vec4<f32>(0.0);
  var a13 = vec4<f32>(0.0);
  var a14 = vec4<f32>(0.0);
  var a15 = vec4<f32>(0.0);

  let steps = (params.k / 32u) * STEPS_PER_CHUNK;
  // Registers of step s: the chunk's scales, units UNITS·h .. of the chunk (h = s % STEPS_PER_CHUNK).
  var f = fetch(rb, 0u);
  var pos = quant_pos(0u, min(xu, UNITS - 1u));
  var xl = x[(xb + pos.x) >> 2u];
  var xh = x[(xb + pos.y) >> 2u];
  for (var s = 0u; s < steps; s++) {
    stage_units(lid, s, f);
    if (stages_x) {
      let l = select(vec4<f32>(0.0), xl, xv);
      let hv = select(vec4<f32>(0.0), xh, xv);
      for (var i = 0u; i < 4u; i++) {
        xt[(8u * xu + i) * TG + xm / 4u][xm % 4u] = l[i];
        xt[(8u * xu + 4u + i) * TG + xm / 4u][xm % 4u] = hv[i];
      }
    }
    workgroupBarrier();
    // The last step reloads its own units (in bounds, unused) rather than branching.
    let sn = min(s + 1u, steps - 1u);
    f = fetch(rb, sn);
    pos = quant_pos(sn / STEPS_PER_CHUNK, UNITS * (sn % STEPS_PER_CHUNK) + min(xu, UNITS - 1u));
    xl = x[(xb + pos.x) >> 2u];
    xh = x[(xb + pos.y) >> 2u];
    for (var kk = 0u; kk < select(0u, KK, busy); kk++) {
      if (GATE_UP) {
        let ag = wt[kk * 64u + ty];
        let au = wt[kk * 64u + 32u + ty];
        if (TPI == 2u) {
          let b4 = xt[kk * TG + tx / 2u];
          let b = select(b4.xy, b4.zw, (tx & 1u) == 1u);
          a0 += ag * b.x;
          a1 += ag * b.y;
          a2 += au * b.x;
          a3 += au * b.y;
        } else {
          let b0 = xt[kk * TG + tx * (TPI / 4u)];
          a0 += ag * b0.x;
          a1 += ag * b0.y;
          a2 += ag * b0.z;
          a3 += ag * b0.w;
          a8 += au * b0.x;
          a9 += au * b0.y;
          a10 += au * b0.z;
          a11 += au * b0.w;
          if (TPI == 8u) {
            let b1 = xt[kk * TG + 2u * tx + 1u];
            a4 += ag * b1.x;
            a5 += ag * b1.y;
            a6 += ag * b1.z;
            a7 += ag * b1.w;
            a12 += au * b1.x;
            a13 += au * b1.y;
            a14 += au * b1.z;
            a15 += au * b1.w;
          }
        }
      } else {
        let a = wt[kk * 64u + ty];
        let b0 = xt[kk * TG + tx * (TPI / 4u)];
        a0 += a * b0.x;
        a1 += a * b0.y;
        a2 += a * b0.z;
        a3 += a * b0.w;
        if (TPI >= 8u) {
          let b1 = xt[kk * TG + tx * (TPI / 4u) + 1u];
          a4 += a * b1.x;
          a5 += a * b1.y;
          a6 += a * b1.z;
          a7 += a * b1.w;
        }
        if (TPI == 16u) {
          let b2 = xt[kk * TG + tx * 4u + 2u];
          let b3 = xt[kk * TG + tx * 4u + 3u];
          a8 += a * b2.x;
          a9 += a * b2.y;
          a10 += a * b2.z;
          a11 += a * b2.w;
          a12 += a * b3.x;
          a13 += a * b3.y;
          a14 += a * b3.z;
          a15 += a * b3.w;
        }
      }
    }
    workgroupBarrier();
  }

  let r0 = n0 + 4u * ty;
  let t0 = m0 + TPI * tx;
  if (GATE_UP) {
    if (TPI == 2u) {
      store(e, t0, count, r0, a0, a2);
      store(e, t0 + 1u, count, r0, a1, a3);
      return;
    }
    store(e, t0, count, r0, a0, a8);
    store(e, t0 + 1u, count, r0, a1, a9);
    store(e, t0 + 2u, count, r0, a2, a10);
    store(e, t0 + 3u, count, r0, a3, a11);
    if (TPI == 8u) {
      store(e, t0 + 4u, count, r0, a4, a12);
      store(e, t0 + 5u, count, r0, a5, a13);
      store(e, t0 + 6u, count, r0, a6, a14);
      store(e, t0 + 7u, count, r0, a7, a15);
    }
    return;
  }
  let z = vec4<f32>(0.0);
  store(e, t0, count, r0, a0, z);
  store(e, t0 + 1u, count, r0, a1, z);
  store(e, t0 + 2u, count, r0, a2, z);
  store(e, t0 + 3u, count, r0, a3, z);
  if (TPI >= 8u) {
    store(e, t0 + 4u, count, r0, a4, z);
    store(e, t0 + 5u, count, r0, a5, z);
    store(e, t0 + 6u, count, r0, a6, z);
    store(e, t0 + 7u, count, r0, a7, z);
  }
  if (TPI == 16u) {
    store(e, t0 + 8u, count, r0, a8, z);
    store(e, t0 + 9u, count, r0, a9, z);
    store(e, t0 + 10u, count, r0, a10, z);
    store(e, t0 + 11u, count, r0, a11, z);
    store(e, t0 + 12u, count, r0, a12, z);
    store(e, t0 + 13u, count, r0, a13, z);
    store(e, t0 + 14u, count, r0, a14, z);
    store(e, t0 + 15u, count, r0, a15, z);
  }
}
