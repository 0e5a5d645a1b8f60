/**
 * The engine service end to end (a real Worker on the test adapter): loading → ready, concurrent requests ≡
 * their solo greedy runs, the bounded queue, context checks, cancellation, prefix reuse and close.
 * Reference outputs come from a Stage in the test process (cold: the slot reset, the whole prompt prefilled).
 * @module
 */
import { GREEDY_SAMPLING } from "../sampling.ts";
import assert from "node:assert/strict";
import { openGguf } from "../gguf.ts";
import { Stage } from "../exec/stage.ts";
import { MAX_BATCH_SLOTS } from "../exec/activations.ts";
import { EARLY_READS } from "../gpu/readback.ts";
import { type EngineOptions, type EngineService, startEngine } from "./service.ts";
import { type GenerateResult, QueueFullError } from "./api.ts";
import { testGpu } from "../../tests/util/gpu.ts";
import { fixturePath } from "../../tests/util/fixtures.ts";
import { Rng } from "../../tests/util/rng.ts";

const MODEL = fixturePath("tiny-qwen35moe.q8_0.gguf");
const N_CTX = 96;
const GREEDY = GREEDY_SAMPLING;

/** Cold greedy reference: Stage.generate in this process, same context size as the engine. */
const reference = await (async () => {
  const gpu = await testGpu();
  const file = await openGguf(MODEL);
  const stage = await Stage.load(gpu, file, { nCtx: N_CTX, nSlots: 1 });
  const nVocab = stage.hp.nVocab;
  return {
    nVocab,
    async solo(prompt: readonly number[], nNew: number, stopIds: number[] = []): Promise<number[]> {
      return (await stage.generate(0, prompt, { nNew, stopIds })).tokens;
    },
    close() {
      stage.destroy();
      file.close();
    },
  };
})();

globalThis.addEventListener("unload", () => reference.close());

function randomPrompt(rng: Rng, n: number): number[] {
  return Array.from({ length: n }, () => rng.int(0, reference.nVocab));
}

/**
 * An engine of the tiny model without the warm-up (EngineOptions.warmUp false: each test compiles only the
 * pipelines its requests use; the warm-up itself is checked in slots_test.ts and the default-model test).
 */
function engine(nSlots: number, queueSize: number, more: Partial<EngineOptions> = {}): EngineService {
  return startEngine({
    model: MODEL,
    nCtx: N_CTX,
    nSlots,
    queueSize,
    warmUp: false,
    onLog: () => {},
    ...more,
  });
}

/** Resolves when the engine reports ready (polling status, as /health would). */
async function ready(e: EngineService): Promise<void> {
  while (e.status().state === "loading") await new Promise((r) => setTimeout(r, 20));
  assert.equal(e.status().state, "ready");
}

Deno.test("the default model: loading at once, synthesized and logged, then ready with its name and sizes", async () => {
  const log: string[] = [];
  const e = startEngine({ nCtx: 64, nSlots: 1, queueSize: 0, onLog: (l) => log.push(l) });
  let path = "";
  try {
    const s0 = e.status();
    assert.equal(s0.state, "loading");
    assert.equal(s0.nCtx, 64);
    assert.equal(s0.nSlots, 1);
    await ready(e);
    const s = e.status();
    assert.equal(s.arch, "qwen35moe");
    assert.ok(s.totalBytes > 0 && s.loadedBytes === s.totalBytes, JSON.stringify(s));
    assert.ok(log.some((l) => /tiny synthetic qwen35moe/.test(l)), log.join("\n"));
    assert.ok(log.some((l) => /x f32 in the decode mat-vecs/.test(l)), log.join("\n"));
    assert.ok(
      log.some((l) => /^GPU pipelines built in [\d.]+ s$/.test(l)),
      "the warm-up ran: " + log.join("\n"),
    );
    path = await e.modelPath();
    assert.ok(path.endsWith(".gguf") && (await Deno.stat(path)).isFile, path);
    const r = await e.generate({ prompt: [1, 2, 3], maxTokens: 4, sampling: GREEDY, stopIds: [] });
    assert.equal(r.tokens.length, 4);
    assert.equal(r.reason, "length");
  } finally {
    await e.close();
  }
  await assert.rejects(Deno.stat(path), Deno.errors.NotFound, "close() removes the synthesized model");
});

