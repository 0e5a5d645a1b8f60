// MoE routing (spec §10) for each token, a dispatch of its own (lib/route.wgsl says how). moe_matvec runs the
// same routing in its prologue (ROUTE) when the gate·up pass can take it.
// Bindings:
//   logits   f32 ne=[N_EXPERT, nTokens]       router logits (ffn_gate_inp output)
//   ids      u32 ne=[N_EXPERT_USED, nTokens]  selected experts, most probable first
//   weights  f32 ne=[N_EXPERT_USED, nTokens]  their routing weights
// Grid (nTokens): workgroup t owns token t.
// Constants: const N_EXPERT, N_EXPERT_USED, WG: u32 (WG power of two <= 256); const W_SCALE: f32 (1 when
// the model has no expert_weights_scale).
// Limits: N_EXPERT <= 4096 (16 KiB of workgroup memory); N_EXPERT_USED <= min(N_EXPERT, 256).

@group(0) @binding(0) var<storage, read> logits: array<f32>;
@group(0) @binding(1) var<storage, read_write> ids: array<u32>;
@group(0) @binding(2) var<storage, read_write> weights: array<f32>;

fn route_logit(t: u32, e: u32) -> f32 {
  return logits[t * N_EXPERT + e];
}

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3u, @builtin(local_invocation_index) lid: u32) {
  let t = wid.x;
  route_token(t, lid);
  for (var j = lid; j < N_EXPERT_USED; j += WG) {
    ids[t * N_EXPERT_USED + j] = route_id[j];
    weights[t * N_EXPERT_USED + j] = route_w[j];
  }
}
