import assert from "node:assert/strict";
import { PipelineCache } from "./kernel.ts";
import { Rng } from "../tests/util/rng.ts";
import { poisoned, readAll, testGpu, upload } from "../tests/util/gpu.ts";
import {
  encodeStreamRead,
  prepareStreamRead,
  STREAM_READ_PARAMS_BYTES,
  streamReadParams,
} from "./stream_read.ts";

// The kernel's only output is the write on a magic match, so the test sets magic to one invocation's XOR fold
// (computed here from the grid-stride pattern): a kernel that skips a vec4 of that invocation's share, or reads
// outside the range, misses the write; a wrong magic must write nothing.
const WORKGROUPS = 3;
const STRIDE = 256 * WORKGROUPS;
Deno.test("stream_read reads exactly its range (write happens only on the true XOR fold)", async () => {
  const rng = new Rng();
  const { device } = await testGpu();
  const cache = new PipelineCache(device);
  const words = new Uint32Array(4 * 5000).map(() => rng.u32());
  const src = upload(device, words, "src");
  const shapes = [
    { offsetBytes: 16 * rng.int(0, 100), sizeBytes: 16 * rng.int(1, 4000) },
    { offsetBytes: 0, sizeBytes: 16 * 5000 },
    { offsetBytes: 16 * 7, sizeBytes: 16 },
  ];
  const params = device.createBuffer({
    size: 256 * 2 * shapes.length,
    usage: GPUBufferUsage.UNIFORM | GPUBufferUsage.COPY_DST,
  });
  const outs: GPUBuffer[] = [];
  const lanes: number[] = [];
  const enc = device.createCommandEncoder();
  const pass = enc.beginComputePass();
  for (const [i, s] of shapes.entries()) {
    const count = s.sizeBytes / 16;
    const g = rng.int(0, Math.min(count, STRIDE));
    let fold = 0;
    for (let v = g; v < count; v += STRIDE) {
      for (let w = 0; w < 4; w++) fold ^= words[4 * (s.offsetBytes / 16 + v) + w]!;
    }
    lanes.push(g & 3);
    for (const [j, magic] of [fold >>> 0, (fold ^ 1) >>> 0].entries()) {
      const slot = 2 * i + j;
      device.queue.writeBuffer(params, 256 * slot, streamReadParams(s, magic));
      const out = poisoned(device, 4, 0xffffffff);
      outs.push(out);
      const op = await prepareStreamRead(cache, {
        device,
        shape: s,
        bindings: {
          params: { buffer: params, offset: 256 * slot, size: STREAM_READ_PARAMS_BYTES },
          src,
          out,
        },
        workgroups: WORKGROUPS,
      });
      encodeStreamRead(pass, op);
    }
  }
  pass.end();
  device.queue.submit([enc.finish()]);
  const got = await readAll(device, outs);
  for (const [i, s] of shapes.entries()) {
    const hit = new Uint32Array(got[2 * i]!, 0, 4);
    const miss = new Uint32Array(got[2 * i + 1]!, 0, 4);
    assert.ok(
      hit[lanes[i]!] !== 0xffffffff,
      `range ${JSON.stringify(s)} (seed ${rng.seed}): no write on the true fold`,
    );
    assert.ok(
      miss.every((v) => v === 0xffffffff),
      `range ${JSON.stringify(s)} (seed ${rng.seed}): wrote on a wrong fold`,
    );
  }
  [src, params, ...outs].forEach((b) => b.destroy());
});
