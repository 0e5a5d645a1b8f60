// moe_matvec: the expert mat-vecs of a MoE block, with the expert of each column read from a GPU id buffer
// (no CPU round trip between router and experts; spec qwen3next.md §10):
//   routed column (col < n_routed): e = ids[col],  xc = col / x_div
//   shared column (col >= n_routed): e = shared_e, xc = col - n_routed + shared_x0
//   (gate·up: shared_x0 = 0, the token; down: shared_x0 = n_routed, the shared column's own activations)
//   GATE_UP: y[col][r] = silu(Σ_k G_e[r][k]·x[xc][k]) · (Σ_k U_e[r][k]·x[xc][k])
//   else:    y[col][r] = Σ_k W_e[r][k]·x[xc][k]
// where matrix M_e of a 3-D expert tensor ne=[K, N, E] starts at byte off_M + e·expert_bytes. Gate and up
// live in ONE binding (the engine uploads them back to back), because the quant chunk interface reads one
// binding through `weight_word`. The shared expert rides along as extra columns when its matrices sit right
// after the routed experts' in the same binding (expert index shared_e = E), or runs alone with zero ids.
//
// ROUTE (gate·up of the routed experts): the router's top-k runs in the prologue of every workgroup
// (lib/route.wgsl, the same code as moe_route) for the column's token, instead of a dispatch of its own;
// workgroup (0, col) writes ids[col] and route_weights[col] for the down pass and the combine.
// Bindings:
//   0 params  array<u32> ne=[11]: [k, n, row_bytes, expert_bytes, off_g (bytes), off_u (bytes), n_cols, x_div,
//             n_routed, shared_e, shared_x0]
//   1 ids     array<u32> ne=[n_routed] (read_write: written with ROUTE, read otherwise)
//   2 weights array<u32> raw GGUF blocks of type TYPE
//   3 x       array<vec4<f32>> ne=[K, n_cols / x_div]
//   4 y       array<f32> ne=[N, n_cols]
//   5 logits  array<f32> ne=[N_EXPERT, tokens]  router logits (ROUTE; otherwise any buffer)
//   6 route_weights array<f32> ne=[n_routed] read_write (ROUTE; otherwise any unaliased buffer)
// Grid (ceil(ceil(N / WG_ROWS) / BLOCKS), n_cols): workgroup (w, col) of WG invocations owns BLOCKS row
// blocks of WG_ROWS = (WG / TEAM)·ROWS rows of column col (blocks w·BLOCKS .. w·BLOCKS + BLOCKS − 1, one after
// the other: the table, routing and column set-up are paid once per BLOCKS blocks). Every row's sum has the
// same order for any BLOCKS and UNROLL (given TEAM), so they change speed, not bits; so do ROWS and WG while
// (WG_ROWS·GROUPS) % GROUP_LEN == 0 (the reduction's rotation below is then a function of the row).
// A team of TEAM invocations owns ROWS rows; a row is K/8 units of 8 weights (lib/quant.wgsl) and invocation
// t of a team takes units t, t + TEAM, ... of all its rows (as matvec.wgsl: a warp reads consecutive weight
// words and neighbouring x quads, each x quad serves every row and matrix from registers). Partials are
// added in workgroup memory in two levels of 8 (or fewer).
// SHARED_T > 0 (= the shared columns, at most 8): workgroup column n_routed runs every shared column (grid
// n_routed + 1 columns), decoding each weight unit once for all the tokens' x. Each column's sums keep the
// routed path's order, but not its bits: which products a driver fuses into FMAs follows the code's shape,
// and lavapipe rounds this path differently (an explicit fma() did not pin it there either).
// Constants: TYPE (ggml id), WG (workgroup size: power of two, 32..256), TEAM (power of two <= WG), ROWS
//   (1..4), BLOCKS (>= 1), UNROLL (units per loop step: 2 or 4; their loads are in flight together), SHARED_T
//   (0..8): u32; GATE_UP, ROUTE: bool;
//   N_EXPERT, N_EXPERT_USED: u32 and W_SCALE: f32 (the routing's, lib/route.wgsl; placeholders without ROUTE).
// Workgroup memory: 8·WG·ROWS bytes + 2048 (IQ4 table): 10 KiB at WG 256, ROWS 4.
// Limits: K % 32 == 0, byte offsets multiples of 4.

@group(0) @binding(0) var<storage, read> params: array<u32>;
@group(0) @binding(1) var<storage, read_write> ids: array<u32>;
@group(0) @binding(2) var<storage, read> weights: array<u32>;
@group(0) @binding(3) var<storage, read> x: array<vec4<f32>>;
@group(0) @binding(4) var<storage, read_write> y: array<f32>;
@group(0) @binding(5) var<storage, read> logits: array<f32>;
@group(0) @binding(6) var<storage, read_write> route_weights: array<f32>;

fn route_logit(t: u32, e: u32) -> f32 {
  return logits[t * N_EXPERT + e];
}

