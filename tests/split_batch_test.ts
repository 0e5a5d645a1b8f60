/**
 * `Stage.runBatch` (engine/exec/_batch_run.ts), what a split's pipelined driver and a worker's RUN_BATCH run:
 * one row per slot of a group in one batched step equals each slot's one-token `Stage.run`, bit for bit, for
 * a head range (token ids in, hidden rows out) and a last range (hidden rows in, logits out), on both tiny
 * architectures, over several steps with the slots at different positions. Also its refusals.
 * @module
 */
import assert from "node:assert/strict";
import { openGguf, Stage } from "../engine/mod.ts";
import { testGpu } from "./util/gpu.ts";
import { fixturePath } from "./util/fixtures.ts";
import { Rng } from "./util/rng.ts";

/** Index and values of the first element where `a` and `b` differ in bits, or undefined. */
function firstDiff(a: Float32Array, b: Float32Array): string | undefined {
  const ua = new Uint32Array(a.buffer, a.byteOffset, a.length);
  const ub = new Uint32Array(b.buffer, b.byteOffset, b.length);
  if (ua.length !== ub.length) return `lengths ${ua.length} and ${ub.length}`;
  const i = ua.findIndex((w, j) => w !== ub[j]);
  return i < 0 ? undefined : `element ${i}: ${a[i]} vs ${b[i]}`;
}

for (const name of ["tiny-qwen35moe.q8_0.gguf", "tiny-qwen3next.q8_0.gguf"]) {
  Deno.test(`runBatch ${name}: a group's rows and logits equal each slot's one-token run, bit for bit`, async () => {
    const rng = new Rng();
    const gpu = await testGpu();
    using file = await openGguf(fixturePath(name));
    const load = (layers: [number, number]) =>
      Stage.load(gpu, file, { nCtx: 64, nSlots: 4, maxChunk: 8, layers });
    const probe = await load([0, 1]);
    const L = probe.hp.nLayer;
    probe.destroy();
    // Batched and solo copies of a head range and a last range.
    const [headB, headS, lastB, lastS] = [
      await load([0, 2]),
      await load([0, 2]),
      await load([2, L]),
      await load([2, L]),
    ];
    try {
      assert.ok(headB.canBatch && lastB.canBatch, "the tiny shape binds per-slot rows");
      const slots = [3, 0, 2]; // not in order: row b is slots[b]
      for (const s of slots) {
        const prompt = Array.from({ length: rng.int(1, 9) }, () => rng.int(0, 1021));
        for (const head of [headB, headS]) {
          const h = await head.run(s, { tokens: prompt }, 0, { rows: "all" });
          for (const last of head === headB ? [lastB] : [lastS]) {
            await last.run(s, { hidden: h.data, nTokens: prompt.length }, 0, { rows: "none" });
          }
        }
      }
      const E = headB.hp.nEmbd;
      const V = lastB.hp.nVocab;
      for (let step = 0; step < 3; step++) {
        // Steps of two and three slots, so a graph of each size is built and reused.
        const group = step === 1 ? slots.slice(0, 2) : slots;
        const ids = group.map(() => rng.int(0, 1021));
        const hb = await headB.runBatch(group, { tokens: ids });
        assert.equal(hb.kind, "hidden");
        const lb = await lastB.runBatch(group, { hidden: hb.data, nTokens: group.length });
        assert.equal(lb.kind, "logits");
        for (const [b, s] of group.entries()) {
          const hs = await headS.run(s, { tokens: [ids[b]!] }, headS.length(s), { rows: "all" });
          const where = `step ${step}, slot ${s} (seed ${rng.seed})`;
          const dh = firstDiff(hb.data.subarray(b * E, (b + 1) * E), hs.data);
          assert.equal(dh, undefined, `hidden row of ${where} differs at ${dh}`);
          const ls = await lastS.run(s, { hidden: hs.data, nTokens: 1 }, lastS.length(s), { rows: "last" });
          const dl = firstDiff(lb.data.subarray(b * V, (b + 1) * V), ls.data);
          assert.equal(dl, undefined, `logits of ${where} differ at ${dl}`);
          assert.equal(headB.length(s), headS.length(s));
          assert.equal(lastB.length(s), lastS.length(s));
        }
      }
      await assert.rejects(() => headB.runBatch([1, 1], { tokens: [1, 2] }), /distinct slots/);
      await assert.rejects(() => headB.runBatch([0, 9], { tokens: [1, 2] }), /Slot 9 does not exist/);
      await assert.rejects(() => headB.runBatch([0, 1], { tokens: [1] }), /one row per slot/);
      await assert.rejects(
        () => lastB.runBatch([0, 1], { tokens: [1, 2] }),
        /take hidden rows, not token ids/,
      );
    } finally {
      for (const s of [headB, headS, lastB, lastS]) s.destroy();
    }
  });
}
