import assert from "node:assert/strict";
import { SlotStates } from "./state.ts";
import { readAll, testGpu } from "../tests/util/gpu.ts";
import { Rng } from "../tests/util/rng.ts";

// A KV-like buffer of 2 heads x 8 positions x 4 words; live ranges are each head's first nPos positions.
const POS_WORDS = 4;
const MAX_POS = 8;
const kvRanges = (nPos: number) =>
  [0, 1].map((h) => ({ offsetBytes: (h * MAX_POS) * POS_WORDS * 4, sizeBytes: nPos * POS_WORDS * 4 }));

Deno.test("SlotStates: reset, snapshot of live ranges, restore into the same and another slot", async () => {
  const rng = new Rng();
  const { device } = await testGpu();
  const st = new SlotStates(device, {
    nSlots: 2,
    specs: [
      { layer: 3, name: "k_cache", sizeBytes: 2 * MAX_POS * POS_WORDS * 4, liveRanges: kvRanges },
      { layer: 0, name: "ssm", sizeBytes: 64 },
    ],
  });
  assert.equal(st.bytesPerSlot, 2 * MAX_POS * POS_WORDS * 4 + 64);
  const kv = st.buffer(0, 3, "k_cache");
  const ssm = st.buffer(0, 0, "ssm");
  const kvData = new Uint32Array(kv.size / 4).map(() => rng.u32());
  const ssmData = new Uint32Array(16).map(() => rng.u32());
  device.queue.writeBuffer(kv, 0, kvData);
  device.queue.writeBuffer(ssm, 0, ssmData);
  let enc = device.createCommandEncoder();
  const snap = st.snapshot(enc, 0, 3);
  device.queue.submit([enc.finish()]);
  // Overwrite slot 0, then restore the snapshot into slot 0 and slot 1.
  device.queue.writeBuffer(kv, 0, new Uint32Array(kv.size / 4).fill(7));
  device.queue.writeBuffer(ssm, 0, new Uint32Array(16).fill(7));
  enc = device.createCommandEncoder();
  st.restore(enc, snap, 0);
  st.restore(enc, snap, 1);
  device.queue.submit([enc.finish()]);
  const [kv0, kv1, ssm1] = await readAll(device, [kv, st.buffer(1, 3, "k_cache"), st.buffer(1, 0, "ssm")]);
  const expectKv = new Uint32Array(kvData.length);
  for (const h of [0, 1]) {
    const at = h * MAX_POS * POS_WORDS;
    expectKv.set(kvData.subarray(at, at + 3 * POS_WORDS), at);
  }
  assert.deepEqual(new Uint32Array(kv0!), expectKv, `seed ${rng.seed}`);
  assert.deepEqual(new Uint32Array(kv1!), expectKv, `seed ${rng.seed}`);
  assert.deepEqual(new Uint32Array(ssm1!), ssmData, `seed ${rng.seed}`);
  assert.equal(st.snapshotLength(snap), 3);
  assert.equal(st.snapshotBytes, 2 * 3 * POS_WORDS * 4 + 64);

  enc = device.createCommandEncoder();
  st.reset(enc, 1);
  device.queue.submit([enc.finish()]);
  const [z] = await readAll(device, [st.buffer(1, 0, "ssm")]);
  assert.ok(new Uint32Array(z!).every((w) => w === 0));
  st.drop(snap);
  assert.throws(() => st.restore(device.createCommandEncoder(), snap, 0), /Snapshot 1 does not exist/);
  assert.throws(() => st.buffer(2, 0, "ssm"), /Slot 2 does not exist: this engine has 2 slots/);
  st.destroy();
});
