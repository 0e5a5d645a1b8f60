// residual_add: h[t][d] += Σ_{s < N_TERMS} w_s · e[t][s][d]  (+ sigmoid(g[t]) · sh[t][d] when SHARED)
// where w_s = weights[t][s] when WEIGHTED, else 1. One kernel for the plain residual add (N_TERMS = 1,
// unweighted) and for the MoE sum: routed experts weighted by the router, the shared expert by its sigmoid gate
// (spec qwen3next.md §10), each output element with one writer, no atomics.
//
// Bindings (f32; t < n_tokens):
//   0 params  array<u32> ne=[2]: [n_tokens, _]
//   1 e       ne=[D, N_TERMS, n_tokens]  terms to add
//   2 weights ne=[N_TERMS, n_tokens]     (WEIGHTED; otherwise bind any buffer of >= 4 bytes)
//   3 sh      ne=[D, n_tokens]           shared expert output (SHARED; otherwise any buffer)
//   4 g       ne=[n_tokens]              shared expert gate logit (SHARED; otherwise any buffer)
//   5 h       ne=[D, n_tokens] read_write, the residual stream
// Grid (ceil(D / 256), n_tokens, 1). Constants: D, N_TERMS: u32; WEIGHTED, SHARED: bool.

@group(0) @binding(0) var<storage, read> params: array<u32>;
@group(0) @binding(1) var<storage, read> e: array<f32>;
@group(0) @binding(2) var<storage, read> weights: array<f32>;
@group(0) @binding(3) var<storage, read> sh: array<f32>;
@group(0) @binding(4) var<storage, read> g: array<f32>;
@group(0) @binding(5) var<storage, read_write> h: array<f32>;

@compute @workgroup_size(256)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
  let d = gid.x;
  let t = gid.y;
  if (d >= D || t >= params[0]) {
    return;
  }
  var acc = 0.0;
  for (var s = 0u; s < N_TERMS; s++) {
    var w = 1.0;
    if (WEIGHTED) {
      w = weights[t * N_TERMS + s];
    }
    acc += w * e[(t * N_TERMS + s) * D + d];
  }
  if (SHARED) {
    acc += sh[t * D + d] / (1.0 + exp(-g[t]));
  }
  h[t * D + d] += acc;
}
