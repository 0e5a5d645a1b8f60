// moe_gmv_q8: the expert passes of a batched decode step (or a short chunk) with int8 x, grouped by expert:
// moe_matvec_q8's pass (same params, weights, int8 x and output; the ids through moe_tiles' table) where the columns that share an expert
// (the shared expert's columns, a routed expert that several tokens picked) load and decode each 32-weight
// chunk once for up to CT of them (lib/q8chunk.wgsl's chunk_dec, then dec_dot against each column's x).
// Every (row, column) equals moe_matvec_q8's with the same TEAM, bit for bit: dx_c · dec_dot summed over the
// chunks t, t + TEAM, ... into one f32 in its order, and the TEAM partials added from the row's index mod
// TEAM on, as its rotating start gives where its rows per workgroup are a multiple of TEAM (TEAM ≤ 16).
// Columns as moe_matvec's:
//   routed column (col < n_routed): e = ids[col],  xc = col / x_div
//   shared column (col >= n_routed): e = shared_e, xc = col - n_routed + shared_x0
//   GATE_UP: y[col][r] = silu(G_e[r]·x̂[xc]) · (U_e[r]·x̂[xc])
//   else:    y[col][r] = W_e[r]·x̂[xc]
// Tiles: moe_tiles.wgsl's table (the columns grouped by expert in tiles of up to CT columns); workgroup
// (w, y) takes tile y, or returns past the last.
// Bindings:
//   0 params   array<u32> ne=[11]: moe_matvec's words [k, n, row_bytes, expert_bytes, off_g, off_u, n_cols,
//              x_div, n_routed, shared_e, shared_x0]
//   1 weights  array<u32>        raw GGUF blocks of type TYPE (gate and up in this one binding)
//   2 weights2 array<vec2<u32>>  the same buffer (IQ4_XS: byte offsets of matrices multiples of 8)
//   3 xq       array<vec4<u32>>  x column xc at word xc·9K/32 (K % 128 == 0): quantize_q8's output for TYPE's
//              byte order (K/4 words of int8 quads, then K/32 f32 scales)
//   4 y        array<f32> ne=[N, n_cols] read_write
//   5 tiles    array<u32>: moe_tiles' table of the pass's ids and columns at the same CT
// Grid (ceil(N / WG_ROWS), a bound on the tiles: n_routed + ceil(shared columns / CT)); WG_ROWS = 256 / TEAM:
// a team of TEAM invocations owns one row of the tile's columns.
// Constants: TYPE (8, 12, 13, 14 or 23), TEAM (power of two, 1..16), CT (1..8): u32; GATE_UP: bool.
// Workgroup memory: 1024 (IQ4_XS table) + 8192 (partials) bytes.

@group(0) @binding(0) var<storage, read> params: array<u32>;
@group(0) @binding(1) var<storage, read> weights: array<u32>;
@group(0) @binding(2) var<storage, read> weights2: array<vec2<u32>>;
@group(0) @binding(3) var<storage, read> xq: array<vec4<u32>>;
@group(0) @binding(4) var<storage, read_write> y: array<f32>;
@group(0) @binding(5) var<storage, read> tiles: array<u32>;

const WG: u32 = 256u;
const COPIES: u32 = 1u;
const ROWS: u32 = 1u;
const WG_ROWS: u32 = WG / TEAM;

// Four columns' partials: [o · TEAM + t] gate (or the only matrix), [WG + o · TEAM + t] up.
var<workgroup> partial: array<vec4<f32>, 2u * WG>;
fn silu(v: f32) -> f32 {
  return v / (1.0 + exp(-v));
}

// Chunk c of the int8 x column whose words start at xq word xb (a multiple of 4); k = K.
fn x_chunk(xb: u32, k: u32, c: u32) -> XChunk {
  let q = xb >> 2u;
  let s = xb + k / 4u + c;
  return XChunk(xq[q + 2u * c], xq[q + 2u * c + 1u], bitcast<f32>(xq[s >> 2u][s & 3u]));
}

// The x column's first word of output column col.
fn x_base(col: u32, k: u32) -> u32 {
  let xc = select(col - params[8] + params[10], col / params[7], col < params[8]);
  return xc * (9u * k / 32u);
}

// One column's sums (gate, up) plus chunk c of the decoded gate (dg) and up (du) rows against its x.
fn col_acc(a: vec2<f32>, xb: u32, k: u32, c: u32, dg: Dec, du: Dec) -> vec2<f32> {
  let xk = x_chunk(xb, k, c);
  var r = a;
  r.x += xk.d * dec_dot(dg, xk.a, xk.b);
  if (GATE_UP) {
    r.y += xk.d * dec_dot(du, xk.a, xk.b);
  }
  return r;
}

// Sums of four columns: gate in g, up in u.
struct Acc4 {
  g: vec4<f32>,
  u: vec4<f32>,
}

