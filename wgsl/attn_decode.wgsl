// Split-K decode attention, one query token at position p = params.pos0 (spec §7 step 6, GQA):
//   for q head h, KV head g = h / (H_Q / H_KV), positions t in this split's range of 0..p:
//   s_t = SCALE * q_h . K[g][t];  m = max_t s_t;  l = sum_t exp(s_t - m);  O = sum_t exp(s_t - m) V[g][t]
// The partials (O unnormalised, m, l) per (split, head) are merged by attn_combine.
// Split ranges: per = max(PER_MIN, roundup(ceil((p + 1) / N_SPLIT), TILE)); split s covers
// [s * per, min((s + 1) * per, p + 1)), so ceil((p + 1) / per) splits are used (attn_combine reads those).
// The grid is constant whatever p is (pre-encodable); the workgroups of unused splits write nothing.
// Columns (grid z): a batched decode step attends one token of each of several sequences in one dispatch;
// column c runs exactly the code of a dispatch of its own on its slices (so its bits are a solo step's): params
// words c·P_COL.. = [pos0, n_tokens, slot] (P_COL = 0: one column, AttnParams, slot 0), its q at token c, its
// caches from word slot·KV_COL of pooled caches (every slot of the layer at 256-byte strides; KV_COL = 0: its
// own), its partials from word c·PO_COL of part_o and c·ML_COL of part_ml (each column's padded to 256 bytes,
// as attn_combine reads them; column 0 at offset 0).
// Bindings:
//   params   u32 [pos0, n_tokens] (AttnParams) per column   only pos0 (and slot) is read (the cache holds 0..pos0)
//   q        f32 ne=[D_H, H_Q, columns]        normed, roped queries (attn_qk_rope q_out)
//   k_cache  u32 words of K[g][t][d], ne=[D_H, P_MAX, H_KV]: f32 bits, or with KV_F16 two f16 per word
//            (low half = even d)
//   v_cache  V[g][t][d] likewise
//   part_o   f32 ne=[D_H, H_Q, N_SPLIT]        unnormalised O per split and head
//   part_ml  f32 ne=[2, H_Q, N_SPLIT]          (m, l) per split and head
// Grid (N_SPLIT, H_KV, columns): workgroup (s, g, c) owns, in column c, split s for the G = H_Q / H_KV query heads of KV head g, so
// each K/V row is read once for all G heads, straight from the cache into registers (no staging). A tile of
// TILE positions takes three barriers:
//   (a) q.k: invocation (key kt, lane c) of TILE / KPT keys x SLICES = WG * KPT / TILE lanes loads its slice
//       of K row kt (lane c takes the 16-byte words c, c + SLICES, ...: a row is read by SLICES adjacent
//       invocations, so loads coalesce) and multiplies each word by a 4x4 block of q (4 heads x the word's
//       4 dims, from workgroup memory): partial dots of 4 heads per block. With KPT = 2 it does the same for
//       key kt + TILE / 2 with the same q blocks: half the workgroup-memory reads per multiply-add (those
//       reads, not the cache loads, bounded KPT = 1 at depth on the H200);
//   (b) score (h, t): the SLICES partials summed, scaled, masked past the split's end;
//   (c) every invocation of head h reads the tile's TILE scores of h, so all of them know the new running
//       max m_h (kept in registers by each: no serial step); p = exp(s - m_h); l is kept per key lane;
//   (d) P.V: invocation (key group kq, dim quad dq) of KQ = WG / (D_H / 4) groups x D_H / 4 quads owns dims
//       4dq..4dq+3 of every head over the keys kq, kq + KQ, ...: V rows stream as 16-byte loads, one row
//       read by D_H / 4 adjacent invocations. The key groups' sums meet once per split, at the end.
// Rows past the split's end are clamped to its last row (loaded, finite) and weigh 0 (score NEG).
// Registers are named variables (acc0..acc7, sA/sB), never function-scope arrays: the H200's driver keeps
// those in local memory when a loop indexes them (docs/PERF.md, 2026-12-04), hence G <= 8.
// Constants: const H_Q, H_KV, D_H, P_MAX, N_SPLIT, TILE, PER_MIN, WG, KPT: u32; const SCALE: f32;
// const KV_F16: bool; const P_COL, KV_COL: u32 (column strides above, in words; 0 for one column).
// Limits (attn_decode.ts checks them): H_Q % H_KV == 0; G <= 8; D_H % 8 == 0; KPT in {1, 2}; TILE % KPT
// == 0; (WG * KPT) % TILE == 0 and SLICES % 4 == 0; (D_H / 8) % SLICES == 0; G * TILE <= 2 * WG (two scores
// per invocation); WG % (D_H / 4) == 0; TILE % KQ == 0; PER_MIN % TILE == 0; workgroup memory
// (attnDecodeWorkgroupBytes) within the device's limit (32 KiB on lavapipe); KV_COL % 4 == 0.
@group(0) @binding(0) var<storage, read> params: array<u32>;
@group(0) @binding(1) var<storage, read> q: array<f32>;
@group(0) @binding(2) var<storage, read> k_cache: array<vec4<u32>>;
@group(0) @binding(3) var<storage, read> v_cache: array<vec4<u32>>;
@group(0) @binding(4) var<storage, read_write> part_o: array<vec4<f32>>;
@group(0) @binding(5) var<storage, read_write> part_ml: array<f32>;

