import assert from "node:assert/strict";
import { PipelineCache } from "./kernel.ts";
import { assertClose, assertPoisoned, type Tolerance } from "../tests/util/close.ts";
import { POISON_F32, poisoned, testGpu, upload } from "../tests/util/gpu.ts";
import { Rng } from "../tests/util/rng.ts";
import {
  checkGdnChunk,
  encodeGdnChunk,
  gdnChunkBlocks,
  gdnChunkDispatches,
  gdnChunkMaxBlocks,
  type GdnChunkScan,
  gdnChunkScan,
  type GdnChunkScratch,
  gdnChunkScratchBytes,
  packGdnChunkParams,
  prepareGdnChunk,
} from "./gdn_chunk.ts";
import { encodeGdnStep, GDN_STEP, gdnDims, type GdnStepBindings, packGdnParams } from "./gdn_step.ts";
import { encodeGdnConvRing, GDN_CONV_RING, GDN_CONV_RING_TAP } from "./gdn_conv_ring.ts";
import {
  type Inputs,
  makeInputs,
  type Model,
  ODD_A,
  ODD_B,
  prefixInputs,
  REAL_35,
  REAL_NEXT,
  reference,
  type Result,
  ringHist,
  runAll,
  type Tap,
  TINY_35,
  TINY_NEXT,
  uploadLayer,
} from "./_gdn_testing.ts";

// The same tolerances as gdn_step_test. ô is O(1) after the RMSNorm (|ô| up to ~10 with silu(z)); the chunked
// form sums in another order than the recurrence (128-long dots, 64-long substitutions and intra-block sums of
// O(1) terms, the state carried over blocks). Seen on lavapipe over seeds: |y err| <= 1.6e-5, at most 0.16 of
// this tolerance (gdn_step on the same inputs: up to 1.0e-5, 0.12 of it); tight enough to see a dropped term.
const Y_TOL: Tolerance = { atol: 3e-5, rtol: 3e-4 };
// The state is O(1) (|k̂| = 1, |V'| ≲ |v| + |S k̂|); same f32 accumulation argument as ô. Seen: <= 1.5e-6, at
// most 0.01 of this tolerance (gdn_step: up to 2.2e-6).
const S_TOL: Tolerance = { atol: 3e-5, rtol: 3e-4 };
// The ring holds copies of the f32 inputs: exact.
const RING_TOL: Tolerance = { atol: 0, rtol: 0 };

/**
 * One dispatch of a schedule: `n` tokens through the chunked kernels (scan shape `scan`), or `gdn_step`. A
 * chunk's `cut` is its params word 2 as written (0 by default); with 0 < cut < n the dispatch also gets a
 * poisoned state tap and records `gdn_conv_ring_tap` (into a poisoned ring tap) before its ring update.
 * `unrolled`: the prep's written-out forward substitution (COMPACT_SOLVE false, what GPUs run); by default the
 * loops, as the engine takes on this CPU adapter: written out, each variant costs lavapipe about 30 s of
 * compile (docs/PERF.md), so one test runs that form.
 */
interface Part {
  readonly n: number;
  readonly kernel: "chunk" | "step";
  readonly scan?: GdnChunkScan;
  readonly cut?: number;
  readonly unrolled?: boolean;
}

const chunks = (...ns: number[]): Part[] => ns.map((n) => ({ n, kernel: "chunk" }));

