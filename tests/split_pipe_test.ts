/**
 * The split's pipelined multi-slot driver (engine/exec/_split_pipe.ts) in one process over real loopback
 * links: four sequences generated together on a 2-stage and a 3-stage chain (both tiny architectures), in
 * pipeline groups of batched frames (RUN_BATCH) and without groups (one slot at a time), each equal to its
 * solo unsplit `generate()`: greedy, seeded sampling and penalties, a stop id, a prompt rest and a resumed
 * sequence; then a call paused by the scheduler's hook and resumed gives the same ids.
 * @module
 */
import assert from "node:assert/strict";
import { type BatchItem, openGguf, samplingParams, SplitDecoder, Stage } from "../engine/mod.ts";
import { listenWorker, serveWorker, type WorkerServer } from "../wire/mod.ts";
import { ChainLink } from "../wire/chain.ts";
import { stageBackend } from "../wire/stage_backend.ts";
import { testGpu } from "./util/gpu.ts";
import { fixturePath } from "./util/fixtures.ts";
import { Rng } from "./util/rng.ts";

const BUILD = { version: "0.0.0-test", commit: "test" };
const CTX = 64;
const SLOTS = 4;
const NNEW = 7;

for (const name of ["tiny-qwen35moe.q8_0.gguf", "tiny-qwen3next.q8_0.gguf"]) {
  Deno.test(`split ${name}: 4 sequences pipelined (2 and 3 stages) ≡ unpipelined ≡ their solo unsplit runs`, async () => {
    const rng = new Rng();
    const gpu = await testGpu();
    using file = await openGguf(fixturePath(name));
    const arch = name.split("-")[1]!.split(".")[0]!;
    const load = (layers?: [number, number]) =>
      Stage.load(gpu, file, { nCtx: CTX, nSlots: SLOTS, maxChunk: 16, ...(layers ? { layers } : {}) });
    const whole = await load();
    const L = whole.hp.nLayer;
    const stages: Stage[] = [whole];
    const servers: WorkerServer[] = [];
    const links: ChainLink[] = [];
    const serve = async (stage: Stage, next?: ChainLink) => {
      stages.push(stage);
      const backend = stageBackend(stage, { build: BUILD, arch, next });
      await next?.ready();
      const listener = listenWorker({ hostname: "127.0.0.1", port: 0 });
      servers.push(serveWorker(listener, backend, { log: () => {} }));
      return (listener.addr as Deno.NetAddr).port;
    };
    const link = (port: number, head?: Stage) => {
      const l = new ChainLink({ hostname: "127.0.0.1", port }, { build: BUILD, log: () => {} });
      links.push(l);
      if (!head) return l; // a middle worker's link: its stageBackend attaches it
      l.attach({
        arch,
        layers: { first: 0, end: head.layers[1], total: L },
        nEmbd: head.hp.nEmbd,
        nSlots: SLOTS,
        nCtx: CTX,
        int8Activations: false,
        int8Experts: false,
        kvF16: false,
        fingerprint: head.fingerprint,
      });
      return l;
    };
    try {
      const p2 = await serve(await load([2, L]));
      const p3last = await serve(await load([3, L]));
      const p3 = await serve(await load([1, 3]), link(p3last));
      const head2 = await load([0, 2]);
      const head3 = await load([0, 1]);
      stages.push(head2, head3);
      const prompts = [0, 1, 2, 3].map(() => Array.from({ length: rng.int(3, 11) }, () => rng.int(0, 1021)));
      const sampling = [
        undefined,
        samplingParams({ temperature: 0.9, topK: 8, topP: 0.95, minP: 0, seed: rng.int(0, 1 << 30) }),
        samplingParams({ temperature: 0, repeatPenalty: 1.3, presencePenalty: 0.2, seed: 1 }),
        undefined,
      ];
      const optsOf = (i: number) => ({
        top: i === 3 ? 3 : 0,
        ...(sampling[i] ? { sampling: sampling[i] } : {}),
      });
      // Solo unsplit references; sequence 3 stops at its 4th id.
      const want: number[][] = [];
      const wantTop: [number, number][][][] = [];
      for (const [i, p] of prompts.entries()) {
        const r = await whole.generate(0, p, { nNew: NNEW, ...optsOf(i) });
        want.push(r.tokens);
        wantTop.push(r.top);
      }
      const stopId = want[3]![3]!;
      want[3] = want[3]!.slice(0, want[3]!.indexOf(stopId) + 1);
      for (const [what, head, port] of [["2 stages", head2, p2], ["3 stages", head3, p3]] as const) {
        // groups 1: every lane in one group, the three lanes with a first frame run alone side by side.
        for (const groups of [2, 1, 0]) {
          const next = link(port, head);
          const dec = new SplitDecoder(head, next, { groups });
          assert.equal(dec.canBatch, groups > 0);
          const where = `${arch}, ${what}, groups ${groups} (seed ${rng.seed})`;
          // Sequences 0 and 1 prefill their prompts but the last id first (a prompt rest of one id); sequence 2
          // is fed whole in the call; sequence 3 runs 2 ids alone first and is resumed in the call.
          for (const i of [0, 1]) await dec.prefill(i, prompts[i]!.slice(0, -1), 0);
          const [r3] = await dec.generate([{
            slot: 3,
            prompt: prompts[3]!,
            opts: { nNew: 2, ...optsOf(3) },
          }]);
          const seq3 = [...prompts[3]!, ...r3!.tokens];
          const streamed: number[][] = [[], [], [], []];
          const items: BatchItem[] = [0, 1, 2, 3].map((i) => {
            const onTokens = (ids: readonly number[]) => streamed[i]!.push(...ids);
            if (i === 3) {
              return {
                slot: 3,
                prompt: [seq3.at(-1)!],
                opts: {
                  nNew: NNEW - 2,
                  base: seq3.length - 1,
                  resume: true,
                  samplerStep: 2,
                  samplerHistory: seq3,
                  stopIds: [stopId],
                  onTokens,
                  ...optsOf(3),
                },
              };
            }
            const base = i < 2 ? prompts[i]!.length - 1 : 0;
            return {
              slot: i,
              prompt: prompts[i]!.slice(base),
              opts: { nNew: NNEW, base, onTokens, ...optsOf(i) },
            };
          });
          const steps = head.profile.phases["pipe.step"]?.count ?? 0;
          const rs = await dec.generate(items);
          // The pipelined driver's phases land in the head stage's profile: a step and a chain round trip
          // per group step (none with groups 0, which takes turns through the one-slot path).
          const stepped = (head.profile.phases["pipe.step"]?.count ?? 0) - steps;
          assert.equal(stepped > 0, groups > 0, `pipe.step ${stepped}, ${where}`);
          if (groups > 0) {
            for (
              const k of ["pipe.lock", "pipe.head", "pipe.chain", "pipe.take", "pipe.between", "pipe.alone"]
            ) {
              assert.ok((head.profile.phases[k]?.count ?? 0) > 0, `${k}, ${where}`);
            }
          }
          const got = rs.map((r, i) => i === 3 ? [...r3!.tokens, ...r.tokens] : r.tokens);
          assert.deepEqual(got, want, where);
          assert.deepEqual(streamed.slice(0, 3), want.slice(0, 3), `streamed ids, ${where}`);
          assert.equal(rs[3]!.reason, "stop", where);
          assert.deepEqual([...r3!.top, ...rs[3]!.top], wantTop[3]!.slice(0, want[3]!.length), where);
          for (const i of [0, 1, 2]) {
            assert.equal(rs[i]!.reason, "length", where);
            assert.equal(
              head.length(i),
              prompts[i]!.length + NNEW - 1,
              `the head holds all but the last id, ${where}`,
            );
          }
          // Paused by the scheduler's hook after a few steps, then resumed: the same ids.
          if (groups > 0) {
            let asked = 0;
            const first = await dec.generate(
              [0, 1, 2].map((i) => ({ slot: i, prompt: prompts[i]!, opts: { nNew: NNEW, ...optsOf(i) } })),
              { pause: () => ++asked > 4 },
            );
            assert.ok(first.some((r) => r.paused), `a call paused, ${where}`);
            const rest = await dec.generate(
              first.map((r, i) => {
                const seq = [...prompts[i]!, ...r.tokens];
                return {
                  slot: i,
                  prompt: [seq.at(-1)!],
                  opts: {
                    nNew: NNEW - r.tokens.length,
                    base: seq.length - 1,
                    resume: true,
                    samplerStep: r.tokens.length,
                    samplerHistory: seq,
                    ...optsOf(i),
                  },
                };
              }).filter((it) => it.opts.nNew > 0),
            );
            let k = 0;
            const again = first.map((r) =>
              r.tokens.length < NNEW ? [...r.tokens, ...rest[k++]!.tokens] : r.tokens
            );
            assert.deepEqual(again, want.slice(0, 3), `paused and resumed, ${where}`);
          }
          await next.close();
        }
      }
    } finally {
      for (const l of links) await l.close();
      for (const s of servers) await s.close();
      for (const s of stages) s.destroy();
    }
  });
}
