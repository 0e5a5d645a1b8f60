import assert from "node:assert/strict";
import { Rng } from "../util/rng.ts";
import { assertClose } from "../util/close.ts";
import {
  attention,
  conv1dStep,
  deltaNetChunked,
  deltaNetGates,
  type DeltaNetInputs,
  type DeltaNetShape,
  deltaNetStep,
  expertFfn,
  l2Norm,
  matvec,
  matvecQuant,
  moeFfn,
  moeRoute,
  rmsNorm,
  rmsNormGated,
  ropeNeox,
  silu,
  softplus,
} from "./ops.ts";

/** Hand-computed values are given to 5 decimals in the spec. */
const HAND = { atol: 1e-5, rtol: 0 };
/** f64 against f64 via a different association order: rounding only. */
const F64 = { atol: 1e-10, rtol: 1e-9 };

Deno.test("deltaNetStep reproduces the two-token example of spec §8.5", () => {
  const shape: DeltaNetShape = { dK: 2, dV: 2, nK: 1, nV: 1, kHeadOf: () => 0 };
  const t1 = deltaNetStep(new Float64Array(4), {
    ...shape,
    q: [1, 0],
    k: [1, 0],
    v: [2, 3],
    beta: [0.5],
    g: [0],
  });
  assertClose(t1.o, [0.70711, 1.06066], HAND, { what: "token 1 output", seed: 0 });
  // transposed storage: state[i + dK*j] = S[i][j]; S = [[1, 1.5], [0, 0]]
  assertClose(t1.state, [1, 0, 1.5, 0], HAND, { what: "token 1 state", seed: 0 });
  const t2 = deltaNetStep(t1.state, {
    ...shape,
    q: [0, 1],
    k: [0, 1],
    v: [1, 1],
    beta: [1],
    g: [Math.log(0.5)],
  });
  assertClose(t2.o, [0.70711, 0.70711], HAND, { what: "token 2 output", seed: 0 });
  assertClose(t2.state, [0.5, 1, 0.75, 1], HAND, { what: "token 2 state", seed: 0 });
  // the same two tokens as one sequence, in both forms
  const both: DeltaNetInputs = {
    q: [1, 0, 0, 1],
    k: [1, 0, 0, 1],
    v: [2, 3, 1, 1],
    beta: [0.5, 1],
    g: [0, Math.log(0.5)],
  };
  const seq = deltaNetStep(new Float64Array(4), { ...shape, ...both });
  assertClose(seq.o, [0.70711, 1.06066, 0.70711, 0.70711], HAND, { what: "sequence", seed: 0 });
  const ch = deltaNetChunked(new Float64Array(4), { ...shape, ...both, chunk: 64 });
  assertClose(ch.o, seq.o, F64, { what: "chunked example output", seed: 0 });
  assertClose(ch.state, seq.state, F64, { what: "chunked example state", seed: 0 });
});

function randomDeltaNet(rng: Rng, shape: DeltaNetShape, nTokens: number): DeltaNetInputs {
  const { dK, dV, nK, nV } = shape;
  const unit = (n: number) =>
    l2Norm(Float64Array.from({ length: n * dK }, () => rng.normal()), { eps: 1e-6, n: dK });
  return {
    q: unit(nK * nTokens),
    k: unit(nK * nTokens),
    v: Float64Array.from({ length: dV * nV * nTokens }, () => rng.normal()),
    beta: Float64Array.from({ length: nV * nTokens }, () => rng.float()),
    // g in (-3, 0]: strong and weak decay, some almost none
    g: Float64Array.from({ length: nV * nTokens }, () => -3 * rng.float() ** 2),
  };
}

Deno.test("deltaNetChunked equals the recurrence for chunk sizes 1, 7, 64 and ragged lengths", () => {
  const rng = new Rng();
  for (const kHeadOf of [(h: number) => Math.floor(h / 2), (h: number) => h % 2]) {
    const shape: DeltaNetShape = { dK: 8, dV: 6, nK: 2, nV: 4, kHeadOf };
    for (const [nTokens, chunk] of [[100, 1], [100, 7], [100, 64], [64, 64], [5, 64], [130, 64]] as const) {
      const x = randomDeltaNet(rng, shape, nTokens);
      const s0 = Float64Array.from({ length: 8 * 6 * 4 }, () => rng.normal() * 0.5);
      const ref = deltaNetStep(s0, { ...shape, ...x });
      const got = deltaNetChunked(s0, { ...shape, ...x, chunk });
      const what = `chunk ${chunk}, ${nTokens} tokens, kHeadOf(1) = ${kHeadOf(1)}`;
      assertClose(got.o, ref.o, F64, { what: `${what}: output`, seed: rng.seed });
      assertClose(got.state, ref.state, F64, { what: `${what}: state`, seed: rng.seed });
    }
  }
});