/** Records `inp` as the dispatches of `schedule`; returns the readback buffers and their decoder. */
async function record(
  device: GPUDevice,
  cache: PipelineCache,
  pass: GPUComputePassEncoder,
  inp: Inputs,
  schedule: readonly Part[],
  owned: GPUBuffer[],
): Promise<{ read: GPUBuffer[]; decode: (bufs: ArrayBuffer[]) => Result }> {
  const c = inp.m.c;
  const d = gdnDims(c);
  const K = c.K_CONV;
  assert.equal(schedule.reduce((s, p) => s + p.n, 0), inp.nTokens, "schedule covers the inputs");
  const step = await cache.get(GDN_STEP, c);
  const ringConsts = { CONV_CH: d.convCh, K_CONV: K, T_COL: 0 };
  const ringPipe = await cache.get(GDN_CONV_RING, ringConsts);
  const ringTapPipe = await cache.get(GDN_CONV_RING_TAP, ringConsts);
  const mk = (buf: GPUBuffer) => (owned.push(buf), buf);
  const { ring, state, convW, dtBias, ssmA, normW } = uploadLayer(device, inp, owned);
  // Scratch sized for the longest part and poisoned: a read of a word prep did not write turns y NaN.
  const maxN = Math.max(...schedule.map((p) => p.n));
  const sb = gdnChunkScratchBytes(c, maxN);
  const scratch: GdnChunkScratch = {
    wsQkw: mk(poisoned(device, sb.wsQkw / 4, POISON_F32, "ws_qkw")),
    wsUp: mk(poisoned(device, sb.wsUp / 4, POISON_F32, "ws_up")),
  };
  const baW = c.BA_GROUPED ? 2 * c.N_V : c.N_V;
  const ys: GPUBuffer[] = [];
  const taps: { cut: number; state: GPUBuffer; ring: GPUBuffer }[] = [];
  let t0 = 0;
  for (const { n, kernel, scan, cut = 0, unrolled = false } of schedule) {
    assert.ok(kernel === "chunk" || cut === 0, "only chunks are cut");
    // A cut of n or more is no cut: written as is (packGdnChunkParams refuses it).
    const words = kernel === "step"
      ? packGdnParams(inp.pos0 + t0, n)
      : cut < n
      ? packGdnChunkParams(inp.pos0 + t0, n, cut)
      : Uint32Array.of(inp.pos0 + t0, n, cut);
    const params = mk(upload(device, words, "params"));
    const xQkv = mk(upload(device, inp.x.subarray(t0 * d.convCh, (t0 + n) * d.convCh)));
    // A_OFF > 0: a follows b in one buffer bound to both bindings, A_OFF words after it.
    const bPart = inp.b.subarray(t0 * baW, (t0 + n) * baW);
    const aPart = inp.a.subarray(t0 * baW, (t0 + n) * baW);
    let b: GPUBuffer;
    let a: GPUBuffer;
    if (c.A_OFF > 0) {
      assert.ok(!c.BA_GROUPED && c.A_OFF >= baW * n, "A_OFF runs hold a after all of b");
      const joint = new Float32Array(c.A_OFF + baW * n);
      joint.set(bPart);
      joint.set(aPart, c.A_OFF);
      b = a = mk(upload(device, joint));
    } else {
      b = mk(upload(device, bPart));
      a = c.BA_GROUPED ? b : mk(upload(device, aPart));
    }
    const y = mk(poisoned(device, d.inner * n, POISON_F32, "y"));
    ys.push(y);
    const bindings: GdnStepBindings = {
      params,
      xQkv,
      z: mk(upload(device, inp.z.subarray(t0 * d.inner, (t0 + n) * d.inner))),
      b,
      a,
      convW,
      dtBias,
      ssmA,
      normW,
      convRing: { buffer: ring, size: d.convRing * 4 },
      state: { buffer: state, size: d.state * 4 },
      y: { buffer: y, size: d.inner * n * 4 },
    };
    const tap = cut > 0 && cut < n
      ? {
        cut,
        state: mk(poisoned(device, d.state, POISON_F32, "state tap")),
        ring: mk(poisoned(device, d.convRing, POISON_F32, "ring tap")),
      }
      : undefined;
    if (kernel === "chunk") {
      const pipelines = await prepareGdnChunk(cache, c, { scan, compactSolve: !unrolled });
      const stateTap = tap && { buffer: tap.state, size: d.state * 4 };
      encodeGdnChunk(pass, {
        device,
        pipelines,
        constants: c,
        bindings,
        scratch,
        maxTokens: n,
        scan,
        tap: stateTap,
      });
    } else {
      encodeGdnStep(pass, { device, pipeline: step, constants: c, bindings, maxTokens: n });
    }
    if (tap) {
      // The ring after the cut, recorded before the ring update of the same tokens.
      taps.push(tap);
      encodeGdnConvRing(pass, {
        device,
        pipeline: ringTapPipe,
        constants: ringConsts,
        bindings: {
          params,
          xQkv,
          convRing: bindings.convRing,
          tap: { buffer: tap.ring, size: d.convRing * 4 },
        },
        maxTokens: n,
        tap: true,
      });
    }
    if (n > 1 || kernel === "chunk") {
      encodeGdnConvRing(pass, {
        device,
        pipeline: ringPipe,
        constants: ringConsts,
        bindings: { params, xQkv, convRing: bindings.convRing },
        maxTokens: n,
      });
    }
    t0 += n;
  }
  const what = `${inp.m.name} schedule ${JSON.stringify(schedule)} pos0 ${inp.pos0}`;
  const decode = (bufs: ArrayBuffer[]): Result => {
    const y = new Float32Array(d.inner * inp.nTokens);
    let at = 0;
    schedule.forEach(({ n }, i) => {
      const w = new Uint32Array(bufs[i]!);
      assertPoisoned(w.subarray(d.inner * n), POISON_F32, `${what}: y of dispatch ${i}`);
      y.set(new Float32Array(bufs[i]!, 0, d.inner * n), at);
      at += d.inner * n;
    });
    const sbuf = bufs[schedule.length]!;
    assertPoisoned(new Uint32Array(sbuf).subarray(d.state), POISON_F32, `${what}: state`);
    const rb = bufs[schedule.length + 1]!;
    assertPoisoned(new Uint32Array(rb).subarray(d.convRing), POISON_F32, `${what}: conv ring`);
    for (const [i, name] of [[2, "ws_qkw"], [3, "ws_up"]] as const) {
      const words = (i === 2 ? sb.wsQkw : sb.wsUp) / 4;
      assertPoisoned(
        new Uint32Array(bufs[schedule.length + i]!).subarray(words),
        POISON_F32,
        `${what}: ${name}`,
      );
    }
    const hist = ringHist(new Float32Array(rb, 0, d.convRing), inp.pos0 + inp.nTokens, inp.m);
    const tapsOut: Tap[] = taps.map(({ cut }, i) => {
      const [sw, rw] = [bufs[schedule.length + 4 + 2 * i]!, bufs[schedule.length + 5 + 2 * i]!];
      assertPoisoned(new Uint32Array(sw).subarray(d.state), POISON_F32, `${what}: state tap ${i}`);
      assertPoisoned(new Uint32Array(rw).subarray(d.convRing), POISON_F32, `${what}: ring tap ${i}`);
      return { cut, state: new Float32Array(sw, 0, d.state), ring: new Float32Array(rw, 0, d.convRing) };
    });
    return { y, state: new Float32Array(sbuf, 0, d.state), hist, taps: tapsOut };
  };
  const wsQkw = scratch.wsQkw as GPUBuffer;
  const wsUp = scratch.wsUp as GPUBuffer;
  return { read: [...ys, state, ring, wsQkw, wsUp, ...taps.flatMap((t) => [t.state, t.ring])], decode };
}

