/**
 * The scheduler on a real stage (test adapter), seen through a decoder that logs every GPU call: continuous
 * batching (every generating request in every decode call), a new request joining the running set, and a long
 * prompt's pieces alternating with the others' decode turns.
 * @module
 */
import assert from "node:assert/strict";
import { openGguf } from "../gguf.ts";
import { Stage } from "../exec/stage.ts";
import type { BatchItem, SlotDecoder } from "../exec/slot_decoder.ts";
import { samplingParams } from "../sampling.ts";
import { type RunnerJob, SlotRunner, type SlotRunnerOptions } from "./_runner.ts";
import type { JobResult } from "./_protocol.ts";
import { testGpu } from "../../tests/util/gpu.ts";
import { fixturePath } from "../../tests/util/fixtures.ts";
import { Rng } from "../../tests/util/rng.ts";

const GREEDY = samplingParams({ temperature: 0 });

/**
 * `d` with every prefill and generate call logged into `log` (`P<slot>`, `G<slots>`, and `@<point>` for each
 * snapshot point asked of it); `split`: like a split chain, it cannot batch and ignores `pause`. Only with
 * `snapIn` does it take snapshots inside a prefill (SlotDecoder.snapInPrefill): the runner otherwise ends a
 * piece at the point and snapshots after it.
 */
function logged(d: SlotDecoder, log: string[], split = false, snapIn = false): SlotDecoder {
  const at = (p: number | undefined) => p === undefined ? "" : `@${p}`;
  return {
    nCtx: d.nCtx,
    nSlots: d.nSlots,
    canBatch: d.canBatch && !split,
    snapInPrefill: snapIn && d.snapInPrefill,
    get snapshotBytes() {
      return d.snapshotBytes;
    },
    length: (slot) => d.length(slot),
    prefill: (slot, tokens, base, snapAt) => {
      log.push(`P${slot}${at(snapAt)}`);
      return d.prefill(slot, tokens, base, snapAt);
    },
    parts: d.parts,
    prefillPart: (slot, tokens, base, layers) => {
      log.push(`Q${slot}:${layers.join("-")}`);
      return d.prefillPart!(slot, tokens, base, layers);
    },
    snapshot: (slot) => d.snapshot(slot),
    restore: (id, slot) => d.restore(id, slot),
    drop: (id) => d.drop(id),
    generate: (items: readonly BatchItem[], opts) => {
      log.push(`G${items.map((it) => it.slot).join("")}${items.map((it) => at(it.opts.snapAt)).join("")}`);
      return d.generate(items, split ? { batch: opts?.batch } : opts);
    },
  };
}

/** A request of `maxTokens` ids (greedy unless `sampling` says otherwise, no stop ids, never aborted). */
function runnerJob(
  prompt: number[],
  maxTokens: number,
  onTokens: RunnerJob["onTokens"] = () => {},
  sampling: RunnerJob["sampling"] = GREEDY,
): RunnerJob {
  return { prompt, maxTokens, stopIds: [], sampling, signal: new AbortController().signal, onTokens };
}

/** A greedy job of `prompt` whose id batches are logged into `log` as `<name>:<count>`, then `more()`. */
function loggedJob(
  log: string[],
  prompt: number[],
  maxTokens: number,
  name: string,
  more?: () => void,
): RunnerJob {
  return runnerJob(prompt, maxTokens, (ids) => {
    log.push(`${name}:${ids.length}`);
    more?.();
  });
}

/** lateBesideThree's runner: readback batches of 4, 2 between pieces, no prompt-boundary snapshots. */
const LATE_OPTS = { batch: 4, pieceSteps: 2, turnTokens: 64, snapshotBack: 0, batchMin: 2 } as const;

/**
 * Three short prompts stream on `stage` through a runner with `opts` (its GPU calls logged), and a 60-token
 * prompt arrives once each has streamed a batch of 4 ids; every request's ids must equal its solo run.
 * Returns the log, the results and a line naming the seed and the log, for the caller's checks of the order.
 */
async function lateBesideThree(stage: Stage, rng: Rng, opts: SlotRunnerOptions) {
  const prompts = [0, 1, 2].map(() => Array.from({ length: rng.int(2, 6) }, () => rng.int(0, 1021)));
  const long = Array.from({ length: 60 }, () => rng.int(0, 1021));
  const want: number[][] = [];
  for (const p of prompts) want.push((await stage.generate(0, p, { nNew: 64 })).tokens);
  const wantLong = (await stage.generate(0, long, { nNew: 5 })).tokens;
  const log: string[] = [];
  const runner = new SlotRunner(logged(stage.decoder, log), opts);
  let late: Promise<JobResult> | undefined;
  const streams = prompts.map((p, i) =>
    runner.submit(loggedJob(log, p, 64, `s${i}`, () => {
      // The long prompt arrives once all three have streamed a decode batch.
      if (!late && [0, 1, 2].every((k) => log.some((x) => x.startsWith(`s${k}:4`)))) {
        log.push("arrive");
        late = runner.submit(loggedJob(log, long, 5, "long"));
      }
    }))
  );
  const got = await Promise.all(streams);
  const lateGot = await late!;
  for (const [i, r] of got.entries()) assert.deepEqual(r.tokens, want[i], `stream ${i} (seed ${rng.seed})`);
  assert.deepEqual(lateGot.tokens, wantLong, `the long prompt (seed ${rng.seed})`);
  return { log, got, lateGot, what: `(seed ${rng.seed}) ${log.join(" ")}` };
}

