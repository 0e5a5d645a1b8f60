/**
 * `generate`'s prefill progress and prompt checks (issue #24): a prompt that prefills for longer than the
 * threshold prints progress lines on stderr (`LLM_PROGRESS_MS` lowers the one-second threshold and interval
 * here), a short one prints none, and a prompt longer than `--ctx` is refused before any GPU work.
 */
import assert from "node:assert/strict";
import { fixturePath } from "../tests/util/fixtures.ts";
import { prefillProgress, progressMs } from "./generate.ts";

const MOD = new URL("../mod.ts", import.meta.url).pathname;
const MODEL = fixturePath("tiny-qwen35moe.q8_0.gguf");
const LINE = /^prefill (\d+)\/(\d+) tokens, ([\d,]+|-) tok\/s$/gm;

async function generate(
  args: string[],
  env: Record<string, string> = {},
): Promise<{ code: number; stderr: string }> {
  const out = await new Deno.Command(Deno.execPath(), {
    args: ["run", "-A", MOD, "generate", "--model", MODEL, ...args],
    stdout: "null",
    stderr: "piped",
    env: { XDG_RUNTIME_DIR: Deno.env.get("XDG_RUNTIME_DIR") ?? "/tmp", NO_COLOR: "1", ...env },
  }).output();
  return { code: out.code, stderr: new TextDecoder().decode(out.stderr) };
}

const tokens = (n: number) => Array.from({ length: n }, (_, i) => (i * 37 + 5) % 1000).join(",");

Deno.test("generate: a long prompt prints prefill progress on stderr, a short one none", async () => {
  // 96 tokens in chunks of 8: 11 chunks reported; with a 1 ms threshold every one of them prints.
  const [long, short] = await Promise.all([
    generate(["--tokens", tokens(96), "--n", "1", "--chunk", "8"], { LLM_PROGRESS_MS: "1" }),
    // 24 tokens in chunks of 8 (2 chunks reported) under a threshold they stay below. (A cold process builds
    // its pipelines during the first chunks: over a second on lavapipe, so the default would print here.)
    generate(["--tokens", tokens(24), "--n", "1", "--chunk", "8"], { LLM_PROGRESS_MS: "600000" }),
  ]);
  assert.equal(long.code, 0, long.stderr);
  const lines = [...long.stderr.matchAll(LINE)];
  assert.ok(lines.length >= 2, `expected progress lines:\n${long.stderr}`);
  const done = lines.map((m) => Number(m[1]));
  for (const m of lines) assert.equal(m[2], "96");
  assert.ok(done.every((d, i) => d % 8 === 0 && d < 96 && (i === 0 || d > done[i - 1]!)), done.join(" "));
  assert.equal(short.code, 0, short.stderr);
  assert.deepEqual([...short.stderr.matchAll(LINE)], [], short.stderr);
  assert.match(short.stderr, /^prompt 24 tokens, prefill/m);
});

Deno.test("generate: a prompt longer than --ctx is refused before the GPU is touched", async () => {
  // With no usable backend any GPU work fails: the prompt's error first proves nothing reached the GPU.
  const noGpu = { DENO_WEBGPU_BACKEND: "metal" };
  const control = await generate(["--tokens", tokens(4), "--n", "1"], noGpu);
  assert.equal(control.code, 1, control.stderr);
  assert.doesNotMatch(control.stderr, /does not fit/);
  const r = await generate(["--tokens", tokens(20), "--n", "4", "--ctx", "8"], noGpu);
  assert.equal(r.code, 1, r.stderr);
  assert.match(r.stderr, /The prompt of 20 tokens does not fit --ctx 8: raise --ctx to at least 24/);
  const bad = await generate(["--tokens", tokens(4)], { LLM_PROGRESS_MS: "soon" });
  assert.equal(bad.code, 1);
  assert.match(bad.stderr, /LLM_PROGRESS_MS=soon must be a number of milliseconds >= 0/);
});

Deno.test("prefillProgress: nothing before the threshold, then at most one line per interval", () => {
  let t = 0;
  const p = prefillProgress(1000, () => t);
  t = 999;
  assert.equal(p(100, 4000), undefined);
  t = 1000;
  assert.equal(p(1234, 4000), "prefill 1234/4000 tokens, 1,234 tok/s");
  t = 1999;
  assert.equal(p(2000, 4000), undefined);
  t = 2000;
  assert.equal(p(2468, 4000), "prefill 2468/4000 tokens, 1,234 tok/s");
  assert.equal(progressMs(undefined), 1000);
  assert.equal(progressMs("50"), 50);
  assert.throws(() => progressMs("-1"), /LLM_PROGRESS_MS=-1/);
});
