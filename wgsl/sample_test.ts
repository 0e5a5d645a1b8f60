import assert from "node:assert/strict";
import { PipelineCache } from "./kernel.ts";
import { assertPoisoned } from "../tests/util/close.ts";
import { GUARD_WORDS, poisoned, readAll, testGpu, upload } from "../tests/util/gpu.ts";
import { Rng } from "../tests/util/rng.ts";
import {
  ARGMAX,
  ARGMAX_NONFINITE,
  argmaxBindGroups,
  type ArgmaxConstants,
  argmaxVariants,
  encodeArgmax,
} from "./argmax.ts";
import {
  encodeSample,
  packSampleParams,
  packSampleState,
  SAMPLE,
  SAMPLE_NONE,
  SAMPLE_NONFINITE,
  sampleBindGroups,
  type SampleConstants,
  sampleHash,
  sampleMaskWords,
  type SampleParamValues,
  sampleStateWords,
  sampleUniform,
  sampleVariants,
} from "./sample.ts";

const POISON_U32 = 0xffffffff;
/** Chi-square checks pass at p >= 1e-4: a correct kernel fails one check in 10 000 runs. */
const CHI2_MIN_P = 1e-4;
/** A reference draw closer than this (in CDF units) to a boundary may go either way in f32: not checked. */
const DRAW_MARGIN = 2e-5;
/** The log-sum-exp's sum of up to 248k f32 terms, added per invocation and then in trees: relative error. */
const LSE_RTOL = 1e-4;
/** Small-vocabulary settings: 2 blocks, a 128-entry sort buffer, a 16-id history ring (wraps in tests). */
const SMALL: Omit<SampleConstants, "N_VOCAB"> = { K: 64, N_BLOCK: 2, WG: 64, BUF: 128, HIST: 16 };

type Knobs = Omit<SampleParamValues, "ringSlot" | "seedLo" | "seedHi"> & { seed: number };

/** Neutral chain (temperature 1, nothing cut, no penalties) to spread overrides over. */
const PLAIN: Knobs = {
  maskUnused: false,
  temperature: 1,
  topK: 0,
  topP: 1,
  minP: 0,
  repeatPenalty: 1,
  presencePenalty: 0,
  frequencyPenalty: 0,
  penaltyLastN: 0,
  seed: 1,
};

interface Job {
  c: SampleConstants;
  logits: Float32Array;
  knobs: Knobs;
  steps: number;
  history?: readonly number[];
  mask?: Uint32Array;
  /** Each step starts from the initial history with step counter j (a fixed penalty window per draw). */
  fixedWindow?: boolean;
}

interface Ran {
  ids: number[];
  next: number;
  state: Uint32Array;
  result: Uint32Array;
}

function seedHalves(seed: number): { seedLo: number; seedHi: number } {
  return { seedLo: seed >>> 0, seedHi: Math.floor(seed / 2 ** 32) >>> 0 };
}

/**
 * Runs every job's steps in one submission (one compute pass per step, ring slot j for step j) and reads
 * ring, next token, state and result back in one round.
 */
async function runJobs(jobs: readonly Job[]): Promise<Ran[]> {
  const { device } = await testGpu();
  const cache = new PipelineCache(device);
  const enc = device.createCommandEncoder();
  const made: { b: Record<string, GPUBuffer>; job: Job }[] = [];
  for (const job of jobs) {
    const c = job.c;
    const hist = job.history ?? [];
    const params = packSampleParams({ ...job.knobs, ...seedHalves(job.knobs.seed), ringSlot: 0 });
    const stateWords = sampleStateWords(c.HIST);
    const b: Record<string, GPUBuffer> = {
      logits: upload(device, job.logits),
      pairs: poisoned(device, 2 * (c.K + 1) * c.N_BLOCK, POISON_U32),
      result: poisoned(device, 2 * (c.K + 1), POISON_U32),
      params: upload(device, params),
      mask: upload(device, job.mask ?? new Uint32Array(Math.ceil(c.N_VOCAB / 32))),
      state: upload(device, packSampleState(c.HIST, { history: hist })),
      nextToken: poisoned(device, 1, POISON_U32),
      ring: poisoned(device, job.steps, POISON_U32),
      slots: upload(device, Uint32Array.from({ length: job.steps }, (_, j) => j)),
    };
    if (job.fixedWindow) {
      const init = new Uint32Array(stateWords * job.steps);
      for (let j = 0; j < job.steps; j++) {
        init.set(packSampleState(c.HIST, { step: j, history: hist }), j * stateWords);
      }
      b.inits = upload(device, init);
    }
    const v = sampleVariants(c);
    const pipelines = {
      partial: await cache.get(SAMPLE, v.partial),
      final: await cache.get(SAMPLE, v.final),
    };
    const bindGroups = sampleBindGroups(device, {
      pipelines,
      constants: c,
      buffers: b as Record<
        "logits" | "pairs" | "result" | "params" | "mask" | "state" | "nextToken" | "ring",
        GPUBuffer
      >,
    });
    for (let j = 0; j < job.steps; j++) {
      enc.copyBufferToBuffer(b.slots!, 4 * j, b.params!, 0, 4);
      if (b.inits) enc.copyBufferToBuffer(b.inits, 4 * stateWords * j, b.state!, 0, 4 * stateWords);
      const pass = enc.beginComputePass();
      encodeSample(pass, { pipelines, bindGroups, constants: c });
      pass.end();
    }
    made.push({ b, job });
  }
  device.queue.submit([enc.finish()]);
  const outs = await readAll(device, made.flatMap(({ b }) => [b.ring!, b.nextToken!, b.state!, b.result!]));
  return made.map(({ b, job }, i) => {
    const ring = new Uint32Array(outs[4 * i]!);
    const next = new Uint32Array(outs[4 * i + 1]!);
    assertPoisoned(ring.subarray(job.steps, job.steps + GUARD_WORDS), POISON_U32, "sample ring");
    assertPoisoned(next.subarray(1, 1 + GUARD_WORDS), POISON_U32, "sample next token");
    for (const buf of Object.values(b)) buf.destroy();
    return {
      ids: Array.from(ring.subarray(0, job.steps)),
      next: next[0]!,
      state: new Uint32Array(outs[4 * i + 2]!),
      result: new Uint32Array(outs[4 * i + 3]!),
    };
  });
}

