// gdn_chunk_norm: the gated RMSNorm of spec qwen3next.md §8.7 in place, last of the chunked prefill's three
// dispatches:  y[t][h] ← RMSNorm(o_{t,h}, ssm_norm) ⊙ silu(z_{t,h})  with o_{t,h} = y[t][h] from gdn_chunk.
//
// Bindings (f32 unless noted; ne innermost first):
//   0 params  u32 ne=[2] or more: [pos0, n, ...] (only n is read: the chunked prefill's cut word 2 does not
//             matter here, the norm works per token)
//   1 z       ne=[N_V·D_V, n]  gate input, token (or column) t at word t·Z_COL
//   2 norm_w  ne=[D_V]  ssm_norm.weight, shared by all heads
//   3 y       ne=[N_V·D_V, n] read_write: o in, ô out
//   4 xq      u32 read_write (QX): ô rounded to int8 per 32 elements, quantize_q8's output for K = N_V·D_V in
//             byte order LAYOUT, column t at word t·9K/32 (otherwise bind any buffer not bound elsewhere)
//
// Constants: N_V, D_V, Z_COL (>= N_V·D_V; N_V·D_V for z's tokens back to back), LAYOUT (0 or 1): u32; EPS: f32;
// QX: bool (D_V % 32 == 0). The sum of squares goes through lib/rms.wgsl (WG = 64 partials); QX rounds with
// lib/q8pack.wgsl as quantize_q8 does, from the same f32 values it writes to y, so xq has the bits a
// quantize_q8 of y would give (the int8 x of the output projection, without that dispatch).
// Grid (N_V, maxTokens, 1): workgroup (h, t) owns head h of token t (returns when t >= n); invocation lid the
// columns lid, lid + 64, ...

@group(0) @binding(0) var<storage, read> params: array<u32>;
@group(0) @binding(1) var<storage, read> z: array<f32>;
@group(0) @binding(2) var<storage, read> norm_w: array<f32>;
@group(0) @binding(3) var<storage, read_write> y: array<f32>;
@group(0) @binding(4) var<storage, read_write> xq: array<u32>;

const WG: u32 = 64u;
const NJ: u32 = (D_V + WG - 1u) / WG;
// QX: the head's ô as quads, for the rounding.
var<workgroup> yw: array<vec4<f32>, select(1u, D_V / 4u, QX)>;

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
      let v = o[m] * scale * norm_w[j] * (zc / (1.0 + exp(-zc)));
      y[base + j] = v;
      if (QX) {
        yw[j / 4u][j % 4u] = v;
      }
    }
  }
  if (QX) {
    workgroupBarrier();
    // One invocation per quad word of the head's D_V / 32 chunks (quantize_q8 QUADS' split).
    let k = N_V * D_V;
    let qo = t * (k / 4u + k / 32u);
    for (var i = lid; i < D_V / 4u; i += WG) {
      let c = i / 8u;
      let m = i % 8u;
      var amax = 0.0;
      for (var q = 0u; q < 8u; q++) {
        amax = max(amax, q8x_amax4(yw[8u * c + q]));
      }
      let dv = q8x_d(amax);
      let wq = q8x_word_quads(LAYOUT, m);
      let lo = yw[8u * c + wq.x];
      let hi = yw[8u * c + wq.y];
      let gc = h * (D_V / 32u) + c;
      xq[qo + 8u * gc + m] = q8x_word(LAYOUT, m, lo, hi, dv.y);
      if (m == 0u) {
        xq[qo + k / 4u + gc] = bitcast<u32>(dv.x);
      }
    }
  }
}
