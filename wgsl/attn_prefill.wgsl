// Causal gated attention for a chunk of nTok new tokens at positions p_t = pos0 + t, over the cache
// (positions 0..pos0-1 from earlier chunks, pos0.. written by attn_qk_rope for this chunk); spec §7 steps 6-7:
//   o[t][h] = sum_{u <= p_t} softmax_u(SCALE * q[t][h] . K[g][u]) V[g][u] * sigmoid(gate[t][h]),  g = h / (H_Q / H_KV)
// Flash-attention form: one pass over the keys in tiles of TILE with an online softmax in f32, both products
// as register-blocked GEMMs. Every per-invocation value is a named scalar or vector (no function-scope array
// indexed by a loop counter: naga bounds-clamps those and the H200's driver keeps them in local memory).
// Bindings:
//   params   AttnParams { pos0: u32, n_tokens: u32 }   tokens present (<= BQ * grid.x)
//   q        f32 ne=[D_H, H_Q, nTok]        normed, roped queries (attn_qk_rope q_out), read as vec4
//   qf       f32 ne=[2*D_H, H_Q, nTok]      attn_q output; gate_h = qf[t][h][D_H..2*D_H), read as vec4
//   k_cache  K[g][u][d], ne=[D_H, P_MAX, H_KV], holding positions 0..pos0+n_tokens-1: f32, or with KV_F16
//            two f16 per word (low half = even d); read as vec4<u32> (4 f32 or 8 f16 dims)
//   v_cache  V likewise
//   o        f32 ne=[D_H, H_Q, nTok]        gated attention output; with NS > 1 the partials instead,
//            ne=[D_H + 4, NS, H_Q, nTok]: row (t, h) of split s holds O_s = sum_u exp(s_u - m_s) V[u] over the
//            split's keys (unnormalized, ungated), then the quad (m_s, l_s, 0, 0); attn_prefill_combine merges
// Key splits (grid z, NS): split s of a block of keys 0..end-1 (nt = ceil(end / TILE) tiles) walks tiles
// s*per .. s*per+per-1, per = max(SPLIT_MIN, ceil(nt / NS)); at depth they multiply the workgroups by NS
// (a 512-token chunk alone is 256 workgroups on 132 SMs), near the diagonal the later splits are empty and
// only write (m, l) = (NEG, 0). A row sees the first key of its split or none of it (keys run from the
// split's first to the row's position): then its m stays NEG (its l and O are sums of exp(NEG - NEG) = 1,
// not 0) and the combine skips the split, as it skips empty ones.
// Grid (ceil(nTok / BQ), H_KV, NS): workgroup (b, g, s) owns the R = BQ * G query rows of tokens b*BQ .. b*BQ+BQ-1
// and the G = H_Q / H_KV heads of KV head g (row r = token r / G, head g*G + r % G), so every K/V element it
// stages serves R rows (GQA). The R rows of q stay in workgroup memory for the whole pass, or with Q_GLOBAL
// are read from the q binding at each use (L1-cached; the score lanes of a warp read 2 rows): that frees
// two thirds of the 48 KiB for wider stages (DC) or more rows (BQ). Keys run from 0 to the block's last
// position (tiles after it are never visited; the diagonal tiles are masked).
// The cache streams through one staging buffer in stages of TILE * DC elements: per tile D_H / DC stages of K
// (TILE keys by DC dims) then TILE / TV stages of V (TV = TILE * DC / D_H keys by D_H dims). Every stage's
// global loads go to registers one stage ahead and land in workgroup memory after the current stage's
// compute, so the cache latency hides behind the FMAs (2 barriers per stage). Per tile:
//   1. S = Q K^T: invocation (rl, kl) holds a 4 x 4 block of scores s0..s3 (row rl*4 + i, keys kl + j*KQ as
//      components j): per quad of dims 4 + 4 quad loads feed 64 FMAs.
//   2. Scores are masked (u > p_t, u >= end) and scaled; per-row tile maxima meet in `red`; every invocation
//      holding a row keeps the same running max m, writes p = exp(s - m) to `ps` and (key lane 0) the
//      correction exp(m_old - m) to `corr_s`.
//   3. O = corr * O + P V: invocation (ol, dl) holds a 4 x 16 block of O (aIJ: row ol*4 + I, quad dl + J*DG)
//      and the row sums l of its rows (it reads every p of them): 4 quads of V and 4 broadcast loads of p
//      feed 64 FMAs per key.
// At the end, o = O / l * sigmoid(gate).
// Constants: const H_Q, H_KV, D_H, P_MAX, BQ, TILE, DC, WG, NS, SPLIT_MIN: u32; const SCALE: f32;
// const KV_F16, Q_GLOBAL: bool.
// Limits (attn_prefill.ts checks them): H_Q % H_KV == 0; R % 4 == 0; D_H % 64 == 0; TILE == D_H / 4 and
// WG == R * D_H / 64 (the 4 x 4 and 4 x 16 blocks cover the tile's scores and O exactly); D_H % DC == 0;
// DC % 8 == 0; a stage is at most 8 loads per invocation (TILE * DC / (4 or 8) <= 8 * WG); workgroup memory
// 16 * (QS + max(TILE * (DC / 4 + 1), TV * D_H / 4)) + 4 * (PS + R * TILE / 4 + R), QS = R * (D_H / 4 + 1) and
// PS = TILE * (R + 1) (with Q_GLOBAL: QS = 1, PS = TILE * (R + 4) + 1)
// bytes <= the device limit (48 KiB on the H200, 32 KiB on lavapipe).
struct AttnParams {
  pos0: u32,
  n_tokens: u32,
}

