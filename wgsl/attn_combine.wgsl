// Merge of attn_decode's split partials plus the output gate (spec §7 steps 6-7), one query token:
//   M = max_s m_s;  o[h][d] = (sum_s exp(m_s - M) O_s[h][d]) / (sum_s exp(m_s - M) l_s) * sigmoid(gate_h[d])
// over the splits attn_decode used at position p = params.pos0: per = max(PER_MIN, roundup(ceil((p + 1) /
// N_SPLIT), TILE)), used = ceil((p + 1) / per) (the same formula as attn_decode; the others hold nothing).
// Columns (grid z): a batched decode step merges one token of each of several sequences in one dispatch; column
// c runs exactly the code of a dispatch of its own on its slices (so its bits are a solo step's): its pos0 at
// word c·COL_WORDS of params (a batched step's column table, 64 words per column), its partials from word
// c·PO_COL of part_o and c·ML_COL of part_ml (each column's partials padded to 256 bytes), its qf at word
// c·QF_COL (2·D_H·H_Q: packed by token; more: a fused in-projection's columns) and its o at token c. One column: params is its own AttnParams, everything at offset 0.
// Bindings:
//   params   u32 [pos0, n_tokens] (AttnParams) per column   only pos0 is read
//   part_o   f32 ne=[D_H, H_Q, N_SPLIT]   from attn_decode
//   part_ml  f32 ne=[2, H_Q, N_SPLIT]     from attn_decode
//   qf       f32 ne=[2*D_H, H_Q]          attn_q output; gate_h = qf[h][D_H..2*D_H)
//   o        f32 ne=[D_H, H_Q]            gated attention output (input of attn_output)
// Grid (H_Q, ceil(D_H / CD), columns): workgroup (h, c, col) owns dims c*CD .. c*CD+CD-1 of head h of column col. Every workgroup
// reduces the used splits' (m, l) pairs itself (spread over the invocations, tree in workgroup memory); then
// invocation (sg, dl) folds splits sg, sg + SG, ... of dim c*CD + dl (SG = WG / CD split lanes), four loads
// in flight, and the SG partial sums meet in workgroup memory in a fixed order.
// Why so wide: at a 32k context attn_decode uses up to N_SPLIT = 256 splits (16 KiB of partials each), and
// 16 workgroups walking them one invocation per dim were latency-bound chains of loads.
// QX (a batched step's columns, whose attn_output reads int8 x): a workgroup owns 32 dims, one int8 chunk of
// o, as 32 / CD groups of CD dims in turn, each group's dims summed exactly as above (so o has the same bits),
// and also writes the chunk rounded to int8 in byte order LAYOUT as quantize_q8 would (lib/q8pack.wgsl, one
// invocation per quad word) into xq: column col's chunk c (c = (h·D_H + d) / 32) at word
// col·(K/4 + K/32) + 8c, its scale at col·(K/4 + K/32) + K/4 + c, K = H_Q·D_H. Then attn_output skips its own
// quantize_q8.
// Constants: const H_Q, D_H, N_SPLIT, TILE, PER_MIN, WG, CD, QF_COL, LAYOUT: u32; const QX: bool. Limits:
// WG % CD == 0; with QX 32 % CD == 0 and D_H % 32 == 0.
@group(0) @binding(0) var<storage, read> params: array<u32>;
@group(0) @binding(1) var<storage, read> part_o: array<f32>;
@group(0) @binding(2) var<storage, read> part_ml: array<f32>;
@group(0) @binding(3) var<storage, read> qf: array<f32>;
@group(0) @binding(4) var<storage, read_write> o: array<f32>;
@group(0) @binding(5) var<storage, read_write> xq: array<u32>;

const SG: u32 = WG / CD;
const COL_WORDS: u32 = 64u;
const PO_COL: u32 = (D_H * H_Q * N_SPLIT + 63u) / 64u * 64u;
const ML_COL: u32 = (2u * H_Q * N_SPLIT + 63u) / 64u * 64u;

// CD-dim groups per workgroup: with QX one int8 chunk of 32 dims.
const GROUPS: u32 = select(1u, 32u / CD, QX);
const K: u32 = H_Q * D_H;

var<workgroup> wts: array<f32, N_SPLIT>;
var<workgroup> red: array<f32, WG>;
// QX: the workgroup's 32 outputs.
var<workgroup> chunk: array<f32, 32>;

