import assert from "node:assert/strict";
import { PipelineCache } from "./kernel.ts";
import { assertClose, assertPoisoned } from "../tests/util/close.ts";
import { POISON_F32, poisoned, readAll, testGpu, upload } from "../tests/util/gpu.ts";
import { Rng } from "../tests/util/rng.ts";
import {
  checkGdnConvRing,
  encodeGdnConvRing,
  GDN_CONV_RING,
  GDN_CONV_RING_TAP,
  type GdnConvRingConstants,
} from "./gdn_conv_ring.ts";
import { packGdnParams } from "./gdn_step.ts";
import { packGdnChunkParams } from "./gdn_chunk.ts";

// The ring holds copies of f32 inputs.
const TOL = { atol: 0, rtol: 0 };

Deno.test("gdn_conv_ring: writes exactly the last K-1 inputs into their position's slot", async () => {
  const { device } = await testGpu();
  const cache = new PipelineCache(device);
  const rng = new Rng();
  // C not a multiple of the workgroup size (64): the tail guard is exercised.
  const cases: Array<{ c: GdnConvRingConstants; pos0: number; n: number }> = [
    { c: { CONV_CH: 1000, K_CONV: 4, T_COL: 0 }, pos0: 0, n: 1 },
    { c: { CONV_CH: 1000, K_CONV: 4, T_COL: 0 }, pos0: 5, n: 2 },
    { c: { CONV_CH: 1000, K_CONV: 4, T_COL: 0 }, pos0: 1_000_003, n: 3 },
    { c: { CONV_CH: 8192, K_CONV: 4, T_COL: 0 }, pos0: rng.int(0, 1 << 20), n: 7 },
    { c: { CONV_CH: 200, K_CONV: 3, T_COL: 0 }, pos0: rng.int(0, 1 << 20), n: 64 },
    // Tokens T_COL apart (a short chunk's fused in-projections), NaN between them.
    { c: { CONV_CH: 200, K_CONV: 4, T_COL: 320 }, pos0: rng.int(0, 1 << 20), n: 6 },
  ];
  const owned: GPUBuffer[] = [];
  const rings: GPUBuffer[] = [];
  const xs: Float32Array[] = [];
  const enc = device.createCommandEncoder();
  const pass = enc.beginComputePass();
  for (const { c, pos0, n } of cases) {
    const pipeline = await cache.get(GDN_CONV_RING, c);
    const x = rng.normals(c.CONV_CH * n);
    xs.push(x);
    const xT = c.T_COL || c.CONV_CH;
    const xAll = new Float32Array((n - 1) * xT + c.CONV_CH).fill(Number.NaN);
    for (let t = 0; t < n; t++) xAll.set(x.subarray(t * c.CONV_CH, (t + 1) * c.CONV_CH), t * xT);
    const ring = poisoned(device, c.CONV_CH * c.K_CONV, POISON_F32, "conv_ring");
    rings.push(ring);
    const bindings = {
      params: upload(device, packGdnParams(pos0, n)),
      xQkv: upload(device, xAll),
      convRing: { buffer: ring, size: c.CONV_CH * c.K_CONV * 4 },
    };
    owned.push(bindings.params, bindings.xQkv, ring);
    encodeGdnConvRing(pass, { device, pipeline, constants: c, bindings, maxTokens: n });
  }
  pass.end();
  device.queue.submit([enc.finish()]);
  const got = await readAll(device, rings);
  cases.forEach(({ c, pos0, n }, i) => {
    const what = `gdn_conv_ring${JSON.stringify(c)} pos0 ${pos0} n ${n}`;
    const words = new Uint32Array(got[i]!);
    const f = new Float32Array(got[i]!);
    assertPoisoned(words.subarray(c.CONV_CH * c.K_CONV), POISON_F32, what);
    const written = new Set<number>();
    for (let t = Math.max(0, n - (c.K_CONV - 1)); t < n; t++) {
      const slot = (pos0 + t) % c.K_CONV;
      written.add(slot);
      assertClose(
        f.subarray(slot * c.CONV_CH, (slot + 1) * c.CONV_CH),
        xs[i]!.subarray(t * c.CONV_CH, (t + 1) * c.CONV_CH),
        TOL,
        { what: `${what} slot ${slot} (token ${t})`, seed: rng.seed },
      );
    }
    for (let slot = 0; slot < c.K_CONV; slot++) {
      if (written.has(slot)) continue;
      assertPoisoned(
        words.subarray(slot * c.CONV_CH, (slot + 1) * c.CONV_CH),
        POISON_F32,
        `${what} slot ${slot}`,
      );
    }
  });
  owned.forEach((b) => b.destroy());
});

