// gdn_conv_ring: after a gdn_step dispatch of n > 1 tokens, store the last min(n, K_CONV-1) pre-conv inputs in
// the conv ring:  conv_ring[((pos0 + t) mod K_CONV)·CONV_CH + ch] = x_qkv[t·CONV_CH + ch]  for t >= n-(K_CONV-1).
// (gdn_step writes its ring slot itself when n == 1; running this after it then rewrites the same values.)
// It must be a separate dispatch: inside gdn_step other workgroups may still read the slots it overwrites.
//
// Entry point `main_tap` (spec gdn_conv_ring_tap, the twin's GDN_CONV_RING_TAP): the ring as it stands after the
// first m = min(cut, n) tokens of the dispatch, into `tap`, conv_ring left as it is:
//   tap[r] = conv_ring[r] for every ring word r, then for t in [max(0, m − (K_CONV−1)), m):
//   tap[((pos0 + t) mod K_CONV)·CONV_CH + ch] = x_qkv[t·CONV_CH + ch]
// (what conv_ring would hold after a dispatch of only those m tokens). cut == 0 (a chunked prefill with no
// snapshot inside: nothing reads the tap) writes nothing. Record it
// BEFORE the ordinary gdn_conv_ring dispatch of the same tokens, which updates conv_ring in place. A second
// entry point, not a constant: WebGPU's automatic layout keeps a binding that code under a false constant
// names, so one entry point would make every gdn_conv_ring dispatch bind a tap.
//
// Bindings (f32 unless noted; ne innermost first):
//   0 params    u32 ne=[2]: [pos0, n], the same words as the gdn_step dispatch before it; main_tap: ne=[3]
//               [pos0, n, cut], gdn_chunk's params with the cut (word 2 is not read by main)
//   1 x_qkv     ne=[CONV_CH, n]  the gdn_step input (token t at word t·T_COL with T_COL > 0, as gdn_step's)
//   2 conv_ring ne=[CONV_CH, K_CONV] read_write (main_tap: only read), layout as in gdn_step.wgsl
//   3 tap       ne=[CONV_CH, K_CONV] written, conv_ring's layout (main_tap only; main's layout has no binding 3)
// Constants: CONV_CH, K_CONV, T_COL: u32. Grid (ceil(CONV_CH / 64), 1, 1): an invocation owns one channel.

@group(0) @binding(0) var<storage, read> params: array<u32>;
@group(0) @binding(1) var<storage, read> x_qkv: array<f32>;
@group(0) @binding(2) var<storage, read_write> conv_ring: array<f32>;
@group(0) @binding(3) var<storage, read_write> tap: array<f32>;

// The pre-conv input of channel ch at dispatch token t.
fn x_at(t: u32, ch: u32) -> f32 {
  return x_qkv[t * select(CONV_CH, T_COL, T_COL > 0u) + ch];
}

// The ring word of channel ch for dispatch token t (positions from pos0).
fn ring_word(pos0: u32, t: u32, ch: u32) -> u32 {
  return ((pos0 + t) % K_CONV) * CONV_CH + ch;
}

// The first of the last K_CONV-1 of m tokens (0 when m < K_CONV).
fn first_kept(m: u32) -> u32 {
  if (m > K_CONV - 1u) {
    return m - (K_CONV - 1u);
  }
  return 0u;
}

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
  let ch = gid.x;
  if (ch >= CONV_CH) {
    return;
  }
  let pos0 = params[0];
  let n = params[1];
  for (var t = first_kept(n); t < n; t++) {
    conv_ring[ring_word(pos0, t, ch)] = x_at(t, ch);
  }
}

@compute @workgroup_size(64)
fn main_tap(@builtin(global_invocation_id) gid: vec3<u32>) {
  let ch = gid.x;
  if (ch >= CONV_CH) {
    return;
  }
  let pos0 = params[0];
  let m = min(params[2], params[1]);
  if (m == 0u) {
    return;
  }
  for (var r = 0u; r < K_CONV; r++) {
    tap[r * CONV_CH + ch] = conv_ring[r * CONV_CH + ch];
  }
  for (var t = first_kept(m); t < m; t++) {
    tap[ring_word(pos0, t, ch)] = x_at(t, ch);
  }
}
