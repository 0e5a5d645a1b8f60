// q8x: x (f32) to int8 per 32-element chunk for quantize_q8 and matvec_q8_fused's prologue (so that both give
// the same bits; tests/forward_test.ts checks the engine's logged decisions); the rounding and the byte order
// are lib/q8pack.wgsl's. The including kernel declares `x` (array<vec4<f32>>, storage), `nw`
// (array<vec4<f32>>: the RMSNorm weight), `const WG: u32`, `const NORM: u32`, `const EPS: f32` and `const
// LAYOUT: u32`, and includes lib/rms.wgsl and lib/q8pack.wgsl.
// NORM = 1: v = x · (1 / sqrt(Σ x² / K + EPS)) · nw, the scale from lib/rms.wgsl; NORM = 0: v = x.

// NORM: the RMSNorm scale of the K elements of x from element x_off (every invocation calls it: barriers);
// otherwise 1.
fn q8x_scale(lid: u32, x_off: u32, k: u32) -> f32 {
  if (NORM == 0u) {
    return 1.0;
  }
  var ss = 0.0;
  for (var i = lid; i < k; i += WG) {
    let v = x[(x_off + i) >> 2u][(x_off + i) & 3u];
    ss += v * v;
  }
  return rms_scale(lid, ss, k, EPS);
}

// Quad q of x, normed with `scale` and the norm weight's quad n (NORM): the one expression every rounding of
// a normed x uses (q8x_chunk, quantize_q8's quad words), so that they give the same bits.
fn q8x_quad(q: u32, n: u32, scale: f32) -> vec4<f32> {
  let v = x[q];
  if (NORM == 1u) {
    return v * scale * nw[n];
  }
  return v;
}

// Chunk c of the x whose quad c·8 sits at quad index xb (x_off / 4 + 8c), normed with `scale` (NORM). The
// values go straight into the chunk and q8x_fill rounds them in place (a chunk assembled from an array
// argument ran several times slower in matvec_q8_fused's prologue on the H200, docs/PERF.md).
fn q8x_chunk(xb: u32, c: u32, scale: f32) -> Q8xChunk {
  var out: Q8xChunk;
  var amax = 0.0;
  for (var m = 0u; m < 8u; m++) {
    let v = q8x_quad(xb + m, 8u * c + m, scale);
    out.v[m] = v;
    amax = max(amax, q8x_amax4(v));
  }
  q8x_fill(&out, amax);
  return out;
}
