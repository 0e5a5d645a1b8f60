// stream_read: reads src[off .. off + count) once (vec4<u32>) and folds it with XOR; the bandwidth ceiling that
// matvec is measured against (bench/matvec.ts). Nothing is written unless the fold equals params.magic, which
// random data practically never does, but the compiler cannot know that, so no load is dropped.
//
// Bindings:
//   params uniform Params (count, off in vec4 units; magic)
//   src    array<vec4<u32>>  the bytes to read
//   out    array<u32>  ne=[4]: written only on a magic match
// Invocation i of the grid reads vec4 i, i + S, i + 2S, ... (S = all invocations), four loads in flight per
// iteration. The grid is 1-D; 256 invocations per workgroup. No constants.

struct Params {
  count: u32,
  off: u32,
  magic: u32,
  pad: u32,
}

@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var<storage, read> src: array<vec4<u32>>;
@group(0) @binding(2) var<storage, read_write> out: array<u32>;

@compute @workgroup_size(256)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
  let stride = nwg.x * 256u;
  var acc = vec4<u32>(0u);
  var i = gid.x;
  for (; i + 3u * stride < params.count; i += 4u * stride) {
    let a = src[params.off + i];
    let b = src[params.off + i + stride];
    let c = src[params.off + i + 2u * stride];
    let d = src[params.off + i + 3u * stride];
    acc ^= a ^ b ^ c ^ d;
  }
  for (; i < params.count; i += stride) {
    acc ^= src[params.off + i];
  }
  let f = acc.x ^ acc.y ^ acc.z ^ acc.w;
  if (f == params.magic) {
    out[gid.x & 3u] = f;
  }
}