/** Between any two prefill calls (`piece`) in `log[from..to)`, each of the three streams got a decode batch. */
function assertTurnsBetween(
  log: readonly string[],
  from: number,
  to: number,
  piece: (x: string) => boolean,
  what: string,
): void {
  let seen: Set<string> | undefined; // undefined before the first piece
  for (let i = from; i < to; i++) {
    const x = log[i]!;
    if (piece(x)) {
      if (seen) assert.deepEqual([...seen].sort(), ["s0", "s1", "s2"], `at ${i}: ${what}`);
      seen = new Set();
    } else if (/^s\d:/.test(x)) seen?.add(x.slice(0, 2));
  }
}

Deno.test("runner: a long prompt arriving while 3 stream alternates its pieces with their decode turns; all equal their solo runs", async () => {
  const rng = new Rng();
  const gpu = await testGpu();
  using file = await openGguf(fixturePath("tiny-qwen35moe.q8_0.gguf"));
  const stage = await Stage.load(gpu, file, { nCtx: 128, nSlots: 4, maxChunk: 8 });
  try {
    const { log, got, lateGot, what } = await lateBesideThree(stage, rng, { ...LATE_OPTS, prefillTurn: 8 });
    // Batch size seen: the three shared their steps (with each other, then with the long prompt).
    for (const r of [...got, lateGot]) {
      assert.ok(r.meanBatch > 1 && r.meanBatch <= 4, `meanBatch ${r.meanBatch}`);
    }
    // The three arrive together (their prompts exceed one round's 8 tokens together: the last joins a turn
    // later), and one call holds all three before the long prompt arrives.
    assert.ok(log.slice(0, log.indexOf("arrive")).some((x) => /^G\d{3}$/.test(x)), what);
    // The long prompt: 60 tokens = 7 pieces of 8 and the last 4 with its first id, which it gets in a call
    // beside the three (it joins the running set).
    const from = log.indexOf("arrive");
    const first = log.indexOf("long:1");
    const pieces = log.slice(from, first).filter((x) => /^P/.test(x)).length;
    assert.equal(pieces, 7, what);
    const join = log.lastIndexOf(log.slice(from, first).filter((x) => x.startsWith("G")).at(-1)!, first);
    assert.match(log[join]!, /^G\d{4}$/, what);
    // That call prefills the prompt's rest before its steps: a decode turn separates it from the last piece
    // (the streams never wait for a piece and the rest back to back).
    assert.ok(!log[join - 1]!.startsWith("P"), what);
    // The turns between the pieces run pieceSteps (2) steps per readback, not batch (4): the streams' batches
    // from the first piece to the long prompt's first id hold 2 ids each.
    const piece0 = log.findIndex((x, i) => i > from && x.startsWith("P"));
    const during = log.slice(piece0, first).filter((x) => /^s\d:/.test(x));
    assert.ok(during.length >= 3 * 6 && during.every((x) => x.endsWith(":2")), what);
    // Between two pieces each stream gets one decode batch (one piece, one turn): no stream waits longer.
    assertTurnsBetween(log, from, first, (x) => x.startsWith("P"), what);
    assert.equal(stage.decoder.snapshotBytes, 0, "no snapshot leaked");
  } finally {
    stage.destroy();
  }
});

