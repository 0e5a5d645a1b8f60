// gdn_step: n tokens of one gated DeltaNet layer (spec qwen3next.md §8.2-§8.5, §8.7), one sequence, in order:
//   per v-head h and token t:  ô_h,t = RMSNorm(o_h,t, ssm_norm) ⊙ silu(z_h,t)  with o from the recurrence §8.5
// Decode is n = 1; prefill is the same code over n tokens, so a prefill of n equals n decode steps bit for bit.
// Columns (grid z): a batched decode step runs one token of each of several sequences in one dispatch; column c
// runs exactly the code of a dispatch of its own, on its own slices of every binding (so its bits are a solo
// step's). Its params are words c·P_COL.. of params: [pos0, n, slot] (P_COL = 0: one column, [pos0, n], slot 0);
// its x_qkv at word c·X_COL, its z at word c·Z_COL, its y at token c (n must be 1 when there are several
// columns), its b and a at word c·BA_COL, its conv ring at word slot·RING_COL and its state at word slot·STATE_COL of
// the pooled state buffers (all slots of the layer, 256-byte strides).
//
// Bindings (f32 unless noted; ne innermost first; t = token of this dispatch, 0 <= t < n):
//   0 params    u32 ne=[2]: [pos0 (position of token 0), n (token count, >= 1)]
//   1 x_qkv     ne=[C, n]  pre-conv in-projection output, C = 2·N_K·D_K + N_V·D_V, canonical order q|k|v
//   2 z         ne=[N_V·D_V, n]  gate input of the gated norm
//   3 b         ne=[N_V, n] (β logits); BA_GROUPED: ne=[2·N_V, n], the raw qwen3next ssm_ba output U
//   4 a         ne=[N_V, n] (α logits); BA_GROUPED: the same U as b (bind the buffer twice)
//   5 conv_w    ne=[K_CONV, C]  ssm_conv1d: W[ch][k] = conv_w[k + K_CONV·ch], tap K_CONV-1 = current token
//   6 dt_bias   ne=[N_V]   ssm_dt.bias
//   7 ssm_a     ne=[N_V]   ssm_a (= -exp(A_log), negative)
//   8 norm_w    ne=[D_V]   ssm_norm.weight, shared by all heads
//   9 conv_ring ne=[C, K_CONV] read_write: slot s = pos mod K_CONV holds the pre-conv x_qkv of that position.
//                 Reads: slots of pos0-K_CONV+1 .. pos0-1 (zero for a fresh sequence: the engine clears it).
//                 Writes: only when n == 1, slot pos0 mod K_CONV (read by no one in this step); for n > 1 run
//                 gdn_conv_ring after this dispatch. Each q/k channel has one writer workgroup (see below).
//  10 state     ne=[D_K, D_V, N_V] read_write, transposed: state[(h·D_V + j)·D_K + i] = S_h[i][j] (spec §8.5)
//  11 y         ne=[N_V·D_V, n]  ô, v-heads in file order (input of ssm_out)
//
// Constants: N_K, N_V, D_K, D_V, K_CONV: u32; EPS: f32 (RMS eps, also the L2-norm floor);
//   KAPPA_TILED: bool (true: κ(h) = h mod N_K, qwen35moe; false: κ(h) = floor(h / (N_V/N_K)), qwen3next, §9);
//   BA_GROUPED: bool (true: b[h] = U[2r·floor(h/r) + h mod r], a[h] = U[2r·floor(h/r) + r + h mod r], §8.1).
//   SPLIT: u32 (workgroups per v-head, each owning D_V / SPLIT state columns; > 1 writes o before the gated norm
//   to y, and gdn_chunk_norm must run after this dispatch);
//   A_OFF: u32 (not BA_GROUPED: a[h] of token t at word t·N_V + h + A_OFF of its binding; 0 for a buffer of its own,
//   N_V for a decode whose a follows b in one buffer bound twice; 0 when BA_GROUPED).
//   P_COL, X_COL, Z_COL, BA_COL, RING_COL, STATE_COL: u32 (column strides above, in words; all 0 for one column;
//   one stride S for x_qkv, z, b and a reads one in-projection output [qkv | z | b | a] per column, S words apart);
//   T_COL: u32 (words between the tokens of one column's x_qkv, z, b and a: the same fused [qkv | z | b | a]
//   output per token, T_COL words apart; 0: each binding's tokens back to back, as ne says).
// Limits: STATE_COL % 4 == 0; N_V % N_K == 0; D_K % 64 == 0, D_K <= 256; D_V % (16·SPLIT) == 0, D_V <= 128 (workgroup storage, ~21 KiB at
// D_K = D_V = 128, stays under lavapipe's 32 KiB); 1 <= K_CONV <= 4 (taps and window are vec4s).
//
// Grid (N_V, SPLIT, columns): workgroup (h, s, c) owns, in column c, columns s·D_V/SPLIT.. of v-head h's state for all n tokens (a
// column's recurrence needs no other column; only the gated norm spans the head, hence gdn_chunk_norm after
// a split step). With SPLIT = 1 the norm runs here. It computes the conv + SiLU of its key head's 2·D_K q/k
// channels (repeated by the r workgroups sharing κ(h); the one with h mod r == 0, or h < N_K when tiled, and
// s == 0, writes their ring slot) and of its D_V v channels; local channel lc = lid + 256·i is owned by one
// invocation for all tokens, which keeps its taps and conv window in registers. Invocation (il = lid % 16,
// jg = lid / 16) holds S_h columns j = j0 + jg + 16·c (c < D_V/(16·SPLIT), j0 the workgroup's first), rows i
// in the vec4s il + 16·m (m < D_K/64),
// in registers for the whole token loop; dots over i are summed across the 16 lanes in workgroup memory.
// Registers are named (state column groups s0..s7 of S4 vec4s, channels ch0..ch2, k̂ and q̂ as S4), never
// function-scope arrays indexed by loop counters, which the H200 keeps in local memory (2-3x slower, docs/PERF.md);
// the parts the constants leave unused sit behind constant `if`s and compile away (limits: NJ = D_V/(16·SPLIT)
// <= 8, M4 = D_K/64 <= 4, NCH = ceil((2·D_K + D_V)/256) <= 3). Each sum keeps the order of the loops it replaced.
// The next token's inputs are loaded while the current one is processed (global latency off the chain).
// Recurrence per token: one pass reads u = S_oldᵀk̂ and w = S_oldᵀq, then δ = β(v − decay·u),
// o = decay·w + δ·(k̂·q), S = decay·S_old + k̂δᵀ: algebraically spec §8.5's order (decay, read, delta, write,
// read after the write), as in llama.cpp's fused kernel; it saves one reduction round per token.

