// group_tiles: which tile of moe_group.wgsl's lists a workgroup of a grouped expert pass owns (moe_matmul,
// moe_gmv). Tiles are GROUP_TILE columns of one group; grid y runs over every group's tiles in group order (a
// bound: workgroups past the last tile get NO_TILE). Needs the including kernel's uniform `params` (fields
// n_groups, cap, n_routed, shared_x0, x_div), `groups` (counts, then each group's columns) and const
// GROUP_TILE: u32; 256 invocations per workgroup, up to 1024 groups.

const NO_TILE: u32 = 0xffffffffu;

var<workgroup> scan: array<u32, 256>;
var<workgroup> tile_group: u32;
var<workgroup> tile_m0: u32;

// Tiles of GROUP_TILE columns in group e (none past the last group).
fn group_tiles(e: u32) -> u32 {
  if (e >= params.n_groups) {
    return 0u;
  }
  return (min(groups[e], params.cap) + GROUP_TILE - 1u) / GROUP_TILE;
}

// The Y column of entry m of group e's list, and the x row it reads.
fn token_col(e: u32, m: u32) -> u32 {
  return groups[params.n_groups + e * params.cap + m];
}

fn x_row(col: u32) -> u32 {
  return select(col - params.n_routed + params.shared_x0, col / params.x_div, col < params.n_routed);
}

// Leaves tile y's group in tile_group (NO_TILE past the last tile) and its first column in tile_m0, for the
// kernel to read with workgroupUniformLoad. Invocation lid sums the tiles of groups 4·lid .. 4·lid + 3; an
// inclusive prefix sum over the invocations gives each range's first tile. Every invocation calls it.
fn find_tile(lid: u32, y: u32) {
  if (lid == 0u) {
    tile_group = NO_TILE;
  }
  var own = 0u;
  for (var i = 0u; i < 4u; i++) {
    own += group_tiles(4u * lid + i);
  }
  scan[lid] = own;
  workgroupBarrier();
  for (var d = 1u; d < 256u; d <<= 1u) {
    var v = scan[lid];
    if (lid >= d) {
      v += scan[lid - d];
    }
    workgroupBarrier();
    scan[lid] = v;
    workgroupBarrier();
  }
  var first = scan[lid] - own;
  for (var i = 0u; i < 4u; i++) {
    let tiles = group_tiles(4u * lid + i);
    if (y >= first && y < first + tiles) {
      tile_group = 4u * lid + i;
      tile_m0 = GROUP_TILE * (y - first);
    }
    first += tiles;
  }
}