// Columns j0..j0+3 (those below CT and live) of chunk c.
fn acc4(a: Acc4, xb: vec4<u32>, j0: u32, live: u32, k: u32, c: u32, dg: Dec, du: Dec) -> Acc4 {
  var r = a;
  var v = col_acc(vec2<f32>(r.g.x, r.u.x), xb.x, k, c, dg, du);
  r.g.x = v.x;
  r.u.x = v.y;
  if (j0 + 1u < CT && j0 + 1u < live) {
    v = col_acc(vec2<f32>(r.g.y, r.u.y), xb.y, k, c, dg, du);
    r.g.y = v.x;
    r.u.y = v.y;
  }
  if (j0 + 2u < CT && j0 + 2u < live) {
    v = col_acc(vec2<f32>(r.g.z, r.u.z), xb.z, k, c, dg, du);
    r.g.z = v.x;
    r.u.z = v.y;
  }
  if (j0 + 3u < CT && j0 + 3u < live) {
    v = col_acc(vec2<f32>(r.g.w, r.u.w), xb.w, k, c, dg, du);
    r.g.w = v.x;
    r.u.w = v.y;
  }
  return r;
}

// Adds the team partials of columns j0..j0+3 and stores their live rows below N (every invocation calls it:
// barriers). Row o of the workgroup adds its TEAM partials from o mod TEAM on (moe_matvec_q8's order).
fn reduce4(a: Acc4, cols: vec4<u32>, j0: u32, live: u32, row_base: u32, lid: u32) {
  let n = params[1];
  partial[lid] = a.g;
  partial[WG + lid] = a.u;
  workgroupBarrier();
  for (var o = lid; o < WG_ROWS; o += WG) {
    var s0 = vec4<f32>(0.0);
    var s1 = vec4<f32>(0.0);
    for (var q = 0u; q < TEAM; q++) {
      let j = (q + o) % TEAM;
      s0 += partial[o * TEAM + j];
      if (GATE_UP) {
        s1 += partial[WG + o * TEAM + j];
      }
    }
    let row = row_base + o;
    if (row < n) {
      for (var i = 0u; i < 4u; i++) {
        if (j0 + i < live) {
          var v = s0[i];
          if (GATE_UP) {
            v = silu(s0[i]) * s1[i];
          }
          y[cols[i] * n + row] = v;
        }
      }
    }
  }
  workgroupBarrier();
}

@compute @workgroup_size(256)
fn main(@builtin(local_invocation_index) lid: u32, @builtin(workgroup_id) wid: vec3<u32>) {
  q8dot_table(lid);
  // Tile y: [expert, live columns, CT columns] at word 1 + y·(2 + CT) (read-only storage: uniform).
  let y0 = wid.y;
  if (y0 >= tiles[0]) {
    return;
  }
  let tw = 1u + y0 * (2u + CT);
  let e = tiles[tw];
  let live = tiles[tw + 1u];
  let k = params[0];
  let n = params[1];
  let c0 = vec4<u32>(tiles[tw + 2u], tiles[tw + 2u + min(1u, CT - 1u)], tiles[tw + 2u + min(2u, CT - 1u)],
    tiles[tw + 2u + min(3u, CT - 1u)]);
  let c1 = vec4<u32>(tiles[tw + 2u + min(4u, CT - 1u)], tiles[tw + 2u + min(5u, CT - 1u)],
    tiles[tw + 2u + min(6u, CT - 1u)], tiles[tw + 2u + min(7u, CT - 1u)]);
  let xb0 = vec4<u32>(x_base(c0.x, k), x_base(c0.y, k), x_base(c0.z, k), x_base(c0.w, k));
  let xb1 = vec4<u32>(x_base(c1.x, k), x_base(c1.y, k), x_base(c1.z, k), x_base(c1.w, k));
  let t = lid % TEAM;
  let row_base = wid.x * WG_ROWS;
  // Rows past N read row N-1 (in bounds) and are never stored.
  let row = min(row_base + lid / TEAM, n - 1u) * params[2];
  let rbg = vec4<u32>(params[4] + e * params[3] + row);
  let rbu = vec4<u32>(params[5] + e * params[3] + row);
  let z = Acc4(vec4<f32>(0.0), vec4<f32>(0.0));
  var a0 = z;
  var a1 = z;
  for (var c = t; c < k / 32u; c += TEAM) {
    let lg = load_rows(rbg, c);
    var lu = lg;
    if (GATE_UP) {
      lu = load_rows(rbu, c);
    }
    let dg = chunk_dec(rbg.x, c, lg.r0);
    var du = dg;
    if (GATE_UP) {
      du = chunk_dec(rbu.x, c, lu.r0);
    }
    a0 = acc4(a0, xb0, 0u, live, k, c, dg, du);
    if (CT > 4u && live > 4u) {
      a1 = acc4(a1, xb1, 4u, live, k, c, dg, du);
    }
  }
  reduce4(a0, c0, 0u, live, row_base, lid);
  if (CT > 4u) {
    reduce4(a1, c1, 4u, live, row_base, lid);
  }
}