Deno.test("deltaNetStep: the key head mapping kHeadOf is honoured", () => {
  const rng = new Rng();
  const x = randomDeltaNet(rng, { dK: 4, dV: 4, nK: 2, nV: 4, kHeadOf: () => 0 }, 3);
  const s0 = new Float64Array(4 * 4 * 4);
  const grouped = deltaNetStep(s0, { dK: 4, dV: 4, nK: 2, nV: 4, kHeadOf: (h) => Math.floor(h / 2), ...x });
  const tiled = deltaNetStep(s0, { dK: 4, dV: 4, nK: 2, nV: 4, kHeadOf: (h) => h % 2, ...x });
  // v-head 0 reads k-head 0 in both; v-head 1 reads k-head 0 (grouped) or 1 (tiled)
  // o is [token][v-head][dV]: heads 0 and 3 read the same k-head in both mappings, heads 1 and 2 do not. One element
  // can agree by chance (a small beta or v), so the test compares each head over all tokens.
  const headDiff = (h: number) => {
    let d = 0;
    for (let t = 0; t < 3; t++) {
      for (let j = 0; j < 4; j++) {
        d = Math.max(d, Math.abs(grouped.o[(t * 4 + h) * 4 + j]! - tiled.o[(t * 4 + h) * 4 + j]!));
      }
    }
    return d;
  };
  assert.equal(headDiff(0), 0, `seed ${rng.seed}: head 0`);
  assert.equal(headDiff(3), 0, `seed ${rng.seed}: head 3`);
  assert.ok(headDiff(1) > 1e-6, `seed ${rng.seed}: head 1 should differ`);
  assert.ok(headDiff(2) > 1e-6, `seed ${rng.seed}: head 2 should differ`);
});

Deno.test("ropeNeox rotates the pairs (j, j + nRot/2) and passes dims >= nRot through", () => {
  const headDim = 256;
  const x = new Float64Array(headDim);
  x[3] = 1;
  x[3 + 32] = 2;
  x[4] = 5; // pair (4, 36) with x[36] = 0
  x[100] = 7;
  const base = 1e7;
  const pos = 5;
  const y = ropeNeox(x, { headDim, nRot: 64, base, pos: [pos] });
  const phi3 = pos * base ** (-6 / 64);
  const phi4 = pos * base ** (-8 / 64);
  const want = new Float64Array(headDim);
  want[3] = Math.cos(phi3) - 2 * Math.sin(phi3);
  want[35] = Math.sin(phi3) + 2 * Math.cos(phi3);
  want[4] = 5 * Math.cos(phi4);
  want[36] = 5 * Math.sin(phi4);
  want[100] = 7;
  assertClose(y, want, F64, { what: "rope hand case", seed: 0 });
  // position 0 is the identity
  assertClose(ropeNeox(x, { headDim, nRot: 64, base, pos: [0] }), x, F64, { what: "rope pos 0", seed: 0 });
});

Deno.test("moeRoute: softmax, top-k with ties to the lower index, renormalized, clamped, scaled", () => {
  const r = moeRoute([1, 3, 3, 0, 2], { nUsed: 2 });
  assert.deepEqual(r.ids, [1, 2]);
  assertClose(r.weights, [0.5, 0.5], F64, { what: "tie weights", seed: 0 });
  const r3 = moeRoute([1, 3, 3, 0, 2], { nUsed: 3 });
  assert.deepEqual(r3.ids, [1, 2, 4]);
  const e = Math.E;
  const d = 2 * e ** 3 + e ** 2;
  assertClose(r3.weights, [e ** 3 / d, e ** 3 / d, e ** 2 / d], F64, { what: "top-3 weights", seed: 0 });
  const rs = moeRoute([1, 3, 3, 0, 2], { nUsed: 3, weightsScale: 2 });
  assertClose(rs.weights, [2 * e ** 3 / d, 2 * e ** 3 / d, 2 * e ** 2 / d], F64, { what: "scaled", seed: 0 });
  // 20000 equal experts, top-1: the selected sum 5e-5 is below the clamp 6.1035e-5
  const flat = moeRoute(new Float64Array(20000), { nUsed: 1 });
  assert.deepEqual(flat.ids, [0]);
  assertClose(flat.weights, [5e-5 / 6.1035e-5], F64, { what: "clamped weight", seed: 0 });
});

