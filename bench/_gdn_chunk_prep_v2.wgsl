// gdn_chunk_prep v2 (bench/gdn_chunk.ts --scan only): prep before phases 1 and 5 left their loop-indexed private
// arrays (conv taps and window, the substitution's column), kept to time the engine's against it; its header as it was.
// gdn_chunk_prep: the state-independent half of the chunked gated DeltaNet prefill (spec qwen3next.md §8.2-§8.4,
// §8.6), for every 64-token block c of a dispatch and v-head h in parallel:
//   conv + SiLU, q̂/√D_K and k̂ (§8.3, §8.4), β and G (cumulative log decay, §8.2), then with
//   M[t][s] = β_t (k̂_t·k̂_s) e^{G_t−G_s} (s < t):  U = (I+M)^{-1} diag(β) V,  W = (I+M)^{-1} diag(β e^G) K,
//   P[t][s] = (q_t·k̂_s) e^{G_t−G_s} (s <= t, 0 above the diagonal)
// into the scratch blocks read by gdn_chunk (the state-dependent scan; algorithm and block layout there).
// Tokens t >= n of the last block are zero rows (k = v = β = g = 0): no-ops in the scan (§8.6 zero padding).
//
// Bindings (f32 unless noted; ne innermost first; the first seven as in gdn_step.wgsl):
//   0 params    u32 ne=[2]: [pos0, n]
//   1 x_qkv     ne=[C, n]  pre-conv q|k|v, C = 2·N_K·D_K + N_V·D_V
//   2 b         ne=[N_V, n]; BA_GROUPED: ne=[2·N_V, n] (raw ssm_ba)
//   3 a         ne=[N_V, n] from word A_OFF; BA_GROUPED: the same buffer as b
//   4 conv_w    ne=[K_CONV, C]
//   5 dt_bias   ne=[N_V]
//   6 ssm_a     ne=[N_V]
//   7 conv_ring ne=[C, K_CONV]  read only here: slots of positions pos0-K_CONV+1 .. pos0-1
//   8 ws_qkw    ne=[QKW_BLK, N_V, NB] scratch (NB = ceil(n/64) blocks), written: block (c, h) at (c·N_V + h)·QKW_BLK
//   9 ws_up     ne=[UP_BLK, N_V, NB] scratch, written, same block order
//
// Constants (as gdn_step): N_K, N_V, D_K, D_V, K_CONV: u32; EPS: f32; KAPPA_TILED, BA_GROUPED: bool; A_OFF: u32.
// Limits: N_V % N_K == 0; D_K % 64 == 0, D_K <= 256; D_V % 16 == 0, D_V <= 128 (the twin checks them).
// Workgroup storage: 16.8 KiB (M is 64×64 f32).
//
// Grid (N_V, ceil(maxTokens/64), 1); a workgroup (h, c) with 64·c >= n returns at once. Phases, each ending in
// a barrier (the block's scratch is also the workgroup's working memory, hence storageBarrier):
//   1 conv: an invocation owns a local channel (q, k of κ(h), v of h) for the 64 tokens, window in registers;
//     β, g of token lid into workgroup memory.
//   2 L2 norms: invocation 2t+w sums the squares of q (w = 0) or k (w = 1) of token t; the prefix sum of g.
//   3 q and k scaled in place.
//   4 a 4×4 tile of (t, s) per invocation: k̂_t·k̂_s and q_t·k̂_s → M (workgroup) and P (scratch), over key
//     slices of 32 staged in workgroup memory (M's array) by coalesced loads; the tile in named vec4s.
//   5 forward substitution (I+M) x = rhs, one column of [U | W] per invocation (D_V + D_K columns), in vec4
//     steps over the column held in a private array.

