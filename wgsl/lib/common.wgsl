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

// The four bytes of `w` (byte 0 first) as f32 0..255, exactly: each byte becomes the mantissa of 2^23 and
// 2^23 is subtracted. Integer-to-float conversions run at a quarter of the FMA rate on NVIDIA, enough to make
// a Q8_0 matvec compute-bound; these are two full-rate operations per value.
fn common_u8x4(w: u32) -> vec4<f32> {
  let b = vec4<u32>(w, w >> 8u, w >> 16u, w >> 24u) & vec4<u32>(0xFFu);
  return bitcast<vec4<f32>>(b | vec4<u32>(0x4B000000u)) - vec4<f32>(8388608.0);
}

// The four bytes of `w` as signed int8 values in f32: (b ^ 0x80) − 128, exactly.
fn common_i8x4(w: u32) -> vec4<f32> {
  let b = vec4<u32>(w, w >> 8u, w >> 16u, w >> 24u) & vec4<u32>(0xFFu);
  return bitcast<vec4<f32>>((b ^ vec4<u32>(0x80u)) | vec4<u32>(0x4B000000u)) - vec4<f32>(8388736.0);
}

// The four low nibbles of `w` (bytes 0..3), as f32.
fn common_lo4(w: u32) -> vec4<f32> {
  return common_u8x4(w & 0x0F0F0F0Fu);
}

// The four high nibbles of `w` (bytes 0..3), as f32.
fn common_hi4(w: u32) -> vec4<f32> {
  return common_u8x4((w >> 4u) & 0x0F0F0F0Fu);
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

// The IQ4 codebook per byte: common_kv2[b] = (kvalues[b & 15], kvalues[b >> 4]) as f32. A workgroup table,
// because the arithmetic lookup above costs about ten integer operations per weight, several times the
// memory time of a 4-bit matvec on the H200; one 64-bit shared load yields two weights. Kernels that decode
// IQ4 types call quant_init (lib/quant.wgsl) and a barrier before the first lookup.
var<workgroup> common_kv2: array<vec2<f32>, 256>;

// Fills common_kv2 from 256 invocations (lid < 256).
fn common_kv2_init(lid: u32) {
  let v = common_kvalues(vec4<u32>(lid & 15u, lid >> 4u, 0u, 0u));
  common_kv2[lid] = v.xy;
}

// kvalues of the nibbles of `w`: [0] = the four low nibbles (bytes 0..3), [1] = the four high nibbles.
fn common_kv_word(w: u32) -> array<vec4<f32>, 2> {
  let p0 = common_kv2[w & 0xFFu];
  let p1 = common_kv2[(w >> 8u) & 0xFFu];
  let p2 = common_kv2[(w >> 16u) & 0xFFu];
  let p3 = common_kv2[w >> 24u];
  return array<vec4<f32>, 2>(vec4<f32>(p0.x, p1.x, p2.x, p3.x), vec4<f32>(p0.y, p1.y, p2.y, p3.y));
}
