// matmul: Y[m][n] = Σ_k W[n][k] · X[m][k] for M tokens (prefill), reading packed weights (lib/quant.wgsl).
//
// Bindings (offsets and strides come from `params`, so each binding can be a slice of a bigger buffer):
//   params  uniform Params
//   weights array<u32>  W ne=[K, N] of type TYPE, raw GGUF block bytes; row n starts at byte w_off + n·row_bytes
//   x       array<vec4<f32>>  X ne=[K, M]; element (k, m) at x_off + m·x_stride + k (x_off, x_stride % 4 == 0)
//   y       array<f32>  Y ne=[N, M]; element (n, m) at y_off + m·y_stride + n
// A workgroup (256 invocations, 16 × 16) owns a tile of BN = 16·TR rows × BM = 16·TT tokens; an invocation
// owns TR rows × TT tokens (f32 accumulators): row groups ty + 16·a and token groups tx + 16·b of 4 each.
// Per K step of one chunk (32 positions, lib/quant.wgsl), the invocations dequantize the tile's units (8
// weights of one row each, TR/4 per invocation) into workgroup memory `wt` and stage the tokens' inputs (TT/4
// units of 8 per invocation) into `xt` (both f32, transposed so that the inner loop reads vec4s), then every
// invocation runs 32 rank-1 updates of TR × TT, while the next step's weights and inputs load into
// registers. Rows ≥ N and tokens ≥ M are computed from clamped or zero inputs and never stored.
// Constants: const TYPE: u32 (ggml id); const TR: u32, const TT: u32 (4 or 8).
// Limits: K % 32 == 0; workgroup memory 2048·(TR + TT) bytes, plus 2 KiB for the IQ4 table.

struct Params {
  k: u32,
  n: u32,
  m: u32,
  row_bytes: u32,
  w_off: u32,
  x_off: u32,
  y_off: u32,
  x_stride: u32,
  y_stride: u32,
  pad0: u32,
  pad1: u32,
  pad2: u32,
}

@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var<storage, read> weights: array<u32>;
@group(0) @binding(2) var<storage, read> x: array<vec4<f32>>;
@group(0) @binding(3) var<storage, read_write> y: array<f32>;

const RV: u32 = TR / 4u; // row groups (vec4s of rows) per invocation, and weight units it stages
const TV: u32 = TT / 4u; // token groups per invocation, and input units it stages
const WG_R: u32 = 4u * TR; // row groups per tile (BN / 4)
const WG_T: u32 = 4u * TT; // token groups per tile (BM / 4)

// wt[kk · WG_R + r / 4][r % 4] = W[n0 + r][position kk of the chunk's unit order]; xt likewise with tokens.
var<workgroup> wt: array<vec4<f32>, 32u * WG_R>;
var<workgroup> xt: array<vec4<f32>, 32u * WG_T>;

fn weight_word(i: u32) -> u32 {
  return weights[i];
}

