// get_rows: y[t][k] = W[ids[ID_OFF + t]][k] for t < n_tokens: dequantizes whole rows (the token embedding) from
// packed GGUF blocks through the chunk interface of lib/quant.wgsl.
//
// Bindings:
//   0 params  array<u32> ne=[4]: [k (row length), n (rows of W), row_bytes, n_tokens]
//   1 ids     array<u32> ne=[ID_OFF + n_tokens]  row index per token; an id >= n writes zeros (the engine
//             validates ids on the CPU; this only keeps a corrupt id from reading out of bounds)
//   2 weights array<u32> W ne=[k, n] of type TYPE, raw GGUF block bytes
//   3 y       array<f32> ne=[k, n_tokens]
// Grid (n_tokens, 1, 1): workgroup t owns token t; invocation i takes chunks i, i + WG, ... of the row.
// Constants: TYPE: u32 (ggml id), ID_OFF: u32 (word offset of token 0's id in `ids`). Limits: k % 32 == 0.

@group(0) @binding(0) var<storage, read> params: array<u32>;
@group(0) @binding(1) var<storage, read> ids: array<u32>;
@group(0) @binding(2) var<storage, read> weights: array<u32>;
@group(0) @binding(3) var<storage, read_write> y: array<f32>;

const WG: u32 = 64u;

fn weight_word(i: u32) -> u32 {
  return weights[i];
}

@compute @workgroup_size(WG)
fn main(@builtin(local_invocation_index) lid: u32, @builtin(workgroup_id) wid: vec3<u32>) {
  if (QUANT_NEEDS_INIT) {
    for (var i = lid; i < 256u; i += WG) {
      quant_init(i);
    }
    workgroupBarrier();
  }
  let k = params[0];
  let n = params[1];
  let t = wid.x;
  if (t >= params[3]) {
    return;
  }
  let id = ids[ID_OFF + t];
  let valid = id < n;
  let rb = min(id, n - 1u) * params[2];
  let out = t * k;
  for (var c = lid; c < k / 32u; c += WG) {
    let s = quant_scales(rb, c);
    for (var j = 0u; j < 4u; j++) {
      let pos = quant_pos(c, j);
      let q = quant_q(rb, c, j);
      var lo = s.x * q[0] - vec4<f32>(s.z);
      var hi = s.y * q[1] - vec4<f32>(s.w);
      if (!valid) {
        lo = vec4<f32>(0.0);
        hi = vec4<f32>(0.0);
      }
      for (var e = 0u; e < 4u; e++) {
        y[out + pos.x + e] = lo[e];
        y[out + pos.y + e] = hi[e];
      }
    }
  }
}