Deno.test("int8Activations reaches the stage: logged, and a request gives its Stage's int8 greedy tokens", async () => {
  const rng = new Rng();
  const gpu = await testGpu();
  using file = await openGguf(MODEL);
  const stage = await Stage.load(gpu, file, { nCtx: N_CTX, nSlots: 1, int8Activations: true });
  const log: string[] = [];
  // snapshotBack 0: the prompt in one prefill chunk, as Stage.generate takes it (another chunking would differ
  // by f32 summation order, enough to decide a near-tie the other way).
  const e = engine(1, 0, { int8Activations: true, snapshotBack: 0, onLog: (l) => log.push(l) });
  try {
    const prompt = randomPrompt(rng, rng.int(1, 20));
    const want = (await stage.generate(0, prompt, { nNew: 12 })).tokens;
    await ready(e);
    const got = await e.generate({ prompt, maxTokens: 12, sampling: GREEDY, stopIds: [] });
    assert.deepEqual(got.tokens, want, `prompt ${prompt} (seed ${rng.seed})`);
    assert.ok(log.some((l) => /x int8 in the decode mat-vecs/.test(l)), log.join("\n"));
    // warmUp false (this file's engines): no warm-up, said so.
    assert.ok(log.some((l) => /^Warm-up skipped/.test(l)), log.join("\n"));
    assert.ok(!log.some((l) => /GPU pipelines built/.test(l)), log.join("\n"));
  } finally {
    await e.close();
    stage.destroy();
  }
});

// 10 slots: steps wider than a chunk's 8 columns (their variants are built at warm-up from 9 slots on).
Deno.test("10 concurrent requests on 10 slots each give their solo greedy output, streamed in order", async () => {
  const rng = new Rng();
  const e = engine(10, 0, { warmUp: true });
  try {
    // The warm-up compiled every pipeline these requests need (batched steps of 2..10 slots, prompt widths).
    while (e.status().state === "loading") await new Promise((r) => setTimeout(r, 50));
    const warm = e.status().pipelines;
    assert.ok(warm !== undefined && warm > 0, `pipelines after the warm-up: ${warm}`);
    const prompts = Array.from({ length: 10 }, () => randomPrompt(rng, rng.int(1, 20)));
    const n = 16;
    const solo: number[][] = [];
    for (const p of prompts) solo.push(await reference.solo(p, n));
    // Requests 2 and 3 stop at an id their solo run makes mid-way: the same tokens, cut there.
    const stops = prompts.map((_, i) => (i >= 2 ? [solo[i]![7]!] : []));
    const want = solo.map((t, i) => {
      const at = stops[i]!.length > 0 ? t.indexOf(stops[i]![0]!) : -1;
      return at >= 0 ? t.slice(0, at + 1) : t;
    });
    const streamed: number[][] = prompts.map(() => []);
    const got = await Promise.all(prompts.map((prompt, i) =>
      e.generate({
        prompt,
        maxTokens: n,
        sampling: GREEDY,
        stopIds: stops[i]!,
        onTokens: (ids) => streamed[i]!.push(...ids),
      })
    ));
    for (const [i, r] of got.entries()) {
      const what = `request ${i} prompt ${prompts[i]} (seed ${rng.seed})`;
      assert.deepEqual(r.tokens, want[i], what);
      assert.deepEqual(streamed[i], want[i], what);
      assert.equal(r.reason, stops[i]!.length > 0 ? "stop" : "length", what);
      assert.equal(r.promptTokens, prompts[i]!.length);
    }
    const c = e.status().counters;
    assert.equal(c.requests, 10);
    assert.equal(c.generatedTokens, want.reduce((a, t) => a + t.length, 0));
    // All ten arrive together and every generating request joins every step: all but the first ids (and the
    // ids made alone after the others ended) come from batched steps.
    assert.ok(c.batchedTokens >= 10 * 6, `batched tokens ${c.batchedTokens}`);
    assert.equal(e.status().busySlots, 0);
    assert.equal(e.status().pipelines, warm, "no pipeline compiled while serving");
    // The engine's readbacks: its stagings and ring buffers are reused, so most are read early.
    const rb = e.status().readbacks!;
    assert.equal(rb.fellBack, 0);
    if (EARLY_READS) assert.ok(rb.early > rb.awaited, `readbacks ${JSON.stringify(rb)}`);
  } finally {
    await e.close();
  }
});

