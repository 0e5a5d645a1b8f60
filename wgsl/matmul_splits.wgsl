// matmul_splits: adds the partial products of a split-K matmul (matmul.wgsl with grid z = SPLITS):
//   Y[m][n] = Σ_{z < splits} P[z][m][n], added in z order (the same bits for every run).
// Bindings:
//   params  uniform Params
//   part    array<f32>  P ne=[N, M, splits], dense: element (n, m, z) at (z·M + m)·N + n
//   y       array<f32>  Y ne=[N, M]; element (n, m) at y_off + m·y_stride + n
// One invocation per output element; the grid is 2-D when there are more than 65535 workgroups
// (workgroup id = y·num_workgroups.x + x).

struct Params {
  n: u32,
  m: u32,
  splits: u32,
  y_off: u32,
  y_stride: u32,
  pad0: u32,
  pad1: u32,
  pad2: u32,
}

@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var<storage, read> part: array<f32>;
@group(0) @binding(2) var<storage, read_write> y: array<f32>;

@compute @workgroup_size(256)
fn main(
  @builtin(local_invocation_index) lid: u32,
  @builtin(workgroup_id) wid: vec3<u32>,
  @builtin(num_workgroups) nwg: vec3<u32>,
) {
  let i = (wid.y * nwg.x + wid.x) * 256u + lid;
  let total = params.n * params.m;
  if (i >= total) {
    return;
  }
  var s = part[i];
  for (var z = 1u; z < params.splits; z++) {
    s += part[z * total + i];
  }
  let m = i / params.n;
  y[params.y_off + m * params.y_stride + i % params.n] = s;
}
