/**
 * The decode driver's rewind points (one per batch of a sequence with stop ids or a signal) are dropped as
 * soon as no rewind can need them: a long generation holds a bounded number, not one per batch.
 * @module
 */
import assert from "node:assert/strict";
import { openGguf } from "../engine/gguf.ts";
import { Stage } from "../engine/mod.ts";
import { testGpu } from "./util/gpu.ts";
import { fixturePath } from "./util/fixtures.ts";

// Pooled states take their rewind points in the pools' mirrors (engine/exec/_rewind.ts: no snapshot buffers);
// states of a buffer per slot (a pool over the binding limit) in SlotStates' rewind snapshots, at most three.
for (const perSlot of [false, true]) {
  const how = perSlot
    ? "states per slot: at most three rewind snapshots"
    : "pooled states: no snapshot buffers";
  Deno.test(`generate with a signal, whatever the number of batches (${how})`, async () => {
    const gpu = await testGpu();
    using file = await openGguf(fixturePath("tiny-qwen35moe.q8_0.gguf"));
    const stage = await Stage.load(gpu, file, {
      nCtx: 64,
      nSlots: 1,
      maxStatePoolBytes: perSlot ? 4 : undefined,
    });
    try {
      const prompt = [5, 17, 300, 42];
      const plain = await stage.generate(0, prompt, { nNew: 33, batch: 2 });
      let most = 0;
      const r = await stage.generate(0, prompt, {
        nNew: 33,
        batch: 2,
        signal: new AbortController().signal,
        onTokens: () => most = Math.max(most, stage.states.snapshotBytes),
      });
      assert.deepEqual(r.tokens, plain.tokens);
      assert.equal(stage.states.snapshotBytes, 0, "every snapshot dropped at the end");
      if (!perSlot) {
        assert.equal(most, 0, "rewind points in the mirrors");
        return;
      }
      // One snapshot of the slot at its longest (the live KV range grows with the sequence).
      const id = stage.snapshot(0);
      const one = stage.states.snapshotBytes;
      stage.decoder.drop(id);
      // 16 batches: kept all, they would be 16 snapshots by the last one.
      assert.ok(most > 0 && most <= 3 * one, `${most} bytes of snapshots held, one is ${one}`);
    } finally {
      stage.destroy();
    }
  });
}