Deno.test("runner: with pieceParts a long prompt beside 3 streams goes in chunk-wide pieces, a few layers per round; all equal their solo runs", async () => {
  const rng = new Rng();
  const gpu = await testGpu();
  using file = await openGguf(fixturePath("tiny-qwen35moe.q8_0.gguf"));
  // Chunks of 8 (the column path: every chunking gives the bits of one-token steps), rounds of 4 tokens.
  const stage = await Stage.load(gpu, file, { nCtx: 128, nSlots: 4, maxChunk: 8 });
  const [l0, l1] = stage.layers;
  try {
    const { log, what } = await lateBesideThree(stage, rng, {
      ...LATE_OPTS,
      prefillTurn: 4,
      pieceParts: true,
    });
    const from = log.indexOf("arrive");
    const first = log.indexOf("long:1");
    // 60 tokens: 7 pieces of a chunk (8) in two parts each (8 tokens at 4 per round), the layers split evenly,
    // in order; then the last 4 (one round's budget) join the streams' call with the first id.
    const mid = l0 + Math.round((l1 - l0) / 2);
    const parts = log.slice(from, first).filter((x) => x.startsWith("Q"));
    assert.deepEqual(parts, Array(7).fill([`Q3:${l0}-${mid}`, `Q3:${mid}-${l1}`]).flat(), what);
    assert.equal(log.slice(from, first).filter((x) => x.startsWith("P")).length, 0, what);
    assert.match(
      log[log.lastIndexOf(log.slice(from, first).filter((x) => x.startsWith("G")).at(-1)!, first)]!,
      /^G\d{4}$/,
      what,
    );
    // One part per round: a decode turn of the three between any two parts.
    assertTurnsBetween(log, from, first, (x) => x.startsWith("Q") || x.startsWith("P"), what);
    assert.equal(stage.decoder.snapshotBytes, 0, "no snapshot leaked");
  } finally {
    stage.destroy();
  }
});

Deno.test("runner: a piece in parts cancelled between its parts ends cancelled; the streams and a later run of its prompt are unharmed", async () => {
  const rng = new Rng();
  const gpu = await testGpu();
  using file = await openGguf(fixturePath("tiny-qwen35moe.q8_0.gguf"));
  const stage = await Stage.load(gpu, file, { nCtx: 128, nSlots: 4, maxChunk: 8 });
  try {
    const prompts = [0, 1].map(() => Array.from({ length: rng.int(2, 6) }, () => rng.int(0, 1021)));
    const long = Array.from({ length: 40 }, () => rng.int(0, 1021));
    const want: number[][] = [];
    for (const p of prompts) want.push((await stage.generate(0, p, { nNew: 48 })).tokens);
    const wantLong = (await stage.generate(0, long, { nNew: 5 })).tokens;
    const log: string[] = [];
    const decoder = logged(stage.decoder, log);
    const opts = { ...LATE_OPTS, prefillTurn: 4 };
    const runner = new SlotRunner(decoder, { ...opts, pieceParts: true });
    const stop = new AbortController();
    let late: Promise<JobResult> | undefined;
    const streams = prompts.map((p, i) =>
      runner.submit(loggedJob(log, p, 48, `s${i}`, () => {
        if (!late && [0, 1].every((k) => log.some((x) => x.startsWith(`s${k}:4`)))) {
          log.push("arrive");
          late = runner.submit({ ...loggedJob(log, long, 5, "long"), signal: stop.signal });
        }
        // Cancelled right after its third part (the second piece's first).
        if (late && log.filter((x) => x.startsWith("Q")).length === 3) stop.abort();
      }))
    );
    const got = await Promise.all(streams);
    const cancelled = await late!;
    const what = `(seed ${rng.seed}) ${log.join(" ")}`;
    for (const [i, r] of got.entries()) assert.deepEqual(r.tokens, want[i], `stream ${i} ${what}`);
    assert.equal(cancelled.reason, "cancelled", what);
    assert.deepEqual(cancelled.tokens, [], what);
    assert.equal(log.filter((x) => x.startsWith("Q")).length, 3, what);
    // The same prompt again (the slot's half-advanced state must not pass for a prefix): its solo tokens.
    const again = await runner.submit(loggedJob(log, long, 5, "again"));
    assert.deepEqual(again.tokens, wantLong, what);
  } finally {
    stage.destroy();
  }
});

/**
 * The burst tests' runner: pieces up to the snapshot point (8 before each prompt's end) and the rests after it
 * (8 each) fit one round's budget together: at most 4 × 19 = 76 prompt tokens against 128 (with 64, some
 * seeds' prompts left the last rest for the next call).
 */
const BURST_OPTS = { batch: 4, turnTokens: 64, snapshotBack: 8, prefillTurn: 128, batchMin: 2 } as const;

/**
 * Four prompts of 12-19 tokens on tiny-qwen3next (4 slots), submitted by `submit` to a runner (BURST_OPTS)
 * over the logged decoder it is given, each checked against its solo tokens; then the log must start with
 * every piece and one call of all four.
 */
async function burst(
  submit: (inner: SlotDecoder, prompts: number[][]) => Promise<JobResult[]>,
  more?: (stage: Stage) => void,
): Promise<void> {
  const rng = new Rng();
  const gpu = await testGpu();
  using file = await openGguf(fixturePath("tiny-qwen3next.q8_0.gguf"));
  const stage = await Stage.load(gpu, file, { nCtx: 64, nSlots: 4, maxChunk: 16 });
  try {
    const prompts = [0, 1, 2, 3].map(() => Array.from({ length: rng.int(12, 20) }, () => rng.int(0, 1021)));
    const want: number[][] = [];
    for (const p of prompts) want.push((await stage.generate(0, p, { nNew: 10 })).tokens);
    const log: string[] = [];
    for (const [i, r] of (await submit(logged(stage.decoder, log), prompts)).entries()) {
      assert.deepEqual(r.tokens, want[i], `request ${i} (seed ${rng.seed})`);
    }
    assert.deepEqual(
      log.slice(0, 5),
      ["P0", "P1", "P2", "P3", "G0123"],
      `(seed ${rng.seed}) ${log.join(" ")}`,
    );
    more?.(stage);
  } finally {
    stage.destroy();
  }
}