const G: u32 = H_Q / H_KV;
// Head quads (the heads padded to whole vec4s; the pad heads have q = 0 and are never written out).
const G4: u32 = (G + 3u) / 4u;
// 16-byte words of one cache row: quads of f32, or octets of f16.
const DQ: u32 = D_H / 4u;
const DO: u32 = D_H / 8u;
const ROW_WORDS: u32 = select(DQ, DO, KV_F16);
const SLICES: u32 = WG * KPT / TILE;
const KQ: u32 = WG / DQ;
const SCORES: u32 = G * TILE;
// Stands in for -inf (a -inf constant is not expressible); exp(NEG - m) is 0 for every finite score m.
const NEG: f32 = -3.0e38;
// Words between columns' partials (attn_combine's PO_COL and ML_COL).
const PO_COL: u32 = (D_H * H_Q * N_SPLIT + 63u) / 64u * 64u;
const ML_COL: u32 = (2u * H_Q * N_SPLIT + 63u) / 64u * 64u;

// q as 4x4 blocks: block (hq, e) has column j = dim 4e' + j of heads 4hq..4hq+3 at qs[(4hq + j) * DQ + e]
// (adjacent lanes read adjacent words: no bank conflicts), where e' = e for f32; with KV_F16 the quads are
// reordered, even ones first, then odd ones (e' = 2e, then 2(e - DO) + 1), so that lane c's two quads of
// octet e are blocks e and DO + e. After the tile loop qs holds the key groups' sums of (d), head h at h*DQ + dq.
var<workgroup> qs: array<vec4<f32>, G4 * DQ * 4u>;
// (a) -> (b): partial dots; scalar h * TILE * SLICES + t * SLICES + c (head h, key t, lane c).
var<workgroup> part: array<vec4<f32>, G * WG * KPT / 4u>;
// (b) -> (c): scores sc[h][t]; after the loop, each key lane's l.
var<workgroup> sc: array<vec4<f32>, SCORES / 4u>;
// (c) -> (d): p_s[t][hq] (4 heads a vec4) and each head's rescale of O.
var<workgroup> p_s: array<vec4<f32>, TILE * G4>;
var<workgroup> corr_s: array<vec4<f32>, G4>;

// Words of cache row `row` of KV head g start at this index of the vec4<u32> arrays (kv: the column's
// cache, in vec4 words).
fn row_base(kv: u32, g: u32, row: u32) -> u32 {
  return kv + (g * P_MAX + row) * ROW_WORDS;
}

// Dims 4dq..4dq+3 of a V row from its 16-byte word (f32: word dq; f16: the half of word dq / 2).
fn v_quad(w: vec4<u32>, dq: u32) -> vec4<f32> {
  if (KV_F16) {
    let hi = (dq & 1u) == 1u;
    return vec4<f32>(unpack2x16float(select(w.x, w.z, hi)), unpack2x16float(select(w.y, w.w, hi)));
  }
  return bitcast<vec4<f32>>(w);
}

// q[h][d] of KV head g's head h in column col, 0 for the pad heads.
fn q_at(col: u32, g: u32, h: u32, d: u32) -> f32 {
  if (h < G) {
    return q[(col * H_Q + g * G + h) * D_H + d];
  }
  return 0.0;
}