@group(0) @binding(0) var<storage, read> params: array<u32>;
@group(0) @binding(1) var<storage, read> x_qkv: array<f32>;
@group(0) @binding(2) var<storage, read> b: array<f32>;
@group(0) @binding(3) var<storage, read> a: array<f32>;
@group(0) @binding(4) var<storage, read> conv_w: array<f32>;
@group(0) @binding(5) var<storage, read> dt_bias: array<f32>;
@group(0) @binding(6) var<storage, read> ssm_a: array<f32>;
@group(0) @binding(7) var<storage, read> conv_ring: array<f32>;
@group(0) @binding(8) var<storage, read_write> ws_qkw: array<f32>;
@group(0) @binding(9) var<storage, read_write> ws_up: array<f32>;

const BT: u32 = 64u; // tokens per block (spec §8.6 chunk)
const WG: u32 = 256u;
const R: u32 = N_V / N_K;
const C_CH: u32 = 2u * N_K * D_K + N_V * D_V;
const LOC_CH: u32 = 2u * D_K + D_V;
// Block layouts (words), shared with gdn_chunk.wgsl and the twin:
//   ws_qkw: Q [BT][D_K] (q̂/√D_K) | K [BT][D_K] (k̂) | W [BT][D_K]
//   ws_up:  U [BT][D_V] | P [BT][BT] | G [BT]
const QKW_BLK: u32 = 3u * BT * D_K;
const OFF_K: u32 = BT * D_K;
const OFF_W: u32 = 2u * BT * D_K;
const UP_BLK: u32 = BT * D_V + BT * BT + BT;
const OFF_P: u32 = BT * D_V;
const OFF_G: u32 = BT * D_V + BT * BT;

// M[t][4·s4 .. 4·s4+3] at t·16 + s4 (zero for s >= t); in phase 4 first the staging of 32-wide key slices
// of K (vec4 t·8 + i) and Q (vec4 512 + t·8 + i)
var<workgroup> ms: array<vec4<f32>, BT * BT / 4u>;
var<workgroup> beta_s: array<f32, BT>;
var<workgroup> g_s: array<f32, BT>; // g, then (phase 2) the cumulative G
var<workgroup> rn: array<f32, 2u * BT>; // [2t]: 1/(max(‖q_t‖, ε)·√D_K), [2t+1]: 1/max(‖k_t‖, ε)


// x ← (I+M)^{-1} x by forward substitution, M strictly lower triangular in `ms`; x[t4][r] is row 4·t4 + r
// (vec4 steps: a quarter of the dependent loads of a scalar loop).
fn substitute(x: ptr<function, array<vec4<f32>, BT / 4u>>) {
  for (var t = 1u; t < BT; t++) {
    let t4 = t / 4u;
    var acc = vec4<f32>(0.0);
    for (var s4 = 0u; s4 < t4; s4++) {
      acc += ms[t * (BT / 4u) + s4] * (*x)[s4];
    }
    let mrow = ms[t * (BT / 4u) + t4];
    var v = (*x)[t4][t % 4u] - (acc.x + acc.y + acc.z + acc.w);
    for (var r = 0u; r < t % 4u; r++) {
      v -= mrow[r] * (*x)[t4][r];
    }
    (*x)[t4][t % 4u] = v;
  }
}

// Row t of M (into ms) and of P (into the block at ub) for keys 4·st .. 4·st+3, from kk[b] = k̂_t·k̂_{4st+b} and
// qk[b] = q_t·k̂_{4st+b}; zeros above the diagonal.
fn emit_mp(t: u32, st: u32, ub: u32, kk: vec4<f32>, qk: vec4<f32>) {
  var mv = vec4<f32>(0.0);
  var pv = vec4<f32>(0.0);
  for (var f = 0u; f < 4u; f++) {
    let s = 4u * st + f;
    if (s <= t) {
      let dec = exp(g_s[t] - g_s[s]);
      pv[f] = qk[f] * dec;
      if (s < t) {
        mv[f] = beta_s[t] * kk[f] * dec;
      }
    }
    ws_up[ub + OFF_P + t * BT + s] = pv[f];
  }
  ms[t * (BT / 4u) + st] = mv;
}