// Tree reduction of red[0..WG) with max (is_max) or +; every invocation gets the result.
fn reduce(lid: u32, v: f32, is_max: bool) -> f32 {
  red[lid] = v;
  workgroupBarrier();
  for (var k = WG / 2u; k > 0u; k >>= 1u) {
    if (lid < k) {
      let u = red[lid + k];
      red[lid] = select(red[lid] + u, max(red[lid], u), is_max);
    }
    workgroupBarrier();
  }
  let r = red[0];
  workgroupBarrier();
  return r;
}

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3u, @builtin(local_invocation_index) lid: u32) {
  let h = wid.x;
  let col = wid.z;
  let pob = col * PO_COL;
  let mlb = col * ML_COL;
  let ctx = params[col * COL_WORDS] + 1u;
  let per = max(PER_MIN, ((ctx + N_SPLIT - 1u) / N_SPLIT + TILE - 1u) / TILE * TILE);
  let used = min((ctx + per - 1u) / per, N_SPLIT);
  var mx = -3.4e38;
  for (var s = lid; s < used; s += WG) {
    mx = max(mx, part_ml[mlb + (s * H_Q + h) * 2u]);
  }
  let m = reduce(lid, mx, true);
  var l = 0.0;
  for (var s = lid; s < used; s += WG) {
    let w = exp(part_ml[mlb + (s * H_Q + h) * 2u] - m);
    wts[s] = w;
    l += w * part_ml[mlb + (s * H_Q + h) * 2u + 1u];
  }
  // The barriers inside reduce also publish wts.
  let inv_l = 1.0 / reduce(lid, l, false);
  let dl = lid % CD;
  let sg = lid / CD;
  for (var gi = 0u; gi < GROUPS; gi++) {
    let d = (wid.y * GROUPS + gi) * CD + dl;
    let dd = min(d, D_H - 1u);
    var a = vec4<f32>(0.0);
    var s = sg;
    for (; s + 3u * SG < used; s += 4u * SG) {
      a += vec4<f32>(wts[s], wts[s + SG], wts[s + 2u * SG], wts[s + 3u * SG]) * vec4<f32>(
        part_o[pob + (s * H_Q + h) * D_H + dd],
        part_o[pob + ((s + SG) * H_Q + h) * D_H + dd],
        part_o[pob + ((s + 2u * SG) * H_Q + h) * D_H + dd],
        part_o[pob + ((s + 3u * SG) * H_Q + h) * D_H + dd],
      );
    }
    var acc = (a.x + a.y) + (a.z + a.w);
    for (; s < used; s += SG) {
      acc += wts[s] * part_o[pob + (s * H_Q + h) * D_H + dd];
    }
    red[lid] = acc;
    workgroupBarrier();
    if (sg == 0u && d < D_H) {
      var sum = 0.0;
      for (var k = 0u; k < SG; k++) {
        sum += red[k * CD + dl];
      }
      let gate = qf[col * QF_COL + h * 2u * D_H + D_H + d];
      let v = sum * inv_l / (1.0 + exp(-gate));
      o[(col * H_Q + h) * D_H + d] = v;
      if (QX) {
        chunk[gi * CD + dl] = v;
      }
    }
    // The next group writes red again.
    workgroupBarrier();
  }
  if (QX && lid < 8u) {
    // Quad word m of the chunk: the chunk's largest |v| (each of the eight invocations finds it), then the
    // word in LAYOUT order and, from invocation 0, the scale.
    var amax = 0.0;
    for (var j = 0u; j < 8u; j++) {
      amax = max(amax, q8x_amax4(chunk_quad(j)));
    }
    let dv = q8x_d(amax);
    let m = lid;
    let wq = q8x_word_quads(LAYOUT, m);
    let c = (h * D_H) / 32u + wid.y;
    let qo = col * (K / 4u + K / 32u);
    xq[qo + 8u * c + m] = q8x_word(LAYOUT, m, chunk_quad(wq.x), chunk_quad(wq.y), dv.y);
    if (m == 0u) {
      xq[qo + K / 4u + c] = bitcast<u32>(dv.x);
    }
  }
}

// Quad j of the workgroup's chunk.
fn chunk_quad(j: u32) -> vec4<f32> {
  return vec4<f32>(chunk[4u * j], chunk[4u * j + 1u], chunk[4u * j + 2u], chunk[4u * j + 3u]);
}
