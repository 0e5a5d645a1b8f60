/**
 * Drafted decoding in the unsplit engine (engine/exec/drafting.ts) against the decode driver alone, both tiny
 * architectures: greedy, seeded sampling and penalties give the same ids, reasons and slot contents with
 * drafts on. The drafter is an oracle (the undrafted run's own ids) with chosen ids wrong, so frames accept
 * all, part and none of their guesses, and the wrapper goes pipelined → frames → pipelined; a stop id inside a
 * frame, the token budget and the context's end all land inside frames, and a caller's pause returns between
 * frames (the rest then resumes with frames first). After each run the slot continues undrafted (a resumed
 * decode-driver call) to the undrafted run's next ids: its state is exactly the undrafted one's.
 * @module
 */
import assert from "node:assert/strict";
import { openGguf, samplingParams, Stage } from "../engine/mod.ts";
import { DraftingDecoder } from "../engine/exec/drafting.ts";
import type { GenerateOptions, GenerateResult } from "../engine/exec/slot_decoder.ts";
import { testGpu } from "./util/gpu.ts";
import { fixturePath } from "./util/fixtures.ts";

const CTX = 80;
const PROMPT = [17, 301, 5, 88, 640, 12, 999, 45, 230, 7, 64, 3];
/** Ids after the prompt that the oracle gets wrong: a frame rejects its tail there. */
const WRONG = new Set([12, 24, 25, 36]);
/** Ids a follow-up makes on the slot after a run (undrafted, resumed): checks the slot's state. */
const FOLLOW = 5;

/** A prompt that leaves room for 25 ids in the context. */
const LONG = Array.from({ length: CTX - 24 }, (_, i) => (i * 37 + 11) % 1000);

/**
 * The scenarios per model and case (each costs a few seconds of lavapipe): every one greedy on qwen35moe, the
 * sampled cases on those where the sampler's state carries over (frames, pause and resume, stop rollback).
 */
const ALL = ["budget", "budget in a frame", "stop", "context", "paused", "rejected", "bonus"];
const SCENARIOS: Record<string, Record<string, string[]>> = {
  "tiny-qwen35moe.q8_0.gguf": {
    "greedy": ALL,
    "seeded t=0.9": ["budget", "paused"],
    "penalties t=0": ["stop"],
  },
  "tiny-qwen3next.q8_0.gguf": { "greedy": ["budget"], "seeded t=0.9": ["paused"], "penalties t=0": ["stop"] },
};

