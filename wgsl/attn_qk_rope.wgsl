// Attention prologue for nTok tokens at positions p = pos0 + t (spec §7 steps 3-5):
//   q_out[t][h] = rope(RMSNorm(q_h, q_norm), p);  k_cache[g][p] = rope(RMSNorm(k_g, k_norm), p);  v_cache[g][p] = v_g
// rope: NeoX pairs (j, j + N_ROT/2) over dims 0..N_ROT-1, phi = p * ROPE_THETA^(-2j/N_ROT) in f32 (as llama.cpp);
// dims N_ROT..D_H-1 pass through. The gate halves of qf are not touched (attn_combine/attn_prefill read them).
// Columns (grid z): a batched decode step writes one token of each of several sequences in one dispatch; column
// c runs exactly the code of a dispatch of its own on its slices (so its bits are a solo step's): params words
// c·P_COL.. = [pos0, n_tokens, slot] (P_COL = 0: one column, AttnParams, slot 0), its qf, k, v and q_out at
// token c (n_tokens must be 1 when there are several columns; with IN_COL > 0 its qf, k and v at word c·IN_COL
// of their bindings: a fused in-projection's column [qf | k | v]), its caches from word slot·KV_COL of pooled
// caches (every slot of the layer at 256-byte strides).
// Bindings:
//   params   u32 [pos0, n_tokens] (AttnParams) per column: position of token 0, tokens present (<= grid.y)
//   qf       f32 ne=[2*D_H, H_Q, nTok]   attn_q output; head h holds [q_h (D_H) | gate_h (D_H)] (spec §7.1)
//   k        f32 ne=[D_H, H_KV, nTok]    attn_k output
//   v        f32 ne=[D_H, H_KV, nTok]    attn_v output
//   q_norm   f32 ne=[D_H]                attn_q_norm weight
//   k_norm   f32 ne=[D_H]                attn_k_norm weight
//   q_out    f32 ne=[D_H, H_Q, nTok]     normed, roped queries
//   k_cache  u32 words of K[g][p][d], ne=[D_H, P_MAX, H_KV]: f32 bits, or with KV_F16 two f16 per word
//            (dims 2w, 2w+1 in word w of a row, low half first); this (slot, layer)'s cache, row p written
//   v_cache  V likewise
// Grid (H_Q + H_KV, nTok, columns): workgroup (j, t, c) owns, in column c, q head j of token t when j < H_Q, else KV head j - H_Q
// (norm, rope, K and V append). Invocation i loads dims i, i + WG, ... and writes dim pairs (2w, 2w+1) for
// w = i, i + WG, ... (one f16 word); the row sits in workgroup memory because a rope pair spans
// invocations. Tokens with t >= n_tokens or p >= P_MAX write nothing.
// Constants: const H_Q, H_KV, D_H, N_ROT, P_MAX, WG: u32; const ROPE_THETA, EPS: f32; const KV_F16: bool;
//   const P_COL, KV_COL, IN_COL: u32 (column strides above, in words; 0 for one column; IN_COL 0: qf, k, v
//   each packed by token).
// Limits: D_H and N_ROT even, N_ROT <= D_H; WG a power of two <= 256; phases < 2^18 * pi/2 (p < 4e5).
@group(0) @binding(0) var<storage, read> params: array<u32>;
@group(0) @binding(1) var<storage, read> qf: array<f32>;
@group(0) @binding(2) var<storage, read> k: array<f32>;
@group(0) @binding(3) var<storage, read> v: array<f32>;
@group(0) @binding(4) var<storage, read> q_norm: array<f32>;
@group(0) @binding(5) var<storage, read> k_norm: array<f32>;
@group(0) @binding(6) var<storage, read_write> q_out: array<f32>;
@group(0) @binding(7) var<storage, read_write> k_cache: array<u32>;
@group(0) @binding(8) var<storage, read_write> v_cache: array<u32>;

const HALF_ROT: u32 = N_ROT / 2u;
// Words between tokens (columns) of qf, and of k and v.
const QF_W: u32 = select(IN_COL, 2u * D_H * H_Q, IN_COL == 0u);
const KV_W: u32 = select(IN_COL, D_H * H_KV, IN_COL == 0u);
// Phase reduction by pi/2 (Cody-Waite): pi/2 = PIO2_HI + PIO2_MID + PIO2_LO where HI and MID have 6
// significant bits, so n * HI and n * MID are exact for n < 2^18 (phases up to ~4e5 rad). Then sin/cos by
// Taylor polynomials on |r| <= pi/4 (error < 1e-9): Vulkan only bounds the built-in sin/cos to an absolute
// 2^-11 on [-pi, pi], so the built-ins would make rope differ between devices; this keeps the f32 phase's
// accuracy on every device.
const PIO2_HI: f32 = 1.5625;
const PIO2_MID: f32 = 0.00830078125;
const PIO2_LO: f32 = -4.454454938240815e-06;
const TWO_OVER_PI: f32 = 0.6366197723675814;

