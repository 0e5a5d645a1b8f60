// Greedy argmax over the vocabulary, in two dispatches of this kernel (ties to the lowest index):
//   partial (PAIRS = false): block b of N_BLOCK scans logits [b*chunk, min((b+1)*chunk, N)), chunk = ceil(N / N_BLOCK),
//                            and writes its best (value, id) pair to dst[b];
//   final   (PAIRS = true, N_BLOCK = 1): reduces the N pairs to one pair in dst[0]; with FINAL it also writes
//                            the id to next_token[0] (the next step's input) and ring[params.ring_slot] (output ring).
// (v, i) beats (w, j) when v > w, or v == w and i < j. A row holding a NaN or +Inf logit (broken weights or
// numerics: a NaN cannot be ranked, an +Inf wins by overflow) gives the id 0xFFFFFFFE (NONFINITE) instead of a
// winner, so the host refuses it rather than emitting a token; -Inf never wins (an excluded id, as a mask
// writes it); an empty row gives 0xFFFFFFFF (NONE).
// Bindings:
//   src         u32 ne=[N] (f32 logits as bits) or ne=[2, N] (pairs: value bits, id)
//   dst         u32 ne=[2, N_BLOCK]   (value bits, id) per block
//   params      ArgmaxParams { ring_slot: u32 }   word of `ring` the final id goes to
//   next_token  u32 ne=[1]   written when FINAL (bound but untouched otherwise)
//   ring        u32 ne=[ring_slot + 1]   written when FINAL (bound but untouched otherwise)
// Grid (N_BLOCK): workgroup b owns block b; invocation i scans elements i, i + WG, ... of it; the WG
// candidates meet in a tree in workgroup memory.
// Constants: const N, N_BLOCK, WG: u32 (WG power of two <= 256); const PAIRS, FINAL: bool.
struct ArgmaxParams {
  ring_slot: u32,
}

@group(0) @binding(0) var<storage, read> src: array<u32>;
@group(0) @binding(1) var<storage, read_write> dst: array<u32>;
@group(0) @binding(2) var<storage, read> params: ArgmaxParams;
@group(0) @binding(3) var<storage, read_write> next_token: array<u32>;
@group(0) @binding(4) var<storage, read_write> ring: array<u32>;

const NONE: u32 = 0xffffffffu;
const NONFINITE: u32 = 0xfffffffeu;

var<workgroup> rv: array<f32, WG>;
var<workgroup> ri: array<u32, WG>;
// Set when this workgroup saw a non-finite logit (or, in the final pass, a NONFINITE block).
var<workgroup> bad: atomic<u32>;

fn beats(v: f32, i: u32, bv: f32, bi: u32) -> bool {
  return i < NONFINITE && (bi >= NONFINITE || v > bv || (v == bv && i < bi));
}

fn is_nan(bits: u32) -> bool {
  return (bits & 0x7fffffffu) > 0x7f800000u;
}

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3u, @builtin(local_invocation_index) lid: u32) {
  let chunk = (N + N_BLOCK - 1u) / N_BLOCK;
  let lo = wid.x * chunk;
  let hi = min(lo + chunk, N);
  var bv = 0.0;
  var bi = NONE;
  var my_bad = false;
  for (var e = lo + lid; e < hi; e += WG) {
    var bits: u32;
    var id: u32;
    if (PAIRS) {
      bits = src[2u * e];
      id = src[2u * e + 1u];
    } else {
      bits = src[e];
      id = e;
    }
    my_bad = my_bad || select(is_nan(bits) || bits == 0x7f800000u, id == NONFINITE, PAIRS);
    let v = bitcast<f32>(bits);
    if (!is_nan(bits) && beats(v, id, bv, bi)) {
      bv = v;
      bi = id;
    }
  }
  rv[lid] = bv;
  ri[lid] = bi;
  if (my_bad) {
    atomicStore(&bad, 1u);
  }
  workgroupBarrier();
  for (var o = WG / 2u; o > 0u; o >>= 1u) {
    if (lid < o && beats(rv[lid + o], ri[lid + o], rv[lid], ri[lid])) {
      rv[lid] = rv[lid + o];
      ri[lid] = ri[lid + o];
    }
    workgroupBarrier();
  }
  if (lid == 0u) {
    let id = select(ri[0], NONFINITE, atomicLoad(&bad) != 0u);
    dst[2u * wid.x] = bitcast<u32>(rv[0]);
    dst[2u * wid.x + 1u] = id;
    if (FINAL) {
      next_token[0] = id;
      ring[params.ring_slot] = id;
    }
  }
}