const WG_ROWS: u32 = (WG / TEAM) * ROWS;
const MATS: u32 = select(1u, 2u, GATE_UP);

// First reduction level: each of the 2·WG_ROWS · GROUPS sums adds TEAM / GROUPS partials; the second adds GROUPS.
const GROUPS: u32 = select(1u, TEAM / 8u, TEAM >= 8u);
const GROUP_LEN: u32 = TEAM / GROUPS;

// partial[(m · WG_ROWS + local row) · TEAM + t]
var<workgroup> partial: array<f32, WG * ROWS * 2u>;

fn weight_word(i: u32) -> u32 {
  return weights[i];
}

fn silu(v: f32) -> f32 {
  return v / (1.0 + exp(-v));
}


// Adds unit u (8 weights) of each row of each matrix (row bases rbg, rbu) times the matching x quads to `a`.
fn unit_acc(u: u32, xb: u32, rbg: vec4<u32>, rbu: vec4<u32>, a: Acc) -> Acc {
  let c = u / 4u;
  let j = u % 4u;
  let pos = quant_pos(c, j);
  let xl = x[(xb + pos.x) >> 2u];
  let xh = x[(xb + pos.y) >> 2u];
  let sxl = dot(xl, vec4<f32>(1.0));
  let sxh = dot(xh, vec4<f32>(1.0));
  var r = a;
  r.g += rows_units(rbg, c, j, xl, xh, sxl, sxh);
  if (GATE_UP) {
    r.u += rows_units(rbu, c, j, xl, xh, sxl, sxh);
  }
  return r;
}

// unit_acc for every shared column at once: the unit is decoded once and applied to each token's x (token i's
// column at xb0 + i·k).
fn shared_unit_acc(u: u32, xb0: u32, k: u32, rbg: vec4<u32>, rbu: vec4<u32>, a: AccT) -> AccT {
  let c = u / 4u;
  let j = u % 4u;
  let pos = quant_pos(c, j);
  let dg = dec_rows(rbg, c, j);
  var du = dg;
  if (GATE_UP) {
    du = dec_rows(rbu, c, j);
  }
  var r = a;
  r.a0 = tok_acc(a.a0, xb0, pos, dg, du);
  if (SHARED_T > 1u) {
    r.a1 = tok_acc(a.a1, xb0 + k, pos, dg, du);
  }
  if (SHARED_T > 2u) {
    r.a2 = tok_acc(a.a2, xb0 + 2u * k, pos, dg, du);
  }
  if (SHARED_T > 3u) {
    r.a3 = tok_acc(a.a3, xb0 + 3u * k, pos, dg, du);
  }
  if (SHARED_T > 4u) {
    r.a4 = tok_acc(a.a4, xb0 + 4u * k, pos, dg, du);
  }
  if (SHARED_T > 5u) {
    r.a5 = tok_acc(a.a5, xb0 + 5u * k, pos, dg, du);
  }
  if (SHARED_T > 6u) {
    r.a6 = tok_acc(a.a6, xb0 + 6u * k, pos, dg, du);
  }
  if (SHARED_T > 7u) {
    r.a7 = tok_acc(a.a7, xb0 + 7u * k, pos, dg, du);
  }
  return r;
}

// Adds the workgroup's partials of acc and stores rows r0 .. r0 + WG_ROWS − 1 (those below n) of column col.
// Every invocation calls it (barriers): the callers' branches depend on the workgroup id and params only.
fn reduce_store(acc: Acc, col: u32, r0: u32, n: u32, lid: u32) {
  let team = lid / TEAM;
  let t = lid % TEAM;
  if (BLOCKS > 1u || SHARED_T > 1u) {
    // The previous block's or column's last reads of partial are done before it is overwritten.
    workgroupBarrier();
  }
  for (var r = 0u; r < ROWS; r++) {
    partial[(team * ROWS + r) * TEAM + t] = acc.g[r];
    partial[(WG_ROWS + team * ROWS + r) * TEAM + t] = acc.u[r];
  }
  workgroupBarrier();
  for (var i = lid; i < 2u * WG_ROWS * GROUPS; i += WG) {
    let base = i * GROUP_LEN;
    var s = 0.0;
    for (var q = 0u; q < GROUP_LEN; q++) {
      s += partial[base + ((q + i) % GROUP_LEN)];
    }
    partial[base] = s;
  }
  workgroupBarrier();
  for (var o = lid; o < WG_ROWS; o += WG) {
    let row = r0 + o;
    var s0 = 0.0;
    var s1 = 0.0;
    for (var g = 0u; g < GROUPS; g++) {
      s0 += partial[o * TEAM + g * GROUP_LEN];
      s1 += partial[(WG_ROWS + o) * TEAM + g * GROUP_LEN];
    }
    if (row < n) {
      var v = s0;
      if (GATE_UP) {
        v = silu(s0) * s1;
      }
      y[col * n + row] = v;
    }
  }
}