/** What the chain keeps and draws at one step, in float64 from the llama.cpp formulas. */
interface RefStep {
  /** Kept ids, best first, and their weights at the temperature (greedy: one id). */
  kept: number[];
  weights: number[];
  /** The reference's id for this step's u, SAMPLE_NONE (no candidate) or SAMPLE_NONFINITE (NaN/+Inf row). */
  id: number;
  /** Whether f32 rounding could change the outcome (a draw or a cut close to its boundary). */
  ambiguous: boolean;
}

/** Penalised logits per llama.cpp's penalties sampler, rounded to f32 at each operation as the kernel. */
function refPenalise(logits: Float32Array, window: readonly number[], k: Knobs): Float32Array {
  const y = Float32Array.from(logits);
  const on = k.penaltyLastN > 0 &&
    (k.repeatPenalty !== 1 || k.presencePenalty !== 0 || k.frequencyPenalty !== 0);
  if (!on) return y;
  const counts = new Map<number, number>();
  for (const id of window) counts.set(id, (counts.get(id) ?? 0) + 1);
  const f = Math.fround;
  for (const [id, c] of counts) {
    const x = y[id]!;
    const r = x <= 0 ? f(x * f(k.repeatPenalty)) : f(x / f(k.repeatPenalty));
    y[id] = f(r - f(f(c * f(k.frequencyPenalty)) + f(k.presencePenalty)));
  }
  return y;
}