Deno.test("attention: causal softmax, GQA head mapping, scale and sigmoid gate on a hand case", () => {
  // headDim 2, nHead 2, nHeadKv 1, two tokens in the cache, two queries
  const k = [0, 0, 2, 0];
  const v = [1, 0, 0, 1];
  const q = [1, 0, 0, 1, 1, 0, 0, 1]; // token 0: heads (1,0), (0,1); token 1: same
  const o = attention(q, { k, v, headDim: 2, nHead: 2, nHeadKv: 1, scale: 0.5 });
  // token 0 sees only cache position 0: output v0 for both heads
  // token 1 head 0: scores [0, 1] (2 * 0.5), head 1: scores [0, 0]
  const a = 1 / (1 + Math.E);
  assertClose(o, [1, 0, 1, 0, a, 1 - a, 0.5, 0.5], F64, { what: "attention", seed: 0 });
  const gate = [0, 0, 0, 0, 0, 0, Math.log(3), -Math.log(3)];
  const og = attention(q, { k, v, gate, headDim: 2, nHead: 2, nHeadKv: 1, scale: 0.5 });
  assertClose(og, [0.5, 0, 0.5, 0, a / 2, (1 - a) / 2, 0.375, 0.125], F64, { what: "gated", seed: 0 });
  // two KV heads, four query heads: heads 0-1 read KV 0, heads 2-3 read KV 1
  const k2 = [0, 0, 0, 0];
  const v2 = [1, 2, 3, 4];
  const o2 = attention([1, 0, 1, 0, 1, 0, 1, 0], {
    k: k2,
    v: v2,
    headDim: 2,
    nHead: 4,
    nHeadKv: 2,
    scale: 1,
  });
  assertClose(o2, [1, 2, 1, 2, 3, 4, 3, 4], F64, { what: "GQA mapping", seed: 0 });
});

Deno.test("conv1dStep: taps, rolling state and a prefill equal to token-by-token steps", () => {
  // 2 channels, K = 3: w ne=[3, 2]
  const w = [1, 10, 100, 2, 20, 200];
  const s0 = [1, 2, 3, 4]; // x_{-2} = (1,2), x_{-1} = (3,4)
  const r = conv1dStep([5, 6], { state: s0, w, nCh: 2 });
  assert.deepEqual(Array.from(r.y), [1 + 30 + 500, 4 + 80 + 1200]);
  assert.deepEqual(Array.from(r.state), [3, 4, 5, 6]);
  const rng = new Rng();
  const wr = Array.from({ length: 4 * 3 }, () => rng.normal());
  const xs = Array.from({ length: 3 * 5 }, () => rng.normal());
  const all = conv1dStep(xs, { state: new Float64Array(9), w: wr, nCh: 3 });
  let st: ArrayLike<number> = new Float64Array(9);
  for (let t = 0; t < 5; t++) {
    const one = conv1dStep(xs.slice(3 * t, 3 * t + 3), { state: st, w: wr, nCh: 3 });
    assertClose(one.y, all.y.slice(3 * t, 3 * t + 3), F64, { what: `conv token ${t}`, seed: rng.seed });
    st = one.state;
  }
  assertClose(st, all.state, F64, { what: "conv state", seed: rng.seed });
});

