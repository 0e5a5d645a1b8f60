/**
 * The head logs a long prompt's prefill progress (issue #24), as a process: with `LLM_PROGRESS_MS` lowering
 * the one-second threshold and interval, and `--chunk 8` making the runner prefill the prompt in pieces, the
 * log shows `prefill slot=0 prompt_tokens=N/240` lines with a growing N before the request's own line.
 */
import assert from "node:assert/strict";

const ROOT = new URL("..", import.meta.url).pathname;
/** Longest wait for one expected log line (loading and warm-up on a busy lavapipe included). */
const WAIT_MS = 120_000;
const PROMPT = Array.from({ length: 240 }, (_, i) => (i * 37 + 5) % 1000);

Deno.test("head: a long prompt's prefill progress is logged per slot while it runs", async () => {
  const child = new Deno.Command(Deno.execPath(), {
    args: ["run", "-A", "mod.ts", "head", "--port", "0", "--ctx", "256", "--slots", "1", "--chunk", "8"],
    cwd: ROOT,
    stdout: "null",
    stderr: "piped",
    env: { XDG_RUNTIME_DIR: "/tmp", NO_COLOR: "1", LLM_PROGRESS_MS: "1" },
  }).spawn();
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
    await waitFor(/ready: 1 slots of 256 positions/);
    assert.deepEqual(log.filter((l) => l.startsWith("prefill ")), [], "no progress lines before a request");
    const r = await fetch(`http://127.0.0.1:${port}/completion`, {
      method: "POST",
      headers: { "content-type": "application/json", "x-request-id": "prefill-log-test" },
      body: JSON.stringify({ prompt: PROMPT, n_predict: 1 }),
    });
    const body = await r.json();
    assert.equal(r.status, 200, JSON.stringify(body));
    await waitFor(/^POST \/completion 200 .*id=prefill-log-test$/);
    const held = log.flatMap((l) => {
      const m = /^prefill slot=0 prompt_tokens=(\d+)\/240 tok_s=([\d.]+|-) elapsed_ms=\d+$/.exec(l);
      return m ? [Number(m[1])] : [];
    });
    assert.ok(new Set(held).size >= 2, `expected growing progress lines:\n${log.join("\n")}`);
    assert.ok(held.every((n, i) => n <= 240 && (i === 0 || n >= held[i - 1]!)), held.join(" "));
    child.kill("SIGTERM");
    assert.equal((await child.status).code, 0, log.join("\n"));
  } finally {
    if (!exited) child.kill("SIGKILL");
    await lines.cancel();
  }
});
