// RMSNorm of rows (spec §5): y[r][i] = x[r][i] / sqrt(sum_i x[r][i]^2 / N + EPS) * w[i], all in f32.
// Bindings:
//   x  f32 ne=[N, nRows]  input rows
//   w  f32 ne=[N]         norm weight (GGUF weight, already 1 + w_hf)
//   y  f32 ne=[N, nRows]  output rows (may not alias x)
// A workgroup owns one row (workgroup_id.x); invocation i owns elements i, i + WG, ... of it.
// The sum of squares goes through lib/rms.wgsl (the order every fused norm shares).
// Constants: const N: u32; const EPS: f32; const WG: u32 (power of two, <= 256).
@group(0) @binding(0) var<storage, read> x: array<f32>;
@group(0) @binding(1) var<storage, read> w: array<f32>;
@group(0) @binding(2) var<storage, read_write> y: array<f32>;

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3u, @builtin(local_invocation_index) lid: u32) {
  let base = wid.x * N;
  var s = 0.0;
  for (var i = lid; i < N; i += WG) {
    let v = x[base + i];
    s += v * v;
  }
  let scale = rms_scale(lid, s, N, EPS);
  for (var i = lid; i < N; i += WG) {
    y[base + i] = x[base + i] * scale * w[i];
  }
}
