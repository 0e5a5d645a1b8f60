import assert from "node:assert/strict";
import { RewindPoints } from "./_rewind.ts";
import { SlotStates, type StateBinding } from "../state.ts";
import { PipelineCache } from "../../wgsl/kernel.ts";
import { readAll, testGpu } from "../../tests/util/gpu.ts";
import { Rng } from "../../tests/util/rng.ts";

// A KV-like state (2 heads x 8 positions x 4 words, live ranges per head) and two states live whole: an ssm of
// 68 bytes (the pool has padding between slots) and a conv ring.
const POS_WORDS = 4;
const MAX_POS = 8;
const KV_BYTES = 2 * MAX_POS * POS_WORDS * 4;
const specs = [
  {
    layer: 3,
    name: "k_cache",
    sizeBytes: KV_BYTES,
    liveRanges: (n: number) =>
      [0, 1].map((h) => ({ offsetBytes: h * MAX_POS * POS_WORDS * 4, sizeBytes: n * POS_WORDS * 4 })),
  },
  { layer: 0, name: "ssm", sizeBytes: 68 },
  { layer: 1, name: "conv", sizeBytes: 48 },
];

function words(bytes: ArrayBuffer, r: StateBinding): Uint32Array {
  return new Uint32Array(bytes.slice(r.offset, r.offset + r.size));
}

/** Fills every slot's regions with random words; returns them by slot and state name. */
function fill(device: GPUDevice, st: SlotStates, rng: Rng): Record<string, Uint32Array>[] {
  return [0, 1, 2].map((slot) =>
    Object.fromEntries(specs.map((s) => {
      const r = st.binding(slot, s.layer, s.name);
      const v = new Uint32Array(s.sizeBytes / 4).map(() => rng.u32());
      device.queue.writeBuffer(r.buffer, r.offset, v);
      return [s.name, v];
    }))
  );
}

async function read(device: GPUDevice, st: SlotStates, slot: number): Promise<Record<string, Uint32Array>> {
  const rs = specs.map((s) => st.binding(slot, s.layer, s.name));
  const got = await readAll(device, rs.map((r) => r.buffer));
  return Object.fromEntries(specs.map((s, i) => [s.name, words(got[i]!, rs[i]!)]));
}

Deno.test("RewindPoints: pooled states copied into two mirrors per slot, restored with the KV rows since cleared", async () => {
  const rng = new Rng();
  const { device } = await testGpu();
  const st = new SlotStates(device, { nSlots: 3, specs });
  const rp = await RewindPoints.create(device, st, new PipelineCache(device));
  try {
    const at = fill(device, st, rng);
    let enc = device.createCommandEncoder();
    const p0 = rp.take(enc, 0, 3);
    const p2 = rp.take(enc, 2, 5);
    rp.encode(enc);
    device.queue.submit([enc.finish()]);
    // No snapshot buffers: the copies are in the mirrors.
    assert.equal(st.snapshotBytes, 0);
    // The slots run on: every state changes.
    const later = fill(device, st, rng);
    // Slot 0 back to 3 tokens after writing up to position 6: its whole states as at the point, KV rows 3..5
    // cleared, the rows below 3 and from 6 as they are now; the other slots untouched.
    assert.equal(rp.restore(p0, 0, 6), 3);
    const s0 = await read(device, st, 0);
    assert.deepEqual(s0.ssm, at[0]!.ssm, `seed ${rng.seed}`);
    assert.deepEqual(s0.conv, at[0]!.conv, `seed ${rng.seed}`);
    const kv = later[0]!.k_cache!.slice();
    for (const h of [0, 1]) kv.fill(0, (h * MAX_POS + 3) * POS_WORDS, (h * MAX_POS + 6) * POS_WORDS);
    assert.deepEqual(s0.k_cache, kv, `seed ${rng.seed}`);
    for (const slot of [1, 2]) assert.deepEqual(await read(device, st, slot), later[slot], `slot ${slot}`);
    assert.throws(() => rp.restore(p2, 1, 6), /restores its own slot/);
    assert.throws(() => rp.restore(p2, 2, 4), /restores its own slot/);
    // Slot 0's second point takes the other mirror; a third (none reused) a rewind snapshot; reusing the
    // first takes its mirror. Each restores its own copy.
    const now = fill(device, st, rng);
    enc = device.createCommandEncoder();
    const q1 = rp.take(enc, 0, 4);
    const q2 = rp.take(enc, 0, 5);
    assert.ok(st.snapshotBytes > 0, "the third point of a slot is a snapshot");
    rp.encode(enc);
    device.queue.submit([enc.finish()]);
    fill(device, st, rng);
    assert.equal(rp.restore(q1, 0, 7), 4);
    assert.deepEqual((await read(device, st, 0)).ssm, now[0]!.ssm, `seed ${rng.seed}`);
    fill(device, st, rng);
    assert.equal(rp.restore(q2, 0, 7), 5);
    assert.deepEqual((await read(device, st, 0)).conv, now[0]!.conv, `seed ${rng.seed}`);
    const again = fill(device, st, rng);
    enc = device.createCommandEncoder();
    const r0 = rp.take(enc, 0, 2, p0);
    rp.encode(enc);
    device.queue.submit([enc.finish()]);
    fill(device, st, rng);
    assert.equal(rp.restore(r0, 0, 3), 2);
    assert.deepEqual((await read(device, st, 0)).ssm, again[0]!.ssm, `seed ${rng.seed}`);
    assert.throws(() => rp.restore(p0, 0, 3), /does not exist/);
    for (const id of [p2, q1, q2, r0]) rp.drop(id);
    assert.equal(st.snapshotBytes, 0, "every point dropped");
  } finally {
    rp.destroy();
    st.destroy();
  }
});
