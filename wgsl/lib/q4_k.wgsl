// q4_k: chunk decoding of Q4_K (type 12; 256 elements in 144 bytes: d, dmin f16, scales[12], qs[128]). Chunk
// c: block c / 8, h = c % 8, 64-element group g = h / 2, half e = h % 2; unit j = qs word 8g + 4e + j: elements
// 64g+16e+4j..+3 (low nibbles, sub-block 2g) and 64g+32+16e+4j..+3 (high nibbles, sub-block 2g+1).
// y = d·sc·q − dmin·m. Blocks are 16-byte aligned. Needs common.wgsl and q4k_scale_min for Q5_K too.

fn q4k_pos(c: u32, j: u32) -> vec2<u32> {
  let h = c & 7u;
  let k = 256u * (c >> 3u) + 64u * (h >> 1u) + 16u * (h & 1u) + 4u * j;
  return vec2<u32>(k, k + 32u);
}

// get_scale_min_k4 (quants.md) for sub-blocks 2g and 2g+1 from the 12 scale bytes at word `sw` (aligned):
// returns (sc[2g], sc[2g+1], m[2g], m[2g+1]) as integers.
fn q4k_scale_min(sw: u32, g: u32) -> vec4<u32> {
  return q4k_scale_min_words(weight_word(sw), weight_word(sw + 1u), weight_word(sw + 2u), g);
}

// q4k_scale_min from the three scale words s0..s2 as loaded.
fn q4k_scale_min_words(s0: u32, s1: u32, s2: u32, g: u32) -> vec4<u32> {
  let a = unpack4xU8(s0);
  let b = unpack4xU8(s1);
  let cc = unpack4xU8(s2);
  // j < 4: sc = a[j] & 63, m = b[j] & 63;  j >= 4: sc = (cc[j-4] & 15) | ((a[j-4] >> 6) << 4),
  // m = (cc[j-4] >> 4) | ((b[j-4] >> 6) << 4).
  let sc_lo = a & vec4<u32>(63u);
  let m_lo = b & vec4<u32>(63u);
  let sc_hi = (cc & vec4<u32>(15u)) | ((a >> vec4<u32>(6u)) << vec4<u32>(4u));
  let m_hi = (cc >> vec4<u32>(4u)) | ((b >> vec4<u32>(6u)) << vec4<u32>(4u));
  let i0 = (2u * g) & 3u;
  let up = g >= 2u;
  let sc = select(vec2<u32>(sc_lo[i0], sc_lo[i0 + 1u]), vec2<u32>(sc_hi[i0], sc_hi[i0 + 1u]), up);
  let m = select(vec2<u32>(m_lo[i0], m_lo[i0 + 1u]), vec2<u32>(m_hi[i0], m_hi[i0 + 1u]), up);
  return vec4<u32>(sc, m);
}

fn q4k_scales(rb: u32, c: u32) -> vec4<f32> {
  let w0 = (rb + 144u * (c >> 3u)) >> 2u;
  let dd = unpack2x16float(weight_word(w0));
  let sm = vec4<f32>(q4k_scale_min(w0 + 1u, (c & 7u) >> 1u));
  return vec4<f32>(dd.x * sm.x, dd.x * sm.y, dd.y * sm.z, dd.y * sm.w);
}

fn q4k_q(rb: u32, c: u32, j: u32) -> array<vec4<f32>, 2> {
  let h = c & 7u;
  let w = weight_word(((rb + 144u * (c >> 3u) + 16u) >> 2u) + 8u * (h >> 1u) + 4u * (h & 1u) + j);
  return array<vec4<f32>, 2>(common_lo4(w), common_hi4(w));
}
