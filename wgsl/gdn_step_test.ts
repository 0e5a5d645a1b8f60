import assert from "node:assert/strict";
import { bindGroup, PipelineCache } from "./kernel.ts";
import { assertClose, assertPoisoned } from "../tests/util/close.ts";
import { GUARD_WORDS, POISON_F32, poisoned, readAll, testGpu, upload } from "../tests/util/gpu.ts";
import { Rng } from "../tests/util/rng.ts";
import {
  checkGdnConstants,
  checkGdnStep,
  encodeGdnStep,
  GDN_STEP,
  gdnDims,
  type GdnStepBindings,
  gdnStepNeedsNorm,
  packGdnParams,
} from "./gdn_step.ts";
import { GDN_CHUNK_NORM, GDN_CHUNK_NORM_BINDINGS, gdnNormConstants } from "./gdn_chunk.ts";
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

// ô is O(1) after the RMSNorm; f32 128-long dots and an f32 state carried over up to 64 tokens gave errors
// below 2e-6 on lavapipe at first, and up to 1.0e-5 on other seeds later (max |y err| measured while testing
// gdn_chunk against it): 3x headroom, and still tight enough to see a term dropped anywhere.
const Y_TOL = { atol: 3e-5, rtol: 3e-4 };
// The state is O(1) (|k̂| = 1, |δ| ≲ |v| + |u|); same f32 accumulation argument as ô.
const S_TOL = { atol: 3e-5, rtol: 3e-4 };
// The ring holds copies of the f32 inputs: exact.
const RING_TOL = { atol: 0, rtol: 0 };

/**
 * Records `inp` as dispatches of `schedule` token counts; returns the readback buffers and their decoder.
 * `tCol`: each token's x_qkv, z, b and a as one fused in-projection output [qkv | z | b | a], tCol words apart
 * (T_COL), NaN between them.
 */
