import assert from "node:assert/strict";
import { PipelineCache } from "./kernel.ts";
import { assertClose, assertPoisoned, type Tolerance } from "../tests/util/close.ts";
import { POISON_F32, poisoned, testGpu, upload } from "../tests/util/gpu.ts";
import { Rng } from "../tests/util/rng.ts";
import {
  checkGdnChunk,
  encodeGdnChunk,
  gdnChunkDispatches,
  type GdnChunkScan,
  gdnChunkScan,
  type GdnChunkScratch,
  gdnChunkScratchBytes,
  prepareGdnChunk,
} from "./gdn_chunk.ts";
import { encodeGdnStep, GDN_STEP, gdnDims, type GdnStepBindings, packGdnParams } from "./gdn_step.ts";
import { encodeGdnConvRing, GDN_CONV_RING } from "./gdn_conv_ring.ts";
import {
  type Inputs,
  makeInputs,
  type Model,
  ODD_A,
  ODD_B,
  REAL_35,
  REAL_NEXT,
  reference,
  type Result,
  runAll,
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

/** One dispatch of a schedule: `n` tokens through the chunked kernels (scan shape `scan`), or `gdn_step`. */
interface Part {
  readonly n: number;
  readonly kernel: "chunk" | "step";
  readonly scan?: GdnChunkScan;
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
  let t0 = 0;
  for (const { n, kernel, scan } of schedule) {
    const params = mk(upload(device, packGdnParams(inp.pos0 + t0, n), "params"));
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
    if (kernel === "chunk") {
      const pipelines = await prepareGdnChunk(cache, c, { scan });
      encodeGdnChunk(pass, { device, pipelines, constants: c, bindings, scratch, maxTokens: n, scan });
    } else {
      encodeGdnStep(pass, { device, pipeline: step, constants: c, bindings, maxTokens: n });
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
    const rf = new Float32Array(rb, 0, d.convRing);
    const end = inp.pos0 + inp.nTokens;
    const hist = new Float32Array(d.convCh * (K - 1));
    for (let k = 0; k < K - 1; k++) {
      const slot = (end - (K - 1) + k) % K;
      hist.set(rf.subarray(slot * d.convCh, (slot + 1) * d.convCh), k * d.convCh);
    }
    return { y, state: new Float32Array(sbuf, 0, d.state), hist };
  };
  const wsQkw = scratch.wsQkw as GPUBuffer;
  const wsUp = scratch.wsUp as GPUBuffer;
  return { read: [...ys, state, ring, wsQkw, wsUp], decode };
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

Deno.test("gdn_chunk: tiny dims, both κ and b/a layouts, n = 1, 7, 64, 100, 130, fresh and carried", async () => {
  const rng = new Rng();
  const runs: Run[] = [];
  for (const m of [TINY_NEXT, TINY_35]) {
    for (const n of [1, 7, 64, 100, 130]) {
      const fresh = runs.length % 2 === 0;
      const pos0 = fresh ? 0 : rng.int(1, 1_000_000);
      runs.push({ inp: makeInputs(rng, m, { nTokens: n, pos0, fresh }), schedule: chunks(n) });
    }
  }
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
    params: buf(8),
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
  // two blocks of 64 tokens per head
  assert.deepEqual(sb, { wsQkw: 4 * 3 * 64 * 128 * 2 * 4, wsUp: 4 * (64 * 128 + 64 * 64 + 64) * 2 * 4 });
  const scratch: GdnChunkScratch = { wsQkw: buf(sb.wsQkw), wsUp: buf(sb.wsUp) };
  checkGdnChunk(c, { bindings, scratch, maxTokens: n });
  const ds = gdnChunkDispatches(c, { bindings, scratch, maxTokens: n });
  assert.deepEqual(ds.map((x) => [x.spec.name, x.grid]), [
    ["gdn_chunk_prep", [4, 2, 1]],
    ["gdn_chunk", [4, 8, 1]],
    ["gdn_chunk_norm", [4, 65, 1]],
  ]);
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