// The q block (head quad hq, quad position e): the partial dots of 4 heads with k are block * k.
fn q_block(hq: u32, e: u32) -> mat4x4<f32> {
  let b = 4u * hq * DQ + e;
  return mat4x4<f32>(qs[b], qs[b + DQ], qs[b + 2u * DQ], qs[b + 3u * DQ]);
}

// Partial dot of head h (< 4 * G4) from (a) at `slot` (its key's lanes are slots kt * SLICES ..); pad heads
// are not stored.
fn put_part(h: u32, slot: u32, v: f32) {
  if (h < G) {
    part[(h * WG * KPT + slot) / 4u][slot % 4u] = v;
  }
}

// The partial dots of heads 0..3 (a) and 4..7 (b) at `slot`.
fn put_parts(slot: u32, a: vec4<f32>, b: vec4<f32>) {
  put_part(0u, slot, a.x);
  put_part(1u, slot, a.y);
  put_part(2u, slot, a.z);
  put_part(3u, slot, a.w);
  if (G > 4u) {
    put_part(4u, slot, b.x);
    put_part(5u, slot, b.y);
    put_part(6u, slot, b.z);
    put_part(7u, slot, b.w);
  }
}

// (b) for score i = (head i / TILE, key i % TILE): the sum of its lanes' partials, scaled; NEG past `end`.
fn score(i: u32, t0: u32, end: u32) -> f32 {
  let h = i / TILE;
  let t = i % TILE;
  var a4 = vec4<f32>(0.0);
  for (var cq = 0u; cq < SLICES / 4u; cq++) {
    a4 += part[(h * WG * KPT + t * SLICES) / 4u + cq];
  }
  let s = select(NEG, ((a4.x + a4.y) + (a4.z + a4.w)) * SCALE, t0 + t < end);
  sc[i / 4u][i % 4u] = s;
  return s;
}

// (c) for score i with value s and its head's running (m, l) of this key lane: publishes p and, from key 0,
// the head's rescale; returns the new (m, l).
fn softmax_step(i: u32, s: f32, ml: vec2<f32>) -> vec2<f32> {
  let h = i / TILE;
  let t = i % TILE;
  var mx4 = vec4<f32>(NEG);
  for (var tq = 0u; tq < TILE / 4u; tq++) {
    mx4 = max(mx4, sc[h * (TILE / 4u) + tq]);
  }
  let m_new = max(ml.x, max(max(mx4.x, mx4.y), max(mx4.z, mx4.w)));
  let cr = exp(ml.x - m_new);
  let p = exp(s - m_new);
  p_s[t * G4 + h / 4u][h % 4u] = p;
  if (t == 0u) {
    corr_s[h / 4u][h % 4u] = cr;
  }
  return vec2<f32>(m_new, fma(ml.y, cr, p));
}

// The (m, l) of head i / TILE from key lane 0 (the lanes' l summed; they were published as sc).
fn put_ml(i: u32, mlb: u32, out_head0: u32, m: f32) {
  let h = i / TILE;
  var l4 = vec4<f32>(0.0);
  for (var tq = 0u; tq < TILE / 4u; tq++) {
    l4 += sc[h * (TILE / 4u) + tq];
  }
  part_ml[mlb + (out_head0 + h) * 2u] = m;
  part_ml[mlb + (out_head0 + h) * 2u + 1u] = (l4.x + l4.y) + (l4.z + l4.w);
}