async function record(
  device: GPUDevice,
  cache: PipelineCache,
  pass: GPUComputePassEncoder,
  inp: Inputs,
  schedule: readonly number[],
  owned: GPUBuffer[],
  tCol = 0,
): Promise<{ read: GPUBuffer[]; decode: (bufs: ArrayBuffer[]) => Result }> {
  const d = gdnDims(inp.m.c);
  const baW = inp.m.c.BA_GROUPED ? 2 * inp.m.c.N_V : inp.m.c.N_V;
  // Fused: a right after b (A_OFF = N_V) unless b and a are one grouped tensor.
  const c = tCol > 0 ? { ...inp.m.c, T_COL: tCol, A_OFF: inp.m.c.BA_GROUPED ? 0 : baW } : inp.m.c;
  const K = c.K_CONV;
  assert.equal(schedule.reduce((s, n) => s + n, 0), inp.nTokens, "schedule covers the inputs");
  const step = await cache.get(GDN_STEP, c);
  const ringConsts = { CONV_CH: d.convCh, K_CONV: K, T_COL: tCol };
  const ringPipe = await cache.get(GDN_CONV_RING, ringConsts);
  const normPipe = await cache.get(GDN_CHUNK_NORM, gdnNormConstants(c, tCol || undefined));
  const mk = (buf: GPUBuffer) => (owned.push(buf), buf);
  const { ring, state, convW, dtBias, ssmA, normW } = uploadLayer(device, inp, owned);
  /** x_qkv, z, b and a of tokens t0..t0+n: one fused buffer (tCol) or a buffer each. */
  const inputs = (t0: number, n: number): Pick<GdnStepBindings, "xQkv" | "z" | "b" | "a"> => {
    if (tCol > 0) {
      const io = new Float32Array(n * tCol).fill(Number.NaN);
      for (let t = 0; t < n; t++) {
        const at = t * tCol;
        const tt = t0 + t;
        io.set(inp.x.subarray(tt * d.convCh, (tt + 1) * d.convCh), at);
        io.set(inp.z.subarray(tt * d.inner, (tt + 1) * d.inner), at + d.convCh);
        io.set(inp.b.subarray(tt * baW, (tt + 1) * baW), at + d.convCh + d.inner);
        if (!c.BA_GROUPED) io.set(inp.a.subarray(tt * baW, (tt + 1) * baW), at + d.convCh + d.inner + baW);
      }
      const buf = mk(upload(device, io, "fused in-projections"));
      const part = (from: number) => ({ buffer: buf, offset: 4 * from, size: 4 * (n * tCol - from) });
      const ba = part(d.convCh + d.inner);
      return { xQkv: part(0), z: part(d.convCh), b: ba, a: ba };
    }
    // A_OFF > 0 (decode only): a follows b in one buffer, bound to both bindings, as the engine's fused
    // in-projection output lays them out.
    const joint = c.A_OFF > 0
      ? new Float32Array([
        ...inp.b.subarray(t0 * baW, (t0 + n) * baW),
        ...inp.a.subarray(t0 * baW, (t0 + n) * baW),
      ])
      : undefined;
    assert.ok(!joint || (n === 1 && c.A_OFF === c.N_V), "A_OFF runs are decode steps with a right after b");
    const b = mk(upload(device, joint ?? inp.b.subarray(t0 * baW, (t0 + n) * baW)));
    return {
      xQkv: mk(upload(device, inp.x.subarray(t0 * d.convCh, (t0 + n) * d.convCh))),
      z: mk(upload(device, inp.z.subarray(t0 * d.inner, (t0 + n) * d.inner))),
      b,
      a: c.BA_GROUPED || joint ? b : mk(upload(device, inp.a.subarray(t0 * baW, (t0 + n) * baW))),
    };
  };
  const ys: GPUBuffer[] = [];
  let t0 = 0;
  for (const n of schedule) {
    const params = mk(upload(device, packGdnParams(inp.pos0 + t0, n), "params"));
    const y = { buffer: mk(poisoned(device, d.inner * n, POISON_F32, "y")), size: d.inner * n * 4 };
    const bindings: GdnStepBindings = {
      params,
      ...inputs(t0, n),
      convW,
      dtBias,
      ssmA,
      normW,
      convRing: { buffer: ring, size: d.convRing * 4 },
      state: { buffer: state, size: d.state * 4 },
      y,
    };
    ys.push(y.buffer);
    encodeGdnStep(pass, { device, pipeline: step, constants: c, bindings, maxTokens: n });
    if (gdnStepNeedsNorm(c)) {
      // SPLIT > 1: y holds o; the gated norm runs as its own dispatch, as in the engine.
      pass.setPipeline(normPipe);
      const nb = { ...bindings, xq: mk(poisoned(device, 1)) }; // QX off: any buffer
      pass.setBindGroup(0, bindGroup(device, normPipe, GDN_CHUNK_NORM_BINDINGS.map((k) => nb[k])));
      pass.dispatchWorkgroups(c.N_V, n);
    }
    if (n > 1) {
      encodeGdnConvRing(pass, {
        device,
        pipeline: ringPipe,
        constants: ringConsts,
        bindings: { params, xQkv: bindings.xQkv, convRing: bindings.convRing },
        maxTokens: n,
      });
    }
    t0 += n;
  }
  const what = `${inp.m.name} schedule [${schedule}] pos0 ${inp.pos0}`;
  const decode = (bufs: ArrayBuffer[]): Result => {
    const y = new Float32Array(d.inner * inp.nTokens);
    let at = 0;
    schedule.forEach((n, i) => {
      const w = new Uint32Array(bufs[i]!);
      assertPoisoned(w.subarray(d.inner * n), POISON_F32, `${what}: y of dispatch ${i}`);
      y.set(new Float32Array(bufs[i]!, 0, d.inner * n), at);
      at += d.inner * n;
    });
    const sb = bufs[schedule.length]!;
    assertPoisoned(new Uint32Array(sb).subarray(d.state), POISON_F32, `${what}: state`);
    const rb = bufs[schedule.length + 1]!;
    assertPoisoned(new Uint32Array(rb).subarray(d.convRing), POISON_F32, `${what}: conv ring`);
    const rf = new Float32Array(rb, 0, d.convRing);
    const end = inp.pos0 + inp.nTokens;
    const hist = new Float32Array(d.convCh * (K - 1));
    for (let k = 0; k < K - 1; k++) {
      const slot = (end - (K - 1) + k) % K;
      hist.set(rf.subarray(slot * d.convCh, (slot + 1) * d.convCh), k * d.convCh);
    }
    return { y, state: new Float32Array(sb, 0, d.state), hist };
  };
  return { read: [...ys, state, ring], decode };
}

