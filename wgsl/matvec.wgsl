// matvec: y[b][n] = Σ_k W[n][k] · x[b][k] for b < BATCH columns, reading packed weights (lib/quant.wgsl).
//
// Bindings (offsets and strides come from `params`, so each binding can be a slice of a bigger buffer):
//   params  uniform Params
//   weights array<u32>  W ne=[K, N] of type TYPE, raw GGUF block bytes; row n starts at byte w_off + n·row_bytes
//   x       array<vec4<f32>>  ne=[K, BATCH]; element (k, b) at x_off + b·x_stride + k (x_off, x_stride % 4 == 0)
//   y       array<f32>  ne=[N, BATCH]; element (n, b) at y_off + b·y_stride + n
//   nw      array<vec4<f32>>  ne=[K]  RMSNorm weight (NORM 1 or 2; otherwise bind any buffer of ≥ 16 bytes)
//   xn      array<vec4<f32>>  ne=[K]  read_write: the normed x at x_off (NORM 1; otherwise any unaliased buffer)
// NORM = 1 (batch 1) multiplies by the RMSNorm of x first (spec §5): every workgroup sums x² itself in the
// order of rms_norm.wgsl with WG = 256 (invocation i takes k = i, i + 256, ..., then lib/rms.wgsl), so its
// normed values equal rms_norm's bit for bit; workgroup 0 also writes them to xn for the block's other
// readers. That saves the norm's own dispatch. NORM = 2 (any batch) multiplies x by the norm weight alone
// (y = W·(x ⊙ nw)) and leaves the RMSNorm's scale, one factor per column, to the reader of y: the MoE router,
// whose moe_route scales each token's logits (engine/blocks/moe.ts says why). ACC = 1 adds into y (y += W·x): the residual add of an
// output projection, with the same rounding as residual_add (h + t).
// A workgroup (256 invocations) owns WG_ROWS = (256 / TEAM) · ROWS consecutive rows; a team of TEAM invocations
// owns ROWS rows. A row is K/8 units of 8 weights (4 units per 32-weight chunk, lib/quant.wgsl); invocation t
// of a team takes units t, t + TEAM, ... of all its rows, so the invocations of a warp read consecutive weight
// words and neighbouring x quads (coalesced), and each x quad it loads serves ROWS rows from registers. Each
// invocation keeps ROWS·BATCH f32 accumulators: at batch 1 with ROWS ≤ 4 in the components of one vec4 (row
// bases in a vec4<u32>), with no arrays (small arrays cost registers or local memory on some drivers;
// docs/PERF.md measured 1.2-1.3× on the H200); the team partials are added in workgroup memory in two
// levels of 8 (or fewer) so that all invocations share the work.
// The grid is 2-D when there are more than 65535 workgroups: workgroup id = y·num_workgroups.x + x.
// Grid z (batch 1): columns of a batched step, each running exactly the code of a dispatch of its own on its
// own slices: column z's x (and xn) at x_off + z·x_stride, its y at y_off + z·y_stride (z = 0: params' own).
// SR = 1 (strength-reduced batch-1 loop; TYPE 23 or 8, TEAM % 32 == 0, ROWS = BATCH = 1): since TEAM is a
// multiple of 32, unit u = t + i·TEAM has u % 32 = t % 32 for every i, so the unit's place in its block
// (word offsets, scale shifts, funnel shift) is computed once per invocation and the block word index and x
// quad index advance by constants per step (SR_WS words, SR_XS quads). A step takes UNROLL units and issues
// all their loads before any math. The sum order is the SR = 0 order (units t, t + TEAM, ... added one by
// one into one scalar) and each unit's value is the same expression, so SR = 1 equals SR = 0 bit for bit
// (given the same TEAM).
// XR = 2 (batched, named; ROWS ≤ 4, BATCH ≤ 16): no function-scope arrays (the H200 keeps loop-indexed ones in
// local memory, docs/PERF.md). Row bases sit in a vec4<u32>, sums in named vec4s a<r><g> (row r, columns
// 4g..4g+3; NbAcc). Per unit each row's scales and quads are decoded once, then column group after column
// group (written out, `if (BATCH > 4u)` ...) the group's x quads are loaded once and applied to every row. Each
// (row, column) still adds its units one by one in the order t, t + TEAM, ... through rows_dot, and the
// reduction is the same two levels, so every column equals its solo step bit for bit (same TEAM). The partials
// of NB_P columns (whole groups within 30 KiB) are reduced per pass, reusing the workgroup memory.
// Constants: const TYPE: u32 (ggml id), const TEAM: u32 (power of two, 1..256), const ROWS: u32 (1..8; XR 2:
//   1..4), const BATCH: u32 (1..8; XR 2: 1..16), const UNROLL: u32 (units per loop step: 1 or 2; with SR 1, 2,
//   4 or 8), const XR: u32 (batched path: 0 holds all columns' x quads in arrays for the rows, 1 reloads them
//   per row, 2 the named path above), const SR: u32 (0 or 1), const NORM: u32 (0, 1 or 2), const ACC: u32 (0 or 1),
//   const EPS: f32 (the norm's epsilon).
// Limits: K % 32 == 0; workgroup memory 4·256·ROWS·PART_COLS + 2048 (IQ4 table) + 1024 (NORM 1) bytes ≤ 32 KiB
// (PART_COLS: BATCH, or NB_P with XR 2).

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
@group(0) @binding(4) var<storage, read> nw: array<vec4<f32>>;
@group(0) @binding(5) var<storage, read_write> xn: array<vec4<f32>>;

