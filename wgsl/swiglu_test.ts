import assert from "node:assert/strict";
import { PipelineCache } from "../engine/gpu/kernel.ts";
import { silu } from "../tests/ref/ops.ts";
import { poisoned, readAll, testGpu, upload } from "../tests/util/gpu.ts";
import { Rng } from "../tests/util/rng.ts";
import { encodeSwiglu, SWIGLU, swigluBindGroup, type SwigluConstants } from "./swiglu.ts";
import { checkF32 } from "./_test_util.ts";

/** One exp, add, divide and multiply in f32: a few ulp (absolute floor for silu's zero near z = 0). */
const TOL = { atol: 1e-7, rtol: 2e-6 };

Deno.test("swiglu matches silu(g) * u", async () => {
  const rng = new Rng();
  const { device } = await testGpu();
  const cache = new PipelineCache(device);
  const cases: [number, number, number][] = [
    [8, 1, 64], // debug
    [512, 8, 256], // nFfExp for 8 experts
    [1021, 2, 64], // not a multiple of WG
    [rng.int(1, 3000), rng.int(1, 4), 128],
  ];
  const enc = device.createCommandEncoder();
  const pass = enc.beginComputePass();
  const runs = [];
  for (const [n, nTokens, wg] of cases) {
    const c: SwigluConstants = { N: n, WG: wg };
    const g = rng.normals(n * nTokens, 4);
    const u = rng.normals(n * nTokens, 2);
    const b = { g: upload(device, g), u: upload(device, u), y: poisoned(device, n * nTokens) };
    const pipeline = await cache.get(SWIGLU, c);
    const bg = swigluBindGroup(device, { pipeline, constants: c, nTokens, buffers: b });
    encodeSwiglu(pass, { pipeline, bindGroup: bg, constants: c, nTokens });
    runs.push({ c, nTokens, b, ref: Float64Array.from(g, (z, i) => silu(z) * u[i]!) });
  }
  pass.end();
  device.queue.submit([enc.finish()]);
  const outs = await readAll(device, runs.map((r) => r.b.y));
  runs.forEach((r, i) => {
    checkF32(outs[i]!, r.ref, TOL, {
      what: `swiglu N=${r.c.N} WG=${r.c.WG} nTokens=${r.nTokens}`,
      seed: rng.seed,
    });
    Object.values(r.b).forEach((b) => b.destroy());
  });
});

Deno.test("swiglu shape check throws before encoding", async () => {
  const { device } = await testGpu();
  const c: SwigluConstants = { N: 512, WG: 256 };
  const pipeline = await new PipelineCache(device).get(SWIGLU, c);
  const small = device.createBuffer({ size: 1024, usage: GPUBufferUsage.STORAGE });
  assert.throws(
    () =>
      swigluBindGroup(device, {
        pipeline,
        constants: c,
        nTokens: 1,
        buffers: { g: small, u: small, y: small },
      }),
    /binding g holds 1024 bytes but ne=\[512, 1\]/,
  );
  small.destroy();
});
