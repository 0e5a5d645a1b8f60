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
// NORM = 1: v = x · (1 / sqrt(Σ x² / K + EPS)) · nw, the scale from lib/rms.wgsl (every workgroup sums x² in
// the one order every norm in the engine uses, so xn has the bits of rms_norm's output); v is written to xn
// and quantized. NORM = 0: v = x.
// Chunk c: d = max|v| / 127 (0 for an all-zero chunk), q_i = round(v_i · (1/d)) (ties to even), clamped to ±127;
// v_i ≈ d·q_i. LAYOUT orders the 32 bytes as the weight type's kernel reads them:
//   0 (Q8_0): word m = q[4m..4m+3] (natural order);
//   1 (IQ4_XS): words 2j, 2j+1 = q[4j, 4j+1, 16+4j, 17+4j], q[4j+2, 4j+3, 18+4j, 19+4j] (j < 4): the order of
//     the byte-pair codebook lookups of qs word j (low nibbles are elements 4j..4j+3, high ones 16+4j..19+4j).
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

fn q4(v: vec4<f32>, inv: f32) -> vec4<i32> {
  return clamp(vec4<i32>(round(v * inv)), vec4<i32>(-127), vec4<i32>(127));
}

@compute @workgroup_size(256)
fn main(
  @builtin(local_invocation_index) lid: u32,
  @builtin(workgroup_id) wid: vec3<u32>,
) {
  var scale = 1.0;
  if (NORM == 1u) {
    var ss = 0.0;
    for (var i = lid; i < params.k; i += WG) {
      let v = x[(params.x_off + i) >> 2u][(params.x_off + i) & 3u];
      ss += v * v;
    }
    scale = rms_scale(lid, ss, params.k, EPS);
  }
  let c = wid.x * WG + lid;
  if (c >= params.k / 32u) {
    return;
  }
  let xb = (params.x_off >> 2u) + 8u * c;
  var v: array<vec4<f32>, 8>;
  var amax = 0.0;
  for (var m = 0u; m < 8u; m++) {
    v[m] = x[xb + m];
    if (NORM == 1u) {
      v[m] = v[m] * scale * nw[8u * c + m];
      xn[xb + m] = v[m];
    }
    let a = abs(v[m]);
    amax = max(amax, max(max(a.x, a.y), max(a.z, a.w)));
  }
  let d = amax / 127.0;
  let inv = select(0.0, 1.0 / d, d > 0.0);
  let o = 8u * c;
  if (LAYOUT == 0u) {
    for (var m = 0u; m < 8u; m++) {
      xq[o + m] = pack4xI8(q4(v[m], inv));
    }
  } else {
    for (var j = 0u; j < 4u; j++) {
      let lo = q4(v[j], inv);
      let hi = q4(v[4u + j], inv);
      xq[o + 2u * j] = pack4xI8(vec4<i32>(lo.xy, hi.xy));
      xq[o + 2u * j + 1u] = pack4xI8(vec4<i32>(lo.zw, hi.zw));
    }
  }
  xq[params.k / 4u + c] = bitcast<u32>(d);
}
