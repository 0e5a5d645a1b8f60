// SwiGLU activation (spec §10): y[t][i] = silu(g[t][i]) * u[t][i], silu(z) = z / (1 + exp(-z)).
// Bindings:
//   g  f32 ne=[N, nTokens]  gate projection (W_gate · m)
//   u  f32 ne=[N, nTokens]  up projection (W_up · m)
//   y  f32 ne=[N, nTokens]  activation (input of W_down)
// Grid (ceil(N / WG), nTokens): invocation i of workgroup (b, t) owns element b * WG + i of row t.
// Constants: const N, WG: u32.
@group(0) @binding(0) var<storage, read> g: array<f32>;
@group(0) @binding(1) var<storage, read> u: array<f32>;
@group(0) @binding(2) var<storage, read_write> y: array<f32>;

@compute @workgroup_size(WG)
fn main(@builtin(global_invocation_id) gid: vec3u) {
  let i = gid.x;
  let t = gid.y;
  if (i >= N) {
    return;
  }
  let z = g[t * N + i];
  y[t * N + i] = z / (1.0 + exp(-z)) * u[t * N + i];
}
