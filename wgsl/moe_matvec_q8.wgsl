// moe_matvec_q8: moe_matvec (the expert mat-vecs of a MoE block, the expert of each column read from a GPU id
// buffer) with int8 x and integer dot products: matvec_q8's arithmetic (lib/q8chunk.wgsl) for Q8_0, Q4_K, Q5_K, Q6_K or IQ4_XS
// experts. Columns as moe_matvec's:
//   routed column (col < n_routed): e = ids[col],  xc = col / x_div
//   shared column (col >= n_routed): e = shared_e, xc = col - n_routed + shared_x0
//   GATE_UP: y[col][r] = silu(G_e[r]·x̂[xc]) · (U_e[r]·x̂[xc])
//   else:    y[col][r] = W_e[r]·x̂[xc]
// where x̂ is the int8 x dequantized (d·q per element) and each dot product is Σ_c (dw_c·dx_c)·Σ_i w_i·q_i in
// f32, as matvec_q8. QOUT: the workgroup also rounds its rows of y to int8 per 32 rows (lib/q8pack.wgsl, the
// bits quantize_q8 would give, in the byte order OUT_LAYOUT) into yq: the int8 x of the down pass, without a
// quantize dispatch between the passes. XIN: x is f32 instead (xq holds its bits, column xc at quad xc·K/4),
// and every workgroup rounds its column to int8 in its prologue (lib/q8pack.wgsl, quantize_q8's bits; one
// invocation per quad word) into workgroup memory; workgroups (0, col) also write it to yq (quantize_q8's
// format at word xc·9K/32) for the engine's int8 log and the tests.
// Bindings:
//   0 params   array<u32> ne=[11]: moe_matvec's words [k, n, row_bytes, expert_bytes, off_g, off_u, n_cols,
//              x_div, n_routed, shared_e, shared_x0]
//   1 ids      array<u32> ne=[n_routed]
//   2 weights  array<u32>        raw GGUF blocks of type TYPE (gate and up in this one binding)
//   3 weights2 array<vec2<u32>>  the same buffer (IQ4_XS: byte offsets of matrices multiples of 8)
//   4 xq       array<vec4<u32>>  x column xc at word xc·S, S = 9K/32 (K % 128 == 0): quantize_q8's output
//              for TYPE's byte order (K/4 words of int8 quads, then K/32 f32 scales)
//   5 y        array<f32> ne=[N, n_cols] read_write
//   6 yq       array<u32> read_write: column col of y as int8 at word col·9N/32, quantize_q8's format in byte
//              order OUT_LAYOUT (QOUT; otherwise bind any buffer not bound elsewhere)
// Grid (ceil(N / WG_ROWS), n_cols): workgroup (w, col) owns WG_ROWS = (256 / TEAM)·ROWS rows of column col; a
// team of TEAM invocations owns ROWS rows and walks chunks t, t + TEAM, ... (a whole 32-weight chunk per step,
// gate's and up's loads issued before their math); one invocation per row adds its team's TEAM partials,
// starting at its row in the workgroup mod TEAM: where TEAM <= 16 (the defaults) that is the row mod TEAM
// whatever the ROWS, so ROWS gives the same bits; above 16 it does not.
// Constants: TYPE (8, 12, 13, 14 or 23), TEAM (power of two <= 256), ROWS (1..4), OUT_LAYOUT (0 or 1), KC (XIN: K/32, else
//   1): u32; GATE_UP, QOUT, XIN: bool (QOUT needs WG_ROWS % 32 == 0 and N % 32 == 0; not both QOUT and XIN).
// Workgroup memory: 1024 (IQ4_XS table) + 1024·ROWS·(1 or 2) + 4·WG_ROWS (QOUT) + 36·KC (XIN) bytes.