Deno.test("prompt pieces of 4 tokens interleave with the others' decode; 3 requests on 3 slots each give their solo output", async () => {
  const rng = new Rng();
  const e = engine(3, 0, { prefillTurn: 4, prefillAlone: 4, pieceGap: 0, batch: 4 });
  try {
    // Request 0 has the longest prompt (several pieces, prefillAlone 4: pieces even before the others stream);
    // 1 and 2 fit one piece, so both start generating
    // while 0 is still prefilling whatever the draw.
    const prompts = [rng.int(5, 20), rng.int(2, 5), rng.int(2, 5)].map((len) => randomPrompt(rng, len));
    const n = [17, 9, 12];
    const want: number[][] = [];
    for (const [i, p] of prompts.entries()) want.push(await reference.solo(p, n[i]!));
    // Request 2 stops at its 7th id (a stop inside a later batch).
    const stops = [[], [], [want[2]![6]!]];
    want[2] = want[2]!.slice(0, want[2]!.indexOf(want[2]![6]!) + 1);
    const got = await Promise.all(
      prompts.map((prompt, i) =>
        e.generate({ prompt, maxTokens: n[i]!, sampling: GREEDY, stopIds: stops[i]! })
      ),
    );
    for (const [i, r] of got.entries()) {
      assert.deepEqual(r.tokens, want[i], `request ${i} prompt ${prompts[i]} (seed ${rng.seed})`);
    }
    assert.deepEqual(got.map((r) => r.reason), ["length", "length", "stop"]);
    assert.ok(e.status().counters.batchedTokens > 0);
  } finally {
    await e.close();
  }
});

Deno.test("batchMin 0: requests take turns of 5 ids (the first turn ends at the first id); each gives its solo output", async () => {
  const rng = new Rng();
  const e = engine(3, 0, { turnTokens: 5, prefillTurn: 4, batchMin: 0 });
  try {
    const prompts = [rng.int(5, 20), rng.int(2, 5), rng.int(2, 5)].map((len) => randomPrompt(rng, len));
    const n = [17, 9, 12];
    const want: number[][] = [];
    for (const [i, p] of prompts.entries()) want.push(await reference.solo(p, n[i]!));
    const order: number[] = [];
    const got = await Promise.all(
      prompts.map((prompt, i) =>
        e.generate({ prompt, maxTokens: n[i]!, sampling: GREEDY, stopIds: [], onTokens: () => order.push(i) })
      ),
    );
    for (const [i, r] of got.entries()) {
      assert.deepEqual(r.tokens, want[i], `request ${i} prompt ${prompts[i]} (seed ${rng.seed})`);
    }
    // Request 0 (17 ids) was still streaming after requests 1 and 2 had started: turns, not whole requests.
    assert.ok(order.lastIndexOf(0) > order.indexOf(1) && order.indexOf(2) < order.lastIndexOf(0), `${order}`);
    assert.equal(e.status().counters.batchedTokens, 0, "no batched step");
  } finally {
    await e.close();
  }
});