type Sampling = ReturnType<typeof samplingParams>;
const CASES: { name: string; sampling?: Sampling }[] = [
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

/** The decode driver's continuation of `slot` after `r` (a run of `prompt` that did not fill the context). */
async function follow(stage: Stage, slot: number, prompt: number[], r: GenerateResult, s?: Sampling) {
  const seq = [...prompt, ...r.tokens];
  const [f] = await stage.decoder.generate([{
    slot,
    prompt: [seq.at(-1)!],
    opts: {
      nNew: FOLLOW,
      base: seq.length - 1,
      resume: true,
      samplerStep: r.tokens.length,
      samplerHistory: seq,
      ...(s ? { sampling: s } : {}),
    },
  }]);
  return f!.tokens;
}

for (const name of ["tiny-qwen35moe.q8_0.gguf", "tiny-qwen3next.q8_0.gguf"]) {
  Deno.test(`drafting ${name}: frames give the undrafted ids, reasons and slot state`, async () => {
    const gpu = await testGpu();
    using file = await openGguf(fixturePath(name));
    const stage = await Stage.load(gpu, file, { nCtx: CTX, nSlots: 2, maxChunk: 64 });
    try {
      for (const c of CASES) {
        const s = c.sampling ? { sampling: c.sampling } : {};
        /** The undrafted run of `prompt` to the context's end (the oracle's ids), once per prompt. */
        const runs = new Map<number[], number[]>();
        const fullRun = async (prompt: number[]) => {
          const hit = runs.get(prompt);
          if (hit) return hit;
          const ids = (await stage.generate(1, prompt, { nNew: 41, ...s })).tokens;
          runs.set(prompt, ids);
          return ids;
        };
        /** The undrafted run on slot 1 and the drafted one on slot 0, compared (ids, reason, slot, follow-up). */
        const check = async (
          what: string,
          prompt: number[],
          opts: Omit<GenerateOptions, "sampling">,
          o: {
            minDraft?: number;
            pauseAfter?: number;
            frames: boolean;
            allWrong?: boolean;
            wrong?: Set<number>;
          },
        ) => {
          const label = `${name} ${c.name} ${what}`;
          const full = await fullRun(prompt);
          const [want] = await stage.decoder.generate([{ slot: 1, prompt, opts: { ...opts, ...s } }]);
          const oracle = (seq: readonly number[], k: number) => {
            const at = seq.length - prompt.length;
            return full.slice(at, at + k).map((id, j) =>
              o.allWrong || (o.wrong ?? WRONG).has(at + j) ? (id + 1) % 1024 : id
            );
          };
          const dec = new DraftingDecoder(stage.decoder, stage, {
            draft: 7,
            drafter: oracle,
            ...(o.minDraft ? { minDraft: o.minDraft } : {}),
          });
          let asked = 0;
          const pause = o.pauseAfter === undefined ? undefined : () => ++asked > o.pauseAfter!;
          const streamed: number[] = [];
          const item = {
            slot: 0,
            prompt,
            opts: { ...opts, ...s, onTokens: (ids: readonly number[]) => streamed.push(...ids) },
          };
          let [got] = await dec.generate([item], pause ? { pause } : {});
          if (got!.paused) {
            // The caller paused between frames: the rest resumes (frames first) to the same ids.
            const seq = [...prompt, ...got!.tokens];
            const [rest] = await dec.generate([{
              slot: 0,
              prompt: [seq.at(-1)!],
              opts: {
                ...item.opts,
                nNew: opts.nNew - got!.tokens.length,
                base: seq.length - 1,
                resume: true,
                samplerStep: got!.tokens.length,
                samplerHistory: seq,
              },
            }]);
            got = { ...rest!, tokens: [...got!.tokens, ...rest!.tokens] };
          }
          const st = dec.draftStats;
          console.log(`${label}: ${st.frames} frames, ${st.accepted}/${st.proposed} drafts accepted`);
          assert.deepEqual(got!.tokens, want!.tokens, `${label}: ids`);
          assert.deepEqual(streamed, want!.tokens, `${label}: streamed ids`);
          assert.equal(got!.reason, want!.reason, `${label}: reason`);
          assert.equal(stage.length(0), stage.length(1), `${label}: the slot holds every id but the last`);
          if (o.frames) {
            assert.ok(st.frames > 0 && st.accepted > 0, `${label}: frames ran and kept drafts`);
            assert.ok(st.accepted < st.proposed, `${label}: some drafts were rejected`);
          }
          if (stage.length(0) < CTX) {
            assert.deepEqual(
              await follow(stage, 0, prompt, got!, c.sampling),
              await follow(stage, 1, prompt, want!, c.sampling),
              `${label}: the slot's state (an undrafted follow-up)`,
            );
          }
          return { got: got!, stats: st };
        };
        const scenarios = SCENARIOS[name]![c.name]!;
        // Pipelined (the first id and a batch of 8), then frames at 9 (keeps 3; the frame chained behind it is
        // dropped), 13 (keeps all 7, so the frame chained at 20 counts: it keeps 3) and 25 (none: no frames for
        // a while), then pipelined to the end.
        if (scenarios.includes("budget")) {
          await check("budget", PROMPT, { nNew: 40 }, { minDraft: 2, frames: true });
        }
        // The budget's end inside a frame (17: the frame at 13 carries 3 guesses and ends at the 17th id).
        if (scenarios.includes("budget in a frame")) {
          await check("budget in a frame", PROMPT, { nNew: 17 }, { minDraft: 2, frames: true });
        }
        // A stop id inside a frame: the first id at 15..19 not seen before it.
        if (scenarios.includes("stop")) {
          const full = await fullRun(PROMPT);
          const at = [15, 16, 17, 18, 19].find((i) => !full.slice(0, i).includes(full[i]!))!;
          assert.ok(at !== undefined, `${name} ${c.name}: a stop id to pick`);
          const { got: r } = await check("stop in a frame", PROMPT, { nNew: 40, stopIds: [full[at]!] }, {
            minDraft: 2,
            frames: true,
          });
          assert.equal(r.reason, "stop");
        }
        // The context's end inside frames: a prompt that leaves room for 25 ids.
        if (scenarios.includes("context")) {
          const { got: ctx } = await check("context end", LONG, { nNew: 60 }, { minDraft: 1, frames: true });
          assert.equal(ctx.reason, "context");
        }
        // The caller's pause between frames, then a resumed call that starts with frames.
        // Guesses always wrong: one frame keeps none (and the one chained behind it is dropped), then no
        // frames for 32 positions (past the budget).
        if (scenarios.includes("rejected")) {
          const { stats } = await check("all wrong", PROMPT, { nNew: 40 }, {
            minDraft: 2,
            frames: false,
            allWrong: true,
          });
          assert.deepEqual(
            stats,
            { frames: 2, proposed: 14, accepted: 0 },
            `${name}: the backoff after a poor frame`,
          );
        }
        // The frame at 13 keeps all its guesses but the chained frame's first row (the guess of id 20) is
        // wrong: the chained frame goes back to its snapshot (the slot after the frame at 13).
        if (scenarios.includes("bonus")) {
          await check("last id guessed wrong", PROMPT, { nNew: 40 }, {
            minDraft: 2,
            frames: true,
            wrong: new Set([12, 20, 24, 25]),
          });
        }
        if (scenarios.includes("paused")) {
          await check("paused", PROMPT, { nNew: 30 }, { minDraft: 2, pauseAfter: 3, frames: true });
        }
      }
    } finally {
      stage.destroy();
    }
  });
}

Deno.test("drafting: the decoder passes the runner's idle work to the decoder it wraps", async () => {
  const calls: string[] = [];
  const inner = { warmIdle: () => (calls.push("inner"), Promise.resolve(calls.length < 2)) };
  const dec = new DraftingDecoder(inner as unknown as Stage["decoder"], {} as unknown as Stage, { draft: 4 });
  assert.equal(await dec.warmIdle(), true);
  assert.equal(await dec.warmIdle(), false);
  assert.deepEqual(calls, ["inner", "inner"]);
});