// NORM: 1 / sqrt(mean(x²) + EPS) of column 0, the same in every invocation.
var<private> nscale: f32;
// params.x_off and params.y_off plus the grid-z column's strides (set first in main; z = 0: params' own).
var<private> x_off: u32;
var<private> y_off: u32;

// The x quad at element offset `e` (a multiple of 4) of the column starting at `xb`: normed with NORM.
fn x_quad(xb: u32, e: u32) -> vec4<f32> {
  let v = x[(xb + e) >> 2u];
  if (NORM == 1u) {
    return v * nscale * nw[e >> 2u];
  }
  if (NORM == 2u) {
    return v * nw[e >> 2u];
  }
  return v;
}

const WG: u32 = 256u;
const WG_ROWS: u32 = (WG / TEAM) * ROWS;
// First reduction level: each of OUTS · GROUPS sums adds TEAM / GROUPS partials; the second adds GROUPS.
const GROUPS: u32 = select(1u, TEAM / 8u, TEAM >= 8u);
const GROUP_LEN: u32 = TEAM / GROUPS;

// XR = 2: columns per reduction pass, whole groups of 4 within 30 KiB of partials (the IQ4 table takes 2 KiB of
// the 32): ROWS 1 up to 16 (one pass at 16 columns), ROWS 2 12, ROWS 3 8, ROWS 4 4; and the passes.
const NB_P: u32 = min(4u * ((BATCH + 3u) / 4u), max(4u, 4u * ((30u / ROWS) / 4u)));
const NB_PASSES: u32 = (BATCH + NB_P - 1u) / NB_P;
// Column groups of 4 per pass.
const NB_GPP: u32 = NB_P / 4u;
// Columns whose partials workgroup memory holds at once.
const PART_COLS: u32 = select(BATCH, NB_P, XR == 2u);

// partial[(b · WG_ROWS + local row) · TEAM + t] (b the column within the reduction pass); after level 1, group
// sums at partial[o · TEAM + g · GROUP_LEN].
var<workgroup> partial: array<f32, WG * ROWS * PART_COLS>;

fn weight_word(i: u32) -> u32 {
  return weights[i];
}

