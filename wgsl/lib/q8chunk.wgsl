// q8chunk: one 32-weight chunk of a Q8_0, Q4_K, Q5_K, Q6_K or IQ4_XS row against int8 x, the decode shared by the int8-x
// mat-vecs (lib/q8dot.wgsl's row loop for matvec_q8 and matvec_q8_fused; moe_matvec_q8). The including kernel
// declares `const WG: u32`, `const TYPE: u32` (8 Q8_0, 12 Q4_K, 13 Q5_K, 14 Q6_K, 23 IQ4_XS), `const COPIES: u32` (copies of the IQ4_XS
// table), `const ROWS: u32` (1..4) and the weight bindings `weights` (array<u32>) and `weights2`
// (array<vec2<u32>>, the same buffer), and includes lib/common.wgsl, lib/iq4_xs.wgsl and lib/q4_k.wgsl.

// Chunk c of the int8 x: its 32 int8 values as eight quad words in the weight type's LAYOUT order (a, b) and
// its scale d.
struct XChunk {
  a: vec4<u32>,
  b: vec4<u32>,
  d: f32,
}

// IQ4_XS: COPIES interleaved copies of the byte-pair table (entry b of copy p at b·COPIES + p; lane l reads
// copy l % COPIES): 16 copies leave about 2 distinct words per bank in a warp's random lookups instead of 3,
// 32 copies (32 KiB) put lane l's lookups in bank l, free of conflicts.
var<workgroup> tab8: array<u32, 256 * COPIES>;
var<private> tab_copy: u32;

fn weight_word(i: u32) -> u32 {
  return weights[i];
}

// The loaded words of one chunk of one row. Q8_0: a = words 0..3, b = words 4..7, c = word 8 of the block's
// first word on; IQ4_XS: a = (head, scales_l, -, -), b = the 16 qs bytes; Q6_K: a, b, c = the nine words from
// the one holding the chunk's first ql byte, e, f, g = the same for its qh bytes, h = (the word holding its
// two scales, the word holding d); Q4_K and Q5_K: a, b = its 8 qs words, e, f = Q5_K's 8 qh words, s = the
// block's 3 scale words, h.x = (d, dmin).
struct Chunk {
  a: vec4<u32>,
  b: vec4<u32>,
  c: u32,
  e: vec4<u32>,
  f: vec4<u32>,
  g: u32,
  h: vec2<u32>,
  s: vec3<u32>,
}

// Q4_K / Q5_K chunk c (elements 32c..32c+31 of the row, one x chunk): block c / 8 of KQ_BYTES bytes,
// sub-block s = c % 8 of group g = s / 2: the low (s even) or high nibbles of the group's 32 qs bytes (at
// 16 + 32g in Q4_K, 48 + 32g in Q5_K), Q5_K's fifth bit bit s of the 32 qh bytes at 16; scale sc[s] and min
// m[s] from the 12 scale bytes at 4. Blocks are 16-byte aligned.
const KQ_BYTES: u32 = select(144u, 176u, TYPE == 13u);
const KQ_QS: u32 = select(16u, 48u, TYPE == 13u);

// Q6_K chunk c (elements 32c..32c+31 of the row, one x chunk): block c / 8, quarter q = c % 4 of half
// n = (c / 4) % 2. Its 6-bit values: the low nibbles (q < 2) or high nibbles of the 32 ql bytes at
// 64n + 32·(q % 2), and bits 2q, 2q+1 of the 32 qh bytes at 128 + 32n; elements 0..15 take scale
// sc[8n + 2q], 16..31 sc[8n + 2q + 1]. Blocks (210 bytes) start at byte 0 or 2 of a word.
fn q6k_block(rb: u32, c: u32) -> u32 {
  return rb + 210u * (c >> 3u);
}

fn nine_words(i: u32) -> Chunk {
  var l: Chunk;
  l.a = vec4<u32>(weights[i], weights[i + 1u], weights[i + 2u], weights[i + 3u]);
  l.b = vec4<u32>(weights[i + 4u], weights[i + 5u], weights[i + 6u], weights[i + 7u]);
  l.c = weights[i + 8u];
  return l;
}

