import assert from "node:assert/strict";
import { bindGroup, PipelineCache } from "./kernel.ts";
import { dequantizeRow } from "../engine/quant/dequant.ts";
import { type GgmlTypeName, TYPE_ID } from "../engine/quant/types.ts";
import {
  checkGetRows,
  GET_ROWS,
  GET_ROWS_BINDINGS,
  getRowsConstants,
  getRowsGrid,
  getRowsParams,
} from "./get_rows.ts";
import { randomWeights } from "./_quant_testing.ts";
import { checkF32 } from "./_test_util.ts";
import { poisoned, readAll, testGpu, upload } from "../tests/util/gpu.ts";
import { Rng } from "../tests/util/rng.ts";

// Dequantization is exact in f32 (one product and one subtraction per element, as the reference rounds).
const TOL = { atol: 0, rtol: 1e-6 };

Deno.test("get_rows: every type, ids from a GPU buffer at an offset, out-of-range id gives zeros", async () => {
  const rng = new Rng();
  const { device } = await testGpu();
  const cache = new PipelineCache(device);
  const cases: { type: GgmlTypeName; k: number; n: number; ids: number[]; idOff: number }[] = [];
  for (const type of Object.keys(TYPE_ID) as GgmlTypeName[]) {
    const k = type.endsWith("_K") || type === "IQ4_XS" ? 512 : 96;
    const n = rng.int(3, 40);
    const ids = Array.from({ length: rng.int(1, 6) }, () => rng.int(0, n));
    ids.push(n - 1, 0);
    cases.push({ type, k, n, ids, idOff: rng.int(0, 5) });
  }
  const bad = { type: "Q8_0" as GgmlTypeName, k: 64, n: 5, ids: [2, 5, 1], idOff: 0 };
  cases.push(bad);
  const enc = device.createCommandEncoder();
  const pass = enc.beginComputePass();
  const outs: GPUBuffer[] = [];
  const weights: Uint8Array[] = [];
  for (const c of cases) {
    const w = randomWeights(rng, c.type, c.k, c.n, 0.5);
    weights.push(w);
    const shape = { type: c.type, k: c.k, n: c.n, nTokens: c.ids.length };
    const consts = getRowsConstants(shape, c.idOff);
    const ids = new Uint32Array(c.idOff + c.ids.length).fill(0xffffffff);
    ids.set(c.ids, c.idOff);
    const y = poisoned(device, c.k * c.ids.length);
    outs.push(y);
    const b = {
      params: upload(device, getRowsParams(shape)),
      ids: upload(device, ids),
      weights: upload(device, w),
      y: { buffer: y, size: 4 * c.k * c.ids.length },
    };
    checkGetRows(shape, consts, b);
    const p = await cache.get(GET_ROWS, consts);
    pass.setPipeline(p);
    pass.setBindGroup(0, bindGroup(device, p, GET_ROWS_BINDINGS.map((n) => b[n])));
    pass.dispatchWorkgroups(...getRowsGrid(shape));
  }
  pass.end();
  device.queue.submit([enc.finish()]);
  const got = await readAll(device, outs);
  cases.forEach((c, i) => {
    const ref = new Float64Array(c.k * c.ids.length);
    c.ids.forEach((id, t) => {
      if (id < c.n) ref.set(dequantizeRow(c.type, weights[i]!, c.k, id), t * c.k);
    });
    checkF32(got[i]!, ref, TOL, {
      what: `get_rows ${c.type} k=${c.k} n=${c.n} ids=${c.ids}`,
      seed: rng.seed,
    });
  });
  assert.throws(
    () =>
      checkGetRows({ type: "Q8_0", k: 64, n: 5, nTokens: 4 }, { TYPE: 8, ID_OFF: 0 }, {
        params: upload(device, new Uint32Array(4)),
        ids: upload(device, new Uint32Array(4)),
        weights: upload(device, new Uint8Array(5 * 68)),
        y: upload(device, new Float32Array(64 * 3)),
      }),
    /binding y holds 768 bytes but ne=\[64, 4\]/,
  );
});