interface Run {
  readonly inp: Inputs;
  readonly schedule: readonly number[];
}

function checkAgainstRef(got: Result, inp: Inputs, schedule: readonly number[], seed: number): void {
  const ref = reference(inp);
  const key = `${inp.m.name} ${JSON.stringify(inp.m.c)} schedule [${schedule}] pos0 ${inp.pos0}`;
  assertClose(got.y, ref.y, Y_TOL, {
    what: `gdn_step y ${key} ne=[${gdnDims(inp.m.c).inner}, ${inp.nTokens}]`,
    seed,
  });
  assertClose(got.state, ref.state, S_TOL, { what: `gdn_step state ${key}`, seed });
  assertClose(got.hist, ref.hist, RING_TOL, { what: `gdn_step conv ring ${key}`, seed });
}

function assertSame(a: Result, b: Result, what: string, seed: number): void {
  for (const part of ["y", "state", "hist"] as const) {
    const x = a[part];
    const y = b[part];
    assert.equal(x.length, y.length);
    for (let i = 0; i < x.length; i++) {
      if (!Object.is(x[i], y[i])) {
        throw new Error(`${what} (seed ${seed}): ${part}[${i}] differs: ${x[i]} vs ${y[i]}`);
      }
    }
  }
}

Deno.test("gdn_step: decode steps from zero state, both κ mappings and b/a layouts (tiny dims)", async () => {
  const rng = new Rng();
  const runs = [TINY_NEXT, TINY_35].map((m) => ({
    inp: makeInputs(rng, m, { nTokens: 6, pos0: 0, fresh: true }),
    schedule: [1, 1, 1, 1, 1, 1],
  }));
  const got = await runAll(runs, record);
  runs.forEach((r, i) => checkAgainstRef(got[i]!, r.inp, r.schedule, rng.seed));
});

Deno.test("gdn_step: real dims, decode from a random state at a large position, both κ", async () => {
  const rng = new Rng();
  const aAfterB: Model = { name: "real qwen35moe, a after b", c: { ...REAL_35.c, A_OFF: REAL_35.c.N_V } };
  const runs = [REAL_NEXT, REAL_35, aAfterB].map((m) => ({
    inp: makeInputs(rng, m, { nTokens: 3, pos0: 1_000_001 + rng.int(0, 4), fresh: false }),
    schedule: [1, 1, 1],
  }));
  const got = await runAll(runs, record);
  runs.forEach((r, i) => checkAgainstRef(got[i]!, r.inp, r.schedule, rng.seed));
});

