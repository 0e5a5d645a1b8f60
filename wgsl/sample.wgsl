// Sampling one token id from the logits on the GPU, in two dispatches of this kernel, following llama.cpp's
// default chain: penalties -> top_k -> top_p -> min_p -> temperature -> draw (chat.md §8, KERNELS.md §6).
//   partial (FINAL = false): block b of N_BLOCK owns logits [b*CHUNK, min((b+1)*CHUNK, N_VOCAB)),
//            CHUNK = ceil(N_VOCAB / N_BLOCK). It drops masked ids, applies the penalties
//            y = (x <= 0 ? x * repeat : x / repeat) - (count * frequency + presence) to ids among the last
//            penalty_last_n ids of the history, and writes its K best (y, id) pairs, sorted, to dst[b][0..K)
//            and its log-sum-exp partial (max m, sum of exp(y - m) over finite y) to dst[b][K]. A block
//            holding a NaN or +Inf logit (masked or not) writes NONFINITE as the id of its first pair.
//   final   (FINAL = true, one workgroup): merges the N_BLOCK*K pairs to the K best and the N_BLOCK partials
//            to (m, s) into dst[0..K] (same layout as one block), then invocation 0 runs the chain on the
//            sorted candidates, writes the id to next_token[0] and ring[params.ring_slot], appends it to the
//            history and advances state.step. When a block was NONFINITE, the id is NONFINITE (0xFFFFFFFE, as
//            the argmax kernel writes it, also as dst[0]'s id): broken weights or numerics are refused by the
//            host rather than hidden by drawing from the rest of the row; nothing is appended, the step
//            advances.
// Chain (n = candidates holding an id; x0 = the best):
//   temperature <= 0 or x0 = -inf: the best candidate (greedy; the argmax kernel's choice when nothing is
//   masked and penalties are off: same order, ties to the lowest id);
//   top_k: keep min(top_k, n) (top_k = 0 or > K keeps n: the candidate cap is K);
//   top_p < 1: p_i = exp(y_i - L) with L the log-sum-exp over the whole vocabulary when top_k is 0 or > K,
//   else over the kept candidates; keep the shortest prefix whose sum of p reaches top_p (all kept if none);
//   min_p > 0: keep the prefix with y_i >= x0 + log(min_p);
//   draw: w_i = exp(y_i / T - x0 / T) (0 for -inf); the first i whose running sum of w exceeds u * sum w,
//   u = (h >> 8) / 2^24 with h = rng_hash(seed_lo, seed_hi, step) (below; the twin mirrors it bit-exactly).
// Logits are f32: finite or -inf (an excluded id); NaN and +inf flag the row (NONFINITE, above). With no
// candidate (every id masked) the id is NONE (0xFFFFFFFF) and nothing is appended to the history.
// Bindings:
//   src         u32 ne=[N_VOCAB] (f32 logits as bits) in the partial pass; ne=[2, K+1, N_BLOCK] in the final
//   dst         u32 ne=[2, K+1, N_BLOCK] (partial) or ne=[2, K+1] (final): (value bits, id) best first, then
//               (m bits, s bits)
//   params      SampleParams (12 words, below); written once per request except ring_slot (per step)
//   mask        u32 ne=[ceil(N_VOCAB / 32)]: bit (id & 31) of word id >> 5 set = never sample id (FLAG_MASK)
//   state       SampleState { step, count, hist[HIST] }: RNG counter; ids appended so far; ring of the last
//               HIST ids (id k of all appended at hist[k % HIST]); read by the partial, written by the final
//   next_token  u32 ne=[1]   (final pass)
//   ring        u32 ne=[ring_slot + 1]   (final pass)
// Grid: partial N_BLOCK workgroups, final 1. A workgroup reads its candidates (the block's logits; in the
// final pass the N_BLOCK*K list entries) twice: first each invocation takes the maximum of its candidates
// (stride WG), and the K-th largest of those WG maxima, theta, bounds the K-th best from below; then the
// candidates >= theta are packed into a list in workgroup memory and bitonic-sorted (compare-exchange steps
// split over WG invocations, one barrier per step). When more than BUF candidates tie at theta, it falls back
// to rounds: the K best so far in slots 0..K-1, the next BUF-K candidates in the rest, a sort of all BUF per
// round.
// Constants: const N_VOCAB, N_BLOCK, K, WG, BUF, HIST: u32; const FINAL: bool. K <= 64; WG power of two,
// K <= WG <= BUF; BUF power of two >= 2K; HIST power of two (the penalty window cap); CHUNK <= 32768 (the
// penalty bitmask).
struct SampleParams {
  ring_slot: u32,
  flags: u32,
  temperature: f32,
  top_k: u32,
  top_p: f32,
  min_p: f32,
  repeat_penalty: f32,
  presence_penalty: f32,
  frequency_penalty: f32,
  penalty_last_n: u32,
  seed_lo: u32,
  seed_hi: u32,
}

