// q8dot: the body of the int8-x mat-vecs matvec_q8 and matvec_q8_fused (see matvec_q8.wgsl for the value and
// the constants TYPE, TEAM, ROWS, ACC, RED, COPIES, GROUPS, PF). The including kernel declares `const WG: u32 =
// 256u`, the Params struct below as `params`, the weight bindings `weights` (array<u32>) and `weights2`
// (array<vec2<u32>>), `y` (array<f32>, read_write), and `fn x_chunk(c: u32) -> XChunk` (chunk c of the int8 x).

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

// Chunk c of the int8 x: its 32 int8 values as eight quad words in the weight type's LAYOUT order (a, b) and
// its scale d.
struct XChunk {
  a: vec4<u32>,
  b: vec4<u32>,
  d: f32,
}

const WG_ROWS: u32 = (WG / TEAM) * ROWS;
// RED 1: the length of the partial runs the first reduction step adds (1: none).
const RUN: u32 = select(1u, 8u, TEAM >= 8u);

// IQ4_XS: COPIES interleaved copies of the byte-pair table (entry b of copy p at b·COPIES + p; lane l reads
// copy l % COPIES): 16 copies leave about 2 distinct words per bank in a warp's random lookups instead of 3,
// 32 copies (32 KiB) put lane l's lookups in bank l, free of conflicts.
var<workgroup> tab8: array<u32, 256 * COPIES>;
var<private> tab_copy: u32;
var<workgroup> partial: array<f32, WG * ROWS>;

fn weight_word(i: u32) -> u32 {
  return weights[i];
}

// The loaded words of one chunk of one row. Q8_0: a = words 0..3, b = words 4..7, c = word 8 of the block's
// first word on; IQ4_XS: a = (head, scales_l, -, -), b = the 16 qs bytes.
struct Chunk {
  a: vec4<u32>,
  b: vec4<u32>,
  c: u32,
}

fn load_chunk(rb: u32, c: u32) -> Chunk {
  if (TYPE == 23u) {
    let w0 = (rb + 136u * (c >> 3u)) >> 2u;
    let q = (w0 + 2u + 4u * (c & 7u)) >> 1u;
    let qa = weights2[q];
    let qb = weights2[q + 1u];
    return Chunk(vec4<u32>(weights[w0], weights[w0 + 1u], 0u, 0u), vec4<u32>(qa, qb), 0u);
  }
  let i = (rb + 34u * c) >> 2u;
  return Chunk(
    vec4<u32>(weights[i], weights[i + 1u], weights[i + 2u], weights[i + 3u]),
    vec4<u32>(weights[i + 4u], weights[i + 5u], weights[i + 6u], weights[i + 7u]),
    weights[i + 8u],
  );
}

// Chunk c of the team's ROWS rows (rows past ROWS left zero), all loads before any math (more bytes in
// flight per lane).
struct Rows {
  r0: Chunk,
  r1: Chunk,
  r2: Chunk,
  r3: Chunk,
}

fn load_rows(rb: vec4<u32>, c: u32) -> Rows {
  var l: Rows;
  l.r0 = load_chunk(rb.x, c);
  if (ROWS >= 2u) {
    l.r1 = load_chunk(rb.y, c);
  }
  if (ROWS >= 3u) {
    l.r2 = load_chunk(rb.z, c);
  }
  if (ROWS >= 4u) {
    l.r3 = load_chunk(rb.w, c);
  }
  return l;
}

// IQ4_XS: the 8 codebook values of qs word w as two int8x4 words in x's LAYOUT 1 order.
fn iq4_pack8(w: u32) -> vec2<u32> {
  let t0 = tab8[(w & 0xFFu) * COPIES + tab_copy];
  let t1 = tab8[((w >> 8u) & 0xFFu) * COPIES + tab_copy];
  let t2 = tab8[((w >> 16u) & 0xFFu) * COPIES + tab_copy];
  let t3 = tab8[(w >> 24u) * COPIES + tab_copy];
  return vec2<u32>(t0 + t1 * 256u, t2 + t3 * 256u);
}

// Σ_i w_i·q_i of the chunk times its weight scale, against the x quads x0, x1.
fn chunk_dot(rb: u32, c: u32, l: Chunk, x0: vec4<u32>, x1: vec4<u32>) -> f32 {
  if (TYPE == 23u) {
    let ib = c & 7u;
    let p0 = iq4_pack8(l.b.x);
    let p1 = iq4_pack8(l.b.y);
    let p2 = iq4_pack8(l.b.z);
    let p3 = iq4_pack8(l.b.w);
    let s = dot4I8Packed(p0.x, x0.x) + dot4I8Packed(p0.y, x0.y) + dot4I8Packed(p1.x, x0.z) +
      dot4I8Packed(p1.y, x0.w) + dot4I8Packed(p2.x, x1.x) + dot4I8Packed(p2.y, x1.y) +
      dot4I8Packed(p3.x, x1.z) + dot4I8Packed(p3.y, x1.w);
    return iq4xs_scale(l.a.x, l.a.y, 4u * ib, 16u + 2u * ib) * f32(s);
  }
  // Q8_0: the block starts at byte 0 or 2 of its first word (blocks are 34 bytes); d is that word's low or
  // high half, and the qs words are funnel-shifted or the next eight words as they are.
  let al = ((rb + 34u * c) & 2u) != 0u;
  let h = unpack2x16float(l.a.x);
  let d = select(h.x, h.y, al);
  let q0 = select((l.a.x >> 16u) | (l.a.y << 16u), l.a.y, al);
  let q1 = select((l.a.y >> 16u) | (l.a.z << 16u), l.a.z, al);
  let q2 = select((l.a.z >> 16u) | (l.a.w << 16u), l.a.w, al);
  let q3 = select((l.a.w >> 16u) | (l.b.x << 16u), l.b.x, al);
  let q4 = select((l.b.x >> 16u) | (l.b.y << 16u), l.b.y, al);
  let q5 = select((l.b.y >> 16u) | (l.b.z << 16u), l.b.z, al);
  let q6 = select((l.b.z >> 16u) | (l.b.w << 16u), l.b.w, al);
  let q7 = select((l.b.w >> 16u) | (l.c << 16u), l.c, al);
  let s = dot4I8Packed(q0, x0.x) + dot4I8Packed(q1, x0.y) + dot4I8Packed(q2, x0.z) + dot4I8Packed(q3, x0.w) +
    dot4I8Packed(q4, x1.x) + dot4I8Packed(q5, x1.y) + dot4I8Packed(q6, x1.z) + dot4I8Packed(q7, x1.w);
  return d * f32(s);
}

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

// Builds the IQ4_XS table (every invocation calls it: barriers) and sets tab_copy.
fn q8dot_table(lid: u32) {
  if (TYPE == 23u) {
    // tab8[b·COPIES + p] = the int8 codebook values of b's low and high nibble in bytes 0 and 2: copy 0 from
    // the codebook (one entry per invocation), then the other copies from copy 0 (a warp's reads hit
    // 32 / COPIES words, its writes consecutive words).
    let kv = vec2<i32>(common_kvalues(vec4<u32>(lid & 15u, lid >> 4u, 0u, 0u)).xy);
    tab8[lid * COPIES] = (u32(kv.x) & 0xFFu) | ((u32(kv.y) & 0xFFu) << 16u);
    workgroupBarrier();
    if (COPIES > 1u) {
      for (var i = lid; i < 256u * COPIES; i += WG) {
        let p = i % COPIES;
        if (p != 0u) {
          tab8[i] = tab8[i - p];
        }
      }
      workgroupBarrier();
    }
  }
  tab_copy = lid % COPIES;
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
