// q8pack: 32 f32 values to int8 with one scale, the rounding of every int8 x in the engine (lib/q8x.wgsl for
// quantize_q8 and matvec_q8_fused's prologue, moe_matvec_q8's QOUT epilogue: all eight words at once,
// q8x_fill; moe_matvec_q8's XIN prologue and moe_route's XQ: one word per invocation, q8x_word), in ONE
// order of operations so that all give the same bits (tested). The including kernel declares `const LAYOUT:
// u32`.
// d = max|v| / 127 (0 for an all-zero chunk), q_i = round(v_i · (1/d)) (ties to even), clamped to ±127;
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

fn q8x_q4(v: vec4<f32>, inv: f32) -> vec4<i32> {
  return clamp(vec4<i32>(round(v * inv)), vec4<i32>(-127), vec4<i32>(127));
}

// The largest |v| of a quad.
fn q8x_amax4(v: vec4<f32>) -> f32 {
  let a = abs(v);
  return max(max(a.x, a.y), max(a.z, a.w));
}

// (d, 1/d) of a chunk whose largest |v| is amax (1/d = 0 for an all-zero chunk).
fn q8x_d(amax: f32) -> vec2<f32> {
  let d = amax / 127.0;
  return vec2<f32>(d, select(0.0, 1.0 / d, d > 0.0));
}

// The element quads of a chunk that quad word m reads in byte order `order` (q8x_word's lo and hi): order 0
// lo = quad m (hi unused); order 1 lo = quad m / 2, hi = quad 4 + m / 2. Every kernel that rounds one quad
// word per invocation loads them from here.
fn q8x_word_quads(order: u32, m: u32) -> vec2<u32> {
  return vec2<u32>(select(m, m / 2u, order == 1u), 4u + m / 2u);
}

// Quad word m of a chunk in byte order `order` (a LAYOUT), from its element quads: order 0 reads lo = v[m];
// order 1 lo = v[m / 2] and hi = v[4 + m / 2] (word m takes their x, y (m even) or z, w (m odd) halves).
fn q8x_word(order: u32, m: u32, lo: vec4<f32>, hi: vec4<f32>, inv: f32) -> u32 {
  let l = q8x_q4(lo, inv);
  if (order == 0u) {
    return pack4xI8(l);
  }
  let h = q8x_q4(hi, inv);
  if ((m & 1u) == 0u) {
    return pack4xI8(vec4<i32>(l.xy, h.xy));
  }
  return pack4xI8(vec4<i32>(l.zw, h.zw));
}

// Rounds the values of `out` (out.v, their largest |v| amax) into out.w and out.d, all eight words at once.
fn q8x_fill(out: ptr<function, Q8xChunk>, amax: f32) {
  let dv = q8x_d(amax);
  (*out).d = dv.x;
  if (LAYOUT == 0u) {
    for (var m = 0u; m < 8u; m++) {
      (*out).w[m] = pack4xI8(q8x_q4((*out).v[m], dv.y));
    }
  } else {
    for (var j = 0u; j < 4u; j++) {
      let lo = q8x_q4((*out).v[j], dv.y);
      let hi = q8x_q4((*out).v[4u + j], dv.y);
      (*out).w[2u * j] = pack4xI8(vec4<i32>(lo.xy, hi.xy));
      (*out).w[2u * j + 1u] = pack4xI8(vec4<i32>(lo.zw, hi.zw));
    }
  }
}
