/**
 * Inputs that used to hang or run away: a FIFO, a device or a folder as the model of head, inspect,
 * generate and tokenize is refused before it is opened (opening a FIFO blocks until a writer comes);
 * `synth --split-parts` above the tensor count is refused.
 */
import assert from "node:assert/strict";
import type { Command } from "./command.ts";
import { command as generate } from "./generate.ts";
import { command as head } from "./head.ts";
import { command as inspect } from "./inspect.ts";
import { command as synth } from "./synth.ts";
import { command as tokenize } from "./tokenize.ts";

/** Runs a command and returns what it threw; fails after `ms` (the bug this guards against is a hang). */
async function thrown(cmd: Command, argv: string[], ms = 5000): Promise<Error> {
  let timer: ReturnType<typeof setTimeout> | undefined;
  const timeout = new Promise<never>((_, reject) => {
    timer = setTimeout(() => reject(new Error(`${argv.join(" ")} still running after ${ms} ms`)), ms);
  });
  try {
    await Promise.race([cmd.run(argv), timeout]);
  } catch (e) {
    return e as Error;
  } finally {
    clearTimeout(timer);
  }
  throw new Error(`${argv.join(" ")} did not fail`);
}

Deno.test("hangs: a FIFO, a device or a folder as --model is refused at once, naming what it is", async () => {
  const dir = await Deno.makeTempDir({ prefix: "hangs_test_" });
  const fifo = `${dir}/model.gguf`;
  try {
    const mk = await new Deno.Command("mkfifo", { args: [fifo] }).output();
    assert.ok(mk.success, "mkfifo");
    const cases: [string, Command, (m: string) => string[]][] = [
      ["inspect", inspect, (m) => [m]],
      ["tokenize", tokenize, (m) => ["--model", m, "--text", "hi"]],
      ["generate", generate, (m) => ["--model", m, "--prompt", "hi", "--n", "1"]],
      ["head", head, (m) => ["--model", m, "--port", "0"]],
    ];
    for (const [name, cmd, argv] of cases) {
      for (
        const [path, what] of [[fifo, "a FIFO \\(named pipe\\)"], ["/dev/zero", "a device file"], [
          dir,
          "a folder",
        ]] as const
      ) {
        const e = await thrown(cmd, argv(path));
        assert.match(
          e.message,
          new RegExp(`^GGUF path ${path} is ${what}, not a regular file: pass the .gguf file itself`),
          `${name} ${path}`,
        );
      }
    }
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});

Deno.test("hangs: synth --split-parts above the tensor count is refused with the count", async () => {
  const e = await thrown(synth, [
    "--arch",
    "qwen35moe",
    "--out",
    "/nonexistent/x.gguf",
    "--split-parts",
    "1000",
  ]);
  assert.match(
    e.message,
    /^--split-parts 1000 is more than the model's \d+ tensors: every split part holds at least one tensor, so give at most \d+$/,
  );
});
