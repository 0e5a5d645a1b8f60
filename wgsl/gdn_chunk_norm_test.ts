import { bindGroup, PipelineCache } from "./kernel.ts";
import { GDN_CHUNK_NORM, GDN_CHUNK_NORM_BINDINGS, gdnNormConstants } from "./gdn_chunk.ts";
import { q8Layout, q8xBytes } from "./matvec_q8.ts";
import { quantizeOnGpu } from "./_q8_testing.ts";
import { GUARD_WORDS, POISON_F32, poisoned, readAll, testGpu, upload } from "../tests/util/gpu.ts";
import { assertPoisoned } from "../tests/util/close.ts";
import { Rng } from "../tests/util/rng.ts";
import assert from "node:assert/strict";

Deno.test("gdn_chunk_norm QX: y as without it, and xq the bits quantize_q8 gives for y, in each byte order", async () => {
  const rng = new Rng();
  const { device } = await testGpu();
  const cache = new PipelineCache(device);
  for (const type of ["Q8_0", "IQ4_XS"] as const) {
    for (const dV of [64, 128]) {
      const nV = rng.int(1, 5);
      const inner = nV * dV;
      const n = rng.int(1, 6);
      const zCol = inner + 4 * rng.int(0, 3);
      const c = { N_V: nV, D_V: dV, EPS: 1e-6 };
      const o = rng.normals(inner * n, 10 ** rng.int(-2, 2));
      o.fill(0, 0, 32); // an all-zero chunk
      const z = rng.normals(zCol * n, 1);
      const normW = rng.normals(dV, 1);
      const k = inner;
      const words = (n * q8xBytes(k)) / 4;
      const outs: GPUBuffer[] = [];
      const enc = device.createCommandEncoder();
      const pass = enc.beginComputePass();
      for (const qx of [undefined, { layout: q8Layout(type) }]) {
        const y = upload(device, o, "y");
        const xq = poisoned(device, words);
        outs.push(y, xq);
        const b = {
          params: upload(device, Uint32Array.of(0, n)),
          z: upload(device, z),
          normW: upload(device, normW),
          y,
          xq: { buffer: xq, offset: 0, size: 4 * words },
        };
        const p = await cache.get(GDN_CHUNK_NORM, gdnNormConstants(c, zCol, qx));
        pass.setPipeline(p);
        pass.setBindGroup(0, bindGroup(device, p, GDN_CHUNK_NORM_BINDINGS.map((key) => b[key])));
        pass.dispatchWorkgroups(nV, n + 1); // a token row past n does nothing
      }
      pass.end();
      device.queue.submit([enc.finish()]);
      const [y0, xq0, y1, xq1] = await readAll(device, outs);
      const what = `gdn_chunk_norm QX ${type} N_V=${nV} D_V=${dV} n=${n} Z_COL=${zCol} (seed ${rng.seed})`;
      assert.deepEqual(new Uint32Array(y1!), new Uint32Array(y0!), `${what}: y`);
      assertPoisoned(new Uint32Array(xq0!, 0, words), POISON_F32, `${what}: xq untouched without QX`);
      assertPoisoned(new Uint32Array(xq1!, 4 * words, GUARD_WORDS), POISON_F32, `${what}: xq guard`);
      const yOut = new Float32Array(y1!);
      for (let t = 0; t < n; t++) {
        const { words: want } = await quantizeOnGpu(device, cache, type, yOut.slice(t * k, (t + 1) * k));
        const cw = q8xBytes(k) / 4;
        assert.deepEqual(new Uint32Array(xq1!, 4 * t * cw, cw), want, `${what}: column ${t}`);
      }
    }
  }
  assert.throws(() => gdnNormConstants({ N_V: 2, D_V: 48, EPS: 1e-6 }, 96, { layout: 0 }), /D_V=48/);
});
