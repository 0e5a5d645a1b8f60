// gdn_chunk: the state-dependent scan of the chunked gated DeltaNet prefill (spec qwen3next.md §8.6), the middle
// of three dispatches (gdn_chunk_prep, gdn_chunk, gdn_chunk_norm; the twin gdn_chunk.ts records them). Per
// v-head h and 64-token block c in order, with S the state entering the block, for the columns J of this
// workgroup (column j of S, V', O and S_next depends on column j only):
//   V' = U − W·S[:, J]
//   O  = diag(e^G)·Q·S[:, J] + P·V'                      (o before the gated norm, into y)
//   S[:, J] ← e^{G_63}·S[:, J] + (diag(e^{G_63 − G}) K)ᵀ·V'
// with Q (q̂/√D_K), K (k̂), W, U, P, G from gdn_chunk_prep (definitions in its header). Exactly spec §8.6, with
// T = (I+M)^{-1} applied by forward substitution in prep; zero rows pad a short block (no-ops in the scan).
//
// Blocks and the cut (params word 2, the same partition as gdn_chunk_prep's): without a cut (cut == 0 or
// cut >= n) block c covers the dispatch tokens [64·c, min(64·c + 64, n)), NB = ceil(n/64) blocks. With
// 0 < cut < n the tokens split into two runs [0, cut) and [cut, n), each cut into blocks from its own start:
// nb1 = ceil(cut/64) blocks cover [0, cut) (the last one possibly short), then ceil((n − cut)/64) cover
// [cut, n); block c starts at 64·c (c < nb1) or cut + 64·(c − nb1) and ends at min(start + 64, cut or n).
// Row i of block c is the dispatch token start + i (its y is written there; rows past the block's end are zero
// padding). Right after block nb1 − 1 (S then the state after the first cut tokens) the workgroup also copies its
// S columns to `tap`: the result is bit for bit that of a dispatch of tokens [0, cut) followed by one of
// [cut, n) at pos0 + cut, and tap holds the state between them. Without a cut tap is not touched.
//
// Bindings (f32; ne innermost first):
//   0 params  u32 ne=[3]: [pos0, n, cut] (cut as above; pos0 is not read here)
//   1 ws_qkw  ne=[QKW_BLK, N_V, NB] read: block (c, h) at (c·N_V + h)·QKW_BLK words, Q|K|W each ne=[D_K, 64]
//   2 ws_up   ne=[UP_BLK, N_V, NB] read: block (c, h) at (c·N_V + h)·UP_BLK: U ne=[D_V, 64] | P ne=[64, 64] | G ne=[64]
//             (P is 0 above the diagonal)
//   3 state   ne=[D_K, D_V, N_V] read_write, transposed as in gdn_step: state[(h·D_V + j)·D_K + i] = S_h[i][j]
//   4 y       ne=[N_V·D_V, n] written: o of token t, head h, column j at t·N_V·D_V + h·D_V + j (gdn_chunk_norm
//             turns it into ô in place)
//   5 tap     ne=[D_K, D_V, N_V] written only with a cut: the state after token cut − 1, laid out as `state`
//             (without a cut the twin binds any buffer not bound elsewhere in the dispatch)
// (NB <= ceil(n/64) + 1 as above; QKW_BLK = 3·64·D_K, UP_BLK = 64·D_V + 64·64 + 64; both multiples of 4, read
// as vec4.)
//
// Constants: N_V, D_K, D_V: u32; BJ: state columns per workgroup (8, 16 or 32, dividing D_V); CJ: columns per
// invocation (1 or 2). Limits: D_K % 64 == 0, D_K <= 256; D_V % BJ == 0. Workgroup size 16·BJ/CJ; storage
// BJ·(16·(D_K/4+1) + 256) + 512 bytes (13 KiB at D_K = 128, BJ = 16; the twin keeps it <= 32 KiB).
//
// Grid (N_V, D_V/BJ, 1): workgroup (h, jb) owns columns J = BJ·jb .. BJ·jb+BJ−1 of head h for all blocks, its
// S[:, J] transposed in workgroup memory (rows padded by one vec4 against bank conflicts). Invocation
// (jl = lid % LJ, tq = lid / LJ), LJ = BJ/CJ, owns the local columns jl and (CJ = 2) jl + LJ, the four
// consecutive tokens 4·tq .. 4·tq+3 in V' and O, and the key rows 4·(tq + 16·m) .. +3 (m < D_K/64) of S in the
// update. Per block: barrier, V' (and Q·S) into workgroup memory, barrier, O and the state update (each
// invocation rewrites only its own S entries); after block nb1 − 1 of a cut dispatch one more barrier and the
// copy of S to tap (a dispatch without a cut pays a few scalar ops per block for the partition and no barrier).
//
// Registers, not arrays: every per-invocation accumulator is a named vec4 or mat4x4 indexed by constants (a
// function-scope array indexed by a loop counter lives in local memory on the H200, docs/PERF.md), which was
// the v1 kernel's limit (bench/_gdn_chunk_v1.wgsl). Four rows of W, Q, P or K are read per step as the
// columns of a mat4x4 (x·M gives the four dots), the loads that do not depend on the state (U, G) are issued
// before the block's first barrier, W·S and Q·S take two key vec4s per step and P·V' two token vec4s (more
// loads in flight per wait), and V', e^G and e^{G_63−G} sit in workgroup memory as vec4s of four tokens.

