// route: MoE routing of one token by one workgroup of WG invocations (spec §10): pi = softmax(logits);
// S = the N_EXPERT_USED largest pi (ties to the lower index), in descending order;
// w_e = pi_e / max(sum_{e' in S} pi_e', 6.1035e-5) * W_SCALE.
// Ranking uses the logits (softmax is monotonic), so f32 rounding of pi can never reorder or tie experts.
// The logits sit in workgroup memory; max and sum of exp go through a tree; invocation i ranks experts
// i, i + WG, ...: rank(e) = #{e' : l_e' > l_e or (l_e' == l_e and e' < e)}, and an expert with rank <
// N_EXPERT_USED writes itself to slot rank (ranks are distinct). NaN logits are not supported.
// The including kernel defines `fn route_logit(t: u32, e: u32) -> f32` (logit e of token t) and the constants
// N_EXPERT, N_EXPERT_USED, WG: u32 (WG a power of two <= 256) and W_SCALE: f32. Workgroup memory:
// 4·N_EXPERT + 4·WG + 8·N_EXPERT_USED bytes.

// ggml's lower bound on the selected probabilities' sum before renormalising (L5 build_moe_ffn).
const ROUTE_SUM_MIN: f32 = 6.1035e-5;

var<workgroup> route_lg: array<f32, N_EXPERT>;
var<workgroup> route_red: array<f32, WG>;
// After route_token: the selected experts, most probable first, and their weights.
var<workgroup> route_id: array<u32, N_EXPERT_USED>;
var<workgroup> route_w: array<f32, N_EXPERT_USED>;

// Routes token t; every invocation of the workgroup must call it (barriers). On return route_id and
// route_w hold the selection for every invocation.
fn route_token(t: u32, lid: u32) {
  var mx = -3.0e38;
  for (var e = lid; e < N_EXPERT; e += WG) {
    let l = route_logit(t, e);
    route_lg[e] = l;
    mx = max(mx, l);
  }
  route_red[lid] = mx;
  workgroupBarrier();
  for (var o = WG / 2u; o > 0u; o >>= 1u) {
    if (lid < o) {
      route_red[lid] = max(route_red[lid], route_red[lid + o]);
    }
    workgroupBarrier();
  }
  mx = route_red[0];
  workgroupBarrier();
  var s = 0.0;
  for (var e = lid; e < N_EXPERT; e += WG) {
    s += exp(route_lg[e] - mx);
  }
  route_red[lid] = s;
  workgroupBarrier();
  for (var o = WG / 2u; o > 0u; o >>= 1u) {
    if (lid < o) {
      route_red[lid] += route_red[lid + o];
    }
    workgroupBarrier();
  }
  let total = route_red[0];

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
      route_w[rank] = exp(l - mx) / total;
    }
  }
  workgroupBarrier();
  var sum = 0.0;
  for (var i = 0u; i < N_EXPERT_USED; i++) {
    sum += route_w[i];
  }
  // Everyone has summed the probabilities before they become weights.
  workgroupBarrier();
  for (var j = lid; j < N_EXPERT_USED; j += WG) {
    route_w[j] = route_w[j] / max(sum, ROUTE_SUM_MIN) * W_SCALE;
  }
  workgroupBarrier();
}