Deno.test("a long prompt arriving while 3 stream is prefilled in pieces between their decode batches", async () => {
  const rng = new Rng();
  const batch = 4;
  // pieceGap 0: fixed pieces of 8 (the pacer would size them by time; engine/serve/_runner_test.ts), whole
  // (pieces in parts: engine/serve/_runner_test.ts).
  const e = engine(4, 0, { prefillTurn: 8, pieceGap: 0, pieceParts: false, batch });
  try {
    const prompts = [0, 1, 2].map(() => randomPrompt(rng, rng.int(2, 6)));
    // 80 prompt tokens: pieces of 8 up to the snapshot point 72 (9 pieces), the last 8 with the first id.
    const long = randomPrompt(rng, 80);
    const want = [];
    for (const p of prompts) want.push(await reference.solo(p, 64));
    const wantLong = await reference.solo(long, 6);
    await ready(e);
    const events: string[] = [];
    let late: Promise<GenerateResult> | undefined;
    const streams = prompts.map((prompt, i) =>
      e.generate({
        prompt,
        maxTokens: 64,
        sampling: GREEDY,
        stopIds: [],
        onTokens: () => {
          events.push(`s${i}`);
          // The long prompt arrives once all three are streaming.
          if (!late && new Set(events).size === 3) {
            events.push("arrive");
            late = e.generate({
              prompt: long,
              maxTokens: 6,
              sampling: GREEDY,
              stopIds: [],
              onTokens: () => events.push("long"),
            });
          }
        },
      })
    );
    const got = await Promise.all(streams);
    const lateGot = await late!;
    for (const [i, r] of got.entries()) assert.deepEqual(r.tokens, want[i], `stream ${i} (seed ${rng.seed})`);
    assert.deepEqual(lateGot.tokens, wantLong, `the long prompt (seed ${rng.seed})`);
    // Between the arrival and the long prompt's first id, each stream got one batch per piece (one piece, one
    // decode turn): their flow never stopped for the whole prefill.
    const during = events.slice(events.indexOf("arrive"), events.indexOf("long"));
    for (const i of [0, 1, 2]) {
      const n = during.filter((x) => x === `s${i}`).length;
      assert.ok(n >= 9, `stream ${i} got ${n} batches during the 9-piece prefill: ${events.join(" ")}`);
    }
  } finally {
    await e.close();
  }
});

Deno.test("new requests go first: every request's first id lands before any request's second batch", async () => {
  const rng = new Rng();
  // Two prompts longer than the snapshot distance (8): their first turn is a prefill piece up to the
  // snapshot point, and the turn after it must still come before the others' generating turns.
  const prompts = [rng.int(9, 16), rng.int(9, 16), rng.int(2, 8)].map((n) => randomPrompt(rng, n));
  const want: number[][] = [];
  for (const p of prompts) want.push(await reference.solo(p, 20));
  // The engine starts after the references, so the three requests arrive together while it loads (the
  // worker hands them to the scheduler at once), not one by one to an engine already serving.
  const e = engine(3, 0, { batchMin: 0 });
  try {
    const order: number[] = [];
    const got = await Promise.all(
      prompts.map((prompt, i) =>
        e.generate({ prompt, maxTokens: 20, sampling: GREEDY, stopIds: [], onTokens: () => order.push(i) })
      ),
    );
    for (const [i, r] of got.entries()) {
      assert.deepEqual(r.tokens, want[i], `request ${i} (seed ${rng.seed})`);
    }
    // Turns of 64 ids would let request 0 finish before the others start; first turns end at the first id.
    assert.deepEqual([...order.slice(0, 3)].sort(), [0, 1, 2], `${order}`);
  } finally {
    await e.close();
  }
});

Deno.test("engine options out of range are refused before a worker starts, naming the option", () => {
  assert.throws(
    () => engine(2, 0, { batchMin: 1 }),
    /batchMin must be 0 \(never\) or an integer 2\.\.16, got 1/,
  );
  // 16: the engine's MAX_BATCH_SLOTS (service.ts spells it: the main thread does not load the engine).
  assert.throws(() => engine(2, 0, { batchMin: MAX_BATCH_SLOTS + 1 }), /batchMin .* got 17/);
  assert.throws(() => engine(2, 0, { turnTokens: -1 }), /turnTokens must be an integer >= 0, got -1/);
  assert.throws(() => engine(2, 0, { batch: 0 }), /batch must be an integer in 1\.\.64, got 0/);
  assert.throws(() => engine(2, 0, { maxChunk: 0 }), /maxChunk must be an integer in 1\.\.4096, got 0/);
  assert.throws(
    () => engine(2, 0, { batch: 4, pieceSteps: 5 }),
    /pieceSteps must be an integer in 1\.\.4, got 5/,
  );
  assert.throws(() => engine(2, 0, { nCtx: 1 }), /nCtx must be an integer >= 2, got 1/);
  for (const g of [0.5, -1, 65, NaN]) {
    assert.throws(
      () => engine(2, 0, { pieceGap: g }),
      new RegExp(`pieceGap must be 0 \\(fixed pieces of prefillTurn\\) or a number in 1\\.\\.64 .*got ${g}`),
    );
  }
});

