// moe_tiles: the columns of an expert pass grouped by expert in tiles of up to CT columns, for moe_gmv_q8 (a
// batched step's or a short chunk's expert passes; gate·up and down share one table). The first column of
// each expert in `ids` leads its group, which lists its columns in ascending order and takes ceil(count / CT)
// tiles; groups take their tiles in the order of their leaders; the shared columns n_routed .. n_cols − 1
// follow in tiles of CT.
//   tiles[0] = the number of tiles T
//   tiles[1 + y·(2 + CT) ..] = [expert, live columns m (1..CT), column 0, .., column CT − 1] of tile y < T
//   (columns past m repeat column m − 1)
// Bindings:
//   0 params array<u32>: moe_matvec's words (n_cols at 6, n_routed at 8, shared_e at 9)
//   1 ids    array<u32> ne=[n_routed] (n_routed ≤ 256)
//   2 tiles  array<u32> read_write ne=[1 + (n_routed + ceil(shared columns / CT))·(2 + CT)]
// Grid (1, 1, 1), 256 invocations: invocation i holds column i's expert; each leader writes its group's tiles
// after the tiles of the leaders before it.
// Constants: CT (1..8): u32.

@group(0) @binding(0) var<storage, read> params: array<u32>;
@group(0) @binding(1) var<storage, read> ids: array<u32>;
@group(0) @binding(2) var<storage, read_write> tiles: array<u32>;

const WG: u32 = 256u;

// Each routed column's expert, and each leader's tiles (0 for the others).
var<workgroup> col_e: array<u32, WG>;
var<workgroup> col_tiles: array<u32, WG>;

// Writes tile y's head: expert e and its live columns.
fn put_tile(y: u32, e: u32, live: u32) {
  let tw = 1u + y * (2u + CT);
  tiles[tw] = e;
  tiles[tw + 1u] = live;
}

@compute @workgroup_size(256)
fn main(@builtin(local_invocation_index) lid: u32) {
  let n_routed = params[8];
  let n_cols = params[6];
  let mine = lid < n_routed;
  var e = 0xffffffffu;
  if (mine) {
    e = ids[lid];
  }
  col_e[lid] = e;
  workgroupBarrier();
  var lead = mine;
  for (var j = 0u; j < lid && lead; j++) {
    lead = col_e[j] != e;
  }
  var count = 0u;
  if (lead) {
    for (var j = lid; j < n_routed; j++) {
      count += u32(col_e[j] == e);
    }
  }
  col_tiles[lid] = (count + CT - 1u) / CT;
  workgroupBarrier();
  if (lead) {
    var y = 0u;
    for (var j = 0u; j < lid; j++) {
      y += col_tiles[j];
    }
    // The group's columns in order, CT per tile.
    var m = 0u;
    var last = lid;
    for (var j = lid; j < n_routed; j++) {
      if (col_e[j] == e) {
        let ty = y + m / CT;
        tiles[1u + ty * (2u + CT) + 2u + m % CT] = j;
        last = j;
        m++;
        if (m % CT == 0u || m == count) {
          put_tile(ty, e, (m - 1u) % CT + 1u);
          for (var i = m % CT; i != 0u && i < CT; i++) {
            tiles[1u + ty * (2u + CT) + 2u + i] = last;
          }
        }
      }
    }
  }
  if (lid == 0u) {
    var total = 0u;
    for (var j = 0u; j < n_routed; j++) {
      total += col_tiles[j];
    }
    let n_shared = n_cols - n_routed;
    let shared_tiles = (n_shared + CT - 1u) / CT;
    for (var s = 0u; s < shared_tiles; s++) {
      let m0 = CT * s;
      let live = min(CT, n_shared - m0);
      put_tile(total + s, params[9], live);
      for (var i = 0u; i < CT; i++) {
        tiles[1u + (total + s) * (2u + CT) + 2u + i] = n_routed + m0 + min(i, live - 1u);
      }
    }
    tiles[0] = total + shared_tiles;
  }
}