@group(0) @binding(0) var<storage, read> params: array<u32>;
@group(0) @binding(1) var<storage, read> ws_qkw: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read> ws_up: array<vec4<f32>>;
@group(0) @binding(3) var<storage, read_write> state: array<vec4<f32>>;
@group(0) @binding(4) var<storage, read_write> y: array<f32>;
@group(0) @binding(5) var<storage, read_write> tap: array<vec4<f32>>;

const BT: u32 = 64u;
const BT4: u32 = BT / 4u;
const TQ: u32 = 16u; // token vec4s of a block, and key-row groups of the update
const LJ: u32 = BJ / CJ; // column lanes
const WG: u32 = TQ * LJ;
const D4: u32 = D_K / 4u;
const DV4: u32 = D_V / 4u;
const SP: u32 = D4 + 1u; // padded row of st, in vec4
const M4: u32 = D4 / TQ; // key vec4s per column and invocation in the update (1..4)
const Y_W: u32 = N_V * D_V;
const QKW_BLK4: u32 = 3u * BT * D4;
const OFF_K4: u32 = BT * D4;
const OFF_W4: u32 = 2u * BT * D4;
const UP_BLK4: u32 = BT * DV4 + BT * BT4 + BT4;
const OFF_P4: u32 = BT * DV4;
const OFF_G4: u32 = BT * DV4 + BT * BT4;

var<workgroup> st: array<vec4<f32>, BJ * SP>; // st[jl·SP + i4] = S[4·i4 .. 4·i4+3][BJ·jb + jl]
var<workgroup> vp: array<vec4<f32>, BT4 * BJ>; // vp[t4·BJ + jl] = V'[4·t4 .. 4·t4+3][jl]
var<workgroup> eg: array<vec4<f32>, BT4>; // e^{G_t}, four tokens a vec4
var<workgroup> dk: array<vec4<f32>, BT4>; // e^{G_63 − G_t}

// Rows r, r+1, r+2, r+3 of a D4-wide matrix in ws_qkw at vec4 b (row r), as the columns of a mat4x4.
fn rows4(b: u32) -> mat4x4<f32> {
  return mat4x4<f32>(ws_qkw[b], ws_qkw[b + D4], ws_qkw[b + 2u * D4], ws_qkw[b + 3u * D4]);
}

// The key vec4s tq + 16·m (m < M4) of one K row (b: its vec4 tq) as the columns of a mat4x4; zero beyond M4.
fn krow(b: u32) -> mat4x4<f32> {
  var k = mat4x4<f32>();
  k[0] = ws_qkw[b];
  if (M4 > 1u) {
    k[1] = ws_qkw[b + TQ];
  }
  if (M4 > 2u) {
    k[2] = ws_qkw[b + 2u * TQ];
  }
  if (M4 > 3u) {
    k[3] = ws_qkw[b + 3u * TQ];
  }
  return k;
}

