import assert from "node:assert/strict";
import { PipelineCache } from "./kernel.ts";
import { assertClose, assertPoisoned } from "../tests/util/close.ts";
import { POISON_F32, poisoned, readAll, testGpu, upload } from "../tests/util/gpu.ts";
import { Rng } from "../tests/util/rng.ts";
import {
  checkGdnConvRing,
  encodeGdnConvRing,
  GDN_CONV_RING,
  type GdnConvRingConstants,
} from "./gdn_conv_ring.ts";
import { packGdnParams } from "./gdn_step.ts";

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
  [strided, short].forEach((b) => b.destroy());
  Object.values(bindings).forEach((b) => b.destroy());
});
