// matvec_q8b: matvec_q8 over BATCH columns, y[col][n] = Σ_k W[n][k] · x̂[col][k] for col < BATCH, with each
// weight chunk loaded and decoded once for all columns (lib/q8chunk.wgsl's chunk_dec, then dec_dot against
// each column's int8 x): the int8 mat-vec of a batched decode step. Every column equals matvec_q8's y for
// that column alone, bit for bit, given the same TEAM and RED: each (row, column) adds dx_c · dec_dot over
// chunks t, t + TEAM, ... into one f32 in matvec_q8's order, and the team partials are added in its order
// (RED 0: one invocation per row, the run starting at the row's index mod TEAM as matvec_q8's rotating start
// gives where its rows per workgroup are a multiple of TEAM; RED 1: runs of 8, then the runs).
//
// Bindings (the weight buffer twice, as words and word pairs; xq twice, as quads and scale words):
//   params    uniform Params
//   weights   array<u32>        W ne=[K, N]; row n starts at byte w_off + n·row_bytes
//   weights2  array<vec2<u32>>  the same buffer (IQ4_XS: w_off % 8 == 0)
//   xq        array<vec4<u32>>  quantize_q8's output for this TYPE's layout: column col at word col·x_stride
//             (K/4 quad words, then K/32 scale words)
//   xs        array<u32>        the same buffer
//   y         array<f32>        element (n, col) at y_off + col·y_stride + n
// Grid: ceil(N / WG_ROWS) workgroups, 2-D past 65535 (id = y·num_workgroups.x + x); workgroup w owns rows
// w·WG_ROWS.., WG_ROWS = (256 / TEAM)·ROWS; a team of TEAM invocations owns ROWS rows and keeps ROWS·BATCH
// sums in named vec4s (a<r><g>: row r, columns 4g..4g+3; no function-scope arrays, which some drivers put in
// local memory). The partials go through workgroup memory four columns at a time.
// XSUM (the K-quants, 12, 13, 14): the workgroup first sums each column's x over each chunk's two halves
// (K/32 chunks, dec_dot's Σ q_i, which depends on x alone) into workgroup memory, and every row takes them
// from there (dec_dot_sums: the same integers) instead of summing them again.
// Constants: const TYPE: u32 (8, 12, 13, 14 or 23), const TEAM: u32 (power of two, 1..256), const ROWS: u32
//   (1..4), const BATCH: u32 (1..16), const ACC: u32 (1: y += W·x̂), const RED: u32 (0 or 1, as matvec_q8),
//   const XSUM: u32 (0, or K/32 with a K-quant TYPE).
// Workgroup memory: 1024 (IQ4_XS table) + 4096·ROWS + 8·XSUM·BATCH bytes.

struct Params {
  k: u32,
  n: u32,
  row_bytes: u32,
  w_off: u32,
  y_off: u32,
  y_stride: u32,
  x_stride: u32,
  _pad: u32,
}

@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var<storage, read> weights: array<u32>;
@group(0) @binding(2) var<storage, read> weights2: array<vec2<u32>>;
@group(0) @binding(3) var<storage, read> xq: array<vec4<u32>>;
@group(0) @binding(4) var<storage, read> xs: array<u32>;
@group(0) @binding(5) var<storage, read_write> y: array<f32>;

const WG: u32 = 256u;
const COPIES: u32 = 1u;
const WG_ROWS: u32 = (WG / TEAM) * ROWS;
// Column groups of four.
const NG: u32 = (BATCH + 3u) / 4u;
const RUN: u32 = select(1u, 8u, TEAM >= 8u);

// xsum[j · XSUM + c]: column j's (Σ q_i of x0, of x1) over chunk c (XSUM > 0).
var<workgroup> xsum: array<vec2<i32>, XSUM * BATCH + 1u>;

// partial[r · WG + lid] (RED 1) or [(team · ROWS + r) · TEAM + t] (RED 0): four columns' partials.
var<workgroup> partial: array<vec4<f32>, WG * ROWS>;

