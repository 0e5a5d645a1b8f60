// combine_q8: the MoE combine of mat-vec columns with the next block's RMSNorm and its int8 rounding in one
// dispatch. h[t] += Σ_s w_s·e_s + sh / (1 + exp(-g)) (residual_add's WEIGHTED SHARED sum), y[t] = RMSNorm(h[t])·nw,
// and y[t] rounded to int8 per 32 elements in both byte orders: the input of the next block's int8
// in-projections (and of the LM head after the last layer) in a batched step, which otherwise takes a
// quantize_q8 NORM dispatch of its own (and a second one where attention's v reads the other byte order).
//
// Every value has the bits of the dispatches it replaces: each element of the new row is the expression of
// residual_add's added() (in vec4 lanes); the row waits in workgroup memory, invocation i sums the squares of
// elements i, i + 256, ... in order and lib/rms.wgsl halves the 256 partials (quantize_q8 NORM's and
// matvec_q8_fused's scale); each quad of the normed row is v · scale · nw (lib/q8x.wgsl's q8x_quad), and each
// quad word is rounded from them as quantize_q8 QUADS rounds it (lib/q8pack.wgsl).
// The work is one chain of latencies (a workgroup per row), so every load is issued before the first use:
// the terms, h, sh, the gate and the norm weight at once; then three workgroup steps (the row, the norm's
// sum, the chunks' largest |v|) and the words.
//
// Bindings (t < n_tokens):
//   params  uniform Params: n_tokens; g_col (g's stride per token; 0 means 1); alt (words from the byte order 0
//           copy to the byte order 1 copy in xq)
//   e       array<vec4<f32>>  ne=[D, N_TERMS, n_tokens]  the routed experts' outputs
//   weights array<f32>        ne=[N_TERMS, n_tokens]     their router weights
//   sh      array<vec4<f32>>  ne=[D, n_tokens]           the shared expert's output
//   g       array<f32>        ne=[n_tokens] (stride g_col) the shared expert's gate logit
//   h       array<vec4<f32>>  read_write ne=[D, n_tokens] the residual stream
//   nw      array<vec4<f32>>  ne=[D]                     the next norm's weight
//   y       array<vec4<f32>>  read_write ne=[D, n_tokens] the normed rows
//   xq      array<u32>        read_write: column t's int8 x (quantize_q8's format, D/4 + D/32 words) at
//           t·(D/4 + D/32) in byte order 0 and at alt + t·(D/4 + D/32) in byte order 1
// Grid (1, n_tokens, 1): a workgroup owns a row. Constants: D (a multiple of 32), N_TERMS: u32; EPS: f32.

struct Params {
  n_tokens: u32,
  g_col: u32,
  alt: u32,
  _pad: u32,
}

@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var<storage, read> e: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read> weights: array<f32>;
@group(0) @binding(3) var<storage, read> sh: array<vec4<f32>>;
@group(0) @binding(4) var<storage, read> g: array<f32>;
@group(0) @binding(5) var<storage, read_write> h: array<vec4<f32>>;
@group(0) @binding(6) var<storage, read> nw: array<vec4<f32>>;
@group(0) @binding(7) var<storage, read_write> y: array<vec4<f32>>;
@group(0) @binding(8) var<storage, read_write> xq: array<u32>;

const WG: u32 = 256u;
// lib/q8pack.wgsl's all-words rounding (unused here) reads a LAYOUT; the words below name their order.
const LAYOUT: u32 = 0u;
// Quads of a row, and per invocation (invocation i owns quads i, i + 256, ...).
const Q: u32 = D / 4u;
const QPER: u32 = (Q + WG - 1u) / WG;

// The new row, then (after the norm's sum) the normed row.
var<workgroup> row: array<vec4<f32>, Q>;
// The largest |v| of each normed quad.
var<workgroup> qmax: array<f32, Q>;

@compute @workgroup_size(256)
fn main(
  @builtin(local_invocation_index) lid: u32,
  @builtin(workgroup_id) wid: vec3<u32>,
) {
  let t = wid.y;
  if (t >= params.n_tokens) {
    return;
  }
  var hv: array<vec4<f32>, QPER>;
  var nv: array<vec4<f32>, QPER>;
  var shv: array<vec4<f32>, QPER>;
  var ev: array<vec4<f32>, N_TERMS * QPER>;
  var wv: array<f32, N_TERMS>;
  for (var j = 0u; j < QPER; j++) {
    let q = min(lid + j * WG, Q - 1u);
    hv[j] = h[t * Q + q];
    nv[j] = nw[q];
    shv[j] = sh[t * Q + q];
    for (var s = 0u; s < N_TERMS; s++) {
      ev[s * QPER + j] = e[(t * N_TERMS + s) * Q + q];
    }
  }
  for (var s = 0u; s < N_TERMS; s++) {
    wv[s] = weights[t * N_TERMS + s];
  }
  let den = 1.0 + exp(-g[t * max(params.g_col, 1u)]);
  for (var j = 0u; j < QPER; j++) {
    var acc = vec4<f32>(0.0);
    for (var s = 0u; s < N_TERMS; s++) {
      acc += wv[s] * ev[s * QPER + j];
    }
    acc += shv[j] / den;
    let q = lid + j * WG;
    if (q < Q) {
      let v = hv[j] + acc;
      row[q] = v;
      h[t * Q + q] = v;
    }
  }
  workgroupBarrier();
  var ss = 0.0;
  for (var i = lid; i < D; i += WG) {
    let v = row[i >> 2u][i & 3u];
    ss += v * v;
  }
  // rms_scale's last barrier follows every read of the row: each invocation may overwrite its own quads.
  let scale = rms_scale(lid, ss, D, EPS);
  for (var j = 0u; j < QPER; j++) {
    let q = lid + j * WG;
    if (q < Q) {
      let v = row[q] * scale * nv[j];
      row[q] = v;
      qmax[q] = q8x_amax4(v);
      y[t * Q + q] = v;
    }
  }
  workgroupBarrier();
  let qo = t * (Q + D / 32u);
  for (var j = 0u; j < QPER; j++) {
    let i = lid + j * WG;
    if (i < Q) {
      // Quad word i: chunk c's word m, from the chunk's largest |v| (each of its eight invocations finds it).
      let c = i / 8u;
      let m = i % 8u;
      var amax = 0.0;
      for (var k = 0u; k < 8u; k++) {
        amax = max(amax, qmax[8u * c + k]);
      }
      let dv = q8x_d(amax);
      for (var order = 0u; order < 2u; order++) {
        let wq = q8x_word_quads(order, m);
        let at = order * params.alt + qo;
        xq[at + i] = q8x_word(order, m, row[8u * c + wq.x], row[8u * c + wq.y], dv.y);
        if (m == 0u) {
          xq[at + Q + c] = bitcast<u32>(dv.x);
        }
      }
    }
  }
}
