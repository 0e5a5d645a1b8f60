import assert from "node:assert/strict";
import { ChainTimes, RECENT_WINDOW, RunningTime } from "./stats.ts";

Deno.test("RunningTime: count, total, last and the mean of the latest window", () => {
  const t = new RunningTime();
  assert.deepEqual(t.view(), { count: 0, totalMs: 0, lastMs: 0, recentMs: 0 });
  t.add(2);
  t.add(4);
  assert.deepEqual(t.view(), { count: 2, totalMs: 6, lastMs: 4, recentMs: 3 });
  // Past the window the mean covers only the latest RECENT_WINDOW samples; the total keeps everything.
  for (let i = 0; i < RECENT_WINDOW; i++) t.add(10);
  const v = t.view();
  assert.equal(v.count, RECENT_WINDOW + 2);
  assert.equal(v.totalMs, 6 + 10 * RECENT_WINDOW);
  assert.equal(v.lastMs, 10);
  assert.equal(v.recentMs, 10);
  t.add(42);
  assert.equal(t.view().recentMs, (10 * (RECENT_WINDOW - 1) + 42) / RECENT_WINDOW);
  assert.throws(() => t.add(-1), /finite number >= 0 ms, got -1/);
  assert.throws(() => t.add(NaN), /got NaN/);
});

Deno.test("ChainTimes: per-stage compute from the head and the RUN_RESULT, wire as round trip minus compute", () => {
  const c = new ChainTimes();
  assert.equal(c.compute(0), undefined);
  assert.equal(c.wire(1), undefined);
  c.record({ headUs: 5000, timesUs: [3000, 1000], roundTripUs: 6500 });
  c.record({ timesUs: [1000, 3000], roundTripUs: 4200 }); // a later prompt piece: no head time
  assert.deepEqual(c.compute(0), { count: 1, totalMs: 5, lastMs: 5, recentMs: 5 });
  assert.deepEqual(c.compute(1), { count: 2, totalMs: 4, lastMs: 1, recentMs: 2 });
  assert.deepEqual(c.compute(2), { count: 2, totalMs: 4, lastMs: 3, recentMs: 2 });
  const w = c.wire(1)!;
  assert.equal(w.count, 2);
  assert.ok(Math.abs(w.totalMs - 2.7) < 1e-9, `wire total ${w.totalMs}`);
  assert.ok(Math.abs(w.lastMs - 0.2) < 1e-9, `wire last ${w.lastMs}`);
  assert.equal(c.wire(0), undefined, "the head's own range has no wire");
  assert.equal(c.wire(2), undefined, "a middle worker reports no hop time: the first hop holds it");
  // Clock skew between a stage's own timer and the round trip never makes a negative wire time.
  c.record({ timesUs: [900], roundTripUs: 800 });
  assert.equal(c.wire(1)!.lastMs, 0);
});
