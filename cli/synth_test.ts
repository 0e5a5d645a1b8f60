import assert from "node:assert/strict";
import { command } from "./synth.ts";
import { archOf, openGguf, tensorName } from "../engine/mod.ts";

/** Runs the command, returning its exit code and printed lines. */
async function run(argv: string[]): Promise<{ code: number; out: string }> {
  const lines: string[] = [];
  const [log, error] = [console.log, console.error];
  console.log = console.error = (...a: unknown[]) => lines.push(a.join(" "));
  try {
    return { code: await command.run(argv), out: lines.join("\n") };
  } finally {
    [console.log, console.error] = [log, error];
  }
}

Deno.test("synth CLI writes a valid legacy-layout split model and prints its throughput", async () => {
  const dir = await Deno.makeTempDir({ prefix: "cli_synth_test_" });
  try {
    const out = `${dir}/m.gguf`;
    const r = await run([
      "--arch",
      "qwen3next",
      "--quant",
      "f16",
      "--layout",
      "legacy",
      "--seed",
      "9",
      "--split-parts",
      "2",
      "--out",
      out,
    ]);
    assert.equal(r.code, 0, r.out);
    assert.match(r.out, /DeltaNet layout ssm_in/);
    assert.match(r.out, /wrote .*m-00002-of-00002\.gguf/);
    assert.match(r.out, /of tensor data in [\d.]+ s: \d+ MB\/s/);
    using f = await openGguf(`${dir}/m-00001-of-00002.gguf`);
    const a = archOf(f.metadata);
    const c = a.checkTensors(f, a.readHparams(f.metadata));
    assert.deepEqual(c.layouts, ["ssm_in", "ssm_in", "ssm_in", undefined]);
    assert.equal(f.tensor(tensorName("ssm_in", 0)).type.name, "F16");
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});

Deno.test("synth CLI rejects missing and invalid options with what to use instead", async () => {
  assert.equal((await run(["--arch", "qwen3next"])).code, 2);
  await assert.rejects(
    () => run(["--arch", "llama", "--out", "/tmp/x.gguf"]),
    /--arch llama is not qwen35moe or qwen3next/,
  );
  await assert.rejects(
    () => run(["--arch", "qwen3next", "--quant", "q2_k", "--out", "/tmp/x.gguf"]),
    /--quant q2_k is not one of f32, f16/,
  );
  await assert.rejects(
    () => run(["--arch", "qwen3next", "--split-parts", "0", "--out", "/tmp/x.gguf"]),
    /--split-parts 0 must be an integer >= 1/,
  );
  const help = await run(["--help"]);
  assert.equal(help.code, 0);
  assert.match(help.out, /--preset tiny\|35b-a3b\|80b-a3b/);
});
