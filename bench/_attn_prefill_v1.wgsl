// Copy of wgsl/attn_prefill.wgsl before the flash rewrite (commit c26fdaf), kept for bench/attention.ts only:
// the engine no longer runs it. Its constants: BQ, TILE, WG as the engine set them (1, 8, 256).
// Causal gated attention for a chunk of nTok new tokens at positions p_t = pos0 + t, over the cache
// (positions 0..pos0-1 from earlier chunks, pos0.. written by attn_qk_rope for this chunk); spec §7 steps 6-7:
//   o[t][h] = sum_{u <= p_t} softmax_u(SCALE * q[t][h] . K[g][u]) V[g][u] * sigmoid(gate[t][h]),  g = h / (H_Q / H_KV)
// Flash-attention form: one pass over the keys with an online softmax in f32.
// Bindings:
//   params   AttnParams { pos0: u32, n_tokens: u32 }   tokens present (<= BQ * grid.x)
//   q        f32 ne=[D_H, H_Q, nTok]        normed, roped queries (attn_qk_rope q_out)
//   qf       f32 ne=[2*D_H, H_Q, nTok]      attn_q output; gate_h = qf[t][h][D_H..2*D_H)
//   k_cache  u32 words of K[g][u][d], ne=[D_H, P_MAX, H_KV], holding positions 0..pos0+n_tokens-1: f32 bits,
//            or with KV_F16 two f16 per word (low half = even d)
//   v_cache  V likewise
//   o        f32 ne=[D_H, H_Q, nTok]        gated attention output
// Grid (ceil(nTok / BQ), H_KV): workgroup (b, g) owns R = BQ * G query rows: tokens b*BQ .. b*BQ+BQ-1 times
// the G = H_Q / H_KV heads of KV head g (row r = token (r / G), head g*G + r % G), so every K/V row is read
// once for all of them. Keys run from 0 to the block's last position in tiles of TILE: stage K, R * TILE
// invocations each take one full dot (masked when u > p_t), R invocations update the online softmax, stage
// V, then invocation i accumulates outputs o = i + j * WG (row o / D_H, dim o % D_H) in registers.
// Staged queries and K/V rows (lib/attn.wgsl) are vec4s with a row stride of D_H / 4 + 1 (no bank conflicts).
// Constants: const H_Q, H_KV, D_H, P_MAX, BQ, TILE, WG: u32; const SCALE: f32; const KV_F16: bool.
// Limits: H_Q % H_KV == 0; BQ * G * D_H % WG == 0; D_H % 4 == 0; workgroup memory
// 4 * ((R + TILE) * (D_H + 4) + R * TILE + 3 * R) bytes <= device limit (32 KiB on lavapipe).
struct AttnParams {
  pos0: u32,
  n_tokens: u32,
}

@group(0) @binding(0) var<storage, read> params: AttnParams;
@group(0) @binding(1) var<storage, read> q: array<f32>;
@group(0) @binding(2) var<storage, read> qf: array<f32>;
@group(0) @binding(3) var<storage, read> k_cache: array<u32>;
@group(0) @binding(4) var<storage, read> v_cache: array<u32>;
@group(0) @binding(5) var<storage, read_write> o: array<f32>;

const G: u32 = H_Q / H_KV;
const R: u32 = BQ * G;
const OPI: u32 = R * D_H / WG;
// Stands in for -inf (a -inf constant is not expressible); exp(NEG - m) is 0 for every finite score m.
const NEG: f32 = -3.0e38;

var<workgroup> qs: array<vec4<f32>, R * ATTN_ROW>;
var<workgroup> sc: array<f32, R * TILE>;
var<workgroup> m_s: array<f32, R>;
var<workgroup> l_s: array<f32, R>;
var<workgroup> corr: array<f32, R>;

// Token of row r, clamped to the last present token so padding rows read valid data (never written).
fn row_token(blk: u32, r: u32, n: u32) -> u32 {
  return min(blk * BQ + r / G, n - 1u);
}

// Element e of the K (V) cache: f32 bits, or half of an f16 pair word (low half = even element).
fn load_k(e: u32) -> f32 {
  if (KV_F16) {
    return unpack2x16float(k_cache[e >> 1u])[e & 1u];
  }
  return bitcast<f32>(k_cache[e]);
}

