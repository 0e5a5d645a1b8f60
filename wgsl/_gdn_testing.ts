/**
 * Shared fixtures of the gated DeltaNet kernel tests (gdn_step, gdn_chunk): test models, random inputs and the
 * float64 reference of a whole layer's core from the in-projection outputs to ô.
 * @module
 */
import { PipelineCache } from "./kernel.ts";
import { GUARD_WORDS, POISON_F32, readAll, testGpu, upload } from "../tests/util/gpu.ts";
import type { Rng } from "../tests/util/rng.ts";
import {
  conv1dStep,
  deltaNetChunked,
  deltaNetStep,
  l2Norm,
  rmsNormGated,
  sigmoid,
  silu,
  softplus,
} from "../tests/ref/ops.ts";
import { GDN_ONE_COLUMN, gdnDims, type GdnStepConstants } from "./gdn_step.ts";

/** RMS eps and L2-norm floor of the test models. */
export const EPS = 1e-6;

/** A test model: a name and the kernel constants. */
export interface Model {
  readonly name: string;
  readonly c: GdnStepConstants;
}

function model(name: string, nK: number, nV: number, d: number, tiled: boolean): Model {
  return {
    name,
    // qwen3next (grouped κ) also takes its b/a in the raw ssm_ba layout, so both gathers are covered.
    c: {
      N_K: nK,
      N_V: nV,
      D_K: d,
      D_V: d,
      K_CONV: 4,
      EPS,
      KAPPA_TILED: tiled,
      BA_GROUPED: !tiled,
      A_OFF: 0,
      SPLIT: 1,
      ...GDN_ONE_COLUMN,
    },
  };
}

export const TINY_NEXT = model("tiny qwen3next", 2, 4, 128, false);
export const TINY_35 = model("tiny qwen35moe", 2, 4, 128, true);
export const REAL_NEXT = model("real qwen3next", 16, 32, 128, false);
export const REAL_35 = model("real qwen35moe", 16, 32, 128, true);
// Awkward shapes inside the limits: D_K = 256 with one column group (D_V = 16; gdn_step: 3 local channels per
// invocation, 2·256 + 16 > 512), and D_V < D_K with three column groups; a 2- and a 3-slot ring.
export const ODD_A: Model = {
  name: "odd dims A",
  c: {
    N_K: 1,
    N_V: 2,
    D_K: 256,
    D_V: 16,
    K_CONV: 2,
    EPS,
    KAPPA_TILED: false,
    BA_GROUPED: true,
    A_OFF: 0,
    SPLIT: 1,
    ...GDN_ONE_COLUMN,
  },
};
export const ODD_B: Model = {
  name: "odd dims B",
  c: {
    N_K: 3,
    N_V: 6,
    D_K: 64,
    D_V: 48,
    K_CONV: 3,
    EPS,
    KAPPA_TILED: true,
    BA_GROUPED: false,
    A_OFF: 0,
    SPLIT: 1,
    ...GDN_ONE_COLUMN,
  },
};

/** Inputs of a whole token sequence, f32 as the kernels read them. */
export interface Inputs {
  readonly m: Model;
  readonly nTokens: number;
  readonly pos0: number;
  readonly x: Float32Array; // ne=[C, T]
  readonly z: Float32Array; // ne=[nV·dV, T]
  readonly b: Float32Array; // ne=[nV, T], or ne=[2nV, T] (ssm_ba) when grouped
  readonly a: Float32Array; // like b; the same array when grouped
  readonly convW: Float32Array;
  readonly dtBias: Float32Array;
  readonly ssmA: Float32Array;
  readonly normW: Float32Array;
  readonly hist: Float32Array; // the K-1 inputs before pos0, oldest first, ne=[C, K-1]
  readonly s0: Float32Array; // ne=[dK, dV, nV]
}

