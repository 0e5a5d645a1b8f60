// q8dot: the row loop of the int8-x mat-vecs matvec_q8 and matvec_q8_fused (see matvec_q8.wgsl for the value
// and the constants TYPE, TEAM, ROWS, ACC, RED, COPIES, GROUPS, PF); the chunk decode is lib/q8chunk.wgsl's.
// The including kernel declares `const WG: u32 = 256u`, the Params struct below as `params`, the weight
// bindings `weights` (array<u32>) and `weights2` (array<vec2<u32>>), `y` (array<f32>, read_write), and
// `fn x_chunk(c: u32) -> XChunk` (chunk c of the int8 x), and includes lib/q8chunk.wgsl.

struct Params {
  k: u32,
  n: u32,
  row_bytes: u32,
  w_off: u32,
  y_off: u32,
  x_off: u32,
  _pad1: u32,
  _pad2: u32,
}

const WG_ROWS: u32 = (WG / TEAM) * ROWS;
// RED 1: the length of the partial runs the first reduction step adds (1: none).
const RUN: u32 = select(1u, 8u, TEAM >= 8u);

var<workgroup> partial: array<f32, WG * ROWS>;

// RED 1: adds row r of team `team`'s partials (runs of RUN after the first step) and stores the sum.
fn finish(wg: u32, team: u32, r: u32) {
  var s = 0.0;
  for (var j = 0u; j < TEAM; j += RUN) {
    s += partial[r * WG + team * TEAM + j];
  }
  store(wg * WG_ROWS + team * ROWS + r, s);
}

// y[row] = s (ACC: y[row] += s) for rows inside N.
fn store(row: u32, s: f32) {
  if (row < params.n) {
    let at = params.y_off + row;
    if (ACC == 1u) {
      y[at] = y[at] + s;
    } else {
      y[at] = s;
    }
  }
}

// The GROUPS row groups of workgroup wg (every invocation calls it: barriers).
fn q8dot_groups(wg: u32, lid: u32) {
  // GROUPS row groups per workgroup, one after another (the table built once for all of them).
  for (var g = 0u; g < GROUPS; g++) {
    row_group(wg * GROUPS + g, lid);
    workgroupBarrier();
  }
}

// The WG_ROWS rows of row group `wg`: every invocation of the workgroup calls it (barriers).
fn row_group(wg: u32, lid: u32) {
  let team = lid / TEAM;
  let t = lid % TEAM;
  let row0 = wg * WG_ROWS + team * ROWS;
  // Rows past N read row N-1 (in bounds) and are never stored: no early return before the barrier.
  let rb = params.w_off +
    min(vec4<u32>(row0) + vec4<u32>(0u, 1u, 2u, 3u), vec4<u32>(params.n - 1u)) * params.row_bytes;
  let n_chunks = params.k / 32u;
  var a = vec4<f32>(0.0);
  // PF = 1: the weight loads of chunk c + TEAM are issued before chunk c's math (software pipelining: a lane
  // keeps the next step's bytes in flight while it computes).
  var next: Rows;
  if (PF == 1u && t < n_chunks) {
    next = load_rows(rb, t);
  }
  for (var c = t; c < n_chunks; c += TEAM) {
    let xc = x_chunk(c);
    let x0 = xc.a;
    let x1 = xc.b;
    let dx = xc.d;
    var l: Rows;
    if (PF == 1u) {
      l = next;
      if (c + TEAM < n_chunks) {
        next = load_rows(rb, c + TEAM);
      }
    } else {
      l = load_rows(rb, c);
    }
    a.x += dx * chunk_dot(rb.x, c, l.r0, x0, x1);
    if (ROWS >= 2u) {
      a.y += dx * chunk_dot(rb.y, c, l.r1, x0, x1);
    }
    if (ROWS >= 3u) {
      a.z += dx * chunk_dot(rb.z, c, l.r2, x0, x1);
    }
    if (ROWS >= 4u) {
      a.w += dx * chunk_dot(rb.w, c, l.r3, x0, x1);
    }
  }
  if (RED == 0u) {
    // One invocation per row adds its team's TEAM partials (row-major, each row's run read from a rotating
    // start: consecutive invocations hit different banks).
    for (var r = 0u; r < ROWS; r++) {
      partial[(team * ROWS + r) * TEAM + t] = a[r];
    }
    workgroupBarrier();
    for (var o = lid; o < WG_ROWS; o += WG) {
      var s = 0.0;
      for (var e = 0u; e < TEAM; e++) {
        s += partial[o * TEAM + ((e + o) % TEAM)];
      }
      store(wg * WG_ROWS + o, s);
    }
    return;
  }
  // RED 1: runs of 8 first, in parallel (lanes t % 8 == 0 of each team, each reading 8 consecutive words), so
  // that a row's final sum takes TEAM/8 dependent adds instead of TEAM.
  for (var r = 0u; r < ROWS; r++) {
    partial[r * WG + lid] = a[r];
  }
  workgroupBarrier();
  if (TEAM >= 8u) {
    if ((t & 7u) == 0u) {
      for (var r = 0u; r < ROWS; r++) {
        var s = 0.0;
        for (var e = 0u; e < 8u; e++) {
          s += partial[r * WG + lid + e];
        }
        partial[r * WG + lid] = s;
      }
    }
    workgroupBarrier();
  }
  // Row r of a team is finished by the team's lane r (TEAM >= ROWS), else by one invocation per row.
  if (TEAM >= ROWS) {
    if (t < ROWS) {
      finish(wg, team, t);
    }
  } else {
    for (var o = lid; o < WG_ROWS; o += WG) {
      finish(wg, o / ROWS, o % ROWS);
    }
  }
}
