// residual_add: h[t][d] += Σ_{s < N_TERMS} w_s · e[t][s][d]  (+ sigmoid(g[t]) · sh[t][d] when SHARED)
// where w_s = weights[t][s] when WEIGHTED, else 1. One kernel for the plain residual add (N_TERMS = 1,
// unweighted) and for the MoE sum: routed experts weighted by the router, the shared expert by its sigmoid gate
// (spec qwen3next.md §10), each output element with one writer, no atomics.
// NORM also writes the RMSNorm of the new row (spec §5), the next block's normed input, saving its own
// dispatch: y[t][d] = h[t][d] / sqrt(Σ_d h[t][d]² / D + EPS) · nw[d], summed as rms_norm.wgsl with WG = 256
// does (invocation i owns d = i, i + 256, ...; then lib/rms.wgsl), so a fused and a separate norm agree bit
// for bit where the driver compiles the two alike.
//
// Bindings (f32; t < n_tokens):
//   0 params  array<u32> ne=[2]: [n_tokens, g_col] (g_col: g's stride per token; 0 means 1)
//   1 e       ne=[D, N_TERMS, n_tokens]  terms to add
//   2 weights ne=[N_TERMS, n_tokens]     (WEIGHTED; otherwise bind any buffer of >= 4 bytes)
//   3 sh      ne=[D, n_tokens]           shared expert output (SHARED; otherwise any buffer)
//   4 g       ne=[n_tokens] (stride g_col) shared expert gate logit (SHARED; otherwise any buffer): a batched
//             router's output keeps it after each token's expert logits
//   5 h       ne=[D, n_tokens] read_write, the residual stream
//   6 nw      ne=[D]                     norm weight (NORM; otherwise any buffer)
//   7 y       ne=[D, n_tokens] read_write, the normed rows (NORM; otherwise any buffer not bound elsewhere)
// Grid: (ceil(D / 256), n_tokens, 1), or (1, n_tokens, 1) with NORM (a workgroup owns a row).
// Constants: D, N_TERMS: u32; WEIGHTED, SHARED, NORM: bool; EPS: f32.

@group(0) @binding(0) var<storage, read> params: array<u32>;
@group(0) @binding(1) var<storage, read> e: array<f32>;
@group(0) @binding(2) var<storage, read> weights: array<f32>;
@group(0) @binding(3) var<storage, read> sh: array<f32>;
@group(0) @binding(4) var<storage, read> g: array<f32>;
@group(0) @binding(5) var<storage, read_write> h: array<f32>;
@group(0) @binding(6) var<storage, read> nw: array<f32>;
@group(0) @binding(7) var<storage, read_write> y: array<f32>;

const WG: u32 = 256u;
// Elements per invocation with NORM (the new row stays in registers between the add and the scaling).
const PER: u32 = (D + WG - 1u) / WG;


// The new value of h[t][d].
fn added(t: u32, d: u32) -> f32 {
  var acc = 0.0;
  for (var s = 0u; s < N_TERMS; s++) {
    var w = 1.0;
    if (WEIGHTED) {
      w = weights[t * N_TERMS + s];
    }
    acc += w * e[(t * N_TERMS + s) * D + d];
  }
  if (SHARED) {
    acc += sh[t * D + d] / (1.0 + exp(-g[t * max(params[1], 1u)]));
  }
  return h[t * D + d] + acc;
}

@compute @workgroup_size(256)
fn main(
  @builtin(global_invocation_id) gid: vec3<u32>,
  @builtin(local_invocation_index) lid: u32,
  @builtin(workgroup_id) wid: vec3<u32>,
) {
  if (!NORM) {
    let d = gid.x;
    let t = gid.y;
    if (d >= D || t >= params[0]) {
      return;
    }
    h[t * D + d] = added(t, d);
    return;
  }
  // NORM: workgroup (0, t) owns row t. Rows past n_tokens do nothing but still reach every barrier.
  let t = wid.y;
  let live = t < params[0];
  // Terms outermost and the PER elements innermost: the PER loads of one term are independent, so they are
  // in flight together (one element after another would chain (N_TERMS + 1)·PER load latencies serially in
  // this single workgroup: 25 µs per MoE combine on the H200, docs/PERF.md).
  var v: array<f32, PER>;
  for (var j = 0u; j < PER; j++) {
    let d = min(lid + j * WG, D - 1u);
    v[j] = h[t * D + d];
  }
  var acc: array<f32, PER>;
  for (var s = 0u; s < N_TERMS; s++) {
    var w = 1.0;
    if (WEIGHTED) {
      w = weights[t * N_TERMS + s];
    }
    for (var j = 0u; j < PER; j++) {
      let d = min(lid + j * WG, D - 1u);
      acc[j] += w * e[(t * N_TERMS + s) * D + d];
    }
  }
  if (SHARED) {
    // The same expression as added(), so that h agrees bit for bit with the NORM = false path.
    for (var j = 0u; j < PER; j++) {
      let d = min(lid + j * WG, D - 1u);
      acc[j] += sh[t * D + d] / (1.0 + exp(-g[t * max(params[1], 1u)]));
    }
  }
  var s = 0.0;
  for (var j = 0u; j < PER; j++) {
    let d = lid + j * WG;
    if (live && d < D) {
      v[j] = v[j] + acc[j];
      h[t * D + d] = v[j];
      s += v[j] * v[j];
    }
  }
  let scale = rms_scale(lid, s, D, EPS);
  for (var j = 0u; j < PER; j++) {
    let d = lid + j * WG;
    if (live && d < D) {
      y[t * D + d] = v[j] * scale * nw[d];
    }
  }
}
