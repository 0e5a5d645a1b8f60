// matmul: Y[m][n] = Σ_k W[n][k] · X[m][k] for M tokens (prefill), reading packed weights (lib/quant.wgsl).
//
// Bindings (offsets and strides come from `params`, so each binding can be a slice of a bigger buffer):
//   params  uniform Params
//   weights array<u32>  W ne=[K, N] of type TYPE, raw GGUF block bytes; row n starts at byte w_off + n·row_bytes
//   x       array<vec4<f32>>  X ne=[K, M]; element (k, m) at x_off + m·x_stride + k (x_off, x_stride % 4 == 0)
//   y       array<f32>  Y ne=[N, M]; element (n, m) at y_off + m·y_stride + n
// Split K (grid z > 1; small N, where a few workgroups would each run every chunk step in turn): workgroup z
// sums chunks [z·chunks_per_split, (z + 1)·chunks_per_split) only and writes its partial Y at
// y_off + z·split_stride + m·y_stride + n; matmul_splits.wgsl then adds the partials in z order. Without a
// split, chunks_per_split = K / 32 and the grid's z is 1.
// A workgroup (256 invocations, 16 × 16) owns a tile of BN = 16·TR rows × BM = 16·TT tokens; an invocation
// owns TR rows × TT tokens (f32 accumulators): row groups ty + 16·a and token groups tx + 16·b of 4 each.
// Per K step of one chunk (32 positions, lib/quant.wgsl), the invocations dequantize the tile's units (8
// weights of one row each, TR/4 per invocation) into workgroup memory `wt` and stage the tokens' inputs (TT/4
// units of 8 per invocation) into `xt` (both f32, transposed so that the inner loop reads vec4s), then every
// invocation runs 32 rank-1 updates of TR × TT, while the next step's weights and inputs load into
// registers. Rows ≥ N and tokens ≥ M are computed from clamped or zero inputs and never stored.
// Constants: const TYPE: u32 (ggml id); const TR: u32, const TT: u32 (4 or 8).
// (The grouped expert passes of a prefill chunk have a kernel of their own: moe_matmul.wgsl.)
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
  chunks_per_split: u32,
  split_stride: u32,
  pad0: u32,
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

// The rank-1 update of a 4 × 4 block: column i holds row i's 4 tokens.
fn outer(a: vec4<f32>, b: vec4<f32>) -> mat4x4<f32> {
  return mat4x4<f32>(a.x * b, a.y * b, a.z * b, a.w * b);
}

// Stages one weight unit (8 weights of tile row 4·g + comp, unit wj) into wt.
fn stage_w(g: u32, comp: u32, wj: u32, sc: vec4<f32>, q: array<vec4<f32>, 2>) {
  let lo = q[0] * sc.x - vec4<f32>(sc.z);
  let hi = q[1] * sc.y - vec4<f32>(sc.w);
  for (var i = 0u; i < 4u; i++) {
    wt[(8u * wj + i) * WG_R + g][comp] = lo[i];
    wt[(8u * wj + 4u + i) * WG_R + g][comp] = hi[i];
  }
}

// Stages one input unit (8 inputs of tile token 4·g + comp, unit xj) into xt; zeros for tokens ≥ M.
fn stage_x(g: u32, comp: u32, xj: u32, valid: bool, xl: vec4<f32>, xh: vec4<f32>) {
  let l = select(vec4<f32>(0.0), xl, valid);
  let h = select(vec4<f32>(0.0), xh, valid);
  for (var i = 0u; i < 4u; i++) {
    xt[(8u * xj + i) * WG_T + g][comp] = l[i];
    xt[(8u * xj + 4u + i) * WG_T + g][comp] = h[i];
  }
}

// Stores block (a, b) of the invocation's accumulators: rows 4·(ty + 16·a) + i, tokens 4·(tx + 16·b) + j.
fn store_block(y0: u32, n0: u32, m0: u32, ty: u32, tx: u32, a: u32, b: u32, blk: mat4x4<f32>) {
  for (var j = 0u; j < 4u; j++) {
    let m = m0 + 4u * (tx + 16u * b) + j;
    if (m < params.m) {
      for (var i = 0u; i < 4u; i++) {
        let row = n0 + 4u * (ty + 16u * a) + i;
        if (row < params.n) {
          y[y0 + m * params.y_stride + row] = blk[i][j];
        }
      }
    }
  }
}

