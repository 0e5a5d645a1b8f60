import assert from "node:assert/strict";
import { PrefillLog } from "./prefill_log.ts";

const slot = (
  o: { slot?: number; phase?: "idle" | "prefilling" | "generating"; held: number; age: number },
) => ({
  slot: o.slot ?? 0,
  phase: o.phase ?? "prefilling" as const,
  promptTokens: 4000,
  prefilledTokens: o.held,
  generatedTokens: 0,
  ageMs: o.age,
});

Deno.test("PrefillLog: nothing for a short prefill; a long one logs at most once per interval, per request", () => {
  const log = new PrefillLog(1000);
  // Admitted at t=0, seen at t=100 holding 256 tokens.
  assert.deepEqual(log.update([slot({ held: 256, age: 100 })], 100), []);
  assert.deepEqual(log.update([slot({ held: 768, age: 900 })], 900), []);
  assert.deepEqual(log.update([slot({ held: 1280, age: 1100 })], 1100), [
    "prefill slot=0 prompt_tokens=1280/4000 tok_s=1024.0 elapsed_ms=1000",
  ]);
  assert.deepEqual(log.update([slot({ held: 1536, age: 1600 })], 1600), []);
  assert.equal(log.update([slot({ held: 2304, age: 2100 })], 2100).length, 1);
  // It generates: done. A new request on the slot starts over (no line before its own second).
  assert.deepEqual(log.update([slot({ phase: "generating", held: 4000, age: 2600 })], 2600), []);
  assert.deepEqual(log.update([slot({ held: 512, age: 10 })], 3000), []);
  assert.deepEqual(log.update([slot({ held: 1024, age: 510 })], 3500), []);
  assert.equal(log.update([slot({ held: 2048, age: 1010 })], 4000).length, 1);
  // A short request that ends before the interval prints nothing.
  const quick = new PrefillLog(1000);
  assert.deepEqual(quick.update([slot({ slot: 1, held: 256, age: 5 })], 5), []);
  assert.deepEqual(quick.update([slot({ slot: 1, phase: "idle", held: 0, age: 0 })], 600), []);
});
