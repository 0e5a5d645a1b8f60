/**
 * A last stage's `ids` runs (engine/exec/_stage_run.ts, _batch_run.ts): the argmax drawn on the GPU in the
 * run's pass equals the CPU argmax of the same run's logits (a snapshot restored between the two), for a
 * prompt's last row, for every row of a one-token-chunk run (a drafted frame), and for each column of a
 * batched step; and the refusals (a head's ids, wide chunks). Decode frames are read early (their stagings
 * pooled: engine/gpu/readback.ts). Sampled `ids` runs (`RunOptions.sample`): the GPU sampler in the run's pass
 * draws what `Stage.sampleRows` draws from the same run's logits, in one readback instead of two.
 * @module
 */
import assert from "node:assert/strict";
import { argmaxCpu, GREEDY_SAMPLING, openGguf, type SamplingParams, Stage } from "../engine/mod.ts";
import { testGpu } from "./util/gpu.ts";
import { EARLY_READS, readStats } from "../engine/gpu/readback.ts";
import { fixturePath } from "./util/fixtures.ts";
import { Rng } from "./util/rng.ts";
import { stageBackend } from "../wire/stage_backend.ts";
import type { RunRequest } from "../wire/mod.ts";

/** The CPU argmax of each row of `logits` (ne=[V, rows]). */
function argmaxRows(logits: Float32Array, V: number): number[] {
  return Array.from({ length: logits.length / V }, (_, r) => argmaxCpu(logits.subarray(r * V, (r + 1) * V)));
}

/** The head's hidden rows of `n` random ids continuing `slot`'s sequence. */
async function headRows(head: Stage, rng: Rng, slot: number, n: number): Promise<Float32Array<ArrayBuffer>> {
  const tokens = Array.from({ length: n }, () => rng.int(0, 1021));
  return (await head.run(slot, { tokens }, head.length(slot), { rows: "all" })).data;
}

/** Runs `body` over a head (layers 0:2) and a last stage (2:L) of the tiny qwen35moe, both destroyed after. */
async function withStages(
  o: { nCtx: number; nSlots: number },
  body: (head: Stage, last: Stage) => Promise<void>,
): Promise<void> {
  const gpu = await testGpu();
  using file = await openGguf(fixturePath("tiny-qwen35moe.q8_0.gguf"));
  const load = (layers: [number, number]) => Stage.load(gpu, file, { ...o, maxChunk: 4, layers });
  const head = await load([0, 2]);
  const last = await load([2, head.hp.nLayer]);
  try {
    await body(head, last);
  } finally {
    head.destroy();
    last.destroy();
  }
}

Deno.test("Stage ids: the GPU argmax of a run and a batched step equals the CPU argmax of its logits", async () => {
  const rng = new Rng();
  await withStages({ nCtx: 64, nSlots: 3 }, async (head, last) => {
    const V = last.hp.nVocab;
    const hidden = (slot: number, n: number) => headRows(head, rng, slot, n);
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
  });
});

