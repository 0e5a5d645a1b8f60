import assert from "node:assert/strict";
import { SlotStates, STATE_ALIGN_BYTES, type StateBinding } from "./state.ts";
import { readAll, testGpu } from "../tests/util/gpu.ts";
import { Rng } from "../tests/util/rng.ts";

// A KV-like buffer of 2 heads x 8 positions x 4 words; live ranges are each head's first nPos positions.
const POS_WORDS = 4;
const MAX_POS = 8;
const kvRanges = (nPos: number) =>
  [0, 1].map((h) => ({ offsetBytes: (h * MAX_POS) * POS_WORDS * 4, sizeBytes: nPos * POS_WORDS * 4 }));
const KV_BYTES = 2 * MAX_POS * POS_WORDS * 4;
// 68 bytes: not a multiple of the 256-byte stride, so the pool has padding between slots.
const SSM_BYTES = 68;
const specs = [
  { layer: 3, name: "k_cache", sizeBytes: KV_BYTES, liveRanges: kvRanges },
  { layer: 0, name: "ssm", sizeBytes: SSM_BYTES },
];

/** Writes random words into `slot`'s k_cache and ssm regions; returns them (kv, ssm). */
function fillSlot(st: SlotStates, device: GPUDevice, rng: Rng, slot: number): [Uint32Array, Uint32Array] {
  const kv = new Uint32Array(KV_BYTES / 4).map(() => rng.u32());
  const ssm = new Uint32Array(SSM_BYTES / 4).map(() => rng.u32());
  const k = st.binding(slot, 3, "k_cache");
  const m = st.binding(slot, 0, "ssm");
  device.queue.writeBuffer(k.buffer, k.offset, kv);
  device.queue.writeBuffer(m.buffer, m.offset, ssm);
  return [kv, ssm];
}

/** The words of a region out of its buffer's bytes. */
function words(bytes: ArrayBuffer, r: StateBinding): Uint32Array {
  return new Uint32Array(bytes.slice(r.offset, r.offset + r.size));
}