Deno.test("a full queue refuses with QueueFullError and a Retry-After; a prompt that does not fit is a RangeError", async () => {
  const rng = new Rng();
  const e = engine(1, 1);
  try {
    const req = () => ({ prompt: randomPrompt(rng, 5), maxTokens: 6, sampling: GREEDY, stopIds: [] });
    const a = e.generate(req());
    const b = e.generate(req());
    assert.equal(e.status().busySlots, 1);
    assert.equal(e.status().queued, 1);
    await assert.rejects(e.generate(req()), (err: unknown) => {
      assert.ok(err instanceof QueueFullError, String(err));
      assert.ok(err.retryAfterSeconds >= 1, String(err.retryAfterSeconds));
      assert.match(err.message, /1 slots are busy and the queue of 1 is full/);
      return true;
    });
    assert.equal((await a).tokens.length, 6);
    assert.equal((await b).tokens.length, 6);
    await assert.rejects(
      e.generate({ ...req(), prompt: randomPrompt(rng, N_CTX) }),
      new RangeError(
        `Prompt of ${N_CTX} tokens plus 1 does not fit the context of ${N_CTX}: shorten the prompt, or ` +
          `restart the server with --ctx ${N_CTX + 1} or more`,
      ),
    );
    await assert.rejects(
      e.generate({ ...req(), sampling: { ...GREEDY, topP: 1.5 } }),
      /top_p 1\.5 is outside/,
    );
    // Seeded sampling through the service: the same request twice gives the same ids.
    const hot = { ...req(), sampling: { ...GREEDY, temperature: 1.2, seed: 77 } };
    assert.deepEqual((await e.generate(hot)).tokens, (await e.generate(hot)).tokens);
    await assert.rejects(e.generate({ ...req(), prompt: [reference.nVocab] }), /not an id in 0\.\./);
    // A throwing onTokens rejects its own request with that error; the next request runs.
    await assert.rejects(
      e.generate({
        ...req(),
        onTokens: () => {
          throw new Error("sink broke");
        },
      }),
      /sink broke/,
    );
    assert.equal((await e.generate(req())).tokens.length, 6);
    // Prompt and context exactly full: one token, reason "context".
    const full = await e.generate({ ...req(), prompt: randomPrompt(rng, N_CTX - 1), maxTokens: 5 });
    assert.equal(full.tokens.length, 2);
    assert.equal(full.reason, "context");
  } finally {
    await e.close();
  }
});

Deno.test("abort stops a request at a batch boundary and frees the slot; a queued request aborts at once", async () => {
  const rng = new Rng();
  const e = engine(1, 1);
  try {
    const prompt = randomPrompt(rng, 6);
    const ac = new AbortController();
    let calls = 0;
    // An unreachable stop id and a signal: Stage.generate snapshots every batch, which a cancel must not leak.
    const running = e.generate({
      prompt,
      maxTokens: 80,
      sampling: GREEDY,
      stopIds: [reference.nVocab - 1],
      signal: ac.signal,
      onTokens: () => {
        if (++calls === 1) ac.abort();
      },
    });
    const qc = new AbortController();
    const queued = e.generate({ prompt, maxTokens: 4, sampling: GREEDY, stopIds: [], signal: qc.signal });
    qc.abort();
    const q = await queued;
    assert.equal(q.reason, "cancelled");
    assert.deepEqual(q.tokens, []);
    const r = await running;
    assert.equal(r.reason, "cancelled");
    assert.equal(calls, 1, "no ids are streamed after the abort");
    const made = e.status().counters.generatedTokens;
    assert.ok(made < 80, `the worker stopped early: ${made} ids made of 80`);
    assert.equal(r.tokens.length, 1);
    assert.equal(e.internals().snapshotBytes, 0, "a cancelled generate leaves no snapshot behind");
    // The slot is free and clean: the next request runs and gives its solo output.
    const next = randomPrompt(rng, 7);
    const after = await e.generate({ prompt: next, maxTokens: 10, sampling: GREEDY, stopIds: [] });
    assert.deepEqual(after.tokens, await reference.solo(next, 10), `seed ${rng.seed}`);
    // An already aborted signal never reaches the worker.
    const pre = await e.generate({
      prompt: next,
      maxTokens: 3,
      sampling: GREEDY,
      stopIds: [],
      signal: ac.signal,
    });
    assert.equal(pre.reason, "cancelled");
    assert.equal(e.status().busySlots, 0);
  } finally {
    await e.close();
  }
});