// Every per-invocation set (second row group, second token group) is a named variable under a constant
// condition rather than an array indexed in a loop: the driver then keeps all of it in registers.
@compute @workgroup_size(256)
fn main(@builtin(local_invocation_index) lid: u32, @builtin(workgroup_id) wid: vec3<u32>) {
  let n0 = wid.x * (16u * TR);
  let m0 = wid.y * (16u * TT);
  let split = wid.z;
  let count = params.m;
  let tx = lid % 16u; // token group
  let ty = lid / 16u; // row group
  // This workgroup's chunks [c0, c1) of the K / 32 (all of them without a split).
  let c0 = split * params.chunks_per_split;
  let c1 = min(c0 + params.chunks_per_split, params.k / 32u);
  if (QUANT_NEEDS_INIT) {
    quant_init(lid);
    workgroupBarrier();
  }

  // Weight staging: rows wr (and wr + 64), unit wj. Input staging: tokens xm (and xm + 64), unit xj.
  let wr = lid / 4u;
  let wj = lid % 4u;
  let rb0 = params.w_off + min(n0 + wr, params.n - 1u) * params.row_bytes;
  let rb1 = params.w_off + min(n0 + wr + 64u, params.n - 1u) * params.row_bytes;
  let xm = lid % 64u;
  let xj = lid / 64u;
  let xv0 = m0 + xm < count;
  let xv1 = m0 + xm + 64u < count;
  let xb0 = params.x_off + min(m0 + xm, count - 1u) * params.x_stride;
  let xb1 = params.x_off + min(m0 + xm + 64u, count - 1u) * params.x_stride;

  var m00 = mat4x4<f32>();
  var m01 = mat4x4<f32>();
  var m10 = mat4x4<f32>();
  var m11 = mat4x4<f32>();

  // The next chunk's weights and inputs are loaded into registers before this chunk's rank-1 updates run,
  // so the global loads of step c + 1 are in flight during the math of step c (register double buffering).
  var sc0 = quant_scales(rb0, c0);
  var q0 = quant_q(rb0, c0, wj);
  var sc1 = vec4<f32>(0.0);
  var q1 = array<vec4<f32>, 2>();
  if (RV > 1u) {
    sc1 = quant_scales(rb1, c0);
    q1 = quant_q(rb1, c0, wj);
  }
  var pos = quant_pos(c0, xj);
  var xl0 = x[(xb0 + pos.x) >> 2u];
  var xh0 = x[(xb0 + pos.y) >> 2u];
  var xl1 = vec4<f32>(0.0);
  var xh1 = vec4<f32>(0.0);
  if (TV > 1u) {
    xl1 = x[(xb1 + pos.x) >> 2u];
    xh1 = x[(xb1 + pos.y) >> 2u];
  }
  for (var c = c0; c < c1; c++) {
    stage_w(wr / 4u, wr % 4u, wj, sc0, q0);
    if (RV > 1u) {
      stage_w(wr / 4u + 16u, wr % 4u, wj, sc1, q1);
    }
    stage_x(xm / 4u, xm % 4u, xj, xv0, xl0, xh0);
    if (TV > 1u) {
      stage_x(xm / 4u + 16u, xm % 4u, xj, xv1, xl1, xh1);
    }
    workgroupBarrier();
    // The last step reloads its own chunk (in bounds, unused) rather than branching.
    let cn = min(c + 1u, c1 - 1u);
    sc0 = quant_scales(rb0, cn);
    q0 = quant_q(rb0, cn, wj);
    if (RV > 1u) {
      sc1 = quant_scales(rb1, cn);
      q1 = quant_q(rb1, cn, wj);
    }
    pos = quant_pos(cn, xj);
    xl0 = x[(xb0 + pos.x) >> 2u];
    xh0 = x[(xb0 + pos.y) >> 2u];
    if (TV > 1u) {
      xl1 = x[(xb1 + pos.x) >> 2u];
      xh1 = x[(xb1 + pos.y) >> 2u];
    }
    for (var kk = 0u; kk < 32u; kk++) {
      let a0 = wt[kk * WG_R + ty];
      let b0 = xt[kk * WG_T + tx];
      m00 += outer(a0, b0);
      if (TV > 1u) {
        let b1 = xt[kk * WG_T + tx + 16u];
        m01 += outer(a0, b1);
        if (RV > 1u) {
          let a1 = wt[kk * WG_R + ty + 16u];
          m10 += outer(a1, b0);
          m11 += outer(a1, b1);
        }
      } else if (RV > 1u) {
        let a1 = wt[kk * WG_R + ty + 16u];
        m10 += outer(a1, b0);
      }
    }
    workgroupBarrier();
  }

  let y0 = params.y_off + split * params.split_stride;
  store_block(y0, n0, m0, ty, tx, 0u, 0u, m00);
  if (TV > 1u) {
    store_block(y0, n0, m0, ty, tx, 0u, 1u, m01);
  }
  if (RV > 1u) {
    store_block(y0, n0, m0, ty, tx, 1u, 0u, m10);
    if (TV > 1u) {
      store_block(y0, n0, m0, ty, tx, 1u, 1u, m11);
    }
  }
}
