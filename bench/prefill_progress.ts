/**
 * Benchmark: what `GenerateOptions.onPrefill` costs. One prompt (`--tokens`, default 2,048) prefilled and its
 * first id generated on the fixture's tiny qwen35moe, with and without a progress callback, alternating in
 * one run (`--rounds` each, the first of each discarded as warm-up): without it the chunks are queued at
 * once, with it each is submitted once the one before has finished (engine/exec/decode.ts #queueChunks).
 * One JSON line per run: ms and tok/s to the first id.
 *
 * Usage: `deno run -A bench/prefill_progress.ts [--tokens 2048] [--chunk 256] [--rounds 4]`
 * @module
 */
import { parseArgs } from "node:util";
import { acquireGpu, openGguf, Stage } from "../engine/mod.ts";

const { values } = parseArgs({
  args: Deno.args,
  options: {
    tokens: { type: "string", default: "2048" },
    chunk: { type: "string", default: "256" },
    rounds: { type: "string", default: "4" },
  },
});
const nTokens = Number(values.tokens);
const chunk = Number(values.chunk);
const gpu = await acquireGpu();
using file = await openGguf(new URL("../tests/fixtures/tiny-qwen35moe.q8_0.gguf", import.meta.url).pathname);
const stage = await Stage.load(gpu, file, { nCtx: nTokens + 8, nSlots: 1, maxChunk: chunk });
const ids = Array.from({ length: nTokens }, (_, i) => (i * 7919) % 1000 + 1);
const commit = Deno.env.get("BENCH_COMMIT") ??
  new TextDecoder().decode(
    (await new Deno.Command("git", { args: ["rev-parse", "--short", "HEAD"] }).output()).stdout,
  )
    .trim();
for (let r = 0; r < Number(values.rounds); r++) {
  for (const progress of [false, true]) {
    let reports = 0;
    const t0 = performance.now();
    await stage.generate(0, ids, { nNew: 1, onPrefill: progress ? () => reports++ : undefined });
    const ms = performance.now() - t0;
    if (r === 0) continue;
    console.log(JSON.stringify({
      bench: "prefill_progress",
      commit,
      adapter: gpu.adapter.info.description,
      params: { tokens: nTokens, chunk, progress },
      result: { ms: Math.round(ms), tokPerS: Math.round((nTokens * 1000) / ms), reports },
    }));
  }
}
stage.destroy();
