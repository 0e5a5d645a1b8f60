// Residual add, optionally sigmoid-gated per token (spec §6, §10 shared expert):
//   acc[t][i] += x[t][i]                      (GATED = false)
//   acc[t][i] += sigmoid(gate[t]) * x[t][i]   (GATED = true; gate is one logit per token, e.g. the
//                                              shared-expert gate ffn_gate_inp_shexp · m)
// Bindings:
//   acc   f32 ne=[N, nTokens]  read and written in place (the residual stream h)
//   x     f32 ne=[N, nTokens]
//   gate  f32 ne=[nTokens]     read only when GATED (bind x again otherwise)
// Grid (ceil(N / WG), nTokens): invocation i of workgroup (b, t) owns element b * WG + i of row t.
// Constants: const N, WG: u32; const GATED: bool.
@group(0) @binding(0) var<storage, read_write> acc: array<f32>;
@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<storage, read> gate: array<f32>;

@compute @workgroup_size(WG)
fn main(@builtin(global_invocation_id) gid: vec3u) {
  let i = gid.x;
  let t = gid.y;
  if (i >= N) {
    return;
  }
  var s = 1.0;
  if (GATED) {
    s = 1.0 / (1.0 + exp(-gate[t]));
  }
  acc[t * N + i] += s * x[t * N + i];
}
