// bf16: chunk decoding of BF16 rows (type 30): f32 bits = u16 << 16. Chunk convention in quant.wgsl, same
// element order as f32.wgsl. Needs common.wgsl. Rows must be 4-byte aligned (K is a multiple of 32).

fn bf16_pos(c: u32, j: u32) -> vec2<u32> {
  let k = 32u * c + 8u * j;
  return vec2<u32>(k, k + 4u);
}

fn bf16_scales(rb: u32, c: u32) -> vec4<f32> {
  return vec4<f32>(1.0, 1.0, 0.0, 0.0);
}

// Two bf16 of one word: the lower address is the low half.
fn bf16_pair(w: u32) -> vec2<f32> {
  return bitcast<vec2<f32>>(vec2<u32>(w << 16u, w & 0xFFFF0000u));
}

fn bf16_q(rb: u32, c: u32, j: u32) -> array<vec4<f32>, 2> {
  let i = (rb >> 2u) + 16u * c + 4u * j;
  let lo = vec4<f32>(bf16_pair(weight_word(i)), bf16_pair(weight_word(i + 1u)));
  let hi = vec4<f32>(bf16_pair(weight_word(i + 2u)), bf16_pair(weight_word(i + 3u)));
  return array<vec4<f32>, 2>(lo, hi);
}