// Adds unit u (8 weights) of each of the invocation's rows times the matching x quads to `acc`. Each row's
// unit is decoded once (scales and quads) and applied to all BATCH columns: in a batched decode step the
// decoding, not the weight load, is what grows with the columns. The arithmetic per column is rows_unit's
// (rows_unit_dot), so every column equals its solo step bit for bit.
fn unit_acc(u: u32, rb: ptr<function, array<u32, ROWS>>, acc: ptr<function, array<array<f32, BATCH>, ROWS>>) {
  let c = u / 4u;
  let j = u % 4u;
  let pos = quant_pos(c, j);
  if (XR == 1u) {
    // x quads reloaded per row: no per-column arrays live across the rows (registers), more L1 reads.
    for (var r = 0u; r < ROWS; r++) {
      let s = quant_scales((*rb)[r], c);
      let q = quant_q((*rb)[r], c, j);
      for (var b = 0u; b < BATCH; b++) {
        let xb = x_off + b * params.x_stride;
        let xl1 = x_quad(xb, pos.x);
        let xh1 = x_quad(xb, pos.y);
        (*acc)[r][b] += rows_unit_dot(s, q, xl1, xh1, dot(xl1, vec4<f32>(1.0)), dot(xh1, vec4<f32>(1.0)));
      }
    }
    return;
  }
  var xl: array<vec4<f32>, BATCH>;
  var xh: array<vec4<f32>, BATCH>;
  var sxl: array<f32, BATCH>;
  var sxh: array<f32, BATCH>;
  for (var b = 0u; b < BATCH; b++) {
    let xb = x_off + b * params.x_stride;
    xl[b] = x_quad(xb, pos.x);
    xh[b] = x_quad(xb, pos.y);
    sxl[b] = dot(xl[b], vec4<f32>(1.0));
    sxh[b] = dot(xh[b], vec4<f32>(1.0));
  }
  for (var r = 0u; r < ROWS; r++) {
    let s = quant_scales((*rb)[r], c);
    let q = quant_q((*rb)[r], c, j);
    for (var b = 0u; b < BATCH; b++) {
      (*acc)[r][b] += rows_unit_dot(s, q, xl[b], xh[b], sxl[b], sxh[b]);
    }
  }
}

// Unit u of the team's ROWS (≤ 4) rows at bytes rb.x, rb.y, ... times column 0 of x: the x quads are loaded
// once for all rows (the batch-1 path; row r's value in component r, the others 0).
fn unit_rows(u: u32, rb: vec4<u32>) -> vec4<f32> {
  let c = u / 4u;
  let j = u % 4u;
  let pos = quant_pos(c, j);
  let xl = x_quad(x_off, pos.x);
  let xh = x_quad(x_off, pos.y);
  return rows_units(rb, c, j, xl, xh, dot(xl, vec4<f32>(1.0)), dot(xh, vec4<f32>(1.0)));
}

// XR = 2: one row's decoded unit (quant_scales, quant_q's two quads), named.
struct NbRow {
  s: vec4<f32>,
  ql: vec4<f32>,
  qh: vec4<f32>,
}

fn nb_row(rb: u32, c: u32, j: u32) -> NbRow {
  let q = quant_q(rb, c, j);
  return NbRow(quant_scales(rb, c), q[0], q[1]);
}

// XR = 2: one unit's x quads of a group of 4 columns (l0 = column 4g's lo quad, ...) and their element sums in
// the components of sl, sh. Columns ≥ BATCH are zeros and are not loaded.
struct NbX {
  l0: vec4<f32>,
  l1: vec4<f32>,
  l2: vec4<f32>,
  l3: vec4<f32>,
  h0: vec4<f32>,
  h1: vec4<f32>,
  h2: vec4<f32>,
  h3: vec4<f32>,
  sl: vec4<f32>,
  sh: vec4<f32>,
}

// XR = 2: the x quads of unit position `pos` of columns 4g..4g+3 (g is a constant at every call).
fn nb_x(g: u32, pos: vec2<u32>) -> NbX {
  var v: NbX;
  let b = 4u * g;
  let xb = x_off + b * params.x_stride;
  v.l0 = x_quad(xb, pos.x);
  v.h0 = x_quad(xb, pos.y);
  if (b + 1u < BATCH) {
    v.l1 = x_quad(xb + params.x_stride, pos.x);
    v.h1 = x_quad(xb + params.x_stride, pos.y);
  }
  if (b + 2u < BATCH) {
    v.l2 = x_quad(xb + 2u * params.x_stride, pos.x);
    v.h2 = x_quad(xb + 2u * params.x_stride, pos.y);
  }
  if (b + 3u < BATCH) {
    v.l3 = x_quad(xb + 3u * params.x_stride, pos.x);
    v.h3 = x_quad(xb + 3u * params.x_stride, pos.y);
  }
  let one = vec4<f32>(1.0);
  v.sl = vec4<f32>(dot(v.l0, one), dot(v.l1, one), dot(v.l2, one), dot(v.l3, one));
  v.sh = vec4<f32>(dot(v.h0, one), dot(v.h1, one), dot(v.h2, one), dot(v.h3, one));
  return v;
}

