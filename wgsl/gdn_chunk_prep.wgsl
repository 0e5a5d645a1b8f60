// gdn_chunk_prep: the state-independent half of the chunked gated DeltaNet prefill (spec qwen3next.md §8.2-§8.4,
// §8.6), for every 64-token block c of a dispatch and v-head h in parallel:
//   conv + SiLU, q̂/√D_K and k̂ (§8.3, §8.4), β and G (cumulative log decay, §8.2), then with
//   M[t][s] = β_t (k̂_t·k̂_s) e^{G_t−G_s} (s < t):  U = (I+M)^{-1} diag(β) V,  W = (I+M)^{-1} diag(β e^G) K,
//   P[t][s] = (q_t·k̂_s) e^{G_t−G_s} (s <= t, 0 above the diagonal)
// into the scratch blocks read by gdn_chunk (the state-dependent scan; algorithm and block layout there).
// A block's rows past its last token are zero rows (k = v = β = g = 0): no-ops in the scan (§8.6 zero padding).
//
// Blocks (params word 2 `cut`; gdn_chunk.wgsl's header says what the scan does with it): without a cut
// (cut == 0 or cut >= n) block c covers the dispatch tokens [64·c, min(64·c + 64, n)). With 0 < cut < n the
// runs [0, cut) and [cut, n) are each cut into blocks from their own start: blocks c < nb1 = ceil(cut/64)
// cover [64·c, min(64·c + 64, cut)), blocks c >= nb1 cover [cut + 64·(c − nb1), min(that + 64, n)); NB =
// nb1 + ceil((n − cut)/64) <= ceil(n/64) + 1 blocks. Row i of block c is the token start + i. The conv is in
// dispatch-token coordinates, unaffected by blocks: a window reaching before a block's start reads the
// dispatch's earlier tokens, or the ring before token 0.
//
// Bindings (f32 unless noted; ne innermost first; the first seven as in gdn_step.wgsl):
//   0 params    u32 ne=[3]: [pos0, n, cut]
//   1 x_qkv     ne=[C, n]  pre-conv q|k|v, C = 2·N_K·D_K + N_V·D_V
//   2 b         ne=[N_V, n]; BA_GROUPED: ne=[2·N_V, n] (raw ssm_ba)
//   3 a         ne=[N_V, n] from word A_OFF; BA_GROUPED: the same buffer as b
//   4 conv_w    ne=[K_CONV, C]
//   5 dt_bias   ne=[N_V]
//   6 ssm_a     ne=[N_V]
//   7 conv_ring ne=[C, K_CONV]  read only here: slots of positions pos0-K_CONV+1 .. pos0-1
//   8 ws_qkw    ne=[QKW_BLK, N_V, NB] scratch (NB blocks as above), written: block (c, h) at (c·N_V + h)·QKW_BLK
//   9 ws_up     ne=[UP_BLK, N_V, NB] scratch, written, same block order
//
// Constants (as gdn_step): N_K, N_V, D_K, D_V, K_CONV: u32; EPS: f32; KAPPA_TILED, BA_GROUPED: bool; A_OFF: u32;
// and COMPACT_SOLVE: bool, phase 5's form (below).
// Limits: N_V % N_K == 0; D_K % 64 == 0, D_K <= 256; D_V % 16 == 0, D_V <= 128; K_CONV <= 4 (taps and window in
// one vec4); the twin checks them.
// Workgroup storage: 17.25 KiB (M is 64×64 f32).
//
// Grid (N_V, ceil(maxTokens/64) + 1, 1); a workgroup (h, c) with c >= NB returns at once. Phases, each ending in
// a barrier (the block's scratch is also the workgroup's working memory, hence storageBarrier):
//   1 conv: an invocation owns 16 tokens of a local channel (q, k of κ(h), v of h) per task, 4·LOC_CH tasks;
//     taps and window in vec4s; β, g of token lid into workgroup memory.
//   2 L2 norms: invocation 2t+w sums the squares of q (w = 0) or k (w = 1) of token t; the prefix sum of g.
//   3 q and k scaled in place; β e^G into workgroup memory.
//   4 a 4×4 tile of (t, s) per invocation: k̂_t·k̂_s and q_t·k̂_s → M (workgroup) and P (scratch), over key
//     slices of 32 staged in workgroup memory (M's array) by coalesced loads; the tile in named vec4s.
//   5 forward substitution (I+M) x = rhs, one column of [U | W] per invocation (D_V + D_K columns), held in 16
//     named vec4s (BT = 64 written out): 4×4 blocks of M as mat4x4 from workgroup memory. COMPACT_SOLVE: the
//     same sums in the same order as loops over the row blocks, each solved block read back from where it
//     was written. Written out, LLVM on a CPU adapter (lavapipe) takes about 30 s to compile the kernel at its
//     first dispatch, against under 2 s as loops (docs/PERF.md); the engine takes the loops on CPU adapters.
// Hot per-invocation values are named scalars/vec4s indexed by constants only: a private array indexed by a loop
// counter lives in local memory on the H200 (docs/PERF.md).

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
var<workgroup> beg_s: array<f32, BT>; // β e^G (phase 3)
var<workgroup> rn: array<f32, 2u * BT>; // [2t]: 1/(max(‖q_t‖, ε)·√D_K), [2t+1]: 1/max(‖k_t‖, ε)