Deno.test("prefix reuse: a prompt extending a slot's history prefills only the new part, same tokens as cold", async () => {
  const rng = new Rng();
  const e = engine(2, 2);
  try {
    const p1 = randomPrompt(rng, rng.int(3, 12));
    const t1 = (await e.generate({ prompt: p1, maxTokens: 8, sampling: GREEDY, stopIds: [] })).tokens;
    // An unrelated request lands on the other (least recently used) slot and keeps turn 1's history.
    const other = randomPrompt(rng, 5);
    const o = await e.generate({ prompt: other, maxTokens: 3, sampling: GREEDY, stopIds: [] });
    assert.equal(o.cachedTokens, 0);
    // Turn 2: the history (prompt + generated ids but the last, which was never fed) plus new tokens.
    const p2 = [...p1, ...t1, ...randomPrompt(rng, 4)];
    const before = e.internals().prefilledTokens;
    const cold = await reference.solo(p2, 12);
    const r2 = await e.generate({ prompt: p2, maxTokens: 12, sampling: GREEDY, stopIds: [] });
    const what = `p2 ${p2} (seed ${rng.seed})`;
    assert.deepEqual(r2.tokens, cold, what);
    assert.equal(r2.cachedTokens, p1.length + t1.length - 1, what);
    assert.equal(e.internals().prefilledTokens - before, p2.length - r2.cachedTokens);
    // Turn 3 extends turn 2 and stops at an id of its cold run: the stepwise path stops alike.
    const p3 = [...p2, ...r2.tokens, ...randomPrompt(rng, 2)];
    const cold3 = await reference.solo(p3, 10);
    const stop = cold3[4]!;
    const r3 = await e.generate({ prompt: p3, maxTokens: 10, sampling: GREEDY, stopIds: [stop] });
    assert.deepEqual(r3.tokens, cold3.slice(0, cold3.indexOf(stop) + 1), what);
    assert.equal(r3.reason, "stop");
    assert.equal(r3.cachedTokens, p2.length + r2.tokens.length - 1);
    // A prompt that diverges inside the history is a miss.
    const p4 = [...p3];
    p4[0] = (p4[0]! + 1) % reference.nVocab;
    assert.equal(
      (await e.generate({ prompt: p4, maxTokens: 2, sampling: GREEDY, stopIds: [] })).cachedTokens,
      0,
    );
    const c = e.status().counters;
    assert.equal(c.prefixHits, 2);
    assert.equal(c.cachedTokens, r2.cachedTokens + r3.cachedTokens);
  } finally {
    await e.close();
  }
});

