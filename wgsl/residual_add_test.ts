import { bindGroup, PipelineCache } from "./kernel.ts";
import {
  checkResidualAdd,
  RESIDUAL_ADD,
  RESIDUAL_ADD_BINDINGS,
  type ResidualAddConstants,
  residualAddGrid,
} from "./residual_add.ts";
import { checkF32 } from "./_test_util.ts";
import { poisoned, readAll, testGpu, upload } from "../tests/util/gpu.ts";
import { Rng } from "../tests/util/rng.ts";

// A sum of at most 11 f32 terms plus one exp: a few ulps of the largest term.
const TOL = { atol: 1e-6, rtol: 1e-5 };

Deno.test("residual_add: plain add and the weighted MoE sum with the gated shared expert", async () => {
  const rng = new Rng();
  const { device } = await testGpu();
  const cache = new PipelineCache(device);
  const plain = { NORM: false, EPS: 0 };
  const norm = { NORM: true, EPS: 1e-6 };
  // gCol: the gate logit's stride per token (params[1]; 0 means 1): a batched router's output.
  const cases: (ResidualAddConstants & { n: number; maxTokens: number; gCol?: number })[] = [
    { D: 300, N_TERMS: 1, WEIGHTED: false, SHARED: false, ...plain, n: 3, maxTokens: 4 },
    { D: 256, N_TERMS: 8, WEIGHTED: true, SHARED: true, ...plain, n: 1, maxTokens: 1 },
    { D: 2048, N_TERMS: 10, WEIGHTED: true, SHARED: true, ...plain, n: 5, maxTokens: 7 },
    { D: 300, N_TERMS: 8, WEIGHTED: true, SHARED: true, ...plain, n: 3, maxTokens: 3, gCol: 257 },
    // With the norm: a row length that 256 does not divide, rows past n_tokens, the real MoE shape.
    { D: 300, N_TERMS: 1, WEIGHTED: false, SHARED: false, ...norm, n: 3, maxTokens: 4 },
    { D: 2048, N_TERMS: 8, WEIGHTED: true, SHARED: true, ...norm, n: 2, maxTokens: 2 },
    { D: 2048, N_TERMS: 8, WEIGHTED: true, SHARED: true, ...norm, n: 4, maxTokens: 4, gCol: 9 },
  ];
  const enc = device.createCommandEncoder();
  const pass = enc.beginComputePass();
  const outs: GPUBuffer[] = [];
  const refs: Float64Array[] = [];
  const what: string[] = [];
  for (const c of cases) {
    const e = rng.normals(c.D * c.N_TERMS * c.maxTokens);
    const w = rng.normals(c.N_TERMS * c.maxTokens);
    const sh = rng.normals(c.D * c.maxTokens);
    const gCol = c.gCol ?? 1;
    const g = rng.normals(c.maxTokens * gCol, 3);
    const h0 = rng.normals(c.D * c.maxTokens);
    const h = poisoned(device, c.D * c.maxTokens);
    device.queue.writeBuffer(h, 0, h0);
    const ref = Float64Array.from(h0);
    for (let t = 0; t < c.n; t++) {
      for (let d = 0; d < c.D; d++) {
        let acc = 0;
        for (let s = 0; s < c.N_TERMS; s++) {
          acc += (c.WEIGHTED ? w[t * c.N_TERMS + s]! : 1) * e[(t * c.N_TERMS + s) * c.D + d]!;
        }
        if (c.SHARED) acc += sh[t * c.D + d]! / (1 + Math.exp(-g[t * gCol]!));
        ref[t * c.D + d] = h0[t * c.D + d]! + acc;
      }
    }
    // The normed rows (NORM): y = h / sqrt(mean(h²) + eps) · nw for t < n; rows past n stay poisoned (the
    // guard words checked after the reference).
    const nw = rng.normals(c.D);
    const y = poisoned(device, c.D * c.maxTokens);
    const yRef = new Float64Array(c.D * c.n);
    for (let t = 0; t < c.n; t++) {
      let ss = 0;
      for (let d = 0; d < c.D; d++) ss += ref[t * c.D + d]! ** 2;
      const scale = 1 / Math.sqrt(ss / c.D + c.EPS);
      for (let d = 0; d < c.D; d++) yRef[t * c.D + d] = ref[t * c.D + d]! * scale * nw[d]!;
    }
    const b = {
      params: upload(device, Uint32Array.of(c.n, c.gCol ?? 0)),
      e: upload(device, e),
      weights: upload(device, w),
      sh: upload(device, sh),
      g: upload(device, g),
      h: { buffer: h, size: 4 * c.D * c.maxTokens },
      nw: upload(device, nw),
      y: { buffer: y, size: 4 * c.D * c.maxTokens },
    };
    const consts = {
      D: c.D,
      N_TERMS: c.N_TERMS,
      WEIGHTED: c.WEIGHTED,
      SHARED: c.SHARED,
      NORM: c.NORM,
      EPS: c.EPS,
    };
    checkResidualAdd(consts, b, c.maxTokens);
    const p = await cache.get(RESIDUAL_ADD, consts);
    pass.setPipeline(p);
    pass.setBindGroup(0, bindGroup(device, p, RESIDUAL_ADD_BINDINGS.map((n) => b[n])));
    pass.dispatchWorkgroups(...residualAddGrid(consts, c.maxTokens));
    outs.push(h);
    refs.push(ref);
    what.push(`residual_add ${JSON.stringify(c)}: h`);
    if (c.NORM) {
      outs.push(y);
      refs.push(yRef);
      what.push(`residual_add ${JSON.stringify(c)}: normed rows y`);
    }
  }
  pass.end();
  device.queue.submit([enc.finish()]);
  const got = await readAll(device, outs);
  what.forEach((w, i) => checkF32(got[i]!, refs[i]!, TOL, { what: w, seed: rng.seed }));
});
