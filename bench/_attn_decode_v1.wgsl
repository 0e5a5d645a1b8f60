// The decode attention kernel as the engine ran it before the per-key-lane rewrite (issue #24), kept beside
// bench/attention.ts for comparison only, with lib/attn.wgsl's tile staging copied in so that it stays as it
// was whatever that library becomes. Same bindings, grid and constants as then (wgsl/attn_decode.ts of
// commit 8affc07).
// Split-K decode attention, one query token at position p = params.pos0 (spec §7 step 6, GQA):
//   for q head h, KV head g = h / (H_Q / H_KV), positions t in this split's range of 0..p:
//   s_t = SCALE * q_h . K[g][t];  m = max_t s_t;  l = sum_t exp(s_t - m);  O = sum_t exp(s_t - m) V[g][t]
// The partials (O unnormalised, m, l) per (split, head) are merged by attn_combine.
// Split ranges: per = max(PER_MIN, roundup(ceil((p + 1) / N_SPLIT), TILE)); split s covers
// [s * per, min((s + 1) * per, p + 1)), so ceil((p + 1) / per) splits are used (attn_combine reads those).
// The grid is constant whatever p is (pre-encodable); the workgroups of unused splits write nothing. N_SPLIT
// follows the cache capacity (the engine's attnDecodeSplits): with a fixed 32 splits a 32k context gave 64
// workgroups of 1024 positions each, latency-bound at ~150 GB/s (0.9 ms per layer on the H200).
// Bindings:
//   params   AttnParams { pos0: u32, n_tokens: u32 }   only pos0 is read (the cache holds 0..pos0)
//   q        f32 ne=[D_H, H_Q]                 normed, roped queries (attn_qk_rope q_out, token 0)
//   k_cache  u32 words of K[g][t][d], ne=[D_H, P_MAX, H_KV]: f32 bits, or with KV_F16 two f16 per word
//            (low half = even d)
//   v_cache  V[g][t][d] likewise
//   part_o   f32 ne=[D_H, H_Q, N_SPLIT]        unnormalised O per split and head
//   part_ml  f32 ne=[2, H_Q, N_SPLIT]          (m, l) per split and head
// Grid (N_SPLIT, H_KV): workgroup (s, g) owns split s for the G = H_Q / H_KV query heads of KV head g, so
// each K/V row is read once for all G heads. Per tile of TILE positions: stage K in workgroup memory,
// G * TILE invocations each take one full q.k dot, G invocations update the online softmax, stage V, then
// invocation i accumulates outputs o = i + j * WG (head o / D_H, dim o % D_H) in registers.
// Constants: const H_Q, H_KV, D_H, P_MAX, N_SPLIT, TILE, PER_MIN, WG: u32; const SCALE: f32;
// const KV_F16: bool.
// Limits: H_Q % H_KV == 0; G * D_H % WG == 0; D_H % 8 == 0 (16-byte cache loads); PER_MIN % TILE == 0;
// G * TILE <= WG is not required; workgroup memory 4 * (G * D_H + TILE * (D_H + 4) + G * TILE + 3 * G) bytes <= device limit (32 KiB
// on lavapipe).
struct AttnParams {
  pos0: u32,
  n_tokens: u32,
}

@group(0) @binding(0) var<storage, read> params: AttnParams;
@group(0) @binding(1) var<storage, read> q: array<f32>;
@group(0) @binding(2) var<storage, read> k_cache: array<vec4<u32>>;
@group(0) @binding(3) var<storage, read> v_cache: array<vec4<u32>>;
@group(0) @binding(4) var<storage, read_write> part_o: array<f32>;
@group(0) @binding(5) var<storage, read_write> part_ml: array<f32>;

const G: u32 = H_Q / H_KV;
const OPI: u32 = G * D_H / WG;
// Stands in for -inf (a -inf constant is not expressible); exp(NEG - m) is 0 for every finite score m.
const NEG: f32 = -3.0e38;

// lib/attn.wgsl as of commit 8affc07.
const ATTN_DQ: u32 = D_H / 4u;
const ATTN_ROW: u32 = ATTN_DQ + 1u;

// attn_kv[row · ATTN_ROW + quad]: the staged tile.
var<workgroup> attn_kv: array<vec4<f32>, TILE * ATTN_ROW>;

fn attn_stage_tile(lid: u32, kv_base: u32, t0: u32, end: u32, is_k: bool) {
  for (var i = lid; i < TILE * ATTN_DQ; i += WG) {
    let row = i / ATTN_DQ;
    let col = i % ATTN_DQ;
    var x = vec4<f32>(0.0);
    if (t0 + row < end) {
      x = attn_load4(is_k, kv_base + (t0 + row) * D_H + 4u * col);
    }
    attn_kv[row * ATTN_ROW + col] = x;
  }
}

