// gdn_chunk_norm: the gated RMSNorm of spec qwen3next.md §8.7 in place, last of the chunked prefill's three
// dispatches:  y[t][h] ← RMSNorm(o_{t,h}, ssm_norm) ⊙ silu(z_{t,h})  with o_{t,h} = y[t][h] from gdn_chunk.
//
// Bindings (f32 unless noted; ne innermost first):
//   0 params  u32 ne=[2]: [pos0, n]
//   1 z       ne=[N_V·D_V, n]  gate input, token (or column) t at word t·Z_COL
//   2 norm_w  ne=[D_V]  ssm_norm.weight, shared by all heads
//   3 y       ne=[N_V·D_V, n] read_write: o in, ô out
//
// Constants: N_V, D_V, Z_COL (>= N_V·D_V; N_V·D_V for z's tokens back to back): u32; EPS: f32. The sum of squares goes through lib/rms.wgsl (WG = 64 partials).
// Grid (N_V, maxTokens, 1): workgroup (h, t) owns head h of token t (returns when t >= n); invocation lid the
// columns lid, lid + 64, ...

@group(0) @binding(0) var<storage, read> params: array<u32>;
@group(0) @binding(1) var<storage, read> z: array<f32>;
@group(0) @binding(2) var<storage, read> norm_w: array<f32>;
@group(0) @binding(3) var<storage, read_write> y: array<f32>;

const WG: u32 = 64u;
const NJ: u32 = (D_V + WG - 1u) / WG;

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
  let h = wid.x;
  let t = wid.y;
  if (t >= params[1]) {
    return;
  }
  let base = t * N_V * D_V + h * D_V;
  let zbase = t * Z_COL + h * D_V;
  var o: array<f32, NJ>;
  var partial = 0.0;
  for (var m = 0u; m < NJ; m++) {
    let j = lid + WG * m;
    if (j < D_V) {
      o[m] = y[base + j];
      partial += o[m] * o[m];
    }
  }
  let scale = rms_scale(lid, partial, D_V, EPS);
  for (var m = 0u; m < NJ; m++) {
    let j = lid + WG * m;
    if (j < D_V) {
      let zc = z[zbase + j];
      y[base + j] = o[m] * scale * norm_w[j] * (zc / (1.0 + exp(-zc)));
    }
  }
}
