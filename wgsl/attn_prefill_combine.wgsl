// Merge of attn_prefill's key-split partials plus the output gate (spec §7 steps 6-7), per query row (t, h):
//   M = max_s m_s;  o[t][h] = (sum_s exp(m_s - M) O_s) / (sum_s exp(m_s - M) l_s) * sigmoid(gate[t][h])
// A split that saw no key of the row (m_s = NEG: empty, or all masked) weighs 0 and its O is not read. Every
// row has a split with a real m_s (the one holding key 0), so the sum of weights is >= 1.
// Bindings:
//   params  AttnParams { pos0: u32, n_tokens: u32 }   only n_tokens is read (rows of later tokens untouched)
//   part    f32 ne=[D_H + 4, NS, H_Q, nTok]   attn_prefill's o with NS > 1: per split D_H dims of O_s, then
//           (m_s, l_s, 0, 0)
//   qf      f32 ne=[2*D_H, H_Q, nTok]         attn_q output; gate_h = qf[t][h][D_H..2*D_H)
//   o       f32 ne=[D_H, H_Q, nTok]           gated attention output
// Grid (nTok, ceil(H_Q * D_H / 4 / WG)): invocation (t, i) owns quad i % (D_H / 4) of head i / (D_H / 4) of
// token t; the NS (m, l) quads of a row are read by each of its D_H / 4 invocations (cached).
// Constants: const H_Q, D_H, NS, WG: u32. Limits (attn_prefill_combine.ts): D_H % 4 == 0, NS >= 1.
struct AttnParams {
  pos0: u32,
  n_tokens: u32,
}

@group(0) @binding(0) var<storage, read> params: AttnParams;
@group(0) @binding(1) var<storage, read> part: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read> qf: array<vec4<f32>>;
@group(0) @binding(3) var<storage, read_write> o: array<vec4<f32>>;

const DQ: u32 = D_H / 4u;
const PQ: u32 = DQ + 1u;
// attn_prefill's stand-in for -inf.
const NEG: f32 = -3.0e38;

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3u, @builtin(local_invocation_index) lid: u32) {
  let t = wid.x;
  let i = wid.y * WG + lid;
  if (t >= params.n_tokens || i >= H_Q * DQ) {
    return;
  }
  let row = t * H_Q + i / DQ;
  let dq = i % DQ;
  let pb = row * NS * PQ;
  var mx = NEG;
  for (var s = 0u; s < NS; s++) {
    mx = max(mx, part[pb + s * PQ + DQ].x);
  }
  var acc = vec4<f32>(0.0);
  var l = 0.0;
  for (var s = 0u; s < NS; s++) {
    let ml = part[pb + s * PQ + DQ];
    if (ml.x > NEG) {
      let w = exp(ml.x - mx);
      l += w * ml.y;
      acc = fma(vec4<f32>(w), part[pb + s * PQ + dq], acc);
    }
  }
  o[row * DQ + dq] = acc / l / (1.0 + exp(-qf[row * 2u * DQ + DQ + dq]));
}