Deno.test("gdn_step + gdn_conv_ring: prefill of 1, 7 and 64 tokens equals the reference and n decode steps", async () => {
  const rng = new Rng();
  const i7 = makeInputs(rng, TINY_35, { nTokens: 7, pos0: 0, fresh: true });
  const i1 = makeInputs(rng, TINY_NEXT, { nTokens: 1, pos0: 5 + rng.int(0, 4), fresh: false });
  const mixed = makeInputs(rng, TINY_NEXT, { nTokens: 10, pos0: 2 + rng.int(0, 4), fresh: false });
  const i64 = makeInputs(rng, REAL_NEXT, { nTokens: 64, pos0: 0, fresh: true });
  const runs: Run[] = [
    { inp: i7, schedule: [7] },
    { inp: i7, schedule: Array(7).fill(1) },
    { inp: i1, schedule: [1] },
    // prefill, decode, and a prefill shorter than the conv window (ring kernel with n < K-1)
    { inp: mixed, schedule: [7, 1, 2] },
    { inp: mixed, schedule: Array(10).fill(1) },
    { inp: i64, schedule: [64] },
    { inp: i64, schedule: Array(64).fill(1) },
  ];
  const got = await runAll(runs, record);
  runs.forEach((r, i) => checkAgainstRef(got[i]!, r.inp, r.schedule, rng.seed));
  // The per-token code is the same, and the ring holds exact copies: prefill and decode agree bit for bit.
  assertSame(got[0]!, got[1]!, "prefill 7 vs 7 decode steps", rng.seed);
  assertSame(got[3]!, got[4]!, "prefill 7+1+2 vs 10 decode steps", rng.seed);
  assertSame(got[5]!, got[6]!, "prefill 64 vs 64 decode steps", rng.seed);
});

Deno.test("gdn_step + gdn_conv_ring T_COL: tokens of a fused in-projection output give the packed layout's bits", async () => {
  const rng = new Rng();
  for (const m of [TINY_35, TINY_NEXT, { ...TINY_35, c: { ...TINY_35.c, SPLIT: 2 } }]) {
    const inp = makeInputs(rng, m, { nTokens: 8, pos0: rng.int(0, 9), fresh: false });
    const d = gdnDims(m.c);
    // The engine's column: [qkv | z | b | a] padded to 64 words.
    const tCol = Math.ceil((d.convCh + d.inner + 2 * m.c.N_V) / 64) * 64;
    const runs: Run[] = [{ inp, schedule: [5, 1, 2] }, { inp, schedule: [8] }];
    const packed = await runAll(runs, record);
    const fused = await runAll(
      runs,
      (dev, cache, pass, i, sch, owned) => record(dev, cache, pass, i, sch, owned, tCol),
    );
    runs.forEach((r, i) => {
      checkAgainstRef(fused[i]!, r.inp, r.schedule, rng.seed);
      assertSame(fused[i]!, packed[i]!, `${m.name} T_COL ${tCol} schedule [${r.schedule}]`, rng.seed);
    });
  }
});

Deno.test("gdn_step + gdn_conv_ring: awkward dims, decode and prefill", async () => {
  const rng = new Rng();
  const runs: Run[] = [];
  for (const m of [ODD_A, ODD_B]) {
    const inp = makeInputs(rng, m, { nTokens: 9, pos0: rng.int(0, 1000), fresh: false });
    runs.push({ inp, schedule: [1, 1, 5, 1, 1] }, { inp, schedule: [9] });
  }
  const got = await runAll(runs, record);
  runs.forEach((r, i) => checkAgainstRef(got[i]!, r.inp, r.schedule, rng.seed));
  assertSame(got[0]!, got[1]!, "odd dims A: decode/prefill mix vs prefill", rng.seed);
  assertSame(got[2]!, got[3]!, "odd dims B: decode/prefill mix vs prefill", rng.seed);
});

Deno.test("gdn_step SPLIT (columns over workgroups, then gdn_chunk_norm): reference, and prefill = decode steps", async () => {
  const rng = new Rng();
  const split = (m: Model, s: number): Model => ({ name: `${m.name}, SPLIT ${s}`, c: { ...m.c, SPLIT: s } });
  const real = makeInputs(rng, split(REAL_35, 4), {
    nTokens: 3,
    pos0: 1_000_001 + rng.int(0, 4),
    fresh: false,
  });
  const tiny = makeInputs(rng, split(TINY_NEXT, 8), { nTokens: 7, pos0: 0, fresh: true });
  const odd = makeInputs(rng, split(ODD_B, 3), { nTokens: 9, pos0: rng.int(0, 1000), fresh: false });
  const runs: Run[] = [
    { inp: real, schedule: [1, 1, 1] },
    { inp: tiny, schedule: [7] },
    { inp: tiny, schedule: Array(7).fill(1) },
    { inp: odd, schedule: [1, 1, 5, 1, 1] },
    { inp: odd, schedule: [9] },
  ];
  const got = await runAll(runs, record);
  runs.forEach((r, i) => checkAgainstRef(got[i]!, r.inp, r.schedule, rng.seed));
  assertSame(got[1]!, got[2]!, "SPLIT 8: prefill 7 vs 7 decode steps", rng.seed);
  assertSame(got[3]!, got[4]!, "SPLIT 3: decode/prefill mix vs prefill", rng.seed);
});