@group(0) @binding(0) var<storage, read> params: array<u32>;
@group(0) @binding(1) var<storage, read> x_qkv: array<f32>;
@group(0) @binding(2) var<storage, read> z: array<f32>;
@group(0) @binding(3) var<storage, read> b: array<f32>;
@group(0) @binding(4) var<storage, read> a: array<f32>;
@group(0) @binding(5) var<storage, read> conv_w: array<f32>;
@group(0) @binding(6) var<storage, read> dt_bias: array<f32>;
@group(0) @binding(7) var<storage, read> ssm_a: array<f32>;
@group(0) @binding(8) var<storage, read> norm_w: array<f32>;
@group(0) @binding(9) var<storage, read_write> conv_ring: array<f32>;
@group(0) @binding(10) var<storage, read_write> state: array<vec4<f32>>;
@group(0) @binding(11) var<storage, read_write> y: array<f32>;

const WG: u32 = 256u;
const LANES: u32 = 16u;
const JG: u32 = WG / LANES;
const COLS: u32 = D_V / SPLIT; // state columns (v channels) of one workgroup
const NJ: u32 = COLS / JG;
const M4: u32 = D_K / (4u * LANES);
const R: u32 = N_V / N_K;
const C_CH: u32 = 2u * N_K * D_K + N_V * D_V;
const Y_W: u32 = N_V * D_V;
// Words between tokens of x_qkv, z and b/a: T_COL (a fused in-projection output per token) or packed.
const X_T: u32 = select(C_CH, T_COL, T_COL > 0u);
const Z_T: u32 = select(Y_W, T_COL, T_COL > 0u);
const BA_T: u32 = select(select(N_V, 2u * N_V, BA_GROUPED), T_COL, T_COL > 0u);
const LOC_CH: u32 = 2u * D_K + D_V;
const RED_W: u32 = COLS + 1u; // padded row of the lane partials: spreads the lanes over memory banks
const NCH: u32 = (LOC_CH + WG - 1u) / WG; // local channels per invocation