Deno.test("runner: requests arriving together prefill their pieces up to the snapshot point back to back, then start in one call", async () => {
  await burst(
    (inner, prompts) => {
      const runner = new SlotRunner(inner, BURST_OPTS);
      return Promise.all(prompts.map((p) => runner.submit(runnerJob(p, 10))));
    },
    (stage) => assert.ok(stage.decoder.snapshotBytes > 0, "each slot holds its prompt-boundary snapshot"),
  );
});

Deno.test("runner: requests arriving one by one during the first one's piece still start in one call", async () => {
  // The other three arrive while the first request's piece is on the GPU (as HTTP requests of a burst do,
  // each in a task of its own); the first does not start alone.
  await burst(async (inner, prompts) => {
    let later: Promise<JobResult>[] | undefined;
    const runner: SlotRunner = new SlotRunner({
      ...inner,
      prefill: (slot, tokens, base) => {
        later ??= prompts.slice(1).map((p) => runner.submit(runnerJob(p, 10)));
        return inner.prefill(slot, tokens, base);
      },
    }, BURST_OPTS);
    const first = await runner.submit(runnerJob(prompts[0]!, 10));
    return [first, ...await Promise.all(later!)];
  });
});

Deno.test("runner: requests whose messages wait in the worker's queue during the first one's piece still start in one call", async () => {
  // Over HTTP the others' messages reach the engine's worker while it encodes the first request's piece, and
  // a decode call's readback blocks the thread: they are delivered only when the worker gets back to its
  // event loop (a task each, here one MessageChannel message posted during the piece). The runner must look
  // before it forms the call.
  await burst(async (inner, prompts) => {
    let later: Promise<JobResult>[] | undefined;
    const { port1, port2 } = new MessageChannel();
    port1.onmessage = () => {
      later = prompts.slice(1).map((p) => runner.submit(runnerJob(p, 10)));
      port1.close();
    };
    let posted = false;
    const runner: SlotRunner = new SlotRunner({
      ...inner,
      prefill: (slot, tokens, base) => {
        if (!posted) port2.postMessage(null);
        posted = true;
        return inner.prefill(slot, tokens, base);
      },
    }, BURST_OPTS);
    const first = await runner.submit(runnerJob(prompts[0]!, 10));
    return [first, ...await Promise.all(later!)];
  });
});

Deno.test("runner: on a decoder that cannot batch and ignores pause (a split), requests take turns of turnTokens ids", async () => {
  const rng = new Rng();
  const gpu = await testGpu();
  using file = await openGguf(fixturePath("tiny-qwen35moe.q8_0.gguf"));
  const stage = await Stage.load(gpu, file, { nCtx: 64, nSlots: 2, maxChunk: 16 });
  try {
    const prompts = [0, 1].map(() => Array.from({ length: rng.int(2, 8) }, () => rng.int(0, 1021)));
    const want: number[][] = [];
    for (const p of prompts) want.push((await stage.generate(0, p, { nNew: 30 })).tokens);
    const log: string[] = [];
    const runner = new SlotRunner(logged(stage.decoder, log, true), {
      batch: 4,
      turnTokens: 8,
      snapshotBack: 0,
      prefillTurn: 0,
      batchMin: 2,
    });
    const job = (i: number, more?: () => void) => loggedJob(log, prompts[i]!, 30, `s${i}`, more);
    let second: Promise<JobResult> | undefined;
    const first = runner.submit(job(0, () => second ??= runner.submit(job(1))));
    const got = [await first, await second!];
    for (const [i, r] of got.entries()) {
      assert.deepEqual(r.tokens, want[i], `request ${i} (seed ${rng.seed})`);
    }
    // The second request's first id lands while the first (30 ids) is still going.
    const what = `(seed ${rng.seed}) ${log.join(" ")}`;
    assert.ok(
      log.findIndex((x) => x.startsWith("s1:")) < log.findLastIndex((x) => x.startsWith("s0:")),
      what,
    );
    assert.ok(log.every((x) => !/^G\d\d/.test(x)), `one slot per call: ${what}`);
  } finally {
    stage.destroy();
  }
});

/**
 * Counts the GPU readbacks (`mapAsync` calls) of this module's isolate in `count.maps` until the returned
 * function restores the original: each costs at least 10 ms in Deno, whatever the GPU (docs PLATFORM.md).
 */