Deno.test("gdn_step: shape checks throw before encoding", async () => {
  const { device } = await testGpu();
  const c = TINY_35.c;
  const d = gdnDims(c);
  const bufs: GPUBuffer[] = [];
  const buf = (words: number) => {
    const b = device.createBuffer({ size: words * 4, usage: GPUBufferUsage.STORAGE });
    bufs.push(b);
    return b;
  };
  const bindings: GdnStepBindings = {
    params: buf(2),
    xQkv: buf(d.convCh * 2),
    z: buf(d.inner * 2),
    b: buf(c.N_V * 2),
    a: buf(c.N_V * 2),
    convW: buf(c.K_CONV * d.convCh),
    dtBias: buf(c.N_V),
    ssmA: buf(c.N_V),
    normW: buf(c.D_V),
    convRing: buf(d.convRing),
    state: buf(d.state),
    y: buf(d.inner * 2),
  };
  checkGdnStep(c, { bindings, maxTokens: 2 });
  assert.throws(() => checkGdnStep(c, { bindings, maxTokens: 3 }), /binding xQkv has .* bytes but needs/);
  assert.throws(
    () =>
      checkGdnStep(c, {
        bindings: { ...bindings, state: { buffer: bindings.state as GPUBuffer, size: 64 } },
        maxTokens: 1,
      }),
    /binding state has 64 bytes/,
  );
  assert.throws(() => checkGdnStep({ ...c, BA_GROUPED: true }, { bindings, maxTokens: 2 }), /binding b has/);
  assert.throws(
    () => checkGdnStep({ ...c, D_K: 96 }, { bindings, maxTokens: 1 }),
    /D_K=96 must be a multiple of 64/,
  );
  assert.throws(() => checkGdnStep({ ...c, N_V: 5 }, { bindings, maxTokens: 1 }), /N_V=5 is not a multiple/);
  assert.throws(() => checkGdnStep({ ...c, SPLIT: 3 }, { bindings, maxTokens: 1 }), /SPLIT=3 must be/);
  assert.throws(() => checkGdnStep({ ...c, SPLIT: 0 }, { bindings, maxTokens: 1 }), /SPLIT=0 must be/);
  // taps and window are vec4s
  assert.throws(() => checkGdnConstants({ ...c, K_CONV: 5 }), /K_CONV=5 exceeds 4/);
  assert.throws(() => packGdnParams(0, 0), /token count must be a positive integer/);
  assert.deepEqual([...packGdnParams(7, 3)], [7, 3]);
  bufs.forEach((b) => b.destroy());
});

/**
 * A batched step's layout: `slots` per column, state pools of `nSlots` slots at 256-byte strides. Inputs
 * `packed`: each column's [x_qkv | z | b | a] in one buffer at one stride (a fused in-projection's output),
 * each part 256-byte aligned; else x_qkv, z, b and a in buffers of their own with NaN gaps between columns.
 */
interface ColumnCase {
  readonly m: Model;
  readonly nSlots: number;
  readonly slots: readonly number[];
  readonly inps: readonly Inputs[];
  readonly packed?: boolean;
}

/** Column inputs of one layer: fresh per column, the layer's weights shared (those of column 0). */
function columnCase(
  rng: Rng,
  m: Model,
  nSlots: number,
  slots: readonly number[],
  packed = false,
): ColumnCase {
  const inps: Inputs[] = [];
  for (const [j] of slots.entries()) {
    const fresh = j === 1;
    const inp = makeInputs(rng, m, { nTokens: 1, pos0: fresh ? 0 : rng.int(0, 100_000), fresh });
    const w = inps[0] ?? inp;
    inps.push({ ...inp, convW: w.convW, dtBias: w.dtBias, ssmA: w.ssmA, normW: w.normW });
  }
  return { m, nSlots, slots, inps, packed };
}

