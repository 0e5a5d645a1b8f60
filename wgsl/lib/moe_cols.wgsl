// moe_cols: one weight unit decoded once and applied to several columns' x, for the expert mat-vec kernels
// (moe_matvec's shared columns, moe_gmv's grouped columns). Needs lib/quant.wgsl, lib/rows.wgsl and the
// including kernel's const ROWS: u32, const GATE_UP: bool and x: array<vec4<f32>> (the columns' inputs).

// The sums of one column's rows: gate (or the only matrix) and up.
struct Acc {
  g: vec4<f32>,
  u: vec4<f32>,
}

// One unit of one row, decoded once (quant_scales, quant_q) for several columns' x.
struct Dec {
  s: vec4<f32>,
  q: array<vec4<f32>, 2>,
}

// The unit of up to 4 rows (the first ROWS of rb's components).
struct Dec4 {
  r0: Dec,
  r1: Dec,
  r2: Dec,
  r3: Dec,
}

fn dec_row(rb: u32, c: u32, j: u32) -> Dec {
  return Dec(quant_scales(rb, c), quant_q(rb, c, j));
}

fn dec_rows(rb: vec4<u32>, c: u32, j: u32) -> Dec4 {
  var d: Dec4;
  d.r0 = dec_row(rb.x, c, j);
  if (ROWS >= 2u) {
    d.r1 = dec_row(rb.y, c, j);
  }
  if (ROWS >= 3u) {
    d.r2 = dec_row(rb.z, c, j);
  }
  if (ROWS >= 4u) {
    d.r3 = dec_row(rb.w, c, j);
  }
  return d;
}

// rows_units on decoded units: rows_unit is rows_unit_dot of the same decode, so every value has its bits.
fn dot_rows(d: Dec4, xl: vec4<f32>, xh: vec4<f32>, sxl: f32, sxh: f32) -> vec4<f32> {
  var v = vec4<f32>(rows_unit_dot(d.r0.s, d.r0.q, xl, xh, sxl, sxh), 0.0, 0.0, 0.0);
  if (ROWS >= 2u) {
    v.y = rows_unit_dot(d.r1.s, d.r1.q, xl, xh, sxl, sxh);
  }
  if (ROWS >= 3u) {
    v.z = rows_unit_dot(d.r2.s, d.r2.q, xl, xh, sxl, sxh);
  }
  if (ROWS >= 4u) {
    v.w = rows_unit_dot(d.r3.s, d.r3.q, xl, xh, sxl, sxh);
  }
  return v;
}

// unit_acc of one token (x column at xb) on the decoded units dg (gate or only matrix) and du (up).
fn tok_acc(a: Acc, xb: u32, pos: vec2<u32>, dg: Dec4, du: Dec4) -> Acc {
  let xl = x[(xb + pos.x) >> 2u];
  let xh = x[(xb + pos.y) >> 2u];
  let sxl = dot(xl, vec4<f32>(1.0));
  let sxh = dot(xh, vec4<f32>(1.0));
  var r = a;
  r.g += dot_rows(dg, xl, xh, sxl, sxh);
  if (GATE_UP) {
    r.u += dot_rows(du, xl, xh, sxl, sxh);
  }
  return r;
}

// The sums of up to 8 columns, named: no array indexed by a loop counter (local memory on the H200).
struct AccT {
  a0: Acc,
  a1: Acc,
  a2: Acc,
  a3: Acc,
  a4: Acc,
  a5: Acc,
  a6: Acc,
  a7: Acc,
}
