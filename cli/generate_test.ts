import assert from "node:assert/strict";
import { fixturePath } from "../tests/util/fixtures.ts";

const MOD = new URL("../mod.ts", import.meta.url).pathname;

async function generate(args: string[]): Promise<{ code: number; stdout: string; stderr: string }> {
  const out = await new Deno.Command(Deno.execPath(), {
    args: ["run", "-A", MOD, "generate", ...args],
    stdout: "piped",
    stderr: "piped",
    env: { XDG_RUNTIME_DIR: Deno.env.get("XDG_RUNTIME_DIR") ?? "/tmp", NO_COLOR: "1" },
  }).output();
  const dec = new TextDecoder();
  return { code: out.code, stdout: dec.decode(out.stdout), stderr: dec.decode(out.stderr) };
}

Deno.test("generate --tokens --json --echo reproduces llama.cpp's greedy tokens and scores on a fixture", async () => {
  const name = "tiny-qwen35moe.q8_0";
  const expect = JSON.parse(await Deno.readTextFile(fixturePath(`${name}.expect.json`)));
  // The case whose greedy run goes longest before a certified near-tie.
  type Turn = { input_ids: number[]; generated: number[]; first_near_tie_step: number | null };
  const turns: Turn[] = expect.reference.cases.map((c: { turns: Turn[] }) => c.turns[0]);
  const reach = (t: Turn) => t.first_near_tie_step ?? t.generated.length;
  const turn = turns.reduce((a, b) => (reach(b) > reach(a) ? b : a)) as Turn & {
    prompt_top5: [number, number][][];
  };
  const upTo = reach(turn);
  assert.ok(upTo >= 1, "a fixture case has at least one step before a near-tie");
  const n = Math.max(1, Math.min(8, upTo));
  const r = await generate([
    "--model",
    fixturePath(`${name}.gguf`),
    "--tokens",
    turn.input_ids.join(","),
    "--n",
    String(n),
    "--top",
    "3",
    "--json",
    "--echo",
    "--ignore-eos",
    // The reference is llama.cpp on an F32 copy of the weights (exact math, no rounding of x): compare it with
    // the exact path, not the default int8 x for the experts (which moves this top logit by more than 1e-2).
    "--f32-experts",
  ]);
  assert.equal(r.code, 0, r.stderr);
  const got = JSON.parse(r.stdout);
  assert.deepEqual(got.tokens, turn.generated.slice(0, n));
  assert.equal(got.top.length, n);
  assert.equal(got.top[0].length, 3);
  assert.equal(got.top[0][0][0], got.tokens[0], "top[0] leads with the generated id");
  assert.equal(got.prompt_top.length, turn.input_ids.length);
  // The last prompt position predicts the first generated token, as llama.cpp's prompt_top5 says.
  const last = turn.prompt_top5.at(-1)!;
  assert.equal(got.prompt_top.at(-1)[0][0], last[0]![0]);
  assert.ok(Math.abs(got.prompt_top.at(-1)[0][1] - last[0]![1]) < 1e-2);
});

Deno.test("generate --int8-experts, --f32-experts and the default int8 x reach the stage: logits move by the int8 rounding of x, not more", async () => {
  const args = ["--model", fixturePath("tiny-qwen35moe.q8_0.gguf"), "--tokens", "1,2,3,4", "--n", "3"];
  const runs = await Promise.all(
    [["--f32-experts"], [], ["--int8-experts"], ["--int8"]].map((a) =>
      generate([...args, "--top", "1", "--json", ...a])
    ),
  );
  for (const r of runs) assert.equal(r.code, 0, r.stderr);
  const [f32, int8, experts, flagged] = runs.map((r) =>
    JSON.parse(r.stdout) as { top: [number, number][][] }
  );
  // Step 0's logits come from the 4-token prompt chunk: f32 x everywhere with --f32-experts, int8 x for every
  // mat-vec by default (a mat-vec chunk), for the experts alone with --int8-experts: three different values,
  // each near the f32 one.
  const a = f32!.top[0]![0]![1];
  const b = int8!.top[0]![0]![1];
  const c = experts!.top[0]![0]![1];
  assert.notEqual(a, b, "the default gave the --f32-experts run's logit bit for bit: int8 x is not on");
  assert.notEqual(
    a,
    c,
    "--int8-experts gave the --f32-experts run's logit bit for bit: int8 experts are not on",
  );
  assert.notEqual(b, c, "--int8-experts gave the default run's logit bit for bit");
  for (const v of [b, c]) {
    assert.ok(Math.abs(a - v) < 0.05 * Math.max(1, Math.abs(a)), `top logit ${v} with int8 x against ${a}`);
  }
  // --int8 names the default: the same bits.
  assert.deepEqual(flagged, int8);
});