/** Plain-loop reference of one step of the chain (K-candidate cap included). */
function refStep(
  logits: Float32Array,
  k: Knobs,
  opts: { K: number; window: readonly number[]; step: number; mask?: Uint32Array },
): RefStep {
  // A NaN or +Inf anywhere in the row (masked ids included) refuses the row, as the argmax does.
  if (logits.some((x) => Number.isNaN(x) || x === Infinity)) {
    return { kept: [], weights: [], id: SAMPLE_NONFINITE, ambiguous: false };
  }
  const y = refPenalise(logits, opts.window, k);
  const masked = (id: number) =>
    k.maskUnused && opts.mask !== undefined && ((opts.mask[id >>> 5]! >>> (id & 31)) & 1) === 1;
  const all: number[] = [];
  for (let id = 0; id < y.length; id++) if (!masked(id)) all.push(id);
  all.sort((a, b) => y[b]! - y[a]! || a - b);
  const cand = all.slice(0, opts.K);
  if (cand.length === 0) return { kept: [], weights: [], id: SAMPLE_NONE, ambiguous: false };
  const x0 = y[cand[0]!]!;
  if (!(k.temperature > 0) || !Number.isFinite(x0)) {
    return { kept: [cand[0]!], weights: [1], id: cand[0]!, ambiguous: false };
  }
  let ambiguous = false;
  let keep = cand.length;
  if (k.topK > 0) keep = Math.min(keep, k.topK);
  if (k.topP < 1) {
    let mAll = -Infinity;
    for (const id of all) if (Number.isFinite(y[id]!)) mAll = Math.max(mAll, y[id]!);
    let sAll = 0;
    for (const id of all) if (Number.isFinite(y[id]!)) sAll += Math.exp(y[id]! - mAll);
    let norm = mAll + Math.log(sAll);
    if (k.topK > 0 && k.topK <= opts.K) {
      let s = 0;
      for (let i = 0; i < keep; i++) s += Math.exp(y[cand[i]!]! - x0);
      norm = x0 + Math.log(s);
    }
    let cum = 0;
    for (let i = 0; i < keep; i++) {
      cum += Math.exp(y[cand[i]!]! - norm);
      if (Math.abs(cum - k.topP) < 1e-5) ambiguous = true;
      if (cum >= k.topP) {
        keep = i + 1;
        break;
      }
    }
  }
  if (k.minP > 0) {
    const thr = x0 + Math.log(k.minP);
    let n = 1;
    while (n < keep && y[cand[n]!]! >= thr) {
      if (Math.abs(y[cand[n]!]! - thr) < 1e-5) ambiguous = true;
      n++;
    }
    if (n < keep && Math.abs(y[cand[n]!]! - thr) < 1e-5) ambiguous = true;
    keep = n;
  }
  const kept = cand.slice(0, keep);
  const weights = kept.map((id) => Math.exp((y[id]! - x0) / k.temperature));
  const total = weights.reduce((a, b) => a + b, 0);
  const { seedLo, seedHi } = seedHalves(k.seed);
  const u = sampleUniform(seedLo, seedHi, opts.step);
  let acc = 0;
  let id = kept[kept.length - 1]!;
  for (let i = 0; i < kept.length; i++) {
    acc += weights[i]!;
    if (Math.abs(acc / total - u) < DRAW_MARGIN) ambiguous = true;
    if (acc / total > u) {
      id = kept[i]!;
      break;
    }
  }
  return { kept, weights, id, ambiguous };
}

/** Upper tail of the chi-square distribution with `df` degrees of freedom at `x` (series of P(df/2, x/2)). */
function chi2Sf(x: number, df: number): number {
  const a = df / 2;
  const z = x / 2;
  let term = 1 / a;
  let sum = term;
  for (let n = 1; n < 10000 && term > 1e-17 * sum; n++) {
    term *= z / (a + n);
    sum += term;
  }
  return 1 - Math.exp(-z + a * Math.log(z) - lgamma(a)) * sum;
}

/** ln Γ(a) for a = df/2 (integers and half-integers). */
function lgamma(a: number): number {
  let r = a === Math.floor(a) ? 0 : Math.log(Math.sqrt(Math.PI));
  for (let t = a - 1; t > 0.25; t--) r += Math.log(t);
  return r;
}

/** Counts per id of `ids` over `n` ids. */
function histogram(ids: readonly number[], n: number): number[] {
  const h = new Array<number>(n).fill(0);
  for (const id of ids) {
    assert.ok(id < n, `drawn id ${id} is outside the vocabulary of ${n}`);
    h[id]!++;
  }
  return h;
}

/** Throws unless the counts fit the probabilities at p >= CHI2_MIN_P (every cell expects >= 5). */
function assertChiSquare(counts: readonly number[], probs: readonly number[], what: string): void {
  const n = counts.reduce((a, b) => a + b, 0);
  let x2 = 0;
  let df = -1;
  for (let i = 0; i < probs.length; i++) {
    const e = n * probs[i]!;
    if (e === 0) {
      assert.equal(counts[i], 0, `${what}: id ${i} has probability 0 but was drawn ${counts[i]} times`);
      continue;
    }
    assert.ok(e >= 5, `${what}: test design: id ${i} expects ${e} < 5 draws`);
    x2 += (counts[i]! - e) ** 2 / e;
    df++;
  }
  const p = chi2Sf(x2, df);
  assert.ok(
    p >= CHI2_MIN_P,
    `${what}: chi-square ${x2.toFixed(2)} with ${df} degrees of freedom has p = ${p.toExponential(2)} < ` +
      `${CHI2_MIN_P}; counts ${counts.join(",")}, expected ${probs.map((q) => (n * q).toFixed(1)).join(",")}`,
  );
}

function softmax(x: readonly number[], t = 1): number[] {
  const m = Math.max(...x.filter((v) => !Number.isNaN(v)));
  const w = x.map((v) => (Number.isNaN(v) ? 0 : Math.exp((v - m) / t)));
  const s = w.reduce((a, b) => a + b, 0);
  return w.map((v) => v / s);
}