@group(0) @binding(0) var<storage, read> params: array<u32>;
@group(0) @binding(1) var<storage, read> ids: array<u32>;
@group(0) @binding(2) var<storage, read> weights: array<u32>;
@group(0) @binding(3) var<storage, read> weights2: array<vec2<u32>>;
@group(0) @binding(4) var<storage, read> xq: array<vec4<u32>>;
@group(0) @binding(5) var<storage, read_write> y: array<f32>;
@group(0) @binding(6) var<storage, read_write> yq: array<u32>;

const WG: u32 = 256u;
const COPIES: u32 = 1u;
const LAYOUT: u32 = OUT_LAYOUT;
const WG_ROWS: u32 = (WG / TEAM) * ROWS;
const MATS: u32 = select(1u, 2u, GATE_UP);
// XIN: the column's int8 x (quad words in TYPE's byte order, and scales), rounded in the prologue.
const X_LAYOUT: u32 = select(0u, 1u, TYPE == 23u);
var<workgroup> xw: array<vec4<u32>, select(1u, 2u * KC, XIN)>;
var<workgroup> sw: array<f32, select(1u, KC, XIN)>;

// partial[(m · WG_ROWS + local row) · TEAM + t]
var<workgroup> partial: array<f32, WG * ROWS * MATS>;
// QOUT: the workgroup's rows of y, four per quad.
var<workgroup> yv: array<vec4<f32>, select(1u, WG_ROWS / 4u, QOUT)>;

fn silu(v: f32) -> f32 {
  return v / (1.0 + exp(-v));
}

// Chunk c of the int8 x column whose words start at xq word xb (a multiple of 4; XIN: workgroup memory); k = K.
fn x_chunk(xb: u32, k: u32, c: u32) -> XChunk {
  if (XIN) {
    return XChunk(xw[2u * c], xw[2u * c + 1u], sw[c]);
  }
  let q = xb >> 2u;
  let s = xb + k / 4u + c;
  return XChunk(xq[q + 2u * c], xq[q + 2u * c + 1u], bitcast<f32>(xq[s >> 2u][s & 3u]));
}

// XIN: rounds f32 x column xc (quads from xq quad xc·K/4, as bits) to int8 into xw and sw, one invocation per
// quad word (each computes its chunk's scale: the same bits); workgroup (0, col) also writes it to yq at word
// xc·9K/32 in quantize_q8's format. Every invocation calls it (barrier).
fn round_x(lid: u32, xc: u32, k: u32, log: bool) {
  let xb = xc * (k / 4u);
  for (var i = lid; i < 8u * KC; i += WG) {
    let c = i / 8u;
    let m = i % 8u;
    var amax = 0.0;
    for (var j = 0u; j < 8u; j++) {
      amax = max(amax, q8x_amax4(bitcast<vec4<f32>>(xq[xb + 8u * c + j])));
    }
    let dv = q8x_d(amax);
    let wq = q8x_word_quads(X_LAYOUT, m);
    let lo = bitcast<vec4<f32>>(xq[xb + 8u * c + wq.x]);
    let hi = bitcast<vec4<f32>>(xq[xb + 8u * c + wq.y]);
    let w = q8x_word(X_LAYOUT, m, lo, hi, dv.y);
    xw[2u * c + m / 4u][m % 4u] = w;
    if (m == 0u) {
      sw[c] = dv.x;
    }
    if (log) {
      let o = xc * (9u * k / 32u);
      yq[o + 8u * c + m] = w;
      if (m == 0u) {
        yq[o + k / 4u + c] = bitcast<u32>(dv.x);
      }
    }
  }
  workgroupBarrier();
}

// The chunk dots of the ROWS rows at byte bases rb (rows past ROWS: 0).
fn rows_dot(rb: vec4<u32>, c: u32, l: Rows, xk: XChunk) -> vec4<f32> {
  var r = vec4<f32>(0.0);
  r.x = chunk_dot(rb.x, c, l.r0, xk.a, xk.b);
  if (ROWS >= 2u) {
    r.y = chunk_dot(rb.y, c, l.r1, xk.a, xk.b);
  }
  if (ROWS >= 3u) {
    r.z = chunk_dot(rb.z, c, l.r2, xk.a, xk.b);
  }
  if (ROWS >= 4u) {
    r.w = chunk_dot(rb.w, c, l.r3, xk.a, xk.b);
  }
  return r;
}

