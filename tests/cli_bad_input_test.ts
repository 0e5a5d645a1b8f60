/**
 * The CLI's bad-input suite: wrong, out-of-range and unknown options of every command, each checked for its
 * exit code AND its message (what was wrong and what to do), never a stack trace. Real processes, in parallel.
 * @module
 */
import assert from "node:assert/strict";
import { fixturePath } from "./util/fixtures.ts";

const MOD = new URL("../mod.ts", import.meta.url).pathname;
const F = fixturePath("tiny-qwen35moe.q8_0.gguf");

/** argv, the exit code, and the last line of stderr it must match. */
const CASES: readonly [string[], number, RegExp][] = [
  [["head", "--slots", "0"], 1, /^error: --slots 0 must be an integer >= 1$/],
  [["head", "--ctx", "abc"], 1, /^error: --ctx abc must be an integer >= 2$/],
  [["head", "--frobnicate"], 1, /^error: Unknown option '--frobnicate'$/],
  [["head", "--piece-steps", "0"], 1, /^error: --piece-steps 0 must be an integer >= 1$/],
  [
    ["head", "--piece-steps", "9"],
    1,
    /^error: --piece-steps 9 must be at most 8 \(the decode steps per readback\)$/,
  ],
  [["head", "--piece-gap", "x"], 1, /^error: --piece-gap x must be a number in \[0, 64\]$/],
  [
    ["head", "--piece-gap", "0.5"],
    1,
    /^error: --piece-gap 0.5 must be 0 \(fixed pieces\) or 1..64 \(steady gaps per round\)$/,
  ],
  [
    ["head", "--model", F, "--draft-cache", "1000"],
    1,
    /^error: --draft-cache 1000 feeds the drafts: give it with --draft$/,
  ],
  [
    ["head", "--model", F, "--draft", "3", "--draft-min", "5"],
    1,
    /^error: --draft-min 5 must be at most --draft 3$/,
  ],
  [
    ["head", "--model", F, "--draft", "8"],
    1,
    /^error: --draft 8 must be at most 7 \(rows per frame: 1 \+ drafts <= 8\)$/,
  ],
  [
    ["head", "--model", F, "--link-timeout", "0"],
    1,
    /^error: --link-timeout 0 must be seconds in 0\.1\.\.3600 \(a stalled stage's reply wait\)$/,
  ],
  [
    ["head", "--model", F, "--link-timeout", "5"],
    1,
    /^error: --link-timeout bounds the wait for the chain: give it with --layers and --next$/,
  ],
  [
    ["worker", "--model", F, "--layers", "2:4", "--listen", "127.0.0.1:9", "--link-timeout", "5"],
    1,
    /^error: --link-timeout bounds the wait for --next: give it with --next \(a middle worker\)$/,
  ],
  [
    ["head", "--model", "/nonexistent.gguf", "--port", "0"],
    1,
    /GGUF file \/nonexistent\.gguf does not exist: check the path/,
  ],
  [["generate", "--model", F, "--tokens", "1,x"], 1, /^error: --tokens x must be an integer >= 0$/],
  [
    ["generate", "--model", F, "--tokens", "1", "--chunk", "0"],
    1,
    /^error: --chunk 0 must be an integer >= 1$/,
  ],
  [
    ["generate", "--model", F, "--tokens", "1", "--temp", "9999"],
    1,
    /^error: temperature 9999 is outside \[0, 100\]$/,
  ],
  [["generate", "--model", F], 2, /give exactly one of --prompt and --tokens/],
  [
    ["generate", "--model", F, "--tokens", "1", "--draft", "8"],
    1,
    /^error: --draft 8 must be at most 7 \(rows per frame: 1 \+ drafts <= 8\)$/,
  ],
  [
    ["generate", "--model", F, "--tokens", "1", "--draft", "2", "--draft-min", "3"],
    1,
    /^error: --draft-min 3 must be at most --draft \(2\)$/,
  ],
  [["inspect"], 2, /^error: give exactly one GGUF path$/],
  [["inspect", "--slots", "100000", F], 1, /^error: --slots 100000 must be an integer in 1\.\.256$/],
  [["inspect", "--ctx", "0", F], 1, /^error: --ctx 0 must be an integer in 1\.\.16777216$/],
  [
    ["synth", "--arch", "nope", "--preset", "tiny", "--quant", "q8_0", "--out", "/tmp/x.gguf"],
    1,
    /--arch nope is not qwen35moe or qwen3next/,
  ],
  [
    [
      "synth",
      "--arch",
      "qwen35moe",
      "--preset",
      "tiny",
      "--quant",
      "q8_0",
      "--split-parts",
      "1000",
      "--out",
      "/tmp/x.gguf",
    ],
    1,
    /--split-parts 1000 is more than the model's 76 tensors: .* give at most 76/,
  ],
  [
    ["tokenize", "--model", F, "--decode", "1,abc"],
    1,
    /--decode: "abc" is not a token id: give non-negative integers/,
  ],
  [
    ["worker", "--model", F, "--layers", "3:1", "--listen", "127.0.0.1:0"],
    1,
    /Address "127\.0\.0\.1:0" is not HOST:PORT with a port in 1\.\.65535/,
  ],
  [["frobnicate"], 2, /--help \(or -h, or help <command>\) prints a command's options/],
  // int8 x for every mat-vec is the default of head, worker, generate and probe (--int8 names it);
  // --int8-experts keeps it for the experts alone and --f32-experts turns it off: any two are a usage error.
  ...([
    ["head", "--model", F, "--port", "0"],
    ["worker", "--model", F, "--layers", "2:4", "--listen", "127.0.0.1:9"],
    ["generate", "--model", F, "--tokens", "1"],
    ["probe", "127.0.0.1:9", "--model", F, "--layers", "0:2"],
  ].map((argv): [string[], number, RegExp] => [
    [...argv, "--int8-experts", "--f32-experts"],
    2,
    /^error: --int8-experts \(int8 x for the expert mat-vecs alone\) and --f32-experts \(f32 x everywhere\) contradict each other: give one$/,
  ])),
  [
    ["head", "--model", F, "--port", "0", "--int8", "--f32-experts"],
    2,
    /^error: --int8 \(int8 x for every mat-vec, the default\) and --f32-experts \(f32 x everywhere\) contradict each other: give one$/,
  ],
  [
    ["worker", "--model", F, "--layers", "2:4", "--listen", "127.0.0.1:9", "--int8", "--int8-experts"],
    2,
    /^error: --int8 \(int8 x for every mat-vec, the default\) and --int8-experts \(int8 x for the expert mat-vecs alone\) contradict each other: give one$/,
  ],
];

async function run(argv: string[]): Promise<{ code: number; stderr: string }> {
  const out = await new Deno.Command(Deno.execPath(), {
    args: ["run", "-A", MOD, ...argv],
    stdout: "piped",
    stderr: "piped",
    env: { XDG_RUNTIME_DIR: Deno.env.get("XDG_RUNTIME_DIR") ?? "/tmp", NO_COLOR: "1" },
  }).output();
  return {
    code: out.code,
    stderr: new TextDecoder().decode(out.stderr) + new TextDecoder().decode(out.stdout),
  };
}

Deno.test("CLI bad input: every case exits with its code and a specific message, no stack trace", async () => {
  const results: { argv: string[]; code: number; stderr: string }[] = [];
  // Four processes at a time (each starts a Deno; the GPU ones fail before loading weights).
  for (let i = 0; i < CASES.length; i += 4) {
    const batch = CASES.slice(i, i + 4);
    results.push(...await Promise.all(batch.map(async ([argv]) => ({ argv, ...await run(argv) }))));
  }
  const bad: string[] = [];
  for (const [i, [argv, code, re]] of CASES.entries()) {
    const r = results[i]!;
    const lines = r.stderr.trim().split("\n").filter((l) => !/XDG_RUNTIME_DIR/.test(l));
    const ok = r.code === code && lines.some((l) => re.test(l)) && !/^\s+at .*:\d+:\d+\)?$/m.test(r.stderr);
    if (!ok) {
      bad.push(
        `${argv.join(" ")}: exit ${r.code} (want ${code})\n${
          r.stderr.trim().split("\n").slice(-3).join("\n")
        }`,
      );
    }
  }
  assert.deepEqual(bad, [], bad.join("\n\n"));
});