// XR = 2: `a` plus a decoded row unit times the 4 columns of group g (component k: column 4g + k; those past
// BATCH stay as they are), each added on its own through rows_dot: the arithmetic of the solo step. Add per
// component: `a += vec4(v0, v1, v2, v3)` with v built from vec4(v0, 0, 0, 0) gave column 0 other bits than
// the solo step on lavapipe (ROWS ≥ 2, two or more units per invocation).
fn nb_add(a: vec4<f32>, d: NbRow, x4: NbX, g: u32) -> vec4<f32> {
  var v = a;
  v.x += rows_dot(d.s, d.ql, d.qh, x4.l0, x4.h0, x4.sl.x, x4.sh.x);
  if (4u * g + 1u < BATCH) {
    v.y += rows_dot(d.s, d.ql, d.qh, x4.l1, x4.h1, x4.sl.y, x4.sh.y);
  }
  if (4u * g + 2u < BATCH) {
    v.z += rows_dot(d.s, d.ql, d.qh, x4.l2, x4.h2, x4.sl.z, x4.sh.z);
  }
  if (4u * g + 3u < BATCH) {
    v.w += rows_dot(d.s, d.ql, d.qh, x4.l3, x4.h3, x4.sl.w, x4.sh.w);
  }
  return v;
}

// XR = 2: the invocation's sums, named: a<r><g> holds row r (of the team's ROWS) times columns 4g..4g+3.
struct NbAcc {
  a00: vec4<f32>,
  a01: vec4<f32>,
  a02: vec4<f32>,
  a03: vec4<f32>,
  a10: vec4<f32>,
  a11: vec4<f32>,
  a12: vec4<f32>,
  a13: vec4<f32>,
  a20: vec4<f32>,
  a21: vec4<f32>,
  a22: vec4<f32>,
  a23: vec4<f32>,
  a30: vec4<f32>,
  a31: vec4<f32>,
  a32: vec4<f32>,
  a33: vec4<f32>,
}

// XR = 2: adds unit u of the team's ROWS (≤ 4) rows at bytes rb.x, rb.y, ... times every column to `acc`. Each
// row's unit is decoded once; then column group after column group, the group's x quads are loaded once and
// applied to every row from registers. Nothing lives in an array (docs/PERF.md: the H200 keeps loop-indexed
// arrays in local memory).
fn nb_unit(u: u32, rb: vec4<u32>, acc: ptr<function, NbAcc>) {
  let c = u / 4u;
  let j = u % 4u;
  let pos = quant_pos(c, j);
  let d0 = nb_row(rb.x, c, j);
  var d1 = d0;
  var d2 = d0;
  var d3 = d0;
  if (ROWS >= 2u) {
    d1 = nb_row(rb.y, c, j);
  }
  if (ROWS >= 3u) {
    d2 = nb_row(rb.z, c, j);
  }
  if (ROWS >= 4u) {
    d3 = nb_row(rb.w, c, j);
  }
  {
    let x4 = nb_x(0u, pos);
    (*acc).a00 = nb_add((*acc).a00, d0, x4, 0u);
    if (ROWS >= 2u) {
      (*acc).a10 = nb_add((*acc).a10, d1, x4, 0u);
    }
    if (ROWS >= 3u) {
      (*acc).a20 = nb_add((*acc).a20, d2, x4, 0u);
    }
    if (ROWS >= 4u) {
      (*acc).a30 = nb_add((*acc).a30, d3, x4, 0u);
    }
  }
  if (BATCH > 4u) {
    let x4 = nb_x(1u, pos);
    (*acc).a01 = nb_add((*acc).a01, d0, x4, 1u);
    if (ROWS >= 2u) {
      (*acc).a11 = nb_add((*acc).a11, d1, x4, 1u);
    }
    if (ROWS >= 3u) {
      (*acc).a21 = nb_add((*acc).a21, d2, x4, 1u);
    }
    if (ROWS >= 4u) {
      (*acc).a31 = nb_add((*acc).a31, d3, x4, 1u);
    }
  }
  if (BATCH > 8u) {
    let x4 = nb_x(2u, pos);
    (*acc).a02 = nb_add((*acc).a02, d0, x4, 2u);
    if (ROWS >= 2u) {
      (*acc).a12 = nb_add((*acc).a12, d1, x4, 2u);
    }
    if (ROWS >= 3u) {
      (*acc).a22 = nb_add((*acc).a22, d2, x4, 2u);
    }
    if (ROWS >= 4u) {
      (*acc).a32 = nb_add((*acc).a32, d3, x4, 2u);
    }
  }
  if (BATCH > 12u) {
    let x4 = nb_x(3u, pos);
    (*acc).a03 = nb_add((*acc).a03, d0, x4, 3u);
    if (ROWS >= 2u) {
      (*acc).a13 = nb_add((*acc).a13, d1, x4, 3u);
    }
    if (ROWS >= 3u) {
      (*acc).a23 = nb_add((*acc).a23, d2, x4, 3u);
    }
    if (ROWS >= 4u) {
      (*acc).a33 = nb_add((*acc).a33, d3, x4, 3u);
    }
  }
}