// Block (j, i) of M applied to the solved rows y of block i: Σ_s M[4j+r][4i+s]·y[s] in component r (x·mat4x4
// gives the dots with the matrix's columns, here rows 4j..4j+3 of M restricted to block i).
fn mx(j: u32, i: u32, y: vec4<f32>) -> vec4<f32> {
  let at = 4u * j * (BT / 4u) + i;
  return y * mat4x4<f32>(ms[at], ms[at + BT / 4u], ms[at + 2u * (BT / 4u)], ms[at + 3u * (BT / 4u)]);
}

// Forward substitution inside diagonal block j: rows 4j..4j+3 of (I+M) y = v, the terms of the earlier blocks
// already taken off v.
fn solve4(j: u32, v: vec4<f32>) -> vec4<f32> {
  let m1 = ms[(4u * j + 1u) * (BT / 4u) + j];
  let m2 = ms[(4u * j + 2u) * (BT / 4u) + j];
  let m3 = ms[(4u * j + 3u) * (BT / 4u) + j];
  let y0 = v.x;
  let y1 = v.y - m1.x * y0;
  let y2 = v.z - m2.x * y0 - m2.y * y1;
  let y3 = v.w - m3.x * y0 - m3.y * y1 - m3.z * y2;
  return vec4<f32>(y0, y1, y2, y3);
}

// Right-hand side of column col at tokens 4·t4 .. 4·t4+3: β_t·v_t[col] (col < D_V: U) or
// β_t·e^{G_t}·k̂_t[col − D_V] (W).
fn rhs4(t4: u32, col: u32, qb: u32, ub: u32) -> vec4<f32> {
  let t = 4u * t4;
  if (col < D_V) {
    let at = ub + t * D_V + col;
    let s = vec4<f32>(beta_s[t], beta_s[t + 1u], beta_s[t + 2u], beta_s[t + 3u]);
    return s * vec4<f32>(ws_up[at], ws_up[at + D_V], ws_up[at + 2u * D_V], ws_up[at + 3u * D_V]);
  }
  let at = qb + OFF_K + t * D_K + (col - D_V);
  let s = vec4<f32>(beg_s[t], beg_s[t + 1u], beg_s[t + 2u], beg_s[t + 3u]);
  return s * vec4<f32>(ws_qkw[at], ws_qkw[at + D_K], ws_qkw[at + 2u * D_K], ws_qkw[at + 3u * D_K]);
}