// a + dx·dec_dot for column j's chunk c (matvec_q8's `a += dx * chunk_dot(...)`).
fn acc_col(a: f32, d: Dec, j: u32, c: u32) -> f32 {
  let b = j * params.x_stride;
  let x0 = xq[(b >> 2u) + 2u * c];
  let x1 = xq[(b >> 2u) + 2u * c + 1u];
  let dx = bitcast<f32>(xs[b + params.k / 4u + c]);
  if (XSUM > 0u) {
    return a + dx * dec_dot_sums(d, x0, x1, xsum[j * XSUM + c]);
  }
  return a + dx * dec_dot(d, x0, x1);
}

// Columns j0..j0+3 (those below BATCH) of one row's sums.
fn acc4(a: vec4<f32>, d: Dec, j0: u32, c: u32) -> vec4<f32> {
  var r = a;
  r.x = acc_col(r.x, d, j0, c);
  if (j0 + 1u < BATCH) {
    r.y = acc_col(r.y, d, j0 + 1u, c);
  }
  if (j0 + 2u < BATCH) {
    r.z = acc_col(r.z, d, j0 + 2u, c);
  }
  if (j0 + 3u < BATCH) {
    r.w = acc_col(r.w, d, j0 + 3u, c);
  }
  return r;
}

// y[row][col] = s (ACC: +=) for the four columns from j0 below BATCH, rows inside N.
fn store4(row: u32, j0: u32, s: vec4<f32>) {
  if (row >= params.n) {
    return;
  }
  for (var i = 0u; i < 4u; i++) {
    if (j0 + i < BATCH) {
      let at = params.y_off + (j0 + i) * params.y_stride + row;
      if (ACC == 1u) {
        y[at] = y[at] + s[i];
      } else {
        y[at] = s[i];
      }
    }
  }
}

// Adds the team partials of column group g (a0..a3: rows 0..3's sums, those below ROWS) and stores them
// (every invocation calls it: barriers).
fn reduce(wg: u32, lid: u32, g: u32, a0: vec4<f32>, a1: vec4<f32>, a2: vec4<f32>, a3: vec4<f32>) {
  let team = lid / TEAM;
  let t = lid % TEAM;
  let j0 = 4u * g;
  if (RED == 0u) {
    partial[(team * ROWS) * TEAM + t] = a0;
    if (ROWS >= 2u) {
      partial[(team * ROWS + 1u) * TEAM + t] = a1;
    }
    if (ROWS >= 3u) {
      partial[(team * ROWS + 2u) * TEAM + t] = a2;
    }
    if (ROWS >= 4u) {
      partial[(team * ROWS + 3u) * TEAM + t] = a3;
    }
    workgroupBarrier();
    for (var o = lid; o < WG_ROWS; o += WG) {
      var s = vec4<f32>(0.0);
      for (var e = 0u; e < TEAM; e++) {
        s += partial[o * TEAM + ((e + o) % TEAM)];
      }
      store4(wg * WG_ROWS + o, j0, s);
    }
    workgroupBarrier();
    return;
  }
  partial[lid] = a0;
  if (ROWS >= 2u) {
    partial[WG + lid] = a1;
  }
  if (ROWS >= 3u) {
    partial[2u * WG + lid] = a2;
  }
  if (ROWS >= 4u) {
    partial[3u * WG + lid] = a3;
  }
  workgroupBarrier();
  if (TEAM >= 8u) {
    if ((t & 7u) == 0u) {
      for (var r = 0u; r < ROWS; r++) {
        var s = vec4<f32>(0.0);
        for (var e = 0u; e < 8u; e++) {
          s += partial[r * WG + lid + e];
        }
        partial[r * WG + lid] = s;
      }
    }
    workgroupBarrier();
  }
  for (var o = lid; o < WG_ROWS; o += WG) {
    let r = o % ROWS;
    let tm = o / ROWS;
    var s = vec4<f32>(0.0);
    for (var j = 0u; j < TEAM; j += RUN) {
      s += partial[r * WG + tm * TEAM + j];
    }
    store4(wg * WG_ROWS + o, j0, s);
  }
  workgroupBarrier();
}