for (const pooled of [true, false]) {
  const how = pooled ? "pooled" : "one buffer per slot (pool over maxPoolBytes)";
  Deno.test(`SlotStates (${how}): reset, snapshot of live ranges, restore into the same and another slot`, async () => {
    const rng = new Rng();
    const { device } = await testGpu();
    const nSlots = 3;
    const st = new SlotStates(device, { nSlots, specs, maxPoolBytes: pooled ? undefined : 600 });
    assert.equal(st.bytesPerSlot, KV_BYTES + SSM_BYTES);
    // The KV pool (3 · 256 bytes) is over 600 bytes, the ssm pool (2 · 256 + 68) is not.
    assert.equal(st.pool(3, "k_cache") === undefined, !pooled);
    const ssmPool = st.pool(0, "ssm");
    assert.ok(ssmPool);
    assert.equal(ssmPool.strideBytes, STATE_ALIGN_BYTES);
    assert.equal(ssmPool.buffer.size, 2 * STATE_ALIGN_BYTES + SSM_BYTES);
    for (let s = 0; s < nSlots; s++) {
      const r = st.binding(s, 0, "ssm");
      assert.deepEqual([r.buffer, r.offset, r.size], [ssmPool.buffer, s * STATE_ALIGN_BYTES, SSM_BYTES]);
      const k = st.binding(s, 3, "k_cache");
      assert.equal(k.offset % STATE_ALIGN_BYTES, 0);
      assert.equal(k.size, KV_BYTES);
    }
    // Every buffer starts as random bits (slot regions, padding), so any stray write shows.
    const bufs = [
      ...new Set(
        [0, 1, 2].flatMap((s) => [st.binding(s, 3, "k_cache").buffer, st.binding(s, 0, "ssm").buffer]),
      ),
    ];
    const before = bufs.map((b) => new Uint32Array(b.size / 4).map(() => rng.u32()));
    bufs.forEach((b, i) => device.queue.writeBuffer(b, 0, before[i]!));
    const kv0 = st.binding(0, 3, "k_cache");
    const ssm0 = st.binding(0, 0, "ssm");
    const [kvData, ssmData] = fillSlot(st, device, rng, 0);
    let enc = device.createCommandEncoder();
    const snap = st.snapshot(enc, 0, 3);
    device.queue.submit([enc.finish()]);
    // Overwrite slot 0, then restore the snapshot into slot 0 and slot 2; slot 1 must keep its bits.
    device.queue.writeBuffer(kv0.buffer, kv0.offset, new Uint32Array(KV_BYTES / 4).fill(7));
    device.queue.writeBuffer(ssm0.buffer, ssm0.offset, new Uint32Array(SSM_BYTES / 4).fill(7));
    enc = device.createCommandEncoder();
    st.restore(enc, snap, 0);
    st.restore(enc, snap, 2);
    device.queue.submit([enc.finish()]);
    let after = await readAll(device, bufs);
    const region = (s: number, l: number, name: string) => {
      const r = st.binding(s, l, name);
      return words(after[bufs.indexOf(r.buffer)]!, r);
    };
    const expectKv = new Uint32Array(kvData.length);
    for (const h of [0, 1]) {
      const at = h * MAX_POS * POS_WORDS;
      expectKv.set(kvData.subarray(at, at + 3 * POS_WORDS), at);
    }
    assert.deepEqual(region(0, 3, "k_cache"), expectKv, `seed ${rng.seed}`);
    assert.deepEqual(region(2, 3, "k_cache"), expectKv, `seed ${rng.seed}`);
    assert.deepEqual(region(2, 0, "ssm"), ssmData, `seed ${rng.seed}`);
    assert.equal(st.snapshotLength(snap), 3);
    assert.equal(st.snapshotBytes, 2 * 3 * POS_WORDS * 4 + SSM_BYTES);
    // Words outside slots 0 and 2 (slot 1, the pools' padding) are the random bits written first.
    const written = (b: GPUBuffer, word: number) =>
      [0, 2].some((s) =>
        [st.binding(s, 3, "k_cache"), st.binding(s, 0, "ssm")].some((r) =>
          r.buffer === b && word * 4 >= r.offset && word * 4 < r.offset + r.size
        )
      );
    bufs.forEach((b, i) => {
      const w = new Uint32Array(after[i]!);
      for (let j = 0; j < w.length; j++) {
        if (!written(b, j)) assert.equal(w[j], before[i]![j], `${b.label} word ${j} (seed ${rng.seed})`);
      }
    });

    enc = device.createCommandEncoder();
    st.reset(enc, 2);
    device.queue.submit([enc.finish()]);
    after = await readAll(device, bufs);
    assert.ok(region(2, 0, "ssm").every((w) => w === 0));
    assert.ok(region(2, 3, "k_cache").every((w) => w === 0));
    assert.deepEqual(region(0, 0, "ssm"), ssmData, `reset of slot 2 left slot 0 (seed ${rng.seed})`);
    assert.deepEqual(
      region(1, 0, "ssm"),
      words(before[bufs.indexOf(ssmPool.buffer)]!.buffer, st.binding(1, 0, "ssm")),
    );
    st.drop(snap);
    assert.throws(() => st.restore(device.createCommandEncoder(), snap, 0), /Snapshot 1 does not exist/);
    assert.throws(() => st.binding(3, 0, "ssm"), /Slot 3 does not exist: this engine has 3 slots/);
    assert.throws(() => st.pool(1, "ssm"), /No state ssm in layer 1/);
    st.destroy();
  });
}