Deno.test("sample: temperature 0 and top_k 1 pick the argmax id bit for bit; NaN or +Inf flag the row", async () => {
  const rng = new Rng();
  const { device } = await testGpu();
  const cache = new PipelineCache(device);
  type Bad = "nan" | "inf" | undefined;
  const shapes: { c: SampleConstants; ties: boolean; bad?: Bad; coarse?: boolean; flat?: boolean }[] = [
    // One logit per invocation: the bound from the invocations' maxima is exactly the K-th value.
    { c: { K: 64, WG: 128, BUF: 256, HIST: 16, N_BLOCK: 1, N_VOCAB: 128 }, ties: false },
    // A block of BUF equal logits: exactly BUF values pass the bound and fill the sort buffer.
    { c: { ...SMALL, N_VOCAB: 256 }, ties: false, flat: true },
    // Two values only: more ties at the bound than the sort buffer holds (the rounds fallback).
    { c: { ...SMALL, N_VOCAB: 1021, N_BLOCK: 3 }, ties: false, coarse: true },
    // The same with one NaN: the flag survives the rounds fallback.
    { c: { ...SMALL, N_VOCAB: 1021, N_BLOCK: 3 }, ties: false, coarse: true, bad: "nan" },
    { c: { ...SMALL, N_VOCAB: 8 }, ties: true },
    { c: { ...SMALL, N_VOCAB: 8 }, ties: false, bad: "inf" },
    { c: { ...SMALL, N_VOCAB: 1021, N_BLOCK: 7 }, ties: true, bad: "nan" },
    { c: { ...SMALL, N_VOCAB: 1021, N_BLOCK: 3 }, ties: false, bad: "nan" },
    { c: { ...SMALL, N_VOCAB: 1021, N_BLOCK: 3 }, ties: false, bad: "inf" },
    { c: { K: 64, N_BLOCK: 64, WG: 256, BUF: 2048, HIST: 256, N_VOCAB: 248320 }, ties: true },
    { c: { K: 64, N_BLOCK: 64, WG: 256, BUF: 2048, HIST: 256, N_VOCAB: 151936 }, ties: false, bad: "nan" },
    { c: { K: 64, N_BLOCK: 64, WG: 256, BUF: 2048, HIST: 256, N_VOCAB: 151936 }, ties: false, bad: "inf" },
    {
      c: { ...SMALL, N_VOCAB: rng.int(1, 5000), N_BLOCK: rng.int(1, 9) },
      ties: rng.float() < 0.5,
      bad: ([undefined, "nan", "inf"] as const)[rng.int(0, 3)],
    },
  ];
  const jobs: Job[] = [];
  const argmaxRuns: { c: ArgmaxConstants; b: Record<string, GPUBuffer> }[] = [];
  const enc = device.createCommandEncoder();
  const pass = enc.beginComputePass();
  for (const s of shapes) {
    const n = s.c.N_VOCAB;
    const logits = s.flat
      ? new Float32Array(n).fill(1.5)
      : s.coarse
      ? Float32Array.from({ length: n }, () => rng.int(0, 2) * 0.5)
      : s.ties
      ? Float32Array.from({ length: n }, () => rng.int(-6, 7) * 0.5)
      : rng.normals(n, 4);
    if (s.ties) logits[n - 1] = 3; // the maximum repeats, also in the last block
    if (n > 10) logits[rng.int(0, n)] = -Infinity;
    // One bad logit, anywhere (any block, first or last element included): the row is broken.
    if (s.bad) logits[rng.int(0, n)] = s.bad === "nan" ? NaN : Infinity;
    jobs.push({ c: s.c, logits, knobs: { ...PLAIN, temperature: 0 }, steps: 1 });
    jobs.push({ c: s.c, logits, knobs: { ...PLAIN, temperature: 1.5, topK: 1, seed: rng.u32() }, steps: 1 });
    const c: ArgmaxConstants = { N_VOCAB: n, N_BLOCK: s.c.N_BLOCK, WG: 64, WRITE_IDS: true };
    const b = {
      logits: upload(device, logits),
      pairs: poisoned(device, 2 * c.N_BLOCK, POISON_U32),
      result: poisoned(device, 2, POISON_U32),
      params: upload(device, Uint32Array.of(0)),
      nextToken: poisoned(device, 1, POISON_U32),
      ring: poisoned(device, 1, POISON_U32),
    };
    const v = argmaxVariants(c);
    const pipelines = {
      partial: await cache.get(ARGMAX, v.partial),
      final: await cache.get(ARGMAX, v.final),
    };
    encodeArgmax(pass, {
      pipelines,
      bindGroups: argmaxBindGroups(device, { pipelines, constants: c, buffers: b }),
      constants: c,
    });
    argmaxRuns.push({ c, b });
  }
  // All-tie and all -inf rows: the lowest id.
  for (const fill of [2.5, -Infinity]) {
    jobs.push({
      c: { ...SMALL, N_VOCAB: 300 },
      logits: new Float32Array(300).fill(fill),
      knobs: { ...PLAIN, temperature: 0 },
      steps: 1,
    });
    jobs.push({
      c: { ...SMALL, N_VOCAB: 300 },
      logits: new Float32Array(300).fill(fill),
      knobs: { ...PLAIN, topK: 1 },
      steps: 1,
    });
  }
  pass.end();
  device.queue.submit([enc.finish()]);
  const argmaxIds = (await readAll(device, argmaxRuns.map((r) => r.b.ring!))).map((a) =>
    new Uint32Array(a)[0]!
  );
  for (const r of argmaxRuns) for (const buf of Object.values(r.b)) buf.destroy();
  const ran = await runJobs(jobs);
  shapes.forEach((s, i) => {
    const what =
      `sample N_VOCAB=${s.c.N_VOCAB} N_BLOCK=${s.c.N_BLOCK} ties=${s.ties} bad=${s.bad} (seed ${rng.seed})`;
    const greedy = ran[2 * i]!;
    const top1 = ran[2 * i + 1]!;
    const logits = jobs[2 * i]!.logits;
    // The float64 reference: the best id, or NONFINITE for a row with a NaN or +Inf.
    const ref = refStep(logits, { ...PLAIN, temperature: 0 }, { K: 64, window: [], step: 0 });
    assert.equal(ref.id === SAMPLE_NONFINITE, s.bad !== undefined, `${what}: test design: bad row`);
    assert.equal(SAMPLE_NONFINITE, ARGMAX_NONFINITE, "one code for a broken row");
    assert.equal(argmaxIds[i], ref.id, `${what}: argmax vs reference`);
    assert.equal(greedy.ids[0], ref.id, `${what}: temperature 0 vs reference and argmax`);
    assert.equal(greedy.next, ref.id, `${what}: next token`);
    assert.equal(top1.ids[0], ref.id, `${what}: top_k 1 vs reference and argmax`);
    assert.equal(greedy.result[1], ref.id, `${what}: result[0] id`);
    if (s.bad) {
      // Refused: the step advances (the RNG stream stays aligned), nothing joins the penalty history.
      assert.deepEqual(Array.from(greedy.state.subarray(0, 2)), [1, 0], `${what}: state step, count`);
      assert.deepEqual(Array.from(top1.state.subarray(0, 2)), [1, 0], `${what}: top_k 1 state step, count`);
    } else {
      // The final candidates are the reference's K best (value bits and ids), then the log-sum-exp pair.
      const order = Array.from(logits.keys()).sort((a, b) => logits[b]! - logits[a]! || a - b).slice(0, 64);
      const got = Array.from({ length: 64 }, (_, k) => greedy.result[2 * k + 1]!);
      const want = [...order, ...new Array<number>(64 - order.length).fill(SAMPLE_NONE)];
      assert.deepEqual(got, want, `${what}: the 64 candidates`);
      assert.deepEqual(
        Array.from(greedy.state.subarray(0, 3)),
        [1, 1, ref.id],
        `${what}: state step, count, hist[0]`,
      );
    }
    // Then the whole vocabulary's log-sum-exp as (max m, sum of exp(x - m)) over the finite logits.
    const finite = Array.from(logits).filter((x) => Number.isFinite(x));
    const m = finite.reduce((a, x) => Math.max(a, x), -Infinity);
    const sum = finite.reduce((a, x) => a + Math.exp(x - m), 0);
    const lse = new Float32Array(greedy.result.buffer, 4 * 2 * 64, 2);
    assert.equal(lse[0], m, `${what}: log-sum-exp max`);
    assert.ok(Math.abs(lse[1]! - sum) <= LSE_RTOL * sum, `${what}: log-sum-exp sum ${lse[1]} vs ${sum}`);
    assertPoisoned(greedy.result.subarray(2 * 65, 2 * 65 + GUARD_WORDS), POISON_U32, `${what} result`);
  });
  for (let j = 0; j < 4; j++) {
    assert.equal(ran[2 * shapes.length + j]!.ids[0], 0, `uniform rows, case ${j}: lowest id`);
  }
});

