// Test-only kernel for the loader: y[i] = f32(f16(x[i]) * f16(SCALE)) + OFFSET when USE_F16, else x[i] * SCALE + OFFSET.
// Bindings: x f32 ne=[n]; y f32 ne=[n]. One invocation per element. Constants: SCALE f32, OFFSET f32, USE_F16 bool, WG u32.
@group(0) @binding(0) var<storage, read> x: array<f32>;
@group(0) @binding(1) var<storage, read_write> y: array<f32>;

@compute @workgroup_size(WG)
fn main(@builtin(global_invocation_id) gid: vec3u) {
  let i = gid.x;
  if (i >= arrayLength(&y)) {
    return;
  }
  if (USE_F16) {
    y[i] = f32(f16(x[i]) * f16(SCALE)) + OFFSET;
  } else {
    y[i] = x[i] * SCALE + OFFSET;
  }
}