fn load_chunk(rb: u32, c: u32) -> Chunk {
  if (TYPE == 12u || TYPE == 13u) {
    let w0 = (rb + KQ_BYTES * (c >> 3u)) >> 2u;
    let qs = w0 + KQ_QS / 4u + 8u * ((c & 7u) >> 1u);
    var l: Chunk;
    l.a = vec4<u32>(weights[qs], weights[qs + 1u], weights[qs + 2u], weights[qs + 3u]);
    l.b = vec4<u32>(weights[qs + 4u], weights[qs + 5u], weights[qs + 6u], weights[qs + 7u]);
    if (TYPE == 13u) {
      l.e = vec4<u32>(weights[w0 + 4u], weights[w0 + 5u], weights[w0 + 6u], weights[w0 + 7u]);
      l.f = vec4<u32>(weights[w0 + 8u], weights[w0 + 9u], weights[w0 + 10u], weights[w0 + 11u]);
    }
    l.s = vec3<u32>(weights[w0 + 1u], weights[w0 + 2u], weights[w0 + 3u]);
    l.h = vec2<u32>(weights[w0], 0u);
    return l;
  }
  if (TYPE == 14u) {
    let blk = q6k_block(rb, c);
    let j = c & 7u;
    let n = j >> 2u;
    var l = nine_words((blk + 64u * n + 32u * (j & 1u)) >> 2u);
    let h = nine_words((blk + 128u + 32u * n) >> 2u);
    l.e = h.a;
    l.f = h.b;
    l.g = h.c;
    l.h = vec2<u32>(weights[(blk + 192u + 8u * n + 2u * (j & 3u)) >> 2u], weights[(blk + 208u) >> 2u]);
    return l;
  }
  if (TYPE == 23u) {
    let w0 = (rb + 136u * (c >> 3u)) >> 2u;
    let q = (w0 + 2u + 4u * (c & 7u)) >> 1u;
    let qa = weights2[q];
    let qb = weights2[q + 1u];
    var l: Chunk;
    l.a = vec4<u32>(weights[w0], weights[w0 + 1u], 0u, 0u);
    l.b = vec4<u32>(qa, qb);
    return l;
  }
  return nine_words((rb + 34u * c) >> 2u);
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

// Word i of a run of bytes that starts at byte 2 of word lo when `al` (else at byte 0): lo's high half and
// hi's low half.
fn half_shift(lo: u32, hi: u32, al: bool) -> u32 {
  return select(lo, (lo >> 16u) | (hi << 16u), al);
}

// K-quants: four unsigned values as bytes, the nibbles of word w at shift s below the high bits of word h at
// shift t under mask m (per byte: Q6_K 2 bits, m = 0x03030303; Q5_K 1 bit, 0x01010101; Q4_K none, 0).
fn k_quad(w: u32, s: u32, h: u32, t: u32, m: u32) -> u32 {
  return ((w >> s) & 0x0F0F0F0Fu) | (((h >> t) & m) << 4u);
}

// Σ_i v_i·q_i and Σ_i q_i over 16 elements: four packed value words against four x words.
fn dot16(v: vec4<u32>, x: vec4<u32>) -> vec2<i32> {
  return vec2<i32>(dot16v(v, x), qsum16(x));
}

// Σ_i v_i·q_i over 16 elements: dot16's first half.
fn dot16v(v: vec4<u32>, x: vec4<u32>) -> i32 {
  return dot4I8Packed(v.x, x.x) + dot4I8Packed(v.y, x.y) + dot4I8Packed(v.z, x.z) + dot4I8Packed(v.w, x.w);
}

// Σ_i q_i over x's 16 elements: dot16's second half.
fn qsum16(x: vec4<u32>) -> i32 {
  let ones = 0x01010101u;
  return dot4I8Packed(ones, x.x) + dot4I8Packed(ones, x.y) + dot4I8Packed(ones, x.z) + dot4I8Packed(ones, x.w);
}

// One chunk decoded (the integer work that does not depend on x): its 32 weights as eight quad words, v0 for
// the quads x0 meets and v1 for x1's, in x's LAYOUT order (Q8_0, IQ4_XS: int8 values; Q6_K, Q4_K, Q5_K:
// unsigned values below the offset or min), and the scales: Q8_0, IQ4_XS, Q6_K f.x = the scale, Q6_K s = the
// two 16-element sub-scales; Q4_K, Q5_K f = (d, dmin), s = (sc, m). A batched kernel decodes a chunk once and
// takes dec_dot against each column's x.
struct Dec {
  v0: vec4<u32>,
  v1: vec4<u32>,
  f: vec2<f32>,
  s: vec2<i32>,
}

fn chunk_dec(rb: u32, c: u32, l: Chunk) -> Dec {
  var d: Dec;
  if (TYPE == 12u || TYPE == 13u) {
    // w_i = d·sc·v_i − dmin·m: Σ w_i·q_i = d·sc·Σ v_i·q_i − dmin·m·Σ q_i (dec_dot).
    let s = c & 7u;
    let sh = 4u * (s & 1u);
    let m = select(0u, 0x01010101u, TYPE == 13u);
    d.v0 = vec4<u32>(k_quad(l.a.x, sh, l.e.x, s, m), k_quad(l.a.y, sh, l.e.y, s, m),
      k_quad(l.a.z, sh, l.e.z, s, m), k_quad(l.a.w, sh, l.e.w, s, m));
    d.v1 = vec4<u32>(k_quad(l.b.x, sh, l.f.x, s, m), k_quad(l.b.y, sh, l.f.y, s, m),
      k_quad(l.b.z, sh, l.f.z, s, m), k_quad(l.b.w, sh, l.f.w, s, m));
    let sm = q4k_scale_min_words(l.s.x, l.s.y, l.s.z, s >> 1u);
    let odd = (s & 1u) == 1u;
    d.f = unpack2x16float(l.h.x);
    d.s = vec2<i32>(i32(select(sm.x, sm.y, odd)), i32(select(sm.z, sm.w, odd)));
    return d;
  }
  if (TYPE == 14u) {
    let blk = q6k_block(rb, c);
    let j = c & 7u;
    let al = (blk & 2u) != 0u;
    let s = 4u * ((j >> 1u) & 1u);
    let t = 2u * (j & 3u);
    d.v0 = vec4<u32>(
      k_quad(half_shift(l.a.x, l.a.y, al), s, half_shift(l.e.x, l.e.y, al), t, 0x03030303u),
      k_quad(half_shift(l.a.y, l.a.z, al), s, half_shift(l.e.y, l.e.z, al), t, 0x03030303u),
      k_quad(half_shift(l.a.z, l.a.w, al), s, half_shift(l.e.z, l.e.w, al), t, 0x03030303u),
      k_quad(half_shift(l.a.w, l.b.x, al), s, half_shift(l.e.w, l.f.x, al), t, 0x03030303u),
    );
    d.v1 = vec4<u32>(
      k_quad(half_shift(l.b.x, l.b.y, al), s, half_shift(l.f.x, l.f.y, al), t, 0x03030303u),
      k_quad(half_shift(l.b.y, l.b.z, al), s, half_shift(l.f.y, l.f.z, al), t, 0x03030303u),
      k_quad(half_shift(l.b.z, l.b.w, al), s, half_shift(l.f.z, l.f.w, al), t, 0x03030303u),
      k_quad(half_shift(l.b.w, l.c, al), s, half_shift(l.f.w, l.g, al), t, 0x03030303u),
    );
    // The scale pair sits at byte 0 or 2 of h.x (a 2-byte-aligned pair never straddles words; the 8n of its
    // offset keeps the parity); d at byte 0 or 2 of h.y, as the block.
    let sh = 8u * ((blk + 192u + 2u * (j & 3u)) & 2u);
    let sc = bitcast<i32>(l.h.x);
    let dh = unpack2x16float(l.h.y);
    d.f = vec2<f32>(select(dh.x, dh.y, al), 0.0);
    d.s = vec2<i32>(extractBits(sc, sh, 8u), extractBits(sc, sh + 8u, 8u));
    return d;
  }
  if (TYPE == 23u) {
    let ib = c & 7u;
    let p0 = iq4_pack8(l.b.x);
    let p1 = iq4_pack8(l.b.y);
    let p2 = iq4_pack8(l.b.z);
    let p3 = iq4_pack8(l.b.w);
    d.v0 = vec4<u32>(p0, p1);
    d.v1 = vec4<u32>(p2, p3);
    d.f = vec2<f32>(iq4xs_scale(l.a.x, l.a.y, 4u * ib, 16u + 2u * ib), 0.0);
    return d;
  }
  // Q8_0: the block starts at byte 0 or 2 of its first word (blocks are 34 bytes); d is that word's low or
  // high half, and the qs words are funnel-shifted or the next eight words as they are.
  let al = ((rb + 34u * c) & 2u) != 0u;
  let h = unpack2x16float(l.a.x);
  d.f = vec2<f32>(select(h.x, h.y, al), 0.0);
  d.v0 = vec4<u32>(
    select((l.a.x >> 16u) | (l.a.y << 16u), l.a.y, al),
    select((l.a.y >> 16u) | (l.a.z << 16u), l.a.z, al),
    select((l.a.z >> 16u) | (l.a.w << 16u), l.a.w, al),
    select((l.a.w >> 16u) | (l.b.x << 16u), l.b.x, al),
  );
  d.v1 = vec4<u32>(
    select((l.b.x >> 16u) | (l.b.y << 16u), l.b.y, al),
    select((l.b.y >> 16u) | (l.b.z << 16u), l.b.z, al),
    select((l.b.z >> 16u) | (l.b.w << 16u), l.b.w, al),
    select((l.b.w >> 16u) | (l.c << 16u), l.c, al),
  );
  return d;
}

// Σ_i w_i·q_i of a decoded chunk times its weight scale, against the x quads x0, x1.
fn dec_dot(d: Dec, x0: vec4<u32>, x1: vec4<u32>) -> f32 {
  if (TYPE == 12u || TYPE == 13u) {
    let v = dot16(d.v0, x0) + dot16(d.v1, x1);
    return d.f.x * f32(d.s.x) * f32(v.x) - d.f.y * f32(d.s.y) * f32(v.y);
  }
  if (TYPE == 14u) {
    // Σ (v_i − 32)·q_i per half as Σ v_i·q_i − 32·Σ q_i (the values are unsigned bytes).
    let d0 = dot16(d.v0, x0);
    let d1 = dot16(d.v1, x1);
    return d.f.x * f32(d.s.x * (d0.x - 32 * d0.y) + d.s.y * (d1.x - 32 * d1.y));
  }
  let s = dot4I8Packed(d.v0.x, x0.x) + dot4I8Packed(d.v0.y, x0.y) + dot4I8Packed(d.v0.z, x0.z) +
    dot4I8Packed(d.v0.w, x0.w) + dot4I8Packed(d.v1.x, x1.x) + dot4I8Packed(d.v1.y, x1.y) +
    dot4I8Packed(d.v1.z, x1.z) + dot4I8Packed(d.v1.w, x1.w);
  return d.f.x * f32(s);
}

// dec_dot given x's sums s = (qsum16(x0), qsum16(x1)), which depend on x alone: a batched kernel sums each
// column's chunk once for all its rows. The same integers as dec_dot's, so the same f32.
fn dec_dot_sums(d: Dec, x0: vec4<u32>, x1: vec4<u32>, s: vec2<i32>) -> f32 {
  if (TYPE == 12u || TYPE == 13u) {
    let v = vec2<i32>(dot16v(d.v0, x0) + dot16v(d.v1, x1), s.x + s.y);
    return d.f.x * f32(d.s.x) * f32(v.x) - d.f.y * f32(d.s.y) * f32(v.y);
  }
  if (TYPE == 14u) {
    return d.f.x * f32(d.s.x * (dot16v(d.v0, x0) - 32 * s.x) + d.s.y * (dot16v(d.v1, x1) - 32 * s.y));
  }
  return dec_dot(d, x0, x1);
}

// Σ_i w_i·q_i of the chunk times its weight scale, against the x quads x0, x1.
fn chunk_dot(rb: u32, c: u32, l: Chunk, x0: vec4<u32>, x1: vec4<u32>) -> f32 {
  return dec_dot(chunk_dec(rb, c, l), x0, x1);
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