var<workgroup> qs: array<f32, D_K>;
var<workgroup> ks: array<f32, D_K>;
var<workgroup> vs: array<f32, D_V>;
var<workgroup> delta: array<f32, D_V>;
var<workgroup> red: array<vec2<f32>, LANES * RED_W>;
var<workgroup> red_kq: array<f32, LANES>;
var<workgroup> sum_a: array<vec2<f32>, WG>;
var<workgroup> sum_b: array<vec2<f32>, 16>;

// Sum of v over the workgroup, returned to every invocation. Two barriers; safe to call back to back: sum_a
// is rewritten only after all its readers passed the second barrier, sum_b only after the next first one.
fn wg_sum(v: vec2<f32>, lid: u32) -> vec2<f32> {
  sum_a[lid] = v;
  workgroupBarrier();
  if (lid < 16u) {
    var s = vec2<f32>(0.0);
    for (var i = 0u; i < 16u; i++) {
      s += sum_a[i * 16u + lid];
    }
    sum_b[lid] = s;
  }
  workgroupBarrier();
  var t = vec2<f32>(0.0);
  for (var i = 0u; i < 16u; i++) {
    t += sum_b[i];
  }
  return t;
}

// The M4 <= 4 vec4s of one lane in one state column (rows 4·(il + 16·m)..), or of k̂ or q̂ at those rows.
struct S4 {
  m0: vec4<f32>,
  m1: vec4<f32>,
  m2: vec4<f32>,
  m3: vec4<f32>,
}

// One local conv channel of an invocation: its global channel, taps and window (component k = tap k, k < K_CONV;
// tap K_CONV-1 is the current token), and the next token's input.
struct Ch {
  ch: u32,
  tp: vec4<f32>,
  w: vec4<f32>,
  xn: f32,
}

fn st_load(row: u32) -> S4 {
  var s: S4;
  s.m0 = state[row];
  if (M4 > 1u) {
    s.m1 = state[row + LANES];
  }
  if (M4 > 2u) {
    s.m2 = state[row + 2u * LANES];
  }
  if (M4 > 3u) {
    s.m3 = state[row + 3u * LANES];
  }
  return s;
}

fn st_store(row: u32, s: S4) {
  state[row] = s.m0;
  if (M4 > 1u) {
    state[row + LANES] = s.m1;
  }
  if (M4 > 2u) {
    state[row + 2u * LANES] = s.m2;
  }
  if (M4 > 3u) {
    state[row + 3u * LANES] = s.m3;
  }
}

// This lane's partials of u = S_oldᵀk̂ and w = S_oldᵀq in one column, summed over m in order.
fn st_uw(s: S4, k4: S4, q4: S4) -> vec2<f32> {
  var uw = vec2<f32>(0.0);
  uw += vec2<f32>(dot(s.m0, k4.m0), dot(s.m0, q4.m0));
  if (M4 > 1u) {
    uw += vec2<f32>(dot(s.m1, k4.m1), dot(s.m1, q4.m1));
  }
  if (M4 > 2u) {
    uw += vec2<f32>(dot(s.m2, k4.m2), dot(s.m2, q4.m2));
  }
  if (M4 > 3u) {
    uw += vec2<f32>(dot(s.m3, k4.m3), dot(s.m3, q4.m3));
  }
  return uw;
}

// S = decay·S_old + k̂δᵀ in one column (δ = d).
fn st_next(s: S4, k4: S4, decay: f32, d: f32) -> S4 {
  var r = s;
  r.m0 = decay * s.m0 + k4.m0 * d;
  if (M4 > 1u) {
    r.m1 = decay * s.m1 + k4.m1 * d;
  }
  if (M4 > 2u) {
    r.m2 = decay * s.m2 + k4.m2 * d;
  }
  if (M4 > 3u) {
    r.m3 = decay * s.m3 + k4.m3 * d;
  }
  return r;
}

fn ks4(i: u32) -> vec4<f32> {
  return vec4<f32>(ks[i], ks[i + 1u], ks[i + 2u], ks[i + 3u]);
}

fn qs4(i: u32) -> vec4<f32> {
  return vec4<f32>(qs[i], qs[i + 1u], qs[i + 2u], qs[i + 3u]);
}