Deno.test("sample: each draw matches the float64 chain (penalties, wrapping history, cuts)", async () => {
  const rng = new Rng();
  const V = 1000;
  const c: SampleConstants = { ...SMALL, N_VOCAB: V, N_BLOCK: 4 };
  const logits = rng.normals(V, 1.5);
  // A cluster of near-top logits so that the penalties reorder the leaders and the cuts bite.
  for (let i = 0; i < 12; i++) logits[rng.int(0, V)] = 4 + rng.float();
  const history = Array.from({ length: 20 }, () => rng.int(0, V));
  const seed = rng.u32() + 2 ** 32 * rng.int(0, 1000);
  const configs: Knobs[] = [
    {
      ...PLAIN,
      seed,
      temperature: 0.8,
      topP: 0.9,
      minP: 0.02,
      repeatPenalty: 1.3,
      presencePenalty: 0.5,
      frequencyPenalty: 0.3,
      penaltyLastN: 12,
    },
    { ...PLAIN, seed, temperature: 1.2, topK: 40, topP: 0.8, repeatPenalty: 0.8, penaltyLastN: 16 },
    { ...PLAIN, seed, temperature: 0.6, topK: 20, minP: 0.1, presencePenalty: -0.5, penaltyLastN: 5 },
    { ...PLAIN, seed, temperature: 2 },
    { ...PLAIN, seed, temperature: 0, repeatPenalty: 1.5, frequencyPenalty: 1, penaltyLastN: 16 },
  ];
  const steps = 150;
  const jobs: Job[] = configs.map((knobs) => ({ c, logits, knobs, steps, history }));
  jobs.push({ c, logits, knobs: configs[0]!, steps, history }); // same seed: same ids
  jobs.push({ c, logits, knobs: { ...configs[0]!, seed: seed + 1 }, steps, history }); // another seed
  const ran = await runJobs(jobs);
  configs.forEach((k, ci) => {
    const what = `config ${ci} (seed ${rng.seed})`;
    const seen = [...history];
    let ambiguous = 0;
    for (let t = 0; t < steps; t++) {
      const window = seen.slice(Math.max(0, seen.length - Math.min(k.penaltyLastN, c.HIST)));
      const ref = refStep(logits, k, { K: c.K, window, step: t });
      const got = ran[ci]!.ids[t]!;
      if (ref.ambiguous) {
        ambiguous++;
        assert.ok(
          ref.kept.includes(got) || got === ref.id,
          `${what} step ${t}: id ${got} is not a candidate`,
        );
      } else {
        assert.equal(got, ref.id, `${what} step ${t}: kept ${ref.kept.join(",")}`);
      }
      seen.push(got);
    }
    assert.ok(ambiguous < steps / 20, `${what}: ${ambiguous} of ${steps} draws were too close to call`);
    const st = ran[ci]!.state;
    assert.equal(st[0], steps, `${what}: step counter`);
    assert.equal(st[1], history.length + steps, `${what}: history count`);
    for (let k2 = seen.length - c.HIST; k2 < seen.length; k2++) {
      assert.equal(st[2 + (k2 % c.HIST)], seen[k2], `${what}: history ring entry ${k2}`);
    }
    assert.equal(ran[ci]!.next, seen[seen.length - 1], `${what}: next token is the last id`);
  });
  assert.deepEqual(ran[5]!.ids, ran[0]!.ids, `same seed, same ids (seed ${rng.seed})`);
  assert.notDeepEqual(ran[6]!.ids, ran[0]!.ids, `another seed, other ids (seed ${rng.seed})`);
  assert.ok(new Set(ran[3]!.ids).size > 20, `temperature 2 draws spread out (seed ${rng.seed})`);
});

