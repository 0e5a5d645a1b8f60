// Merge of attn_decode's split partials plus the output gate (spec §7 steps 6-7), one query token:
//   M = max_s m_s;  o[h][d] = (sum_s exp(m_s - M) O_s[h][d]) / (sum_s exp(m_s - M) l_s) * sigmoid(gate_h[d])
// Empty splits carry m = NEG, l = 0, O = 0 and drop out (exp(NEG - M) = 0).
// Bindings:
//   part_o   f32 ne=[D_H, H_Q, N_SPLIT]   from attn_decode
//   part_ml  f32 ne=[2, H_Q, N_SPLIT]     from attn_decode
//   qf       f32 ne=[2*D_H, H_Q]          attn_q output; gate_h = qf[h][D_H..2*D_H)
//   o        f32 ne=[D_H, H_Q]            gated attention output (input of attn_output)
// Grid (H_Q): workgroup h owns head h; invocation i owns dims i, i + WG, ... and folds all N_SPLIT splits.
// Constants: const H_Q, D_H, N_SPLIT, WG: u32.
@group(0) @binding(0) var<storage, read> part_o: array<f32>;
@group(0) @binding(1) var<storage, read> part_ml: array<f32>;
@group(0) @binding(2) var<storage, read> qf: array<f32>;
@group(0) @binding(3) var<storage, read_write> o: array<f32>;

var<workgroup> wts: array<f32, N_SPLIT>;
var<workgroup> denom: f32;

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3u, @builtin(local_invocation_index) lid: u32) {
  let h = wid.x;
  if (lid == 0u) {
    var mx = part_ml[h * 2u];
    for (var s = 1u; s < N_SPLIT; s++) {
      mx = max(mx, part_ml[(s * H_Q + h) * 2u]);
    }
    var l = 0.0;
    for (var s = 0u; s < N_SPLIT; s++) {
      let w = exp(part_ml[(s * H_Q + h) * 2u] - mx);
      wts[s] = w;
      l += w * part_ml[(s * H_Q + h) * 2u + 1u];
    }
    denom = l;
  }
  workgroupBarrier();
  let inv_l = 1.0 / denom;
  for (var d = lid; d < D_H; d += WG) {
    var acc = 0.0;
    for (var s = 0u; s < N_SPLIT; s++) {
      acc += wts[s] * part_o[(s * H_Q + h) * D_H + d];
    }
    let gate = qf[h * 2u * D_H + D_H + d];
    o[h * D_H + d] = acc * inv_l / (1.0 + exp(-gate));
  }
}