interface Run {
  readonly inp: Inputs;
  readonly schedule: readonly Part[];
}

function maxErr(got: ArrayLike<number>, ref: ArrayLike<number>): string {
  let m = 0;
  let q = 0;
  for (let i = 0; i < ref.length; i++) {
    m = Math.max(m, Math.abs(got[i]! - ref[i]!));
    q = Math.max(q, Math.abs(got[i]! - ref[i]!) / (Y_TOL.atol + Y_TOL.rtol * Math.abs(ref[i]!)));
  }
  return `${m.toExponential(2)} (${q.toFixed(3)} of tol)`;
}

function describe(r: Run): string {
  return `${r.inp.m.name} ${JSON.stringify(r.inp.m.c)} schedule ${
    JSON.stringify(r.schedule)
  } pos0 ${r.inp.pos0}`;
}

function checkAgainstRef(got: Result, r: Run, seed: number): void {
  const ref = reference(r.inp, "chunked");
  const key = describe(r);
  if (Deno.env.get("GDN_CHUNK_ERRORS")) {
    console.log(
      `${key}: max |y err| ${maxErr(got.y, ref.y)}, max |state err| ${maxErr(got.state, ref.state)}`,
    );
  }
  assertClose(got.y, ref.y, Y_TOL, {
    what: `gdn_chunk y ${key} ne=[${gdnDims(r.inp.m.c).inner}, ${r.inp.nTokens}]`,
    seed,
  });
  assertClose(got.state, ref.state, S_TOL, { what: `gdn_chunk state ${key}`, seed });
  assertClose(got.hist, ref.hist, RING_TOL, { what: `gdn_chunk conv ring ${key}`, seed });
}

