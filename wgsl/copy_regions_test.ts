import assert from "node:assert/strict";
import { bindGroup, PipelineCache } from "./kernel.ts";
import {
  checkCopyRegions,
  COPY_REGIONS,
  COPY_REGIONS_BINDINGS,
  COPY_REGIONS_PER,
  copyRegionsGrid,
  copyRegionsParams,
  type CopyRegionsShape,
} from "./copy_regions.ts";
import { POISON_F32, poisoned, readAll, testGpu, upload } from "../tests/util/gpu.ts";
import { Rng } from "../tests/util/rng.ts";

Deno.test("copy_regions: the listed slots' regions land at their places, every other word of dst untouched", async () => {
  const rng = new Rng();
  const { device } = await testGpu();
  const cache = new PipelineCache(device);
  const pipeline = await cache.get(COPY_REGIONS, { PER: COPY_REGIONS_PER });
  // Regions shorter than a workgroup's words, longer than several, and not multiples of 4 words.
  for (const lenWords of [1, 17, rng.int(1, 5000), 2 * 256 * COPY_REGIONS_PER + 3]) {
    const stride = Math.ceil((4 * lenWords) / 256) * 256 + 256 * rng.int(0, 2);
    const nSlots = rng.int(2, 9);
    const slots = [...Array(nSlots).keys()].filter(() => rng.float() < 0.6);
    if (slots.length === 0) slots.push(nSlots - 1);
    slots.reverse(); // any order
    const shape: CopyRegionsShape = { lenBytes: 4 * lenWords, strideBytes: stride, slots };
    const words = (stride * nSlots) / 4;
    const src = new Uint32Array(words).map(() => rng.u32());
    const dst = poisoned(device, words);
    const b = { params: upload(device, copyRegionsParams(shape)), src: upload(device, src), dst };
    checkCopyRegions(shape, b);
    const enc = device.createCommandEncoder();
    const pass = enc.beginComputePass();
    pass.setPipeline(pipeline);
    pass.setBindGroup(0, bindGroup(device, pipeline, COPY_REGIONS_BINDINGS.map((n) => b[n])));
    pass.dispatchWorkgroups(...copyRegionsGrid(shape));
    pass.end();
    device.queue.submit([enc.finish()]);
    const [got] = await readAll(device, [dst]);
    const g = new Uint32Array(got!);
    const want = new Uint32Array(g.length).fill(POISON_F32);
    for (const s of slots) {
      const at = (s * stride) / 4;
      want.set(src.subarray(at, at + lenWords), at);
    }
    assert.deepEqual(
      g,
      want,
      `len ${lenWords} words, stride ${stride} bytes, slots ${slots} (seed ${rng.seed})`,
    );
  }
});

Deno.test("copy_regions checks throw before encoding: lengths, slots, bindings", () => {
  const buf = (bytes: number) => ({ size: bytes }) as unknown as GPUBuffer;
  const ok = { lenBytes: 64, strideBytes: 256, slots: [0, 2] };
  const b = { params: buf(64), src: buf(768), dst: buf(768) };
  checkCopyRegions(ok, b);
  assert.throws(() => checkCopyRegions({ ...ok, lenBytes: 66 }, b), /multiples of 4/);
  assert.throws(() => checkCopyRegions({ ...ok, lenBytes: 512 }, b), /within their stride/);
  assert.throws(() => checkCopyRegions({ ...ok, slots: [1, 1] }, b), /distinct slots/);
  assert.throws(() => checkCopyRegions({ ...ok, slots: [] }, b), /distinct slots/);
  assert.throws(() => checkCopyRegions({ ...ok, slots: [3] }, b), /binding src holds 768 bytes/);
  assert.throws(() => checkCopyRegions(ok, { ...b, dst: buf(500) }), /binding dst/);
});