function countReadbacks(count: { maps: number }): () => void {
  const proto = GPUBuffer.prototype;
  const orig = proto.mapAsync;
  proto.mapAsync = function (this: GPUBuffer, ...a: Parameters<GPUBuffer["mapAsync"]>) {
    count.maps++;
    return orig.apply(this, a);
  };
  return () => proto.mapAsync = orig;
}

Deno.test("runner: a fresh request's first id costs one GPU readback (prompt piece, snapshot, rest and first id)", async () => {
  const rng = new Rng();
  const gpu = await testGpu();
  using file = await openGguf(fixturePath("tiny-qwen35moe.q8_0.gguf"));
  const stage = await Stage.load(gpu, file, { nCtx: 64, nSlots: 4, maxChunk: 16 });
  const count = { maps: 0 };
  const restore = countReadbacks(count);
  try {
    const log: string[] = [];
    const runner = new SlotRunner(logged(stage.decoder, log), {
      batch: 8,
      turnTokens: 64,
      snapshotBack: 8,
      prefillTurn: 0,
      batchMin: 2,
    });
    const sampled = samplingParams({ temperature: 0.8, topK: 20, seed: rng.u32() });
    // 20 prompt tokens with chunks of 16: a piece of 12 up to the snapshot point, then a rest of 8; and 40:
    // a piece of two chunks, a rest of 8 (each new prompt also gets a fresh slot: no prefix reuse).
    for (const [n, sampling] of [[20, GREEDY], [20, sampled], [40, GREEDY], [40, sampled]] as const) {
      const what = `${n} prompt tokens, temperature ${sampling.temperature} (seed ${rng.seed})`;
      const prompt = Array.from({ length: n }, () => rng.int(0, 1021));
      log.length = 0;
      count.maps = 0;
      let atFirst = -1;
      const r = await runner.submit(runnerJob(prompt, 9, () => {
        if (atFirst < 0) atFirst = count.maps;
      }, sampling));
      assert.equal(r.tokens.length, 9, what);
      assert.equal(r.prefilledTokens, n, `${what}: no prefix reused`);
      assert.deepEqual(
        log.filter((x) => !x.startsWith("s")),
        [`P${r.slot}`, `G${r.slot}`],
        `${what}: ${log}`,
      );
      assert.equal(atFirst, 1, `${what}: readbacks before the first id`);
      assert.equal(count.maps, 2, `${what}: readbacks in all (the first id's, then one batch of 8 steps)`);
    }
    // Two requests arriving together: both first ids in one round of readbacks, then one batched decode call.
    count.maps = 0;
    const firsts: number[] = [];
    await Promise.all(
      [GREEDY, sampled].map((sampling) =>
        runner.submit(runnerJob(Array.from({ length: 20 }, () => rng.int(0, 1021)), 9, () => {
          if (firsts.length < 2) firsts.push(count.maps);
        }, sampling))
      ),
    );
    assert.deepEqual(
      firsts,
      [2, 2],
      `two first ids after their two maps in flight together (seed ${rng.seed})`,
    );
    assert.equal(count.maps, 3, `then one batch of 8 steps for both (seed ${rng.seed})`);
  } finally {
    restore();
    stage.destroy();
  }
});

Deno.test("runner: a lone long prompt goes in rounds of prefillAlone tokens, pieces of prefillTurn once another streams", async () => {
  const rng = new Rng();
  const gpu = await testGpu();
  using file = await openGguf(fixturePath("tiny-qwen35moe.q8_0.gguf"));
  const stage = await Stage.load(gpu, file, { nCtx: 128, nSlots: 2, maxChunk: 8 });
  try {
    const long = Array.from({ length: 60 }, () => rng.int(0, 1021));
    const short = Array.from({ length: 3 }, () => rng.int(0, 1021));
    const want = (await stage.generate(0, long, { nNew: 4 })).tokens;
    const job = (prompt: number[], maxTokens: number, onTokens?: () => void) =>
      runnerJob(prompt, maxTokens, () => onTokens?.());
    const opts = { batch: 4, turnTokens: 64, snapshotBack: 0, prefillTurn: 8, batchMin: 2 };
    for (const [alone, pieces] of [[undefined, 7], [32, 2], [0, 1]] as const) {
      const log: string[] = [];
      const runner = new SlotRunner(logged(stage.decoder, log), { ...opts, prefillAlone: alone });
      const r = await runner.submit(job(long, 4));
      assert.deepEqual(r.tokens, want, `prefillAlone ${alone} (seed ${rng.seed})`);
      // 59 tokens before the last (which goes with the first id in the generate call): rounds of at most
      // prefillAlone (undefined: prefillTurn 8) tokens.
      const first = log.indexOf(`G${r.slot}`);
      assert.equal(log.slice(0, first).filter((x) => x === `P${r.slot}`).length, pieces, log.join(" "));
    }
    // While another request streams, the long prompt goes in pieces of prefillTurn even with prefillAlone 0.
    const log: string[] = [];
    const runner = new SlotRunner(logged(stage.decoder, log), { ...opts, prefillAlone: 0 });
    let late: Promise<JobResult> | undefined;
    const streaming = runner.submit(job(short, 40, () => {
      if (!late) {
        log.push("arrive");
        late = runner.submit(job(long, 4));
      }
    }));
    await streaming;
    const lateGot = await late!;
    assert.deepEqual(lateGot.tokens, want, `the long prompt beside a stream (seed ${rng.seed})`);
    const after = log.slice(log.indexOf("arrive"));
    const pieces = after.filter((x) => x === `P${lateGot.slot}`).length;
    assert.ok(pieces >= 2, `pieces of 8 between the stream's turns: ${after.join(" ")}`);
  } finally {
    stage.destroy();
  }
});

