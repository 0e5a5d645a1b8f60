/**
 * The piece pacer's arithmetic (engine/serve/_pacer.ts): fixed pieces until the decode step and a piece are
 * measured; then each piece scaled from the last by the round's budget over its time, or along the secant of
 * two widths, in grains of at most 128 tokens, within the bounds.
 * @module
 */
import assert from "node:assert/strict";
import { PiecePacer } from "./_pacer.ts";

const OPTS = { gap: 2.5, minPiece: 256, maxPiece: 8192, batch: 8, pieceSteps: 2 };

Deno.test("pacer: fixed pieces until a step and a piece are measured", () => {
  const p = new PiecePacer(OPTS);
  assert.equal(p.budget(), 256);
  p.round(256, 2, 300); // no step time yet: says nothing
  assert.equal(p.budget(), 256);
  assert.deepEqual(p.measured, { stepMs: undefined, last: undefined });
  p.steady(8, 160);
  assert.equal(p.budget(), 256);
  assert.equal(p.measured.stepMs, 20);
});

Deno.test("pacer: pieces grow toward the round's budget, never past it with a fixed cost", () => {
  // 7 streams at 21 ms per step: a steady gap of 168 ms, rounds of 2.5 × 168 = 420 ms, 378 ms of pieces
  // after the 2 steps. Pieces cost 132 ms + 0.26 ms per token (the H200's shape, docs/PERF.md).
  const p = new PiecePacer(OPTS);
  const piece = (n: number) => 132 + 0.26 * n;
  p.steady(8, 168);
  const sizes: number[] = [];
  for (let i = 0, n = 256; i < 8; i++, n = p.budget()) {
    sizes.push(n);
    p.round(n, 2, 42 + piece(n));
    assert.ok(piece(n) <= 378, `a ${n}-token piece takes ${piece(n)} ms`);
  }
  // 256 in 198.56 ms → 487 tokens fit in proportion → 384 (grains of 128); from two widths the secant (slope
  // 0.26 ms per token) says 946 fit: 768 (at most twice the last), then 896, where it stays. Proportional
  // scaling alone stopped at 768 (768 · 378 / 331.7 = 875).
  assert.deepEqual(sizes, [256, 384, 768, 896, 896, 896, 896, 896]);
  // More streams, slower steps: the budget's time grows with the steady gap (18 · 30 ms = 540 ms of pieces).
  p.steady(8, 8 * 30);
  assert.equal(p.budget(), Math.floor(Math.min(896 + (540 - piece(896)) / 0.26, 2 * 896) / 128) * 128);
});

Deno.test("pacer: a piece stuck at its grain tries one grain more, then keeps what fits", () => {
  // The H100 of 2026-12-05: 7 streams at 12.4 ms per step (223.2 ms of pieces per round at gap 2.5), pieces
  // of 130.4 ms + 0.26 ms per token. 256 · 223.2 / 197 = 290 tokens rounds down to 256 again; the round used
  // 88% of its time, so the next tries 384, which takes 230.2 ms (over); the secant through both then says
  // 356 tokens fit: 256 from there on, never 384 again.
  const p = new PiecePacer(OPTS);
  const piece = (n: number) => 130.4 + 0.26 * n;
  p.steady(8, 8 * 12.4);
  const sizes: number[] = [];
  for (let i = 0, n = 256; i < 6; i++, n = p.budget()) {
    sizes.push(n);
    p.round(n, 2, 2 * 12.4 + piece(n));
  }
  assert.deepEqual(sizes, [256, 384, 256, 256, 256, 256]);
  // A round that used more than 90% of its time does not explore.
  const tight = new PiecePacer(OPTS);
  tight.steady(8, 8 * 12.4);
  tight.round(256, 2, 2 * 12.4 + 210);
  assert.equal(tight.budget(), 256);
});