@compute @workgroup_size(256)
fn main(@builtin(local_invocation_index) lid: u32, @builtin(workgroup_id) wid: vec3<u32>) {
  q8dot_table(lid);
  let k = params[0];
  let n = params[1];
  let col = wid.y;
  let n_routed = params[8];
  // Whole workgroups only (col is the workgroup's y; params is read-only storage: uniform).
  if (col >= params[6]) {
    return;
  }
  var e = params[9];
  var xc = col - n_routed + params[10];
  if (col < n_routed) {
    e = ids[col];
    xc = col / params[7];
  }
  if (XIN) {
    round_x(lid, xc, k, wid.x == 0u);
  }
  let team = lid / TEAM;
  let t = lid % TEAM;
  let row0 = wid.x * WG_ROWS + team * ROWS;
  // Rows past N read row N-1 (in bounds) and are never stored.
  let rows = min(vec4<u32>(row0) + vec4<u32>(0u, 1u, 2u, 3u), vec4<u32>(n - 1u)) * params[2];
  let rbg = params[4] + e * params[3] + rows;
  let rbu = params[5] + e * params[3] + rows;
  let xb = xc * (9u * k / 32u);
  var ag = vec4<f32>(0.0);
  var au = vec4<f32>(0.0);
  for (var c = t; c < k / 32u; c += TEAM) {
    let xk = x_chunk(xb, k, c);
    let lg = load_rows(rbg, c);
    if (GATE_UP) {
      let lu = load_rows(rbu, c);
      ag += xk.d * rows_dot(rbg, c, lg, xk);
      au += xk.d * rows_dot(rbu, c, lu, xk);
    } else {
      ag += xk.d * rows_dot(rbg, c, lg, xk);
    }
  }
  for (var r = 0u; r < ROWS; r++) {
    partial[(team * ROWS + r) * TEAM + t] = ag[r];
    if (GATE_UP) {
      partial[(WG_ROWS + team * ROWS + r) * TEAM + t] = au[r];
    }
  }
  workgroupBarrier();
  // One invocation per row adds its team's partials (each row's run read from a rotating start: consecutive
  // invocations hit different banks).
  for (var o = lid; o < WG_ROWS; o += WG) {
    var s0 = 0.0;
    var s1 = 0.0;
    for (var q = 0u; q < TEAM; q++) {
      let j = (q + o) % TEAM;
      s0 += partial[o * TEAM + j];
      if (GATE_UP) {
        s1 += partial[(WG_ROWS + o) * TEAM + j];
      }
    }
    var v = s0;
    if (GATE_UP) {
      v = silu(s0) * s1;
    }
    let row = wid.x * WG_ROWS + o;
    if (row < n) {
      y[col * n + row] = v;
    }
    if (QOUT) {
      yv[o / 4u][o % 4u] = v;
    }
  }
  if (QOUT) {
    workgroupBarrier();
    let yw = col * (9u * n / 32u);
    for (var q = lid; q < WG_ROWS / 32u; q += WG) {
      let gc = wid.x * (WG_ROWS / 32u) + q;
      if (gc < n / 32u) {
        var p: Q8xChunk;
        var amax = 0.0;
        for (var m = 0u; m < 8u; m++) {
          p.v[m] = yv[8u * q + m];
          amax = max(amax, q8x_amax4(p.v[m]));
        }
        q8x_fill(&p, amax);
        for (var m = 0u; m < 8u; m++) {
          yq[yw + 8u * gc + m] = p.w[m];
        }
        yq[yw + n / 4u + gc] = bitcast<u32>(p.d);
      }
    }
  }
}
