/**
 * The `head` command as a process: serves the embedded default model, then on SIGTERM answers new work
 * with 503 while the in-flight stream finishes cleanly, and exits 0.
 */
import assert from "node:assert/strict";

const DENO = Deno.execPath();

Deno.test("head: serves, and on SIGTERM finishes the in-flight stream and exits 0", async () => {
  const script = `import { command } from "./cli/head.ts"; Deno.exit(await command.run(Deno.args));`;
  const child = new Deno.Command(DENO, {
    args: ["eval", "--config", "deno.json", script, "--", "--port", "0", "--ctx", "128", "--slots", "2"],
    cwd: new URL("..", import.meta.url).pathname,
    stdout: "null",
    stderr: "piped",
    env: { XDG_RUNTIME_DIR: "/tmp" },
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
      const { done, value } = await lines.read();
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
    const base = `http://127.0.0.1:${port}`;
    assert.equal((await (await fetch(`${base}/health`)).json()).status, "ok");
    const r = await fetch(`${base}/completion`, {
      method: "POST",
      body: JSON.stringify({ prompt: "Hello", n_predict: 100, stream: true }),
    });
    const reader = r.body!.pipeThrough(new TextDecoderStream()).getReader();
    let body = (await reader.read()).value ?? "";
    child.kill("SIGTERM");
    await waitFor(/Shutting down: new requests get 503; 1 running and 0 queued/);
    const refused = await fetch(`${base}/v1/messages`, {
      method: "POST",
      body: JSON.stringify({ max_tokens: 2, messages: [{ role: "user", content: "hi" }] }),
    });
    assert.equal(refused.status, 503, "a new request while draining");
    assert.match((await refused.json()).error.message, /^Server is shutting down/);
    assert.equal(
      (await (await fetch(`${base}/health`)).json()).status,
      "ok",
      "health answers while draining",
    );
    for (;;) {
      const { done, value } = await reader.read();
      if (done) break;
      body += value;
    }
    assert.ok(body.trimEnd().endsWith("}"), body);
    assert.equal(
      JSON.parse(body.trimEnd().split("\n").at(-1)!.slice(6)).stop,
      true,
      "the stream ended cleanly",
    );
    const status = await child.status;
    assert.equal(status.code, 0, log.join("\n"));
    await waitFor(/^Stopped$/);
  } finally {
    if (!exited) child.kill("SIGKILL");
    await lines.cancel();
  }
});