fn load4(i: u32) -> vec4<f32> {
  return vec4<f32>(ws_qkw[i], ws_qkw[i + 1u], ws_qkw[i + 2u], ws_qkw[i + 3u]);
}

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
  let h = wid.x;
  let c = wid.y;
  let pos0 = params[0];
  let n = params[1];
  let t0 = c * BT;
  if (t0 >= n) {
    return;
  }
  let nt = min(BT, n - t0);
  var g = h / R;
  if (KAPPA_TILED) {
    g = h % N_K;
  }
  var a_off = A_OFF;
  if (BA_GROUPED) {
    a_off = R;
  }
  let qb = (c * N_V + h) * QKW_BLK;
  let ub = (c * N_V + h) * UP_BLK;

  // 1: gates and conv
  if (lid < BT) {
    var bt = 0.0;
    var gt = 0.0;
    if (lid < nt) {
      let bi = gdn_ba_index(t0 + lid, h);
      bt = 1.0 / (1.0 + exp(-b[bi]));
      gt = ssm_a[h] * gdn_softplus(a[bi + a_off] + dt_bias[h]);
    }
    beta_s[lid] = bt;
    g_s[lid] = gt;
  }
  for (var lc = lid; lc < LOC_CH; lc += WG) {
    let ch = gdn_channel(lc, g, h);
    var taps: array<f32, K_CONV>;
    var win: array<f32, K_CONV>; // win[k]: input at tap k of the current token's window
    for (var k = 0u; k < K_CONV; k++) {
      taps[k] = conv_w[ch * K_CONV + k];
    }
    // tap k < K-1 of token t0 is dispatch token t0 + k - (K-1); before token 0 it is position
    // pos0 + t0 + k + 1 - K, in ring slot (pos0 + t0 + k + 1) mod K
    for (var k = 0u; k + 1u < K_CONV; k++) {
      if (t0 + k + 1u >= K_CONV) {
        win[k] = x_qkv[(t0 + k + 1u - K_CONV) * C_CH + ch];
      } else {
        win[k] = conv_ring[((pos0 + t0 + k + 1u) % K_CONV) * C_CH + ch];
      }
    }
    var dst = ub + (lc - 2u * D_K);
    var stride = D_V;
    if (lc < D_K) {
      dst = qb + lc;
      stride = D_K;
    } else if (lc < 2u * D_K) {
      dst = qb + OFF_K + (lc - D_K);
      stride = D_K;
    }
    for (var t = 0u; t < BT; t++) {
      var yv = 0.0;
      if (t < nt) {
        win[K_CONV - 1u] = x_qkv[(t0 + t) * C_CH + ch];
        var acc = 0.0;
        for (var k = 0u; k < K_CONV; k++) {
          acc += taps[k] * win[k];
        }
        for (var k = 0u; k + 1u < K_CONV; k++) {
          win[k] = win[k + 1u];
        }
        yv = acc / (1.0 + exp(-acc));
      }
      if (lc < 2u * D_K) {
        ws_qkw[dst + t * stride] = yv;
      } else {
        ws_up[dst + t * stride] = yv;
      }
    }
  }
  storageBarrier();
  workgroupBarrier();

  // 2: norms (§8.4) and the cumulative log decay
  if (lid < 2u * BT) {
    let t = lid / 2u;
    let w = lid % 2u;
    let base = qb + w * OFF_K + t * D_K;
    var ss = 0.0;
    for (var i = 0u; i < D_K; i += 4u) {
      let x = load4(base + i);
      ss += dot(x, x);
    }
    var r = 1.0 / max(sqrt(ss), EPS);
    if (w == 0u) {
      r = r / sqrt(f32(D_K));
    }
    rn[lid] = r;
  } else if (lid == 2u * BT) {
    var acc = 0.0;
    for (var t = 0u; t < BT; t++) {
      acc += g_s[t];
      g_s[t] = acc;
      ws_up[ub + OFF_G + t] = acc;
    }
  }
  workgroupBarrier();

  // 3: scale q and k in place
  for (var e = lid; e < 2u * BT * D_K; e += WG) {
    let w = e / (BT * D_K);
    let t = (e % (BT * D_K)) / D_K;
    ws_qkw[qb + e] *= rn[2u * t + w];
  }
  storageBarrier();
  workgroupBarrier();

  // 4: M and P over 4×4 tiles of (t, s); tiles above the diagonal only write zeros. Key slices of 32 are
  // staged in `ms` by coalesced loads (the dots from global memory were latency-bound).
  let tt = lid / 16u;
  let st = lid % 16u;
  // kk_e[b] = k̂_{4tt+e} · k̂_{4st+b}, qk_e[b] = q_{4tt+e} · k̂_{4st+b}: named vec4s (a private array indexed by a
  // loop counter lives in local memory on the H200, docs/PERF.md); x·ks gives the four dots with ks's columns
  var kk0 = vec4<f32>(0.0);
  var kk1 = vec4<f32>(0.0);
  var kk2 = vec4<f32>(0.0);
  var kk3 = vec4<f32>(0.0);
  var qk0 = vec4<f32>(0.0);
  var qk1 = vec4<f32>(0.0);
  var qk2 = vec4<f32>(0.0);
  var qk3 = vec4<f32>(0.0);
  for (var i0 = 0u; i0 < D_K; i0 += 32u) {
    for (var e = lid; e < BT * 8u; e += WG) {
      let at = (e / 8u) * D_K + i0 + 4u * (e % 8u);
      ms[e] = load4(qb + OFF_K + at);
      ms[BT * 8u + e] = load4(qb + at);
    }
    workgroupBarrier();
    if (st <= tt) {
      for (var i = 0u; i < 8u; i++) {
        let sb = 4u * st * 8u + i;
        let ks = mat4x4<f32>(ms[sb], ms[sb + 8u], ms[sb + 16u], ms[sb + 24u]);
        let tb = 4u * tt * 8u + i;
        kk0 += ms[tb] * ks;
        kk1 += ms[tb + 8u] * ks;
        kk2 += ms[tb + 16u] * ks;
        kk3 += ms[tb + 24u] * ks;
        qk0 += ms[BT * 8u + tb] * ks;
        qk1 += ms[BT * 8u + tb + 8u] * ks;
        qk2 += ms[BT * 8u + tb + 16u] * ks;
        qk3 += ms[BT * 8u + tb + 24u] * ks;
      }
    }
    workgroupBarrier();
  }
  emit_mp(4u * tt, st, ub, kk0, qk0);
  emit_mp(4u * tt + 1u, st, ub, kk1, qk1);
  emit_mp(4u * tt + 2u, st, ub, kk2, qk2);
  emit_mp(4u * tt + 3u, st, ub, kk3, qk3);
  workgroupBarrier();

  // 5: U = (I+M)^{-1} diag(β) V in place of V, W = (I+M)^{-1} diag(β e^G) K
  for (var col = lid; col < D_V + D_K; col += WG) {
    var x: array<vec4<f32>, BT / 4u>;
    if (col < D_V) {
      for (var t = 0u; t < BT; t++) {
        x[t / 4u][t % 4u] = beta_s[t] * ws_up[ub + t * D_V + col];
      }
      substitute(&x);
      for (var t = 0u; t < BT; t++) {
        ws_up[ub + t * D_V + col] = x[t / 4u][t % 4u];
      }
    } else {
      let i = col - D_V;
      for (var t = 0u; t < BT; t++) {
        x[t / 4u][t % 4u] = beta_s[t] * exp(g_s[t]) * ws_qkw[qb + OFF_K + t * D_K + i];
      }
      substitute(&x);
      for (var t = 0u; t < BT; t++) {
        ws_qkw[qb + OFF_W + t * D_K + i] = x[t / 4u][t % 4u];
      }
    }
  }
}
