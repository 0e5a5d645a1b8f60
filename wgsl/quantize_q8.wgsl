// quantize_q8: x (f32, K elements per column) to int8 per 32-element chunk, the input of matvec_q8; with NORM,
// x is RMSNorm-ed first (spec §5, the decode norm a matvec NORM prologue would compute); with ROUND, the
// rounded values d·q (exact in f32) are written back as f32 for a kernel that reads f32 x (prefill's matmul,
// so that a prefill chunk rounds x as the int8 mat-vecs do).
//
// Bindings:
//   params  uniform Params
//   x       array<vec4<f32>>  ne=[K, cols]; element (k, col) at x_off + col·x_stride + k (x_off, x_stride % 4 == 0)
//   xq      array<u32>  read_write, (K/4 + K/32) words per column: column col's chunk c has its eight int8 quad
//           words at col·(K/4 + K/32) + 8c.., its scale d_c (f32 bits) at col·(K/4 + K/32) + K/4 + c
//   nw      array<vec4<f32>>  ne=[K]  RMSNorm weight (NORM; otherwise bind any buffer of ≥ 16 bytes)
//   xn      array<vec4<f32>>  read_write: the normed x (NORM) or the rounded x (ROUND) at x's own place;
//           otherwise any unaliased buffer
// The rounding and the byte order (LAYOUT) are lib/q8x.wgsl's. NORM = 1: v = x · (1 / sqrt(Σ x² / K + EPS)) ·
// nw, the scale from lib/rms.wgsl (every workgroup sums x² in the one order every norm in the engine uses, so
// xn has the bits of rms_norm's output); v is written to xn and quantized. NORM = 0: v = x.
// QUADS = 0: one invocation per chunk (all eight words); QUADS = 1: one per quad word (each of a chunk's eight
// finds the chunk's scale itself from the same values, the same bits). 256 per workgroup; grid y = column.
// BOTH = 1 (with QUADS): xq also holds the columns in the other byte order (1 - LAYOUT), params.alt words after
// the LAYOUT ones, the same values and scales: attention's v reads its block's input in another order than q
// and k, and takes that copy instead of a quantize_q8 of its own.
// Constants: const LAYOUT: u32 (0 or 1), const NORM: u32 (0 or 1), const ROUND: u32 (0 or 1; not with NORM),
// const QUADS: u32 (0 or 1), const BOTH: u32 (0 or 1), const EPS: f32 (the norm's epsilon).

struct Params {
  k: u32,
  x_off: u32,
  x_stride: u32,
  alt: u32,
}

@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var<storage, read> x: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read_write> xq: array<u32>;
@group(0) @binding(3) var<storage, read> nw: array<vec4<f32>>;
@group(0) @binding(4) var<storage, read_write> xn: array<vec4<f32>>;

const WG: u32 = 256u;

// QUADS: quad word i of the column (chunk c = i / 8, word m = i % 8): the chunk's largest |v| from all eight
// quads (each of the chunk's invocations finds the same), word m in LAYOUT order, the scale (m = 0), and
// quad m of the normed or rounded x.
fn quad_word(i: u32, x_off: u32, col: u32, scale: f32) {
  let k = params.k;
  if (i >= k / 4u) {
    return;
  }
  let c = i / 8u;
  let m = i % 8u;
  // The chunk's first quad in x (in the norm weight: 8c).
  let xb = (x_off >> 2u) + 8u * c;
  var amax = 0.0;
  for (var j = 0u; j < 8u; j++) {
    amax = max(amax, q8x_amax4(q8x_quad(xb + j, 8u * c + j, scale)));
  }
  let dv = q8x_d(amax);
  // Copy 0 in LAYOUT order at the column's place; with BOTH, copy 1 in the other order params.alt words on.
  for (var copy = 0u; copy <= BOTH; copy++) {
    let order = select(LAYOUT, 1u - LAYOUT, copy == 1u);
    let qo = copy * params.alt + col * (k / 4u + k / 32u);
    let wq = q8x_word_quads(order, m);
    let lo = q8x_quad(xb + wq.x, 8u * c + wq.x, scale);
    let hi = q8x_quad(xb + wq.y, 8u * c + wq.y, scale);
    xq[qo + i] = q8x_word(order, m, lo, hi, dv.y);
    if (m == 0u) {
      xq[qo + k / 4u + c] = bitcast<u32>(dv.x);
    }
  }
  if (NORM == 1u) {
    xn[xb + m] = q8x_quad(xb + m, i, scale);
  }
  if (ROUND == 1u) {
    xn[xb + m] = vec4<f32>(q8x_q4(q8x_quad(xb + m, i, scale), dv.y)) * dv.x;
  }
}

@compute @workgroup_size(256)
fn main(
  @builtin(local_invocation_index) lid: u32,
  @builtin(workgroup_id) wid: vec3<u32>,
) {
  let x_off = params.x_off + wid.y * params.x_stride;
  let scale = q8x_scale(lid, x_off, params.k);
  if (QUADS == 1u) {
    quad_word(wid.x * WG + lid, x_off, wid.y, scale);
    return;
  }
  let c = wid.x * WG + lid;
  if (c >= params.k / 32u) {
    return;
  }
  let xb = (x_off >> 2u) + 8u * c;
  let q = q8x_chunk(xb, c, scale);
  let qo = wid.y * (params.k / 4u + params.k / 32u);
  // 1/d as q8x_d computed it for the packing (from the same d), so that d·q is the value packed.
  let inv = select(0.0, 1.0 / q.d, q.d > 0.0);
  for (var m = 0u; m < 8u; m++) {
    if (NORM == 1u) {
      xn[xb + m] = q.v[m];
    }
    if (ROUND == 1u) {
      xn[xb + m] = vec4<f32>(q8x_q4(q.v[m], inv)) * q.d;
    }
    xq[qo + 8u * c + m] = q.w[m];
  }
  xq[qo + params.k / 4u + c] = bitcast<u32>(q.d);
}