@group(0) @binding(0) var<storage, read> params: AttnParams;
@group(0) @binding(1) var<storage, read> q: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read> qf: array<vec4<f32>>;
@group(0) @binding(3) var<storage, read> k_cache: array<vec4<u32>>;
@group(0) @binding(4) var<storage, read> v_cache: array<vec4<u32>>;
@group(0) @binding(5) var<storage, read_write> o: array<vec4<f32>>;

const G: u32 = H_Q / H_KV;
const R: u32 = BQ * G;
const DQ: u32 = D_H / 4u;
// q rows padded by one quad: the row lanes of a warp read the same quad of different rows.
const QROW: u32 = DQ + 1u;
// S phase: KQ key lanes by WG / KQ row lanes, 4 x 4 scores each.
const KQ: u32 = TILE / 4u;
const DCQ: u32 = DC / 4u;
// K stage rows padded by one quad: the KQ lanes of a warp read the same quad of different keys.
const KROW: u32 = DCQ + 1u;
const NCK: u32 = D_H / DC;
// V stage: TV keys of D_H dims, as many elements as a K stage.
const TV: u32 = TILE * DC / D_H;
const NVS: u32 = TILE / TV;
// O phase: DG dim lanes (quads dl, dl + DG, dl + 2 DG, dl + 3 DG) by WG / DG row lanes, 4 x 16 outputs each.
const DG: u32 = DQ / 4u;
// Row stride of ps: one word of padding, since the lanes writing p differ in key (row of ps).
const PROW: u32 = R + 1u;
// With Q_GLOBAL (workgroup memory to spare) p is kept as quads of 4 rows instead, ps4[key * PQ4 + r / 4]
// (one quad of padding per key): 4 quad stores per invocation per tile and one quad load per key.
const PQ4: u32 = R / 4u + 1u;
const KV_QUADS: u32 = max(TILE * KROW, TV * DQ);
// Dims per global load (one vec4<u32>) and loads per stage per invocation (<= 8; the last round guarded).
const LD: u32 = select(4u, 8u, KV_F16);
const STAGE_LOADS: u32 = TILE * DC / LD;
const NL: u32 = (STAGE_LOADS + WG - 1u) / WG;
// Quads per partial row (NS > 1): D_H / 4 of O, then (m, l, 0, 0).
const PQ: u32 = DQ + 1u;
// Stands in for -inf (a -inf constant is not expressible); exp(NEG - m) is 0 for every finite score m.
const NEG: f32 = -3.0e38;

