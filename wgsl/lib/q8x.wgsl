// q8x: x (f32) to int8 per 32-element chunk, in ONE order of operations for quantize_q8 and matvec_q8_fused's
// prologue (so that both give the same bits; tests/forward_test.ts checks the engine's logged decisions). The
// including kernel declares `x` (array<vec4<f32>>, storage), `nw` (array<vec4<f32>>: the RMSNorm weight),
// `const WG: u32`, `const NORM: u32`, `const EPS: f32` and `const LAYOUT: u32`, and includes lib/rms.wgsl.
// NORM = 1: v = x · (1 / sqrt(Σ x² / K + EPS)) · nw, the scale from lib/rms.wgsl; NORM = 0: v = x.
// Chunk c: d = max|v| / 127 (0 for an all-zero chunk), q_i = round(v_i · (1/d)) (ties to even), clamped to ±127;
// v_i ≈ d·q_i. LAYOUT orders the 32 bytes as the weight type's kernel reads them:
//   0 (Q8_0): word m = q[4m..4m+3] (natural order);
//   1 (IQ4_XS): words 2j, 2j+1 = q[4j, 4j+1, 16+4j, 17+4j], q[4j+2, 4j+3, 18+4j, 19+4j] (j < 4): the order of
//     the byte-pair codebook lookups of qs word j (low nibbles are elements 4j..4j+3, high ones 16+4j..19+4j).

// One quantized chunk: its eight quad words in LAYOUT order, its scale, and the (normed) values.
struct Q8xChunk {
  w: array<u32, 8>,
  d: f32,
  v: array<vec4<f32>, 8>,
}

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

fn q8x_q4(v: vec4<f32>, inv: f32) -> vec4<i32> {
  return clamp(vec4<i32>(round(v * inv)), vec4<i32>(-127), vec4<i32>(127));
}

// Chunk c of the x whose quad c·8 sits at quad index xb (x_off / 4 + 8c), normed with `scale` (NORM).
fn q8x_chunk(xb: u32, c: u32, scale: f32) -> Q8xChunk {
  var out: Q8xChunk;
  var amax = 0.0;
  for (var m = 0u; m < 8u; m++) {
    var v = x[xb + m];
    if (NORM == 1u) {
      v = v * scale * nw[8u * c + m];
    }
    out.v[m] = v;
    let a = abs(v);
    amax = max(amax, max(max(a.x, a.y), max(a.z, a.w)));
  }
  let d = amax / 127.0;
  let inv = select(0.0, 1.0 / d, d > 0.0);
  out.d = d;
  if (LAYOUT == 0u) {
    for (var m = 0u; m < 8u; m++) {
      out.w[m] = pack4xI8(q8x_q4(out.v[m], inv));
    }
  } else {
    for (var j = 0u; j < 4u; j++) {
      let lo = q8x_q4(out.v[j], inv);
      let hi = q8x_q4(out.v[4u + j], inv);
      out.w[2u * j] = pack4xI8(vec4<i32>(lo.xy, hi.xy));
      out.w[2u * j + 1u] = pack4xI8(vec4<i32>(lo.zw, hi.zw));
    }
  }
  return out;
}
