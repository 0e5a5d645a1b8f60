import assert from "node:assert/strict";
import { bindGroup, PipelineCache } from "./kernel.ts";
import {
  checkCombineQ8,
  COMBINE_Q8,
  COMBINE_Q8_BINDINGS,
  type CombineQ8Constants,
  combineQ8Grid,
  combineQ8Params,
} from "./combine_q8.ts";
import { RESIDUAL_ADD, RESIDUAL_ADD_BINDINGS, residualAddGrid } from "./residual_add.ts";
import { decodeQ8x, prepareQuantizeQ8, q8xBytes, quantizeQ8Params } from "./matvec_q8.ts";
import { checkF32 } from "./_test_util.ts";
import { GUARD_WORDS, POISON_F32, poisoned, readAll, testGpu, upload } from "../tests/util/gpu.ts";
import { assertPoisoned } from "../tests/util/close.ts";
import { Rng } from "../tests/util/rng.ts";
import type { GgmlTypeName } from "../engine/quant/types.ts";

// h: a sum of at most 11 f32 terms plus one exp (residual_add_test's tolerance); y adds the norm's scale.
const TOL = { atol: 1e-6, rtol: 1e-5 };
const Y_TOL = { atol: 1e-5, rtol: 1e-4 };
// The byte orders of xq's two copies: order 0 (Q8_0 and the K-quants), order 1 (IQ4_XS).
const ORDERS: readonly GgmlTypeName[] = ["Q8_0", "IQ4_XS"];

