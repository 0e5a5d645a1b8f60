/**
 * Check (not a timing): on a real-shaped model, the batched decode step gives every slot the bits of its solo
 * steps, as tests/batch_test.ts asserts on the tiny models (whose K = 256 cannot show a TEAM that follows a
 * dispatch's rows, engine/blocks/linear.ts `soloTeam`). Each of `--slots` slots generates `--n` greedy ids
 * with their top-2 logits alone, then all of them together in batched steps; one JSON line says whether ids
 * and logits are equal, and where the first difference is. Exit code 1 on a difference.
 *
 * Usage: `deno run -A bench/batch_bits.ts --model F.gguf [--slots 4] [--n 24] [--prompt 12] [--int8-experts]
 * [--f32-experts] [--q8b-rows R] [--gdn-split S]` (the serving commands' numerics, cli/experts.ts: int8 x for every mat-vec
 * by default, whose batched steps run matvec_q8b; `--int8-experts` for the experts alone; `--f32-experts` f32
 * x everywhere; `--int8` names the default; `--q8b-rows` StageOptions.matvecTuning.q8bRows and `--gdn-split`
 * StageOptions.gdnBatchedSplit, as bench/decode.ts). The line's `soloDigest` (FNV-1a of the solo runs' ids and logits) tells two runs' solo
 * bits apart: equal digests with and without a knob say it kept the default's bits. No npm imports.
 * @module
 */
import { expertsConflict, int8ActivationsFlag, int8ExpertsFlag } from "../cli/experts.ts";
import { parseArgs } from "node:util";
import { acquireGpu } from "../engine/gpu/device.ts";
import { openGguf } from "../engine/gguf.ts";
import { Stage } from "../engine/exec/stage.ts";

const { values: args } = parseArgs({
  options: {
    model: { type: "string" },
    slots: { type: "string", default: "4" },
    n: { type: "string", default: "24" },
    prompt: { type: "string", default: "12" },
    "f32-experts": { type: "boolean", default: false },
    "int8-experts": { type: "boolean", default: false },
    int8: { type: "boolean", default: false },
    "q8b-rows": { type: "string" },
    "gdn-split": { type: "string" },
  },
  strict: true,
});
if (!args.model) throw new Error("--model F.gguf is required");
const conflict = expertsConflict(args);
if (conflict) throw new RangeError(conflict);
const nSlots = Number(args.slots);
const nNew = Number(args.n);
const nPrompt = Number(args.prompt);
const gpu = await acquireGpu();
using file = await openGguf(args.model);
const stage = await Stage.load(gpu, file, {
  nCtx: nPrompt + nNew + 8,
  nSlots,
  maxChunk: 64,
  int8Experts: int8ExpertsFlag(args),
  int8Activations: int8ActivationsFlag(args),
  matvecTuning: args["q8b-rows"] === undefined ? undefined : { q8bRows: Number(args["q8b-rows"]) },
  gdnBatchedSplit: args["gdn-split"] === undefined ? undefined : Number(args["gdn-split"]),
});
let seed = 12345;
const rand = (n: number) => (seed = (seed * 1103515245 + 12345) >>> 0) % n;
const prompts = Array.from({ length: nSlots }, () => Array.from({ length: nPrompt }, () => rand(1000) + 10));
const solo = [];
for (let s = 0; s < nSlots; s++) solo.push(await stage.generate(s, prompts[s]!, { nNew, top: 2, batch: 8 }));
const batched = await stage.generateBatch(
  prompts.map((prompt, s) => ({ slot: s, prompt, opts: { nNew, top: 2 } })),
  { batch: 8 },
);
const diffs: string[] = [];
for (let s = 0; s < nSlots; s++) {
  const a = solo[s]!;
  const b = batched[s]!;
  const at = a.tokens.findIndex((t, i) => t !== b.tokens[i]);
  if (at >= 0) diffs.push(`slot ${s}: ids differ from step ${at}`);
  else if (JSON.stringify(a.top) !== JSON.stringify(b.top)) {
    const i = a.top.findIndex((t, j) => JSON.stringify(t) !== JSON.stringify(b.top[j]));
    diffs.push(
      `slot ${s}: top-2 logits differ at step ${i}: ${JSON.stringify(a.top[i])} / ${
        JSON.stringify(b.top[i])
      }`,
    );
  }
}
console.log(JSON.stringify({
  bench: "batch_bits",
  model: args.model,
  adapter: gpu.summary,
  slots: nSlots,
  newTokens: nNew,
  int8Experts: stage.int8Experts,
  int8Activations: stage.int8Activations,
  q8bRows: args["q8b-rows"] ?? "by shape",
  gdnSplit: args["gdn-split"] ?? "default",
  equal: diffs.length === 0,
  diffs,
  soloDigest: fnv1a(JSON.stringify(solo.map((r) => [r.tokens, r.top]))),
}));
stage.destroy();
if (diffs.length > 0) Deno.exit(1);

/** FNV-1a (32 bits) of a string's UTF-16 code units, as 8 hex digits. */
function fnv1a(text: string): string {
  let h = 0x811c9dc5;
  for (let i = 0; i < text.length; i++) h = Math.imul(h ^ text.charCodeAt(i), 0x01000193) >>> 0;
  return h.toString(16).padStart(8, "0");
}