var<workgroup> xs: array<f32, D_H>;

// (cos phi, sin phi) for phi >= 0.
fn rope_cos_sin(phi: f32) -> vec2f {
  let n = round(phi * TWO_OVER_PI);
  let r = ((phi - n * PIO2_HI) - n * PIO2_MID) - n * PIO2_LO;
  let r2 = r * r;
  let s = r + r * r2 * (-1.0 / 6.0 + r2 * (1.0 / 120.0 + r2 * (-1.0 / 5040.0 + r2 * (1.0 / 362880.0))));
  let c = 1.0 + r2 * (-0.5 + r2 * (1.0 / 24.0 + r2 * (-1.0 / 720.0 + r2 * (1.0 / 40320.0 + r2 * (-1.0 / 3628800.0)))));
  switch (u32(n) & 3u) {
    case 0u: {
      return vec2f(c, s);
    }
    case 1u: {
      return vec2f(-s, c);
    }
    case 2u: {
      return vec2f(-c, -s);
    }
    default: {
      return vec2f(s, -c);
    }
  }
}

// Dim i of the normed row in xs after rope at position pos.
fn rope_value(i: u32, pos: u32) -> f32 {
  if (i >= N_ROT) {
    return xs[i];
  }
  let j = i % HALF_ROT;
  let freq = pow(ROPE_THETA, -2.0 * f32(j) / f32(N_ROT));
  let cs = rope_cos_sin(f32(pos) * freq);
  let x0 = xs[j];
  let x1 = xs[j + HALF_ROT];
  if (i < HALF_ROT) {
    return x0 * cs.x - x1 * cs.y;
  }
  return x0 * cs.y + x1 * cs.x;
}

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3u, @builtin(local_invocation_index) lid: u32) {
  let t = wid.y;
  let head = wid.x;
  let col = wid.z;
  let pos = params[col * P_COL] + t;
  var slot = 0u;
  if (P_COL > 0u) {
    slot = params[col * P_COL + 2u];
  }
  // Uniform per workgroup (workgroup id and a read-only storage value), so no barrier is skipped unevenly.
  if (t >= params[col * P_COL + 1u] || pos >= P_MAX) {
    return;
  }
  let tc = col + t; // column c's token (one token per column when there are several)
  let kvw = slot * KV_COL;
  let is_q = head < H_Q;
  let kv_head = head - H_Q;
  var src_base: u32;
  var dst_base: u32;
  if (is_q) {
    src_base = tc * QF_W + head * 2u * D_H;
    dst_base = (tc * H_Q + head) * D_H;
  } else {
    src_base = tc * KV_W + kv_head * D_H;
    dst_base = (kv_head * P_MAX + pos) * D_H;
  }

  var s = 0.0;
  for (var i = lid; i < D_H; i += WG) {
    var x: f32;
    if (is_q) {
      x = qf[src_base + i];
    } else {
      x = k[src_base + i];
    }
    xs[i] = x;
    s += x * x;
  }
  let scale = rms_scale(lid, s, D_H, EPS);
  for (var i = lid; i < D_H; i += WG) {
    var w: f32;
    if (is_q) {
      w = q_norm[i];
    } else {
      w = k_norm[i];
    }
    xs[i] = xs[i] * scale * w;
  }
  workgroupBarrier();

  for (var w = lid; w < D_H / 2u; w += WG) {
    let d = 2u * w;
    let y0 = rope_value(d, pos);
    let y1 = rope_value(d + 1u, pos);
    if (is_q) {
      q_out[dst_base + d] = y0;
      q_out[dst_base + d + 1u] = y1;
    } else if (KV_F16) {
      k_cache[kvw + (dst_base + d) / 2u] = pack2x16float(vec2f(y0, y1));
      v_cache[kvw + (dst_base + d) / 2u] = pack2x16float(vec2f(v[src_base + d], v[src_base + d + 1u]));
    } else {
      k_cache[kvw + dst_base + d] = bitcast<u32>(y0);
      k_cache[kvw + dst_base + d + 1u] = bitcast<u32>(y1);
      v_cache[kvw + dst_base + d] = bitcast<u32>(v[src_base + d]);
      v_cache[kvw + dst_base + d + 1u] = bitcast<u32>(v[src_base + d + 1u]);
    }
  }
}