@compute @workgroup_size(256)
fn main(
  @builtin(local_invocation_index) lid: u32,
  @builtin(workgroup_id) wid: vec3<u32>,
  @builtin(num_workgroups) nwg: vec3<u32>,
) {
  q8dot_table(lid);
  if (XSUM > 0u) {
    for (var e = lid; e < XSUM * BATCH; e += WG) {
      let b = (e / XSUM) * params.x_stride;
      let c = e % XSUM;
      xsum[e] = vec2<i32>(qsum16(xq[(b >> 2u) + 2u * c]), qsum16(xq[(b >> 2u) + 2u * c + 1u]));
    }
    workgroupBarrier();
  }
  let wg = wid.y * nwg.x + wid.x;
  let team = lid / TEAM;
  let t = lid % TEAM;
  let row0 = wg * WG_ROWS + team * ROWS;
  // Rows past N read row N-1 (in bounds) and are never stored: no early return before the barriers.
  let rb = params.w_off + min(vec4<u32>(row0) + vec4<u32>(0u, 1u, 2u, 3u), vec4<u32>(params.n - 1u)) *
    params.row_bytes;
  let n_chunks = params.k / 32u;
  var a00 = vec4<f32>(0.0);
  var a01 = vec4<f32>(0.0);
  var a02 = vec4<f32>(0.0);
  var a03 = vec4<f32>(0.0);
  var a10 = vec4<f32>(0.0);
  var a11 = vec4<f32>(0.0);
  var a12 = vec4<f32>(0.0);
  var a13 = vec4<f32>(0.0);
  var a20 = vec4<f32>(0.0);
  var a21 = vec4<f32>(0.0);
  var a22 = vec4<f32>(0.0);
  var a23 = vec4<f32>(0.0);
  var a30 = vec4<f32>(0.0);
  var a31 = vec4<f32>(0.0);
  var a32 = vec4<f32>(0.0);
  var a33 = vec4<f32>(0.0);
  for (var c = t; c < n_chunks; c += TEAM) {
    let l = load_rows(rb, c);
    let d0 = chunk_dec(rb.x, c, l.r0);
    a00 = acc4(a00, d0, 0u, c);
    if (NG > 1u) {
      a01 = acc4(a01, d0, 4u, c);
    }
    if (NG > 2u) {
      a02 = acc4(a02, d0, 8u, c);
    }
    if (NG > 3u) {
      a03 = acc4(a03, d0, 12u, c);
    }
    if (ROWS >= 2u) {
      let d1 = chunk_dec(rb.y, c, l.r1);
      a10 = acc4(a10, d1, 0u, c);
      if (NG > 1u) {
        a11 = acc4(a11, d1, 4u, c);
      }
      if (NG > 2u) {
        a12 = acc4(a12, d1, 8u, c);
      }
      if (NG > 3u) {
        a13 = acc4(a13, d1, 12u, c);
      }
    }
    if (ROWS >= 3u) {
      let d2 = chunk_dec(rb.z, c, l.r2);
      a20 = acc4(a20, d2, 0u, c);
      if (NG > 1u) {
        a21 = acc4(a21, d2, 4u, c);
      }
      if (NG > 2u) {
        a22 = acc4(a22, d2, 8u, c);
      }
      if (NG > 3u) {
        a23 = acc4(a23, d2, 12u, c);
      }
    }
    if (ROWS >= 4u) {
      let d3 = chunk_dec(rb.w, c, l.r3);
      a30 = acc4(a30, d3, 0u, c);
      if (NG > 1u) {
        a31 = acc4(a31, d3, 4u, c);
      }
      if (NG > 2u) {
        a32 = acc4(a32, d3, 8u, c);
      }
      if (NG > 3u) {
        a33 = acc4(a33, d3, 12u, c);
      }
    }
  }
  reduce(wg, lid, 0u, a00, a10, a20, a30);
  if (NG > 1u) {
    reduce(wg, lid, 1u, a01, a11, a21, a31);
  }
  if (NG > 2u) {
    reduce(wg, lid, 2u, a02, a12, a22, a32);
  }
  if (NG > 3u) {
    reduce(wg, lid, 3u, a03, a13, a23, a33);
  }
}