// XR = 2: writes row r's sums of column group g (a vec4: columns 4g..4g+3, those < BATCH) into the partials of
// reduction pass p, if the group belongs to it.
fn nb_put(p: u32, g: u32, r: u32, team: u32, t: u32, a: vec4<f32>) {
  if (g / NB_GPP != p || 4u * g >= BATCH || r >= ROWS) {
    return;
  }
  let b = 4u * (g % NB_GPP);
  let at = (b * WG_ROWS + team * ROWS + r) * TEAM + t;
  partial[at] = a.x;
  if (4u * g + 1u < BATCH) {
    partial[at + WG_ROWS * TEAM] = a.y;
  }
  if (4u * g + 2u < BATCH) {
    partial[at + 2u * WG_ROWS * TEAM] = a.z;
  }
  if (4u * g + 3u < BATCH) {
    partial[at + 3u * WG_ROWS * TEAM] = a.w;
  }
}

// XR = 2: all of the invocation's sums of reduction pass p into the partials.
fn nb_put_pass(p: u32, team: u32, t: u32, acc: NbAcc) {
  nb_put(p, 0u, 0u, team, t, acc.a00);
  nb_put(p, 0u, 1u, team, t, acc.a10);
  nb_put(p, 0u, 2u, team, t, acc.a20);
  nb_put(p, 0u, 3u, team, t, acc.a30);
  nb_put(p, 1u, 0u, team, t, acc.a01);
  nb_put(p, 1u, 1u, team, t, acc.a11);
  nb_put(p, 1u, 2u, team, t, acc.a21);
  nb_put(p, 1u, 3u, team, t, acc.a31);
  nb_put(p, 2u, 0u, team, t, acc.a02);
  nb_put(p, 2u, 1u, team, t, acc.a12);
  nb_put(p, 2u, 2u, team, t, acc.a22);
  nb_put(p, 2u, 3u, team, t, acc.a32);
  nb_put(p, 3u, 0u, team, t, acc.a03);
  nb_put(p, 3u, 1u, team, t, acc.a13);
  nb_put(p, 3u, 2u, team, t, acc.a23);
  nb_put(p, 3u, 3u, team, t, acc.a33);
}

// The two-level reduction of the partials of `cols` columns (columns col0.. of y) and the stores; starts with
// the barrier after the partials' writes. The rotation of level 1 starts at (local row · GROUPS + g) mod
// GROUP_LEN whatever the column or the pass (WG_ROWS · GROUPS is a multiple of GROUP_LEN), so each row's sum
// takes the same order in every path and batch.
fn reduce_store(wg: u32, lid: u32, cols: u32, col0: u32) {
  workgroupBarrier();
  let outs = WG_ROWS * cols;
  // Level 1: sum runs of GROUP_LEN partials in place (the walk starts at a rotating offset so that the
  // invocations spread over the banks).
  for (var i = lid; i < outs * GROUPS; i += WG) {
    let base = i * GROUP_LEN;
    var s = 0.0;
    for (var e = 0u; e < GROUP_LEN; e++) {
      s += partial[base + ((e + i) % GROUP_LEN)];
    }
    partial[base] = s;
  }
  workgroupBarrier();
  for (var o = lid; o < outs; o += WG) {
    let b = col0 + o / WG_ROWS;
    let rl = o % WG_ROWS;
    let row = wg * WG_ROWS + rl;
    var s = 0.0;
    for (var g = 0u; g < GROUPS; g++) {
      s += partial[o * TEAM + g * GROUP_LEN];
    }
    if (row < params.n && b < BATCH) {
      let at = y_off + b * params.y_stride + row;
      if (ACC == 1u) {
        y[at] = y[at] + s;
      } else {
        y[at] = s;
      }
    }
  }
}