Deno.test("norms, activations, matvec and expertFfn on hand cases", () => {
  assertClose(rmsNorm([3, 4], [1, 2], { eps: 0 }), [3 / Math.sqrt(12.5), 8 / Math.sqrt(12.5)], F64, {
    what: "rmsNorm",
    seed: 0,
  });
  assertClose(rmsNorm([1, 1, 2, 2], null, { eps: 0, n: 2 }), [1, 1, 1, 1], F64, { what: "rows", seed: 0 });
  assertClose(l2Norm([3, 4, 0, 0], { eps: 1e-6, n: 2 }), [0.6, 0.8, 0, 0], F64, { what: "l2Norm", seed: 0 });
  assertClose(
    rmsNormGated([1, 1], [2, 3], { z: [0, 1], eps: 0 }),
    [0, 3 * silu(1)],
    F64,
    { what: "gated", seed: 0 },
  );
  assert.equal(softplus(30), 30);
  assertClose([softplus(0), softplus(-50)], [Math.LN2, Math.exp(-50)], F64, { what: "softplus", seed: 0 });
  assertClose(matvec([1, 2, 3, 4, 5, 6], [1, -1]), [-1, -1, -1], F64, { what: "matvec", seed: 0 });
  // gate = up = identity 2x2, down rows (1, 1) and (0, 1)
  const y = expertFfn([1, 2], { gate: [1, 0, 0, 1], up: [1, 0, 0, 1], down: [1, 1, 0, 1] });
  assertClose(y, [silu(1) * 1 + silu(2) * 2, silu(2) * 2], F64, { what: "expertFfn", seed: 0 });
});

Deno.test("matvecQuant decodes Q8_0 blocks (f16 scale, int8 values) and F32 rows", () => {
  // two Q8_0 rows of 32: row 0 scale 0.5 (f16 0x3800) with q = 1..32; row 1 scale -2 (0xC000) with q = -1
  const bytes = new Uint8Array(2 * 34);
  bytes.set([0x00, 0x38], 0);
  for (let i = 0; i < 32; i++) bytes[2 + i] = i + 1;
  bytes.set([0x00, 0xc0], 34);
  for (let i = 0; i < 32; i++) bytes[36 + i] = 0xff;
  const x = Float64Array.from({ length: 32 }, (_, i) => (i % 2 === 0 ? 1 : 0));
  // row 0: 0.5 · (1 + 3 + ... + 31) = 0.5 · 256; row 1: (-2)(-1) · 16
  assertClose(matvecQuant({ type: "Q8_0", bytes }, x), [128, 32], F64, { what: "Q8_0", seed: 0 });
  const f32 = new Uint8Array(new Float32Array([1.5, -2, 0.25, 4]).buffer);
  assertClose(matvecQuant({ type: "F32", bytes: f32 }, [2, 1]), [1, 4.5], F64, { what: "F32", seed: 0 });
});

Deno.test("deltaNetGates: beta = sigmoid(b), g = ssmA · softplus(a + dtBias) per value head", () => {
  const r = deltaNetGates([0, Math.log(3), 0, 0], { a: [0, 1, -1, 30], ssmA: [-2, -0.5], dtBias: [0, -1] });
  assertClose(r.beta, [0.5, 0.75, 0.5, 0.5], F64, { what: "beta", seed: 0 });
  assertClose(r.g, [-2 * Math.LN2, -0.5 * Math.LN2, -2 * softplus(-1), -0.5 * 29], F64, {
    what: "g",
    seed: 0,
  });
});

Deno.test("moeFfn: routed experts weighted by renormalized probabilities plus the gated shared expert", () => {
  // nEmbd 2, 3 experts of nFf 1, top-2. x = (1, 0): router logits (0, ln 3, ln 2) pick experts 1 and 2
  // with weights 3/5 and 2/5. Every expert gate is silu(x0); up scales by 1, 2, 3; downs send expert 1
  // to dim 0, expert 2 to dim 1 (expert 0 would add 5 to both). Shared: gate logit 0 → 0.5 · silu(1).
  const y = moeFfn([1, 0], {
    gateInp: [0, 0, Math.log(3), 0, Math.log(2), 0],
    gateExps: Float64Array.from([1, 0, 1, 0, 1, 0]),
    upExps: Float64Array.from([1, 0, 2, 0, 3, 0]),
    downExps: Float64Array.from([5, 5, 1, 0, 0, 1]),
    gateInpShexp: [0, 0],
    gateShexp: [1, 0],
    upShexp: [1, 0],
    downShexp: [1, 1],
    nExpert: 3,
    nUsed: 2,
  });
  const s1 = silu(1);
  assertClose(y, [s1 * (0.6 * 2 + 0.5), s1 * (0.4 * 3 + 0.5)], F64, { what: "moeFfn", seed: 0 });
});
