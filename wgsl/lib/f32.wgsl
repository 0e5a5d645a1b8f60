// f32: chunk decoding of F32 rows (type 0); chunk convention in quant.wgsl. Chunk c = elements 32c..32c+31,
// unit j = elements 32c+8j..+3 (lo) and 32c+8j+4..+7 (hi). Needs common.wgsl. Rows must be 4-byte aligned.

fn f32_pos(c: u32, j: u32) -> vec2<u32> {
  let k = 32u * c + 8u * j;
  return vec2<u32>(k, k + 4u);
}

fn f32_scales(rb: u32, c: u32) -> vec4<f32> {
  return vec4<f32>(1.0, 1.0, 0.0, 0.0);
}

fn f32_q(rb: u32, c: u32, j: u32) -> array<vec4<f32>, 2> {
  let i = (rb >> 2u) + 32u * c + 8u * j;
  let lo = vec4<u32>(weight_word(i), weight_word(i + 1u), weight_word(i + 2u), weight_word(i + 3u));
  let hi = vec4<u32>(weight_word(i + 4u), weight_word(i + 5u), weight_word(i + 6u), weight_word(i + 7u));
  return array<vec4<f32>, 2>(bitcast<vec4<f32>>(lo), bitcast<vec4<f32>>(hi));
}
