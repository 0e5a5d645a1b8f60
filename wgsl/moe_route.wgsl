// MoE routing (spec §10) for each token, a dispatch of its own (lib/route.wgsl says how). moe_matvec runs the
// same routing in its prologue (ROUTE) when the gate·up pass can take it.
// Bindings:
//   logits   f32 ne=[LOGITS_COL, nTokens]     router logits (ffn_gate_inp output): token t's at t·LOGITS_COL;
//            read_write: NORM scales the rows past N_EXPERT (the shared expert's gate logit) in place
//   ids      u32 ne=[N_EXPERT_USED, nTokens]  selected experts, most probable first
//   weights  f32 ne=[N_EXPERT_USED, nTokens]  their routing weights
//   x        f32 ne=[32·KC, nTokens]  the experts' input (XQ; otherwise any buffer of ≥ 16 bytes)
//   xq       u32 read_write: token t's x rounded to int8 at word t·9·KC in quantize_q8's format and byte order
//            LAYOUT (lib/q8pack.wgsl, the same bits), the gate·up pass's int8 x (XQ; otherwise any buffer not
//            bound elsewhere)
//   nw       f32 ne=[32·KC]  the RMSNorm weight of the experts' input (NORM; otherwise any buffer of ≥ 16 bytes)
// NORM (with XQ): x is the RMSNorm's input h, not its output, and the logits are the router's W·(h ⊙ nw)
// (matvec NORM 2): the kernel sums h² (each invocation over its quads i = lid, lid + WG, ..., then
// lib/rms.wgsl), scales the logits by the norm's scale s before ranking them and those past N_EXPERT in
// place, and rounds the normed row h·s·nw for the experts. So the post-attention norm costs no dispatch of
// its own in any batch (engine/blocks/moe.ts says why and when).
// Grid (nTokens): workgroup t owns token t.
// Constants: const N_EXPERT, N_EXPERT_USED, WG: u32 (WG power of two <= 256); const W_SCALE: f32 (1 when
// the model has no expert_weights_scale); const XQ: bool, const KC, LAYOUT: u32 (XQ: the chunks of x and the
// byte order of the experts' weight type; 1 and 0 otherwise); const NORM: bool, const EPS: f32 (the norm's
// epsilon; 0 without NORM); const LOGITS_COL: u32 (>= N_EXPERT: the logits'
// stride per token; N_EXPERT + 1 where the router's mat-vec also wrote the shared expert's gate logit).
// Limits: N_EXPERT <= 4096; N_EXPERT_USED <= min(N_EXPERT, 256); NORM needs XQ. Workgroup memory:
// 4·N_EXPERT + 8·N_EXPERT_USED + 128·KC (+ 4·WG with NORM) bytes.

@group(0) @binding(0) var<storage, read_write> logits: array<f32>;
@group(0) @binding(1) var<storage, read_write> ids: array<u32>;
@group(0) @binding(2) var<storage, read_write> weights: array<f32>;
@group(0) @binding(3) var<storage, read> x: array<vec4<f32>>;
@group(0) @binding(4) var<storage, read_write> xq: array<u32>;
@group(0) @binding(5) var<storage, read> nw: array<vec4<f32>>;

// NORM: the RMSNorm scale of the workgroup's token, the same in every invocation.
var<private> rscale: f32;

fn route_logit(t: u32, e: u32) -> f32 {
  if (NORM) {
    return logits[t * LOGITS_COL + e] * rscale;
  }
  return logits[t * LOGITS_COL + e];
}

// XQ: token t's x, loaded before the routing (its loads in flight with the logits'; route_token's first
// barrier publishes it).
var<workgroup> xs: array<vec4<f32>, 8u * KC>;

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3u, @builtin(local_invocation_index) lid: u32) {
  let t = wid.x;
  if (XQ) {
    for (var i = lid; i < 8u * KC; i += WG) {
      xs[i] = x[t * 8u * KC + i];
    }
  }
  if (NORM) {
    // Each invocation reads back only the quads it stored: no barrier before the sum.
    var ss = 0.0;
    for (var i = lid; i < 8u * KC; i += WG) {
      let v = xs[i];
      ss += dot(v, v);
    }
    rscale = rms_scale(lid, ss, 32u * KC, EPS);
    for (var i = lid; i < 8u * KC; i += WG) {
      xs[i] = xs[i] * rscale * nw[i];
    }
    for (var e = N_EXPERT + lid; e < LOGITS_COL; e += WG) {
      logits[t * LOGITS_COL + e] *= rscale;
    }
  }
  route_token(t, lid);
  for (var j = lid; j < N_EXPERT_USED; j += WG) {
    ids[t * N_EXPERT_USED + j] = route_id[j];
    weights[t * N_EXPERT_USED + j] = route_w[j];
  }
  if (XQ) {
    // One invocation per quad word of the int8 x; each computes its chunk's scale (the same bits).
    let o = t * 9u * KC;
    for (var i = lid; i < 8u * KC; i += WG) {
      let c = i / 8u;
      let m = i % 8u;
      var amax = 0.0;
      for (var j = 0u; j < 8u; j++) {
        amax = max(amax, q8x_amax4(xs[8u * c + j]));
      }
      let dv = q8x_d(amax);
      let wq = q8x_word_quads(LAYOUT, m);
      let lo = xs[8u * c + wq.x];
      let hi = xs[8u * c + wq.y];
      xq[o + 8u * c + m] = q8x_word(LAYOUT, m, lo, hi, dv.y);
      if (m == 0u) {
        xq[o + 8u * KC + c] = bitcast<u32>(dv.x);
      }
    }
  }
}