fn put_o(h: u32, pob: u32, out_head0: u32, dq: u32, v: vec4<f32>) {
  if (h < G) {
    part_o[pob + (out_head0 + h) * DQ + dq] = v;
  }
}

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3u, @builtin(local_invocation_index) lid: u32) {
  let split = wid.x;
  let g = wid.y;
  let col = wid.z;
  var slot = 0u;
  if (P_COL > 0u) {
    slot = params[col * P_COL + 2u];
  }
  let kv = slot * (KV_COL / 4u);
  let ctx = min(params[col * P_COL] + 1u, P_MAX);
  let per = max(PER_MIN, ((ctx + N_SPLIT - 1u) / N_SPLIT + TILE - 1u) / TILE * TILE);
  let begin = split * per;
  // Uniform per workgroup: an unused split returns before any barrier.
  if (begin >= ctx) {
    return;
  }
  let end = min(begin + per, ctx);

  for (var i = lid; i < G4 * DQ * 4u; i += WG) {
    let e = i % DQ;
    let j = (i / DQ) % 4u;
    let hq = i / (4u * DQ);
    var quad = e;
    if (KV_F16) {
      quad = select(2u * e, 2u * (e - DO) + 1u, e >= DO);
    }
    let d = 4u * quad + j;
    qs[i] = vec4<f32>(
      q_at(col, g, 4u * hq, d),
      q_at(col, g, 4u * hq + 1u, d),
      q_at(col, g, 4u * hq + 2u, d),
      q_at(col, g, 4u * hq + 3u, d),
    );
  }

  // (a) roles: keys kt and, with KPT = 2, kt + TILE / 2
  let kt = lid / SLICES;
  let c = lid % SLICES;
  // (d) roles
  let kq = lid / DQ;
  let dq = lid % DQ;
  // (b)/(c): scores lid and lid + WG (SCORES <= 2 * WG); each keeps (m, l) of its head and key lane.
  let i0 = lid;
  let i1 = lid + WG;
  var ml0 = vec2<f32>(NEG, 0.0);
  var ml1 = vec2<f32>(NEG, 0.0);
  var acc0 = vec4<f32>(0.0);
  var acc1 = vec4<f32>(0.0);
  var acc2 = vec4<f32>(0.0);
  var acc3 = vec4<f32>(0.0);
  var acc4 = vec4<f32>(0.0);
  var acc5 = vec4<f32>(0.0);
  var acc6 = vec4<f32>(0.0);
  var acc7 = vec4<f32>(0.0);
  workgroupBarrier();

  for (var t0 = begin; t0 < end; t0 += TILE) {
    // (a)
    let base0 = row_base(kv, g, min(t0 + kt, end - 1u));
    let base1 = row_base(kv, g, min(t0 + kt + TILE / KPT, end - 1u));
    var dA0 = vec4<f32>(0.0);
    var dB0 = vec4<f32>(0.0);
    var dA1 = vec4<f32>(0.0);
    var dB1 = vec4<f32>(0.0);
    if (KV_F16) {
      for (var i = 0u; i < DO / SLICES; i++) {
        let e = c + i * SLICES;
        let qa0 = q_block(0u, e);
        let qa1 = q_block(0u, DO + e);
        let qb0 = q_block(G4 - 1u, e);
        let qb1 = q_block(G4 - 1u, DO + e);
        let w0 = k_cache[base0 + e];
        let k00 = vec4<f32>(unpack2x16float(w0.x), unpack2x16float(w0.y));
        let k01 = vec4<f32>(unpack2x16float(w0.z), unpack2x16float(w0.w));
        dA0 += qa0 * k00 + qa1 * k01;
        if (G > 4u) {
          dB0 += qb0 * k00 + qb1 * k01;
        }
        if (KPT > 1u) {
          let w1 = k_cache[base1 + e];
          let k10 = vec4<f32>(unpack2x16float(w1.x), unpack2x16float(w1.y));
          let k11 = vec4<f32>(unpack2x16float(w1.z), unpack2x16float(w1.w));
          dA1 += qa0 * k10 + qa1 * k11;
          if (G > 4u) {
            dB1 += qb0 * k10 + qb1 * k11;
          }
        }
      }
    } else {
      for (var i = 0u; i < DQ / SLICES; i++) {
        let e = c + i * SLICES;
        let qa = q_block(0u, e);
        let qb = q_block(G4 - 1u, e);
        let k0 = bitcast<vec4<f32>>(k_cache[base0 + e]);
        dA0 += qa * k0;
        if (G > 4u) {
          dB0 += qb * k0;
        }
        if (KPT > 1u) {
          let k1 = bitcast<vec4<f32>>(k_cache[base1 + e]);
          dA1 += qa * k1;
          if (G > 4u) {
            dB1 += qb * k1;
          }
        }
      }
    }
    put_parts(lid, dA0, dB0);
    if (KPT > 1u) {
      put_parts(lid + WG, dA1, dB1);
    }
    workgroupBarrier();
    // (b)
    var s0 = NEG;
    var s1 = NEG;
    if (i0 < SCORES) {
      s0 = score(i0, t0, end);
    }
    if (i1 < SCORES) {
      s1 = score(i1, t0, end);
    }
    workgroupBarrier();
    // (c)
    if (i0 < SCORES) {
      ml0 = softmax_step(i0, s0, ml0);
    }
    if (i1 < SCORES) {
      ml1 = softmax_step(i1, s1, ml1);
    }
    workgroupBarrier();
    // (d)
    let cA = corr_s[0];
    acc0 *= cA.x;
    acc1 *= cA.y;
    acc2 *= cA.z;
    acc3 *= cA.w;
    if (G > 4u) {
      let cB = corr_s[G4 - 1u];
      acc4 *= cB.x;
      acc5 *= cB.y;
      acc6 *= cB.z;
      acc7 *= cB.w;
    }
    for (var j = 0u; j < TILE / KQ; j++) {
      let t = kq + j * KQ;
      let row = min(t0 + t, end - 1u);
      let v = v_quad(v_cache[row_base(kv, g, row) + select(dq, dq / 2u, KV_F16)], dq);
      let pA = p_s[t * G4];
      acc0 = fma(vec4<f32>(pA.x), v, acc0);
      acc1 = fma(vec4<f32>(pA.y), v, acc1);
      acc2 = fma(vec4<f32>(pA.z), v, acc2);
      acc3 = fma(vec4<f32>(pA.w), v, acc3);
      if (G > 4u) {
        let pB = p_s[t * G4 + G4 - 1u];
        acc4 = fma(vec4<f32>(pB.x), v, acc4);
        acc5 = fma(vec4<f32>(pB.y), v, acc5);
        acc6 = fma(vec4<f32>(pB.z), v, acc6);
        acc7 = fma(vec4<f32>(pB.w), v, acc7);
      }
    }
    // No barrier here: the next tile's (a) writes only `part`, last read in this tile's (b).
  }

  // Each key lane's l for the head sums below; the barrier after it publishes them.
  if (i0 < SCORES) {
    sc[i0 / 4u][i0 % 4u] = ml0.y;
  }
  if (i1 < SCORES) {
    sc[i1 / 4u][i1 % 4u] = ml1.y;
  }
  // The key groups' O sums meet in qs (free now): groups 1, 2, ... added to group 0 in order.
  workgroupBarrier();
  for (var r = 1u; r < KQ; r++) {
    if (kq == r) {
      qs[0u * DQ + dq] = acc0;
      qs[1u * DQ + dq] = acc1;
      qs[2u * DQ + dq] = acc2;
      qs[3u * DQ + dq] = acc3;
      if (G > 4u) {
        qs[4u * DQ + dq] = acc4;
        qs[5u * DQ + dq] = acc5;
        qs[6u * DQ + dq] = acc6;
        qs[7u * DQ + dq] = acc7;
      }
    }
    workgroupBarrier();
    if (kq == 0u) {
      acc0 += qs[0u * DQ + dq];
      acc1 += qs[1u * DQ + dq];
      acc2 += qs[2u * DQ + dq];
      acc3 += qs[3u * DQ + dq];
      if (G > 4u) {
        acc4 += qs[4u * DQ + dq];
        acc5 += qs[5u * DQ + dq];
        acc6 += qs[6u * DQ + dq];
        acc7 += qs[7u * DQ + dq];
      }
    }
    workgroupBarrier();
  }

  let out_head0 = split * H_Q + g * G;
  let pob = col * (PO_COL / 4u);
  let mlb = col * ML_COL;
  if (kq == 0u) {
    put_o(0u, pob, out_head0, dq, acc0);
    put_o(1u, pob, out_head0, dq, acc1);
    put_o(2u, pob, out_head0, dq, acc2);
    put_o(3u, pob, out_head0, dq, acc3);
    put_o(4u, pob, out_head0, dq, acc4);
    put_o(5u, pob, out_head0, dq, acc5);
    put_o(6u, pob, out_head0, dq, acc6);
    put_o(7u, pob, out_head0, dq, acc7);
  }
  if (i0 < SCORES && i0 % TILE == 0u) {
    put_ml(i0, mlb, out_head0, ml0.x);
  }
  if (i1 < SCORES && i1 % TILE == 0u) {
    put_ml(i1, mlb, out_head0, ml1.x);
  }
}