// SR = 1: where an invocation's units sit in their blocks, the same for all of its units.
struct SrLane {
  // Word index of the first unit's block: IQ4_XS its head word (d, scales_h); Q8_0 the word holding d.
  wi: u32,
  // IQ4_XS: the qs word's offset from wi; Q8_0: the offset of the first of the three words holding the qs.
  o1: u32,
  // IQ4_XS: the scales_l shift 4·ib; Q8_0: the funnel shift (bits) of the qs bytes.
  sa: u32,
  // IQ4_XS: the scales_h shift 16 + 2·ib; Q8_0: 1 when d is the high half of its word.
  sb: u32,
  // Quad index (from x_off) of the first unit's lo quad; the hi quad is xo quads further.
  eq: u32,
  xo: u32,
}

// SR = 1: words and x quads from one unit to the lane's next (TEAM units on: TEAM / 32 blocks of 136 or 8
// blocks of 34 bytes per 32 units).
const SR_WS: u32 = select(68u, 34u, TYPE == 23u) * (TEAM / 32u);
const SR_XS: u32 = 2u * TEAM;

// SR = 1: the loaded words of one unit (IQ4_XS: head, scales_l, qs, -; Q8_0: d word, three qs words) and its
// two x quads.
struct SrLoad {
  w0: u32,
  w1: u32,
  w2: u32,
  w3: u32,
  xl: vec4<f32>,
  xh: vec4<f32>,
}

// SR = 1: the lane's unit t (of the row at byte rb).
fn sr_lane(t: u32, rb: u32) -> SrLane {
  let j = t & 3u;
  if (TYPE == 23u) {
    let ib = (t >> 2u) & 7u;
    return SrLane((rb >> 2u) + 34u * (t >> 5u), 2u + 4u * ib + j, 4u * ib, 16u + 2u * ib, 8u * (t >> 2u) + j, 4u);
  }
  let blk = rb + 34u * (t >> 2u);
  let b = blk + 2u + 8u * j;
  return SrLane(blk >> 2u, (b >> 2u) - (blk >> 2u), (b & 3u) * 8u, (blk >> 1u) & 1u, 8u * (t >> 2u) + 2u * j, 1u);
}

// SR = 1: the x quad at quad index q from x_off (normed with NORM, as x_quad).
fn sr_x(q: u32) -> vec4<f32> {
  let v = x[(x_off >> 2u) + q];
  if (NORM == 1u) {
    return v * nscale * nw[q];
  }
  if (NORM == 2u) {
    return v * nw[q];
  }
  return v;
}

// SR = 1: the loads of the unit whose block word is wi and whose lo quad is eq.
fn sr_load(l: SrLane, wi: u32, eq: u32) -> SrLoad {
  let xl = sr_x(eq);
  let xh = sr_x(eq + l.xo);
  if (TYPE == 23u) {
    return SrLoad(weight_word(wi), weight_word(wi + 1u), weight_word(wi + l.o1), 0u, xl, xh);
  }
  let q = wi + l.o1;
  return SrLoad(weight_word(wi), weight_word(q), weight_word(q + 1u), weight_word(q + 2u), xl, xh);
}