/**
 * Records the batched dispatch of a column case (every column in one gdn_step, the slots' conv rings and
 * states in pools whose other words hold random bits that must stay as they are) and each column's solo
 * step (its own buffers, `record`); returns a checker for the read-back bytes.
 */
async function recordColumns(
  device: GPUDevice,
  cache: PipelineCache,
  pass: GPUComputePassEncoder,
  rng: Rng,
  cc: ColumnCase,
  owned: GPUBuffer[],
): Promise<{ read: GPUBuffer[]; check: (bufs: ArrayBuffer[]) => void }> {
  const { m, nSlots, slots, inps } = cc;
  const nCol = slots.length;
  const pad = (w: number) => Math.ceil(w / 64) * 64;
  const d = gdnDims(m.c);
  const K = m.c.K_CONV;
  const baW = m.c.BA_GROUPED ? 2 * m.c.N_V : m.c.N_V;
  // Packed: [x_qkv | z | b | a] per column, each part starting 256-byte aligned (a binding's offset), and the
  // stride one word past a multiple of 64 (column strides need no alignment); a reads from word N_V of b's range.
  const zAt = pad(d.convCh);
  const baAt = zAt + pad(d.inner);
  const aOff = m.c.BA_GROUPED ? 0 : m.c.N_V;
  const S = baAt + pad(2 * baW) + 1;
  const c = {
    ...m.c,
    P_COL: 64,
    X_COL: cc.packed ? S : pad(d.convCh) + 64,
    Z_COL: cc.packed ? S : pad(d.inner) + 64,
    BA_COL: cc.packed ? S : pad(baW) + 64,
    A_OFF: cc.packed ? aOff : 0,
    RING_COL: pad(d.convRing),
    STATE_COL: pad(d.state),
  };
  const mk = (buf: GPUBuffer) => (owned.push(buf), buf);
  const table = new Uint32Array(nCol * c.P_COL).fill(0xffffffff);
  const x = new Float32Array(nCol * c.X_COL).fill(NaN);
  const z = new Float32Array(nCol * c.Z_COL).fill(NaN);
  const b = new Float32Array(nCol * c.BA_COL).fill(NaN);
  const a = new Float32Array(nCol * c.BA_COL).fill(NaN);
  const io = new Float32Array(nCol * S).fill(NaN);
  // Pools: every word random bits, then each column's slot gets its ring (the slot of no live position
  // poisoned, as uploadLayer does) and state.
  const rand = (n: number) => new Uint32Array(n).map(() => rng.u32());
  const ring0 = rand(c.RING_COL * (nSlots - 1) + d.convRing + GUARD_WORDS);
  const st0 = rand(c.STATE_COL * (nSlots - 1) + d.state + GUARD_WORDS);
  for (const [j, slot] of slots.entries()) {
    const inp = inps[j]!;
    table.set([inp.pos0, 1, slot], j * c.P_COL);
    if (cc.packed) {
      io.set(inp.x, j * S);
      io.set(inp.z, j * S + zAt);
      io.set(inp.b, j * S + baAt);
      if (!m.c.BA_GROUPED) io.set(inp.a, j * S + baAt + aOff);
    } else {
      x.set(inp.x, j * c.X_COL);
      z.set(inp.z, j * c.Z_COL);
      b.set(inp.b, j * c.BA_COL);
      a.set(inp.a, j * c.BA_COL);
    }
    const ring = new Float32Array(ring0.buffer, slot * c.RING_COL * 4, d.convRing);
    new Uint32Array(ring.buffer, ring.byteOffset, d.convRing).fill(POISON_F32);
    for (let k = 0; k < K - 1; k++) {
      const rs = (inp.pos0 - (K - 1) + k + K * 4) % K;
      ring.set(inp.hist.subarray(k * d.convCh, (k + 1) * d.convCh), rs * d.convCh);
    }
    new Float32Array(st0.buffer, slot * c.STATE_COL * 4, d.state).set(inp.s0);
  }
  const w = inps[0]!;
  const ringBuf = mk(upload(device, ring0, "conv_ring pool"));
  const stateBuf = mk(upload(device, st0, "state pool"));
  const yBuf = mk(poisoned(device, nCol * d.inner, POISON_F32, "y"));
  const ioBuf = mk(upload(device, io, "packed in-projection columns"));
  const part = (at: number) => ({ buffer: ioBuf, offset: at * 4, size: (nCol * S - at) * 4 });
  const bBuf = mk(upload(device, b));
  const ins = cc.packed ? { xQkv: part(0), z: part(zAt), b: part(baAt), a: part(baAt) } : {
    xQkv: mk(upload(device, x)),
    z: mk(upload(device, z)),
    b: bBuf,
    a: m.c.BA_GROUPED ? bBuf : mk(upload(device, a)),
  };
  const bindings: GdnStepBindings = {
    params: mk(upload(device, table, "column table")),
    ...ins,
    convW: mk(upload(device, w.convW)),
    dtBias: mk(upload(device, w.dtBias)),
    ssmA: mk(upload(device, w.ssmA)),
    normW: mk(upload(device, w.normW)),
    convRing: { buffer: ringBuf, size: ring0.byteLength - GUARD_WORDS * 4 },
    state: { buffer: stateBuf, size: st0.byteLength - GUARD_WORDS * 4 },
    y: { buffer: yBuf, size: nCol * d.inner * 4 },
  };
  encodeGdnStep(pass, {
    device,
    pipeline: await cache.get(GDN_STEP, c),
    constants: c,
    bindings,
    maxTokens: 1,
    cols: nCol,
    slots: nSlots,
  });
  if (gdnStepNeedsNorm(c)) {
    const normPipe = await cache.get(GDN_CHUNK_NORM, gdnNormConstants(c, c.Z_COL));
    const nb = {
      ...bindings,
      params: mk(upload(device, Uint32Array.of(0, nCol))),
      xq: mk(poisoned(device, 1)),
    };
    pass.setPipeline(normPipe);
    pass.setBindGroup(0, bindGroup(device, normPipe, GDN_CHUNK_NORM_BINDINGS.map((k) => nb[k])));
    pass.dispatchWorkgroups(c.N_V, nCol);
  }
  const solo: Awaited<ReturnType<typeof record>>[] = [];
  for (const inp of inps) solo.push(await record(device, cache, pass, inp, [1], owned));
  const check = (bufs: ArrayBuffer[]) => {
    const [yb, rb, sb] = bufs;
    const what = `${m.name} columns at slots [${slots}] of ${nSlots}, positions [${inps.map((i) => i.pos0)}]`;
    assertPoisoned(new Uint32Array(yb!).subarray(nCol * d.inner), POISON_F32, `${what}: y`);
    const ringW = new Uint32Array(rb!);
    const stW = new Uint32Array(sb!);
    // Words outside the columns' regions (other slots, padding between regions, guard) keep their bits.
    const mine = (at: number, stride: number, size: number) =>
      slots.some((s) => at >= s * stride && at < s * stride + size);
    for (let i = 0; i < ringW.length; i++) {
      if (!mine(i, c.RING_COL, d.convRing) && ringW[i] !== ring0[i]) {
        throw new Error(
          `${what} (seed ${rng.seed}): conv ring pool word ${i} outside the columns' rings changed`,
        );
      }
    }
    for (let i = 0; i < stW.length; i++) {
      if (!mine(i, c.STATE_COL, d.state) && stW[i] !== st0[i]) {
        throw new Error(
          `${what} (seed ${rng.seed}): state pool word ${i} outside the columns' states changed`,
        );
      }
    }
    let at = 3;
    for (const [j, slot] of slots.entries()) {
      const inp = inps[j]!;
      const rf = new Float32Array(rb!, slot * c.RING_COL * 4, d.convRing);
      const end = inp.pos0 + 1;
      const hist = new Float32Array(d.convCh * (K - 1));
      for (let k = 0; k < K - 1; k++) {
        const rs = (end - (K - 1) + k) % K;
        hist.set(rf.subarray(rs * d.convCh, (rs + 1) * d.convCh), k * d.convCh);
      }
      const got: Result = {
        y: new Float32Array(yb!, j * d.inner * 4, d.inner),
        state: new Float32Array(sb!, slot * c.STATE_COL * 4, d.state),
        hist,
      };
      checkAgainstRef(got, inp, [1], rng.seed);
      const n = solo[j]!.read.length;
      assertSame(
        got,
        solo[j]!.decode(bufs.slice(at, at + n)),
        `${what}: column ${j} vs its solo step`,
        rng.seed,
      );
      at += n;
    }
  };
  return { read: [yBuf, ringBuf, stateBuf, ...solo.flatMap((s) => s.read)], check };
}

