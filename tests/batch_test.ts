/**
 * Batched multi-slot decode (`Stage.generateBatch`) against each slot's solo `Stage.generate` on the fixture
 * models of both architectures: ids, top-k logits, stop reasons and the slot state afterwards.
 * @module
 */
import assert from "node:assert/strict";
import { openGguf } from "../engine/gguf.ts";
import {
  argmaxCpu,
  type BatchItem,
  type GenerateOptions,
  type GenerateResult,
  Stage,
} from "../engine/mod.ts";
import { samplingParams } from "../engine/sampling.ts";
import { testGpu } from "./util/gpu.ts";
import { Rng } from "./util/rng.ts";
import { fixturePath } from "./util/fixtures.ts";

// int8: StageOptions.int8Activations, where a batched step quantizes each slot's column on its own (after the
// norm's own dispatch) and a solo step quantizes with the norm in the prologue: the same bits either way.
for (
  const [name, int8] of [["tiny-qwen35moe", false], ["tiny-qwen3next", false], [
    "tiny-qwen3next",
    true,
  ]] as const
) {
  Deno.test(`${name}${int8 ? " int8 activations" : ""}: four slots decoded together equal their solo runs (greedy, sampled, late stop, cancel)`, async () => {
    const rng = new Rng();
    const gpu = await testGpu();
    using file = await openGguf(fixturePath(`${name}.q8_0.gguf`));
    const stage = await Stage.load(gpu, file, { nCtx: 96, nSlots: 4, maxChunk: 8, int8Activations: int8 });
    try {
      assert.ok(stage.canBatch, "the tiny shape binds per-slot rows");
      const prompts = [0, 1, 2, 3].map(() => Array.from({ length: rng.int(2, 13) }, () => rng.int(0, 1021)));
      const hot = samplingParams({ temperature: 1.2, topK: 0, topP: 1, minP: 0, seed: rng.int(0, 1 << 30) });
      // Each request ends differently, so the set shrinks mid-call: slot 0 ends first (the others move to
      // lower columns), slot 2 stops on an id found late inside a batch, slot 3 is cancelled from its token
      // callback, and the sampled slot 1 runs longest: its sampler state moves from column 1 to column 0 and
      // then into its solo decode step.
      const full2 = await stage.generate(2, prompts[2]!, { nNew: 20, batch: 4 });
      const stopId = full2.tokens[9]!;
      const cancelAfter = 6;
      const options = (): GenerateOptions[] => {
        let seen = 0;
        const ac = new AbortController();
        return [
          { nNew: 7, top: 3 },
          { nNew: 28, sampling: hot },
          { nNew: 20, stopIds: [stopId] },
          {
            nNew: 30,
            signal: ac.signal,
            onTokens: (ids) => {
              seen += ids.length;
              if (seen >= cancelAfter) ac.abort();
            },
          },
        ];
      };
      const solo: GenerateResult[] = [];
      const soloNext: Float32Array[] = [];
      for (const [s, o] of options().entries()) {
        const r = await stage.generate(s, prompts[s]!, { ...o, batch: 4 });
        solo.push(r);
        soloNext.push((await stage.run(s, { tokens: [r.tokens.at(-1)!] }, stage.length(s))).data);
      }
      assert.equal(solo[2]!.reason, "stop");
      assert.equal(solo[3]!.reason, "cancelled");
      // A cancel lands at the next readback, and in a batch readbacks come earlier when another slot runs out
      // of steps: the cancelled slot keeps a prefix of its uncancelled run, at least what it had seen.
      const full3 = await stage.generate(3, prompts[3]!, { nNew: 30, batch: 4 });
      const items: BatchItem[] = options().map((o, s) => ({ slot: s, prompt: prompts[s]!, opts: o }));
      const got = await stage.generateBatch(items, { batch: 4 });
      const cut = got[3]!.tokens.length;
      assert.equal(got[3]!.reason, "cancelled");
      assert.ok(cut >= cancelAfter && cut < 30, `cancelled after ${cut} ids`);
      assert.deepEqual(got[3]!.tokens, full3.tokens.slice(0, cut), `slot 3 ids (seed ${rng.seed})`);
      assert.equal(stage.length(3), prompts[3]!.length + cut - 1);
      const next3 = await stage.run(3, { tokens: [got[3]!.tokens.at(-1)!] }, stage.length(3));
      assert.equal(
        argmaxCpu(next3.data),
        full3.tokens[cut],
        `slot 3 state after the cancel (seed ${rng.seed})`,
      );
      for (const [s, r] of got.entries()) {
        if (s === 3) continue;
        const want = solo[s]!;
        assert.deepEqual(r.tokens, want.tokens, `slot ${s} ids (seed ${rng.seed})`);
        assert.equal(r.reason, want.reason, `slot ${s} reason`);
        // Same kernels per column, same summation order: the logits are the same bits.
        assert.deepEqual(r.top, want.top, `slot ${s} top-k logits (seed ${rng.seed})`);
        assert.equal(stage.length(s), prompts[s]!.length + r.tokens.length - 1, `slot ${s} length`);
        const next = await stage.run(s, { tokens: [r.tokens.at(-1)!] }, stage.length(s));
        assert.deepEqual(next.data, soloNext[s], `slot ${s} state after the batch (seed ${rng.seed})`);
      }
      // Continuing a held slot (base) in a batch beside a fresh one.
      const more = await stage.generateBatch([
        { slot: 0, prompt: [got[0]!.tokens.at(-1)!, 5], opts: { nNew: 6, base: stage.length(0) } },
        { slot: 1, prompt: prompts[1]!, opts: { nNew: 6 } },
      ]);
      assert.equal(more[0]!.tokens.length, 6);
      assert.equal(more[1]!.tokens.length, 6);
    } finally {
      stage.destroy();
    }
  });
}