// SR = 1: the unit's dot product, the same expression as rows_unit (lib/rows.wgsl). Keep its shape (scale vec4, one return
// of s.x·dot + s.y·dot): which products a driver fuses into FMAs follows the shape of the code, and a version
// with one return per type differed from SR = 0 in the last bits on lavapipe.
fn sr_dot(l: SrLane, u: SrLoad) -> f32 {
  var s: vec4<f32>;
  var q: array<vec4<f32>, 2>;
  if (TYPE == 23u) {
    let dl = iq4xs_scale(u.w0, u.w1, l.sa, l.sb);
    s = vec4<f32>(dl, dl, 0.0, 0.0);
    q = common_kv_word(u.w2);
  } else {
    let h = unpack2x16float(u.w0);
    let d = select(h.x, h.y, l.sb != 0u);
    s = vec4<f32>(d, d, 0.0, 0.0);
    q = q80_q_words(u.w1, u.w2, u.w3, l.sa);
  }
  return s.x * dot(q[0], u.xl) + s.y * dot(q[1], u.xh);
}

// SR = 1: the ROWS = BATCH = 1 sum of invocation t over the row at byte rb, in unit order.
fn sr_row(t: u32, rb: u32, n_units: u32) -> f32 {
  let l = sr_lane(t, rb);
  var wi = l.wi;
  var eq = l.eq;
  // Units of this invocation: t, t + TEAM, ... below n_units.
  let cnt = (n_units + TEAM - 1u - t) / TEAM;
  var a = 0.0;
  var i = 0u;
  for (; i + UNROLL <= cnt; i += UNROLL) {
    if (UNROLL == 1u) {
      a += sr_dot(l, sr_load(l, wi, eq));
    } else if (UNROLL == 2u) {
      let u0 = sr_load(l, wi, eq);
      let u1 = sr_load(l, wi + SR_WS, eq + SR_XS);
      a += sr_dot(l, u0);
      a += sr_dot(l, u1);
    } else if (UNROLL == 4u) {
      let u0 = sr_load(l, wi, eq);
      let u1 = sr_load(l, wi + SR_WS, eq + SR_XS);
      let u2 = sr_load(l, wi + 2u * SR_WS, eq + 2u * SR_XS);
      let u3 = sr_load(l, wi + 3u * SR_WS, eq + 3u * SR_XS);
      a += sr_dot(l, u0);
      a += sr_dot(l, u1);
      a += sr_dot(l, u2);
      a += sr_dot(l, u3);
    } else {
      let u0 = sr_load(l, wi, eq);
      let u1 = sr_load(l, wi + SR_WS, eq + SR_XS);
      let u2 = sr_load(l, wi + 2u * SR_WS, eq + 2u * SR_XS);
      let u3 = sr_load(l, wi + 3u * SR_WS, eq + 3u * SR_XS);
      let u4 = sr_load(l, wi + 4u * SR_WS, eq + 4u * SR_XS);
      let u5 = sr_load(l, wi + 5u * SR_WS, eq + 5u * SR_XS);
      let u6 = sr_load(l, wi + 6u * SR_WS, eq + 6u * SR_XS);
      let u7 = sr_load(l, wi + 7u * SR_WS, eq + 7u * SR_XS);
      a += sr_dot(l, u0);
      a += sr_dot(l, u1);
      a += sr_dot(l, u2);
      a += sr_dot(l, u3);
      a += sr_dot(l, u4);
      a += sr_dot(l, u5);
      a += sr_dot(l, u6);
      a += sr_dot(l, u7);
    }
    wi += UNROLL * SR_WS;
    eq += UNROLL * SR_XS;
  }
  for (; i < cnt; i++) {
    a += sr_dot(l, sr_load(l, wi, eq));
    wi += SR_WS;
    eq += SR_XS;
  }
  return a;
}

