import assert from "node:assert/strict";
import { PipelineCache } from "../engine/gpu/kernel.ts";
import { sigmoid } from "../tests/ref/ops.ts";
import { GUARD_WORDS, POISON_F32, readAll, testGpu, upload } from "../tests/util/gpu.ts";
import { Rng } from "../tests/util/rng.ts";
import { ADD, addBindGroup, type AddConstants, encodeAdd } from "./add.ts";
import { checkF32 } from "./_test_util.ts";

/**
 * One f32 add (and one exp, divide and multiply when gated): a few ulp of the operands (|acc|, |x| < ~12),
 * not of the sum, which can cancel: hence the absolute part.
 */
const TOL = { atol: 3e-6, rtol: 1e-6 };

Deno.test("add: residual add in place, plain and sigmoid-gated per token", async () => {
  const rng = new Rng();
  const { device } = await testGpu();
  const cache = new PipelineCache(device);
  const cases: [number, number, number, boolean][] = [
    [8, 1, 64, false], // debug
    [2048, 1, 256, false], // nEmbd
    [2048, 3, 256, true],
    [1021, 2, 64, true], // not a multiple of WG
    [rng.int(1, 5000), rng.int(1, 5), 128, rng.float() < 0.5],
  ];
  const enc = device.createCommandEncoder();
  const pass = enc.beginComputePass();
  const runs = [];
  for (const [n, nTokens, wg, gated] of cases) {
    const c: AddConstants = { N: n, WG: wg, GATED: gated };
    const acc = rng.normals(n * nTokens, 2);
    const x = rng.normals(n * nTokens, 2);
    const gate = rng.normals(nTokens, 3);
    // acc carries a poisoned guard band past its end: the kernel must not write there.
    const accInit = new Uint32Array(n * nTokens + GUARD_WORDS).fill(POISON_F32);
    accInit.set(new Uint32Array(acc.buffer));
    const b = {
      acc: upload(device, accInit),
      x: upload(device, x),
      gate: gated ? upload(device, gate) : undefined,
    };
    const pipeline = await cache.get(ADD, c);
    const buffers = { acc: b.acc, x: b.x, gate: b.gate ?? b.x };
    const bg = addBindGroup(device, { pipeline, constants: c, nTokens, buffers });
    encodeAdd(pass, { pipeline, bindGroup: bg, constants: c, nTokens });
    const ref = Float64Array.from(acc, (a, i) => a + (gated ? sigmoid(gate[Math.floor(i / n)]!) : 1) * x[i]!);
    runs.push({ c, nTokens, b, ref });
  }
  pass.end();
  device.queue.submit([enc.finish()]);
  const outs = await readAll(device, runs.map((r) => r.b.acc));
  runs.forEach((r, i) => {
    const what = `add N=${r.c.N} WG=${r.c.WG} GATED=${r.c.GATED} nTokens=${r.nTokens}`;
    checkF32(outs[i]!, r.ref, TOL, { what, seed: rng.seed });
    r.b.acc.destroy();
    r.b.x.destroy();
    r.b.gate?.destroy();
  });
});

Deno.test("add shape check throws before encoding", async () => {
  const { device } = await testGpu();
  const c: AddConstants = { N: 64, WG: 64, GATED: true };
  const pipeline = await new PipelineCache(device).get(ADD, c);
  const big = device.createBuffer({ size: 1024, usage: GPUBufferUsage.STORAGE });
  const small = device.createBuffer({ size: 4, usage: GPUBufferUsage.STORAGE });
  assert.throws(
    () =>
      addBindGroup(device, {
        pipeline,
        constants: c,
        nTokens: 2,
        buffers: { acc: big, x: big, gate: small },
      }),
    /binding gate holds 4 bytes but ne=\[2\]/,
  );
  big.destroy();
  small.destroy();
});