Deno.test("gdn_chunk: tiny dims, both κ and b/a layouts, n = 1, 7, 64, 100, 130, fresh and carried, both solves", async () => {
  const rng = new Rng();
  const runs: Run[] = [];
  for (const m of [TINY_NEXT, TINY_35]) {
    for (const n of [1, 7, 64, 100, 130]) {
      const fresh = runs.length % 2 === 0;
      const pos0 = fresh ? 0 : rng.int(1, 1_000_000);
      runs.push({ inp: makeInputs(rng, m, { nTokens: n, pos0, fresh }), schedule: chunks(n) });
    }
  }
  // The written-out solve (one variant: its phase 5 does not depend on the model's κ or b/a layout): three
  // blocks, the last short, then a short dispatch and a cut one after it
  const inp = makeInputs(rng, TINY_35, { nTokens: 250, pos0: rng.int(1, 1_000_000), fresh: false });
  const unrolled = (n: number, cut = 0): Part => ({ n, kernel: "chunk", cut, unrolled: true });
  runs.push({ inp, schedule: [unrolled(130), unrolled(20), unrolled(100, 37)] });
  const got = await runAll(runs, record);
  runs.forEach((r, i) => checkAgainstRef(got[i]!, r, rng.seed));
});

Deno.test("gdn_chunk: real dims, both κ, carried state and ring at a large position", async () => {
  const rng = new Rng();
  const runs = [REAL_NEXT, REAL_35].map((m) => {
    const n = rng.int(66, 80); // two blocks, the second one short
    return {
      inp: makeInputs(rng, m, { nTokens: n, pos0: 1_000_001 + rng.int(0, 4), fresh: false }),
      schedule: chunks(n),
    };
  });
  const got = await runAll(runs, record);
  runs.forEach((r, i) => checkAgainstRef(got[i]!, r, rng.seed));
});

Deno.test("gdn_chunk: chunks mixed with gdn_step decode steps, a shorter than the conv window, a after b", async () => {
  const rng = new Rng();
  const aAfterB: Model = {
    name: "tiny qwen35moe, a after b",
    c: { ...TINY_35.c, A_OFF: 200 * TINY_35.c.N_V },
  };
  const mixed = makeInputs(rng, TINY_NEXT, { nTokens: 135, pos0: rng.int(0, 100), fresh: false });
  const runs: Run[] = [
    // chunk, decode step, a chunk shorter than the window, chunk
    {
      inp: mixed,
      schedule: [
        ...chunks(70),
        { n: 1, kernel: "step" },
        ...chunks(2),
        { n: 1, kernel: "step" },
        ...chunks(61),
      ],
    },
    {
      inp: makeInputs(rng, aAfterB, { nTokens: 77, pos0: rng.int(0, 100), fresh: false }),
      schedule: chunks(77),
    },
  ];
  const got = await runAll(runs, record);
  runs.forEach((r, i) => checkAgainstRef(got[i]!, r, rng.seed));
});

Deno.test("gdn_chunk: awkward dims", async () => {
  const rng = new Rng();
  const runs: Run[] = [];
  for (const m of [ODD_A, ODD_B]) {
    runs.push({
      inp: makeInputs(rng, m, { nTokens: 90, pos0: rng.int(0, 1000), fresh: false }),
      schedule: chunks(9, 81),
    });
  }
  const got = await runAll(runs, record);
  runs.forEach((r, i) => checkAgainstRef(got[i]!, r, rng.seed));
});

