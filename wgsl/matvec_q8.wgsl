// matvec_q8: y[n] = Σ_k W[n][k] · x[k] at batch 1, with x given as int8 per 32-element chunk (quantize_q8) and
// the products summed by integer dot products (dot4I8Packed): the arithmetic of llama.cpp's quantized dot
// products. TYPE 8 (Q8_0), 12 (Q4_K), 13 (Q5_K), 14 (Q6_K) or 23 (IQ4_XS), read straight from their GGUF block bytes.
//
// Bindings (the weight buffer twice: as words for block heads and Q8_0, as word pairs for IQ4_XS qs; xq
// twice: quads and scale words):
//   params    uniform Params
//   weights   array<u32>        W ne=[K, N]; row n starts at byte w_off + n·row_bytes
//   weights2  array<vec2<u32>>  the same buffer (IQ4_XS: w_off % 8 == 0)
//   xq        array<vec4<u32>>  quantize_q8's output for this TYPE's layout (K/4 + K/32 words)
//   xs        array<u32>        the same buffer (the scale words at K/4 + c)
//   y         array<f32>        element n at y_off + n
// Value: y[n] = Σ_c (dw_c · dx_c) · Σ_{i<32} w_i · q_i in f32 (chunks c = 32 weights: a Q8_0 block, an IQ4_XS
// sub-block; dw_c its scale, w_i its int8 values, IQ4_XS through the codebook; q_i, dx_c the int8 x), i.e. the
// product of the dequantized weights with the dequantized x up to f32 rounding. ACC = 1 adds into y.
// A lane takes a whole chunk per step (Q8_0: the 34-byte block as nine word loads; IQ4_XS: its 16 qs bytes as
// two word-pair loads and the block head), so that each lane keeps ROWS·(36 or 24) bytes in flight; a team
// of TEAM invocations owns ROWS rows and walks chunks t, t + TEAM, ...; each x chunk it loads serves its ROWS
// rows. The body is lib/q8dot.wgsl, shared with matvec_q8_fused. Measured on the H200 (docs/PERF.md, seventh
// and eighth sessions; best variant per shape): Q8_0 80-96% of the streaming ceiling on the 35B-A3B shapes,
// IQ4_XS 41-45% on the tall ones (the per-weight codebook lookups; neither table copies nor software
// pipelining lifted it, and the dot product is the native DP4A), against 30-54% and 22-57% for the engine's
// f32-x matvec.
// IQ4_XS codebook: a 256-entry workgroup table per qs byte, the two int8 codebook values of its nibbles in
// bytes 0 and 2, so two lookups and one multiply-add give four packed weights in x's LAYOUT 1 order.
// Constants: const TYPE: u32 (8, 12, 13, 14 or 23), const TEAM: u32 (power of two, 1..256), const ROWS: u32 (1..4),
//   const ACC: u32 (0 or 1), const RED: u32 (the team reduction: 0 one invocation per row adds TEAM partials,
//   1 runs of 8 in parallel first), const COPIES: u32 (copies of the IQ4_XS table: 1, 2, 4, 8, 16 or 32),
//   const GROUPS: u32 (row groups of WG_ROWS rows per workgroup, one after another), const PF: u32 (1: the
//   next step's weight loads are issued before this step's math).
// Workgroup memory: 1024·COPIES + 1024·ROWS bytes.

@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var<storage, read> weights: array<u32>;
@group(0) @binding(2) var<storage, read> weights2: array<vec2<u32>>;
@group(0) @binding(3) var<storage, read> xq: array<vec4<u32>>;
@group(0) @binding(4) var<storage, read> xs: array<u32>;
@group(0) @binding(5) var<storage, read_write> y: array<f32>;

const WG: u32 = 256u;

fn x_chunk(c: u32) -> XChunk {
  return XChunk(xq[2u * c], xq[2u * c + 1u], bitcast<f32>(xs[params.k / 4u + c]));
}

@compute @workgroup_size(256)
fn main(
  @builtin(local_invocation_index) lid: u32,
  @builtin(workgroup_id) wid: vec3<u32>,
  @builtin(num_workgroups) nwg: vec3<u32>,
) {
  q8dot_table(lid);
  q8dot_groups(wid.y * nwg.x + wid.x, lid);
}
