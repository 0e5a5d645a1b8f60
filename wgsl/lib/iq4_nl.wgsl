// iq4_nl: chunk decoding of IQ4_NL (type 20; Q4_0's layout with the kvalues_iq4nl codebook). Chunk c = block c;
// unit j = qs word j: elements 4j..4j+3 (lo) and 16+4j..16+4j+3 (hi). Needs common.wgsl and its table (quant_init).

fn iq4nl_pos(c: u32, j: u32) -> vec2<u32> {
  let k = 32u * c + 4u * j;
  return vec2<u32>(k, k + 16u);
}

fn iq4nl_scales(rb: u32, c: u32) -> vec4<f32> {
  let d = common_f16(rb + 18u * c);
  return vec4<f32>(d, d, 0.0, 0.0);
}

fn iq4nl_q(rb: u32, c: u32, j: u32) -> array<vec4<f32>, 2> {
  let w = common_u32(rb + 18u * c + 2u + 4u * j);
  return common_kv_word(w);
}
