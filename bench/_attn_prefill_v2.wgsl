// Copy of wgsl/attn_prefill.wgsl before the register-blocked rewrite (commit 8affc07), kept for bench/attention.ts only:
// the engine no longer runs it. bench/_attn_prefill_v2.ts picks its constants as the engine did.
// Causal gated attention for a chunk of nTok new tokens at positions p_t = pos0 + t, over the cache
// (positions 0..pos0-1 from earlier chunks, pos0.. written by attn_qk_rope for this chunk); spec §7 steps 6-7:
//   o[t][h] = sum_{u <= p_t} softmax_u(SCALE * q[t][h] . K[g][u]) V[g][u] * sigmoid(gate[t][h]),  g = h / (H_Q / H_KV)
// Flash-attention form: one pass over the keys in tiles of TILE with an online softmax in f32.
// Bindings:
//   params   AttnParams { pos0: u32, n_tokens: u32 }   tokens present (<= BQ * grid.x)
//   q        f32 ne=[D_H, H_Q, nTok]        normed, roped queries (attn_qk_rope q_out), read as vec4
//   qf       f32 ne=[2*D_H, H_Q, nTok]      attn_q output; gate_h = qf[t][h][D_H..2*D_H), read as vec4
//   k_cache  K[g][u][d], ne=[D_H, P_MAX, H_KV], holding positions 0..pos0+n_tokens-1: f32, or with KV_F16
//            two f16 per word (low half = even d); read as vec4<u32> (4 f32 or 8 f16 dims)
//   v_cache  V likewise
//   o        f32 ne=[D_H, H_Q, nTok]        gated attention output
// Grid (ceil(nTok / BQ), H_KV): workgroup (b, g) owns the R = BQ * G query rows of tokens b*BQ .. b*BQ+BQ-1
// and the G = H_Q / H_KV heads of KV head g (row r = token r / G, head g*G + r % G), so every K/V element it
// stages serves R rows (GQA). The R rows of q stay in workgroup memory for the whole pass. Keys run from 0 to
// the block's last position (tiles above the diagonal are never visited). Per tile:
//   1. S = Q K^T: K is staged DC dims at a time (TILE rows, padded stride); invocation (rl, kl) holds an
//      SR x SK block of scores (rows rl*SR.., keys kl + j*KQ) as vec4 partial sums: SR + SK quad loads feed
//      4 * SR * SK FMAs.
//   2. Scores are masked (u > p_t, u >= end) and scaled; per-row tile maxima meet in `red`; every invocation
//      keeps the running max m and a partial row sum l for its own rows (the same values in every
//      invocation holding a row, so they agree), writes p = exp(s - m) to `ps` and the correction
//      exp(m_old - m) to `corr_s`.
//   3. O = corr * O + P V: V is staged TV rows at a time; invocation (ol, dl) holds an OR x OD block of O
//      (rows ol*OR.., quads dl + jq*DG) in registers: one quad of V per row block and OR broadcast loads of p.
// At the end the partial row sums meet in `red` and the gate is applied.
// Constants: const H_Q, H_KV, D_H, P_MAX, BQ, TILE, DC, TV, SK, OD, WG: u32; const SCALE: f32;
// const KV_F16: bool.
// Limits (attn_prefill.ts checks them): H_Q % H_KV == 0; D_H % DC == 0; DC % 8 == 0; TILE % TV == 0;
// R * TILE % WG == 0; SPI = R * TILE / WG and TILE divisible by SK; WG % (TILE / SK) == 0; OD % 4 == 0;
// (D_H / OD) divides WG and R * D_H / WG is a multiple of OD; workgroup memory
// 16 * (R * D_H / 4 + max(TILE * (DC / 4 + 1), TV * D_H / 4)) + 4 * (TILE * (R + 1) + R * TILE / SK + R)
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
// S phase: KQ key lanes by RQ row lanes, SR x SK scores each.
const KQ: u32 = TILE / SK;
const RQ: u32 = WG / KQ;
const SR: u32 = R / RQ;
const DCQ: u32 = DC / 4u;
// K chunk rows are padded by one quad: the KQ lanes of a warp read the same quad of different rows.
const KROW: u32 = DCQ + 1u;
// O phase: DG dim lanes (quads dl, dl + DG, ...) by OG row lanes, OR x OD outputs each.
const ODQ: u32 = OD / 4u;
const DG: u32 = DQ / ODQ;
const OG: u32 = WG / DG;
const OR: u32 = R / OG;
// Row stride of ps: one word of padding, since the lanes writing p differ in key (row of ps).
const PROW: u32 = R + 1u;
const KV_QUADS: u32 = max(TILE * KROW, TV * DQ);
// Stands in for -inf (a -inf constant is not expressible); exp(NEG - m) is 0 for every finite score m.
const NEG: f32 = -3.0e38;