fn load_v(e: u32) -> f32 {
  if (KV_F16) {
    return unpack2x16float(v_cache[e >> 1u])[e & 1u];
  }
  return bitcast<f32>(v_cache[e]);
}

// K or V elements e..e+3 for the tile staging (lib/attn.wgsl).
fn attn_load4(is_k: bool, e: u32) -> vec4<f32> {
  if (is_k) {
    return vec4<f32>(load_k(e), load_k(e + 1u), load_k(e + 2u), load_k(e + 3u));
  }
  return vec4<f32>(load_v(e), load_v(e + 1u), load_v(e + 2u), load_v(e + 3u));
}

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3u, @builtin(local_invocation_index) lid: u32) {
  let blk = wid.x;
  let g = wid.y;
  let n = params.n_tokens;
  let pos0 = params.pos0;
  // Uniform per workgroup: no barrier is skipped unevenly.
  if (blk * BQ >= n) {
    return;
  }
  let end = min(pos0 + min(blk * BQ + BQ, n), P_MAX);
  let kv_base = g * P_MAX * D_H;

  for (var i = lid; i < R * ATTN_DQ; i += WG) {
    let r = i / ATTN_DQ;
    let t = row_token(blk, r, n);
    let b = (t * H_Q + g * G + r % G) * D_H + 4u * (i % ATTN_DQ);
    qs[r * ATTN_ROW + i % ATTN_DQ] = vec4<f32>(q[b], q[b + 1u], q[b + 2u], q[b + 3u]);
  }
  for (var r = lid; r < R; r += WG) {
    m_s[r] = NEG;
    l_s[r] = 0.0;
  }
  var acc: array<f32, OPI>;
  workgroupBarrier();

  for (var t0 = 0u; t0 < end; t0 += TILE) {
    attn_stage_tile(lid, kv_base, t0, end, true);
    workgroupBarrier();
    for (var i = lid; i < R * TILE; i += WG) {
      let r = i / TILE;
      let tt = i % TILE;
      let qpos = pos0 + row_token(blk, r, n);
      var s = NEG;
      if (t0 + tt <= qpos && t0 + tt < end) {
        // Four partial sums (as attn_decode): a quarter of the dependent add chain.
        var a4 = vec4<f32>(0.0);
        for (var dq = 0u; dq < ATTN_DQ; dq++) {
          a4 += qs[r * ATTN_ROW + dq] * attn_kv[tt * ATTN_ROW + dq];
        }
        s = ((a4.x + a4.y) + (a4.z + a4.w)) * SCALE;
      }
      sc[i] = s;
    }
    workgroupBarrier();
    for (var r = lid; r < R; r += WG) {
      var mx = NEG;
      for (var tt = 0u; tt < TILE; tt++) {
        mx = max(mx, sc[r * TILE + tt]);
      }
      // Every row sees position 0 in the first tile, so m_new is a real score from then on.
      let m_new = max(m_s[r], mx);
      var sum = 0.0;
      for (var tt = 0u; tt < TILE; tt++) {
        let pr = exp(sc[r * TILE + tt] - m_new);
        sc[r * TILE + tt] = pr;
        sum += pr;
      }
      let c = exp(m_s[r] - m_new);
      l_s[r] = l_s[r] * c + sum;
      m_s[r] = m_new;
      corr[r] = c;
    }
    attn_stage_tile(lid, kv_base, t0, end, false);
    workgroupBarrier();
    for (var j = 0u; j < OPI; j++) {
      let oi = lid + j * WG;
      let r = oi / D_H;
      let d = oi % D_H;
      var a = acc[j] * corr[r];
      for (var tt = 0u; tt < TILE; tt++) {
        a += sc[r * TILE + tt] * attn_kv[tt * ATTN_ROW + d / 4u][d % 4u];
      }
      acc[j] = a;
    }
    workgroupBarrier();
  }

  for (var j = 0u; j < OPI; j++) {
    let oi = lid + j * WG;
    let r = oi / D_H;
    let d = oi % D_H;
    let t = blk * BQ + r / G;
    if (t < n) {
      let h = g * G + r % G;
      let gate = qf[(t * H_Q + h) * 2u * D_H + D_H + d];
      o[(t * H_Q + h) * D_H + d] = acc[j] / l_s[r] / (1.0 + exp(-gate));
    }
  }
}