Deno.test("sample: chi-square fit of draws to the softmax (temperature 1, 0.6, penalties)", async () => {
  const rng = new Rng();
  const c: SampleConstants = { ...SMALL, N_VOCAB: 8 };
  const logits = Float32Array.of(1.0, 0.2, -0.3, 0.7, -1.0, 0.0, 0.4, -0.6);
  const n = 2000;
  // Penalties with a fixed window: ids 0 (twice), 3 and 4; llama.cpp: y = (x <= 0 ? x*r : x/r) - (c*f + p).
  const window = [0, 3, 0, 4];
  const r = 1.5, f = 0.25, p = 0.3;
  const penalised = Array.from(logits, (x, id) => {
    const cnt = window.filter((w) => w === id).length;
    if (cnt === 0) return x;
    return (x <= 0 ? x * r : x / r) - (cnt * f + p);
  });
  const jobs: Job[] = [
    { c, logits, knobs: { ...PLAIN, seed: rng.u32() }, steps: n },
    { c, logits, knobs: { ...PLAIN, temperature: 0.6, seed: rng.u32() }, steps: n },
    {
      c,
      logits,
      knobs: {
        ...PLAIN,
        seed: rng.u32(),
        repeatPenalty: r,
        frequencyPenalty: f,
        presencePenalty: p,
        penaltyLastN: 4,
      },
      steps: n,
      history: [5, 6, ...window],
      fixedWindow: true,
    },
  ];
  const ran = await runJobs(jobs);
  const x = Array.from(logits);
  assertChiSquare(histogram(ran[0]!.ids, 8), softmax(x), `temperature 1 (seed ${rng.seed})`);
  assertChiSquare(histogram(ran[1]!.ids, 8), softmax(x, 0.6), `temperature 0.6 (seed ${rng.seed})`);
  assertChiSquare(histogram(ran[2]!.ids, 8), softmax(penalised), `penalties (seed ${rng.seed})`);
});

