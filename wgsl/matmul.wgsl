// matmul: Y[m][n] = Σ_k W[n][k] · X[m][k] for M tokens (prefill), reading packed weights (lib/quant.wgsl).
//
// Bindings (offsets and strides come from `params`, so each binding can be a slice of a bigger buffer):
//   params  uniform Params
//   weights array<u32>  W ne=[K, N] of type TYPE, raw GGUF block bytes; row n starts at byte w_off + n·row_bytes
//   x       array<vec4<f32>>  X ne=[K, M]; element (k, m) at x_off + m·x_stride + k (x_off, x_stride % 4 == 0)
//   y       array<f32>  Y ne=[N, M]; element (n, m) at y_off + m·y_stride + n
// A workgroup (256 invocations, 16 × 16) owns a tile of 64 rows × 64 tokens; an invocation owns 4 rows × 4
// tokens (f32 accumulators). Per K step of one chunk (32 positions, lib/quant.wgsl), each invocation
// dequantizes one unit (8 weights of one row) into workgroup memory `wt` and stages 8 inputs of one token into
// `xt` (both f32, 8 KiB each, transposed so that the inner loop reads vec4s), then every invocation runs 32
// rank-1 updates, while the next step's weights and inputs load into registers. Rows ≥ N and tokens ≥ M
// are computed from clamped or zero inputs and never stored.
// Constants: const TYPE: u32 (ggml id). Limits: K % 32 == 0; workgroup memory 18 KiB (with the IQ4 table).

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

const TILE: u32 = 64u;

// wt[kk · 16 + r / 4][r % 4] = W[n0 + r][position kk of the chunk]; xt likewise with tokens.
var<workgroup> wt: array<vec4<f32>, 512>;
var<workgroup> xt: array<vec4<f32>, 512>;

fn weight_word(i: u32) -> u32 {
  return weights[i];
}

@compute @workgroup_size(256)
fn main(@builtin(local_invocation_index) lid: u32, @builtin(workgroup_id) wid: vec3<u32>) {
  let n0 = wid.x * TILE;
  let m0 = wid.y * TILE;
  let tx = lid % 16u; // token group
  let ty = lid / 16u; // row group
  let n_chunks = params.k / 32u;
  if (QUANT_NEEDS_INIT) {
    quant_init(lid);
    workgroupBarrier();
  }

  // Weight staging: row wr, unit wj. Input staging: token xm, unit xj.
  let wr = lid / 4u;
  let wj = lid % 4u;
  let rb = params.w_off + min(n0 + wr, params.n - 1u) * params.row_bytes;
  let xm = lid % 64u;
  let xj = lid / 64u;
  let x_valid = m0 + xm < params.m;
  let xb = params.x_off + min(m0 + xm, params.m - 1u) * params.x_stride;

  var acc: array<vec4<f32>, 4>;
  for (var i = 0u; i < 4u; i++) {
    acc[i] = vec4<f32>(0.0);
  }

  // The next chunk's weights and inputs are loaded into registers before this chunk's rank-1 updates run,
  // so the global loads of step c + 1 are in flight during the math of step c (register double buffering).
  var sc_n = quant_scales(rb, 0u);
  var q_n = quant_q(rb, 0u, wj);
  var pos_n = quant_pos(0u, xj);
  var xl_n = x[(xb + pos_n.x) >> 2u];
  var xh_n = x[(xb + pos_n.y) >> 2u];
  for (var c = 0u; c < n_chunks; c++) {
    let sc = sc_n;
    let q = q_n;
    var xl = xl_n;
    var xh = xh_n;
    let lo = q[0] * sc.x - vec4<f32>(sc.z);
    let hi = q[1] * sc.y - vec4<f32>(sc.w);
    for (var i = 0u; i < 4u; i++) {
      wt[(8u * wj + i) * 16u + wr / 4u][wr % 4u] = lo[i];
      wt[(8u * wj + 4u + i) * 16u + wr / 4u][wr % 4u] = hi[i];
    }
    if (!x_valid) {
      xl = vec4<f32>(0.0);
      xh = vec4<f32>(0.0);
    }
    for (var i = 0u; i < 4u; i++) {
      xt[(8u * xj + i) * 16u + xm / 4u][xm % 4u] = xl[i];
      xt[(8u * xj + 4u + i) * 16u + xm / 4u][xm % 4u] = xh[i];
    }
    workgroupBarrier();
    // The last step reloads its own chunk (in bounds, unused) rather than branching.
    let cn = min(c + 1u, n_chunks - 1u);
    sc_n = quant_scales(rb, cn);
    q_n = quant_q(rb, cn, wj);
    pos_n = quant_pos(cn, xj);
    xl_n = x[(xb + pos_n.x) >> 2u];
    xh_n = x[(xb + pos_n.y) >> 2u];
    for (var kk = 0u; kk < 32u; kk++) {
      let a = wt[kk * 16u + ty];
      let b = xt[kk * 16u + tx];
      acc[0] += a.x * b;
      acc[1] += a.y * b;
      acc[2] += a.z * b;
      acc[3] += a.w * b;
    }
    workgroupBarrier();
  }

  for (var i = 0u; i < 4u; i++) {
    let row = n0 + 4u * ty + i;
    for (var j = 0u; j < 4u; j++) {
      let m = m0 + 4u * tx + j;
      if (row < params.n && m < params.m) {
        y[params.y_off + m * params.y_stride + row] = acc[i][j];
      }
    }
  }
}