var<workgroup> qs: array<vec4<f32>, R * DQ>;
var<workgroup> kv: array<vec4<f32>, KV_QUADS>;
var<workgroup> ps: array<f32, TILE * PROW>;
var<workgroup> red: array<f32, R * KQ>;
var<workgroup> corr_s: array<f32, R>;

// Token of row r, clamped to the last present token so padding rows read valid data (never written).
fn row_token(blk: u32, r: u32, n: u32) -> u32 {
  return min(blk * BQ + r / G, n - 1u);
}

fn load_w(is_k: bool, i: u32) -> vec4<u32> {
  if (is_k) {
    return k_cache[i];
  }
  return v_cache[i];
}

// Stages quads d0/4 .. d0/4 + nq - 1 of cache rows t0 .. t0 + rows - 1 (element base kv_base) into
// kv[row * stride + quad]; rows from `end` on are zeros (the cache past the chunk may hold anything).
fn stage(is_k: bool, kv_base: u32, t0: u32, end: u32, rows: u32, d0: u32, nq: u32, stride: u32, lid: u32) {
  if (KV_F16) {
    // One vec4<u32> holds 8 f16 dims: two quads per load.
    let per = nq / 2u;
    for (var i = lid; i < rows * per; i += WG) {
      let row = i / per;
      let u = i % per;
      var w = vec4<u32>(0u);
      if (t0 + row < end) {
        w = load_w(is_k, (kv_base + (t0 + row) * D_H + d0) / 8u + u);
      }
      kv[row * stride + 2u * u] = vec4<f32>(unpack2x16float(w.x), unpack2x16float(w.y));
      kv[row * stride + 2u * u + 1u] = vec4<f32>(unpack2x16float(w.z), unpack2x16float(w.w));
    }
  } else {
    for (var i = lid; i < rows * nq; i += WG) {
      let row = i / nq;
      let u = i % nq;
      var w = vec4<u32>(0u);
      if (t0 + row < end) {
        w = load_w(is_k, (kv_base + (t0 + row) * D_H + d0) / 4u + u);
      }
      kv[row * stride + u] = bitcast<vec4<f32>>(w);
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
  let kv_base = g * P_MAX * D_H;

  for (var i = lid; i < R * DQ; i += WG) {
    let r = i / DQ;
    let t = row_token(blk, r, n);
    qs[i] = q[(t * H_Q + g * G + r % G) * DQ + i % DQ];
  }
  let kl = lid % KQ;
  let rl = lid / KQ;
  let dl = lid % DG;
  let ol = lid / DG;
  var m: array<f32, SR>;
  var lp: array<f32, SR>;
  var qpos: array<u32, SR>;
  for (var i = 0u; i < SR; i++) {
    m[i] = NEG;
    qpos[i] = pos0 + row_token(blk, rl * SR + i, n);
  }
  var acc: array<vec4<f32>, OR * ODQ>;

  // Every row sees position 0 in the first tile, so m is a real score from then on.
  for (var t0 = 0u; t0 < end; t0 += TILE) {
    // Explicitly zeroed: a var without initializer inside a loop is zeroed once per invocation (naga).
    var s4 = array<vec4<f32>, SR * SK>();
    for (var c = 0u; c < D_H; c += DC) {
      // The previous chunk's (or tile's P V) reads of kv are done; on the first pass, qs is staged.
      workgroupBarrier();
      stage(true, kv_base, t0, end, TILE, c, DCQ, KROW, lid);
      workgroupBarrier();
      for (var dq = 0u; dq < DCQ; dq++) {
        var kq: array<vec4<f32>, SK>;
        for (var j = 0u; j < SK; j++) {
          kq[j] = kv[(kl + j * KQ) * KROW + dq];
        }
        for (var i = 0u; i < SR; i++) {
          let qv = qs[(rl * SR + i) * DQ + c / 4u + dq];
          for (var j = 0u; j < SK; j++) {
            s4[i * SK + j] = fma(qv, kq[j], s4[i * SK + j]);
          }
        }
      }
    }
    var s: array<f32, SR * SK>;
    for (var i = 0u; i < SR; i++) {
      var mx = NEG;
      for (var j = 0u; j < SK; j++) {
        let u = t0 + kl + j * KQ;
        var v = NEG;
        if (u <= qpos[i] && u < end) {
          let a = s4[i * SK + j];
          v = ((a.x + a.y) + (a.z + a.w)) * SCALE;
        }
        s[i * SK + j] = v;
        mx = max(mx, v);
      }
      red[(rl * SR + i) * KQ + kl] = mx;
    }
    workgroupBarrier();
    // kv is free again (every S read came before the barrier): stage the first V rows meanwhile.
    stage(false, kv_base, t0, end, TV, 0u, DQ, DQ, lid);
    for (var i = 0u; i < SR; i++) {
      let r = rl * SR + i;
      var tm = NEG;
      for (var k = 0u; k < KQ; k++) {
        tm = max(tm, red[r * KQ + k]);
      }
      let mn = max(m[i], tm);
      let cc = exp(m[i] - mn);
      m[i] = mn;
      var sum = 0.0;
      for (var j = 0u; j < SK; j++) {
        let p = exp(s[i * SK + j] - mn);
        ps[(kl + j * KQ) * PROW + r] = p;
        sum += p;
      }
      lp[i] = lp[i] * cc + sum;
      if (kl == 0u) {
        corr_s[r] = cc;
      }
    }
    workgroupBarrier();
    for (var i = 0u; i < OR; i++) {
      let cr = corr_s[ol * OR + i];
      for (var jq = 0u; jq < ODQ; jq++) {
        acc[i * ODQ + jq] *= cr;
      }
    }
    for (var v0 = 0u; v0 < TILE; v0 += TV) {
      if (v0 > 0u) {
        workgroupBarrier();
        stage(false, kv_base, t0 + v0, end, TV, 0u, DQ, DQ, lid);
        workgroupBarrier();
      }
      for (var tt = 0u; tt < TV; tt++) {
        var vq: array<vec4<f32>, ODQ>;
        for (var jq = 0u; jq < ODQ; jq++) {
          vq[jq] = kv[tt * DQ + dl + jq * DG];
        }
        for (var i = 0u; i < OR; i++) {
          let p = vec4<f32>(ps[(v0 + tt) * PROW + ol * OR + i]);
          for (var jq = 0u; jq < ODQ; jq++) {
            acc[i * ODQ + jq] = fma(p, vq[jq], acc[i * ODQ + jq]);
          }
        }
      }
    }
  }

  // The last reads of red were before the last tile's softmax barrier.
  for (var i = 0u; i < SR; i++) {
    red[(rl * SR + i) * KQ + kl] = lp[i];
  }
  workgroupBarrier();
  for (var i = 0u; i < OR; i++) {
    let r = ol * OR + i;
    var l = 0.0;
    for (var k = 0u; k < KQ; k++) {
      l += red[r * KQ + k];
    }
    let t = blk * BQ + r / G;
    if (t < n) {
      let row = t * H_Q + g * G + r % G;
      for (var jq = 0u; jq < ODQ; jq++) {
        let dq = dl + jq * DG;
        let gate = qf[row * 2u * DQ + DQ + dq];
        o[row * DQ + dq] = acc[i * ODQ + jq] / l / (1.0 + exp(-gate));
      }
    }
  }
}
