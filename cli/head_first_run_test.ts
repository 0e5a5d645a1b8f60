/**
 * A new user's first run of `head` as a process (issue #22): a busy port is refused with a message that
 * says what to do and leaves no temporary folder behind; a served head builds its GPU pipelines before it
 * says ready, and logs one line per request with its numbers.
 */
import assert from "node:assert/strict";

const DENO = Deno.execPath();
const ROOT = new URL("..", import.meta.url).pathname;
/** Longest wait for one expected log line (loading and warm-up on a busy lavapipe included). */
const WAIT_MS = 120_000;

function head(args: string[]): Deno.ChildProcess {
  return new Deno.Command(DENO, {
    args: ["run", "-A", "mod.ts", "head", ...args],
    cwd: ROOT,
    stdout: "null",
    stderr: "piped",
    env: { XDG_RUNTIME_DIR: "/tmp", NO_COLOR: "1" },
  }).spawn();
}

/** The default model's temporary folder, from the line that names it. */
function tempDirOf(log: string): string {
  const m = /embedded default, a tiny synthetic qwen35moe \((\/.*)\/tiny-qwen35moe\.gguf\)/.exec(log);
  assert.ok(m, `no default-model line in:\n${log}`);
  return m[1]!;
}

async function exists(path: string): Promise<boolean> {
  try {
    await Deno.stat(path);
    return true;
  } catch (e) {
    if (e instanceof Deno.errors.NotFound) return false;
    throw e;
  }
}

Deno.test("head: a port in use is refused with what to do, and the default model's temp folder is removed", async () => {
  using taken = Deno.listen({ hostname: "127.0.0.1", port: 0 });
  const port = (taken.addr as Deno.NetAddr).port;
  const out = await head(["--port", String(port), "--ctx", "64", "--slots", "1"]).output();
  const log = new TextDecoder().decode(out.stderr);
  assert.equal(out.code, 1, log);
  assert.match(log, new RegExp(`error: Port ${port} on 127\\.0\\.0\\.1 is already in use .*--port`));
  assert.doesNotMatch(log, /^\s+at /m, "no stack trace");
  const dir = tempDirOf(log);
  assert.equal(await exists(dir), false, `${dir} was left behind`);
});

Deno.test("head: pipelines built before ready; one log line per request; the temp folder goes at exit", async () => {
  const child = head(["--port", "0", "--ctx", "128", "--slots", "2"]);
  let exited = false;
  void child.status.then(() => exited = true);
  const log: string[] = [];
  const lines = child.stderr.pipeThrough(new TextDecoderStream()).getReader();
  let pending = "";
  const waitFor = async (re: RegExp): Promise<RegExpExecArray> => {
    for (;;) {
      for (const l of log) {
        const m = re.exec(l);
        if (m) return m;
      }
      let timer: ReturnType<typeof setTimeout> | undefined;
      const late = new Promise<never>((_, reject) => {
        timer = setTimeout(
          () => reject(new Error(`No line ${re} within ${WAIT_MS} ms:\n${log.join("\n")}`)),
          WAIT_MS,
        );
      });
      const { done, value } = await Promise.race([lines.read(), late]).finally(() => clearTimeout(timer));
      if (done) throw new Error(`head exited before printing ${re}:\n${log.join("\n")}`);
      pending += value;
      const parts = pending.split("\n");
      pending = parts.pop()!;
      log.push(...parts);
    }
  };
  try {
    const port = Number((await waitFor(/Listening on http:\/\/127\.0\.0\.1:(\d+)/))[1]);
    await waitFor(/ready: 2 slots of 128 positions/);
    const built = log.findIndex((l) => /^GPU pipelines built in [\d.]+ s$/.test(l));
    assert.ok(built >= 0 && built < log.findIndex((l) => /ready: 2 slots/.test(l)), log.join("\n"));
    const r = await fetch(`http://127.0.0.1:${port}/v1/messages`, {
      method: "POST",
      headers: { "content-type": "application/json", "x-request-id": "first-run-test" },
      body: JSON.stringify({ model: "m", max_tokens: 12, messages: [{ role: "user", content: "Hello" }] }),
    });
    const body = await r.json();
    assert.equal(r.status, 200, JSON.stringify(body));
    const m = await waitFor(
      /^POST \/v1\/messages 200 queue_ms=\d+ ttft_ms=\d+ prompt_tokens=(\d+) cached_tokens=0 prefill_tok_s=[\d.]+ gen_tokens=(\d+) decode_tok_s=([\d.]+|-) batch=1\.0 finish=(\w+) total_ms=\d+ id=first-run-test$/,
    );
    assert.equal(Number(m[1]), body.usage.input_tokens);
    assert.equal(Number(m[2]), body.usage.output_tokens);
    const dir = tempDirOf(log.join("\n"));
    child.kill("SIGTERM");
    // The last lines come with the exit: a crash while exiting shows after them.
    for (let r = await lines.read(); !r.done; r = await lines.read()) pending += r.value;
    log.push(...pending.split("\n").filter((l) => l !== ""));
    assert.equal((await child.status).code, 0, log.join("\n"));
    assert.equal(log.at(-1), "Stopped", log.join("\n"));
    assert.equal(await exists(dir), false, `${dir} was left behind`);
  } finally {
    if (!exited) child.kill("SIGKILL");
    await lines.cancel();
  }
});