// Local channel lc's global channel, taps and window before token 0 (tap k < K-1 of token 0 is position
// pos0 - (K-1) + k, in ring slot (pos0 + k + 1) mod K), and token 0's input.
fn ch_load(lc: u32, g: u32, h: u32, xb: u32, rb: u32, pos0: u32) -> Ch {
  var c: Ch;
  let ch = gdn_channel(lc, g, h);
  c.ch = ch;
  let tw = ch * K_CONV;
  let rs = rb + ch;
  c.tp.x = conv_w[tw];
  if (K_CONV > 1u) {
    c.tp.y = conv_w[tw + 1u];
    c.w.x = conv_ring[rs + ((pos0 + 1u) % K_CONV) * C_CH];
  }
  if (K_CONV > 2u) {
    c.tp.z = conv_w[tw + 2u];
    c.w.y = conv_ring[rs + ((pos0 + 2u) % K_CONV) * C_CH];
  }
  if (K_CONV > 3u) {
    c.tp.w = conv_w[tw + 3u];
    c.w.z = conv_ring[rs + ((pos0 + 3u) % K_CONV) * C_CH];
  }
  c.xn = x_qkv[xb + ch];
  return c;
}

// §8.3 conv + SiLU of local channel lc on the current token's input xc, then the window slides by one token;
// publishes the output to qs, ks or vs, writes xc to the ring slot at ring (a word index) when `ring_on`, and
// returns sq with its square added to the q (x) or k (y) sum.
fn ch_step(c: ptr<function, Ch>, lc: u32, xc: f32, sq: vec2<f32>, ring: u32, ring_on: bool) -> vec2<f32> {
  var w = (*c).w;
  let tp = (*c).tp;
  if (K_CONV == 1u) {
    w.x = xc;
  } else if (K_CONV == 2u) {
    w.y = xc;
  } else if (K_CONV == 3u) {
    w.z = xc;
  } else {
    w.w = xc;
  }
  var acc = 0.0;
  acc += tp.x * w.x;
  if (K_CONV > 1u) {
    acc += tp.y * w.y;
  }
  if (K_CONV > 2u) {
    acc += tp.z * w.z;
  }
  if (K_CONV > 3u) {
    acc += tp.w * w.w;
  }
  var slid = w;
  if (K_CONV > 1u) {
    slid.x = w.y;
  }
  if (K_CONV > 2u) {
    slid.y = w.z;
  }
  if (K_CONV > 3u) {
    slid.z = w.w;
  }
  (*c).w = slid;
  let yv = acc / (1.0 + exp(-acc));
  var s = sq;
  if (lc < D_K) {
    qs[lc] = yv;
    s.x += yv * yv;
  } else if (lc < 2u * D_K) {
    ks[lc - D_K] = yv;
    s.y += yv * yv;
  } else {
    vs[lc - 2u * D_K] = yv;
  }
  if (ring_on) {
    conv_ring[ring + (*c).ch] = xc;
  }
  return s;
}

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
  let h = wid.x;
  let j0 = wid.y * COLS; // first column of this workgroup
  let col = wid.z;
  let pos0 = params[col * P_COL];
  let n = params[col * P_COL + 1u];
  var slot = 0u;
  if (P_COL > 0u) {
    slot = params[col * P_COL + 2u];
  }
  // Column c's slices: inputs and y from token c, b and a from column c, conv ring and state from the slot's.
  let xb = col * X_COL;
  let zb = col * Z_COL;
  let yb = col * Y_W;
  let bab = col * BA_COL;
  let rb = slot * RING_COL;
  let sb = slot * (STATE_COL / 4u);
  var g = h / R;
  var qk_writer = h % R == 0u;
  if (KAPPA_TILED) {
    g = h % N_K;
    qk_writer = h < N_K;
  }
  let il = lid % LANES;
  let jg = lid / LANES;
  var a_off = A_OFF;
  if (BA_GROUPED) {
    a_off = R;
  }

  // Loads that do not depend on each other, issued together: state, conv taps and window, token 0's inputs.
  // Column group c (state column j0 + jg + JG·c) starts at row0 + c·rstep.
  let row0 = sb + (h * D_V + j0 + jg) * (D_K / 4u) + il;
  let rstep = JG * (D_K / 4u);
  var s0 = st_load(row0);
  var s1: S4;
  var s2: S4;
  var s3: S4;
  var s4: S4;
  var s5: S4;
  var s6: S4;
  var s7: S4;
  if (NJ > 1u) {
    s1 = st_load(row0 + rstep);
  }
  if (NJ > 2u) {
    s2 = st_load(row0 + 2u * rstep);
  }
  if (NJ > 3u) {
    s3 = st_load(row0 + 3u * rstep);
  }
  if (NJ > 4u) {
    s4 = st_load(row0 + 4u * rstep);
  }
  if (NJ > 5u) {
    s5 = st_load(row0 + 5u * rstep);
  }
  if (NJ > 6u) {
    s6 = st_load(row0 + 6u * rstep);
  }
  if (NJ > 7u) {
    s7 = st_load(row0 + 7u * rstep);
  }
  // local channels lid + WG·i (i < NCH), each with its flag
  let on0 = lid < LOC_CH;
  let on1 = NCH > 1u && lid + WG < LOC_CH;
  let on2 = NCH > 2u && lid + 2u * WG < LOC_CH;
  var ch0: Ch;
  var ch1: Ch;
  var ch2: Ch;
  if (on0) {
    ch0 = ch_load(lid, g, h, xb, rb, pos0);
  }
  if (on1) {
    ch1 = ch_load(lid + WG, g, h, xb, rb, pos0);
  }
  if (on2) {
    ch2 = ch_load(lid + 2u * WG, g, h, xb, rb, pos0);
  }
  let dtb = dt_bias[h];
  let sa = ssm_a[h];
  let jo = min(lid, D_V - 1u); // invocations past D_V load a valid element and never use it
  let nw = norm_w[jo];
  let bah = gdn_ba_index(0u, h);
  var bn = b[bab + bah];
  var an = a[bab + bah + a_off];
  var zn = z[zb + h * D_V + jo];

  for (var t = 0u; t < n; t++) {
    let p = pos0 + t;
    let xc0 = ch0.xn;
    let xc1 = ch1.xn;
    let xc2 = ch2.xn;
    let bv = bn;
    let av = an;
    let zc = zn;
    if (t + 1u < n) {
      let xt = xb + (t + 1u) * X_T;
      if (on0) {
        ch0.xn = x_qkv[xt + ch0.ch];
      }
      if (on1) {
        ch1.xn = x_qkv[xt + ch1.ch];
      }
      if (on2) {
        ch2.xn = x_qkv[xt + ch2.ch];
      }
      bn = b[bab + (t + 1u) * BA_T + bah];
      an = a[bab + (t + 1u) * BA_T + bah + a_off];
      zn = z[zb + (t + 1u) * Z_T + h * D_V + jo];
    }

    // §8.3 conv + SiLU; the window then slides by one token. The ring slot of p is written when n == 1 (read by
    // no one in this step), by one workgroup per channel.
    var sq = vec2<f32>(0.0);
    let ring = rb + (p % K_CONV) * C_CH;
    let ring_on = n == 1u && j0 == 0u;
    if (on0) {
      sq = ch_step(&ch0, lid, xc0, sq, ring, ring_on && (lid >= 2u * D_K || qk_writer));
    }
    if (on1) {
      let lc = lid + WG;
      sq = ch_step(&ch1, lc, xc1, sq, ring, ring_on && (lc >= 2u * D_K || qk_writer));
    }
    if (on2) {
      let lc = lid + 2u * WG;
      sq = ch_step(&ch2, lc, xc2, sq, ring, ring_on && (lc >= 2u * D_K || qk_writer));
    }
    // §8.4: q̂ = q/max(‖q‖, ε)/√D_K, k̂ = k/max(‖k‖, ε); folded into the lane's register copies below.
    let ss = wg_sum(sq, lid);
    let rq = 1.0 / (max(sqrt(ss.x), EPS) * sqrt(f32(D_K)));
    let rk = 1.0 / max(sqrt(ss.y), EPS);
    // §8.2 gates
    let beta = 1.0 / (1.0 + exp(-bv));
    let decay = exp(sa * gdn_softplus(av + dtb));

    var k4: S4;
    var q4: S4;
    var kq = 0.0;
    k4.m0 = ks4(4u * il) * rk;
    q4.m0 = qs4(4u * il) * rq;
    kq += dot(k4.m0, q4.m0);
    if (M4 > 1u) {
      let i = 4u * (il + LANES);
      k4.m1 = ks4(i) * rk;
      q4.m1 = qs4(i) * rq;
      kq += dot(k4.m1, q4.m1);
    }
    if (M4 > 2u) {
      let i = 4u * (il + 2u * LANES);
      k4.m2 = ks4(i) * rk;
      q4.m2 = qs4(i) * rq;
      kq += dot(k4.m2, q4.m2);
    }
    if (M4 > 3u) {
      let i = 4u * (il + 3u * LANES);
      k4.m3 = ks4(i) * rk;
      q4.m3 = qs4(i) * rq;
      kq += dot(k4.m3, q4.m3);
    }
    if (jg == 0u) {
      red_kq[il] = kq;
    }
    // lane partials of u = S_oldᵀk̂ and w = S_oldᵀq, column group c at red[il·RED_W + jg + JG·c]
    let rr = il * RED_W + jg;
    red[rr] = st_uw(s0, k4, q4);
    if (NJ > 1u) {
      red[rr + JG] = st_uw(s1, k4, q4);
    }
    if (NJ > 2u) {
      red[rr + 2u * JG] = st_uw(s2, k4, q4);
    }
    if (NJ > 3u) {
      red[rr + 3u * JG] = st_uw(s3, k4, q4);
    }
    if (NJ > 4u) {
      red[rr + 4u * JG] = st_uw(s4, k4, q4);
    }
    if (NJ > 5u) {
      red[rr + 5u * JG] = st_uw(s5, k4, q4);
    }
    if (NJ > 6u) {
      red[rr + 6u * JG] = st_uw(s6, k4, q4);
    }
    if (NJ > 7u) {
      red[rr + 7u * JG] = st_uw(s7, k4, q4);
    }
    workgroupBarrier();
    var o = 0.0;
    if (lid < COLS) {
      var uw = vec2<f32>(0.0);
      var kq_all = 0.0;
      for (var l = 0u; l < LANES; l++) {
        uw += red[l * RED_W + lid];
        kq_all += red_kq[l];
      }
      let d = beta * (vs[j0 + lid] - decay * uw.x);
      delta[lid] = d;
      o = decay * uw.y + d * kq_all;
    }
    if (SPLIT == 1u) {
      // §8.7 gated RMSNorm; the barriers inside also publish delta
      let so = wg_sum(vec2<f32>(o * o, 0.0), lid);
      if (lid < D_V) {
        let inv_rms = 1.0 / sqrt(so.x / f32(D_V) + EPS);
        y[yb + t * Y_W + h * D_V + lid] = o * inv_rms * nw * (zc / (1.0 + exp(-zc)));
      }
    } else {
      // o as it is (gdn_chunk_norm applies §8.7 after this dispatch); the barrier publishes delta
      workgroupBarrier();
      if (lid < COLS) {
        y[yb + t * Y_W + h * D_V + j0 + lid] = o;
      }
    }
    s0 = st_next(s0, k4, decay, delta[jg]);
    if (NJ > 1u) {
      s1 = st_next(s1, k4, decay, delta[jg + JG]);
    }
    if (NJ > 2u) {
      s2 = st_next(s2, k4, decay, delta[jg + 2u * JG]);
    }
    if (NJ > 3u) {
      s3 = st_next(s3, k4, decay, delta[jg + 3u * JG]);
    }
    if (NJ > 4u) {
      s4 = st_next(s4, k4, decay, delta[jg + 4u * JG]);
    }
    if (NJ > 5u) {
      s5 = st_next(s5, k4, decay, delta[jg + 5u * JG]);
    }
    if (NJ > 6u) {
      s6 = st_next(s6, k4, decay, delta[jg + 6u * JG]);
    }
    if (NJ > 7u) {
      s7 = st_next(s7, k4, decay, delta[jg + 7u * JG]);
    }
  }

  st_store(row0, s0);
  if (NJ > 1u) {
    st_store(row0 + rstep, s1);
  }
  if (NJ > 2u) {
    st_store(row0 + 2u * rstep, s2);
  }
  if (NJ > 3u) {
    st_store(row0 + 3u * rstep, s3);
  }
  if (NJ > 4u) {
    st_store(row0 + 4u * rstep, s4);
  }
  if (NJ > 5u) {
    st_store(row0 + 5u * rstep, s5);
  }
  if (NJ > 6u) {
    st_store(row0 + 6u * rstep, s6);
  }
  if (NJ > 7u) {
    st_store(row0 + 7u * rstep, s7);
  }
}