// U[t][j], t = 4·tq .. 4·tq+3, from the block at vec4 ub (j a global column of the head).
fn u4(ub: u32, tq: u32, j: u32) -> vec4<f32> {
  let b = ub + 4u * tq * DV4 + j / 4u;
  let e = j % 4u;
  return vec4<f32>(ws_up[b][e], ws_up[b + DV4][e], ws_up[b + 2u * DV4][e], ws_up[b + 3u * DV4][e]);
}

// o of tokens t0 .. t0+3 (those < t_end, the end of the block's run) of one column, y index base yb for token 0
// (the block's padding rows write nothing: past a cut they are the second run's tokens).
fn put_o(t0: u32, t_end: u32, yb: u32, o: vec4<f32>) {
  if (t0 < t_end) {
    y[t0 * Y_W + yb] = o.x;
  }
  if (t0 + 1u < t_end) {
    y[(t0 + 1u) * Y_W + yb] = o.y;
  }
  if (t0 + 2u < t_end) {
    y[(t0 + 2u) * Y_W + yb] = o.z;
  }
  if (t0 + 3u < t_end) {
    y[(t0 + 3u) * Y_W + yb] = o.w;
  }
}

// S rows of column jl (the update's key vec4s tq + 16·m): S ← el·S + a.
fn update_st(jl: u32, tq: u32, el: f32, a: mat4x4<f32>) {
  let b = jl * SP + tq;
  st[b] = el * st[b] + a[0];
  if (M4 > 1u) {
    st[b + TQ] = el * st[b + TQ] + a[1];
  }
  if (M4 > 2u) {
    st[b + 2u * TQ] = el * st[b + 2u * TQ] + a[2];
  }
  if (M4 > 3u) {
    st[b + 3u * TQ] = el * st[b + 3u * TQ] + a[3];
  }
}

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
  let h = wid.x;
  let j0 = wid.y * BJ;
  let jl = lid % LJ;
  let jm = jl + LJ; // the second column when CJ = 2
  let tq = lid / LJ;
  let n = params[1];
  // the partition (header): the first run ends at c1 (n without a cut), its nb1 blocks, then the second run's
  var c1 = n;
  if (params[2] > 0u && params[2] < n) {
    c1 = params[2];
  }
  let nb1 = (c1 + BT - 1u) / BT;
  let nb = nb1 + (n - c1 + BT - 1u) / BT;

  for (var e = lid; e < BJ * D4; e += WG) {
    st[(e / D4) * SP + e % D4] = state[(h * D_V + j0 + e / D4) * D4 + e % D4];
  }
  for (var c = 0u; c < nb; c++) {
    // block c: dispatch tokens [t_lo, min(t_lo + 64, t_hi))
    var t_lo = c * BT;
    var t_hi = c1;
    if (c >= nb1) {
      t_lo = c1 + (c - nb1) * BT;
      t_hi = n;
    }
    let qb = (c * N_V + h) * QKW_BLK4;
    let ub = (c * N_V + h) * UP_BLK4;
    // state-independent loads first, in flight across the barrier
    var g = vec4<f32>(0.0);
    var g_last = 0.0;
    if (lid < BT4) {
      g = ws_up[ub + OFF_G4 + lid];
      g_last = ws_up[ub + OFF_G4 + BT4 - 1u].w;
    }
    let u0 = u4(ub, tq, j0 + jl);
    var u1 = vec4<f32>(0.0);
    if (CJ > 1u) {
      u1 = u4(ub, tq, j0 + jm);
    }
    // the previous block's readers of vp, eg, dk and writers of st are done
    workgroupBarrier();
    if (lid < BT4) {
      eg[lid] = exp(g);
      dk[lid] = exp(vec4<f32>(g_last) - g);
    }

    // W·S and Q·S for tokens 4·tq .. 4·tq+3
    var aw0 = vec4<f32>(0.0);
    var aq0 = vec4<f32>(0.0);
    var aw1 = vec4<f32>(0.0);
    var aq1 = vec4<f32>(0.0);
    let bw = qb + OFF_W4 + 4u * tq * D4;
    let bq = qb + 4u * tq * D4;
    for (var i4 = 0u; i4 < D4; i4 += 2u) {
      let wa = rows4(bw + i4);
      let qa = rows4(bq + i4);
      let wb = rows4(bw + i4 + 1u);
      let qbm = rows4(bq + i4 + 1u);
      let sa = st[jl * SP + i4];
      let sb = st[jl * SP + i4 + 1u];
      aw0 += sa * wa + sb * wb;
      aq0 += sa * qa + sb * qbm;
      if (CJ > 1u) {
        let ra = st[jm * SP + i4];
        let rb = st[jm * SP + i4 + 1u];
        aw1 += ra * wa + rb * wb;
        aq1 += ra * qa + rb * qbm;
      }
    }
    vp[tq * BJ + jl] = u0 - aw0;
    if (CJ > 1u) {
      vp[tq * BJ + jm] = u1 - aw1;
    }
    workgroupBarrier();

    // O = e^G·(Q·S) + P·V': P rows 4·tq .. 4·tq+3 are 0 beyond token 4·tq+3, so token vec4s s4 <= tq suffice;
    // pairs of them per step (the pair's second may be tq+1 <= 15, all zeros: adds exact zeros)
    let egt = eg[tq];
    var o0 = egt * aq0;
    var o1 = egt * aq1;
    let bp = ub + OFF_P4 + 4u * tq * BT4;
    for (var s4 = 0u; s4 <= tq; s4 += 2u) {
      let pa = mat4x4<f32>(ws_up[bp + s4], ws_up[bp + BT4 + s4], ws_up[bp + 2u * BT4 + s4], ws_up[bp + 3u * BT4 + s4]);
      let s5 = s4 + 1u;
      let pb = mat4x4<f32>(ws_up[bp + s5], ws_up[bp + BT4 + s5], ws_up[bp + 2u * BT4 + s5], ws_up[bp + 3u * BT4 + s5]);
      o0 += vp[s4 * BJ + jl] * pa + vp[s5 * BJ + jl] * pb;
      if (CJ > 1u) {
        o1 += vp[s4 * BJ + jm] * pa + vp[s5 * BJ + jm] * pb;
      }
    }
    let yb = h * D_V + j0;
    put_o(t_lo + 4u * tq, t_hi, yb + jl, o0);
    if (CJ > 1u) {
      put_o(t_lo + 4u * tq, t_hi, yb + jm, o1);
    }

    // S ← e^{G_63}·S + Kᵀ·(diag(e^{G_63 − G}) V') for key vec4s tq + 16·m, four tokens per step
    var a0 = mat4x4<f32>();
    var a1 = mat4x4<f32>();
    let bk = qb + OFF_K4 + tq;
    for (var t4 = 0u; t4 < BT4; t4++) {
      let d = dk[t4];
      let r = bk + 4u * t4 * D4;
      let k0 = krow(r);
      let k1 = krow(r + D4);
      let k2 = krow(r + 2u * D4);
      let k3 = krow(r + 3u * D4);
      let v0 = vp[t4 * BJ + jl] * d;
      a0 += k0 * v0.x + k1 * v0.y + k2 * v0.z + k3 * v0.w;
      if (CJ > 1u) {
        let v1 = vp[t4 * BJ + jm] * d;
        a1 += k0 * v1.x + k1 * v1.y + k2 * v1.z + k3 * v1.w;
      }
    }
    let el = eg[BT4 - 1u].w;
    update_st(jl, tq, el, a0);
    if (CJ > 1u) {
      update_st(jm, tq, el, a1);
    }
    if (c + 1u == nb1 && c1 < n) {
      // the tap: S after the first run, once every invocation's update is in (uniform: params and c)
      workgroupBarrier();
      for (var e = lid; e < BJ * D4; e += WG) {
        tap[(h * D_V + j0 + e / D4) * D4 + e % D4] = st[(e / D4) * SP + e % D4];
      }
    }
  }
  workgroupBarrier();
  for (var e = lid; e < BJ * D4; e += WG) {
    state[(h * D_V + j0 + e / D4) * D4 + e % D4] = st[(e / D4) * SP + e % D4];
  }
}
