/**
 * Split serving in one process over real loopback links: the head's `SplitDecoder` on layers 0:a, workers'
 * `stageBackend`s served by `serveWorker` (a 2-stage and a 3-stage chain, both tiny architectures), against
 * the unsplit engine's `generate()`. Greedy, seeded sampling and penalties give the unsplit ids bit for bit,
 * with drafts off and on (prompt lookup on a repetitive prompt, so drafts are accepted and rejected), across
 * a generation split over two calls (the second continuing the first's RNG stream and history, after a
 * settle of the first's last drafted frame). Prints the draft acceptance counts.
 * @module
 */
import assert from "node:assert/strict";
import { openGguf, samplingParams, SplitDecoder, Stage } from "../engine/mod.ts";
import { lookupDrafts, MAX_DRAFT } from "../engine/exec/split.ts";
import { DraftCache } from "../engine/exec/draft_cache.ts";
import { listenWorker, serveWorker, type WorkerServer } from "../wire/mod.ts";
import { ChainLink } from "../wire/chain.ts";
import { stageBackend } from "../wire/stage_backend.ts";
import { testGpu } from "./util/gpu.ts";
import { fixturePath } from "./util/fixtures.ts";

const BUILD = { version: "0.0.0-test", commit: "test" };
const CTX = 160;

Deno.test("lookupDrafts: the ids after the latest earlier match of the longest suffix", () => {
  assert.deepEqual(lookupDrafts([5, 6, 7, 8, 5, 6], 3), [7, 8, 5]);
  assert.deepEqual(lookupDrafts([1, 2, 9, 1, 2, 3, 1, 2], 2), [3, 1]); // latest match wins
  assert.deepEqual(lookupDrafts([4, 1, 2, 3, 9, 2, 3], 4), [9, 2, 3]); // 3-gram absent, 2-gram found
  assert.deepEqual(lookupDrafts([1, 2, 3], 4), []);
  assert.deepEqual(lookupDrafts([7], 2), []);
  assert.deepEqual(lookupDrafts([1, 1, 1], 0), []);
  assert.deepEqual(lookupDrafts([4, 1, 2, 3, 9, 2, 3], 4, 3), []); // no 3-gram match at minN 3
});

Deno.test("DraftCache: continuations of earlier sequences' 3-grams, bounded, own history first", () => {
  const cache = new DraftCache(8);
  assert.throws(() => new DraftCache(0), /positive integer/);
  cache.add([1, 2, 3, 4, 5, 6, 7]);
  assert.deepEqual(cache.lookup([9, 1, 2, 3], 3), [4, 5, 6]);
  assert.deepEqual(cache.lookup([9, 2, 3, 4], 9), [5, 6, 7]);
  assert.deepEqual(cache.lookup([1, 2, 4], 2), []);
  cache.add([1, 2, 3, 8, 8]); // the latest continuation wins
  assert.deepEqual(cache.lookup([1, 2, 3], 2), [8, 8]);
  assert.ok(cache.size <= 8);
  cache.add(Array.from({ length: 40 }, (_, i) => 100 + i));
  assert.equal(cache.size, 8, "the oldest n-grams went");
  assert.deepEqual(cache.lookup([1, 2, 3], 2), []);
  assert.deepEqual(cache.lookup([135, 136, 137], 5), [138, 139]);
  // The drafter: own 3-gram match, then the cache, then own shorter matches.
  const d = cache.drafter();
  assert.deepEqual(d([5, 6, 7, 1, 5, 6, 7], 2), [1, 5]);
  assert.deepEqual(d([0, 135, 136, 137], 1), [138]);
  assert.deepEqual(d([4, 9, 5, 4], 1), [9]);
  assert.equal(cache.hits > 0 && cache.lookups >= cache.hits, true);
});

/** The repetitive prompt: a phrase of 9 ids three times and its start, so lookup drafts from the start. */
const PHRASE = [17, 301, 5, 88, 640, 12, 999, 45, 230];
const PROMPT = [...PHRASE, ...PHRASE, ...PHRASE, 17, 301, 5];

type Case = { name: string; sampling?: ReturnType<typeof samplingParams> };
const CASES: Case[] = [
  { name: "greedy" },
  {
    name: "seeded t=0.9",
    sampling: samplingParams({ temperature: 0.9, topK: 8, topP: 0.95, minP: 0, seed: 7 }),
  },
  {
    name: "penalties t=0",
    sampling: samplingParams({ temperature: 0, repeatPenalty: 1.3, presencePenalty: 0.2, seed: 1 }),
  },
];