Deno.test("sample: top_k, top_p, min_p and the mask keep exactly their ids; NaN or +Inf flag the row", async () => {
  const rng = new Rng();
  const c: SampleConstants = { ...SMALL, N_VOCAB: 8 };
  // Probabilities 0.4 0.25 0.15 0.1 0.05 0.03 0.015 0.005 (ids shuffled so order is not id order).
  const probs = [0.1, 0.015, 0.4, 0.05, 0.25, 0.005, 0.15, 0.03];
  const logits = Float32Array.from(probs, (q) => Math.log(q));
  const byRank = [2, 4, 6, 0, 3, 7, 1, 5];
  const n = 600;
  const mask = sampleMaskWords(8, (id) => id === 4 || id === 0);
  const cases: { knobs: Partial<Knobs>; keep: number[]; mask?: Uint32Array }[] = [
    { knobs: { topK: 3 }, keep: byRank.slice(0, 3) },
    // Whole-vocabulary normaliser: 0.4 + 0.25 = 0.65 < 0.7 <= 0.8: three ids, the crossing one included.
    { knobs: { topP: 0.7 }, keep: byRank.slice(0, 3) },
    // Within top_k 4 (mass 0.9): 0.4/0.9 + 0.25/0.9 = 0.722 >= 0.7: two ids.
    { knobs: { topK: 4, topP: 0.7 }, keep: byRank.slice(0, 2) },
    // p >= 0.2 * 0.4 = 0.08 keeps 0.4 0.25 0.15 0.1.
    { knobs: { minP: 0.2 }, keep: byRank.slice(0, 4) },
    // Tight both ways: 0.24 * 0.4 = 0.096 keeps 0.1; 0.26 * 0.4 = 0.104 drops it.
    { knobs: { minP: 0.24 }, keep: byRank.slice(0, 4) },
    { knobs: { minP: 0.26 }, keep: byRank.slice(0, 3) },
    { knobs: { topK: 5, topP: 0.95, minP: 0.5 }, keep: byRank.slice(0, 2) },
    { knobs: { temperature: 3, maskUnused: true }, keep: byRank.filter((id) => id !== 4 && id !== 0), mask },
    { knobs: { temperature: 0, maskUnused: true }, keep: [2], mask: sampleMaskWords(8, (id) => id === 4) },
    {
      knobs: { temperature: 0, maskUnused: true },
      keep: [6],
      mask: sampleMaskWords(8, (id) => id === 2 || id === 4),
    },
    { knobs: { temperature: 0, maskUnused: false }, keep: [2], mask: sampleMaskWords(8, (id) => id === 2) },
  ];
  const jobs: Job[] = cases.map((k) => ({
    c,
    logits,
    knobs: { ...PLAIN, ...k.knobs, seed: rng.u32() },
    steps: k.knobs.temperature === 0 ? 4 : n,
    mask: k.mask,
  }));
  // Rows that are refused (NONFINITE at every step, whatever the chain) or have no candidate (NONE).
  const withBad = (at: number, v: number) => {
    const x = Float32Array.from(logits);
    x[at] = v;
    return x;
  };
  type Refused = {
    what: string;
    logits: Float32Array;
    knobs: Partial<Knobs>;
    mask?: Uint32Array;
    history?: number[];
  };
  const refused: Refused[] = [
    { what: "NaN at the best id", logits: withBad(2, NaN), knobs: { temperature: 3 } },
    { what: "NaN at the worst id", logits: withBad(5, NaN), knobs: { temperature: 0.7, topK: 3 } },
    { what: "+Inf", logits: withBad(7, Infinity), knobs: { temperature: 1, topP: 0.9, minP: 0.05 } },
    {
      what: "NaN on a penalised id",
      logits: withBad(0, NaN),
      knobs: { repeatPenalty: 1.3, penaltyLastN: 4 },
      history: [0, 3],
    },
    {
      what: "NaN on a masked id",
      logits: withBad(4, NaN),
      knobs: { maskUnused: true },
      mask: sampleMaskWords(8, (id) => id === 4),
    },
    { what: "every logit NaN", logits: new Float32Array(8).fill(NaN), knobs: {} },
  ];
  for (const r of refused) {
    const knobs = { ...PLAIN, ...r.knobs, seed: rng.u32() };
    jobs.push({ c, logits: r.logits, knobs, steps: 3, mask: r.mask, history: r.history });
  }
  jobs.push({
    c,
    logits: logits,
    knobs: { ...PLAIN, maskUnused: true },
    steps: 3,
    mask: sampleMaskWords(8, () => true),
  });
  const ran = await runJobs(jobs);
  cases.forEach((k, i) => {
    const what = `case ${i} ${JSON.stringify(k.knobs)} (seed ${rng.seed})`;
    const drawn = [...new Set(ran[i]!.ids)].sort((a, b) => a - b);
    assert.deepEqual(drawn, [...k.keep].sort((a, b) => a - b), `${what}: ids drawn`);
  });
  refused.forEach((r, i) => {
    const got = ran[cases.length + i]!;
    const what = `${r.what} (seed ${rng.seed})`;
    const want = Array.from(
      { length: 3 },
      (_, t) =>
        refStep(r.logits, { ...PLAIN, ...r.knobs }, { K: 64, window: r.history ?? [], step: t, mask: r.mask })
          .id,
    );
    assert.deepEqual(want, [SAMPLE_NONFINITE, SAMPLE_NONFINITE, SAMPLE_NONFINITE], `${what}: reference`);
    assert.deepEqual(got.ids, want, `${what}: every step flags the row`);
    assert.equal(got.next, SAMPLE_NONFINITE, `${what}: next token`);
    assert.equal(got.result[1], SAMPLE_NONFINITE, `${what}: result[0] id`);
    const count = r.history?.length ?? 0;
    assert.deepEqual(
      Array.from(got.state.subarray(0, 2)),
      [3, count],
      `${what}: step advances, nothing appended`,
    );
  });
  const none = ran[cases.length + refused.length]!;
  assert.deepEqual(
    none.ids,
    [SAMPLE_NONE, SAMPLE_NONE, SAMPLE_NONE],
    `no candidate: NONE (seed ${rng.seed})`,
  );
  assert.deepEqual(
    Array.from(none.state.subarray(0, 2)),
    [3, 0],
    `no candidate: step advances, nothing appended`,
  );
});

