// Top-K over the vocabulary (K <= 64, for `--top`), in two dispatches of this kernel:
//   partial (PAIRS = false): block b of N_BLOCK keeps the K best of logits [b*chunk, min((b+1)*chunk, N)),
//                            chunk = ceil(N / N_BLOCK), as sorted (value, id) pairs in dst[b][0..K);
//   final   (PAIRS = true, N_BLOCK = 1): the K best of the N candidate pairs, sorted, in dst[0][0..K).
// Order: larger value first; equal values by lower id (ties to the lowest index); NaN logits never enter.
// Slots that no finite candidate fills hold (0, 0xFFFFFFFF) and sort last (only when fewer than K exist).
// Bindings:
//   src   u32 ne=[N] (f32 logits as bits) or ne=[2, N] (pairs: value bits, id)
//   dst   u32 ne=[2, K, N_BLOCK]   (value bits, id), best first
// Grid (N_BLOCK): workgroup b owns block b. Its BUF-entry list in workgroup memory holds the K best so far
// in slots 0..K-1; each round fills slots K..BUF-1 with the next BUF-K candidates and bitonic-sorts all BUF
// (compare-exchange steps split over WG invocations, one barrier per step), so slots 0..K-1 are again the
// K best.
// Constants: const N, N_BLOCK, K, WG, BUF: u32 (BUF power of two >= 2K; 8*BUF bytes of workgroup memory);
// const PAIRS: bool.
@group(0) @binding(0) var<storage, read> src: array<u32>;
@group(0) @binding(1) var<storage, read_write> dst: array<u32>;

const NONE: u32 = 0xffffffffu;
const FILL: u32 = BUF - K;

var<workgroup> sv: array<f32, BUF>;
var<workgroup> si: array<u32, BUF>;

// Whether (av, ai) sorts before (bv, bi).
fn before(av: f32, ai: u32, bv: f32, bi: u32) -> bool {
  return ai != NONE && (bi == NONE || av > bv || (av == bv && ai < bi));
}

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3u, @builtin(local_invocation_index) lid: u32) {
  let chunk = (N + N_BLOCK - 1u) / N_BLOCK;
  let lo = wid.x * chunk;
  let hi = min(lo + chunk, N);
  for (var i = lid; i < K; i += WG) {
    sv[i] = 0.0;
    si[i] = NONE;
  }
  for (var start = lo; start < hi; start += FILL) {
    for (var i = lid; i < FILL; i += WG) {
      let e = start + i;
      var v = 0.0;
      var id = NONE;
      if (e < hi) {
        var bits: u32;
        if (PAIRS) {
          bits = src[2u * e];
          id = src[2u * e + 1u];
        } else {
          bits = src[e];
          id = e;
        }
        if ((bits & 0x7fffffffu) > 0x7f800000u) {
          id = NONE;
        } else {
          v = bitcast<f32>(bits);
        }
      }
      sv[K + i] = v;
      si[K + i] = id;
    }
    workgroupBarrier();
    for (var size = 2u; size <= BUF; size <<= 1u) {
      for (var j = size >> 1u; j > 0u; j >>= 1u) {
        for (var i = lid; i < BUF; i += WG) {
          let l = i ^ j;
          if (l > i) {
            let av = sv[i];
            let ai = si[i];
            let bv = sv[l];
            let bi = si[l];
            // Blocks with (i & size) == 0 end in final order, the others reversed: a bitonic merge of both.
            let forward = (i & size) == 0u;
            if (select(before(av, ai, bv, bi), before(bv, bi, av, ai), forward)) {
              sv[i] = bv;
              si[i] = bi;
              sv[l] = av;
              si[l] = ai;
            }
          }
        }
        workgroupBarrier();
      }
    }
  }
  for (var i = lid; i < K; i += WG) {
    dst[(wid.x * K + i) * 2u] = bitcast<u32>(sv[i]);
    dst[(wid.x * K + i) * 2u + 1u] = si[i];
  }
}
