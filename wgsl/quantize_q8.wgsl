// quantize_q8: x (f32, K elements) to int8 per 32-element chunk, the input of matvec_q8; with NORM, x is
// RMSNorm-ed first (spec §5, the decode norm a matvec NORM prologue would compute).
//
// Bindings:
//   params  uniform Params
//   x       array<vec4<f32>>  ne=[K]; element k at x_off + k (x_off % 4 == 0)
//   xq      array<u32>  read_write, K/4 + K/32 words: chunk c's eight int8 quad words at 8c..8c+7, its scale
//           d_c (f32 bits) at K/4 + c
//   nw      array<vec4<f32>>  ne=[K]  RMSNorm weight (NORM; otherwise bind any buffer of ≥ 16 bytes)
//   xn      array<vec4<f32>>  ne=[K]  read_write: the normed x at x_off (NORM; otherwise any unaliased buffer)
// The rounding and the byte order (LAYOUT) are lib/q8x.wgsl's. NORM = 1: v = x · (1 / sqrt(Σ x² / K + EPS)) ·
// nw, the scale from lib/rms.wgsl (every workgroup sums x² in the one order every norm in the engine uses, so
// xn has the bits of rms_norm's output); v is written to xn and quantized. NORM = 0: v = x.
// One invocation per chunk, 256 per workgroup.
// Constants: const LAYOUT: u32 (0 or 1), const NORM: u32 (0 or 1), const EPS: f32 (the norm's epsilon).

struct Params {
  k: u32,
  x_off: u32,
  _pad0: u32,
  _pad1: u32,
}

@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var<storage, read> x: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read_write> xq: array<u32>;
@group(0) @binding(3) var<storage, read> nw: array<vec4<f32>>;
@group(0) @binding(4) var<storage, read_write> xn: array<vec4<f32>>;

const WG: u32 = 256u;

@compute @workgroup_size(256)
fn main(
  @builtin(local_invocation_index) lid: u32,
  @builtin(workgroup_id) wid: vec3<u32>,
) {
  let scale = q8x_scale(lid, params.x_off, params.k);
  let c = wid.x * WG + lid;
  if (c >= params.k / 32u) {
    return;
  }
  let xb = (params.x_off >> 2u) + 8u * c;
  let q = q8x_chunk(xb, c, scale);
  for (var m = 0u; m < 8u; m++) {
    if (NORM == 1u) {
      xn[xb + m] = q.v[m];
    }
    xq[8u * c + m] = q.w[m];
  }
  xq[params.k / 4u + c] = bitcast<u32>(q.d);
}