/** Fresh random inputs (a zero history and state when `fresh`). */
export function makeInputs(
  rng: Rng,
  m: Model,
  opts: { nTokens: number; pos0: number; fresh: boolean },
): Inputs {
  const c = m.c;
  const d = gdnDims(c);
  const T = opts.nTokens;
  const baW = c.BA_GROUPED ? 2 * c.N_V : c.N_V;
  const b = rng.normals(baW * T);
  const ssmA = new Float32Array(c.N_V);
  // Decays from ~0.2 to ~0.99 per token: old state both fades and persists, and across a 64-token block e^G
  // spans from 1 down to underflow.
  for (let h = 0; h < c.N_V; h++) ssmA[h] = -Math.exp(rng.normal() - 1.5);
  const normW = new Float32Array(c.D_V);
  for (let j = 0; j < c.D_V; j++) normW[j] = 1 + 0.2 * rng.normal();
  return {
    m,
    nTokens: T,
    pos0: opts.pos0,
    x: rng.normals(d.convCh * T),
    z: rng.normals(d.inner * T),
    b,
    a: c.BA_GROUPED ? b : rng.normals(baW * T),
    convW: rng.normals(c.K_CONV * d.convCh, 0.5),
    dtBias: rng.normals(c.N_V),
    ssmA,
    normW,
    hist: opts.fresh ? new Float32Array(d.convCh * (c.K_CONV - 1)) : rng.normals(d.convCh * (c.K_CONV - 1)),
    s0: opts.fresh ? new Float32Array(d.state) : rng.normals(d.state, 0.3),
  };
}

/** A cut dispatch's taps (gdn_chunk's cut): the state and the conv ring after its first `cut` tokens. */
export interface Tap {
  readonly cut: number;
  readonly state: Float32Array; // ne=[dK, dV, nV]
  readonly ring: Float32Array; // the whole ring, ne=[C, K]
}

/** Outputs of a run: y, the final state, the conv history (and the taps of its cut dispatches, in order). */
export interface Result {
  readonly y: Float64Array | Float32Array; // ne=[nV·dV, T]
  readonly state: Float64Array | Float32Array;
  readonly hist: Float64Array | Float32Array; // last K-1 inputs, oldest first
  readonly taps?: readonly Tap[];
}

/** The first `nTokens` tokens of `inp` (same position, history, state and weights). */
export function prefixInputs(inp: Inputs, nTokens: number): Inputs {
  const c = inp.m.c;
  const d = gdnDims(c);
  const baW = c.BA_GROUPED ? 2 * c.N_V : c.N_V;
  const b = inp.b.slice(0, baW * nTokens);
  return {
    ...inp,
    nTokens,
    x: inp.x.slice(0, d.convCh * nTokens),
    z: inp.z.slice(0, d.inner * nTokens),
    b,
    a: c.BA_GROUPED ? b : inp.a.slice(0, baW * nTokens),
  };
}

/**
 * The last K-1 inputs a conv ring holds when the next position is `end`, oldest first (slot s holds the
 * positions ≡ s mod K): the `hist` of a {@linkcode Result}.
 */
export function ringHist(ring: Float32Array, end: number, m: Model): Float32Array {
  const { convCh } = gdnDims(m.c);
  const K = m.c.K_CONV;
  const hist = new Float32Array(convCh * (K - 1));
  for (let k = 0; k < K - 1; k++) {
    const slot = (end - (K - 1) + k + K) % K;
    hist.set(ring.subarray(slot * convCh, (slot + 1) * convCh), k * convCh);
  }
  return hist;
}

/**
 * Float64 reference from tests/ref/ops.ts from `hist` and `s0`: token by token (spec §8.5) or in the chunked
 * form (§8.6).
 */
