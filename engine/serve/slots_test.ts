/**
 * The service's per-slot view (`status().slots`, the dashboard's slot table) and queue time, on a real
 * Worker and the test adapter: a generating request shows on its slot with its ids and rate, a long prompt
 * prefilled in pieces between the other's decode turns shows its progress, and idle slots say so. The
 * worker builds its GPU pipelines at load (a warm-up run logged before the load line).
 * @module
 */
import { GREEDY_SAMPLING } from "../sampling.ts";
import assert from "node:assert/strict";
import { startEngine } from "./service.ts";
import type { EngineStatus } from "./api.ts";
import { fixturePath } from "../../tests/util/fixtures.ts";

const GREEDY = GREEDY_SAMPLING;

type SlotView = NonNullable<EngineStatus["slots"]>[number];

Deno.test("status().slots: the generating request, the prefilling one's progress, idle slots; queueMs", async () => {
  const log: string[] = [];
  // prefillTurn 8: B's 48-token prompt goes in pieces, each followed by one decode turn of A (8 ids).
  const e = startEngine({
    model: fixturePath("tiny-qwen35moe.q8_0.gguf"),
    nCtx: 256,
    nSlots: 3,
    queueSize: 1,
    prefillTurn: 8,
    pieceGap: 0,
    snapshotBack: 0,
    onLog: (l) => log.push(l),
  });
  try {
    while (e.status().state === "loading") await new Promise((r) => setTimeout(r, 20));
    assert.equal(e.status().state, "ready");
    // The pipelines were built at load (worker.ts warmUp), not by the first request.
    const built = log.findIndex((l) => /^GPU pipelines built in [\d.]+ s$/.test(l));
    assert.ok(built >= 0 && built < log.findIndex((l) => l.startsWith("Loaded ")), log.join("\n"));
    const idle = e.status().slots;
    assert.ok(idle !== undefined && idle.length === 3, JSON.stringify(idle));
    assert.ok(idle.every((s, i) => s.slot === i && s.phase === "idle"), JSON.stringify(idle));

    const seenA: SlotView[][] = [];
    const a = e.generate({
      prompt: [1, 2, 3, 4],
      maxTokens: 120,
      sampling: GREEDY,
      stopIds: [],
      onTokens: () => seenA.push([...(e.status().slots ?? [])]),
    });
    // B arrives once A generates, so its pieces alternate with A's decode turns.
    while (seenA.length === 0) await new Promise((r) => setTimeout(r, 5));
    const b = e.generate({
      prompt: Array.from({ length: 48 }, (_, i) => 10 + i),
      maxTokens: 2,
      sampling: GREEDY,
      stopIds: [],
    });
    const [ra, rb] = await Promise.all([a, b]);
    assert.equal(ra.tokens.length, 120);
    assert.equal(rb.tokens.length, 2);
    assert.ok(ra.queueMs !== undefined && ra.queueMs >= 0 && ra.queueMs <= ra.timeToFirstTokenMs);

    // A on one slot, generating, its ids counted as they came, with a rate after its first batch.
    const aSlot = seenA[0]!.find((s) => s.phase === "generating");
    assert.ok(aSlot !== undefined, JSON.stringify(seenA[0]));
    assert.equal(aSlot.promptTokens, 4);
    assert.equal(aSlot.prefilledTokens, 4);
    const lastA = seenA.at(-1)!.find((s) => s.slot === aSlot.slot)!;
    assert.equal(lastA.phase, "generating");
    assert.equal(lastA.generatedTokens, 120);
    assert.ok(typeof lastA.tokPerS === "number" && lastA.tokPerS > 0, JSON.stringify(lastA));
    assert.ok(lastA.ageMs > 0);

    // B seen prefilling on another slot with progress strictly between 0 and its prompt.
    const progress = seenA.flatMap((v) =>
      v.filter((s) => s.slot !== aSlot.slot && s.phase === "prefilling").map((s) => s.prefilledTokens)
    );
    assert.ok(progress.some((n) => n > 0 && n < 48), `B's prefill progress seen: ${progress.join(",")}`);
    for (const s of seenA.flat()) if (s.phase === "prefilling") assert.equal(s.promptTokens, 48);
    // Progress only grows.
    for (let i = 1; i < progress.length; i++) assert.ok(progress[i]! >= progress[i - 1]!, progress.join(","));

    const after = e.status().slots!;
    assert.ok(after.every((s) => s.phase === "idle" && s.generatedTokens === 0), JSON.stringify(after));
  } finally {
    await e.close();
  }
});