@compute @workgroup_size(WG)
fn main(@builtin(local_invocation_index) lid: u32, @builtin(workgroup_id) wid: vec3<u32>) {
  // The IQ4 codebook table first (256 entries): every invocation reaches this barrier (the column test below
  // is not uniform in WGSL's analysis, since it reads storage).
  if (QUANT_NEEDS_INIT) {
    for (var i = lid; i < 256u; i += WG) {
      quant_init(i);
    }
    workgroupBarrier();
  }
  let k = params[0];
  let n = params[1];
  let col = wid.y;
  let n_routed = params[8];
  if (ROUTE) {
    // The column's token: routed column col serves slot col % x_div of token col / x_div; a shared column
    // (no routing of its own) routes its token too, so that every invocation reaches the same barriers.
    route_token(select(col / params[7], col - n_routed, col >= n_routed), lid);
  }
  if (col >= params[6]) {
    return;
  }
  var e = params[9];
  var xc = col;
  if (col < n_routed) {
    if (ROUTE) {
      let slot = col % params[7];
      e = route_id[slot];
      if (wid.x == 0u) {
        ids[col] = e;
        route_weights[col] = route_w[slot];
      }
    } else {
      e = ids[col];
    }
    xc = col / params[7];
  } else {
    xc = col - n_routed + params[10];
  }
  let xb = xc * k;
  let team = lid / TEAM;
  let t = lid % TEAM;
  let n_units = k / 8u;
  let eb = e * params[3];
  // The blocks' loop bound is a constant, so every invocation reaches each barrier; a block past N clamps its
  // rows to N-1 (in bounds) and stores nothing.
  for (var blk = 0u; blk < BLOCKS; blk++) {
    let r0 = (wid.x * BLOCKS + blk) * WG_ROWS;
    let row0 = r0 + team * ROWS;
    // Rows past N read row N-1 (in bounds) and are never stored.
    let rows = min(vec4<u32>(row0) + vec4<u32>(0u, 1u, 2u, 3u), vec4<u32>(n - 1u)) * params[2];
    let rbg = params[4] + eb + rows;
    let rbu = params[5] + eb + rows;
    if (SHARED_T > 0u && col == n_routed) {
      // Every shared column in this workgroup: each unit decoded once for all tokens, added in the order of
      // the routed path below (units t, t + TEAM, ... one by one), then each column reduced as there.
      let z = Acc(vec4<f32>(0.0), vec4<f32>(0.0));
      var at = AccT(z, z, z, z, z, z, z, z);
      var u = t;
      for (; u + TEAM < n_units; u += 2u * TEAM) {
        at = shared_unit_acc(u, xb, k, rbg, rbu, at);
        at = shared_unit_acc(u + TEAM, xb, k, rbg, rbu, at);
      }
      for (; u < n_units; u += TEAM) {
        at = shared_unit_acc(u, xb, k, rbg, rbu, at);
      }
      reduce_store(at.a0, col, r0, n, lid);
      if (SHARED_T > 1u) {
        reduce_store(at.a1, col + 1u, r0, n, lid);
      }
      if (SHARED_T > 2u) {
        reduce_store(at.a2, col + 2u, r0, n, lid);
      }
      if (SHARED_T > 3u) {
        reduce_store(at.a3, col + 3u, r0, n, lid);
      }
      if (SHARED_T > 4u) {
        reduce_store(at.a4, col + 4u, r0, n, lid);
      }
      if (SHARED_T > 5u) {
        reduce_store(at.a5, col + 5u, r0, n, lid);
      }
      if (SHARED_T > 6u) {
        reduce_store(at.a6, col + 6u, r0, n, lid);
      }
      if (SHARED_T > 7u) {
        reduce_store(at.a7, col + 7u, r0, n, lid);
      }
      continue;
    }
    var acc = Acc(vec4<f32>(0.0), vec4<f32>(0.0));
    // UNROLL units per step: their loads are independent, so UNROLL times the bytes are in flight per
    // invocation. The units still add into acc one by one in ascending order.
    var u = t;
    if (UNROLL >= 4u) {
      for (; u + 3u * TEAM < n_units; u += 4u * TEAM) {
        acc = unit_acc(u, xb, rbg, rbu, acc);
        acc = unit_acc(u + TEAM, xb, rbg, rbu, acc);
        acc = unit_acc(u + 2u * TEAM, xb, rbg, rbu, acc);
        acc = unit_acc(u + 3u * TEAM, xb, rbg, rbu, acc);
      }
    }
    for (; u + TEAM < n_units; u += 2u * TEAM) {
      acc = unit_acc(u, xb, rbg, rbu, acc);
      acc = unit_acc(u + TEAM, xb, rbg, rbu, acc);
    }
    for (; u < n_units; u += TEAM) {
      acc = unit_acc(u, xb, rbg, rbu, acc);
    }
    // The column test above returned whole workgroups only (col is the workgroup's y), so every invocation
    // of a workgroup that got here reaches reduce_store's barriers.
    reduce_store(acc, col, r0, n, lid);
  }
}
