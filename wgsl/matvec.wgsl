// matvec: y[b][n] = Σ_k W[n][k] · x[b][k] for b < BATCH columns, reading packed weights (lib/quant.wgsl).
//
// Bindings (offsets and strides come from `params`, so each binding can be a slice of a bigger buffer):
//   params  uniform Params
//   weights array<u32>  W ne=[K, N] of type TYPE, raw GGUF block bytes; row n starts at byte w_off + n·row_bytes
//   x       array<vec4<f32>>  ne=[K, BATCH]; element (k, b) at x_off + b·x_stride + k (x_off, x_stride % 4 == 0)
//   y       array<f32>  ne=[N, BATCH]; element (n, b) at y_off + b·y_stride + n
// A workgroup (256 invocations) owns WG_ROWS = (256 / TEAM) · ROWS consecutive rows; a team of TEAM invocations
// owns ROWS rows, and invocation t of a team takes chunks t, t + TEAM, ... of those rows (consecutive
// invocations read consecutive words: coalesced). Each invocation keeps ROWS·BATCH f32 accumulators; the team
// partials go through workgroup memory and one invocation per output adds TEAM of them.
// The grid is 2-D when there are more than 65535 workgroups: workgroup id = y·num_workgroups.x + x.
// Constants: const TYPE: u32 (ggml id), const TEAM: u32 (power of two, 4..256), const ROWS: u32 (1..8),
//   const BATCH: u32 (1..8). Limits: K % 32 == 0; workgroup memory 4·256·ROWS·BATCH bytes ≤ 32 KiB.

struct Params {
  k: u32,
  n: u32,
  row_bytes: u32,
  w_off: u32,
  x_off: u32,
  y_off: u32,
  x_stride: u32,
  y_stride: u32,
}

@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var<storage, read> weights: array<u32>;
@group(0) @binding(2) var<storage, read> x: array<vec4<f32>>;
@group(0) @binding(3) var<storage, read_write> y: array<f32>;

const WG: u32 = 256u;
const WG_ROWS: u32 = (WG / TEAM) * ROWS;

// partial[(b · WG_ROWS + local row) · TEAM + t]
var<workgroup> partial: array<f32, WG * ROWS * BATCH>;

fn weight_word(i: u32) -> u32 {
  return weights[i];
}

@compute @workgroup_size(256)
fn main(
  @builtin(local_invocation_index) lid: u32,
  @builtin(workgroup_id) wid: vec3<u32>,
  @builtin(num_workgroups) nwg: vec3<u32>,
) {
  let wg = wid.y * nwg.x + wid.x;
  let team = lid / TEAM;
  let t = lid % TEAM;
  let row0 = wg * WG_ROWS + team * ROWS;
  let n_chunks = params.k / 32u;

  // Rows past N read row N-1 (in bounds) and are never stored: no early return before the barrier.
  var rb: array<u32, ROWS>;
  for (var r = 0u; r < ROWS; r++) {
    rb[r] = params.w_off + min(row0 + r, params.n - 1u) * params.row_bytes;
  }
  var acc: array<array<f32, BATCH>, ROWS>;

  for (var c = t; c < n_chunks; c += TEAM) {
    var sc: array<vec4<f32>, ROWS>;
    for (var r = 0u; r < ROWS; r++) {
      sc[r] = quant_scales(rb[r], c);
    }
    // Zeroed explicitly each chunk: a `var` declared in a loop body is zero-initialised only once by some
    // compilers (naga hoists it to the function entry; seen on lavapipe).
    var plo: array<array<f32, BATCH>, ROWS>;
    var phi: array<array<f32, BATCH>, ROWS>;
    var sxlo: array<f32, BATCH>;
    var sxhi: array<f32, BATCH>;
    for (var b = 0u; b < BATCH; b++) {
      sxlo[b] = 0.0;
      sxhi[b] = 0.0;
      for (var r = 0u; r < ROWS; r++) {
        plo[r][b] = 0.0;
        phi[r][b] = 0.0;
      }
    }
    for (var j = 0u; j < 4u; j++) {
      let pos = quant_pos(c, j);
      var q: array<array<vec4<f32>, 2>, ROWS>;
      for (var r = 0u; r < ROWS; r++) {
        q[r] = quant_q(rb[r], c, j);
      }
      for (var b = 0u; b < BATCH; b++) {
        let xb = params.x_off + b * params.x_stride;
        let xl = x[(xb + pos.x) >> 2u];
        let xh = x[(xb + pos.y) >> 2u];
        if (QUANT_HAS_MIN) {
          sxlo[b] += dot(xl, vec4<f32>(1.0));
          sxhi[b] += dot(xh, vec4<f32>(1.0));
        }
        for (var r = 0u; r < ROWS; r++) {
          plo[r][b] += dot(q[r][0], xl);
          phi[r][b] += dot(q[r][1], xh);
        }
      }
    }
    for (var r = 0u; r < ROWS; r++) {
      let s = sc[r];
      for (var b = 0u; b < BATCH; b++) {
        var v = s.x * plo[r][b] + s.y * phi[r][b];
        if (QUANT_HAS_MIN) {
          v -= s.z * sxlo[b] + s.w * sxhi[b];
        }
        acc[r][b] += v;
      }
    }
  }

  for (var r = 0u; r < ROWS; r++) {
    for (var b = 0u; b < BATCH; b++) {
      partial[(b * WG_ROWS + team * ROWS + r) * TEAM + t] = acc[r][b];
    }
  }
  workgroupBarrier();
  for (var o = lid; o < WG_ROWS * BATCH; o += WG) {
    let b = o / WG_ROWS;
    let rl = o % WG_ROWS;
    let row = wg * WG_ROWS + rl;
    // Start each output's walk at a different bank (o), so the invocations do not all hit one bank.
    var s = 0.0;
    for (var i = 0u; i < TEAM; i++) {
      s += partial[o * TEAM + ((i + o) & (TEAM - 1u))];
    }
    if (row < params.n) {
      y[params.y_off + b * params.y_stride + row] = s;
    }
  }
}
