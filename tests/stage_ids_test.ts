/**
 * A last stage's `ids` runs (engine/exec/_stage_run.ts, _batch_run.ts): the argmax drawn on the GPU in the
 * run's pass equals the CPU argmax of the same run's logits (a snapshot restored between the two), for a
 * prompt's last row, for every row of a one-token-chunk run (a drafted frame), and for each column of a
 * batched step; and the refusals (a head's ids, wide chunks). Decode frames are read early (their stagings
 * pooled: engine/gpu/readback.ts).
 * @module
 */
import assert from "node:assert/strict";
import { argmaxCpu, openGguf, Stage } from "../engine/mod.ts";
import { testGpu } from "./util/gpu.ts";
import { EARLY_READS, readStats } from "../engine/gpu/readback.ts";
import { fixturePath } from "./util/fixtures.ts";
import { Rng } from "./util/rng.ts";

/** The CPU argmax of each row of `logits` (ne=[V, rows]). */
function argmaxRows(logits: Float32Array, V: number): number[] {
  return Array.from({ length: logits.length / V }, (_, r) => argmaxCpu(logits.subarray(r * V, (r + 1) * V)));
}

Deno.test("Stage ids: the GPU argmax of a run and a batched step equals the CPU argmax of its logits", async () => {
  const rng = new Rng();
  const gpu = await testGpu();
  using file = await openGguf(fixturePath("tiny-qwen35moe.q8_0.gguf"));
  const load = (layers: [number, number]) =>
    Stage.load(gpu, file, { nCtx: 64, nSlots: 3, maxChunk: 4, layers });
  const head = await load([0, 2]);
  const last = await load([2, head.hp.nLayer]);
  try {
    const V = last.hp.nVocab;
    const hidden = async (slot: number, n: number) =>
      (await head.run(
        slot,
        { tokens: Array.from({ length: n }, () => rng.int(0, 1021)) },
        head.length(slot),
        {
          rows: "all",
        },
      )).data;
    // Logits, then ids of the same rows from the same state.
    const both = async (
      slot: number,
      h: Float32Array<ArrayBuffer>,
      opts: { rows: "last" | "all"; chunk?: number },
    ) => {
      const base = last.length(slot);
      const snap = last.snapshot(slot);
      const logits = await last.run(slot, { hidden: h, nTokens: h.length / head.hp.nEmbd }, base, opts);
      last.restore(snap, slot);
      last.states.drop(snap);
      const pending = await last.submit(slot, { hidden: h, nTokens: h.length / head.hp.nEmbd }, base, {
        ...opts,
        ids: true,
      });
      const out = await pending.output;
      assert.equal(out.data.length, 0, "an ids run reads back no logits");
      return { want: argmaxRows(logits.data, V), got: Array.from(out.ids!) };
    };
    for (const slot of [0, 1, 2]) {
      // A 6-token prompt (chunks of 4 and 2): the last row's id.
      const p = await both(slot, await hidden(slot, 6), { rows: "last" });
      assert.deepEqual(p.got, p.want, `slot ${slot}: prompt's last id`);
      // A drafted frame: 3 rows, each its own one-token chunk.
      const d = await both(slot, await hidden(slot, 3), { rows: "all", chunk: 1 });
      assert.equal(d.got.length, 3);
      assert.deepEqual(d.got, d.want, `slot ${slot}: drafted frame's ids`);
    }
    for (const group of [[2, 0, 1], [1, 0]]) {
      const h = new Float32Array(group.length * head.hp.nEmbd);
      for (const [b, s] of group.entries()) h.set(await hidden(s, 1), b * head.hp.nEmbd);
      const snaps = group.map((s) => last.snapshot(s));
      const logits = await last.runBatch(group, { hidden: h, nTokens: group.length });
      group.forEach((s, b) => last.restore(snaps[b]!, s));
      for (const id of snaps) last.states.drop(id);
      const out = await (await last.submitBatch(group, { hidden: h, nTokens: group.length }, { ids: true }))
        .output;
      assert.deepEqual(Array.from(out.ids!), argmaxRows(logits.data, V), `group ${group}`);
    }
    await assert.rejects(() => head.submit(0, { tokens: [1] }, head.length(0), { ids: true }), /last stage/);
    // Every row's ids: one-token chunks, or one chunk of at most 8 rows (tests/chunk_exact_test.ts); not 9.
    const h = await hidden(0, 9);
    await assert.rejects(
      () => last.submit(0, { hidden: h, nTokens: 9 }, last.length(0), { rows: "all", ids: true }),
      /chunk: 1\) or one chunk of at most 8 rows/,
    );
    // Decode frames read early (engine/gpu/readback.ts): each stage's staging pool hands a frame a buffer
    // mapped before, read as soon as mapAsync's call returns; the ids still equal the CPU argmax.
    const before = readStats.early;
    for (let k = 0; k < 6; k++) {
      const f = await both(1, await hidden(1, 1), { rows: "last" });
      assert.deepEqual(f.got, f.want, `decode frame ${k}`);
      await new Promise((r) => setTimeout(r, 30)); // the frame's stagings unmapped (about 10 ms) and pooled
    }
    // Three reads per frame (the head's rows, the logits, the ids); a staging's first read waits.
    if (EARLY_READS) {
      assert.ok(readStats.early - before >= 12, `${readStats.early - before} of 18 reads early`);
    }
  } finally {
    head.destroy();
    last.destroy();
  }
});
