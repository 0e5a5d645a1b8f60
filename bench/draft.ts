/**
 * Benchmark: drafted decoding in the unsplit engine (engine/exec/drafting.ts) on one slot, side by side with
 * the pipelined decode driver, in alternating rounds:
 * - `plain`: the request undrafted (the decode driver alone);
 * - `first`: the request through the drafting decoder with a fresh draft cache (guesses from its own history
 *   only: the cost of drafting where guesses rarely come);
 * - `repeat`: the same request again, drafting from the cache the first run filled (a retried or regenerated
 *   request: nearly every guess right); `repeatUnchained` the same with DraftingOptions.chain false (each
 *   frame waits for its readback before the next goes in);
 * - `rejected`: a drafter whose guesses are always wrong (every frame rejects all; the backoff bounds the
 *   cost): the slowdown of a stream whose drafts fail.
 * Each line: wall ms of the whole generate (prompt prefill included), `prefillMs` (the same prompt with one
 * id, measured beside it), tok/s over the generate and over its decode part, frames, proposed and accepted
 * guesses, and whether the ids equal the plain run's.
 *
 * Usage: `deno run -A bench/draft.ts [--model F.gguf] [--prompt 256] [--n 128] [--draft 7] [--min 2,4,6]
 * [--rounds 3] [--f32-experts] [--quick]`: `--f32-experts` keeps f32 x for the expert passes (default: int8 x
 * for them alone, as the serving commands run; `int8Experts` in each line); `--min` lists the DraftingOptions.minDraft values measured (each a `repeat`,
 * `first` and `rejected` line per round); `--quick`: the tiny synthetic qwen35moe, a 24-id prompt, 24 ids,
 * one round (a check that it runs, e.g. on lavapipe). With no `--model` (and no `--quick`) it synthesizes the
 * full-size 35B-A3B-shaped IQ4_XS model to `--synth-out` (default `/tmp/bench-35b-a3b-iq4_xs.gguf`, reused when
 * present). One JSON line per measurement, never an assertion. No npm imports.
 * @module
 */
import { parseArgs } from "node:util";
import { acquireGpu } from "../engine/gpu/device.ts";
import { openGguf } from "../engine/gguf.ts";
import { Stage } from "../engine/exec/stage.ts";
import { DraftCache } from "../engine/exec/draft_cache.ts";
import { DraftingDecoder } from "../engine/exec/drafting.ts";
import type { SlotDecoder } from "../engine/exec/slot_decoder.ts";
import { planModel, synthesize } from "../engine/synth.ts";
import { samplingParams } from "../engine/sampling.ts";
import { buildInfo } from "../version.ts";

const { values: args } = parseArgs({
  options: {
    model: { type: "string" },
    "synth-out": { type: "string", default: "/tmp/bench-35b-a3b-iq4_xs.gguf" },
    prompt: { type: "string", default: "256" },
    n: { type: "string", default: "128" },
    draft: { type: "string", default: "7" },
    min: { type: "string", default: "2,4,6" },
    rounds: { type: "string", default: "3" },
    temp: { type: "string", default: "0" },
    "f32-experts": { type: "boolean", default: false },
    quick: { type: "boolean", default: false },
  },
});

const gpu = await acquireGpu();
const commit = buildInfo().commit;
function emit(what: string, result: Record<string, unknown>): void {
  console.log(JSON.stringify({ bench: "draft", what, commit, adapter: gpu.summary, ...result }));
}

const quick = args.quick;
let path = args.model;
if (!path) {
  const [out, preset] = quick
    ? ["/tmp/bench-tiny-qwen35moe.gguf", "tiny"] as const
    : [args["synth-out"]!, "35b-a3b"] as const;
  path = out;
  if (!await Deno.stat(path).then(() => true, () => false)) {
    const quant = quick ? "q8_0" : "iq4_xs";
    const r = await synthesize(planModel({ arch: "qwen35moe", preset, quant, seed: 7 }), { out: path });
    emit("synth", { path, dataBytes: r.dataBytes, seconds: r.seconds });
  }
}
const nPrompt = quick ? 24 : Number(args.prompt);
const nNew = quick ? 24 : Number(args.n);
const K = Number(args.draft);
const mins = args.min.split(",").map(Number).filter((m) => m <= K);
const rounds = quick ? 1 : Number(args.rounds);
using file = await openGguf(path);
const int8Experts = !args["f32-experts"];
const stage = await Stage.load(gpu, file, { nCtx: nPrompt + nNew + 8, nSlots: 1, int8Experts });
const V = stage.hp.nVocab;
// A fixed pseudo-random prompt (the same every run): the synthetic models' text is noise either way.
let x = 12345;
const prompt = Array.from({ length: nPrompt }, () => (x = (x * 1103515245 + 12345) % 2 ** 31) % V);
const temp = Number(args.temp);
// Sampled runs draw each frame's rows with the GPU sampler in the frame's pass (the argmax path: the argmax).
const sampling = temp > 0
  ? samplingParams({ temperature: temp, topK: 40, topP: 0.95, minP: 0, seed: 1 })
  : undefined;
