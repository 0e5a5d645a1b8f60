// combine_q8: the MoE combine of mat-vec columns with the next block's RMSNorm and its int8 rounding in one
// dispatch. h[t] += Σ_s w_s·e_s + sh / (1 + exp(-g)) (residual_add's WEIGHTED SHARED sum), y[t] = RMSNorm(h[t])·nw,
// and y[t] rounded to int8 per 32 elements in both byte orders: the input of the next block's int8
// in-projections (and of the LM head after the last layer) in a batched step, which otherwise takes a
// quantize_q8 NORM dispatch of its own (and a second one where attention's v reads the other byte order).
//
// Every value has the bits of the dispatches it replaces: each element of the new row is the expression of
// residual_add's added() (in vec4 lanes); the row waits in workgroup memory, invocation i sums the squares of
// elements i, i + 256, ... in order and lib/rms.wgsl halves the 256 partials (quantize_q8 NORM's and
// matvec_q8_fused's scale); each quad word is rounded from v · scale · nw (lib/q8x.wgsl's q8x_quad) as
// quantize_q8 QUADS rounds it (lib/q8pack.wgsl).
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
// Quads of a row, and per invocation.
const Q: u32 = D / 4u;
const QPER: u32 = (Q + WG - 1u) / WG;

var<workgroup> row: array<vec4<f32>, Q>;

// Quad q of the normed row: q8x_quad's expression.
fn normed(q: u32, scale: f32) -> vec4<f32> {
  return row[q] * scale * nw[q];
}

@compute @workgroup_size(256)
fn main(
  @builtin(local_invocation_index) lid: u32,
  @builtin(workgroup_id) wid: vec3<u32>,
) {
  let t = wid.y;
  if (t >= params.n_tokens) {
    return;
  }
  // Every load before any use: the terms of an invocation's quads are in flight together.
  var hv: array<vec4<f32>, QPER>;
  var acc: array<vec4<f32>, QPER>;
  for (var j = 0u; j < QPER; j++) {
    hv[j] = h[t * Q + min(lid + j * WG, Q - 1u)];
  }
  for (var s = 0u; s < N_TERMS; s++) {
    let w = weights[t * N_TERMS + s];
    for (var j = 0u; j < QPER; j++) {
      acc[j] += w * e[(t * N_TERMS + s) * Q + min(lid + j * WG, Q - 1u)];
    }
  }
  let den = 1.0 + exp(-g[t * max(params.g_col, 1u)]);
  for (var j = 0u; j < QPER; j++) {
    acc[j] += sh[t * Q + min(lid + j * WG, Q - 1u)] / den;
  }
  for (var j = 0u; j < QPER; j++) {
    let q = lid + j * WG;
    if (q < Q) {
      let v = hv[j] + acc[j];
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
  let scale = rms_scale(lid, ss, D, EPS);
  let qo = t * (Q + D / 32u);
  for (var j = 0u; j < QPER; j++) {
    let i = lid + j * WG;
    if (i < Q) {
      // Quad word i: chunk c's word m, from the chunk's largest |v| (each of its eight invocations finds it).
      let c = i / 8u;
      let m = i % 8u;
      var amax = 0.0;
      for (var k = 0u; k < 8u; k++) {
        amax = max(amax, q8x_amax4(normed(8u * c + k, scale)));
      }
      let dv = q8x_d(amax);
      for (var order = 0u; order < 2u; order++) {
        let wq = q8x_word_quads(order, m);
        let at = order * params.alt + qo;
        xq[at + i] = q8x_word(order, m, normed(8u * c + wq.x, scale), normed(8u * c + wq.y, scale), dv.y);
        if (m == 0u) {
          xq[at + Q + c] = bitcast<u32>(dv.x);
        }
      }
      y[t * Q + i] = normed(i, scale);
    }
  }
}
