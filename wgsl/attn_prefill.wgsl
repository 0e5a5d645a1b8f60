// Causal gated attention for a chunk of nTok new tokens at positions p_t = pos0 + t, over the cache
// (positions 0..pos0-1 from earlier chunks, pos0.. written by attn_qk_rope for this chunk); spec §7 steps 6-7:
//   o[t][h] = sum_{u <= p_t} softmax_u(SCALE * q[t][h] . K[g][u]) V[g][u] * sigmoid(gate[t][h]),  g = h / (H_Q / H_KV)
// Flash-attention form: one pass over the keys in tiles of TILE with an online softmax in f32, both products
// as register-blocked GEMMs.
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
// the block's last position (tiles after it are never visited; the diagonal tiles are masked).
// The cache streams through one staging buffer in stages of TILE * DC elements: per tile D_H / DC stages of K
// (TILE keys by DC dims) then TILE / TV stages of V (TV = TILE * DC / D_H keys by D_H dims). Every stage's
// global loads go to registers one stage ahead and land in workgroup memory after the current stage's
// compute, so the cache latency hides behind the FMAs (2 barriers per stage). Per tile:
//   1. S = Q K^T: invocation (rl, kl) holds an SR x SK block of scores (rows rl*SR.., keys kl + j*KQ): per
//      quad of dims SR + SK quad loads feed 4 * SR * SK FMAs.
//   2. Scores are masked (u > p_t, u >= end) and scaled; per-row tile maxima meet in `red`; every invocation
//      holding a row keeps the same running max m, writes p = exp(s - m) to `ps` and (key lane 0) the
//      correction exp(m_old - m) to `corr_s`.
//   3. O = corr * O + P V: invocation (ol, dl) holds an OR x OD block of O (rows ol*OR.., quads dl + jq*DG)
//      and the row sums l of its rows (it reads every p of them): ODQ quads of V and OR broadcast loads of p
//      feed 4 * OR * ODQ FMAs per key.
// At the end, o = O / l * sigmoid(gate).
// Constants: const H_Q, H_KV, D_H, P_MAX, BQ, TILE, DC, SK, OD, WG: u32; const SCALE: f32; const KV_F16: bool.
// Limits (attn_prefill.ts checks them): H_Q % H_KV == 0; D_H % DC == 0; DC % 8 == 0; TILE * DC % D_H == 0;
// SK divides TILE, TILE / SK divides WG, WG / (TILE / SK) divides R; OD % 4 == 0, D_H / OD divides WG,
// WG / (D_H / OD) divides R; workgroup memory
// 16 * (R * (D_H / 4 + 1) + max(TILE * (DC / 4 + 1), TV * D_H / 4)) + 4 * (TILE * (R + 1) + R * TILE / SK + R)
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
// S phase: KQ key lanes by RQ row lanes, SR x SK scores each.
const KQ: u32 = TILE / SK;
const RQ: u32 = WG / KQ;
const SR: u32 = R / RQ;
const DCQ: u32 = DC / 4u;
// K stage rows padded by one quad: the KQ lanes of a warp read the same quad of different keys.
const KROW: u32 = DCQ + 1u;
const NCK: u32 = D_H / DC;
// V stage: TV keys of D_H dims, as many elements as a K stage.
const TV: u32 = TILE * DC / D_H;
const NVS: u32 = TILE / TV;
// O phase: DG dim lanes (quads dl, dl + DG, ...) by OG row lanes, OR x OD outputs each.
const ODQ: u32 = OD / 4u;
const DG: u32 = DQ / ODQ;
const OG: u32 = WG / DG;
const OR: u32 = R / OG;
// Row stride of ps: one word of padding, since the lanes writing p differ in key (row of ps).
const PROW: u32 = R + 1u;
const KV_QUADS: u32 = max(TILE * KROW, TV * DQ);
// Dims per global load (one vec4<u32>) and loads per stage per invocation (the last round guarded).
const LD: u32 = select(4u, 8u, KV_F16);
const STAGE_LOADS: u32 = TILE * DC / LD;
const NL: u32 = (STAGE_LOADS + WG - 1u) / WG;
// Stands in for -inf (a -inf constant is not expressible); exp(NEG - m) is 0 for every finite score m.
const NEG: f32 = -3.0e38;

var<workgroup> qs: array<vec4<f32>, R * QROW>;
var<workgroup> kv: array<vec4<f32>, KV_QUADS>;
var<workgroup> ps: array<f32, TILE * PROW>;
var<workgroup> red: array<f32, R * KQ>;
var<workgroup> corr_s: array<f32, R>;

// The next stage's cache words, loaded a stage ahead.
var<private> pre: array<vec4<u32>, NL>;

// Token of row r, clamped to the last present token so padding rows read valid data (never written).
fn row_token(blk: u32, r: u32, n: u32) -> u32 {
  return min(blk * BQ + r / G, n - 1u);
}

// Loads the stage of cache rows row0.. (K: TILE rows of dims d0..d0+DC-1; V: TV rows of all dims) into
// `pre`; rows from `end` on load as zeros (the cache past the chunk may hold anything, NaN included).
fn fetch(is_k: bool, kv_base: u32, row0: u32, d0: u32, end: u32, lid: u32) {
  let w = select(D_H, DC, is_k) / LD;
  for (var k = 0u; k < NL; k++) {
    let i = lid + k * WG;
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
    pre[k] = x;
  }
}