// Rows 4·t4 .. 4·t4+3 of column col of U (in place of V) or of W.
fn out4(t4: u32, col: u32, qb: u32, ub: u32, y: vec4<f32>) {
  let t = 4u * t4;
  if (col < D_V) {
    let at = ub + t * D_V + col;
    ws_up[at] = y.x;
    ws_up[at + D_V] = y.y;
    ws_up[at + 2u * D_V] = y.z;
    ws_up[at + 3u * D_V] = y.w;
  } else {
    let at = qb + OFF_W + t * D_K + (col - D_V);
    ws_qkw[at] = y.x;
    ws_qkw[at + D_K] = y.y;
    ws_qkw[at + 2u * D_K] = y.z;
    ws_qkw[at + 3u * D_K] = y.w;
  }
}

// Rows 4·t4 .. 4·t4+3 of column col of U or W as out4 wrote them.
fn in4(t4: u32, col: u32, qb: u32, ub: u32) -> vec4<f32> {
  let t = 4u * t4;
  if (col < D_V) {
    let at = ub + t * D_V + col;
    return vec4<f32>(ws_up[at], ws_up[at + D_V], ws_up[at + 2u * D_V], ws_up[at + 3u * D_V]);
  }
  let at = qb + OFF_W + t * D_K + (col - D_V);
  return vec4<f32>(ws_qkw[at], ws_qkw[at + D_K], ws_qkw[at + 2u * D_K], ws_qkw[at + 3u * D_K]);
}

// Conv tap of channel ch in window component c (tap c + K_CONV − 4: the current token's in component 3; zero
// below tap 0), K_CONV <= 4.
fn conv_tap(ch: u32, c: u32) -> f32 {
  if (c + K_CONV < 4u) {
    return 0.0;
  }
  return conv_w[ch * K_CONV + c + K_CONV - 4u];
}

// Pre-conv input of channel ch at block token t (dispatch token t0 + t); zero from nt on.
fn conv_x(ch: u32, t: u32, t0: u32, nt: u32) -> f32 {
  if (t < nt) {
    return x_qkv[(t0 + t) * C_CH + ch];
  }
  return 0.0;
}

// Window component c (1..3) before block token ts: the input at block token ts + c − 4, zero where no tap reaches
// it (c + K_CONV < 5) or past nt; before dispatch token 0 it is position pos0 + t0 + ts + c − 4, in ring slot
// (pos0 + t0 + ts + c + K_CONV − 4) mod K_CONV (no wrap below 0: c + K_CONV >= 5 there). t0 is the block's first
// dispatch token: the window of a block starting at a cut reads the first run's last inputs (or the ring).
fn conv_hist(ch: u32, c: u32, ts: u32, t0: u32, nt: u32, pos0: u32) -> f32 {
  if (c + K_CONV < 5u || ts + c >= nt + 4u) {
    return 0.0;
  }
  let d = t0 + ts + c;
  if (d >= 4u) {
    return x_qkv[(d - 4u) * C_CH + ch];
  }
  return conv_ring[((pos0 + d + K_CONV - 4u) % K_CONV) * C_CH + ch];
}

// SiLU of the conv of tokens t .. t+3 from the inputs p of tokens t−4 .. t−1 and q of t .. t+3.
fn conv4(taps: vec4<f32>, p: vec4<f32>, q: vec4<f32>) -> vec4<f32> {
  let acc = vec4<f32>(
    dot(taps, vec4<f32>(p.yzw, q.x)),
    dot(taps, vec4<f32>(p.zw, q.xy)),
    dot(taps, vec4<f32>(p.w, q.xyz)),
    dot(taps, q),
  );
  return acc / (1.0 + exp(-acc));
}