Deno.test("a prompt-boundary snapshot serves a regenerate and a turn whose previous reply was re-rendered", async () => {
  const rng = new Rng();
  const e = engine(2, 0);
  try {
    const p1 = randomPrompt(rng, 20);
    const r1 = await e.generate({ prompt: p1, maxTokens: 6, sampling: GREEDY, stopIds: [] });
    assert.equal(r1.cachedTokens, 0);
    // The live history (p1 and 5 ids) is no prefix of p1 itself: the snapshot 8 tokens before its end is.
    const again = await e.generate({ prompt: p1, maxTokens: 6, sampling: GREEDY, stopIds: [] });
    assert.deepEqual(again.tokens, r1.tokens, `seed ${rng.seed}`);
    assert.equal(again.cachedTokens, p1.length - 8);
    // Turn 2 renders the reply differently (it diverges right after p1): the snapshot still serves.
    const p2 = [...p1, (r1.tokens[0]! + 1) % reference.nVocab, ...randomPrompt(rng, 4)];
    const cold = await reference.solo(p2, 8);
    const r2 = await e.generate({ prompt: p2, maxTokens: 8, sampling: GREEDY, stopIds: [] });
    assert.deepEqual(r2.tokens, cold, `p2 ${p2} (seed ${rng.seed})`);
    assert.equal(r2.cachedTokens, p1.length - 8);
    assert.equal(e.status().counters.prefixHits, 2);
    assert.ok(e.internals().snapshotBytes > 0);
  } finally {
    await e.close();
  }
});

Deno.test("a cancel on the prefix-reuse path keeps the slot's history consistent", async () => {
  const rng = new Rng();
  const e = engine(1, 0);
  try {
    const p1 = randomPrompt(rng, 6);
    const t1 = (await e.generate({ prompt: p1, maxTokens: 4, sampling: GREEDY, stopIds: [] })).tokens;
    const p2 = [...p1, ...t1, ...randomPrompt(rng, 3)];
    const ac = new AbortController();
    const r2 = await e.generate({
      prompt: p2,
      maxTokens: 40,
      sampling: GREEDY,
      stopIds: [],
      signal: ac.signal,
      onTokens: () => ac.abort(),
    });
    assert.equal(r2.reason, "cancelled");
    assert.ok(r2.cachedTokens > 0);
    // Whatever the slot kept, a later turn on it gives the cold output.
    const p3 = [...p2, ...r2.tokens, ...randomPrompt(rng, 2)];
    const r3 = await e.generate({ prompt: p3, maxTokens: 6, sampling: GREEDY, stopIds: [] });
    assert.deepEqual(r3.tokens, await reference.solo(p3, 6), `seed ${rng.seed}`);
  } finally {
    await e.close();
  }
});

Deno.test("close() finishes admitted and queued requests; close({cancel}) cancels them; then nothing is admitted", async () => {
  const rng = new Rng();
  const req = () => ({ prompt: randomPrompt(rng, 4), maxTokens: 6, sampling: GREEDY, stopIds: [] });
  const e = engine(1, 2);
  const a = e.generate(req());
  const b = e.generate(req());
  // Two closes at once both resolve once the requests are done.
  await Promise.all([e.close(), e.close()]);
  const results: GenerateResult[] = [await a, await b];
  assert.deepEqual(results.map((r) => r.reason), ["length", "length"]);
  await assert.rejects(e.generate(req()), QueueFullError);

  const f = engine(1, 2);
  await ready(f);
  const c = f.generate({ ...req(), maxTokens: 60 });
  const d = f.generate(req());
  await f.close({ cancel: true });
  assert.equal((await c).reason, "cancelled");
  assert.equal((await d).reason, "cancelled");
  assert.deepEqual((await d).tokens, []);
});

Deno.test("a model that fails to load: status failed, requests rejected with the cause, close() resolves", async () => {
  const missing = `${await Deno.makeTempDir()}/missing.gguf`;
  const e = startEngine({ model: missing, nCtx: 32, nSlots: 1, queueSize: 1, onLog: () => {} });
  const early = e.generate({ prompt: [1], maxTokens: 1, sampling: GREEDY, stopIds: [] });
  await assert.rejects(early, /The model failed to load: .*missing\.gguf/);
  assert.equal(e.status().state, "failed");
  assert.match(
    e.status().error ?? "",
    /^The model failed to load: GGUF file \S*missing\.gguf does not exist/,
  );
  // Once failed, a request names the cause once (not "The model failed to load: The model failed to load").
  await assert.rejects(
    e.generate({ prompt: [1], maxTokens: 1, sampling: GREEDY, stopIds: [] }),
    /^Error: The model failed to load: GGUF file \S*missing\.gguf does not exist/,
  );
  await assert.rejects(e.modelPath(), /The model failed to load/);
  await e.close();
});
