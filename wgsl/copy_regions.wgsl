// copy_regions: copies some slots' regions of a state pool into the same places of another buffer of the pool's
// layout (engine/exec/_rewind.ts: rewind points of a batched decode step in one dispatch per state, at the
// memory's rate; copyBufferToBuffer measured about 8 µs per region on the H100).
//   dst[s·stride + w] = src[s·stride + w] for w < len and s = params[3 + j], j < params[2]
// Bindings: 0 params array<u32> [len (words), stride (words), n, slots...]; 1 src array<u32>; 2 dst array<u32>
// read_write (not src). Grid (ceil(len / (256·PER)), n): workgroup (x, j) copies words x·256·PER.. of slot j's
// region, each invocation PER words 256 apart (a warp's loads and stores are consecutive words).

@group(0) @binding(0) var<storage, read> params: array<u32>;
@group(0) @binding(1) var<storage, read> src: array<u32>;
@group(0) @binding(2) var<storage, read_write> dst: array<u32>;

const WG: u32 = 256u;

@compute @workgroup_size(256)
fn main(@builtin(local_invocation_index) lid: u32, @builtin(workgroup_id) wid: vec3<u32>) {
  let len = params[0];
  if (wid.y >= params[2]) {
    return;
  }
  let base = params[3u + wid.y] * params[1];
  for (var i = 0u; i < PER; i++) {
    let w = (wid.x * PER + i) * WG + lid;
    if (w < len) {
      dst[base + w] = src[base + w];
    }
  }
}
