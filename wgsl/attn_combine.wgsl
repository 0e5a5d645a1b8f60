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
// Constants: const H_Q, D_H, N_SPLIT, TILE, PER_MIN, WG, CD, QF_COL: u32. Limits: WG % CD == 0.
@group(0) @binding(0) var<storage, read> params: array<u32>;
@group(0) @binding(1) var<storage, read> part_o: array<f32>;
@group(0) @binding(2) var<storage, read> part_ml: array<f32>;
@group(0) @binding(3) var<storage, read> qf: array<f32>;
@group(0) @binding(4) var<storage, read_write> o: array<f32>;

const SG: u32 = WG / CD;
const COL_WORDS: u32 = 64u;
const PO_COL: u32 = (D_H * H_Q * N_SPLIT + 63u) / 64u * 64u;
const ML_COL: u32 = (2u * H_Q * N_SPLIT + 63u) / 64u * 64u;

var<workgroup> wts: array<f32, N_SPLIT>;
var<workgroup> red: array<f32, WG>;

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
  let d = wid.y * CD + dl;
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
    o[(col * H_Q + h) * D_H + d] = sum * inv_l / (1.0 + exp(-gate));
  }
}
