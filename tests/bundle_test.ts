/**
 * The single-file bundle (`deno task bundle`, tools/bundle.ts) as a user runs it: built from this checkout
 * into a fresh folder and run from there, with reads of the checkout denied, so every kernel, template, the
 * engine's Worker module and the npm packages must come from the bundle itself. It prints its embedded
 * build, serves the embedded default model, answers a request and stops cleanly on SIGTERM.
 */
import assert from "node:assert/strict";
import { buildBundle, bundledPackages } from "../tools/bundle.ts";
import { denortTarget } from "../tools/compile.ts";
import { VERSION } from "../version.ts";
import { PROTOCOL_VERSION } from "../wire/mod.ts";

const DENO = Deno.execPath();
const ROOT = new URL("..", import.meta.url).pathname.replace(/\/$/, "");
/** The whole test (build, start, one request, stop) must finish within this. */
const DEADLINE_MS = 120_000;

Deno.test("bundle: out/llm.js, installed by deploy/install.sh, runs head from outside the checkout", async () => {
  const dir = await Deno.makeTempDir({ prefix: "llm_bundle_test_" });
  const deadline = AbortSignal.timeout(DEADLINE_MS);
  try {
    await buildBundle(`${dir}/build/llm.js`, { commit: "0123456789ab" });
    // Installed as a user would: deno and the bundle under PREFIX/lib/llm, the `llm` command in PREFIX/bin.
    const install = await new Deno.Command("sh", {
      args: [`${ROOT}/deploy/install.sh`, "--prefix", dir, "--deno", DENO, "--bundle", `${dir}/build/llm.js`],
      stdout: "piped",
      stderr: "piped",
    }).output();
    assert.equal(install.code, 0, new TextDecoder().decode(install.stderr));
    await Deno.remove(`${dir}/build`, { recursive: true });
    const bundle = `${dir}/lib/llm/llm.js`;
    // The checkout stays unreadable to the bundle: a kernel or template read from source would fail.
    const run = ["run", "-A", `--deny-read=${ROOT}`, bundle];

    const v = await new Deno.Command(`${dir}/bin/llm`, { args: ["--version"], cwd: dir, stdout: "piped" })
      .output();
    assert.equal(v.code, 0);
    assert.equal(
      new TextDecoder().decode(v.stdout),
      `llm ${VERSION} (commit 0123456789ab, wire protocol ${PROTOCOL_VERSION})\n`,
    );

    const child = new Deno.Command(DENO, {
      args: [...run, "head", "--port", "0", "--ctx", "128", "--slots", "1"],
      cwd: dir,
      stdout: "null",
      stderr: "piped",
      env: { XDG_RUNTIME_DIR: "/tmp", NO_COLOR: "1" },
    }).spawn();
    let exited = false;
    void child.status.then(() => exited = true);
    const kill = () => exited || child.kill("SIGKILL");
    deadline.addEventListener("abort", kill);
    const log: string[] = [];
    const lines = child.stderr.pipeThrough(new TextDecoderStream()).getReader();
    let pending = "";
    const waitFor = async (re: RegExp): Promise<RegExpExecArray> => {
      for (;;) {
        for (const l of log) {
          const m = re.exec(l);
          if (m) return m;
        }
        const { done, value } = await lines.read();
        if (done) {
          throw new Error(`The bundled head exited before printing ${re}:\n${log.join("\n")}\n${pending}`);
        }
        pending += value;
        const parts = pending.split("\n");
        pending = parts.pop()!;
        log.push(...parts);
      }
    };
    try {
      const port = Number((await waitFor(/Listening on http:\/\/127\.0\.0\.1:(\d+)/))[1]);
      await waitFor(/ready: 1 slots of 128 positions/);
      const r = await fetch(`http://127.0.0.1:${port}/v1/messages`, {
        method: "POST",
        headers: { "content-type": "application/json" },
        body: JSON.stringify({ model: "m", max_tokens: 4, messages: [{ role: "user", content: "Hello" }] }),
        signal: deadline,
      });
      const body = await r.json();
      assert.equal(r.status, 200, JSON.stringify(body));
      assert.equal(body.type, "message");
      assert.equal(body.content[0].type, "text");
      assert.equal(body.usage.output_tokens, 4);
      assert.equal(body.stop_reason, "max_tokens");
      child.kill("SIGTERM");
      await waitFor(/^Stopped$/);
      assert.equal((await child.status).code, 0, log.join("\n"));
    } finally {
      deadline.removeEventListener("abort", kill);
      if (!exited) child.kill("SIGKILL");
      await child.status;
      await lines.cancel();
    }
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});

Deno.test("bundle: any npm package but hono and @huggingface/jinja is found in the bundle text", () => {
  const text = [
    "// ../../root/.cache/deno/npm/registry.npmjs.org/hono/4.13.19/dist/index.js",
    "// ../../root/.cache/deno/npm/registry.npmjs.org/@anthropic-ai/sdk/1.10.0/index.mjs",
    "// node_modules/.deno/openai@7.55.0/node_modules/openai/index.mjs",
    "const s = '// not a path';",
  ].join("\n");
  assert.deepEqual(bundledPackages(text), ["@anthropic-ai/sdk", "hono", "openai"]);
});

Deno.test("compile: without DENORT_BIN it stops and says what it needs; a non-denort DENORT_BIN is refused", async () => {
  const compile = (env: Record<string, string>) =>
    new Deno.Command(DENO, {
      args: ["run", "-A", `${ROOT}/tools/compile.ts`, "--out-dir", "/nonexistent/out"],
      env: { NO_COLOR: "1", ...env },
      stdout: "piped",
      stderr: "piped",
    }).output();
  const missing = await compile({ DENORT_BIN: "" });
  assert.equal(missing.code, 2);
  const err = new TextDecoder().decode(missing.stderr);
  assert.match(err, /^error: deno compile needs denort, Deno [\d.]+'s runtime binary/);
  assert.match(err, /DENORT_BIN=\/path\/to\/denort deno task compile/);
  const text = await compile({ DENORT_BIN: new URL(import.meta.url).pathname });
  assert.equal(text.code, 2);
  assert.match(new TextDecoder().decode(text.stderr), /is not a denort binary/);
});

Deno.test("compile: denort's target is read from its ELF or Mach-O header", () => {
  const elf = (machine: number) => {
    const b = new Uint8Array(64);
    b.set([0x7f, 0x45, 0x4c, 0x46, 2, 1]);
    new DataView(b.buffer).setUint16(18, machine, true);
    return b;
  };
  assert.equal(denortTarget(elf(62)), "x86_64-unknown-linux-gnu");
  assert.equal(denortTarget(elf(183)), "aarch64-unknown-linux-gnu");
  assert.equal(denortTarget(elf(40)), undefined);
  const macho = new Uint8Array(64);
  new DataView(macho.buffer).setUint32(0, 0xfeedfacf, true);
  new DataView(macho.buffer).setUint32(4, 0x0100000c, true);
  assert.equal(denortTarget(macho), "aarch64-apple-darwin");
  assert.equal(denortTarget(new TextEncoder().encode("#!/bin/sh\necho not a binary at all\n")), undefined);
});