// Writes `pre` into kv: K stages as [TILE][KROW] quads, V stages as [TV][DQ].
fn commit(is_k: bool, lid: u32) {
  let w = select(D_H, DC, is_k) / LD;
  let stride = select(DQ, KROW, is_k);
  for (var k = 0u; k < NL; k++) {
    let i = lid + k * WG;
    if (i < STAGE_LOADS) {
      let at = (i / w) * stride + (i % w) * (LD / 4u);
      let x = pre[k];
      if (KV_F16) {
        kv[at] = vec4<f32>(unpack2x16float(x.x), unpack2x16float(x.y));
        kv[at + 1u] = vec4<f32>(unpack2x16float(x.z), unpack2x16float(x.w));
      } else {
        kv[at] = bitcast<vec4<f32>>(x);
      }
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
  fetch(true, kv_base, 0u, 0u, end, lid);

  for (var i = lid; i < R * DQ; i += WG) {
    let r = i / DQ;
    let t = row_token(blk, r, n);
    qs[r * QROW + i % DQ] = q[(t * H_Q + g * G + r % G) * DQ + i % DQ];
  }
  let kl = lid % KQ;
  let rl = lid / KQ;
  let dl = lid % DG;
  let ol = lid / DG;
  var m: array<f32, SR>;
  var qpos: array<u32, SR>;
  for (var i = 0u; i < SR; i++) {
    m[i] = NEG;
    qpos[i] = pos0 + row_token(blk, rl * SR + i, n);
  }
  var acc: array<vec4<f32>, OR * ODQ>;
  var l: array<f32, OR>;

  // Every row sees position 0 in the first tile, so m is a real score from then on.
  for (var t0 = 0u; t0 < end; t0 += TILE) {
    // Explicitly zeroed: a var without initializer inside a loop is zeroed once per invocation (naga).
    var s = array<f32, SR * SK>();
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
      let qd = ci * DCQ;
      for (var dq = 0u; dq < DCQ; dq++) {
        var kq: array<vec4<f32>, SK>;
        for (var j = 0u; j < SK; j++) {
          kq[j] = kv[(kl + j * KQ) * KROW + dq];
        }
        for (var i = 0u; i < SR; i++) {
          let qv = qs[(rl * SR + i) * QROW + qd + dq];
          for (var j = 0u; j < SK; j++) {
            let k4 = kq[j];
            s[i * SK + j] = fma(qv.w, k4.w, fma(qv.z, k4.z, fma(qv.y, k4.y, fma(qv.x, k4.x, s[i * SK + j]))));
          }
        }
      }
    }
    for (var i = 0u; i < SR; i++) {
      var mx = NEG;
      for (var j = 0u; j < SK; j++) {
        let u = t0 + kl + j * KQ;
        var v = NEG;
        if (u <= qpos[i] && u < end) {
          v = s[i * SK + j] * SCALE;
        }
        s[i * SK + j] = v;
        mx = max(mx, v);
      }
      red[(rl * SR + i) * KQ + kl] = mx;
    }
    // red is complete and every S read of kv is done: V stage 0 lands, the next one is fetched.
    workgroupBarrier();
    commit(false, lid);
    if (NVS > 1u) {
      fetch(false, kv_base, t0 + TV, 0u, end, lid);
    } else if (t0 + TILE < end) {
      fetch(true, kv_base, t0 + TILE, 0u, end, lid);
    }
    for (var i = 0u; i < SR; i++) {
      let r = rl * SR + i;
      var tm = NEG;
      for (var k = 0u; k < KQ; k++) {
        tm = max(tm, red[r * KQ + k]);
      }
      let mn = max(m[i], tm);
      if (kl == 0u) {
        corr_s[r] = exp(m[i] - mn);
      }
      m[i] = mn;
      for (var j = 0u; j < SK; j++) {
        ps[(kl + j * KQ) * PROW + r] = exp(s[i * SK + j] - mn);
      }
    }
    workgroupBarrier();
    for (var i = 0u; i < OR; i++) {
      let cr = corr_s[ol * OR + i];
      l[i] *= cr;
      for (var jq = 0u; jq < ODQ; jq++) {
        acc[i * ODQ + jq] *= cr;
      }
    }
    for (var vi = 0u; vi < NVS; vi++) {
      if (vi > 0u) {
        workgroupBarrier();
        commit(false, lid);
        workgroupBarrier();
        if (vi + 1u < NVS) {
          fetch(false, kv_base, t0 + (vi + 1u) * TV, 0u, end, lid);
        } else if (t0 + TILE < end) {
          fetch(true, kv_base, t0 + TILE, 0u, end, lid);
        }
      }
      for (var tt = 0u; tt < TV; tt++) {
        var vq: array<vec4<f32>, ODQ>;
        for (var jq = 0u; jq < ODQ; jq++) {
          vq[jq] = kv[tt * DQ + dl + jq * DG];
        }
        let pr = (vi * TV + tt) * PROW + ol * OR;
        for (var i = 0u; i < OR; i++) {
          let p = ps[pr + i];
          l[i] += p;
          for (var jq = 0u; jq < ODQ; jq++) {
            acc[i * ODQ + jq] = fma(vec4<f32>(p), vq[jq], acc[i * ODQ + jq]);
          }
        }
      }
    }
  }

  for (var i = 0u; i < OR; i++) {
    let r = ol * OR + i;
    let t = blk * BQ + r / G;
    if (t < n) {
      let row = t * H_Q + g * G + r % G;
      for (var jq = 0u; jq < ODQ; jq++) {
        let dq = dl + jq * DG;
        let gate = qf[row * 2u * DQ + DQ + dq];
        o[row * DQ + dq] = acc[i * ODQ + jq] / l[i] / (1.0 + exp(-gate));
      }
    }
  }
}
