// route: MoE routing of one token by one workgroup of WG invocations (spec §10): pi = softmax(logits);
// S = the N_EXPERT_USED largest pi (ties to the lower index), in descending order;
// w_e = pi_e / max(sum_{e' in S} pi_e', 6.1035e-5) * W_SCALE (ggml's lower bound on the sum).
// Computed as w_e = exp(l_e - l_top) / sum_{e' in S} exp(l_e' - l_top) * W_SCALE, l_top the largest logit: the
// softmax's denominator cancels, and the bound never binds (the N_EXPERT_USED largest of N_EXPERT
// probabilities sum to at least N_EXPERT_USED / N_EXPERT >= 1/4096 > 6.1035e-5), so no max or sum over all
// experts is needed. Ranking uses the logits (softmax is monotonic), so f32 rounding of pi can never reorder
// or tie experts. The logits sit in workgroup memory; invocation i ranks experts i, i + WG, ...:
// rank(e) = #{e' : l_e' > l_e or (l_e' == l_e and e' < e)}, and an expert with rank < N_EXPERT_USED writes
// itself to slot rank (ranks are distinct). NaN logits are not supported.
// The including kernel defines `fn route_logit(t: u32, e: u32) -> f32` (logit e of token t) and the constants
// N_EXPERT, N_EXPERT_USED, WG: u32 (WG a power of two <= 256) and W_SCALE: f32. Workgroup memory:
// 4·N_EXPERT + 8·N_EXPERT_USED bytes.

var<workgroup> route_lg: array<f32, N_EXPERT>;
// After route_token: the selected experts, most probable first, and their weights.
var<workgroup> route_id: array<u32, N_EXPERT_USED>;
var<workgroup> route_w: array<f32, N_EXPERT_USED>;

// Routes token t; every invocation of the workgroup must call it (barriers). On return route_id and
// route_w hold the selection for every invocation.
fn route_token(t: u32, lid: u32) {
  for (var e = lid; e < N_EXPERT; e += WG) {
    route_lg[e] = route_logit(t, e);
  }
  workgroupBarrier();
  for (var e = lid; e < N_EXPERT; e += WG) {
    let l = route_lg[e];
    // Four experts per step: independent workgroup loads in flight together (one at a time chained 256
    // load latencies per invocation).
    var rank = 0u;
    var f = 0u;
    for (; f + 4u <= N_EXPERT; f += 4u) {
      let m = vec4<f32>(route_lg[f], route_lg[f + 1u], route_lg[f + 2u], route_lg[f + 3u]);
      let fi = vec4<u32>(f, f + 1u, f + 2u, f + 3u);
      let ahead = (m > vec4<f32>(l)) | ((m == vec4<f32>(l)) & (fi < vec4<u32>(e)));
      rank += dot(select(vec4<u32>(0u), vec4<u32>(1u), ahead), vec4<u32>(1u));
    }
    for (; f < N_EXPERT; f++) {
      let m = route_lg[f];
      rank += select(0u, 1u, m > l || (m == l && f < e));
    }
    if (rank < N_EXPERT_USED) {
      route_id[rank] = e;
      route_w[rank] = l;
    }
  }
  workgroupBarrier();
  // route_w holds the selected logits, largest first.
  let top = route_w[0];
  var sum = 0.0;
  for (var i = 0u; i < N_EXPERT_USED; i++) {
    sum += exp(route_w[i] - top);
  }
  // Everyone has read the logits before they become weights.
  workgroupBarrier();
  for (var j = lid; j < N_EXPERT_USED; j += WG) {
    route_w[j] = exp(route_w[j] - top) / sum * W_SCALE;
  }
  workgroupBarrier();
}
