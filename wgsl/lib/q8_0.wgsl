// q8_0: chunk decoding of Q8_0 (type 8; 32 elements in 34 bytes: d f16, qs[32] int8). Chunk c = block c; unit j =
// elements 8j..8j+3 (lo) and 8j+4..8j+7 (hi). Blocks are only 2-byte aligned: qs words go through common_u32.
// Needs common.wgsl.

fn q80_pos(c: u32, j: u32) -> vec2<u32> {
  let k = 32u * c + 8u * j;
  return vec2<u32>(k, k + 4u);
}

fn q80_scales(rb: u32, c: u32) -> vec4<f32> {
  let d = common_f16(rb + 34u * c);
  return vec4<f32>(d, d, 0.0, 0.0);
}

fn q80_q(rb: u32, c: u32, j: u32) -> array<vec4<f32>, 2> {
  let b = rb + 34u * c + 2u + 8u * j;
  return array<vec4<f32>, 2>(common_i8x4(common_u32(b)), common_i8x4(common_u32(b + 4u)));
}

// The unit's two quads from three consecutive words w0..w2 holding its 8 bytes at bit offset s = 0, 8, 16 or
// 24 of w0: the same funnel shift as common_u32 (matvec's SR path loads the words itself).
fn q80_q_words(w0: u32, w1: u32, w2: u32, s: u32) -> array<vec4<f32>, 2> {
  let lo = select((w0 >> s) | (w1 << (32u - s)), w0, s == 0u);
  let hi = select((w1 >> s) | (w2 << (32u - s)), w1, s == 0u);
  return array<vec4<f32>, 2>(common_i8x4(lo), common_i8x4(hi));
}