// The float64 reference of the combine and the norm, and, bit for bit, the dispatches the kernel replaces in
// a batched step: residual_add (the MoE combine), then quantize_q8 with the norm in each byte order.
Deno.test("combine_q8: the MoE combine, the next norm and its int8 rows ≡ residual_add + quantize_q8 NORM, bit for bit", async () => {
  const rng = new Rng();
  const { device } = await testGpu();
  const cache = new PipelineCache(device);
  // gCol: the gate logit's stride per token (a batched router's output keeps it after the expert logits).
  const cases = [
    { D: 256, N_TERMS: 8, n: 3, gCol: 9 },
    { D: 2048, N_TERMS: 8, n: 8, gCol: 257 },
    { D: 96, N_TERMS: 2, n: 2, gCol: 0 }, // fewer quads than invocations
    { D: 2048, N_TERMS: 10, n: 1, gCol: 0 },
  ];
  for (const c of cases) {
    const what = `combine_q8 ${JSON.stringify(c)} (seed ${rng.seed})`;
    const consts: CombineQ8Constants = { D: c.D, N_TERMS: c.N_TERMS, EPS: 1e-6 };
    const e = rng.normals(c.D * c.N_TERMS * c.n);
    const w = rng.normals(c.N_TERMS * c.n);
    const sh = rng.normals(c.D * c.n);
    const gs = Math.max(c.gCol, 1);
    const g = rng.normals((c.n - 1) * gs + 1, 3);
    const h0 = rng.normals(c.D * c.n);
    const nw = rng.normals(c.D);
    const colWords = q8xBytes(c.D) / 4;
    // The byte order 1 copy after a gap of 8 words that must stay poisoned.
    const alt = c.n * colWords + 8;
    const inputs = {
      e: upload(device, e),
      weights: upload(device, w),
      sh: upload(device, sh),
      g: upload(device, g),
    };
    const nwBuf = upload(device, nw);
    const h = upload(device, h0);
    const y = poisoned(device, c.D * c.n);
    const xq = poisoned(device, alt + c.n * colWords);
    const params = device.createBuffer({ size: 16, usage: GPUBufferUsage.UNIFORM | GPUBufferUsage.COPY_DST });
    device.queue.writeBuffer(params, 0, combineQ8Params(c.n, c.gCol, alt));
    const b = { params, ...inputs, h, nw: nwBuf, y: { buffer: y, size: 4 * c.D * c.n }, xq };
    checkCombineQ8(consts, b, c.n, c.gCol, alt);
    // The dispatches it replaces, on a copy of h.
    const hB = upload(device, h0);
    const yB = poisoned(device, c.D * c.n);
    const xqB = ORDERS.map(() => poisoned(device, c.n * colWords));
    const enc = device.createCommandEncoder();
    const pass = enc.beginComputePass();
    const p = await cache.get(COMBINE_Q8, consts);
    pass.setPipeline(p);
    pass.setBindGroup(0, bindGroup(device, p, COMBINE_Q8_BINDINGS.map((k) => b[k])));
    pass.dispatchWorkgroups(...combineQ8Grid(c.n));
    const rc = { D: c.D, N_TERMS: c.N_TERMS, WEIGHTED: true, SHARED: true, NORM: false, EPS: 0 };
    // Without NORM residual_add reads no nw and writes no y: any buffers bound nowhere else.
    const rb = {
      params: upload(device, Uint32Array.of(c.n, c.gCol)),
      ...inputs,
      h: hB,
      nw: inputs.e,
      y: poisoned(device, 4),
    };
    const rp = await cache.get(RESIDUAL_ADD, rc);
    pass.setPipeline(rp);
    pass.setBindGroup(0, bindGroup(device, rp, RESIDUAL_ADD_BINDINGS.map((k) => rb[k])));
    pass.dispatchWorkgroups(...residualAddGrid(rc, c.n));
    const qParams: GPUBuffer[] = [];
    for (const [i, type] of ORDERS.entries()) {
      const shape = { type, k: c.D, cols: c.n, xStride: c.D, norm: { eps: consts.EPS } };
      const qp = device.createBuffer({ size: 16, usage: GPUBufferUsage.UNIFORM | GPUBufferUsage.COPY_DST });
      device.queue.writeBuffer(qp, 0, quantizeQ8Params(shape));
      qParams.push(qp);
      const op = await prepareQuantizeQ8(cache, {
        device,
        shape,
        bindings: { params: qp, x: hB, xq: { buffer: xqB[i]!, size: 4 * c.n * colWords }, nw: nwBuf, xn: yB },
      });
      pass.setPipeline(op.pipeline);
      pass.setBindGroup(0, op.bindGroup);
      pass.dispatchWorkgroups(op.grid[0], op.grid[1]);
    }
    pass.end();
    device.queue.submit([enc.finish()]);
    const [gh, gy, gxq, bh, by, bxq0, bxq1] = await readAll(device, [h, y, xq, hB, yB, ...xqB]);

    // The float64 reference.
    const hRef = Float64Array.from(h0);
    const yRef = new Float64Array(c.D * c.n);
    for (let t = 0; t < c.n; t++) {
      const gate = 1 / (1 + Math.exp(-g[t * gs]!));
      let ss = 0;
      for (let d = 0; d < c.D; d++) {
        let acc = 0;
        for (let s = 0; s < c.N_TERMS; s++) acc += w[t * c.N_TERMS + s]! * e[(t * c.N_TERMS + s) * c.D + d]!;
        hRef[t * c.D + d] = h0[t * c.D + d]! + acc + sh[t * c.D + d]! * gate;
        ss += hRef[t * c.D + d]! ** 2;
      }
      const scale = 1 / Math.sqrt(ss / c.D + consts.EPS);
      for (let d = 0; d < c.D; d++) yRef[t * c.D + d] = hRef[t * c.D + d]! * scale * nw[d]!;
    }
    checkF32(gh!, hRef, TOL, { what: `${what}: h`, seed: rng.seed, guard: false });
    checkF32(gy!, yRef, Y_TOL, { what: `${what}: normed rows y`, seed: rng.seed });
    // Each copy's int8 rows: d = max|y| / 127 per 32 elements, each value y rounded to the nearest step.
    const yGot = new Float32Array(gy!, 0, c.D * c.n);
    for (const [i, type] of ORDERS.entries()) {
      for (let t = 0; t < c.n; t++) {
        const at = 4 * ((i === 0 ? 0 : alt) + t * colWords);
        const { q, d } = decodeQ8x(type, c.D, new Uint8Array(gxq!, at, q8xBytes(c.D)));
        for (let k = 0; k < c.D; k++) {
          const v = yGot[t * c.D + k]!;
          const dk = d[k >> 5]!;
          let amax = 0;
          for (let j = k & ~31; j < (k & ~31) + 32; j++) amax = Math.max(amax, Math.abs(yGot[t * c.D + j]!));
          assert.ok(Math.abs(dk - amax / 127) <= 1e-6 * amax, `${what}: ${type} column ${t} scale ${k >> 5}`);
          assert.ok(
            Math.abs(q[k]! * dk - v) <= dk * (0.5 + 1e-3),
            `${what}: ${type} column ${t} element ${k}: ${q[k]} · ${dk} for ${v}`,
          );
        }
      }
    }
    // Bit for bit against the replaced dispatches, and nothing written past either copy or between them.
    assert.deepEqual(new Uint32Array(gh!), new Uint32Array(bh!), `${what}: h against residual_add`);
    const words = c.D * c.n;
    assert.deepEqual(new Uint32Array(gy!, 0, words), new Uint32Array(by!, 0, words), `${what}: y against xn`);
    const qWords = c.n * colWords;
    assert.deepEqual(new Uint32Array(gxq!, 0, qWords), new Uint32Array(bxq0!, 0, qWords), `${what}: order 0`);
    assert.deepEqual(
      new Uint32Array(gxq!, 4 * alt, qWords),
      new Uint32Array(bxq1!, 0, qWords),
      `${what}: order 1`,
    );
    assertPoisoned(new Uint32Array(gxq!, 4 * qWords, 8), POISON_F32, `${what}: the gap between the copies`);
    assertPoisoned(new Uint32Array(gxq!, 4 * (alt + qWords), GUARD_WORDS), POISON_F32, `${what}: past xq`);
    [...Object.values(inputs), nwBuf, h, y, xq, params, hB, yB, ...xqB, rb.params, rb.y, ...qParams].forEach((
      x,
    ) => x.destroy());
  }
});

Deno.test("combine_q8: bindings too small and an overlapping second copy are refused before encoding", () => {
  const buf = (bytes: number) => ({ size: bytes }) as unknown as GPUBuffer;
  const c: CombineQ8Constants = { D: 256, N_TERMS: 8, EPS: 1e-6 };
  const colWords = q8xBytes(256) / 4;
  const ok = {
    params: buf(16),
    e: buf(4 * 256 * 8 * 2),
    weights: buf(4 * 16),
    sh: buf(4 * 256 * 2),
    g: buf(4 * 10),
    h: buf(4 * 256 * 2),
    nw: buf(4 * 256),
    y: buf(4 * 256 * 2),
    xq: buf(4 * 4 * colWords),
  };
  checkCombineQ8(c, ok, 2, 9, 2 * colWords);
  assert.throws(() => checkCombineQ8(c, ok, 2, 9, colWords), /byte order 1 copy starts/);
  assert.throws(() => checkCombineQ8(c, { ...ok, e: buf(4 * 256 * 8) }, 2, 9, 2 * colWords), /binding e/);
  assert.throws(() => checkCombineQ8(c, { ...ok, g: buf(4 * 9) }, 2, 9, 2 * colWords), /binding g/);
  assert.throws(() => checkCombineQ8({ ...c, D: 100 }, ok, 2, 9, 2 * colWords), /multiple of 32/);
});
