// rms: the RMSNorm scale 1 / sqrt(Σ x² / n + eps) of one row, in ONE summation order for every kernel that
// norms a row (rms_norm, residual_add NORM, matvec NORM), so that a norm fused into another kernel gives the
// same bits as the norm's own dispatch (stage splits are compared bit for bit). The caller's invocation i of
// WG adds x² over the row's elements i, i + WG, ... in that order and passes its partial; rms_scale sums the
// WG partials by halving. The including kernel defines `const WG: u32` (a power of two <= 256).

var<workgroup> rms_red: array<f32, WG>;

// The scale of a row of n elements, returned to every invocation; every invocation must call it (barriers),
// and it may be called again at once (its last barrier follows every read).
fn rms_scale(lid: u32, partial: f32, n: u32, eps: f32) -> f32 {
  rms_red[lid] = partial;
  workgroupBarrier();
  for (var o = WG / 2u; o > 0u; o >>= 1u) {
    if (lid < o) {
      rms_red[lid] += rms_red[lid + o];
    }
    workgroupBarrier();
  }
  let scale = 1.0 / sqrt(rms_red[0] / f32(n) + eps);
  workgroupBarrier();
  return scale;
}