for (const name of ["tiny-qwen35moe.q8_0.gguf", "tiny-qwen3next.q8_0.gguf"]) {
  Deno.test(`split ${name}: 2 and 3 stages ≡ unsplit, greedy and sampled, drafts off and on`, async () => {
    const gpu = await testGpu();
    using file = await openGguf(fixturePath(name));
    const arch = name.split("-")[1]!.split(".")[0]!;
    const load = (layers?: [number, number]) =>
      Stage.load(gpu, file, { nCtx: CTX, nSlots: 2, maxChunk: 64, ...(layers ? { layers } : {}) });
    const whole = await load();
    const L = whole.hp.nLayer;
    const stages: Stage[] = [whole];
    const servers: WorkerServer[] = [];
    const links: ChainLink[] = [];
    const serve = async (stage: Stage, next?: ChainLink) => {
      stages.push(stage);
      const backend = stageBackend(stage, { build: BUILD, arch, next });
      // A middle worker connects first: its hello then lists the stages behind it.
      await next?.ready();
      const listener = listenWorker({ hostname: "127.0.0.1", port: 0 });
      servers.push(serveWorker(listener, backend, { log: () => {} }));
      return (listener.addr as Deno.NetAddr).port;
    };
    const link = (port: number, draft: number) => {
      const l = new ChainLink({ hostname: "127.0.0.1", port }, { build: BUILD, draft, log: () => {} });
      links.push(l);
      return l;
    };
    /** A link from `head` (layers 0:a) to the chain at `port`, attached as the head's stage. */
    const headLink = (head: Stage, port: number, draft: number) => {
      const next = link(port, draft);
      next.attach({
        arch,
        layers: { first: 0, end: head.layers[1], total: L },
        nEmbd: head.hp.nEmbd,
        nSlots: 2,
        nCtx: CTX,
        int8Activations: false,
        int8Experts: false,
        kvF16: false,
        fingerprint: head.fingerprint,
      });
      return next;
    };
    try {
      // 2 stages: 0:2 | 2:L. 3 stages: 0:1 | 1:3 → 3:L.
      const p2 = await serve(await load([2, L]));
      const p3last = await serve(await load([3, L]));
      const mid = link(p3last, 0);
      const p3 = await serve(await load([1, 3]), mid);
      const head2 = await load([0, 2]);
      const head3 = await load([0, 1]);
      stages.push(head2, head3);
      const chains: { what: string; head: Stage; port: number }[] = [
        { what: "2 stages", head: head2, port: p2 },
        { what: "3 stages", head: head3, port: p3 },
      ];
      for (const c of CASES) {
        const want =
          (await whole.generate(0, PROMPT, { nNew: 26, ...(c.sampling ? { sampling: c.sampling } : {}) }))
            .tokens;
        // An oracle drafter: the unsplit run's next ids with every third one wrong, so drafts are surely
        // accepted and rejected (random tiny models never repeat themselves, so lookup rarely hits).
        const oracle = (seq: readonly number[], k: number) => {
          const at = seq.length - PROMPT.length;
          return want.slice(at, at + k).map((id, j) => (at + j) % 3 === 2 ? (id + 1) % 1024 : id);
        };
        for (const { what, head, port } of chains) {
          const variants = c.name === "greedy"
            ? [[0], [4], [5, oracle]] as const
            : [[0], [5, oracle]] as const;
          for (const [draft, drafter] of variants) {
            const next = headLink(head, port, draft);
            const dec = new SplitDecoder(head, next, { draft, ...(drafter ? { drafter } : {}) });
            const opts = c.sampling ? { sampling: c.sampling } : {};
            // Two calls: 11 ids, then the rest continuing the same stream (as the scheduler's turns do).
            const [a] = await dec.generate([{ slot: 1, prompt: PROMPT, opts: { nNew: 11, ...opts } }]);
            const seq = [...PROMPT, ...a!.tokens];
            const [b] = await dec.generate([{
              slot: 1,
              prompt: [seq.at(-1)!],
              opts: {
                nNew: 26 - 11,
                base: seq.length - 1,
                samplerStep: 11,
                samplerHistory: seq,
                ...opts,
              },
            }]);
            const got = [...a!.tokens, ...b!.tokens];
            const s = dec.draftStats;
            console.log(
              `${arch} ${c.name} ${what} draft ${draft} ${
                drafter ? "oracle" : "lookup"
              }: ${s.frames} drafted ` +
                `frames, ${s.accepted}/${s.proposed} drafts accepted`,
            );
            assert.deepEqual(got, want, `${arch} ${c.name}, ${what}, draft ${draft}`);
            assert.equal(head.length(1), PROMPT.length + 25, "the head holds every id but the last");
            if (drafter) {
              assert.ok(
                s.frames > 0 && s.accepted > 0,
                `drafts were sent and accepted (${JSON.stringify(s)})`,
              );
              assert.ok(s.accepted < s.proposed, `some drafts were rejected (${JSON.stringify(s)})`);
            }
            await next.close();
          }
          if (c.name === "greedy" && what === "2 stages") {
            // The cross-request cache: the same request twice on two slots. The first finds no match (random
            // models do not repeat themselves); the second drafts the first's output and keeps it.
            const next = headLink(head, port, MAX_DRAFT);
            const cache = new DraftCache(1000);
            const dec = new SplitDecoder(head, next, { draft: MAX_DRAFT, draftCache: cache });
            const plain = PROMPT.slice(9);
            const solo = (await whole.generate(0, plain, { nNew: 20 })).tokens;
            const [first] = await dec.generate([{ slot: 0, prompt: plain, opts: { nNew: 20 } }]);
            const proposedFirst = dec.draftStats.proposed;
            const [again] = await dec.generate([{ slot: 1, prompt: plain, opts: { nNew: 20 } }]);
            const s = dec.draftStats;
            console.log(
              `${arch} draft cache: first ${proposedFirst} drafts; both ${s.accepted}/${s.proposed}`,
            );
            assert.deepEqual(first!.tokens, solo, `${arch} draft cache, first request`);
            assert.deepEqual(again!.tokens, solo, `${arch} draft cache, repeated request`);
            assert.ok(s.accepted >= 14, `the repeat's drafts came from the cache (${JSON.stringify(s)})`);
            await next.close();
          }
        }
      }
    } finally {
      for (const l of links) await l.close();
      for (const s of servers) await s.close();
      for (const s of stages) s.destroy();
    }
  });
}
