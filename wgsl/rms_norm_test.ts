import { PipelineCache } from "./kernel.ts";
import { Rng } from "../tests/util/rng.ts";
import { poisoned, readAll, testGpu, upload } from "../tests/util/gpu.ts";
import { encodeRmsNorm, RMS_NORM, rmsNormBindGroup, type RmsNormConstants } from "./rms_norm.ts";
import { checkF32 } from "./_test_util.ts";
import assert from "node:assert/strict";

/** f32 sum of up to 2048 squares in a tree (error ~ log2(N) ulp) plus sqrt, divide and two multiplies. */
const TOL = { atol: 1e-6, rtol: 4e-6 };

function refRmsNorm(x: Float32Array, w: Float32Array, n: number, eps: number): Float64Array {
  const out = new Float64Array(x.length);
  for (let r = 0; r < x.length / n; r++) {
    let s = 0;
    for (let i = 0; i < n; i++) s += x[r * n + i]! ** 2;
    const scale = 1 / Math.sqrt(s / n + eps);
    for (let i = 0; i < n; i++) out[r * n + i] = x[r * n + i]! * scale * w[i]!;
  }
  return out;
}

Deno.test("rms_norm matches the float64 reference on debug, real and awkward shapes", async () => {
  const rng = new Rng();
  const { device } = await testGpu();
  const cache = new PipelineCache(device);
  const shapes: [number, number, number][] = [
    [8, 1, 64], // debug
    [2048, 3, 256], // nEmbd
    [256, 5, 64], // headDim rows
    [1, 2, 64],
    [1021, 2, 128], // not a multiple of WG
    [rng.int(1, 3000), rng.int(1, 6), 256], // random
  ];
  const enc = device.createCommandEncoder();
  const pass = enc.beginComputePass();
  const cases = [];
  for (const [n, nRows, wg] of shapes) {
    const c: RmsNormConstants = { N: n, EPS: 1e-6, WG: wg };
    const x = rng.normals(n * nRows, 3);
    const w = rng.normals(n, 1);
    const pipeline = await cache.get(RMS_NORM, c);
    const buffers = { x: upload(device, x), w: upload(device, w), y: poisoned(device, n * nRows) };
    const bg = rmsNormBindGroup(device, { pipeline, constants: c, nRows, buffers });
    encodeRmsNorm(pass, { pipeline, bindGroup: bg, constants: c, nRows });
    cases.push({ c, nRows, ref: refRmsNorm(x, w, n, c.EPS), buffers });
  }
  pass.end();
  device.queue.submit([enc.finish()]);
  const outs = await readAll(device, cases.map((k) => k.buffers.y));
  cases.forEach((k, i) => {
    checkF32(outs[i]!, k.ref, TOL, {
      what: `rms_norm N=${k.c.N} WG=${k.c.WG} ne=[${k.c.N}, ${k.nRows}]`,
      seed: rng.seed,
    });
    Object.values(k.buffers).forEach((b) => b.destroy());
  });
});

Deno.test("rms_norm shape check throws before encoding", async () => {
  const { device } = await testGpu();
  const c: RmsNormConstants = { N: 64, EPS: 1e-6, WG: 64 };
  const pipeline = await new PipelineCache(device).get(RMS_NORM, c);
  const small = device.createBuffer({ size: 64 * 4, usage: GPUBufferUsage.STORAGE });
  assert.throws(
    () =>
      rmsNormBindGroup(device, {
        pipeline,
        constants: c,
        nRows: 2,
        buffers: { x: small, w: small, y: small },
      }),
    /binding x holds 256 bytes but ne=\[64, 2\]/,
  );
  assert.throws(
    () =>
      rmsNormBindGroup(device, {
        pipeline,
        constants: { ...c, WG: 48 },
        nRows: 1,
        buffers: { x: small, w: small, y: small },
      }),
    /power of two/,
  );
  small.destroy();
});