@compute @workgroup_size(256)
fn main(@builtin(local_invocation_index) lid: u32, @builtin(workgroup_id) wid: vec3<u32>) {
  let n0 = wid.x * (16u * TR);
  let m0 = wid.y * (16u * TT);
  let tx = lid % 16u; // token group
  let ty = lid / 16u; // row group
  let n_chunks = params.k / 32u;
  if (QUANT_NEEDS_INIT) {
    quant_init(lid);
    workgroupBarrier();
  }

  // Weight staging: rows wr + 64·a, unit wj. Input staging: tokens xm + 64·b, unit xj.
  let wr = lid / 4u;
  let wj = lid % 4u;
  var rb: array<u32, RV>;
  for (var a = 0u; a < RV; a++) {
    rb[a] = params.w_off + min(n0 + wr + 64u * a, params.n - 1u) * params.row_bytes;
  }
  let xm = lid % 64u;
  let xj = lid / 64u;
  var xb: array<u32, TV>;
  var x_valid: array<bool, TV>;
  for (var b = 0u; b < TV; b++) {
    x_valid[b] = m0 + xm + 64u * b < params.m;
    xb[b] = params.x_off + min(m0 + xm + 64u * b, params.m - 1u) * params.x_stride;
  }

  var acc: array<vec4<f32>, TR * TV>;
  for (var i = 0u; i < TR * TV; i++) {
    acc[i] = vec4<f32>(0.0);
  }

  // The next chunk's weights and inputs are loaded into registers before this chunk's rank-1 updates run,
  // so the global loads of step c + 1 are in flight during the math of step c (register double buffering).
  var sc_n: array<vec4<f32>, RV>;
  var q_n: array<array<vec4<f32>, 2>, RV>;
  for (var a = 0u; a < RV; a++) {
    sc_n[a] = quant_scales(rb[a], 0u);
    q_n[a] = quant_q(rb[a], 0u, wj);
  }
  var pos_n = quant_pos(0u, xj);
  var xl_n: array<vec4<f32>, TV>;
  var xh_n: array<vec4<f32>, TV>;
  for (var b = 0u; b < TV; b++) {
    xl_n[b] = x[(xb[b] + pos_n.x) >> 2u];
    xh_n[b] = x[(xb[b] + pos_n.y) >> 2u];
  }
  for (var c = 0u; c < n_chunks; c++) {
    for (var a = 0u; a < RV; a++) {
      let sc = sc_n[a];
      let lo = q_n[a][0] * sc.x - vec4<f32>(sc.z);
      let hi = q_n[a][1] * sc.y - vec4<f32>(sc.w);
      let g = (wr + 64u * a) / 4u;
      let comp = wr % 4u;
      for (var i = 0u; i < 4u; i++) {
        wt[(8u * wj + i) * WG_R + g][comp] = lo[i];
        wt[(8u * wj + 4u + i) * WG_R + g][comp] = hi[i];
      }
    }
    for (var b = 0u; b < TV; b++) {
      var xl = xl_n[b];
      var xh = xh_n[b];
      if (!x_valid[b]) {
        xl = vec4<f32>(0.0);
        xh = vec4<f32>(0.0);
      }
      let g = (xm + 64u * b) / 4u;
      let comp = xm % 4u;
      for (var i = 0u; i < 4u; i++) {
        xt[(8u * xj + i) * WG_T + g][comp] = xl[i];
        xt[(8u * xj + 4u + i) * WG_T + g][comp] = xh[i];
      }
    }
    workgroupBarrier();
    // The last step reloads its own chunk (in bounds, unused) rather than branching.
    let cn = min(c + 1u, n_chunks - 1u);
    for (var a = 0u; a < RV; a++) {
      sc_n[a] = quant_scales(rb[a], cn);
      q_n[a] = quant_q(rb[a], cn, wj);
    }
    pos_n = quant_pos(cn, xj);
    for (var b = 0u; b < TV; b++) {
      xl_n[b] = x[(xb[b] + pos_n.x) >> 2u];
      xh_n[b] = x[(xb[b] + pos_n.y) >> 2u];
    }
    for (var kk = 0u; kk < 32u; kk++) {
      var av: array<vec4<f32>, RV>;
      var bv: array<vec4<f32>, TV>;
      for (var a = 0u; a < RV; a++) {
        av[a] = wt[kk * WG_R + ty + 16u * a];
      }
      for (var b = 0u; b < TV; b++) {
        bv[b] = xt[kk * WG_T + tx + 16u * b];
      }
      for (var a = 0u; a < RV; a++) {
        for (var b = 0u; b < TV; b++) {
          acc[(4u * a + 0u) * TV + b] += av[a].x * bv[b];
          acc[(4u * a + 1u) * TV + b] += av[a].y * bv[b];
          acc[(4u * a + 2u) * TV + b] += av[a].z * bv[b];
          acc[(4u * a + 3u) * TV + b] += av[a].w * bv[b];
        }
      }
    }
    workgroupBarrier();
  }

  for (var a = 0u; a < RV; a++) {
    for (var i = 0u; i < 4u; i++) {
      let row = n0 + 4u * (ty + 16u * a) + i;
      for (var b = 0u; b < TV; b++) {
        for (var j = 0u; j < 4u; j++) {
          let m = m0 + 4u * (tx + 16u * b) + j;
          if (row < params.n && m < params.m) {
            y[params.y_off + m * params.y_stride + row] = acc[(4u * a + i) * TV + b][j];
          }
        }
      }
    }
  }
}
