// q4_0: chunk decoding of Q4_0 (type 2; 32 elements in 18 bytes: d f16, qs[16]; byte j holds element j in its low
// nibble and j+16 in its high nibble). Chunk c = block c; unit j = qs word j: elements 4j..4j+3 (low nibbles, lo)
// and 16+4j..16+4j+3 (high nibbles, hi). y = d·q − 8d, so the −8 becomes the chunk's min. Needs common.wgsl.

fn q40_pos(c: u32, j: u32) -> vec2<u32> {
  let k = 32u * c + 4u * j;
  return vec2<u32>(k, k + 16u);
}

fn q40_scales(rb: u32, c: u32) -> vec4<f32> {
  let d = common_f16(rb + 18u * c);
  return vec4<f32>(d, d, 8.0 * d, 8.0 * d);
}

fn q40_q(rb: u32, c: u32, j: u32) -> array<vec4<f32>, 2> {
  let w = common_u32(rb + 18u * c + 2u + 4u * j);
  return array<vec4<f32>, 2>(common_lo4(w), common_hi4(w));
}