Deno.test("runner: with pieceGap a long prompt beside a stream goes in pieces the pacer sizes; the same tokens", async () => {
  const rng = new Rng();
  const gpu = await testGpu();
  using file = await openGguf(fixturePath("tiny-qwen35moe.q8_0.gguf"));
  const stage = await Stage.load(gpu, file, { nCtx: 128, nSlots: 2, maxChunk: 8 });
  try {
    const long = Array.from({ length: 60 }, () => rng.int(0, 1021));
    const short = Array.from({ length: 3 }, () => rng.int(0, 1021));
    const want = (await stage.generate(0, long, { nNew: 4 })).tokens;
    // A clock the GPU calls advance: a prompt token costs 1 ms, a decode step 10 ms (as each batch lands).
    let clock = 0;
    const d = logged(stage.decoder, []);
    const timed: SlotDecoder = {
      ...d,
      get snapshotBytes() {
        return d.snapshotBytes;
      },
      prefill: async (slot, tokens, base) => {
        await d.prefill(slot, tokens, base);
        clock += tokens.length;
      },
      generate: (items, opts) => {
        const landed = new Set<number>();
        return d.generate(
          items.map((it, i) => ({
            ...it,
            opts: {
              ...it.opts,
              onTokens: (ids) => {
                // A fresh prompt's rest is prefilled before its first id; the batch's steps then land.
                if (!landed.has(i) && !it.opts.resume) clock += it.prompt.length;
                if (!landed.has(i) || i === 0) clock += 10 * ids.length;
                landed.add(i);
                it.opts.onTokens?.(ids);
              },
            },
          })),
          opts,
        );
      },
    };
    for (const [gap, pieces] of [[0, 7], [2.5, 1]] as const) {
      const log: string[] = [];
      const runner = new SlotRunner(logged(timed, log), {
        batch: 4,
        pieceSteps: 2,
        turnTokens: 64,
        snapshotBack: 0,
        prefillTurn: 8,
        prefillAlone: 64,
        pieceGap: gap,
        batchMin: 2,
        now: () => clock,
      });
      let late: Promise<JobResult> | undefined;
      let batches = 0;
      // The long prompt arrives after the stream's third batch: a steady turn of 4 steps ran by then.
      const streaming = runner.submit(runnerJob(short, 40, () => {
        if (++batches === 3) {
          log.push("arrive");
          late = runner.submit(runnerJob(long, 4));
        }
      }));
      await streaming;
      const got = await late!;
      assert.deepEqual(got.tokens, want, `pieceGap ${gap} (seed ${rng.seed})`);
      // Fixed pieces: 8 tokens per round until 4 are left (7 pieces). Paced: steps of 10 ms make the stream's
      // steady gap 40 ms and a round may take 2.5 × 40 = 100 ms; the first piece (8 tokens, no rate yet) and
      // its 2 steps took 28 ms: 1 token per ms, so the next round may prefill 80 tokens (64 at most), and the
      // 52 left join the stream's decode call in one go.
      const after = log.slice(log.indexOf("arrive"));
      assert.equal(after.filter((x) => x === `P${got.slot}`).length, pieces, after.join(" "));
    }
  } finally {
    stage.destroy();
  }
});