Deno.test("generate: bad arguments fail with a message and a non-zero exit", async () => {
  const model = fixturePath("tiny-qwen3next.q8_0.gguf");
  let r = await generate(["--model", model]);
  assert.equal(r.code, 2);
  assert.match(r.stderr, /give exactly one of --prompt and --tokens/);
  r = await generate(["--model", model, "--tokens", "1,99999"]);
  assert.equal(r.code, 1);
  assert.match(r.stderr, /Token id 99999 is outside the vocabulary 0..1023/);
  r = await generate(["--model", model, "--tokens", "1", "--n", "0"]);
  assert.match(r.stderr, /--n 0 generates nothing: add --echo/);
  r = await generate(["--model", model, "--tokens", "1", "--int8-experts", "--f32-experts"]);
  assert.equal(r.code, 2);
  assert.match(
    r.stderr,
    /error: --int8-experts \(.*\) and --f32-experts \(.*\) contradict each other: give one/,
  );
  r = await generate(["--model", "/nonexistent.gguf", "--tokens", "1"]);
  assert.equal(r.code, 1);
  assert.match(r.stderr, /nonexistent\.gguf/);
});

Deno.test("generate --chunk: one prompt prefilled in chunks of 1, 4 and 64 scores alike (f32 summation order)", async () => {
  const tokens = Array.from({ length: 13 }, (_, i) => (i * 37 + 5) % 1000).join(",");
  // --f32-experts: the exact path, whose chunkings differ by f32 summation order alone. (Under the default int8
  // x for the experts, at 863f00b, a first chunk of 10 or more of this prompt's tokens moved the top logit by
  // about 1e-3 relative against chunks of up to 9; at a232858 they agree to 2e-7.)
  const args = [
    "--model",
    fixturePath("tiny-qwen3next.q8_0.gguf"),
    "--tokens",
    tokens,
    "--n",
    "2",
    "--json",
    "--f32-experts",
  ];
  const runs = await Promise.all(
    ["1", "4", "64"].map((c) => generate([...args, "--top", "3", "--chunk", c])),
  );
  for (const r of runs) assert.equal(r.code, 0, r.stderr);
  const tops = runs.map((r) => (JSON.parse(r.stdout) as { top: [number, number][][] }).top[0]!);
  // The same ids; logits equal to f32 summation order (the chunked DeltaNet and the matmul reorder sums).
  for (const t of tops.slice(1)) {
    assert.deepEqual(t.map(([id]) => id), tops[0]!.map(([id]) => id));
    t.forEach(([, v], i) =>
      assert.ok(Math.abs(v - tops[0]![i]![1]) < 1e-3 * Math.max(1, Math.abs(v)), `${v}`)
    );
  }
  // ... and not bit for bit: the chunk reached the stage (1: mat-vecs and the recurrence; 64: matmul, chunked).
  assert.notDeepEqual(
    tops[0],
    tops[2],
    "--chunk 1 and --chunk 64 gave the same bits: the option did not apply",
  );
  const bad = await generate([...args, "--chunk", "0"]);
  assert.equal(bad.code, 1);
  assert.match(bad.stderr, /--chunk 0 must be an integer >= 1/);
});
