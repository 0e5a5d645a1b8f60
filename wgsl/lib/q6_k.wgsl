// q6_k: chunk decoding of Q6_K (type 14; 256 elements in 210 bytes: ql[128], qh[64], scales[16] int8, d f16).
// Chunk c: block c / 8, h = c % 8, half n = h / 4, w2 = (h / 2) % 2, e = h % 2; l = 16e + 4j + i (i = 0..3).
// Unit j = ql word at 64n + 32·w2 + 16e + 4j: low nibbles → elements 128n + 32·w2 + l (lo), high nibbles →
// 128n + 64 + 32·w2 + l (hi); high 2 bits from qh[32n + l] at bit 2·w2 (lo) and 4 + 2·w2 (hi). Scales
// (one per 16 elements): lo sc[8n + 2·w2 + e], hi sc[8n + 2·w2 + e + 4]. y = d·sc·q − 32·d·sc.
// Blocks are only 2-byte aligned: words go through common_u32. Needs common.wgsl.

fn q6k_pos(c: u32, j: u32) -> vec2<u32> {
  let h = c & 7u;
  let k = 256u * (c >> 3u) + 128u * (h >> 2u) + 32u * ((h >> 1u) & 1u) + 16u * (h & 1u) + 4u * j;
  return vec2<u32>(k, k + 64u);
}

fn q6k_scales(rb: u32, c: u32) -> vec4<f32> {
  let h = c & 7u;
  let b = rb + 210u * (c >> 3u);
  let d = common_f16(b + 208u);
  let is = 8u * (h >> 2u) + 2u * ((h >> 1u) & 1u) + (h & 1u);
  let s = d * vec2<f32>(f32(common_i8(b + 192u + is)), f32(common_i8(b + 196u + is)));
  return vec4<f32>(s, 32.0 * s);
}

fn q6k_q(rb: u32, c: u32, j: u32) -> array<vec4<f32>, 2> {
  let h = c & 7u;
  let n = h >> 2u;
  let w2 = (h >> 1u) & 1u;
  let l = 16u * (h & 1u) + 4u * j;
  let b = rb + 210u * (c >> 3u);
  let ql = common_u32(b + 64u * n + 32u * w2 + l);
  let qh = common_u32(b + 128u + 32u * n + l);
  let hlo = ((qh >> (2u * w2)) & 0x03030303u) << 4u;
  let hhi = ((qh >> (4u + 2u * w2)) & 0x03030303u) << 4u;
  return array<vec4<f32>, 2>(common_u8x4((ql & 0x0F0F0F0Fu) | hlo), common_u8x4(((ql >> 4u) & 0x0F0F0F0Fu) | hhi));
}