var<workgroup> qs: array<vec4<f32>, G * ATTN_DQ>;
var<workgroup> sc: array<f32, G * TILE>;
var<workgroup> m_s: array<f32, G>;
var<workgroup> l_s: array<f32, G>;
var<workgroup> corr: array<f32, G>;

// Elements e..e+3 of a cache (e % 4 == 0): f32 bits, or two f16 pair words (low half = even element). One
// 16-byte load per four elements: the tile loads below are latency-bound chains, so fewer, wider loads.
fn load4(w: vec4<u32>, e: u32) -> vec4<f32> {
  if (KV_F16) {
    let hi = ((e >> 1u) & 3u) == 2u;
    return vec4<f32>(
      unpack2x16float(select(w.x, w.z, hi)),
      unpack2x16float(select(w.y, w.w, hi)),
    );
  }
  return bitcast<vec4<f32>>(w);
}

fn load_k4(e: u32) -> vec4<f32> {
  return load4(k_cache[select(e >> 2u, e >> 3u, KV_F16)], e);
}

fn load_v4(e: u32) -> vec4<f32> {
  return load4(v_cache[select(e >> 2u, e >> 3u, KV_F16)], e);
}

// K or V elements e..e+3 for the tile staging (lib/attn.wgsl).
fn attn_load4(is_k: bool, e: u32) -> vec4<f32> {
  if (is_k) {
    return load_k4(e);
  }
  return load_v4(e);
}

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3u, @builtin(local_invocation_index) lid: u32) {
  let split = wid.x;
  let g = wid.y;
  let ctx = min(params.pos0 + 1u, P_MAX);
  let per = max(PER_MIN, ((ctx + N_SPLIT - 1u) / N_SPLIT + TILE - 1u) / TILE * TILE);
  let begin = split * per;
  // Uniform per workgroup: an unused split returns before any barrier.
  if (begin >= ctx) {
    return;
  }
  let end = min(begin + per, ctx);
  let kv_base = g * P_MAX * D_H;

  for (var i = lid; i < G * ATTN_DQ; i += WG) {
    let b = g * G * D_H + 4u * i;
    qs[i] = vec4<f32>(q[b], q[b + 1u], q[b + 2u], q[b + 3u]);
  }
  for (var h = lid; h < G; h += WG) {
    m_s[h] = NEG;
    l_s[h] = 0.0;
  }
  var acc: array<f32, OPI>;
  workgroupBarrier();

  for (var t0 = begin; t0 < end; t0 += TILE) {
    attn_stage_tile(lid, kv_base, t0, end, true);
    workgroupBarrier();
    for (var i = lid; i < G * TILE; i += WG) {
      let h = i / TILE;
      let tt = i % TILE;
      var s = NEG;
      if (t0 + tt < end) {
        // Four partial sums: a quarter of the dependent add chain of a single accumulator.
        var a4 = vec4<f32>(0.0);
        for (var dq = 0u; dq < ATTN_DQ; dq++) {
          a4 += qs[h * ATTN_DQ + dq] * attn_kv[tt * ATTN_ROW + dq];
        }
        let dot = (a4.x + a4.y) + (a4.z + a4.w);
        s = dot * SCALE;
      }
      sc[i] = s;
    }
    workgroupBarrier();
    for (var h = lid; h < G; h += WG) {
      var mx = NEG;
      for (var tt = 0u; tt < TILE; tt++) {
        mx = max(mx, sc[h * TILE + tt]);
      }
      let m_new = max(m_s[h], mx);
      var sum = 0.0;
      for (var tt = 0u; tt < TILE; tt++) {
        let pr = exp(sc[h * TILE + tt] - m_new);
        sc[h * TILE + tt] = pr;
        sum += pr;
      }
      let c = exp(m_s[h] - m_new);
      l_s[h] = l_s[h] * c + sum;
      m_s[h] = m_new;
      corr[h] = c;
    }
    attn_stage_tile(lid, kv_base, t0, end, false);
    workgroupBarrier();
    // Keys outer, heads inner: with WG = D_H every j of an invocation reads the same V element, loaded once.
    for (var j = 0u; j < OPI; j++) {
      acc[j] *= corr[(lid + j * WG) / D_H];
    }
    for (var tt = 0u; tt < TILE; tt++) {
      for (var j = 0u; j < OPI; j++) {
        let o = lid + j * WG;
        let d = o % D_H;
        acc[j] = fma(sc[(o / D_H) * TILE + tt], attn_kv[tt * ATTN_ROW + d / 4u][d % 4u], acc[j]);
      }
    }
    workgroupBarrier();
  }

  let out_head0 = split * H_Q + g * G;
  for (var j = 0u; j < OPI; j++) {
    let o = lid + j * WG;
    part_o[out_head0 * D_H + o] = acc[j];
  }
  for (var h = lid; h < G; h += WG) {
    part_ml[(out_head0 + h) * 2u] = m_s[h];
    part_ml[(out_head0 + h) * 2u + 1u] = l_s[h];
  }
}
