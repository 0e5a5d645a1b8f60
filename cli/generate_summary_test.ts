/**
 * `generate`'s summary line on stderr (issue #22, as llama.cpp's tools print one): prompt tokens and prefill
 * tok/s, generated tokens and decode tok/s, with and without `--json`.
 */
import assert from "node:assert/strict";
import { fixturePath } from "../tests/util/fixtures.ts";
import { speedLine } from "./generate.ts";

const MOD = new URL("../mod.ts", import.meta.url).pathname;
const LINE = /^prompt 4 tokens, prefill [\d.]+ tok\/s; generated 12 tokens, decode [\d.]+ tok\/s$/m;

Deno.test("generate prints prompt tokens, prefill tok/s, generated tokens and decode tok/s on stderr", async () => {
  const base = ["run", "-A", MOD, "generate", "--model", fixturePath("tiny-qwen35moe.q8_0.gguf")];
  const args = [...base, "--tokens", "1,2,3,4", "--n", "12", "--ignore-eos"];
  for (const extra of [[], ["--json"]]) {
    const out = await new Deno.Command(Deno.execPath(), {
      args: [...args, ...extra],
      stdout: "piped",
      stderr: "piped",
      env: { XDG_RUNTIME_DIR: Deno.env.get("XDG_RUNTIME_DIR") ?? "/tmp", NO_COLOR: "1" },
    }).output();
    const stderr = new TextDecoder().decode(out.stderr);
    assert.equal(out.code, 0, stderr);
    assert.match(stderr, LINE, `${extra.join(" ")}:\n${stderr}`);
    assert.doesNotMatch(new TextDecoder().decode(out.stdout), /tok\/s/, "the summary stays off stdout");
  }
});

Deno.test("speedLine: rates from the first id and the batches after it; '-' where nothing was timed", () => {
  assert.equal(
    speedLine(10, 9, { t0: 0, first: { atMs: 500, n: 1 }, lastMs: 1500 }),
    "prompt 10 tokens, prefill 20.0 tok/s; generated 9 tokens, decode 8.0 tok/s",
  );
  assert.equal(
    speedLine(10, 1, { t0: 0, first: { atMs: 500, n: 1 }, lastMs: 500 }),
    "prompt 10 tokens, prefill 20.0 tok/s; generated 1 tokens, decode - tok/s",
  );
  assert.equal(
    speedLine(10, 0, { t0: 0, first: undefined, lastMs: 0 }),
    "prompt 10 tokens, prefill - tok/s; generated 0 tokens, decode - tok/s",
  );
});
