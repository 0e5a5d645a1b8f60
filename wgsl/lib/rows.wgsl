// rows: one 8-weight unit (chunk c, unit j; lib/quant.wgsl) of a weight row against its two x quads, for the
// mat-vec kernels (matvec, moe_matvec). Every row value goes through rows_unit, one expression shape in every
// path, so a row's sum does not depend on how many rows or columns share its x quads (batched decode equals
// the solo step bit for bit). Needs lib/quant.wgsl and the including kernel's const ROWS: u32.

// Unit (c, j) of the row at byte rb times the x quads xl, xh; sxl, sxh are their element sums (used by types
// with a min).
fn rows_unit(rb: u32, c: u32, j: u32, xl: vec4<f32>, xh: vec4<f32>, sxl: f32, sxh: f32) -> f32 {
  return rows_unit_dot(quant_scales(rb, c), quant_q(rb, c, j), xl, xh, sxl, sxh);
}

// A decoded unit (scales s and quads q of quant_scales / quant_q) times the x quads xl, xh: the arithmetic of
// rows_unit, for kernels that decode a unit once and apply it to several columns (batched decode).
fn rows_unit_dot(s: vec4<f32>, q: array<vec4<f32>, 2>, xl: vec4<f32>, xh: vec4<f32>, sxl: f32, sxh: f32) -> f32 {
  return rows_dot(s, q[0], q[1], xl, xh, sxl, sxh);
}

// rows_unit_dot with the unit's two quads as named vec4s (ql = q[0], qh = q[1]): THE expression every row
// value goes through. Keep its shape (scale vec4, s.x·dot + s.y·dot, then the min terms): which products a
// driver contracts into FMAs follows the shape of the code, and every path must round alike.
fn rows_dot(s: vec4<f32>, ql: vec4<f32>, qh: vec4<f32>, xl: vec4<f32>, xh: vec4<f32>, sxl: f32, sxh: f32) -> f32 {
  var v = s.x * dot(ql, xl) + s.y * dot(qh, xh);
  if (QUANT_HAS_MIN) {
    v -= s.z * sxl + s.w * sxh;
  }
  return v;
}

// Unit (c, j) of up to 4 rows at bytes rb.x, rb.y, ... (the first ROWS of them): row r's value in component r,
// the others 0. Row bases and sums live in vec4 components, not arrays: small arrays cost registers or local
// memory on some drivers (docs/PERF.md).
fn rows_units(rb: vec4<u32>, c: u32, j: u32, xl: vec4<f32>, xh: vec4<f32>, sxl: f32, sxh: f32) -> vec4<f32> {
  var v = vec4<f32>(rows_unit(rb.x, c, j, xl, xh, sxl, sxh), 0.0, 0.0, 0.0);
  if (ROWS >= 2u) {
    v.y = rows_unit(rb.y, c, j, xl, xh, sxl, sxh);
  }
  if (ROWS >= 3u) {
    v.z = rows_unit(rb.z, c, j, xl, xh, sxl, sxh);
  }
  if (ROWS >= 4u) {
    v.w = rows_unit(rb.w, c, j, xl, xh, sxl, sxh);
  }
  return v;
}