Deno.test("sample: RNG hash is a per-seed bijection of the step, twin and kernel agree", async () => {
  // Distinct steps give distinct hashes (mix32 and xor with constants are bijections).
  const seen = new Set<number>();
  for (let s = 0; s < 5000; s++) seen.add(sampleHash(7, 9, s));
  assert.equal(seen.size, 5000);
  assert.notEqual(sampleHash(7, 9, 0), sampleHash(7, 10, 0));
  assert.notEqual(sampleHash(7, 9, 0), sampleHash(8, 9, 0));
  // The kernel's draws over two equal logits follow u < 0.5 exactly (no rounding near the boundary).
  const c: SampleConstants = { ...SMALL, N_VOCAB: 2, N_BLOCK: 1 };
  const seed = 0x1234_5678_9abc;
  const ran = await runJobs([{ c, logits: Float32Array.of(0, 0), knobs: { ...PLAIN, seed }, steps: 64 }]);
  const { seedLo, seedHi } = seedHalves(seed);
  const want = Array.from({ length: 64 }, (_, t) => (sampleUniform(seedLo, seedHi, t) < 0.5 ? 0 : 1));
  assert.deepEqual(ran[0]!.ids, want);
});

Deno.test("sample shape checks throw before encoding", async () => {
  const { device } = await testGpu();
  const c: SampleConstants = { ...SMALL, N_VOCAB: 1021 };
  const v = sampleVariants(c);
  const cache = new PipelineCache(device);
  const pipelines = { partial: await cache.get(SAMPLE, v.partial), final: await cache.get(SAMPLE, v.final) };
  const small = device.createBuffer({ size: 64, usage: GPUBufferUsage.STORAGE });
  const big = device.createBuffer({ size: 8192, usage: GPUBufferUsage.STORAGE });
  const buffers = {
    logits: big,
    pairs: small,
    result: big,
    params: small,
    mask: small,
    state: big,
    nextToken: small,
    ring: small,
  };
  assert.throws(
    () => sampleBindGroups(device, { pipelines, constants: c, buffers }),
    /binding pairs holds 64 bytes but ne=\[2, 65, 2\]/,
  );
  assert.throws(() => sampleVariants({ ...c, K: 65 }), /K must be an integer in \[1, 64\], got 65/);
  assert.throws(() => sampleVariants({ ...c, BUF: 64 }), /BUF must be a power of two >= 2K/);
  assert.throws(() => sampleVariants({ ...c, HIST: 100 }), /HIST must be a power of two/);
  assert.throws(() => sampleVariants({ ...c, WG: 32 }), /WG must lie in \[K, BUF\] = \[64, 128\]/);
  assert.throws(() => sampleVariants({ ...c, N_VOCAB: 248320, N_BLOCK: 4 }), /raise N_BLOCK to at least 8/);
  small.destroy();
  big.destroy();
});
