// common: byte-addressed reads of packed weight blocks, shared by every quant lib (wgsl/lib/<type>.wgsl).
// The including kernel defines `fn weight_word(i: u32) -> u32` (word i of its weight binding); lib code
// never names a binding. Byte offsets are u32 (a binding is at most 2 GiB).

// The u32 at byte offset `byte` (any alignment): a two-word funnel shift, branch-free because Q8_0 and Q6_K
// blocks alternate between aligned and 2-byte-misaligned starts within one warp.
fn common_u32(byte: u32) -> u32 {
  let i = byte >> 2u;
  let s = (byte & 3u) * 8u;
  let lo = weight_word(i);
  let hi = weight_word(i + 1u);
  return select((lo >> s) | (hi << (32u - s)), lo, s == 0u);
}

// The f16 at a 2-byte-aligned byte offset, as f32.
fn common_f16(byte: u32) -> f32 {
  let v = unpack2x16float(weight_word(byte >> 2u));
  return select(v.x, v.y, (byte & 2u) != 0u);
}

// The unsigned byte at `byte`.
fn common_u8(byte: u32) -> u32 {
  return (weight_word(byte >> 2u) >> ((byte & 3u) * 8u)) & 0xFFu;
}

// The signed byte at `byte`.
fn common_i8(byte: u32) -> i32 {
  return extractBits(bitcast<i32>(weight_word(byte >> 2u)), (byte & 3u) * 8u, 8u);
}

// The four low nibbles of `w` (bytes 0..3), as f32.
fn common_lo4(w: u32) -> vec4<f32> {
  return vec4<f32>(unpack4xU8(w & 0x0F0F0F0Fu));
}

// The four high nibbles of `w` (bytes 0..3), as f32.
fn common_hi4(w: u32) -> vec4<f32> {
  return vec4<f32>(unpack4xU8((w >> 4u) & 0x0F0F0F0Fu));
}

// kvalues_iq4nl[nib] for four 4-bit codes (quants.md IQ4_NL). The table is four packed words: two selects pick
// the word, a shift pair sign-extends the byte. No runtime-indexed const array (it may become a per-invocation
// local-memory copy, KERNELS.md §0).
fn common_kvalues(nib: vec4<u32>) -> vec4<f32> {
  let b0 = (nib & vec4<u32>(4u)) != vec4<u32>(0u);
  let b1 = nib >= vec4<u32>(8u);
  let lo = select(vec4<u32>(0xBFAD9881u), vec4<u32>(0xF6EADDCFu), b0);
  let hi = select(vec4<u32>(0x26190D01u), vec4<u32>(0x71594535u), b0);
  let word = select(lo, hi, b1);
  let sh = (vec4<u32>(3u) - (nib & vec4<u32>(3u))) * 8u;
  return vec4<f32>(bitcast<vec4<i32>>(word << sh) >> vec4<u32>(24u));
}

// kvalues of the four low nibbles of `w`.
fn common_kvalues_lo(w: u32) -> vec4<f32> {
  return common_kvalues(unpack4xU8(w & 0x0F0F0F0Fu));
}

// kvalues of the four high nibbles of `w`.
fn common_kvalues_hi(w: u32) -> vec4<f32> {
  return common_kvalues(unpack4xU8((w >> 4u) & 0x0F0F0F0Fu));
}
