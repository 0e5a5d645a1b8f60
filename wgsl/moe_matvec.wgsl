// moe_matvec: the expert mat-vecs of a MoE block, with the expert of each column read from a GPU id buffer
// (no CPU round trip between router and experts; spec qwen3next.md §10):
//   routed column (col < n_routed): e = ids[col],  xc = col / x_div
//   shared column (col >= n_routed): e = shared_e, xc = col - n_routed + shared_x0
//   (gate·up: shared_x0 = 0, the token; down: shared_x0 = n_routed, the shared column's own activations)
//   GATE_UP: y[col][r] = silu(Σ_k G_e[r][k]·x[xc][k]) · (Σ_k U_e[r][k]·x[xc][k])
//   else:    y[col][r] = Σ_k W_e[r][k]·x[xc][k]
// where matrix M_e of a 3-D expert tensor ne=[K, N, E] starts at byte off_M + e·expert_bytes. Gate and up
// live in ONE binding (the engine uploads them back to back), because the quant chunk interface reads one
// binding through `weight_word`. The shared expert rides along as extra columns when its matrices sit right
// after the routed experts' in the same binding (expert index shared_e = E), or runs alone with zero ids.
//
// Bindings:
//   0 params  array<u32> ne=[11]: [k, n, row_bytes, expert_bytes, off_g (bytes), off_u (bytes), n_cols, x_div,
//             n_routed, shared_e, shared_x0]
//   1 ids     array<u32> ne=[n_routed]
//   2 weights array<u32> raw GGUF blocks of type TYPE
//   3 x       array<vec4<f32>> ne=[K, n_cols / x_div]
//   4 y       array<f32> ne=[N, n_cols]
// Grid (ceil(N / WG_ROWS), MAX_COLS): workgroup (w, col) owns WG_ROWS = (256 / TEAM)·ROWS rows of column col;
// columns >= params.n_cols return before any barrier (uniform per workgroup). A team of TEAM invocations owns
// ROWS rows; invocation t takes chunks t, t + TEAM, ... (coalesced), partials reduced in workgroup memory.
// Constants: TYPE (ggml id), TEAM (power of two <= 256), ROWS (1..8): u32; GATE_UP: bool.
// Limits: K % 32 == 0, byte offsets multiples of 4.

@group(0) @binding(0) var<storage, read> params: array<u32>;
@group(0) @binding(1) var<storage, read> ids: array<u32>;
@group(0) @binding(2) var<storage, read> weights: array<u32>;
@group(0) @binding(3) var<storage, read> x: array<vec4<f32>>;
@group(0) @binding(4) var<storage, read_write> y: array<f32>;

const WG: u32 = 256u;
const WG_ROWS: u32 = (WG / TEAM) * ROWS;
const MATS: u32 = select(1u, 2u, GATE_UP);

var<workgroup> partial: array<f32, WG * ROWS * 2u>;

fn weight_word(i: u32) -> u32 {
  return weights[i];
}

fn silu(v: f32) -> f32 {
  return v / (1.0 + exp(-v));
}

@compute @workgroup_size(256)
fn main(@builtin(local_invocation_index) lid: u32, @builtin(workgroup_id) wid: vec3<u32>) {
  // The IQ4 codebook table first: every invocation reaches this barrier (the column test below is not uniform
  // in WGSL's analysis, since it reads storage).
  if (QUANT_NEEDS_INIT) {
    quant_init(lid);
    workgroupBarrier();
  }
  let k = params[0];
  let n = params[1];
  let col = wid.y;
  if (col >= params[6]) {
    return;
  }
  let n_routed = params[8];
  var e = params[9];
  var xc = col;
  if (col < n_routed) {
    e = ids[col];
    xc = col / params[7];
  } else {
    xc = col - n_routed + params[10];
  }
  let xb = xc * k;
  let team = lid / TEAM;
  let t = lid % TEAM;
  let row0 = wid.x * WG_ROWS + team * ROWS;

  // Rows past N read row N-1 (in bounds) and are never stored.
  var rb: array<array<u32, ROWS>, 2>;
  for (var m = 0u; m < MATS; m++) {
    let base = params[4u + m] + e * params[3];
    for (var r = 0u; r < ROWS; r++) {
      rb[m][r] = base + min(row0 + r, n - 1u) * params[2];
    }
  }
  var acc: array<array<f32, ROWS>, 2>;
  for (var m = 0u; m < 2u; m++) {
    for (var r = 0u; r < ROWS; r++) {
      acc[m][r] = 0.0;
    }
  }
  for (var c = t; c < k / 32u; c += TEAM) {
    for (var m = 0u; m < MATS; m++) {
      for (var r = 0u; r < ROWS; r++) {
        let s = quant_scales(rb[m][r], c);
        var plo = 0.0;
        var phi = 0.0;
        var sxlo = 0.0;
        var sxhi = 0.0;
        for (var j = 0u; j < 4u; j++) {
          let pos = quant_pos(c, j);
          let q = quant_q(rb[m][r], c, j);
          let xl = x[(xb + pos.x) >> 2u];
          let xh = x[(xb + pos.y) >> 2u];
          plo += dot(q[0], xl);
          phi += dot(q[1], xh);
          if (QUANT_HAS_MIN) {
            sxlo += dot(xl, vec4<f32>(1.0));
            sxhi += dot(xh, vec4<f32>(1.0));
          }
        }
        var v = s.x * plo + s.y * phi;
        if (QUANT_HAS_MIN) {
          v -= s.z * sxlo + s.w * sxhi;
        }
        acc[m][r] += v;
      }
    }
  }
  for (var m = 0u; m < 2u; m++) {
    for (var r = 0u; r < ROWS; r++) {
      partial[(m * WG_ROWS + team * ROWS + r) * TEAM + t] = acc[m][r];
    }
  }
  workgroupBarrier();
  for (var o = lid; o < WG_ROWS; o += WG) {
    let row = wid.x * WG_ROWS + o;
    var s0 = 0.0;
    var s1 = 0.0;
    for (var i = 0u; i < TEAM; i++) {
      let ii = (i + o) & (TEAM - 1u);
      s0 += partial[o * TEAM + ii];
      s1 += partial[(WG_ROWS + o) * TEAM + ii];
    }
    if (row < n) {
      var v = s0;
      if (GATE_UP) {
        v = silu(s0) * s1;
      }
      y[col * n + row] = v;
    }
  }
}