Deno.test("Stage sampled ids: the sampler in a run's pass draws what sampleRows draws from its logits", async () => {
  const rng = new Rng();
  await withStages({ nCtx: 64, nSlots: 3 }, async (head, last) => {
    const V = last.hp.nVocab;
    const nEmbd = head.hp.nEmbd;
    // Settings whose draw depends on the seed, the RNG step and the penalty history.
    const settings = (): SamplingParams => ({
      ...GREEDY_SAMPLING,
      temperature: 1.5,
      topK: 0,
      topP: 1,
      minP: 0,
      repeatPenalty: 1.3,
      presencePenalty: 0.5,
      frequencyPenalty: 0.25,
      penaltyLastN: 64,
      seed: rng.int(0, 2 ** 31),
    });
    const draw = () => ({
      sampling: settings(),
      step: rng.int(0, 50),
      history: Array.from({ length: rng.int(0, 12) }, () => rng.int(0, V - 1)),
    });
    const hidden = (slot: number, n: number) => headRows(head, rng, slot, n);
    const reads = () => readStats.early + readStats.awaited + readStats.fellBack;
    // sampleRows on the logits, then the in-pass draw of the same rows from the same state.
    const both = async (
      slot: number,
      h: Float32Array<ArrayBuffer>,
      opts: { rows: "last" | "all"; chunk?: number },
    ) => {
      const o = draw();
      const base = last.length(slot);
      const snap = last.snapshot(slot);
      const nTokens = h.length / nEmbd;
      const r0 = reads();
      const logits = await last.run(slot, { hidden: h, nTokens }, base, opts);
      const want = Array.from(await last.sampleRows(logits.data, o));
      const twoReads = reads() - r0;
      last.restore(snap, slot);
      last.states.drop(snap);
      const r1 = reads();
      const out =
        await (await last.submit(slot, { hidden: h, nTokens }, base, { ...opts, ids: true, sample: o }))
          .output;
      assert.equal(reads() - r1, 1, "one readback: the ids");
      assert.equal(twoReads, 2, "the logits and then the ids");
      assert.equal(out.data.length, 0, "an ids run reads back no logits");
      return { want, got: Array.from(out.ids!) };
    };
    let differ = 0;
    for (const slot of [0, 1, 2]) {
      // A 6-token prompt (chunks of 4 and 2): the last row's draw.
      const p = await both(slot, await hidden(slot, 6), { rows: "last" });
      assert.deepEqual(p.got, p.want, `slot ${slot}: prompt's last id`);
      // Drafted frames of 3 rows as one chunk (each row's sampler continuing the row before) and as one-token
      // chunks (one sampler continuing its own state).
      for (const chunk of [4, 1]) {
        const d = await both(slot, await hidden(slot, 3), { rows: "all", chunk });
        assert.equal(d.got.length, 3);
        assert.deepEqual(d.got, d.want, `slot ${slot}: drafted frame's ids, chunk ${chunk}`);
        differ += new Set(d.got).size > 1 ? 1 : 0;
      }
    }
    assert.ok(differ > 0, "the drafted frames' rows draw different ids (not one id repeated)");
    // A batched step: columns sampled with their own settings, and a greedy one.
    const group = [2, 0, 1];
    const h = new Float32Array(group.length * nEmbd);
    for (const [b, s] of group.entries()) h.set(await hidden(s, 1), b * nEmbd);
    const sample = [draw(), undefined, draw()];
    const snaps = group.map((s) => last.snapshot(s));
    const logits = await last.runBatch(group, { hidden: h, nTokens: group.length });
    const want = await Promise.all(group.map(async (_, b) => {
      const row = logits.data.slice(b * V, (b + 1) * V);
      const o = sample[b];
      return o ? (await last.sampleRows(row, o))[0]! : argmaxCpu(row);
    }));
    group.forEach((s, b) => last.restore(snaps[b]!, s));
    for (const id of snaps) last.states.drop(id);
    const r0 = reads();
    const out =
      await (await last.submitBatch(group, { hidden: h, nTokens: group.length }, { ids: true, sample }))
        .output;
    assert.equal(reads() - r0, 1, "one readback for the step's ids");
    assert.deepEqual(Array.from(out.ids!), want, "each column's draw");
    // Refusals: a sampled run returns ids; a sampled step takes one entry per slot.
    await assert.rejects(
      () => last.submit(0, { hidden: h.subarray(0, nEmbd), nTokens: 1 }, last.length(0), { sample: draw() }),
      /returns ids/,
    );
    await assert.rejects(
      () => last.submitBatch(group, { hidden: h, nTokens: 3 }, { ids: true, sample: [draw()] }),
      /one entry per slot/,
    );
  });
});

Deno.test("Stage sampled ids: a worker's RUN with settings the sampler refuses fails with the reason, then serves", async () => {
  await withStages({ nCtx: 32, nSlots: 1 }, async (head, last) => {
    const backend = stageBackend(last, {
      build: { version: "0.0.0-test", commit: "test" },
      arch: "qwen35moe",
    });
    const rows = (await head.run(0, { tokens: [5, 6, 7] }, 0, { rows: "all" })).data;
    const sampling = {
      temperature: 0.8,
      topK: 0,
      topP: 1,
      minP: 0,
      repeatPenalty: 1,
      presencePenalty: 5, // the wire's range allows it, the sampler's does not (-2..2)
      frequencyPenalty: 0,
      penaltyLastN: 64,
      seed: 3,
      step: 0,
    };
    const req = (presencePenalty: number): RunRequest => ({
      slot: 0,
      basePos: 0,
      nEmbd: head.hp.nEmbd,
      rows,
      dtype: "f32",
      want: "ids",
      topK: 0,
      drafts: new Uint32Array(0),
      sampling: { ...sampling, presencePenalty },
    });
    await assert.rejects(
      () => backend.run(req(5)),
      /Layers 2:4 cannot sample: presence_penalty 5 is outside/,
    );
    const ok = await backend.run(req(0.5));
    assert.equal(ok.kind, "ids");
    assert.equal(ok.kind === "ids" && ok.ids.length, 1);
  });
});
