// gdn_chunk v1 (bench/gdn_chunk.ts --scan only): the scan before the named-register rewrite, kept to time the
// engine's against it; its header as it was.
// gdn_chunk: the state-dependent scan of the chunked gated DeltaNet prefill (spec qwen3next.md §8.6), the middle
// of three dispatches (gdn_chunk_prep, gdn_chunk, gdn_chunk_norm; the twin gdn_chunk.ts records them). Per
// v-head h and 64-token block c in order, with S the state entering the block, for the columns J of this
// workgroup (column j of S, V', O and S_next depends on column j only):
//   V' = U − W·S[:, J]
//   O  = diag(e^G)·Q·S[:, J] + P·V'                      (o before the gated norm, into y)
//   S[:, J] ← e^{G_63}·S[:, J] + (diag(e^{G_63 − G}) K)ᵀ·V'
// with Q (q̂/√D_K), K (k̂), W, U, P, G from gdn_chunk_prep (definitions in its header). Exactly spec §8.6, with
// T = (I+M)^{-1} applied by forward substitution in prep; zero rows pad the last block.
//
// Bindings (f32; ne innermost first):
//   0 params  u32 ne=[2]: [pos0, n]
//   1 ws_qkw  ne=[QKW_BLK, N_V, NB] read: block (c, h) at (c·N_V + h)·QKW_BLK words, Q|K|W each ne=[D_K, 64]
//   2 ws_up   ne=[UP_BLK, N_V, NB] read: block (c, h) at (c·N_V + h)·UP_BLK: U ne=[D_V, 64] | P ne=[64, 64] | G ne=[64]
//   3 state   ne=[D_K, D_V, N_V] read_write, transposed as in gdn_step: state[(h·D_V + j)·D_K + i] = S_h[i][j]
//   4 y       ne=[N_V·D_V, n] written: o of token t, head h, column j at t·N_V·D_V + h·D_V + j (gdn_chunk_norm
//             turns it into ô in place)
// (NB = ceil(n/64); QKW_BLK = 3·64·D_K, UP_BLK = 64·D_V + 64·64 + 64.)
//
// Constants: N_V, D_K, D_V: u32. Limits: D_K % 64 == 0, D_K <= 256; D_V % 16 == 0. Workgroup storage
// 16·(D_K+4)·4 + 4 KiB + 512 B (13 KiB at D_K = 128).
//
// Grid (N_V, D_V/16, 1): workgroup (h, jb) owns columns J = 16·jb .. 16·jb+15 of head h for all blocks, its
// S[:, J] transposed in workgroup memory (rows padded by one vec4 against bank conflicts). Invocation
// (jl = lid % 16, tq = lid / 16) owns column j = 16·jb + jl and tokens tq + 16·m (m < 4) in V' and O, and key
// rows 4·(tq + 16·m) .. +3 (m < D_K/64) of S[:, j] in the update. Per block: barrier, V' (and Q·S) into
// workgroup memory, barrier, O and the state update (each invocation rewrites only its own S entries).
//
// Measured (bench/gdn_chunk.ts, H200, real dims, all three dispatches): 2.0-2.2 µs per token for n = 256..2048
// (gdn_step: 8.5-8.8), e.g. n = 2048: prep 1.27 ms, this scan 2.87 ms, norm 0.06 ms. The scan is bound by the
// latency of its global loads (W, Q, P, K per block); staging P in workgroup memory and batching the loads
// into private arrays measured 2.5x slower (register pressure), so this plain form stays.

@group(0) @binding(0) var<storage, read> params: array<u32>;
@group(0) @binding(1) var<storage, read> ws_qkw: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read> ws_up: array<f32>;
@group(0) @binding(3) var<storage, read_write> state: array<vec4<f32>>;
@group(0) @binding(4) var<storage, read_write> y: array<f32>;