Deno.test("gdn_step columns: one dispatch over columns at other slots and positions = reference = solo bits, other slots untouched", async () => {
  const rng = new Rng();
  const split = (m: Model, s: number): Model => ({ name: `${m.name}, SPLIT ${s}`, c: { ...m.c, SPLIT: s } });
  const cases = [
    columnCase(rng, TINY_35, 4, [2, 0, 3]),
    columnCase(rng, split(TINY_NEXT, 8), 5, [4, 1]),
    columnCase(rng, split(ODD_B, 3), 3, [1, 2, 0]),
    columnCase(rng, ODD_A, 2, [1]),
    // A fused in-projection's columns: x_qkv, z, b and a of a column in one buffer at one stride.
    columnCase(rng, split(TINY_35, 2), 4, [3, 1, 2], true),
    columnCase(rng, split(TINY_NEXT, 8), 3, [2, 0], true),
    // A batched step's widest: 16 columns (MAX_BATCH_SLOTS) on 16 of 17 pooled slots in a scrambled order.
    columnCase(rng, split(ODD_B, 3), 17, rng.permutation(17).slice(0, 16)),
  ];
  const { device } = await testGpu();
  const cache = new PipelineCache(device);
  const owned: GPUBuffer[] = [];
  const enc = device.createCommandEncoder();
  const pass = enc.beginComputePass();
  const recs = [];
  for (const cc of cases) recs.push(await recordColumns(device, cache, pass, rng, cc, owned));
  pass.end();
  device.queue.submit([enc.finish()]);
  const bufs = await readAll(device, recs.flatMap((r) => r.read));
  let at = 0;
  for (const r of recs) {
    r.check(bufs.slice(at, at + r.read.length));
    at += r.read.length;
  }
  owned.forEach((b) => b.destroy());
});

Deno.test("gdn_step columns: shape checks", () => {
  const c = { ...TINY_35.c, P_COL: 64, X_COL: 0, Z_COL: 0, BA_COL: 64, RING_COL: 4096, STATE_COL: 0 };
  assert.throws(
    () => checkGdnConstants({ ...c, RING_COL: 8 }),
    /RING_COL=8 must be 0 \(one column\) or a stride/,
  );
  assert.throws(
    () => checkGdnConstants({ ...c, STATE_COL: 4 * gdnDims(c).state + 2 }),
    /STATE_COL=.* multiple of 4/,
  );
  const d = gdnDims(c);
  assert.throws(() => checkGdnConstants({ ...c, X_COL: d.convCh - 1 }), /X_COL=\d+ must be 0/);
  assert.throws(() => checkGdnConstants({ ...c, Z_COL: d.inner - 1 }), /Z_COL=\d+ must be 0/);
  assert.throws(() => gdnNormConstants(c, d.inner - 1), /Z_COL=\d+ is shorter than one token's z/);
});