export function reference(inp: Inputs, core: "recurrent" | "chunked" = "recurrent"): Result {
  const c = inp.m.c;
  const { convCh, inner } = gdnDims(c);
  const T = inp.nTokens;
  const conv = conv1dStep(inp.x, { state: inp.hist, w: inp.convW, nCh: convCh });
  const qkLen = c.N_K * c.D_K;
  const q = new Float64Array(qkLen * T);
  const k = new Float64Array(qkLen * T);
  const v = new Float64Array(inner * T);
  for (let t = 0; t < T; t++) {
    const at = t * convCh;
    for (let i = 0; i < qkLen; i++) {
      q[t * qkLen + i] = silu(conv.y[at + i]!);
      k[t * qkLen + i] = silu(conv.y[at + qkLen + i]!);
    }
    for (let i = 0; i < inner; i++) v[t * inner + i] = silu(conv.y[at + 2 * qkLen + i]!);
  }
  const beta = new Float64Array(c.N_V * T);
  const g = new Float64Array(c.N_V * T);
  const r = c.N_V / c.N_K;
  for (let t = 0; t < T; t++) {
    for (let h = 0; h < c.N_V; h++) {
      let bv: number, av: number;
      if (c.BA_GROUPED) { // spec §8.1: group κ = [b_{rκ} … | a_{rκ} …]
        const u0 = t * 2 * c.N_V + 2 * r * Math.floor(h / r) + (h % r);
        bv = inp.b[u0]!;
        av = inp.b[u0 + r]!;
      } else {
        bv = inp.b[t * c.N_V + h]!;
        av = inp.a[t * c.N_V + h]!;
      }
      beta[t * c.N_V + h] = sigmoid(bv);
      g[t * c.N_V + h] = inp.ssmA[h]! * softplus(av + inp.dtBias[h]!);
    }
  }
  const dn = (core === "chunked" ? deltaNetChunked : deltaNetStep)(inp.s0, {
    dK: c.D_K,
    dV: c.D_V,
    nK: c.N_K,
    nV: c.N_V,
    kHeadOf: c.KAPPA_TILED ? (h) => h % c.N_K : (h) => Math.floor(h / r),
    q: l2Norm(q, { eps: EPS, n: c.D_K }),
    k: l2Norm(k, { eps: EPS, n: c.D_K }),
    v,
    beta,
    g,
  });
  return {
    y: rmsNormGated(dn.o, inp.normW, { z: inp.z, eps: EPS, n: c.D_V }),
    state: dn.state,
    hist: conv.state,
  };
}

/** What a test's `record` returns: buffers to read back and how to turn their bytes into a result. */
export interface Recorded {
  readonly read: GPUBuffer[];
  readonly decode: (bufs: ArrayBuffer[]) => Result;
}

/** Records one run's dispatches into `pass` (buffers it creates go to `owned`). */
export type RecordRun<S> = (
  device: GPUDevice,
  cache: PipelineCache,
  pass: GPUComputePassEncoder,
  inp: Inputs,
  schedule: S,
  owned: GPUBuffer[],
) => Promise<Recorded>;

/** Runs all `runs` in one compute pass and one readback round; returns their results in order. */
export async function runAll<S>(
  runs: readonly { readonly inp: Inputs; readonly schedule: S }[],
  record: RecordRun<S>,
): Promise<Result[]> {
  const { device } = await testGpu();
  const cache = new PipelineCache(device);
  const owned: GPUBuffer[] = [];
  const enc = device.createCommandEncoder();
  const pass = enc.beginComputePass();
  const recs: Recorded[] = [];
  for (const r of runs) recs.push(await record(device, cache, pass, r.inp, r.schedule, owned));
  pass.end();
  device.queue.submit([enc.finish()]);
  const bufs = await readAll(device, recs.flatMap((r) => r.read));
  const out: Result[] = [];
  let at = 0;
  for (const r of recs) {
    out.push(r.decode(bufs.slice(at, at + r.read.length)));
    at += r.read.length;
  }
  owned.forEach((b) => b.destroy());
  return out;
}

/**
 * Uploads a run's layer buffers (into `owned`): the conv ring holding `hist` in the slots of positions
 * pos0-K+1..pos0-1 (slot s holds position ≡ s mod K; the one slot with no live position is poisoned, so a read
 * of it turns everything NaN), the incoming state, and the weights. Ring and state carry poisoned guard words.
 */
export function uploadLayer(device: GPUDevice, inp: Inputs, owned: GPUBuffer[]) {
  const d = gdnDims(inp.m.c);
  const K = inp.m.c.K_CONV;
  const mk = (buf: GPUBuffer) => (owned.push(buf), buf);
  const ring0 = new Uint32Array(d.convRing + GUARD_WORDS).fill(POISON_F32);
  const ring0f = new Float32Array(ring0.buffer);
  for (let k = 0; k < K - 1; k++) {
    const slot = (inp.pos0 - (K - 1) + k + K * 4) % K;
    ring0f.set(inp.hist.subarray(k * d.convCh, (k + 1) * d.convCh), slot * d.convCh);
  }
  const st0 = new Uint32Array(d.state + GUARD_WORDS).fill(POISON_F32);
  new Float32Array(st0.buffer).set(inp.s0);
  return {
    ring: mk(upload(device, ring0, "conv_ring")),
    state: mk(upload(device, st0, "state")),
    convW: mk(upload(device, inp.convW)),
    dtBias: mk(upload(device, inp.dtBias)),
    ssmA: mk(upload(device, inp.ssmA)),
    normW: mk(upload(device, inp.normW)),
  };
}