struct SampleState {
  step: u32,
  count: u32,
  hist: array<u32, HIST>,
}

@group(0) @binding(0) var<storage, read> src: array<u32>;
@group(0) @binding(1) var<storage, read_write> dst: array<u32>;
@group(0) @binding(2) var<storage, read> params: SampleParams;
@group(0) @binding(3) var<storage, read> mask: array<u32>;
@group(0) @binding(4) var<storage, read_write> state: SampleState;
@group(0) @binding(5) var<storage, read_write> next_token: array<u32>;
@group(0) @binding(6) var<storage, read_write> ring: array<u32>;

const NONE: u32 = 0xffffffffu;
const NONFINITE: u32 = 0xfffffffeu;
const POS_INF: u32 = 0x7f800000u;
const FLAG_MASK: u32 = 1u;
const CHUNK: u32 = (N_VOCAB + N_BLOCK - 1u) / N_BLOCK;
const PBITS: u32 = (CHUNK + 31u) / 32u;
const FILL: u32 = BUF - K;
// Start of a running maximum: finite, so that no inf arithmetic is needed (WGSL may assume finite math).
const LOW: f32 = -3.0e38;

var<workgroup> sv: array<f32, BUF>;
var<workgroup> si: array<u32, BUF>;
var<workgroup> win: array<u32, HIST>;
var<workgroup> pbits: array<atomic<u32>, PBITS>;
var<workgroup> lm: array<f32, WG>;
var<workgroup> ls: array<f32, WG>;
var<workgroup> n_keep: atomic<u32>;
var<workgroup> n_kept: u32;
// Set when this workgroup saw a NaN or +Inf logit (or, in the final pass, a NONFINITE block).
var<workgroup> bad: atomic<u32>;

// Whether (av, ai) sorts before (bv, bi): larger value first, equal values by lower id, NONE last.
fn before(av: f32, ai: u32, bv: f32, bi: u32) -> bool {
  return ai != NONE && (bi == NONE || av > bv || (av == bv && ai < bi));
}

fn is_nan(bits: u32) -> bool {
  return (bits & 0x7fffffffu) > 0x7f800000u;
}

fn is_finite(v: f32) -> bool {
  return (bitcast<u32>(v) & 0x7f800000u) != 0x7f800000u;
}

// lowbias32 (C. Wellons' 32-bit integer hash): a bijection on u32.
fn mix32(x: u32) -> u32 {
  var z = x;
  z ^= z >> 16u;
  z *= 0x7feb352du;
  z ^= z >> 15u;
  z *= 0x846ca68bu;
  z ^= z >> 16u;
  return z;
}

// Counter-based: for a fixed seed, step -> hash is a bijection, so the 2^32 steps of a run never repeat.
fn rng_hash(seed_lo: u32, seed_hi: u32, step: u32) -> u32 {
  return mix32(mix32(mix32(step ^ 0x85ebca6bu) ^ seed_lo) ^ seed_hi ^ 0x27d4eb2fu);
}

// Penalised logit of `id` (its bit is set, so it occurs in win[0..n_pen)); llama.cpp's penalties sampler.
fn penalised(x: f32, id: u32, n_pen: u32) -> f32 {
  var c = 0u;
  for (var i = 0u; i < n_pen; i++) {
    c += select(0u, 1u, win[i] == id);
  }
  let y = select(x / params.repeat_penalty, x * params.repeat_penalty, x <= 0.0);
  return y - (f32(c) * params.frequency_penalty + f32(select(0u, 1u, c > 0u)) * params.presence_penalty);
}

// Log-sum-exp merge of (m1, s1) and (m2, s2), each s a sum of exp(y - m).
fn lse_merge(m1: f32, s1: f32, m2: f32, s2: f32) -> vec2f {
  let m = max(m1, m2);
  return vec2f(m, s1 * exp(m1 - m) + s2 * exp(m2 - m));
}

// Whether candidate e marks the row as broken: a NaN or +Inf logit (partial pass) or a block's NONFINITE
// id (final pass).
fn nonfinite_at(e: u32) -> bool {
  if (FINAL) {
    let p = (e / K) * (K + 1u) + e % K;
    return src[2u * p + 1u] == NONFINITE;
  }
  let bits = src[e];
  return is_nan(bits) || bits == POS_INF;
}

// Candidate e of this workgroup: logit e (partial pass; not ok when NaN, +Inf or masked; penalised when its
// bit is set) or entry e of the blocks' lists (final pass; not ok when it holds no id or NONFINITE).
struct Cand {
  v: f32,
  id: u32,
  ok: bool,
}