var<workgroup> qs: array<vec4<f32>, select(R * QROW, 1u, Q_GLOBAL)>;
var<workgroup> kv: array<vec4<f32>, KV_QUADS>;
var<workgroup> ps: array<f32, select(TILE * PROW, 1u, Q_GLOBAL)>;
var<workgroup> ps4: array<vec4<f32>, select(1u, TILE * PQ4, Q_GLOBAL)>;
var<workgroup> red: array<f32, R * KQ>;
var<workgroup> corr_s: array<f32, R>;

// The next stage's cache words, loaded a stage ahead (pre0 .. pre{NL-1} in use).
var<private> pre0: vec4<u32>;
var<private> pre1: vec4<u32>;
var<private> pre2: vec4<u32>;
var<private> pre3: vec4<u32>;
var<private> pre4: vec4<u32>;
var<private> pre5: vec4<u32>;
var<private> pre6: vec4<u32>;
var<private> pre7: vec4<u32>;

// Token of row r, clamped to the last present token so padding rows read valid data (never written).
fn row_token(blk: u32, r: u32, n: u32) -> u32 {
  return min(blk * BQ + r / G, n - 1u);
}

// Index of the first quad of row r's query in q (its token clamped like row_token's).
fn q_row(blk: u32, r: u32, n: u32, g: u32) -> u32 {
  return (row_token(blk, r, n) * H_Q + g * G + r % G) * DQ;
}

// Load i of a stage of cache rows row0.. (K: TILE rows of dims d0..d0+DC-1; V: TV rows of all dims); rows
// from `end` on and loads past the stage are zeros (the cache past the chunk may hold anything, NaN too).
fn fetch1(is_k: bool, kv_base: u32, row0: u32, d0: u32, end: u32, i: u32) -> vec4<u32> {
  let w = select(D_H, DC, is_k) / LD;
  let row = i / w;
  var x = vec4<u32>(0u);
  if (i < STAGE_LOADS && row0 + row < end) {
    let e = (kv_base + (row0 + row) * D_H + d0) / LD + i % w;
    if (is_k) {
      x = k_cache[e];
    } else {
      x = v_cache[e];
    }
  }
  return x;
}

fn fetch(is_k: bool, kv_base: u32, row0: u32, d0: u32, end: u32, lid: u32) {
  pre0 = fetch1(is_k, kv_base, row0, d0, end, lid);
  if (NL > 1u) { pre1 = fetch1(is_k, kv_base, row0, d0, end, lid + WG); }
  if (NL > 2u) { pre2 = fetch1(is_k, kv_base, row0, d0, end, lid + 2u * WG); }
  if (NL > 3u) { pre3 = fetch1(is_k, kv_base, row0, d0, end, lid + 3u * WG); }
  if (NL > 4u) { pre4 = fetch1(is_k, kv_base, row0, d0, end, lid + 4u * WG); }
  if (NL > 5u) { pre5 = fetch1(is_k, kv_base, row0, d0, end, lid + 5u * WG); }
  if (NL > 6u) { pre6 = fetch1(is_k, kv_base, row0, d0, end, lid + 6u * WG); }
  if (NL > 7u) { pre7 = fetch1(is_k, kv_base, row0, d0, end, lid + 7u * WG); }
}

// Writes load i into kv: K stages as [TILE][KROW] quads, V stages as [TV][DQ].
fn commit1(is_k: bool, i: u32, x: vec4<u32>) {
  let w = select(D_H, DC, is_k) / LD;
  let stride = select(DQ, KROW, is_k);
  if (i < STAGE_LOADS) {
    let at = (i / w) * stride + (i % w) * (LD / 4u);
    if (KV_F16) {
      kv[at] = vec4<f32>(unpack2x16float(x.x), unpack2x16float(x.y));
      kv[at + 1u] = vec4<f32>(unpack2x16float(x.z), unpack2x16float(x.w));
    } else {
      kv[at] = bitcast<vec4<f32>>(x);
    }
  }
}