const params = { path, nPrompt, nNew, draft: K, rounds, temp, int8Experts };
emit("setup", { ...params, mins, weightBytes: stage.weightBytes });

/** One timed generate on slot 0 of `dec`: wall ms and the ids. */
async function timed(dec: SlotDecoder, n: number): Promise<{ ms: number; tokens: number[] }> {
  const t0 = performance.now();
  const [r] = await dec.generate([{ slot: 0, prompt, opts: { nNew: n, ...(sampling ? { sampling } : {}) } }]);
  return { ms: performance.now() - t0, tokens: r!.tokens };
}

// Warm-up: the driver's graphs, and a frame of every width a drafting run may take (1 + 1..K rows).
const plainIds = (await timed(stage.decoder, nNew)).tokens;
for (let k = 1; k <= K; k++) {
  const cache = new DraftCache(100_000);
  const warm = new DraftingDecoder(stage.decoder, stage, { draft: k, minDraft: k, draftCache: cache });
  await timed(warm, Math.min(nNew, 16));
  await timed(warm, Math.min(nNew, 16));
}

// Round -1 runs every variant once unreported (the rollbacks' graphs, the spares of the snapshots).
let round = -1;
const line = (what: string, ms: number, prefillMs: number, extra: Record<string, unknown>) =>
  round >= 0 && emit(what, {
    ...params,
    ms: +ms.toFixed(2),
    prefillMs: +prefillMs.toFixed(2),
    tokPerS: +(nNew / (ms / 1000)).toFixed(1),
    decodeTokPerS: +((nNew - 1) / ((ms - prefillMs) / 1000)).toFixed(1),
    ...extra,
  });

for (; round < rounds; round++) {
  const prefillMs = (await timed(stage.decoder, 1)).ms;
  const plain = await timed(stage.decoder, nNew);
  line("plain", plain.ms, prefillMs, { round, same: sameIds(plain.tokens) });
  for (const minDraft of mins) {
    const cache = new DraftCache(100_000);
    const dec = new DraftingDecoder(stage.decoder, stage, { draft: K, minDraft, draftCache: cache });
    const stats = () => ({ ...dec.draftStats });
    const first = await timed(dec, nNew);
    const s1 = stats();
    line("first", first.ms, prefillMs, { round, minDraft, ...s1, same: sameIds(first.tokens) });
    const repeat = await timed(dec, nNew);
    const s2 = stats();
    line("repeat", repeat.ms, prefillMs, {
      round,
      minDraft,
      frames: s2.frames - s1.frames,
      proposed: s2.proposed - s1.proposed,
      accepted: s2.accepted - s1.accepted,
      same: sameIds(repeat.tokens),
    });
    // The same repeat with frames one at a time (no chained frame during a readback's wait).
    const cache1 = new DraftCache(100_000);
    const unchained = new DraftingDecoder(stage.decoder, stage, {
      draft: K,
      minDraft,
      draftCache: cache1,
      chain: false,
    });
    await timed(unchained, nNew);
    const u1 = { ...unchained.draftStats };
    const repeat1 = await timed(unchained, nNew);
    const u2 = unchained.draftStats;
    line("repeatUnchained", repeat1.ms, prefillMs, {
      round,
      minDraft,
      frames: u2.frames - u1.frames,
      proposed: u2.proposed - u1.proposed,
      accepted: u2.accepted - u1.accepted,
      same: sameIds(repeat1.tokens),
    });
    const wrong = new DraftingDecoder(stage.decoder, stage, {
      draft: K,
      minDraft,
      drafter: (seq, k) => Array.from({ length: k }, (_, j) => (seq.at(-1)! + 1 + j) % V),
    });
    const rejected = await timed(wrong, nNew);
    line("rejected", rejected.ms, prefillMs, {
      round,
      minDraft,
      ...wrong.draftStats,
      same: sameIds(rejected.tokens),
    });
  }
}
stage.destroy();

function sameIds(ids: readonly number[]): boolean {
  return ids.length === plainIds.length && ids.every((id, i) => id === plainIds[i]);
}