fn cand(e: u32, lo: u32, n_pen: u32, use_mask: bool) -> Cand {
  if (FINAL) {
    let p = (e / K) * (K + 1u) + e % K;
    let id = src[2u * p + 1u];
    return Cand(bitcast<f32>(src[2u * p]), id, id < NONFINITE);
  }
  let bits = src[e];
  let masked = use_mask && ((mask[e >> 5u] >> (e & 31u)) & 1u) != 0u;
  if (is_nan(bits) || bits == POS_INF || masked) {
    return Cand(0.0, NONE, false);
  }
  var v = bitcast<f32>(bits);
  let r = e - lo;
  if ((atomicLoad(&pbits[r >> 5u]) & (1u << (r & 31u))) != 0u) {
    v = penalised(v, e, n_pen);
  }
  return Cand(v, e, true);
}

// Bitonic sort of sv/si[0..n) into `before` order (n a power of two <= BUF, uniform; all invocations call).
fn sort_prefix(n: u32, lid: u32) {
  for (var size = 2u; size <= n; size <<= 1u) {
    for (var j = size >> 1u; j > 0u; j >>= 1u) {
      for (var i = lid; i < n; i += WG) {
        let l = i ^ j;
        if (l > i) {
          let av = sv[i];
          let ai = si[i];
          let bv = sv[l];
          let bi = si[l];
          // Runs with (i & size) == 0 end in final order, the others reversed: a bitonic merge of both.
          if (select(before(av, ai, bv, bi), before(bv, bi, av, ai), (i & size) == 0u)) {
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

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3u, @builtin(local_invocation_index) lid: u32) {
  var lo = wid.x * CHUNK;
  var hi = min(lo + CHUNK, N_VOCAB);
  if (FINAL) {
    lo = 0u;
    hi = N_BLOCK * K;
  }
  // Penalty window: the last n_pen ids into workgroup memory, and a bitmask of the ones in this block.
  let pen_on = !FINAL && params.penalty_last_n > 0u &&
    (params.repeat_penalty != 1.0 || params.presence_penalty != 0.0 || params.frequency_penalty != 0.0);
  var n_pen = 0u;
  if (pen_on) {
    n_pen = min(state.count, min(params.penalty_last_n, HIST));
  }
  for (var i = lid; i < PBITS; i += WG) {
    atomicStore(&pbits[i], 0u);
  }
  for (var i = lid; i < n_pen; i += WG) {
    win[i] = state.hist[(state.count - 1u - i) % HIST];
  }
  workgroupBarrier();
  for (var i = lid; i < n_pen; i += WG) {
    let id = win[i];
    if (id >= lo && id < hi) {
      atomicOr(&pbits[(id - lo) >> 5u], 1u << ((id - lo) & 31u));
    }
  }
  workgroupBarrier();
  let use_mask = (params.flags & FLAG_MASK) != 0u;
  // Pass A: each invocation's maximum over its candidates (stride WG), and in the partial pass its
  // log-sum-exp partial over the finite values.
  var tm = LOW;
  var ts = 0.0;
  var my_max = LOW;
  var my_ok = false;
  var my_bad = false;
  for (var e = lo + lid; e < hi; e += WG) {
    my_bad = my_bad || nonfinite_at(e);
    let c = cand(e, lo, n_pen, use_mask);
    if (c.ok) {
      my_max = select(my_max, c.v, !my_ok || c.v > my_max);
      my_ok = true;
      if (!FINAL && is_finite(c.v)) {
        if (c.v > tm) {
          ts = ts * exp(tm - c.v) + 1.0;
          tm = c.v;
        } else {
          ts += exp(c.v - tm);
        }
      }
    }
  }
  // The K-th largest of the WG maxima is a lower bound of the K-th best value (K invocations each hold a
  // distinct candidate >= it): only candidates >= theta can be among the K best.
  sv[lid] = my_max;
  si[lid] = select(NONE, lid, my_ok);
  if (my_bad) {
    atomicStore(&bad, 1u);
  }
  if (lid == 0u) {
    atomicStore(&n_keep, 0u);
  }
  workgroupBarrier();
  sort_prefix(WG, lid);
  let bounded = si[K - 1u] != NONE;
  let theta = sv[K - 1u];
  workgroupBarrier();
  // Pass B: the candidates >= theta, packed into sv/si[0..kept) (all when fewer than K invocations hold one).
  for (var e = lo + lid; e < hi; e += WG) {
    let c = cand(e, lo, n_pen, use_mask);
    if (c.ok && (!bounded || c.v >= theta)) {
      let at = atomicAdd(&n_keep, 1u);
      if (at < BUF) {
        sv[at] = c.v;
        si[at] = c.id;
      }
    }
  }
  workgroupBarrier();
  if (lid == 0u) {
    n_kept = atomicLoad(&n_keep);
  }
  let kept = workgroupUniformLoad(&n_kept);
  if (kept <= BUF) {
    var n = 1u;
    while (n < kept || n < K) {
      n <<= 1u;
    }
    for (var i = kept + lid; i < n; i += WG) {
      sv[i] = 0.0;
      si[i] = NONE;
    }
    workgroupBarrier();
    sort_prefix(n, lid);
  } else {
    // Too many ties at theta for the buffer: rounds over all candidates, BUF - K at a time.
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
          let c = cand(e, lo, n_pen, use_mask);
          if (c.ok) {
            v = c.v;
            id = c.id;
          }
        }
        sv[K + i] = v;
        si[K + i] = id;
      }
      workgroupBarrier();
      sort_prefix(BUF, lid);
    }
  }
  if (FINAL) {
    // The blocks' partials, merged by one invocation each over a stride, then in a tree.
    for (var b = lid; b < N_BLOCK; b += WG) {
      let p = b * (K + 1u) + K;
      let r = lse_merge(tm, ts, bitcast<f32>(src[2u * p]), bitcast<f32>(src[2u * p + 1u]));
      tm = r.x;
      ts = r.y;
    }
  }
  lm[lid] = tm;
  ls[lid] = ts;
  workgroupBarrier();
  for (var o = WG / 2u; o > 0u; o >>= 1u) {
    if (lid < o) {
      let r = lse_merge(lm[lid], ls[lid], lm[lid + o], ls[lid + o]);
      lm[lid] = r.x;
      ls[lid] = r.y;
    }
    workgroupBarrier();
  }
  let base = select(wid.x * (K + 1u), 0u, FINAL);
  let flagged = atomicLoad(&bad) != 0u;
  for (var i = lid; i < K; i += WG) {
    dst[(base + i) * 2u] = bitcast<u32>(sv[i]);
    dst[(base + i) * 2u + 1u] = select(si[i], NONFINITE, flagged && i == 0u);
  }
  if (lid == 0u) {
    dst[(base + K) * 2u] = bitcast<u32>(lm[0]);
    dst[(base + K) * 2u + 1u] = bitcast<u32>(ls[0]);
  }
  if (FINAL && lid == 0u) {
    let chosen = select(choose(lm[0], ls[0]), NONFINITE, flagged);
    next_token[0] = chosen;
    ring[params.ring_slot] = chosen;
    if (chosen < NONFINITE) {
      state.hist[state.count % HIST] = chosen;
      state.count = state.count + 1u;
    }
    state.step = state.step + 1u;
  }
}

// The chain on the sorted candidates sv/si[0..K) (final pass, one invocation); (m_all, s_all) is the
// log-sum-exp of the whole (penalised, unmasked) vocabulary.
fn choose(m_all: f32, s_all: f32) -> u32 {
  var n = 0u;
  while (n < K && si[n] != NONE) {
    n++;
  }
  if (n == 0u) {
    return NONE;
  }
  let x0 = sv[0];
  let t = params.temperature;
  if (!(t > 0.0) || !is_finite(x0)) {
    return si[0];
  }
  var keep = n;
  if (params.top_k > 0u) {
    keep = min(keep, params.top_k);
  }
  if (params.top_p < 1.0) {
    var norm = m_all + log(s_all);
    if (params.top_k > 0u && params.top_k <= K) {
      var s = 0.0;
      for (var i = 0u; i < keep; i++) {
        if (is_finite(sv[i])) {
          s += exp(sv[i] - x0);
        }
      }
      norm = x0 + log(s);
    }
    var cum = 0.0;
    for (var i = 0u; i < keep; i++) {
      if (is_finite(sv[i])) {
        cum += exp(sv[i] - norm);
      }
      if (cum >= params.top_p) {
        keep = i + 1u;
        break;
      }
    }
  }
  if (params.min_p > 0.0) {
    let thr = x0 + log(params.min_p);
    var k = 1u;
    while (k < keep && sv[k] >= thr) {
      k++;
    }
    keep = k;
  }
  let u = f32(rng_hash(params.seed_lo, params.seed_hi, state.step) >> 8u) * (1.0 / 16777216.0);
  var total = 0.0;
  for (var i = 0u; i < keep; i++) {
    if (is_finite(sv[i])) {
      total += exp(sv[i] / t - x0 / t);
    }
  }
  let goal = u * total;
  var acc = 0.0;
  var pick = 0u;
  for (var i = 0u; i < keep; i++) {
    if (is_finite(sv[i])) {
      let w = exp(sv[i] / t - x0 / t);
      acc += w;
      if (w > 0.0) {
        pick = i;
        if (acc > goal) {
          break;
        }
      }
    }
  }
  return si[pick];
}
