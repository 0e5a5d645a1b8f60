// moe_gmv: the expert passes of a thin prefill chunk (a few tokens per expert) as grouped mat-vecs over
// moe_group.wgsl's lists: the same pass as moe_matmul.wgsl (same params, bindings and output), but each
// workgroup takes CT (1..8) columns of one group and decodes each weight unit once for all of them, keeping
// the columns' sums in registers (the mat-vec inner loop of moe_matvec.wgsl's shared columns). moe_matmul
// decodes its weights into workgroup tiles of 16+ tokens: with 8 tokens per expert (a 256-token chunk of the
// 35B-A3B) most of each tile is empty, and the per-column mat-vecs decode every unit once per column.
//   groups[e] = count_e,  groups[n_groups + e·cap + i] = column i of group e (ascending)
// Column col reads x row col / x_div for col < n_routed, else col − n_routed + shared_x0, and writes Y at
// col·y_stride + row; GATE_UP: Y = silu(gate·x)·(up·x). Expert e's matrix starts at byte w_off +
// e·expert_bytes (up: w_off_up + e·expert_bytes); row r at + r·row_bytes, raw GGUF blocks (lib/quant.wgsl).
//
// Grid (ceil(N / WG_ROWS), a bound on Σ_e ceil(count_e / CT)): workgroup (w, y) finds its group e and first
// column m0 from a prefix sum over the groups' CT-column tiles (as moe_matmul); tiles past the last return.
// A team of TEAM invocations owns ROWS rows (WG_ROWS = (256 / TEAM)·ROWS per workgroup); invocation t of a team
// takes units t, t + TEAM, ... of its rows (8 weights each), decodes each once and adds it times every live
// column's x quads. The TEAM partials of each (row, column) are added in workgroup memory, in lane order.
// Constants: const TYPE: u32 (ggml id); const GATE_UP: bool; const TEAM: u32 (power of two, 4..64); const ROWS:
// u32 (1..4); const CT: u32 (1..8, columns per tile).
// Limits: K % 32 == 0; at most 1024 groups. Workgroup memory 8·WG_ROWS·TEAM + 1032 bytes (+ 2 KiB IQ4 table).

struct Params {
  k: u32,
  n: u32,
  row_bytes: u32,
  w_off: u32,
  w_off_up: u32,
  expert_bytes: u32,
  x_stride: u32,
  y_stride: u32,
  cap: u32,
  x_div: u32,
  n_groups: u32,
  n_routed: u32,
  shared_x0: u32,
  pad0: u32,
  pad1: u32,
  pad2: u32,
}

@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var<storage, read> weights: array<u32>;
@group(0) @binding(2) var<storage, read> x: array<vec4<f32>>;
@group(0) @binding(3) var<storage, read_write> y: array<f32>;
@group(0) @binding(4) var<storage, read> groups: array<u32>;

const WG: u32 = 256u;
const WG_ROWS: u32 = (WG / TEAM) * ROWS;

// partial[(m · WG_ROWS + local row) · TEAM + t], m = 0 gate (or the only matrix), 1 up.
var<workgroup> partial: array<f32, 2u * WG_ROWS * TEAM>;

const GROUP_TILE: u32 = CT;

fn weight_word(i: u32) -> u32 {
  return weights[i];
}

fn silu(v: f32) -> f32 {
  return v / (1.0 + exp(-v));
}

// Unit u of the invocation's rows, decoded once and added times each of the `live` columns' x (element bases
// xb0 for columns 0-3, xb1 for 4-7).
fn unit_acc(u: u32, xb0: vec4<u32>, xb1: vec4<u32>, live: u32, rbg: vec4<u32>, rbu: vec4<u32>, a: AccT) -> AccT {
  let c = u / 4u;
  let j = u % 4u;
  let pos = quant_pos(c, j);
  let dg = dec_rows(rbg, c, j);
  var du = dg;
  if (GATE_UP) {
    du = dec_rows(rbu, c, j);
  }
  var r = a;
  r.a0 = tok_acc(a.a0, xb0.x, pos, dg, du);
  if (CT > 1u && live > 1u) {
    r.a1 = tok_acc(a.a1, xb0.y, pos, dg, du);
  }
  if (CT > 2u && live > 2u) {
    r.a2 = tok_acc(a.a2, xb0.z, pos, dg, du);
  }
  if (CT > 3u && live > 3u) {
    r.a3 = tok_acc(a.a3, xb0.w, pos, dg, du);
  }
  if (CT > 4u && live > 4u) {
    r.a4 = tok_acc(a.a4, xb1.x, pos, dg, du);
  }
  if (CT > 5u && live > 5u) {
    r.a5 = tok_acc(a.a5, xb1.y, pos, dg, du);
  }
  if (CT > 6u && live > 6u) {
    r.a6 = tok_acc(a.a6, xb1.z, pos, dg, du);
  }
  if (CT > 7u && live > 7u) {
    r.a7 = tok_acc(a.a7, xb1.w, pos, dg, du);
  }
  return r;
}

