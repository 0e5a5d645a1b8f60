// iq4_xs: chunk decoding of IQ4_XS (type 23; 256 elements in 136 bytes: d f16, scales_h u16, scales_l[4],
// qs[128]). Chunk c = sub-block ib = c % 8 of block c / 8; unit j = qs word j of the sub-block: elements
// 32ib+4j..+3 (low nibbles, lo) and 32ib+16+4j..+3 (high nibbles, hi). Blocks are 8-byte aligned, so every word
// load is a plain aligned load. Needs common.wgsl and its table (quant_init).

fn iq4xs_pos(c: u32, j: u32) -> vec2<u32> {
  let k = 32u * c + 4u * j;
  return vec2<u32>(k, k + 16u);
}

fn iq4xs_scales(rb: u32, c: u32) -> vec4<f32> {
  let ib = c & 7u;
  let w0 = (rb + 136u * (c >> 3u)) >> 2u;
  let dl = iq4xs_scale(weight_word(w0), weight_word(w0 + 1u), 4u * ib, 16u + 2u * ib);
  return vec4<f32>(dl, dl, 0.0, 0.0);
}

// The scale of sub-block ib from the block's head word (d, scales_h) and its scales_l word, with the shifts
// sl = 4·ib and sh = 16 + 2·ib passed in (matvec's SR path computes them once per invocation): the
// scales_l nibble ib sits at bit 4·ib of the scales_l word, the 2 high bits at bit 2·ib of scales_h.
fn iq4xs_scale(head: u32, scales_l: u32, sl: u32, sh: u32) -> f32 {
  let d = unpack2x16float(head).x;
  let ls = ((scales_l >> sl) & 0xFu) | (((head >> sh) & 3u) << 4u);
  return d * (f32(ls) - 32.0);
}

fn iq4xs_q(rb: u32, c: u32, j: u32) -> array<vec4<f32>, 2> {
  let w = weight_word(((rb + 136u * (c >> 3u) + 8u) >> 2u) + 4u * (c & 7u) + j);
  return common_kv_word(w);
}
