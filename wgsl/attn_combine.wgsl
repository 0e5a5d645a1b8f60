// Merge of attn_decode's split partials plus the output gate (spec §7 steps 6-7), one query token:
//   M = max_s m_s;  o[h][d] = (sum_s exp(m_s - M) O_s[h][d]) / (sum_s exp(m_s - M) l_s) * sigmoid(gate_h[d])
// Empty splits carry m = NEG, l = 0, O = 0 and drop out (exp(NEG - M) = 0).
// Bindings:
//   part_o   f32 ne=[D_H, H_Q, N_SPLIT]   from attn_decode
//   part_ml  f32 ne=[2, H_Q, N_SPLIT]     from attn_decode
//   qf       f32 ne=[2*D_H, H_Q]          attn_q output; gate_h = qf[h][D_H..2*D_H)
//   o        f32 ne=[D_H, H_Q]            gated attention output (input of attn_output)
// Grid (H_Q): workgroup h owns head h; invocation i owns dims i, i + WG, ... and folds all N_SPLIT splits.
// Empty splits: m = NEG (finite), so the max is finite whenever N_SPLIT >= 1.
// Constants: const H_Q, D_H, N_SPLIT, WG: u32.
@group(0) @binding(0) var<storage, read> part_o: array<f32>;
@group(0) @binding(1) var<storage, read> part_ml: array<f32>;
@group(0) @binding(2) var<storage, read> qf: array<f32>;
@group(0) @binding(3) var<storage, read_write> o: array<f32>;

var<workgroup> wts: array<f32, N_SPLIT>;
var<workgroup> red: array<f32, WG>;

// Tree reduction of red[0..WG) with `op` = max (MAX) or + (else); every invocation gets the result.
fn reduce(lid: u32, v: f32, is_max: bool) -> f32 {
  red[lid] = v;
  workgroupBarrier();
  for (var o = WG / 2u; o > 0u; o >>= 1u) {
    if (lid < o) {
      let u = red[lid + o];
      red[lid] = select(red[lid] + u, max(red[lid], u), is_max);
    }
    workgroupBarrier();
  }
  let r = red[0];
  workgroupBarrier();
  return r;
}

// The splits' (m, l) pairs are spread over the invocations and reduced in workgroup memory, and each
// invocation folds the splits of its dims four at a time: a serial walk (one invocation reading 2·N_SPLIT
// pairs, then one split after another) chained ~100 load latencies, 41 µs per layer on the H200 (PERF.md).
@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3u, @builtin(local_invocation_index) lid: u32) {
  let h = wid.x;
  var mx = -3.4e38;
  for (var s = lid; s < N_SPLIT; s += WG) {
    mx = max(mx, part_ml[(s * H_Q + h) * 2u]);
  }
  let m = reduce(lid, mx, true);
  var l = 0.0;
  for (var s = lid; s < N_SPLIT; s += WG) {
    let w = exp(part_ml[(s * H_Q + h) * 2u] - m);
    wts[s] = w;
    l += w * part_ml[(s * H_Q + h) * 2u + 1u];
  }
  let inv_l = 1.0 / reduce(lid, l, false);
  for (var d = lid; d < D_H; d += WG) {
    var a = vec4<f32>(0.0);
    var s = 0u;
    for (; s + 4u <= N_SPLIT; s += 4u) {
      a += vec4<f32>(wts[s], wts[s + 1u], wts[s + 2u], wts[s + 3u]) * vec4<f32>(
        part_o[(s * H_Q + h) * D_H + d],
        part_o[((s + 1u) * H_Q + h) * D_H + d],
        part_o[((s + 2u) * H_Q + h) * D_H + d],
        part_o[((s + 3u) * H_Q + h) * D_H + d],
      );
    }
    var acc = (a.x + a.y) + (a.z + a.w);
    for (; s < N_SPLIT; s++) {
      acc += wts[s] * part_o[(s * H_Q + h) * D_H + d];
    }
    let gate = qf[h * 2u * D_H + D_H + d];
    o[h * D_H + d] = acc * inv_l / (1.0 + exp(-gate));
  }
}