const BT: u32 = 64u;
const WG: u32 = 256u;
const BJ: u32 = 16u; // columns per workgroup
const TQ: u32 = WG / BJ; // token groups
const NT: u32 = BT / TQ; // tokens per invocation in V' and O
const D4: u32 = D_K / 4u;
const SP: u32 = D4 + 1u; // padded row of st, in vec4
const M4: u32 = D4 / TQ; // key vec4s per invocation in the update
const Y_W: u32 = N_V * D_V;
const QKW_BLK4: u32 = 3u * BT * D4;
const OFF_K4: u32 = BT * D4;
const OFF_W4: u32 = 2u * BT * D4;
const UP_BLK: u32 = BT * D_V + BT * BT + BT;
const OFF_P: u32 = BT * D_V;
const OFF_G: u32 = BT * D_V + BT * BT;

var<workgroup> st: array<vec4<f32>, BJ * SP>; // st[jl·SP + i4] = S[4·i4 .. 4·i4+3][16·jb + jl]
var<workgroup> vp: array<f32, BT * BJ>; // V'[t][jl]
var<workgroup> eg: array<f32, BT>; // e^{G_t}
var<workgroup> dk: array<f32, BT>; // e^{G_63 − G_t}

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
  let h = wid.x;
  let j0 = wid.y * BJ;
  let jl = lid % BJ;
  let tq = lid / BJ;
  let n = params[1];
  let nb = (n + BT - 1u) / BT;

  for (var e = lid; e < BJ * D4; e += WG) {
    st[(e / D4) * SP + e % D4] = state[(h * D_V + j0 + e / D4) * D4 + e % D4];
  }
  for (var c = 0u; c < nb; c++) {
    let qb = (c * N_V + h) * QKW_BLK4;
    let ub = (c * N_V + h) * UP_BLK;
    // the previous block's readers of vp, eg, dk and writers of st are done
    workgroupBarrier();
    if (lid < BT) {
      let g = ws_up[ub + OFF_G + lid];
      eg[lid] = exp(g);
      dk[lid] = exp(ws_up[ub + OFF_G + BT - 1u] - g);
    }
    // explicit zeros: lavapipe was seen to keep a loop-body array's values from the previous iteration
    var aw: array<f32, NT>;
    var aq: array<f32, NT>;
    for (var m = 0u; m < NT; m++) {
      aw[m] = 0.0;
      aq[m] = 0.0;
    }
    for (var i4 = 0u; i4 < D4; i4++) {
      let s4 = st[jl * SP + i4];
      for (var m = 0u; m < NT; m++) {
        let t = tq + TQ * m;
        aw[m] += dot(ws_qkw[qb + OFF_W4 + t * D4 + i4], s4);
        aq[m] += dot(ws_qkw[qb + t * D4 + i4], s4);
      }
    }
    for (var m = 0u; m < NT; m++) {
      let t = tq + TQ * m;
      vp[t * BJ + jl] = ws_up[ub + t * D_V + j0 + jl] - aw[m];
    }
    workgroupBarrier();

    for (var m = 0u; m < NT; m++) {
      let t = tq + TQ * m;
      var o = eg[t] * aq[m];
      for (var s = 0u; s <= t; s++) {
        o += ws_up[ub + OFF_P + t * BT + s] * vp[s * BJ + jl];
      }
      if (c * BT + t < n) {
        y[(c * BT + t) * Y_W + h * D_V + j0 + jl] = o;
      }
    }
    var acc: array<vec4<f32>, M4>;
    for (var m = 0u; m < M4; m++) { // explicit zeros, as aw and aq
      acc[m] = vec4<f32>(0.0);
    }
    for (var t = 0u; t < BT; t++) {
      let v = vp[t * BJ + jl] * dk[t];
      for (var m = 0u; m < M4; m++) {
        acc[m] += ws_qkw[qb + OFF_K4 + t * D4 + tq + TQ * m] * v;
      }
    }
    let el = eg[BT - 1u];
    for (var m = 0u; m < M4; m++) {
      let i = jl * SP + tq + TQ * m;
      st[i] = el * st[i] + acc[m];
    }
  }
  workgroupBarrier();
  for (var e = lid; e < BJ * D4; e += WG) {
    state[(h * D_V + j0 + e / D4) * D4 + e % D4] = st[(e / D4) * SP + e % D4];
  }
}