Deno.test("gdn_conv_ring_tap: the ring after the first cut tokens, bit for bit; the ring itself untouched", async () => {
  const { device } = await testGpu();
  const cache = new PipelineCache(device);
  const rng = new Rng();
  const cases: Array<{ c: GdnConvRingConstants; n: number; cut: number }> = [];
  for (const c of [{ CONV_CH: 1000, K_CONV: 4, T_COL: 0 }, { CONV_CH: 200, K_CONV: 3, T_COL: 0 }]) {
    const n = 70;
    for (const cut of [1, 2, c.K_CONV - 1, c.K_CONV, n - 1]) cases.push({ c, n, cut });
  }
  cases.push(
    // A 2-slot ring; tokens T_COL apart; cut 0 (no tap written); a cut word of n or more (the ring after n).
    { c: { CONV_CH: 130, K_CONV: 2, T_COL: 0 }, n: 5, cut: 1 },
    { c: { CONV_CH: 200, K_CONV: 4, T_COL: 320 }, n: 6, cut: 5 },
    { c: { CONV_CH: 200, K_CONV: 4, T_COL: 0 }, n: 6, cut: 0 },
    { c: { CONV_CH: 200, K_CONV: 4, T_COL: 0 }, n: 6, cut: 9 },
  );
  const owned: GPUBuffer[] = [];
  const reads: GPUBuffer[] = [];
  const ring0s: Float32Array[] = [];
  const enc = device.createCommandEncoder();
  const pass = enc.beginComputePass();
  for (const { c, n, cut } of cases) {
    const ringWords = c.CONV_CH * c.K_CONV;
    const pos0 = rng.int(1, 1 << 20);
    const xT = c.T_COL || c.CONV_CH;
    const xAll = new Float32Array((n - 1) * xT + c.CONV_CH).fill(Number.NaN);
    for (let t = 0; t < n; t++) xAll.set(rng.normals(c.CONV_CH), t * xT);
    const ring0 = rng.normals(ringWords);
    ring0s.push(ring0);
    const mk = (buf: GPUBuffer) => (owned.push(buf), buf);
    const xQkv = mk(upload(device, xAll));
    const ring = mk(upload(device, ring0, "conv_ring"));
    const tap = mk(poisoned(device, ringWords, POISON_F32, "tap"));
    // Its tap, then (the engine's order) the ordinary update of all n tokens on the same ring.
    const params = mk(
      upload(device, cut < n ? packGdnChunkParams(pos0, n, cut) : Uint32Array.of(pos0, n, cut)),
    );
    const ringTap = await cache.get(GDN_CONV_RING_TAP, c);
    const tapBindings = { params, xQkv, convRing: ring, tap: { buffer: tap, size: ringWords * 4 } };
    encodeGdnConvRing(pass, {
      device,
      pipeline: ringTap,
      constants: c,
      bindings: tapBindings,
      maxTokens: n,
      tap: true,
    });
    const pipeline = await cache.get(GDN_CONV_RING, c);
    encodeGdnConvRing(pass, {
      device,
      pipeline,
      constants: c,
      bindings: { params, xQkv, convRing: ring },
      maxTokens: n,
    });
    // Want: an ordinary dispatch of the first min(cut, n) tokens on a copy of the ring (none at cut 0), and the
    // ordinary dispatch of all n on another.
    const m = Math.min(cut, n);
    const want = mk(upload(device, ring0, "want"));
    const wantParams = mk(upload(device, Uint32Array.of(pos0, m)));
    const wantBindings = { params: wantParams, xQkv, convRing: want };
    if (m > 0) {
      encodeGdnConvRing(pass, { device, pipeline, constants: c, bindings: wantBindings, maxTokens: m });
    }
    const after = mk(upload(device, ring0, "after"));
    encodeGdnConvRing(pass, {
      device,
      pipeline,
      constants: c,
      bindings: { params, xQkv, convRing: after },
      maxTokens: n,
    });
    // The tap alone leaves its ring as it was.
    const alone = mk(upload(device, ring0, "alone"));
    const tap2 = mk(poisoned(device, ringWords, POISON_F32, "tap"));
    encodeGdnConvRing(pass, {
      device,
      pipeline: ringTap,
      constants: c,
      bindings: { ...tapBindings, convRing: alone, tap: tap2 },
      maxTokens: n,
      tap: true,
    });
    reads.push(tap, want, ring, after, alone);
  }
  pass.end();
  device.queue.submit([enc.finish()]);
  const got = await readAll(device, reads);
  cases.forEach(({ c, n, cut }, i) => {
    const ringWords = c.CONV_CH * c.K_CONV;
    const what = `gdn_conv_ring_tap${JSON.stringify(c)} n ${n} cut ${cut} (seed ${rng.seed})`;
    const [tap, want, ring, after, alone] = got.slice(5 * i, 5 * i + 5).map((b) => new Uint32Array(b));
    // Cut 0 (a chunk with no snapshot inside): nothing reads the tap, and the kernel writes none of it.
    if (cut === 0) assertPoisoned(tap!, POISON_F32, `${what}: tap untouched`);
    else assert.deepEqual(tap!.subarray(0, ringWords), want!.subarray(0, ringWords), `${what}: tap`);
    assertPoisoned(tap!.subarray(ringWords), POISON_F32, `${what}: tap guard`);
    assert.deepEqual(alone, new Uint32Array(ring0s[i]!.buffer), `${what}: the ring after the tap alone`);
    assert.deepEqual(ring, after, `${what}: the ring after the tap and the update of all n tokens`);
  });
  owned.forEach((b) => b.destroy());
});