Deno.test("SlotStates.retake: a snapshot recorded again (another slot, a longer sequence) restores the new copy", async () => {
  const rng = new Rng();
  const { device } = await testGpu();
  const st = new SlotStates(device, { nSlots: 3, specs });
  const filled = [0, 1].map((s) => fillSlot(st, device, rng, s));
  const kv = filled.map((f) => f[0]);
  const ssm = filled.map((f) => f[1]);
  let enc = device.createCommandEncoder();
  const snap = st.snapshot(enc, 0, 2);
  device.queue.submit([enc.finish()]);
  // Slot 1 at 7 positions: its live KV ranges outgrow the first copy's buffer (2 positions), the ssm fits.
  enc = device.createCommandEncoder();
  st.retake(enc, snap, 1, 7);
  st.restore(enc, snap, 2);
  device.queue.submit([enc.finish()]);
  const k2 = st.binding(2, 3, "k_cache");
  const m2 = st.binding(2, 0, "ssm");
  const [kvBytes, ssmBytes] = await readAll(device, [k2.buffer, m2.buffer]);
  const expectKv = new Uint32Array(KV_BYTES / 4);
  for (const h of [0, 1]) {
    const at = h * MAX_POS * POS_WORDS;
    expectKv.set(kv[1]!.subarray(at, at + 7 * POS_WORDS), at);
  }
  assert.deepEqual(words(kvBytes!, k2), expectKv, `seed ${rng.seed}`);
  assert.deepEqual(words(ssmBytes!, m2), ssm[1], `seed ${rng.seed}`);
  assert.equal(st.snapshotLength(snap), 7);
  assert.equal(st.snapshotBytes, 2 * 7 * POS_WORDS * 4 + SSM_BYTES);
  st.drop(snap);
  assert.throws(() => st.retake(device.createCommandEncoder(), snap, 0, 1), /does not exist/);
  st.destroy();
});

Deno.test("SlotStates rewind points: whole states only; restore keeps the KV rows below, clears those written since", async () => {
  const rng = new Rng();
  const { device } = await testGpu();
  const st = new SlotStates(device, { nSlots: 2, specs });
  const k0 = st.binding(0, 3, "k_cache");
  const m0 = st.binding(0, 0, "ssm");
  const [kvAt, ssmAt] = fillSlot(st, device, rng, 0);
  let enc = device.createCommandEncoder();
  const snap = st.snapshot(enc, 0, 3, true);
  device.queue.submit([enc.finish()]);
  // Only the ssm state is held: a rewind point costs the recurrent state, not the context's rows.
  assert.equal(st.snapshotBytes, SSM_BYTES);
  // The slot runs on: positions 3..5 of the KV cache and the whole ssm state change (positions 6.. stay).
  const kvLater = kvAt.slice();
  for (const h of [0, 1]) {
    for (let w = (h * MAX_POS + 3) * POS_WORDS; w < (h * MAX_POS + 6) * POS_WORDS; w++) {
      kvLater[w] = rng.u32();
    }
  }
  device.queue.writeBuffer(k0.buffer, k0.offset, kvLater);
  device.queue.writeBuffer(m0.buffer, m0.offset, new Uint32Array(SSM_BYTES / 4).map(() => rng.u32()));
  assert.throws(() => st.restore(device.createCommandEncoder(), snap, 1, 6), /rewind point of slot 0/);
  assert.throws(() => st.restore(device.createCommandEncoder(), snap, 0), /rewind point of slot 0/);
  assert.throws(() => st.restore(device.createCommandEncoder(), snap, 0, 2), /rewind point of slot 0/);
  enc = device.createCommandEncoder();
  st.restore(enc, snap, 0, 6);
  device.queue.submit([enc.finish()]);
  const [kvBytes, ssmBytes] = await readAll(device, [k0.buffer, m0.buffer]);
  // Rows below 3 as they were, rows 3..5 cleared (as after a reset), rows from 6 untouched.
  const expectKv = kvAt.slice();
  for (const h of [0, 1]) expectKv.fill(0, (h * MAX_POS + 3) * POS_WORDS, (h * MAX_POS + 6) * POS_WORDS);
  assert.deepEqual(words(kvBytes!, k0), expectKv, `seed ${rng.seed}`);
  assert.deepEqual(words(ssmBytes!, m0), ssmAt, `seed ${rng.seed}`);
  // A full snapshot retaken as a rewind point gives up its KV buffers.
  enc = device.createCommandEncoder();
  const full = st.snapshot(enc, 1, 4);
  assert.equal(st.snapshotBytes, SSM_BYTES + (2 * 4 * POS_WORDS * 4 + SSM_BYTES));
  st.retake(enc, full, 1, 4, true);
  device.queue.submit([enc.finish()]);
  assert.equal(st.snapshotBytes, 2 * SSM_BYTES);
  st.destroy();
});