Deno.test("gdn_chunk: every scan shape (BJ, CJ), real and awkward dims, carried state", async () => {
  const rng = new Rng();
  const runs: Run[] = [];
  const shapes: GdnChunkScan[] = [{ BJ: 8, CJ: 1 }, { BJ: 8, CJ: 2 }, { BJ: 16, CJ: 2 }, { BJ: 32, CJ: 1 }, {
    BJ: 32,
    CJ: 2,
  }];
  for (const scan of shapes) {
    // D_K 128 (M4 = 2) over two blocks, the second short; D_K 256 (M4 = 4, BJ capped by D_V = 16) and 64
    // (M4 = 1, D_V = 48: BJ 32 falls back to 16)
    for (const [m, n] of [[REAL_35, rng.int(66, 80)], [ODD_A, 70], [ODD_B, 30]] as const) {
      const inp = makeInputs(rng, m, { nTokens: n, pos0: rng.int(0, 1000), fresh: false });
      runs.push({ inp, schedule: [{ n, kernel: "chunk", scan }] });
    }
  }
  const got = await runAll(runs, record);
  runs.forEach((r, i) => checkAgainstRef(got[i]!, r, rng.seed));
  assert.deepEqual(gdnChunkScan(ODD_B.c, { BJ: 32, CJ: 2 }), { BJ: 16, CJ: 2 });
  assert.deepEqual(gdnChunkScan({ D_K: 256, D_V: 128 }, { BJ: 32, CJ: 1 }), { BJ: 16, CJ: 1 });
  assert.throws(() => gdnChunkScan(ODD_B.c, { BJ: 4, CJ: 1 }), /BJ must be 8, 16 or 32/);
});

Deno.test("gdn_chunk: equals gdn_step over the same tokens within tolerance (real dims)", async () => {
  const rng = new Rng();
  const inp = makeInputs(rng, REAL_35, { nTokens: 40, pos0: rng.int(0, 1000), fresh: false });
  const [chunked, stepped] = await runAll([
    { inp, schedule: chunks(40) },
    { inp, schedule: [{ n: 40, kernel: "step" as const }] },
  ], record);
  const what = `${describe({ inp, schedule: chunks(40) })} vs gdn_step`;
  assertClose(chunked!.y, stepped!.y, Y_TOL, { what: `y ${what}`, seed: rng.seed });
  assertClose(chunked!.state, stepped!.state, S_TOL, { what: `state ${what}`, seed: rng.seed });
  assertClose(chunked!.hist, stepped!.hist, RING_TOL, { what: `conv ring ${what}`, seed: rng.seed });
});

/** Asserts that two f32 results hold the same bits (NaN payloads included), naming the first that differs. */
function sameBits(got: Float32Array | Float64Array, want: Float32Array | Float64Array, what: string): void {
  assert.ok(got instanceof Float32Array && want instanceof Float32Array, `${what}: f32 results`);
  assert.equal(got.length, want.length, `${what}: length`);
  const [g, w] = [
    new Uint32Array(got.buffer, got.byteOffset, got.length),
    new Uint32Array(want.buffer, want.byteOffset, want.length),
  ];
  const i = g.findIndex((v, k) => v !== w[k]);
  assert.ok(
    i < 0,
    `${what}: element ${i} is ${got[i]} (0x${g[i]?.toString(16)}), want ${want[i]} (0x${w[i]?.toString(16)})`,
  );
}

/** A dispatch of `n` chunked tokens cut at `cut`. */
const cutAt = (n: number, cut: number, scan?: GdnChunkScan): Part => ({ n, kernel: "chunk", cut, scan });

// (model, n, cut): a cut inside the first block, at exactly one block, not a multiple of 64 with n > 128 (three
// blocks before the cut's short one, two after), after the first token, before the last, with a 2- and 3-slot
// ring (cuts shorter than the conv window: the second run's window reaches the ring), and at real dims.
const CUTS: ReadonlyArray<readonly [Model, number, number]> = [
  [TINY_NEXT, 100, 30],
  [TINY_35, 130, 64],
  [TINY_NEXT, 200, 100],
  [TINY_35, 70, 1],
  [TINY_NEXT, 70, 69],
  [ODD_A, 90, 1],
  [ODD_B, 75, 2],
  [REAL_35, 75, 41],
];

Deno.test("gdn_chunk: a cut dispatch's y, state and taps (state, ring after the cut) against the reference", async () => {
  const rng = new Rng();
  const runs: Run[] = CUTS.map(([m, n, cut], i) => ({
    inp: makeInputs(rng, m, { nTokens: n, pos0: i === 0 ? 0 : rng.int(1, 1_000_000), fresh: i === 0 }),
    schedule: [cutAt(n, cut)],
  }));
  const got = await runAll(runs, record);
  runs.forEach((r, i) => {
    const g = got[i]!;
    checkAgainstRef(g, r, rng.seed);
    const [tap] = g.taps!;
    const cut = r.schedule[0]!.cut!;
    assert.equal(tap?.cut, cut);
    const ref = reference(prefixInputs(r.inp, cut), "chunked");
    const key = `${describe(r)}: tap at ${cut}`;
    assertClose(tap!.state, ref.state, S_TOL, { what: `gdn_chunk state ${key}`, seed: rng.seed });
    const hist = ringHist(tap!.ring, r.inp.pos0 + cut, r.inp.m);
    assertClose(hist, ref.hist, RING_TOL, { what: `gdn_conv_ring_tap ${key}`, seed: rng.seed });
  });
});

