// MoE routing (spec §10) for each token: pi = softmax(logits); S = the N_EXPERT_USED largest pi (ties to
// the lower index), in descending order; w_e = pi_e / max(sum_{e' in S} pi_e', 6.1035e-5) * W_SCALE.
// Ranking uses the logits (softmax is monotonic), so f32 rounding of pi can never reorder or tie experts.
// Bindings:
//   logits   f32 ne=[N_EXPERT, nTokens]       router logits (ffn_gate_inp output)
//   ids      u32 ne=[N_EXPERT_USED, nTokens]  selected experts, most probable first
//   weights  f32 ne=[N_EXPERT_USED, nTokens]  their routing weights
// Grid (nTokens): workgroup t owns token t. Its logits sit in workgroup memory; max and sum of exp go
// through a tree; invocation i ranks experts i, i + WG, ...: rank(e) = #{e' : l_e' > l_e or (l_e' == l_e
// and e' < e)}, and an expert with rank < N_EXPERT_USED writes itself to slot rank (ranks are distinct).
// Constants: const N_EXPERT, N_EXPERT_USED, WG: u32 (WG power of two <= 256); const W_SCALE: f32 (1 when
// the model has no expert_weights_scale).
// Limits: N_EXPERT <= 4096 (16 KiB of workgroup memory); N_EXPERT_USED <= min(N_EXPERT, 256). NaN logits
// are not supported (they rank arbitrarily).
@group(0) @binding(0) var<storage, read> logits: array<f32>;
@group(0) @binding(1) var<storage, read_write> ids: array<u32>;
@group(0) @binding(2) var<storage, read_write> weights: array<f32>;

// ggml's lower bound on the selected probabilities' sum before renormalising (L5 build_moe_ffn).
const WEIGHT_SUM_MIN: f32 = 6.1035e-5;

var<workgroup> lg: array<f32, N_EXPERT>;
var<workgroup> red: array<f32, WG>;
var<workgroup> sel_p: array<f32, N_EXPERT_USED>;

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3u, @builtin(local_invocation_index) lid: u32) {
  let t = wid.x;
  var mx = -3.0e38;
  for (var e = lid; e < N_EXPERT; e += WG) {
    let l = logits[t * N_EXPERT + e];
    lg[e] = l;
    mx = max(mx, l);
  }
  red[lid] = mx;
  workgroupBarrier();
  for (var o = WG / 2u; o > 0u; o >>= 1u) {
    if (lid < o) {
      red[lid] = max(red[lid], red[lid + o]);
    }
    workgroupBarrier();
  }
  mx = red[0];
  workgroupBarrier();
  var s = 0.0;
  for (var e = lid; e < N_EXPERT; e += WG) {
    s += exp(lg[e] - mx);
  }
  red[lid] = s;
  workgroupBarrier();
  for (var o = WG / 2u; o > 0u; o >>= 1u) {
    if (lid < o) {
      red[lid] += red[lid + o];
    }
    workgroupBarrier();
  }
  let total = red[0];

  for (var e = lid; e < N_EXPERT; e += WG) {
    let l = lg[e];
    // Four experts per step: independent workgroup loads in flight together (one at a time chained 256
    // load latencies per invocation).
    var rank = 0u;
    var f = 0u;
    for (; f + 4u <= N_EXPERT; f += 4u) {
      let m = vec4<f32>(lg[f], lg[f + 1u], lg[f + 2u], lg[f + 3u]);
      let fi = vec4<u32>(f, f + 1u, f + 2u, f + 3u);
      let ahead = (m > vec4<f32>(l)) | ((m == vec4<f32>(l)) & (fi < vec4<u32>(e)));
      rank += dot(select(vec4<u32>(0u), vec4<u32>(1u), ahead), vec4<u32>(1u));
    }
    for (; f < N_EXPERT; f++) {
      let m = lg[f];
      rank += select(0u, 1u, m > l || (m == l && f < e));
    }
    if (rank < N_EXPERT_USED) {
      ids[t * N_EXPERT_USED + rank] = e;
      sel_p[rank] = exp(l - mx) / total;
    }
  }
  workgroupBarrier();
  for (var j = lid; j < N_EXPERT_USED; j += WG) {
    var sum = 0.0;
    for (var i = 0u; i < N_EXPERT_USED; i++) {
      sum += sel_p[i];
    }
    weights[t * N_EXPERT_USED + j] = sel_p[j] / max(sum, WEIGHT_SUM_MIN) * W_SCALE;
  }
}