Deno.test("runner: a request joining a stream in flight ends that call at its first readback, pieceSteps steps in", async () => {
  const rng = new Rng();
  const gpu = await testGpu();
  using file = await openGguf(fixturePath("tiny-qwen35moe.q8_0.gguf"));
  const stage = await Stage.load(gpu, file, { nCtx: 128, nSlots: 2, maxChunk: 8 });
  try {
    const a = Array.from({ length: 3 }, () => rng.int(0, 1021));
    const b = Array.from({ length: 5 }, () => rng.int(0, 1021));
    const wantA = (await stage.generate(0, a, { nNew: 40 })).tokens;
    const wantB = (await stage.generate(0, b, { nNew: 12 })).tokens;
    const log: string[] = [];
    const runner = new SlotRunner(logged(stage.decoder, log), {
      batch: 4,
      pieceSteps: 2,
      turnTokens: 64,
      snapshotBack: 0,
      prefillTurn: 8,
      batchMin: 2,
    });
    const job = (prompt: number[], maxTokens: number, name: string, more?: () => void) =>
      loggedJob(log, prompt, maxTokens, name, more);
    let late: Promise<JobResult> | undefined;
    let batches = 0;
    const ra = runner.submit(job(a, 40, "a", () => {
      if (++batches === 3) {
        log.push("arrive");
        late = runner.submit(job(b, 12, "b"));
      }
    }));
    const got = await ra;
    const gotB = await late!;
    assert.deepEqual(got.tokens, wantA, `a (seed ${rng.seed})`);
    assert.deepEqual(gotB.tokens, wantB, `b (seed ${rng.seed})`);
    // b's prompt (5 tokens, one piece's worth) joins a's call: b's first id and 2 steps of both, then the call
    // ends and the next one runs whole batches of 4 (a stream's gap at a join: the rest and 2 steps).
    const after = log.slice(log.indexOf("arrive"));
    const join = after.findIndex((x) => x === `G${gotB.slot}${got.slot}`);
    assert.ok(join > 0, after.join(" "));
    const call = after.slice(join + 1, after.findIndex((x, i) => i > join && x.startsWith("G")));
    assert.deepEqual(call, ["b:1", "b:2", "a:2"], after.join(" "));
    const next = after.slice(join + 1 + call.length);
    assert.ok(next[0]!.startsWith("G") && next.includes("a:4"), after.join(" "));
  } finally {
    stage.destroy();
  }
});

/**
 * Runs `body` on tiny-qwen3next (4 slots, chunks of 16) with four prompts of 12-19 tokens, `solo` (10 greedy
 * ids of a prompt on slot 0) and each prompt's solo ids.
 */
async function onFour(
  body: (
    stage: Stage,
    rng: Rng,
    four: { prompts: number[][]; solo: (p: number[]) => Promise<number[]>; want: number[][] },
  ) => Promise<void>,
): Promise<void> {
  const rng = new Rng();
  const gpu = await testGpu();
  using file = await openGguf(fixturePath("tiny-qwen3next.q8_0.gguf"));
  const stage = await Stage.load(gpu, file, { nCtx: 64, nSlots: 4, maxChunk: 16 });
  try {
    const prompts = [0, 1, 2, 3].map(() => Array.from({ length: rng.int(12, 20) }, () => rng.int(0, 1021)));
    const solo = async (p: number[]) => (await stage.generate(0, p, { nNew: 10 })).tokens;
    const want: number[][] = [];
    for (const p of prompts) want.push(await solo(p));
    await body(stage, rng, { prompts, solo, want });
  } finally {
    stage.destroy();
  }
}

Deno.test("runner: where the decoder snapshots inside a prefill, a prompt's piece takes it and goes on to the last token; the burst starts in one call and a regenerate reuses the snapshot", async () => {
  await onFour(async (stage, rng, { prompts, solo, want }) => {
    const log: string[] = [];
    const runner = new SlotRunner(logged(stage.decoder, log, false, true), BURST_OPTS);
    const got = await Promise.all(prompts.map((p) => runner.submit(runnerJob(p, 10))));
    const what = `(seed ${rng.seed}) ${log.join(" ")}`;
    for (const [i, r] of got.entries()) assert.deepEqual(r.tokens, want[i], `request ${i} ${what}`);
    // Each prompt's piece up to its last token takes the snapshot 8 before its end; then one call of all four.
    assert.deepEqual(log.slice(0, 5), [...prompts.map((p, i) => `P${i}@${p.length - 8}`), "G0123"], what);
    // A regenerate with another cue: everything before the point is reused (the snapshot seeds a slot).
    const again = [...prompts[0]!.slice(0, -8), ...Array.from({ length: 8 }, () => rng.int(0, 1021))];
    const r = await runner.submit(runnerJob(again, 10));
    assert.equal(r.cachedTokens, again.length - 8, what);
    assert.deepEqual(r.tokens, await solo(again), `the regenerate ${what}`);
    // A long prompt alone in pieces of 12: the piece holding the point takes it (P@32, cut inside its chunk),
    // the rest joins the decode call.
    log.length = 0;
    const long = Array.from({ length: 40 }, () => rng.int(0, 1021));
    const wantLong = await solo(long);
    const pieces = new SlotRunner(logged(stage.decoder, log, false, true), {
      ...BURST_OPTS,
      prefillTurn: 12,
    });
    const rl = await pieces.submit(runnerJob(long, 10));
    assert.deepEqual(rl.tokens, wantLong, `the long prompt (seed ${rng.seed})`);
    assert.deepEqual(log.filter((x) => !x.startsWith("s")).slice(0, 4), [
      `P${rl.slot}`,
      `P${rl.slot}`,
      `P${rl.slot}@32`,
      `G${rl.slot}`,
    ], `(seed ${rng.seed}) ${log.join(" ")}`);
    const again2 = [...long.slice(0, 32), ...Array.from({ length: 8 }, () => rng.int(0, 1021))];
    assert.equal(
      (await pieces.submit(runnerJob(again2, 10))).cachedTokens,
      32,
      "the piece's snapshot is reused",
    );
  });
});

