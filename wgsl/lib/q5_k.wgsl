// q5_k: chunk decoding of Q5_K (type 13; 256 elements in 176 bytes: d, dmin f16, scales[12], qh[32], qs[128]).
// Same chunks, units and scale packing as q4_k.wgsl (needs it for q4k_scale_min, and common.wgsl); the fifth bit
// of element 64g+l is bit 2g of qh[l], of element 64g+32+l bit 2g+1. Blocks are 16-byte aligned.

fn q5k_pos(c: u32, j: u32) -> vec2<u32> {
  return q4k_pos(c, j);
}

fn q5k_scales(rb: u32, c: u32) -> vec4<f32> {
  let w0 = (rb + 176u * (c >> 3u)) >> 2u;
  let dd = unpack2x16float(weight_word(w0));
  let sm = vec4<f32>(q4k_scale_min(w0 + 1u, (c & 7u) >> 1u));
  return vec4<f32>(dd.x * sm.x, dd.x * sm.y, dd.y * sm.z, dd.y * sm.w);
}

fn q5k_q(rb: u32, c: u32, j: u32) -> array<vec4<f32>, 2> {
  let h = c & 7u;
  let g = h >> 1u;
  let w0 = (rb + 176u * (c >> 3u)) >> 2u;
  let l4 = 4u * (h & 1u) + j; // word index of l = 16e + 4j within qh[32] and within the group's 32 qs bytes
  let qh = weight_word(w0 + 4u + l4);
  let w = weight_word(w0 + 12u + 8u * g + l4);
  let blo = ((qh >> (2u * g)) & 0x01010101u) << 4u;
  let bhi = ((qh >> (2u * g + 1u)) & 0x01010101u) << 4u;
  return array<vec4<f32>, 2>(common_u8x4((w & 0x0F0F0F0Fu) | blo), common_u8x4(((w >> 4u) & 0x0F0F0F0Fu) | bhi));
}
