// moe_group: the routed columns of a prefill chunk grouped by expert, for the grouped matmul
// (moe_matmul.wgsl): workgroup e lists the columns col < n_routed with ids[col] == e, in ascending order, and the
// shared expert's group (e == n_expert, when params[3] is 1) lists columns n_routed + t for the n tokens.
//   groups[e] = count_e,  groups[n_groups + e·cap + i] = column i of group e  (n_groups = n_expert + shared)
// Bindings:
//   0 params array<u32> ne=[5]: [n_routed, n_tokens, n_expert, shared (0 or 1), cap]
//   1 ids    array<u32> ne=[n_routed]: the expert of each routed column (moe_route)
//   2 groups array<u32> ne=[n_groups·(1 + cap)]
// Grid (n_groups, 1, 1), 256 invocations: blocks of 256 columns, each rank within its block by a workgroup
// prefix sum (Hillis-Steele over the flags), so the order is the columns' own and the result deterministic.
// An id out of [0, n_expert) belongs to no group. A group longer than cap is cut to cap (ids of distinct
// experts per token keep every count ≤ n_tokens = cap).

@group(0) @binding(0) var<storage, read> params: array<u32>;
@group(0) @binding(1) var<storage, read> ids: array<u32>;
@group(0) @binding(2) var<storage, read_write> groups: array<u32>;

var<workgroup> scan: array<u32, 256>;

@compute @workgroup_size(256)
fn main(@builtin(local_invocation_index) lid: u32, @builtin(workgroup_id) wid: vec3<u32>) {
  let n_routed = params[0];
  let n_tokens = params[1];
  let n_expert = params[2];
  let cap = params[4];
  let n_groups = n_expert + params[3];
  let e = wid.x;
  let list = n_groups + e * cap;
  if (e == n_expert) {
    for (var t = lid; t < min(n_tokens, cap); t += 256u) {
      groups[list + t] = n_routed + t;
    }
    if (lid == 0u) {
      groups[e] = min(n_tokens, cap);
    }
    return;
  }
  var base = 0u;
  for (var c0 = 0u; c0 < n_routed; c0 += 256u) {
    let col = c0 + lid;
    let flag = u32(col < n_routed && ids[col] == e);
    scan[lid] = flag;
    workgroupBarrier();
    for (var d = 1u; d < 256u; d *= 2u) {
      let v = select(0u, scan[lid - d], lid >= d);
      workgroupBarrier();
      scan[lid] += v;
      workgroupBarrier();
    }
    // scan[lid] is the inclusive count of flags up to lid.
    let at = base + scan[lid] - flag;
    if (flag == 1u && at < cap) {
      groups[list + at] = col;
    }
    base += scan[255];
    workgroupBarrier();
  }
  if (lid == 0u) {
    groups[e] = min(base, cap);
  }
}