@compute @workgroup_size(256)
fn main(
  @builtin(local_invocation_index) lid: u32,
  @builtin(workgroup_id) wid: vec3<u32>,
  @builtin(num_workgroups) nwg: vec3<u32>,
) {
  x_off = params.x_off + wid.z * params.x_stride;
  y_off = params.y_off + wid.z * params.y_stride;
  let wg = wid.y * nwg.x + wid.x;
  let team = lid / TEAM;
  let t = lid % TEAM;
  let row0 = wg * WG_ROWS + team * ROWS;
  let n_units = params.k / 8u;
  if (QUANT_NEEDS_INIT) {
    quant_init(lid);
    workgroupBarrier();
  }
  if (NORM == 1u) {
    var ss = 0.0;
    for (var i = lid; i < params.k; i += WG) {
      let v = x[(x_off + i) >> 2u][(x_off + i) & 3u];
      ss += v * v;
    }
    nscale = rms_scale(lid, ss, params.k, EPS);
    if (wg == 0u) {
      for (var q = lid; q < params.k / 4u; q += WG) {
        xn[(x_off >> 2u) + q] = x_quad(x_off, 4u * q);
      }
    }
  }

  // Rows past N read row N-1 (in bounds) and are never stored: no early return before the barrier.
  // UNROLL = 2 takes two units per step: their loads are independent, so twice the bytes are in flight
  // per invocation (the loop's trip count is a runtime value, so the compiler does not unroll it itself).
  // Units are added in the order t, t + TEAM, ... in every path.
  if (XR == 2u) {
    // Named accumulators, x of a column group loaded once per unit for the team's rows (nb_unit); the
    // partials are reduced in NB_PASSES passes of NB_P columns, reusing workgroup memory.
    let last = params.n - 1u;
    let rb4 = params.w_off + min(vec4<u32>(row0) + vec4<u32>(0u, 1u, 2u, 3u), vec4<u32>(last)) * params.row_bytes;
    var acc: NbAcc;
    var u = t;
    if (UNROLL == 2u) {
      for (; u + TEAM < n_units; u += 2u * TEAM) {
        nb_unit(u, rb4, &acc);
        nb_unit(u + TEAM, rb4, &acc);
      }
    }
    for (; u < n_units; u += TEAM) {
      nb_unit(u, rb4, &acc);
    }
    for (var p = 0u; p < NB_PASSES; p++) {
      if (p > 0u) {
        // The previous pass's stores read the partials.
        workgroupBarrier();
      }
      nb_put_pass(p, team, t, acc);
      reduce_store(wg, lid, NB_P, p * NB_P);
    }
    return;
  }
  if (BATCH == 1u && ROWS <= 4u) {
    // Batch 1, ROWS ≤ 4: array-free (row bases and sums in vec4 components; small arrays cost registers or
    // local memory on some drivers, docs/PERF.md), each x quad loaded once for the team's rows. SR = 1
    // (ROWS = 1) runs the strength-reduced loop instead (sr_row, header).
    let last = params.n - 1u;
    let rb4 = params.w_off + min(vec4<u32>(row0) + vec4<u32>(0u, 1u, 2u, 3u), vec4<u32>(last)) * params.row_bytes;
    var a4 = vec4<f32>(0.0);
    if (SR == 1u) {
      a4.x = sr_row(t, rb4.x, n_units);
    } else {
      var u = t;
      if (UNROLL == 2u) {
        for (; u + TEAM < n_units; u += 2u * TEAM) {
          a4 += unit_rows(u, rb4);
          a4 += unit_rows(u + TEAM, rb4);
        }
      }
      for (; u < n_units; u += TEAM) {
        a4 += unit_rows(u, rb4);
      }
    }
    for (var r = 0u; r < ROWS; r++) {
      partial[(team * ROWS + r) * TEAM + t] = a4[r];
    }
  } else {
    var rb: array<u32, ROWS>;
    for (var r = 0u; r < ROWS; r++) {
      rb[r] = params.w_off + min(row0 + r, params.n - 1u) * params.row_bytes;
    }
    var acc: array<array<f32, BATCH>, ROWS>;
    for (var r = 0u; r < ROWS; r++) {
      for (var b = 0u; b < BATCH; b++) {
        acc[r][b] = 0.0;
      }
    }
    var u = t;
    if (UNROLL == 2u) {
      for (; u + TEAM < n_units; u += 2u * TEAM) {
        unit_acc(u, &rb, &acc);
        unit_acc(u + TEAM, &rb, &acc);
      }
    }
    for (; u < n_units; u += TEAM) {
      unit_acc(u, &rb, &acc);
    }
    for (var r = 0u; r < ROWS; r++) {
      for (var b = 0u; b < BATCH; b++) {
        partial[(b * WG_ROWS + team * ROWS + r) * TEAM + t] = acc[r][b];
      }
    }
  }
  reduce_store(wg, lid, BATCH, 0u);
}