Deno.test("gdn_conv_ring: shape checks throw before encoding", async () => {
  const { device } = await testGpu();
  const c = { CONV_CH: 100, K_CONV: 4, T_COL: 0 };
  const buf = (words: number) => device.createBuffer({ size: words * 4, usage: GPUBufferUsage.STORAGE });
  const bindings = { params: buf(2), xQkv: buf(100 * 3), convRing: buf(100 * 4) };
  checkGdnConvRing(c, { bindings, maxTokens: 3 });
  assert.throws(
    () => checkGdnConvRing(c, { bindings, maxTokens: 4 }),
    /binding xQkv has 1200 bytes but needs 1600/,
  );
  assert.throws(() => checkGdnConvRing({ ...c, K_CONV: 5 }, { bindings, maxTokens: 1 }), /binding convRing/);
  assert.throws(() => checkGdnConvRing({ ...c, K_CONV: 0 }, { bindings, maxTokens: 1 }), /K_CONV must be/);
  assert.throws(
    () => checkGdnConvRing({ ...c, T_COL: 99 }, { bindings, maxTokens: 1 }),
    /T_COL=99 must be 0/,
  );
  // Tokens 120 words apart: 3 tokens need 2·120 + 100 words.
  const strided = buf(340);
  const short = buf(339);
  checkGdnConvRing({ ...c, T_COL: 120 }, { bindings: { ...bindings, xQkv: strided }, maxTokens: 3 });
  assert.throws(
    () => checkGdnConvRing({ ...c, T_COL: 120 }, { bindings: { ...bindings, xQkv: short }, maxTokens: 3 }),
    /binding xQkv has 1356 bytes but needs 1360/,
  );
  // The tap: given exactly with `tap`, ring-sized; params then [pos0, n, cut].
  const tap = buf(400);
  const params3 = buf(3);
  checkGdnConvRing(c, { bindings: { ...bindings, params: params3, tap }, maxTokens: 3, tap: true });
  assert.throws(() => checkGdnConvRing(c, { bindings, maxTokens: 3, tap: true }), /tap binding is missing/);
  assert.throws(
    () => checkGdnConvRing(c, { bindings: { ...bindings, tap }, maxTokens: 3 }),
    /a tap binding is given to the ordinary dispatch/,
  );
  assert.throws(
    () =>
      checkGdnConvRing(c, {
        bindings: { ...bindings, params: params3, tap: short },
        maxTokens: 3,
        tap: true,
      }),
    /gdn_conv_ring_tap binding tap has 1356 bytes but needs 1600/,
  );
  assert.throws(
    () => checkGdnConvRing(c, { bindings: { ...bindings, tap }, maxTokens: 3, tap: true }),
    /gdn_conv_ring_tap binding params has 8 bytes but needs 12 \(u32 ne=\[3\]: \[pos0, n, cut\]/,
  );
  assert.throws(
    () =>
      checkGdnConvRing(c, {
        bindings: { ...bindings, params: params3, tap: bindings.convRing },
        maxTokens: 3,
        tap: true,
      }),
    /gdn_conv_ring_tap binding tap overlaps binding convRing/,
  );
  [strided, short, tap, params3].forEach((b) => b.destroy());
  Object.values(bindings).forEach((b) => b.destroy());
});