// Adds the teams' partials of one column and stores rows r0 .. r0 + WG_ROWS − 1 (below N) of Y column col
// when `store`. Every invocation calls it (barriers).
fn reduce_store(acc: Acc, col: u32, store: bool, r0: u32, lid: u32) {
  let team = lid / TEAM;
  let t = lid % TEAM;
  // The previous column's reads of partial are done before it is overwritten.
  workgroupBarrier();
  for (var r = 0u; r < ROWS; r++) {
    partial[(team * ROWS + r) * TEAM + t] = acc.g[r];
    partial[(WG_ROWS + team * ROWS + r) * TEAM + t] = acc.u[r];
  }
  workgroupBarrier();
  for (var o = lid; o < WG_ROWS; o += WG) {
    var s0 = 0.0;
    var s1 = 0.0;
    for (var q = 0u; q < TEAM; q++) {
      s0 += partial[o * TEAM + q];
      s1 += partial[(WG_ROWS + o) * TEAM + q];
    }
    let row = r0 + o;
    if (store && row < params.n) {
      var v = s0;
      if (GATE_UP) {
        v = silu(s0) * s1;
      }
      y[col * params.y_stride + row] = v;
    }
  }
}

@compute @workgroup_size(256)
fn main(@builtin(local_invocation_index) lid: u32, @builtin(workgroup_id) wid: vec3<u32>) {
  // This workgroup's tile: the wid.y-th CT-column tile over the groups in order (lib/group_tiles.wgsl).
  find_tile(lid, wid.y);
  let e = workgroupUniformLoad(&tile_group);
  if (e == NO_TILE) {
    return;
  }
  let m0 = workgroupUniformLoad(&tile_m0);
  let count = min(groups[e], params.cap);
  let live = min(CT, count - m0);
  if (QUANT_NEEDS_INIT) {
    quant_init(lid);
    workgroupBarrier();
  }
  // The tile's columns (a column past the group's last reads its last one's x, and is never stored).
  var cols0 = vec4<u32>(0u);
  var cols1 = vec4<u32>(0u);
  for (var i = 0u; i < 4u; i++) {
    cols0[i] = token_col(e, min(m0 + i, count - 1u));
    cols1[i] = token_col(e, min(m0 + 4u + i, count - 1u));
  }
  let xs = params.x_stride;
  let xb0 = vec4<u32>(x_row(cols0.x), x_row(cols0.y), x_row(cols0.z), x_row(cols0.w)) * xs;
  let xb1 = vec4<u32>(x_row(cols1.x), x_row(cols1.y), x_row(cols1.z), x_row(cols1.w)) * xs;

  let team = lid / TEAM;
  let t = lid % TEAM;
  let r0 = wid.x * WG_ROWS;
  let row0 = r0 + team * ROWS;
  // Rows past N read row N-1 (in bounds) and are never stored.
  let rows = min(vec4<u32>(row0) + vec4<u32>(0u, 1u, 2u, 3u), vec4<u32>(params.n - 1u)) * params.row_bytes;
  let eb = e * params.expert_bytes;
  let rbg = params.w_off + eb + rows;
  let rbu = params.w_off_up + eb + rows;
  let n_units = params.k / 8u;
  let z = Acc(vec4<f32>(0.0), vec4<f32>(0.0));
  var at = AccT(z, z, z, z, z, z, z, z);
  var u = t;
  for (; u + TEAM < n_units; u += 2u * TEAM) {
    at = unit_acc(u, xb0, xb1, live, rbg, rbu, at);
    at = unit_acc(u + TEAM, xb0, xb1, live, rbg, rbu, at);
  }
  for (; u < n_units; u += TEAM) {
    at = unit_acc(u, xb0, xb1, live, rbg, rbu, at);
  }
  reduce_store(at.a0, cols0.x, true, r0, lid);
  if (CT > 1u) {
    reduce_store(at.a1, cols0.y, live > 1u, r0, lid);
  }
  if (CT > 2u) {
    reduce_store(at.a2, cols0.z, live > 2u, r0, lid);
  }
  if (CT > 3u) {
    reduce_store(at.a3, cols0.w, live > 3u, r0, lid);
  }
  if (CT > 4u) {
    reduce_store(at.a4, cols1.x, live > 4u, r0, lid);
  }
  if (CT > 5u) {
    reduce_store(at.a5, cols1.y, live > 5u, r0, lid);
  }
  if (CT > 6u) {
    reduce_store(at.a6, cols1.z, live > 6u, r0, lid);
  }
  if (CT > 7u) {
    reduce_store(at.a7, cols1.w, live > 7u, r0, lid);
  }
}