fn commit(is_k: bool, lid: u32) {
  commit1(is_k, lid, pre0);
  if (NL > 1u) { commit1(is_k, lid + WG, pre1); }
  if (NL > 2u) { commit1(is_k, lid + 2u * WG, pre2); }
  if (NL > 3u) { commit1(is_k, lid + 3u * WG, pre3); }
  if (NL > 4u) { commit1(is_k, lid + 4u * WG, pre4); }
  if (NL > 5u) { commit1(is_k, lid + 5u * WG, pre5); }
  if (NL > 6u) { commit1(is_k, lid + 6u * WG, pre6); }
  if (NL > 7u) { commit1(is_k, lid + 7u * WG, pre7); }
}

// s + (q . k0, q . k1, q . k2, q . k3): 16 FMAs.
fn qk4(q: vec4<f32>, k0: vec4<f32>, k1: vec4<f32>, k2: vec4<f32>, k3: vec4<f32>, s: vec4<f32>) -> vec4<f32> {
  var r = fma(vec4<f32>(q.x), vec4<f32>(k0.x, k1.x, k2.x, k3.x), s);
  r = fma(vec4<f32>(q.y), vec4<f32>(k0.y, k1.y, k2.y, k3.y), r);
  r = fma(vec4<f32>(q.z), vec4<f32>(k0.z, k1.z, k2.z, k3.z), r);
  return fma(vec4<f32>(q.w), vec4<f32>(k0.w, k1.w, k2.w, k3.w), r);
}

// Scaled scores of one row, NEG where the key u is after the row's position or past `end`.
fn masked(s: vec4<f32>, u: vec4<u32>, qpos: u32, end: u32) -> vec4<f32> {
  return select(vec4<f32>(NEG), s * SCALE, (u <= vec4<u32>(qpos)) & (u < vec4<u32>(end)));
}

fn max4(v: vec4<f32>) -> f32 {
  return max(max(v.x, v.y), max(v.z, v.w));
}

// p of row r at keys kl, kl + KQ, kl + 2 KQ, kl + 3 KQ.
fn store_p(r: u32, kl: u32, p: vec4<f32>) {
  ps[kl * PROW + r] = p.x;
  ps[(kl + KQ) * PROW + r] = p.y;
  ps[(kl + 2u * KQ) * PROW + r] = p.z;
  ps[(kl + 3u * KQ) * PROW + r] = p.w;
}

// Gated output of row r (token blk*BQ + r / G) at quads dl + j*DG: a0..a3 / l * sigmoid(gate).
fn write_row(blk: u32, r: u32, n: u32, g: u32, dl: u32, l: f32, a0: vec4<f32>, a1: vec4<f32>, a2: vec4<f32>, a3: vec4<f32>) {
  let t = blk * BQ + r / G;
  if (t < n) {
    let row = t * H_Q + g * G + r % G;
    let gb = row * 2u * DQ + DQ + dl;
    let ob = row * DQ + dl;
    o[ob] = a0 / l / (1.0 + exp(-qf[gb]));
    o[ob + DG] = a1 / l / (1.0 + exp(-qf[gb + DG]));
    o[ob + 2u * DG] = a2 / l / (1.0 + exp(-qf[gb + 2u * DG]));
    o[ob + 3u * DG] = a3 / l / (1.0 + exp(-qf[gb + 3u * DG]));
  }
}