Deno.test("gdn_chunk: a cut dispatch is bit for bit two dispatches split at the cut, no cut one plain", async () => {
  const rng = new Rng();
  const runs: Run[] = [];
  const checks: Array<(got: Result[]) => void> = [];
  // The engine's scan shape, and a narrow one (another copy loop) at real dims.
  const narrow: GdnChunkScan = { BJ: 8, CJ: 1 };
  const cases: Array<readonly [Model, number, number, GdnChunkScan?]> = [...CUTS, [REAL_35, 75, 41, narrow]];
  for (const [m, n, cut, scan] of cases) {
    const inp = makeInputs(rng, m, { nTokens: n, pos0: rng.int(1, 1_000_000), fresh: false });
    const at = runs.length;
    runs.push(
      { inp, schedule: [cutAt(n, cut, scan)] },
      { inp, schedule: [cutAt(cut, 0, scan), cutAt(n - cut, 0, scan)] },
      { inp: prefixInputs(inp, cut), schedule: [cutAt(cut, 0, scan)] },
    );
    checks.push((got) => {
      const [one, two, first] = [got[at]!, got[at + 1]!, got[at + 2]!];
      const what = `${describe(runs[at]!)} vs ${JSON.stringify(runs[at + 1]!.schedule)} (seed ${rng.seed})`;
      sameBits(one.y, two.y, `y ${what}`);
      sameBits(one.state, two.state, `state ${what}`);
      sameBits(one.hist, two.hist, `conv ring ${what}`);
      sameBits(one.taps![0]!.state, first.state, `state tap ${what}: the state after the first dispatch`);
      const hist = ringHist(one.taps![0]!.ring, inp.pos0 + cut, m);
      sameBits(hist, first.hist, `ring tap ${what}: the ring after the first dispatch`);
    });
  }
  // a cut word of n or more: the plain dispatch, no tap written
  for (const cut of [70, 71, 0xffffffff]) {
    const inp = makeInputs(rng, TINY_35, { nTokens: 70, pos0: rng.int(1, 1000), fresh: false });
    const at = runs.length;
    runs.push({ inp, schedule: [cutAt(70, cut)] }, { inp, schedule: chunks(70) });
    checks.push((got) => {
      const what = `${describe(runs[at]!)} vs no cut word (seed ${rng.seed})`;
      assert.deepEqual(got[at]!.taps, [], what);
      sameBits(got[at]!.y, got[at + 1]!.y, `y ${what}`);
      sameBits(got[at]!.state, got[at + 1]!.state, `state ${what}`);
    });
  }
  const got = await runAll(runs, record);
  checks.forEach((check) => check(got));
});