Deno.test("runner: a lone request's whole prompt goes to one call that snapshots inside it and makes its first id; a burst arriving meanwhile is gathered before it decodes on", async () => {
  await onFour(async (stage, rng, { prompts, solo, want }) => {
    const log: string[] = [];
    const inner = logged(stage.decoder, log, false, true);
    // Alone: one call of the whole prompt, its snapshot point inside, that makes the first id; then the rest.
    const runner = new SlotRunner(inner, BURST_OPTS);
    const first = await runner.submit(runnerJob(prompts[0]!, 10));
    let what = `(seed ${rng.seed}) ${log.join(" ")}`;
    assert.deepEqual(first.tokens, want[0], what);
    assert.deepEqual(log, [`G${first.slot}@${prompts[0]!.length - 8}`, `G${first.slot}`], what);
    // Its snapshot serves a regenerate with another cue.
    const again = [...prompts[0]!.slice(0, -8), ...Array.from({ length: 8 }, () => rng.int(0, 1021))];
    const r = await runner.submit(runnerJob(again, 10));
    assert.equal(r.cachedTokens, again.length - 8, what);
    assert.deepEqual(r.tokens, await solo(again), `the regenerate ${what}`);
    // Three more arrive during a lone request's first call: their pieces, then one call of all four.
    log.length = 0;
    let later: Promise<JobResult>[] | undefined;
    // (Pieces of 8 while others stream, 128 while none does: the lone start's first id must not count.)
    const burst: SlotRunner = new SlotRunner({
      ...inner,
      generate: (items, opts) => {
        later ??= prompts.slice(1).map((p) => burst.submit(runnerJob(p, 10)));
        return inner.generate(items, opts);
      },
    }, { ...BURST_OPTS, prefillTurn: 8, prefillAlone: 128 });
    const got = [await burst.submit(runnerJob(prompts[0]!, 10)), ...await Promise.all(later!)];
    what = `(seed ${rng.seed}) ${log.join(" ")}`;
    for (const [i, g] of got.entries()) assert.deepEqual(g.tokens, want[i], `request ${i} ${what}`);
    assert.deepEqual(log.slice(0, 5), [
      `G0@${prompts[0]!.length - 8}`,
      ...prompts.slice(1).map((p, i) => `P${i + 1}@${p.length - 8}`),
      "G1230",
    ], what);
  });
});

Deno.test("runner: the decoder's idle work runs while no request is held, never inside a request's calls, and its failure harms no request", async () => {
  await onFour(async (stage, rng, { prompts, want }) => {
    const log: string[] = [];
    const inner = logged(stage.decoder, log, false, true);
    let calls = 0;
    // Each step takes a few ms; the fourth says nothing is left. Each is told the order the next requests
    // take the slots in (least recently used first).
    const orders: (readonly number[] | undefined)[] = [];
    const warmIdle = async (order?: readonly number[]) => {
      log.push("W");
      orders.push(order);
      await new Promise((r) => setTimeout(r, 5));
      return ++calls < 4;
    };
    const runner = new SlotRunner({ ...inner, warmIdle }, BURST_OPTS);
    // Submitted while the first step (started by the constructor) runs: the request waits for that step only.
    const r = await runner.submit(runnerJob(prompts[0]!, 10));
    assert.deepEqual(r.tokens, want[0], `(seed ${rng.seed}) ${log.join(" ")}`);
    for (let i = 0; i < 100 && calls < 4; i++) await new Promise((r) => setTimeout(r, 5));
    const n = prompts[0]!.length - 8;
    assert.deepEqual(log, ["W", `G0@${n}`, "G0", "W", "W", "W"], `(seed ${rng.seed}) ${log.join(" ")}`);
    const all = Array.from({ length: stage.decoder.nSlots }, (_, s) => s);
    assert.deepEqual(orders[0], all, "before any request: slot 0 first");
    assert.deepEqual(orders.at(-1), [...all.slice(1), 0], "after slot 0's request: slot 0 last");
    // A failing step: the idle work stops, and a request arriving during it runs as usual.
    const failing = new SlotRunner({
      ...inner,
      warmIdle: async () => {
        await new Promise((r) => setTimeout(r, 5));
        throw new Error("an idle step failed");
      },
    }, BURST_OPTS);
    const f = await failing.submit(runnerJob(prompts[1]!, 10));
    assert.deepEqual(f.tokens, want[1], `after a failed idle step (seed ${rng.seed})`);
  });
});