// Split s's partial of row r (NS > 1): O at quads dl + j*DG unnormalized, (m, l) by lane dl == 0.
fn write_part(blk: u32, r: u32, n: u32, g: u32, s: u32, dl: u32, m: f32, l: f32, a0: vec4<f32>, a1: vec4<f32>, a2: vec4<f32>, a3: vec4<f32>) {
  let t = blk * BQ + r / G;
  if (t < n) {
    let pb = ((t * H_Q + g * G + r % G) * NS + s) * PQ;
    o[pb + dl] = a0;
    o[pb + dl + DG] = a1;
    o[pb + dl + 2u * DG] = a2;
    o[pb + dl + 3u * DG] = a3;
    if (dl == 0u) {
      o[pb + DQ] = vec4<f32>(m, l, 0.0, 0.0);
    }
  }
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
  // This split's keys ta..tb-1 (NS = 1: all of them).
  let split = wid.z;
  let nt = (end + TILE - 1u) / TILE;
  let per = max(SPLIT_MIN, (nt + NS - 1u) / NS);
  let ta = min(split * per, nt) * TILE;
  let tb = min(ta + per * TILE, end);
  let dl = lid % DG;
  let o0 = (lid / DG) * 4u;
  if (ta >= tb) {
    // An empty split (uniform per workgroup): its rows' (m, l) only; the combine skips its O.
    if (dl == 0u) {
      for (var i = 0u; i < 4u; i++) {
        let t = blk * BQ + (o0 + i) / G;
        if (t < n) {
          o[((t * H_Q + g * G + (o0 + i) % G) * NS + split) * PQ + DQ] = vec4<f32>(NEG, 0.0, 0.0, 0.0);
        }
      }
    }
    return;
  }
  let kv_base = g * P_MAX * D_H;
  fetch(true, kv_base, ta, 0u, end, lid);

  for (var i = lid; i < R * DQ && !Q_GLOBAL; i += WG) {
    let r = i / DQ;
    let t = row_token(blk, r, n);
    qs[r * QROW + i % DQ] = q[(t * H_Q + g * G + r % G) * DQ + i % DQ];
  }
  let kl = lid % KQ;
  // KQ == DG (TILE == D_H / 4): the rows r0.. of the S phase are the rows o0.. of the O phase.
  let r0 = (lid / KQ) * 4u;
  // Q_GLOBAL: the first quad of rows r0..r0+3 in q.
  let qg0 = q_row(blk, r0, n, g);
  let qg1 = q_row(blk, r0 + 1u, n, g);
  let qg2 = q_row(blk, r0 + 2u, n, g);
  let qg3 = q_row(blk, r0 + 3u, n, g);
  let qpos = vec4<u32>(pos0) + vec4<u32>(
    row_token(blk, r0, n),
    row_token(blk, r0 + 1u, n),
    row_token(blk, r0 + 2u, n),
    row_token(blk, r0 + 3u, n),
  );
  var m = vec4<f32>(NEG);
  var l = vec4<f32>(0.0);
  var a00 = vec4<f32>(0.0);
  var a01 = vec4<f32>(0.0);
  var a02 = vec4<f32>(0.0);
  var a03 = vec4<f32>(0.0);
  var a10 = vec4<f32>(0.0);
  var a11 = vec4<f32>(0.0);
  var a12 = vec4<f32>(0.0);
  var a13 = vec4<f32>(0.0);
  var a20 = vec4<f32>(0.0);
  var a21 = vec4<f32>(0.0);
  var a22 = vec4<f32>(0.0);
  var a23 = vec4<f32>(0.0);
  var a30 = vec4<f32>(0.0);
  var a31 = vec4<f32>(0.0);
  var a32 = vec4<f32>(0.0);
  var a33 = vec4<f32>(0.0);

  // NS = 1: every row sees position 0 in the first tile, so m is a real score from then on.
  for (var t0 = ta; t0 < tb; t0 += TILE) {
    var s0 = vec4<f32>(0.0);
    var s1 = vec4<f32>(0.0);
    var s2 = vec4<f32>(0.0);
    var s3 = vec4<f32>(0.0);
    for (var ci = 0u; ci < NCK; ci++) {
      // The previous stage's reads of kv are done; on the first pass, qs is staged.
      workgroupBarrier();
      commit(true, lid);
      workgroupBarrier();
      if (ci + 1u < NCK) {
        fetch(true, kv_base, t0, (ci + 1u) * DC, end, lid);
      } else {
        fetch(false, kv_base, t0, 0u, end, lid);
      }
      let qb = r0 * QROW + ci * DCQ;
      let qc = ci * DCQ;
      for (var dq = 0u; dq < DCQ; dq++) {
        let k0 = kv[kl * KROW + dq];
        let k1 = kv[(kl + KQ) * KROW + dq];
        let k2 = kv[(kl + 2u * KQ) * KROW + dq];
        let k3 = kv[(kl + 3u * KQ) * KROW + dq];
        if (Q_GLOBAL) {
          s0 = qk4(q[qg0 + qc + dq], k0, k1, k2, k3, s0);
          s1 = qk4(q[qg1 + qc + dq], k0, k1, k2, k3, s1);
          s2 = qk4(q[qg2 + qc + dq], k0, k1, k2, k3, s2);
          s3 = qk4(q[qg3 + qc + dq], k0, k1, k2, k3, s3);
        } else {
          s0 = qk4(qs[qb + dq], k0, k1, k2, k3, s0);
          s1 = qk4(qs[qb + QROW + dq], k0, k1, k2, k3, s1);
          s2 = qk4(qs[qb + 2u * QROW + dq], k0, k1, k2, k3, s2);
          s3 = qk4(qs[qb + 3u * QROW + dq], k0, k1, k2, k3, s3);
        }
      }
    }
    let u = vec4<u32>(t0 + kl) + vec4<u32>(0u, KQ, 2u * KQ, 3u * KQ);
    s0 = masked(s0, u, qpos.x, end);
    s1 = masked(s1, u, qpos.y, end);
    s2 = masked(s2, u, qpos.z, end);
    s3 = masked(s3, u, qpos.w, end);
    red[r0 * KQ + kl] = max4(s0);
    red[(r0 + 1u) * KQ + kl] = max4(s1);
    red[(r0 + 2u) * KQ + kl] = max4(s2);
    red[(r0 + 3u) * KQ + kl] = max4(s3);
    // red is complete and every S read of kv is done: V stage 0 lands, the next one is fetched.
    workgroupBarrier();
    commit(false, lid);
    if (NVS > 1u) {
      fetch(false, kv_base, t0 + TV, 0u, end, lid);
    } else if (t0 + TILE < tb) {
      fetch(true, kv_base, t0 + TILE, 0u, end, lid);
    }
    var tm = vec4<f32>(NEG);
    for (var k = 0u; k < KQ; k++) {
      tm = max(tm, vec4<f32>(red[r0 * KQ + k], red[(r0 + 1u) * KQ + k], red[(r0 + 2u) * KQ + k], red[(r0 + 3u) * KQ + k]));
    }
    let mn = max(m, tm);
    if (kl == 0u) {
      let cr = exp(m - mn);
      corr_s[r0] = cr.x;
      corr_s[r0 + 1u] = cr.y;
      corr_s[r0 + 2u] = cr.z;
      corr_s[r0 + 3u] = cr.w;
    }
    m = mn;
    let p0 = exp(s0 - mn.x);
    let p1 = exp(s1 - mn.y);
    let p2 = exp(s2 - mn.z);
    let p3 = exp(s3 - mn.w);
    if (Q_GLOBAL) {
      let rq = r0 / 4u;
      ps4[kl * PQ4 + rq] = vec4<f32>(p0.x, p1.x, p2.x, p3.x);
      ps4[(kl + KQ) * PQ4 + rq] = vec4<f32>(p0.y, p1.y, p2.y, p3.y);
      ps4[(kl + 2u * KQ) * PQ4 + rq] = vec4<f32>(p0.z, p1.z, p2.z, p3.z);
      ps4[(kl + 3u * KQ) * PQ4 + rq] = vec4<f32>(p0.w, p1.w, p2.w, p3.w);
    } else {
      store_p(r0, kl, p0);
      store_p(r0 + 1u, kl, p1);
      store_p(r0 + 2u, kl, p2);
      store_p(r0 + 3u, kl, p3);
    }
    workgroupBarrier();
    let cr = vec4<f32>(corr_s[o0], corr_s[o0 + 1u], corr_s[o0 + 2u], corr_s[o0 + 3u]);
    l *= cr;
    a00 *= cr.x;
    a01 *= cr.x;
    a02 *= cr.x;
    a03 *= cr.x;
    a10 *= cr.y;
    a11 *= cr.y;
    a12 *= cr.y;
    a13 *= cr.y;
    a20 *= cr.z;
    a21 *= cr.z;
    a22 *= cr.z;
    a23 *= cr.z;
    a30 *= cr.w;
    a31 *= cr.w;
    a32 *= cr.w;
    a33 *= cr.w;
    for (var vi = 0u; vi < NVS; vi++) {
      if (vi > 0u) {
        workgroupBarrier();
        commit(false, lid);
        workgroupBarrier();
        if (vi + 1u < NVS) {
          fetch(false, kv_base, t0 + (vi + 1u) * TV, 0u, end, lid);
        } else if (t0 + TILE < tb) {
          fetch(true, kv_base, t0 + TILE, 0u, end, lid);
        }
      }
      for (var tt = 0u; tt < TV; tt++) {
        let vb = tt * DQ + dl;
        let v0 = kv[vb];
        let v1 = kv[vb + DG];
        let v2 = kv[vb + 2u * DG];
        let v3 = kv[vb + 3u * DG];
        var p: vec4<f32>;
        if (Q_GLOBAL) {
          p = ps4[(vi * TV + tt) * PQ4 + o0 / 4u];
        } else {
          let pr = (vi * TV + tt) * PROW + o0;
          p = vec4<f32>(ps[pr], ps[pr + 1u], ps[pr + 2u], ps[pr + 3u]);
        }
        l += p;
        a00 = fma(vec4<f32>(p.x), v0, a00);
        a01 = fma(vec4<f32>(p.x), v1, a01);
        a02 = fma(vec4<f32>(p.x), v2, a02);
        a03 = fma(vec4<f32>(p.x), v3, a03);
        a10 = fma(vec4<f32>(p.y), v0, a10);
        a11 = fma(vec4<f32>(p.y), v1, a11);
        a12 = fma(vec4<f32>(p.y), v2, a12);
        a13 = fma(vec4<f32>(p.y), v3, a13);
        a20 = fma(vec4<f32>(p.z), v0, a20);
        a21 = fma(vec4<f32>(p.z), v1, a21);
        a22 = fma(vec4<f32>(p.z), v2, a22);
        a23 = fma(vec4<f32>(p.z), v3, a23);
        a30 = fma(vec4<f32>(p.w), v0, a30);
        a31 = fma(vec4<f32>(p.w), v1, a31);
        a32 = fma(vec4<f32>(p.w), v2, a32);
        a33 = fma(vec4<f32>(p.w), v3, a33);
      }
    }
  }

  if (NS > 1u) {
    write_part(blk, o0, n, g, split, dl, m.x, l.x, a00, a01, a02, a03);
    write_part(blk, o0 + 1u, n, g, split, dl, m.y, l.y, a10, a11, a12, a13);
    write_part(blk, o0 + 2u, n, g, split, dl, m.z, l.z, a20, a21, a22, a23);
    write_part(blk, o0 + 3u, n, g, split, dl, m.w, l.w, a30, a31, a32, a33);
  } else {
    write_row(blk, o0, n, g, dl, l.x, a00, a01, a02, a03);
    write_row(blk, o0 + 1u, n, g, dl, l.y, a10, a11, a12, a13);
    write_row(blk, o0 + 2u, n, g, dl, l.z, a20, a21, a22, a23);
    write_row(blk, o0 + 3u, n, g, dl, l.w, a30, a31, a32, a33);
  }
}
