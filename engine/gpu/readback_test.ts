import assert from "node:assert/strict";
import { ReadbackRing } from "./readback.ts";
import { testGpu, upload } from "../../tests/util/gpu.ts";

Deno.test("ReadbackRing: several slots in flight, packed copies, slots reused", async () => {
  const { device } = await testGpu();
  const src = upload(device, new Uint32Array(64).map((_, i) => i * 3 + 1));
  const ring = new ReadbackRing(device, { slots: 3, slotBytes: 32 });
  const enc = device.createCommandEncoder();
  const a = ring.record(enc, [{ src, srcOffsetBytes: 0, sizeBytes: 8 }, {
    src,
    srcOffsetBytes: 40,
    sizeBytes: 4,
  }]);
  const b = ring.record(enc, [{ src, srcOffsetBytes: 100, sizeBytes: 16 }]);
  const c = ring.record(enc, [{ src, srcOffsetBytes: 4, sizeBytes: 4 }]);
  assert.equal(ring.record(enc, [{ src, srcOffsetBytes: 0, sizeBytes: 4 }]), undefined, "all slots busy");
  device.queue.submit([enc.finish()]);
  const [ra, rb, rc] = await Promise.all([ring.map(a!), ring.map(b!), ring.map(c!)]);
  assert.deepEqual([...new Uint32Array(ra!.buffer)], [1, 4, 31]);
  assert.deepEqual([...new Uint32Array(rb!.buffer)], [76, 79, 82, 85]);
  assert.deepEqual([...new Uint32Array(rc!.buffer)], [4]);
  assert.equal(ring.free, 3);
  assert.throws(
    () => ring.record(device.createCommandEncoder(), [{ src, srcOffsetBytes: 0, sizeBytes: 36 }]),
    /exceeds the ring slot size 32/,
  );
  ring.destroy();
  src.destroy();
});
