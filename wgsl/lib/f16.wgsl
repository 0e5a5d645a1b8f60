// f16: chunk decoding of F16 rows (type 1); chunk convention in quant.wgsl, same element order as f32.wgsl.
// Needs common.wgsl. Rows must be 4-byte aligned (K is a multiple of 32).

fn f16_pos(c: u32, j: u32) -> vec2<u32> {
  let k = 32u * c + 8u * j;
  return vec2<u32>(k, k + 4u);
}

fn f16_scales(rb: u32, c: u32) -> vec4<f32> {
  return vec4<f32>(1.0, 1.0, 0.0, 0.0);
}

fn f16_q(rb: u32, c: u32, j: u32) -> array<vec4<f32>, 2> {
  let i = (rb >> 2u) + 16u * c + 4u * j;
  let lo = vec4<f32>(unpack2x16float(weight_word(i)), unpack2x16float(weight_word(i + 1u)));
  let hi = vec4<f32>(unpack2x16float(weight_word(i + 2u)), unpack2x16float(weight_word(i + 3u)));
  return array<vec4<f32>, 2>(lo, hi);
}
