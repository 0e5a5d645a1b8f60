/**
 * The head's request log (request_log.ts) through the app in process, over the fake engine: one line per
 * request with the generation's numbers, written when a stream ends (not when its headers go out), 499 and
 * `finish=cancelled` for a client that went away, plain lines for other routes and refusals, nothing for
 * `/health` and `/metrics`, and nothing at all when the log is off.
 * @module
 */
import assert from "node:assert/strict";
import { parseSse, post, testApp } from "./_test_engine.ts";

const MSG = { model: "m", max_tokens: 64, messages: [{ role: "user", content: "Hi" }] };
const GEN_LINE = new RegExp(
  "^POST /v1/messages 200 queue_ms=\\d+ ttft_ms=\\d+ prompt_tokens=(\\d+) cached_tokens=0 " +
    "prefill_tok_s=[\\d.]+ gen_tokens=(\\d+) decode_tok_s=[\\d.]+ batch=1\\.0 finish=eos total_ms=\\d+ id=req_\\w+$",
);

/** Waits for the lines a settled generation writes (one microtask hop after the response). */
async function settle(): Promise<void> {
  await new Promise((r) => setTimeout(r, 20));
}

Deno.test("request log: a non-streamed generation's line has every number and its finish reason", async () => {
  const lines: string[] = [];
  const { app, engine } = testApp(() => "Hello there, friend", {
    delayMs: 5,
    requestLog: (l) => lines.push(l),
  });
  const r = await post(app, "/v1/messages", MSG);
  const body = await r.json();
  await settle();
  assert.equal(lines.length, 1, lines.join("\n"));
  const m = GEN_LINE.exec(lines[0]!);
  assert.ok(m, lines[0]);
  assert.equal(Number(m[1]), engine.requests[0]!.prompt.length);
  assert.equal(Number(m[2]), body.usage.output_tokens);
  assert.ok(lines[0]!.endsWith(`id=${r.headers.get("request-id")}`), lines[0]);
});

Deno.test("request log: a stream's line comes when its generation ends, with the stream's usage", async () => {
  const lines: string[] = [];
  const { app, engine } = testApp(() => "A streamed answer of some length", {
    delayMs: 5,
    requestLog: (l) => lines.push(l),
  });
  let release!: () => void;
  engine.gate = new Promise<void>((r) => release = r);
  const res = post(app, "/v1/chat/completions", {
    model: "m",
    stream: true,
    stream_options: { include_usage: true },
    messages: [{ role: "user", content: "Hi" }],
  });
  await settle();
  assert.deepEqual(lines, [], "nothing logged before the generation ends");
  release();
  const frames = parseSse(await (await res).text());
  await settle();
  assert.equal(lines.length, 1, lines.join("\n"));
  const usage = JSON.parse(frames.at(-2)!.data).usage;
  assert.match(
    lines[0]!,
    new RegExp(
      `^POST /v1/chat/completions 200 queue_ms=\\d+ ttft_ms=\\d+ prompt_tokens=${usage.prompt_tokens} ` +
        `cached_tokens=0 prefill_tok_s=[\\d.]+ gen_tokens=${usage.completion_tokens} decode_tok_s=[\\d.]+ ` +
        "batch=1\\.0 finish=eos total_ms=\\d+ id=",
    ),
  );
});

Deno.test("request log: a client that goes away mid-stream is 499 finish=cancelled, with no stack trace", async () => {
  const lines: string[] = [];
  const errors: unknown[] = [];
  const origError = console.error;
  console.error = (...a: unknown[]) => errors.push(a);
  try {
    const { app } = testApp(() => "x".repeat(400), { delayMs: 5, requestLog: (l) => lines.push(l) });
    const abort = new AbortController();
    const res = await app.request("/completion", {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify({ prompt: "Hi", n_predict: 300, stream: true }),
      signal: abort.signal,
    });
    const reader = res.body!.getReader();
    await reader.read();
    abort.abort(new DOMException("Client closed the connection", "AbortError"));
    await reader.cancel();
    for (let i = 0; i < 100 && lines.length === 0; i++) await settle();
    assert.equal(lines.length, 1, lines.join("\n"));
    assert.match(
      lines[0]!,
      /^POST \/completion 499 queue_ms=\d+ .* finish=cancelled total_ms=\d+ id=req_\w+$/,
    );
    assert.deepEqual(errors, [], "nothing else printed");
  } finally {
    console.error = origError;
  }
});

Deno.test("request log: other routes and refusals get a plain line; /health and /metrics none; off by default", async () => {
  const lines: string[] = [];
  const { app } = testApp(() => "ok", { requestLog: (l) => lines.push(l) });
  await app.request("/v1/models");
  await app.request("/health");
  await app.request("/metrics");
  await post(app, "/v1/messages", { model: "m", messages: "not a list" });
  await settle();
  assert.equal(lines.length, 2, lines.join("\n"));
  assert.match(lines[0]!, /^GET \/v1\/models 200 total_ms=\d+ id=req_\w+$/);
  assert.match(lines[1]!, /^POST \/v1\/messages 400 total_ms=\d+ id=req_\w+$/);

  const quiet = testApp(() => "ok");
  const errors: unknown[] = [];
  const origError = console.error;
  console.error = (...a: unknown[]) => errors.push(a);
  try {
    await (await post(quiet.app, "/v1/messages", MSG)).json();
    await settle();
  } finally {
    console.error = origError;
  }
  assert.deepEqual(errors, []);
});

Deno.test("request log: a full queue's refusal is logged with its status and finish=error", async () => {
  const lines: string[] = [];
  const { app, engine } = testApp(() => "ok", { nSlots: 1, queueSize: 0, requestLog: (l) => lines.push(l) });
  let release!: () => void;
  engine.gate = new Promise<void>((r) => release = r);
  const first = post(app, "/v1/messages", MSG);
  await settle();
  const refused = await post(app, "/v1/messages", MSG);
  assert.equal(refused.status, 503);
  await refused.body?.cancel();
  release();
  await (await first).json();
  await settle();
  assert.equal(lines.length, 2, lines.join("\n"));
  assert.match(lines[0]!, /^POST \/v1\/messages 503 finish=error total_ms=\d+ id=req_\w+$/);
  assert.match(lines[1]!, /^POST \/v1\/messages 200 queue_ms=\d+ ttft_ms=\d+ .* finish=eos total_ms=/);
});
