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
  MAX_BATCH_SLOTS,
  Stage,
} from "../engine/mod.ts";
import { samplingParams } from "../engine/sampling.ts";
import { testGpu } from "./util/gpu.ts";
import { Rng } from "./util/rng.ts";
import { fixturePath } from "./util/fixtures.ts";
import { planModel, synthesize } from "../engine/synth.ts";

// int8: StageOptions.int8Activations, where a batched step quantizes each slot's column on its own (after the
// norm's own dispatch) and a solo step quantizes with the norm in the prologue: the same bits either way;
// "experts": StageOptions.int8Experts, int8 x for the expert passes alone, whose batched passes take other ROWS
// than the solo step's (moeTuning.batchedQ8Rows: the same bits).
// perSlot: every state pool over StageOptions.maxStatePoolBytes, so each slot's states are buffers of their own
// and the batched step runs gdn_step and attn_qk_rope per slot (the fallback for pools over the binding limit).
for (
  const [name, int8, perSlot] of [
    ["tiny-qwen35moe", false, false],
    ["tiny-qwen3next", false, false],
    ["tiny-qwen3next", true, false],
    ["tiny-qwen35moe", false, true],
    ["tiny-qwen35moe", "experts", false],
  ] as const
) {
  const int8Name = int8 === "experts" ? " int8 x for the experts" : int8 ? " int8 activations" : "";
  const variant = `${int8Name}${perSlot ? " states per slot" : ""}`;
  Deno.test(`${name}${variant}: four slots decoded together equal their solo runs (greedy, sampled, late stop, cancel)`, async () => {
    const rng = new Rng();
    const gpu = await testGpu();
    using file = await openGguf(fixturePath(`${name}.q8_0.gguf`));
    const stage = await Stage.load(gpu, file, {
      nCtx: 96,
      nSlots: 4,
      maxChunk: 8,
      int8Activations: int8 === true,
      int8Experts: int8 === "experts",
      maxStatePoolBytes: perSlot ? 4 : undefined,
      moeTuning: int8 === "experts" ? { batchedQ8Rows: { gateUp: 4, down: 2 } } : undefined,
    });
    // The batched step has one gdn_step, attn_qk_rope and attn_decode per layer, or one per slot (and one
    // attn_combine per layer either way).
    const labels = (await stage.batchGraph([0, 1, 2])).map((op) => op.label);
    const perLayer = perSlot ? 3 : 1;
    for (const k of ["gdn_step", "attn_qk_rope", "attn_decode", "attn_combine"]) {
      const n = labels.filter((x) => x.replace(/^L\d+\./, "").startsWith(k)).length;
      const layers = new Set(labels.filter((x) => x.includes(`.${k}`)).map((x) => x.split(".")[0])).size;
      const want = k === "attn_combine" ? 1 : perLayer;
      assert.ok(layers > 0 && n === want * layers, `${k}: ${n} dispatches over ${layers} layers`);
    }
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

// The widest batched steps: 16 slots (every column of the named mat-vec path, MAX_BATCH_SLOTS) and an odd 11,
// on slots in a scrambled order (column b is not slot b), greedy and sampled columns mixed, sequences of
// different lengths so the step narrows as they end (16 → 12 → 8 columns, 11 → 8 → 5 or so). Each slot's
// ids and top-k logits equal its solo run's; then one batched step of every slot's next row (runBatch) gives
// each slot's full logits row, bit for bit, as its solo continuation does.
// The 11-slot step runs int8 activations (each column quantized on its own, in buffers of 16 columns), and
// with the default StageOptions.combineNormMinRows (17) its residual adds write no norm: each norm is a
// dispatch of its own, but the post-attention norm's, which the router's columns (grid z) compute in their
// prologues; the 16-slot step takes 2, so its residual adds write the next norm.
// "tiny-qwen35moe, 64 experts" is synthesized with 64 routed experts instead of 8: the router's rows for the
// shared expert's gate then start 256-byte aligned, so the router and the shared gate run as ONE mat-vec
// (in a batched step too, each column's logits at a stride of 65 words), as on the real models.
// Under int8 activations the 64-expert model's router takes the post-attention norm itself (the norm's weight in
// its mat-vec, the scale in moe_route: moeTakesNorm), in the 13-slot step and the solo steps alike.
// The batched steps' gdn_step runs at SPLIT 8 on tiny-qwen3next, SPLIT 2 on the 64-expert model and the solo
// step's SPLIT 4 on the 16 slots (StageOptions.gdnBatchedSplit; the gated norm after it in each).
const WIDE = [
  ["tiny-qwen35moe", MAX_BATCH_SLOTS, false],
  ["tiny-qwen3next", 11, true],
  ["tiny-qwen35moe, 64 experts", 8, false],
  ["tiny-qwen35moe, 64 experts", 13, true],
] as const;
for (const [name, width, int8] of WIDE) {
  const variant = !int8
    ? ""
    : name.endsWith("64 experts")
    ? " (int8 activations, the router takes the norm)"
    : " (int8 activations, norms on their own)";
  Deno.test(`${name}: ${width} slots decoded together equal their solo runs bit for bit${variant}`, async () => {
    const rng = new Rng();
    const gpu = await testGpu();
    const e64 = name.endsWith("64 experts");
    const dir = e64 ? await Deno.makeTempDir({ prefix: "batch_test_" }) : undefined;
    if (dir) {
      const plan = planModel({
        arch: "qwen35moe",
        preset: "tiny",
        quant: "q8_0",
        seed: rng.u32(),
        nExpert: 64,
      });
      await synthesize(plan, { out: `${dir}/e64.gguf` });
    }
    using file = await openGguf(dir ? `${dir}/e64.gguf` : fixturePath(`${name}.q8_0.gguf`));
    const stage = await Stage.load(gpu, file, {
      nCtx: 32,
      nSlots: MAX_BATCH_SLOTS,
      maxChunk: 8,
      int8Activations: int8,
      combineNormMinRows: int8 ? undefined : 2,
      gdnBatchedSplit: name === "tiny-qwen3next" ? 8 : e64 ? 2 : undefined,
    });
    try {
      assert.equal(MAX_BATCH_SLOTS, 16);
      const fusedNorms = (await stage.batchGraph([0, 1])).filter((op) => op.label.includes("+norm")).length;
      assert.equal(fusedNorms > 0, !int8, `residual adds that write a norm: ${fusedNorms}`);
      const gdnSplits = (await stage.batchGraph([0, 1])).filter((op) => op.label.endsWith(".gdn_step"))
        .map((op) => op.grid[1]);
      assert.deepEqual(
        new Set(gdnSplits),
        new Set([name === "tiny-qwen3next" ? 8 : e64 ? 2 : 4]),
        "gdn_step SPLIT",
      );
      const routers = (await stage.batchGraph([0, 1])).filter((op) => op.label.includes("ffn_gate_inp"));
      assert.deepEqual(
        routers.map((op) => op.label.replace(/^L\d+\./, "")),
        // Norms on their own: the post-attention norm rides on the router, the columns in grid z.
        Array(stage.hp.nLayer).fill(
          e64 && int8
            ? "ffn_gate_inp+shexp+post_attention_norm"
            : e64
            ? "ffn_gate_inp+shexp"
            : int8
            ? "ffn_gate_inp+post_attention_norm"
            : "ffn_gate_inp",
        ).flatMap((r) => e64 ? [r] : [r, "ffn_gate_inp_shexp"]),
        "the router's mat-vecs per layer",
      );
      const slots = rng.permutation(MAX_BATCH_SLOTS).slice(0, width);
      const prompts = slots.map(() => Array.from({ length: rng.int(2, 10) }, () => rng.int(0, 1021)));
      const opts = slots.map((_, b): GenerateOptions => ({
        nNew: 4 + 2 * (b % 3),
        top: 2,
        sampling: b % 4 === 3
          ? samplingParams({ temperature: 1.2, topK: 0, topP: 1, minP: 0, seed: rng.int(0, 1 << 30) })
          : undefined,
      }));
      const solo: GenerateResult[] = [];
      const soloNext: Float32Array[] = [];
      for (const [b, s] of slots.entries()) {
        const r = await stage.generate(s, prompts[b]!, { ...opts[b]!, batch: 4 });
        solo.push(r);
        soloNext.push((await stage.run(s, { tokens: [r.tokens.at(-1)!] }, stage.length(s))).data);
      }
      const got = await stage.generateBatch(
        slots.map((s, b) => ({ slot: s, prompt: prompts[b]!, opts: opts[b]! })),
        { batch: 4 },
      );
      for (const [b, s] of slots.entries()) {
        const what = `column ${b} slot ${s} (seed ${rng.seed})`;
        assert.deepEqual(got[b]!.tokens, solo[b]!.tokens, `${what} ids`);
        assert.deepEqual(got[b]!.top, solo[b]!.top, `${what} top-k logits`);
        assert.equal(stage.length(s), prompts[b]!.length + solo[b]!.tokens.length - 1, `${what} length`);
      }
      // Every slot's next row in one batched step of all `width` columns: each row is its solo run's logits.
      const next = await stage.runBatch(slots, { tokens: got.map((r) => r.tokens.at(-1)!) });
      const V = stage.hp.nVocab;
      assert.equal(next.data.length, width * V);
      for (const [b, s] of slots.entries()) {
        assert.deepEqual(
          next.data.subarray(b * V, (b + 1) * V),
          soloNext[b],
          `slot ${s} next logits (seed ${rng.seed})`,
        );
      }
    } finally {
      stage.destroy();
      if (dir) await Deno.remove(dir, { recursive: true });
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
      stage.generateBatch(Array.from({ length: MAX_BATCH_SLOTS + 1 }, (_, i) => it(i))),
      /1\.\.16 slots, got 17/,
    );
    await assert.rejects(stage.generateBatch([it(0), it(1)], { batch: 0 }), /Batch must be in 1\.\.64/);
  } finally {
    stage.destroy();
  }
});

Deno.test("turns: calls paused at readback boundaries and resumed, a newcomer joining, equal the uninterrupted runs", async () => {
  const rng = new Rng();
  const gpu = await testGpu();
  using file = await openGguf(fixturePath("tiny-qwen35moe.q8_0.gguf"));
  const stage = await Stage.load(gpu, file, { nCtx: 96, nSlots: 3, maxChunk: 8 });
  try {
    const prompts = [0, 1, 2].map(() => Array.from({ length: rng.int(2, 13) }, () => rng.int(0, 1021)));
    const hot = samplingParams({ temperature: 1.1, topK: 0, topP: 1, minP: 0, seed: rng.int(0, 1 << 30) });
    // Slot 1 samples with a repeat penalty (its RNG step and penalty window must carry over a pause); slot 2
    // joins in the second call with top-k pairs.
    const want: GenerateOptions[] = [
      { nNew: 30 },
      { nNew: 30, sampling: { ...hot, repeatPenalty: 1.3 } },
      { nNew: 13, top: 2 },
    ];
    const solo: GenerateResult[] = [];
    const soloNext: Float32Array[] = [];
    for (const [s, o] of want.entries()) {
      const r = await stage.generate(s, prompts[s]!, { ...o, batch: 4 });
      solo.push(r);
      soloNext.push((await stage.run(s, { tokens: [r.tokens.at(-1)!] }, stage.length(s))).data);
    }
    const made: number[][] = [[], [], []];
    const tops: [number, number][][][] = [[], [], []];
    const streamed: number[][] = [[], [], []];
    // The item that continues slot s: fresh (its whole prompt) before its first id, resumed after.
    const item = (s: number): BatchItem => {
      const o = want[s]!;
      const m = made[s]!;
      const seq = [...prompts[s]!, ...m];
      const onTokens = (ids: readonly number[]) => streamed[s]!.push(...ids);
      if (m.length === 0) return { slot: s, prompt: prompts[s]!, opts: { ...o, onTokens } };
      return {
        slot: s,
        prompt: [m.at(-1)!],
        opts: {
          ...o,
          nNew: o.nNew - m.length,
          base: seq.length - 1,
          resume: true,
          samplerStep: m.length,
          samplerHistory: seq,
          onTokens,
        },
      };
    };
    const call = async (slots: number[], pauseAfter: number) => {
      let asked = 0;
      const rs = await stage.decoder.generate(slots.map(item), {
        batch: 4,
        pause: () => ++asked > pauseAfter,
      });
      for (const [i, s] of slots.entries()) {
        made[s]!.push(...rs[i]!.tokens);
        tops[s]!.push(...rs[i]!.top);
        assert.equal(stage.length(s), prompts[s]!.length + made[s]!.length - 1, `slot ${s} length`);
      }
      return rs;
    };
    // First call: pause asked before the second batch is encoded → one batch of 4 steps after the first id.
    const r1 = await call([0, 1], 0);
    assert.deepEqual(r1.map((r) => [r.tokens.length, r.paused]), [[5, true], [5, true]]);
    // Second call: slot 2 joins fresh; two more batches.
    const r2 = await call([0, 1, 2], 1);
    assert.ok(r2.every((r) => r.paused), JSON.stringify(r2.map((r) => r.tokens.length)));
    assert.equal(r2[0]!.tokens.length, 8);
    // A lone resumed slot runs on its own decode graph, then all three to their ends: each call returns when
    // one of them ends (slot 2 first, at 13 ids), and the rest continue.
    await call([1], 0);
    let left = [0, 1, 2];
    for (let calls = 0; left.length > 0; calls++) {
      assert.ok(calls < 3, `at most one call per sequence end: ${left} left`);
      const rs = await call(left, Infinity);
      left = left.filter((_, i) => rs[i]!.paused);
    }
    for (const s of [0, 1, 2]) {
      const what = `slot ${s} (seed ${rng.seed})`;
      assert.deepEqual(made[s], solo[s]!.tokens, what);
      assert.deepEqual(streamed[s], solo[s]!.tokens, `${what} streamed`);
      assert.deepEqual(tops[s], solo[s]!.top, `${what} top-k`);
      const next = await stage.run(s, { tokens: [made[s]!.at(-1)!] }, stage.length(s));
      assert.deepEqual(next.data, soloNext[s], `${what} state after the turns`);
    }
    // A call ends at the readback where a sequence ends (slot 2 stops at once: its first id is a stop id).
    const p = prompts[2]!;
    const rs = await stage.decoder.generate([
      { slot: 0, prompt: prompts[0]!, opts: { nNew: 40 } },
      { slot: 2, prompt: p, opts: { nNew: 40, stopIds: [solo[2]!.tokens[0]!] } },
    ], { batch: 4, pause: () => false });
    assert.deepEqual(rs.map((r) => [r.tokens.length, r.paused, r.reason]), [[5, true, "length"], [
      1,
      false,
      "stop",
    ]]);
    await assert.rejects(
      stage.decoder.generate([{
        slot: 0,
        prompt: [1, 2],
        opts: { nNew: 2, base: stage.length(0), resume: true },
      }]),
      /Slot 0: a resumed sequence continues at its base \(> 0\) with its last id as the whole prompt, got base \d+ and 2/,
    );
  } finally {
    stage.destroy();
  }
});
