/**
 * The engine service with drafted frames in the unsplit engine (EngineOptions.draft, `head --draft K
 * --draft-cache N` without `--next`): a request and its repeat give the undrafted ids (greedy against a cold
 * Stage run, seeded sampling with penalties against the first run), the repeat drafts from the draft cache,
 * and `status().drafts` (what `/metrics` reports) counts its frames.
 * @module
 */
import { GREEDY_SAMPLING } from "../sampling.ts";
import assert from "node:assert/strict";
import { openGguf } from "../gguf.ts";
import { Stage } from "../exec/stage.ts";
import { startEngine } from "./service.ts";
import type { SamplingParams } from "./api.ts";
import { testGpu } from "../../tests/util/gpu.ts";
import { fixturePath } from "../../tests/util/fixtures.ts";

const MODEL = fixturePath("tiny-qwen35moe.q8_0.gguf");
const N_CTX = 96;
const PROMPT = [17, 301, 5, 88, 640, 12, 999, 45, 230, 7, 64, 3, 500, 41, 8, 77];
const PROMPT_B = [900, 14, 3, 77, 250, 6, 61, 402];
const GREEDY = GREEDY_SAMPLING;
const SAMPLED: SamplingParams = { ...GREEDY, temperature: 0.9, topK: 8, repeatPenalty: 1.2, seed: 11 };

Deno.test("engine --draft: a repeated request drafts from the cache, the same ids, counted in status", async () => {
  const gpu = await testGpu();
  const [want, wantB] = await (async () => {
    using file = await openGguf(MODEL);
    const stage = await Stage.load(gpu, file, { nCtx: N_CTX, nSlots: 1 });
    try {
      return [
        (await stage.generate(0, PROMPT, { nNew: 40 })).tokens,
        (await stage.generate(0, PROMPT_B, { nNew: 12 })).tokens,
      ];
    } finally {
      stage.destroy();
    }
  })();
  // snapshotBack 0: every prompt in one prefill chunk, as the cold Stage run takes it.
  const e = startEngine({
    model: MODEL,
    nCtx: N_CTX,
    nSlots: 2,
    queueSize: 4,
    snapshotBack: 0,
    draft: { k: 7, cache: 10_000 },
    warmUp: false,
    onLog: () => {},
  });
  try {
    const run = async (sampling: SamplingParams, onTokens?: () => void) => {
      const streamed: number[] = [];
      const r = await e.generate({
        prompt: PROMPT,
        maxTokens: 40,
        sampling,
        stopIds: [],
        onTokens: (ids) => {
          streamed.push(...ids);
          onTokens?.();
        },
      });
      assert.deepEqual(streamed, r.tokens);
      return r.tokens;
    };
    assert.deepEqual(await run(GREEDY), want, "the first request");
    assert.deepEqual(await run(GREEDY), want, "the repeat (drafted from the cache)");
    const sampled = await run(SAMPLED);
    assert.deepEqual(await run(SAMPLED), sampled, "a sampled request's repeat");
    // A request joining a drafting one: the scheduler's pause ends its frames, both run batched, then it
    // drafts alone again; both give their solo ids.
    let b: Promise<readonly number[]> | undefined;
    const joined = await run(GREEDY, () => {
      b ??= e.generate({ prompt: PROMPT_B, maxTokens: 12, sampling: GREEDY, stopIds: [] }).then((r) =>
        r.tokens
      );
    });
    assert.deepEqual(joined, want, "the repeat a request joined");
    assert.deepEqual(await b, wantB, "the request that joined it");
    // The worker posts its counts beside the ids: they may land just after the result.
    let d = e.status().drafts;
    for (let i = 0; i < 100 && (d?.accepted ?? 0) < 60; i++) {
      await new Promise((r) => setTimeout(r, 20));
      d = e.status().drafts;
    }
    assert.ok(
      d && d.frames > 0 && d.accepted >= 60,
      `the repeats drafted and kept drafts: ${JSON.stringify(d)}`,
    );
    assert.ok(d.accepted <= d.proposed, JSON.stringify(d));
  } finally {
    await e.close();
  }
});

Deno.test("engine --draft: k outside 1..7 and min above k are refused", () => {
  assert.throws(
    () => startEngine({ model: MODEL, nCtx: N_CTX, nSlots: 1, queueSize: 0, draft: { k: 8 } }),
    /draft: k must be an integer in 1\.\.7, got 8/,
  );
  assert.throws(
    () => startEngine({ model: MODEL, nCtx: N_CTX, nSlots: 1, queueSize: 0, draft: { k: 3, min: 4 } }),
    /draft: min must be an integer in 1\.\.3, got 4/,
  );
});