// Conv outputs y of local channel lc at block tokens t .. t+3 into Q, K or V, zero from nt on (§8.6 padding).
fn conv_out(lc: u32, t: u32, nt: u32, qb: u32, ub: u32, y: vec4<f32>) {
  let v = select(vec4<f32>(0.0), y, vec4<u32>(t) + vec4<u32>(0u, 1u, 2u, 3u) < vec4<u32>(nt));
  if (lc < 2u * D_K) {
    var at = qb + t * D_K + lc;
    if (lc >= D_K) {
      at = qb + OFF_K + t * D_K + (lc - D_K);
    }
    ws_qkw[at] = v.x;
    ws_qkw[at + D_K] = v.y;
    ws_qkw[at + 2u * D_K] = v.z;
    ws_qkw[at + 3u * D_K] = v.w;
  } else {
    let at = ub + t * D_V + (lc - 2u * D_K);
    ws_up[at] = v.x;
    ws_up[at + D_V] = v.y;
    ws_up[at + 2u * D_V] = v.z;
    ws_up[at + 3u * D_V] = v.w;
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
  // block c: dispatch tokens t0 .. t0 + nt − 1 (the partition in the header; c1 = n without a cut)
  var c1 = n;
  if (params[2] > 0u && params[2] < n) {
    c1 = params[2];
  }
  let nb1 = (c1 + BT - 1u) / BT;
  var t0 = c * BT;
  var t_hi = c1;
  if (c >= nb1) {
    t0 = c1 + (c - nb1) * BT;
    t_hi = n;
  }
  if (t0 >= t_hi) {
    return;
  }
  let nt = min(BT, t_hi - t0);
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
  // 16 tokens of one local channel per task, task = quarter·LOC_CH + lc (neighbours take neighbouring channels:
  // coalesced), 4·LOC_CH tasks over the workgroup; taps and window in vec4s, the 19 loads issued together
  for (var task = lid; task < 4u * LOC_CH; task += WG) {
    let lc = task % LOC_CH;
    let ts = 16u * (task / LOC_CH);
    let ch = gdn_channel(lc, g, h);
    let taps = vec4<f32>(conv_tap(ch, 0u), conv_tap(ch, 1u), conv_tap(ch, 2u), conv_tap(ch, 3u));
    let p = vec4<f32>(
      0.0,
      conv_hist(ch, 1u, ts, t0, nt, pos0),
      conv_hist(ch, 2u, ts, t0, nt, pos0),
      conv_hist(ch, 3u, ts, t0, nt, pos0),
    );
    let q0 = vec4<f32>(conv_x(ch, ts, t0, nt), conv_x(ch, ts + 1u, t0, nt), conv_x(ch, ts + 2u, t0, nt),
      conv_x(ch, ts + 3u, t0, nt));
    let q1 = vec4<f32>(conv_x(ch, ts + 4u, t0, nt), conv_x(ch, ts + 5u, t0, nt), conv_x(ch, ts + 6u, t0, nt),
      conv_x(ch, ts + 7u, t0, nt));
    let q2 = vec4<f32>(conv_x(ch, ts + 8u, t0, nt), conv_x(ch, ts + 9u, t0, nt), conv_x(ch, ts + 10u, t0, nt),
      conv_x(ch, ts + 11u, t0, nt));
    let q3 = vec4<f32>(conv_x(ch, ts + 12u, t0, nt), conv_x(ch, ts + 13u, t0, nt), conv_x(ch, ts + 14u, t0, nt),
      conv_x(ch, ts + 15u, t0, nt));
    conv_out(lc, ts, nt, qb, ub, conv4(taps, p, q0));
    conv_out(lc, ts + 4u, nt, qb, ub, conv4(taps, q0, q1));
    conv_out(lc, ts + 8u, nt, qb, ub, conv4(taps, q1, q2));
    conv_out(lc, ts + 12u, nt, qb, ub, conv4(taps, q2, q3));
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

  // 3: scale q and k in place; β e^G for phase 5
  if (lid < BT) {
    beg_s[lid] = beta_s[lid] * exp(g_s[lid]);
  }
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

  // 5: U = (I+M)^{-1} diag(β) V in place of V, W = (I+M)^{-1} diag(β e^G) K, one column per invocation: the
  // column's 16 row blocks r0..r15 (all 64 loads in flight at once), solved block by block into y0..y15, each
  // block's off-diagonal terms as vec4·mat4x4 (named values only: BT = 64 is written out here)
  if (COMPACT_SOLVE) {
    // Row block j: r_j − (mx(j, 0, y_0) + … + mx(j, j−1, y_{j−1})) summed left to right, as written out below;
    // y_i read back from the column (block j's rows of U overwrite rows of V that no later rhs4 reads)
    for (var col = lid; col < D_V + D_K; col += WG) {
      for (var j = 0u; j < BT / 4u; j++) {
        var r = rhs4(j, col, qb, ub);
        if (j > 0u) {
          var acc = mx(j, 0u, in4(0u, col, qb, ub));
          for (var i = 1u; i < j; i++) {
            acc += mx(j, i, in4(i, col, qb, ub));
          }
          r -= acc;
        }
        out4(j, col, qb, ub, solve4(j, r));
      }
    }
    return;
  }
  for (var col = lid; col < D_V + D_K; col += WG) {
    let r0 = rhs4(0u, col, qb, ub);
    let r1 = rhs4(1u, col, qb, ub);
    let r2 = rhs4(2u, col, qb, ub);
    let r3 = rhs4(3u, col, qb, ub);
    let r4 = rhs4(4u, col, qb, ub);
    let r5 = rhs4(5u, col, qb, ub);
    let r6 = rhs4(6u, col, qb, ub);
    let r7 = rhs4(7u, col, qb, ub);
    let r8 = rhs4(8u, col, qb, ub);
    let r9 = rhs4(9u, col, qb, ub);
    let r10 = rhs4(10u, col, qb, ub);
    let r11 = rhs4(11u, col, qb, ub);
    let r12 = rhs4(12u, col, qb, ub);
    let r13 = rhs4(13u, col, qb, ub);
    let r14 = rhs4(14u, col, qb, ub);
    let r15 = rhs4(15u, col, qb, ub);
    let y0 = solve4(0u, r0);
    out4(0u, col, qb, ub, y0);
    let y1 = solve4(1u, r1 - (mx(1u, 0u, y0)));
    out4(1u, col, qb, ub, y1);
    let y2 = solve4(2u, r2 - (mx(2u, 0u, y0) + mx(2u, 1u, y1)));
    out4(2u, col, qb, ub, y2);
    let y3 = solve4(3u, r3 - (mx(3u, 0u, y0) + mx(3u, 1u, y1) + mx(3u, 2u, y2)));
    out4(3u, col, qb, ub, y3);
    let y4 = solve4(4u, r4 - (mx(4u, 0u, y0) + mx(4u, 1u, y1) + mx(4u, 2u, y2) + mx(4u, 3u, y3)));
    out4(4u, col, qb, ub, y4);
    let y5 = solve4(5u, r5 - (mx(5u, 0u, y0) + mx(5u, 1u, y1) + mx(5u, 2u, y2) + mx(5u, 3u, y3) + mx(5u, 4u, y4)));
    out4(5u, col, qb, ub, y5);
    let y6 = solve4(6u, r6 - (mx(6u, 0u, y0) + mx(6u, 1u, y1) + mx(6u, 2u, y2) + mx(6u, 3u, y3) + mx(6u, 4u, y4) +
      mx(6u, 5u, y5)));
    out4(6u, col, qb, ub, y6);
    let y7 = solve4(7u, r7 - (mx(7u, 0u, y0) + mx(7u, 1u, y1) + mx(7u, 2u, y2) + mx(7u, 3u, y3) + mx(7u, 4u, y4) +
      mx(7u, 5u, y5) + mx(7u, 6u, y6)));
    out4(7u, col, qb, ub, y7);
    let y8 = solve4(8u, r8 - (mx(8u, 0u, y0) + mx(8u, 1u, y1) + mx(8u, 2u, y2) + mx(8u, 3u, y3) + mx(8u, 4u, y4) +
      mx(8u, 5u, y5) + mx(8u, 6u, y6) + mx(8u, 7u, y7)));
    out4(8u, col, qb, ub, y8);
    let y9 = solve4(9u, r9 - (mx(9u, 0u, y0) + mx(9u, 1u, y1) + mx(9u, 2u, y2) + mx(9u, 3u, y3) + mx(9u, 4u, y4) +
      mx(9u, 5u, y5) + mx(9u, 6u, y6) + mx(9u, 7u, y7) + mx(9u, 8u, y8)));
    out4(9u, col, qb, ub, y9);
    let y10 = solve4(10u, r10 - (mx(10u, 0u, y0) + mx(10u, 1u, y1) + mx(10u, 2u, y2) + mx(10u, 3u, y3) +
      mx(10u, 4u, y4) + mx(10u, 5u, y5) + mx(10u, 6u, y6) + mx(10u, 7u, y7) + mx(10u, 8u, y8) + mx(10u, 9u, y9)));
    out4(10u, col, qb, ub, y10);
    let y11 = solve4(11u, r11 - (mx(11u, 0u, y0) + mx(11u, 1u, y1) + mx(11u, 2u, y2) + mx(11u, 3u, y3) +
      mx(11u, 4u, y4) + mx(11u, 5u, y5) + mx(11u, 6u, y6) + mx(11u, 7u, y7) + mx(11u, 8u, y8) + mx(11u, 9u, y9) +
      mx(11u, 10u, y10)));
    out4(11u, col, qb, ub, y11);
    let y12 = solve4(12u, r12 - (mx(12u, 0u, y0) + mx(12u, 1u, y1) + mx(12u, 2u, y2) + mx(12u, 3u, y3) +
      mx(12u, 4u, y4) + mx(12u, 5u, y5) + mx(12u, 6u, y6) + mx(12u, 7u, y7) + mx(12u, 8u, y8) + mx(12u, 9u, y9) +
      mx(12u, 10u, y10) + mx(12u, 11u, y11)));
    out4(12u, col, qb, ub, y12);
    let y13 = solve4(13u, r13 - (mx(13u, 0u, y0) + mx(13u, 1u, y1) + mx(13u, 2u, y2) + mx(13u, 3u, y3) +
      mx(13u, 4u, y4) + mx(13u, 5u, y5) + mx(13u, 6u, y6) + mx(13u, 7u, y7) + mx(13u, 8u, y8) + mx(13u, 9u, y9) +
      mx(13u, 10u, y10) + mx(13u, 11u, y11) + mx(13u, 12u, y12)));
    out4(13u, col, qb, ub, y13);
    let y14 = solve4(14u, r14 - (mx(14u, 0u, y0) + mx(14u, 1u, y1) + mx(14u, 2u, y2) + mx(14u, 3u, y3) +
      mx(14u, 4u, y4) + mx(14u, 5u, y5) + mx(14u, 6u, y6) + mx(14u, 7u, y7) + mx(14u, 8u, y8) + mx(14u, 9u, y9) +
      mx(14u, 10u, y10) + mx(14u, 11u, y11) + mx(14u, 12u, y12) + mx(14u, 13u, y13)));
    out4(14u, col, qb, ub, y14);
    let y15 = solve4(15u, r15 - (mx(15u, 0u, y0) + mx(15u, 1u, y1) + mx(15u, 2u, y2) + mx(15u, 3u, y3) +
      mx(15u, 4u, y4) + mx(15u, 5u, y5) + mx(15u, 6u, y6) + mx(15u, 7u, y7) + mx(15u, 8u, y8) + mx(15u, 9u, y9) +
      mx(15u, 10u, y10) + mx(15u, 11u, y11) + mx(15u, 12u, y12) + mx(15u, 13u, y13) + mx(15u, 14u, y14)));
    out4(15u, col, qb, ub, y15);
  }
}
