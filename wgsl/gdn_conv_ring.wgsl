// gdn_conv_ring: after a gdn_step dispatch of n > 1 tokens, store the last min(n, K_CONV-1) pre-conv inputs in
// the conv ring:  conv_ring[((pos0 + t) mod K_CONV)·CONV_CH + ch] = x_qkv[t·CONV_CH + ch]  for t >= n-(K_CONV-1).
// (gdn_step writes its ring slot itself when n == 1; running this after it then rewrites the same values.)
// It must be a separate dispatch: inside gdn_step other workgroups may still read the slots it overwrites.
//
// Bindings (f32 unless noted; ne innermost first):
//   0 params    u32 ne=[2]: [pos0, n], the same words as the gdn_step dispatch before it
//   1 x_qkv     ne=[CONV_CH, n]  the gdn_step input (token t at word t·T_COL with T_COL > 0, as gdn_step's)
//   2 conv_ring ne=[CONV_CH, K_CONV] read_write, layout as in gdn_step.wgsl
// Constants: CONV_CH, K_CONV, T_COL: u32. Grid (ceil(CONV_CH / 64), 1, 1): an invocation owns one channel.

@group(0) @binding(0) var<storage, read> params: array<u32>;
@group(0) @binding(1) var<storage, read> x_qkv: array<f32>;
@group(0) @binding(2) var<storage, read_write> conv_ring: array<f32>;

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
  let ch = gid.x;
  if (ch >= CONV_CH) {
    return;
  }
  let pos0 = params[0];
  let n = params[1];
  var t = 0u;
  if (n > K_CONV - 1u) {
    t = n - (K_CONV - 1u);
  }
  for (; t < n; t++) {
    conv_ring[((pos0 + t) % K_CONV) * CONV_CH + ch] = x_qkv[t * select(CONV_CH, T_COL, T_COL > 0u) + ch];
  }
}