Deno.test("pacer: where piece time grows faster than width, the secant keeps the pieces from overshooting again", () => {
  // lavapipe's shape (docs/PERF.md: 873 / 1,583 / 3,463 ms at 256 / 384 / 512 tokens): n² / 75 ms, 1,500 ms of
  // pieces per round. 256 (874 ms) → 439 in proportion → 384 (1,966 ms, over) → 293 → 256; from there the
  // secant (8.5 ms per token) says 329, so 256 stays, where proportional scaling alone would say 384 again.
  const p = new PiecePacer(OPTS);
  const piece = (n: number) => n * n / 75;
  p.steady(8, 8 * 1500 / 18);
  const sizes: number[] = [];
  for (let i = 0, n = 256; i < 6; i++, n = p.budget()) {
    sizes.push(n);
    p.round(n, 2, 2 * 1500 / 18 + piece(n));
  }
  assert.deepEqual(sizes, [256, 384, 256, 256, 256, 256]);
});

Deno.test("pacer: a round over its budget shrinks the next piece in proportion", () => {
  const p = new PiecePacer(OPTS);
  p.steady(8, 160); // 360 ms of pieces per round
  p.round(1024, 2, 40 + 720); // twice the budget (deep in the prompt, attention grew)
  assert.equal(p.budget(), 512);
  assert.deepEqual(p.measured.last, { tokens: 1024, ms: 720 });
  p.round(512, 2, 40 + 900);
  assert.equal(p.budget(), 256); // 204.8 tokens, never below minPiece
});

Deno.test("pacer: pieces stay within minPiece..maxPiece in grains of at most 128; gap 0 keeps them fixed", () => {
  const slow = new PiecePacer(OPTS);
  slow.steady(8, 8); // 1 ms steps: an 18 ms budget
  slow.round(256, 2, 1002);
  assert.equal(slow.budget(), 256);
  const fast = new PiecePacer({ ...OPTS, maxPiece: 1024 });
  fast.steady(8, 800);
  fast.round(256, 2, 220); // 256 tokens in 20 ms of prefill
  assert.equal(fast.budget(), 1024);
  // A round no longer than its steps (noise, a tiny rest) is not a measurement.
  fast.round(8, 2, 200);
  assert.deepEqual(fast.measured.last, { tokens: 256, ms: 20 });
  const fixed = new PiecePacer({ ...OPTS, gap: 0 });
  fixed.steady(8, 800);
  fixed.round(256, 2, 220);
  assert.equal(fixed.budget(), 256);
  // A small smallest piece is its own grain.
  const small = new PiecePacer({ ...OPTS, minPiece: 8, maxPiece: 64 });
  small.steady(4, 40); // 10 ms steps, batch 8: (20 − 2) × 10 = 180 ms of pieces
  small.round(8, 2, 28); // 8 tokens in 8 ms
  assert.equal(small.budget(), 64); // 180 tokens, capped
  const smaller = new PiecePacer({ ...OPTS, minPiece: 8, maxPiece: 1000 });
  smaller.steady(4, 40);
  smaller.round(8, 2, 20 + 80); // 8 tokens in 80 ms: 18 tokens fit, 16 in grains of 8
  assert.equal(smaller.budget(), 16);
  // Whole prompts (no smallest piece) are never paced.
  const whole = new PiecePacer({ ...OPTS, minPiece: Infinity, maxPiece: Infinity });
  whole.steady(8, 160);
  whole.round(4096, 2, 1000);
  assert.equal(whole.budget(), Infinity);
});

Deno.test("pacer: bad options are refused", () => {
  assert.throws(() => new PiecePacer({ ...OPTS, gap: -1 }), /gap must be >= 0, got -1/);
  assert.throws(() => new PiecePacer({ ...OPTS, gap: NaN }), /gap must be >= 0, got NaN/);
  assert.throws(
    () => new PiecePacer({ ...OPTS, minPiece: 512, maxPiece: 256 }),
    /1 <= min <= max, got 512..256/,
  );
});
