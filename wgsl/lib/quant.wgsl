// quant: the chunk interface every weight-reading kernel uses, dispatched on the constant TYPE (ggml type id).
// Needs every type lib (common, f32, f16, bf16, q8_0, q4_0, iq4_nl, iq4_xs, q4_k, q5_k, q6_k): both sides of
// each branch must type-check; the compiler drops the untaken ones.
//
// A row of K elements (K a multiple of 32) is cut into K/32 chunks of 32 elements, each inside one quant block
// and with at most two scales. Chunk c has 4 units j = 0..3 of 8 elements: two quads (4 consecutive row
// positions each), `lo` and `hi`, at row positions quant_pos(c, j).x + 0..3 and .y + 0..3. A weight value is
// w = s·q − m with (s_lo, s_hi, m_lo, m_hi) = quant_scales(rb, c) per quad and q = quant_q(rb, c, j)[0 | 1].
// The chunks of a row partition it; chunk positions need not be contiguous (K-quants interleave halves).
// `rb` is the byte offset of the row's first block in the weight binding.
//
// const TYPE: u32 (0 F32, 1 F16, 30 BF16, 8 Q8_0, 2 Q4_0, 20 IQ4_NL, 23 IQ4_XS, 12 Q4_K, 13 Q5_K, 14 Q6_K)

fn quant_pos(c: u32, j: u32) -> vec2<u32> {
  if (TYPE == 12u) { return q4k_pos(c, j); }
  if (TYPE == 13u) { return q5k_pos(c, j); }
  if (TYPE == 14u) { return q6k_pos(c, j); }
  if (TYPE == 2u) { return q40_pos(c, j); }
  if (TYPE == 20u) { return iq4nl_pos(c, j); }
  if (TYPE == 23u) { return iq4xs_pos(c, j); }
  if (TYPE == 8u) { return q80_pos(c, j); }
  if (TYPE == 1u) { return f16_pos(c, j); }
  if (TYPE == 30u) { return bf16_pos(c, j); }
  return f32_pos(c, j);
}

fn quant_scales(rb: u32, c: u32) -> vec4<f32> {
  if (TYPE == 12u) { return q4k_scales(rb, c); }
  if (TYPE == 13u) { return q5k_scales(rb, c); }
  if (TYPE == 14u) { return q6k_scales(rb, c); }
  if (TYPE == 2u) { return q40_scales(rb, c); }
  if (TYPE == 20u) { return iq4nl_scales(rb, c); }
  if (TYPE == 23u) { return iq4xs_scales(rb, c); }
  if (TYPE == 8u) { return q80_scales(rb, c); }
  if (TYPE == 1u) { return f16_scales(rb, c); }
  if (TYPE == 30u) { return bf16_scales(rb, c); }
  return f32_scales(rb, c);
}

fn quant_q(rb: u32, c: u32, j: u32) -> array<vec4<f32>, 2> {
  if (TYPE == 12u) { return q4k_q(rb, c, j); }
  if (TYPE == 13u) { return q5k_q(rb, c, j); }
  if (TYPE == 14u) { return q6k_q(rb, c, j); }
  if (TYPE == 2u) { return q40_q(rb, c, j); }
  if (TYPE == 20u) { return iq4nl_q(rb, c, j); }
  if (TYPE == 23u) { return iq4xs_q(rb, c, j); }
  if (TYPE == 8u) { return q80_q(rb, c, j); }
  if (TYPE == 1u) { return f16_q(rb, c, j); }
  if (TYPE == 30u) { return bf16_q(rb, c, j); }
  return f32_q(rb, c, j);
}

// Whether the kernel must call quant_init(lid) from 256 invocations, then workgroupBarrier(), before decoding.
const QUANT_NEEDS_INIT: bool = TYPE == 20u || TYPE == 23u;

// Fills the type's workgroup tables (the IQ4 codebook); lid < 256.
fn quant_init(lid: u32) {
  common_kv2_init(lid);
}

// Whether the quads carry a min (w = s·q − m with m ≠ 0): lets kernels skip the Σx terms at compile time.
const QUANT_HAS_MIN: bool = TYPE == 2u || TYPE == 12u || TYPE == 13u || TYPE == 14u;