Deno.test("gdn_chunk: scratch sizes, dispatches and shape checks", async () => {
  const { device } = await testGpu();
  const c = TINY_35.c;
  const d = gdnDims(c);
  const bufs: GPUBuffer[] = [];
  const buf = (bytes: number) => {
    const b = device.createBuffer({ size: bytes, usage: GPUBufferUsage.STORAGE });
    bufs.push(b);
    return b;
  };
  const n = 65;
  const bindings: GdnStepBindings = {
    params: buf(12),
    xQkv: buf(d.convCh * n * 4),
    z: buf(d.inner * n * 4),
    b: buf(c.N_V * n * 4),
    a: buf(c.N_V * n * 4),
    convW: buf(c.K_CONV * d.convCh * 4),
    dtBias: buf(c.N_V * 4),
    ssmA: buf(c.N_V * 4),
    normW: buf(c.D_V * 4),
    convRing: buf(d.convRing * 4),
    state: buf(d.state * 4),
    y: buf(d.inner * n * 4),
  };
  const sb = gdnChunkScratchBytes(c, n);
  // three blocks of 64 tokens per head: two, and one more for a cut
  assert.deepEqual(sb, { wsQkw: 4 * 3 * 64 * 128 * 3 * 4, wsUp: 4 * (64 * 128 + 64 * 64 + 64) * 3 * 4 });
  // the most blocks a cut gives is one more than none, for every n
  for (let m = 1; m <= 200; m++) {
    assert.equal(gdnChunkBlocks(m).length, Math.ceil(m / 64), `blocks of ${m} tokens`);
    const most = Math.max(...Array.from({ length: m }, (_, cut) => gdnChunkBlocks(m, cut).length));
    assert.equal(most, gdnChunkMaxBlocks(m) - (m % 64 === 1 ? 1 : 0), `blocks of ${m} tokens, any cut`);
  }
  assert.deepEqual(gdnChunkBlocks(200, 100), [[0, 64], [64, 100], [100, 164], [164, 200]]);
  const scratch: GdnChunkScratch = { wsQkw: buf(sb.wsQkw), wsUp: buf(sb.wsUp) };
  checkGdnChunk(c, { bindings, scratch, maxTokens: n });
  const ds = gdnChunkDispatches(c, { bindings, scratch, maxTokens: n });
  assert.deepEqual(ds.map((x) => [x.spec.name, x.grid]), [
    ["gdn_chunk_prep", [4, 3, 1]],
    ["gdn_chunk", [4, 8, 1]],
    ["gdn_chunk_norm", [4, 65, 1]],
  ]);
  // the scan's tap: z when none is given (bound in no other binding of the scan), else the tap
  assert.equal(ds[1]!.bindings[5], bindings.z);
  const tap = buf(d.state * 4);
  assert.equal(gdnChunkDispatches(c, { bindings, scratch, maxTokens: n, tap }).at(1)!.bindings[5], tap);
  assert.throws(
    () => checkGdnChunk(c, { bindings, scratch, maxTokens: n, tap: buf(d.state * 4 - 4) }),
    new RegExp(
      `binding tap has ${d.state * 4 - 4} bytes but needs ${d.state * 4} \\(the state after the cut`,
    ),
  );
  assert.throws(
    () => checkGdnChunk(c, { bindings, scratch, maxTokens: n, tap: bindings.state }),
    /tap overlaps the scan's binding state/,
  );
  const big = buf(d.state * 8);
  checkGdnChunk(c, {
    bindings: { ...bindings, y: { buffer: big, size: d.state * 4 } },
    scratch,
    maxTokens: 1,
    tap: { buffer: big, offset: d.state * 4 },
  });
  assert.throws(
    () => checkGdnChunk(c, { bindings: { ...bindings, params: buf(8) }, scratch, maxTokens: n }),
    /binding params has 8 bytes but needs 12 \(u32 ne=\[3\]: \[pos0, n, cut\]/,
  );
  assert.deepEqual([...packGdnChunkParams(7, 3)], [7, 3, 0]);
  assert.deepEqual([...packGdnChunkParams(7, 3, 2)], [7, 3, 2]);
  assert.throws(() => packGdnChunkParams(7, 3, 3), /cut must be an integer in 0..2 .*: a cut at the end/);
  assert.throws(() => packGdnChunkParams(7, 3, -1), /cut must be an integer in 0..2/);
  assert.throws(() => packGdnChunkParams(7, 0), /token count must be a positive integer/);
  assert.throws(
    () => checkGdnChunk(c, { bindings, scratch: { ...scratch, wsUp: buf(sb.wsUp - 4) }, maxTokens: n }),
    /scratch wsUp has .* bytes but needs/,
  );
  assert.throws(() => checkGdnChunk(c, { bindings, scratch, maxTokens: n + 1 }), /binding xQkv has .* bytes/);
  assert.throws(
    () => checkGdnChunk({ ...c, D_V: 40 }, { bindings, scratch, maxTokens: n }),
    /D_V=40 must be a multiple of 16/,
  );
  assert.throws(
    () => checkGdnChunk({ ...c, K_CONV: 5 }, { bindings, scratch, maxTokens: n }),
    /K_CONV=5 exceeds 4/,
  );
  assert.throws(() => gdnChunkScratchBytes(c, 0), /maxTokens must be a positive integer/);
  bufs.forEach((b) => b.destroy());
});