Deno.test("generateBatch: a slot that fills its context ends with reason context while the others go on", async () => {
  const rng = new Rng();
  const gpu = await testGpu();
  using file = await openGguf(fixturePath("tiny-qwen3next.q8_0.gguf"));
  const stage = await Stage.load(gpu, file, { nCtx: 40, nSlots: 3, maxChunk: 16 });
  try {
    // Slot 0's prompt leaves room for 5 fed ids (6 out), slot 1's for 30; slot 2 wants only 3 ids.
    const prompts = [35, 10, 4].map((n) => Array.from({ length: n }, () => rng.int(0, 1021)));
    const opts: GenerateOptions[] = [{ nNew: 20 }, { nNew: 20 }, { nNew: 3 }];
    const solo: GenerateResult[] = [];
    for (const [s, o] of opts.entries()) solo.push(await stage.generate(s, prompts[s]!, { ...o, batch: 4 }));
    assert.deepEqual(solo.map((r) => r.reason), ["context", "length", "length"]);
    const got = await stage.generateBatch(opts.map((o, s) => ({ slot: s, prompt: prompts[s]!, opts: o })), {
      batch: 4,
    });
    for (const [s, r] of got.entries()) {
      assert.deepEqual(r.tokens, solo[s]!.tokens, `slot ${s} (seed ${rng.seed})`);
      assert.equal(r.reason, solo[s]!.reason);
      assert.equal(stage.length(s), prompts[s]!.length + r.tokens.length - 1);
    }
    assert.equal(got[0]!.tokens.length, 40 - 35 + 1);
  } finally {
    stage.destroy();
  }
});

Deno.test("generateBatch rejects repeated slots, too many items and bad options before touching a slot", async () => {
  const gpu = await testGpu();
  using file = await openGguf(fixturePath("tiny-qwen35moe.q8_0.gguf"));
  const stage = await Stage.load(gpu, file, { nCtx: 32, nSlots: 2, maxChunk: 8 });
  try {
    const it = (slot: number, nNew = 4): BatchItem => ({ slot, prompt: [1, 2], opts: { nNew } });
    await assert.rejects(stage.generateBatch([it(0), it(0)]), /Slots 0,0 repeat/);
    await assert.rejects(stage.generateBatch([it(0), it(2)]), /Slot 2 does not exist/);
    await assert.rejects(
      stage.generateBatch(Array.from({ length: 9 }, (_, i) => it(i))),
      /1\.\.8 slots, got 9/,
    );
    await assert.rejects(stage.generateBatch([it(0), it(1)], { batch: 0 }), /Batch must be in 1\.\.64/);
  } finally {
    stage.destroy();
  }
});
