import assert from "node:assert/strict";
import { ApiError } from "./errors.ts";
import { SseStream, streamResponse } from "./sse.ts";
import { parseSse } from "./_test_engine.ts";

Deno.test("sse: frames are event + one data line; strings verbatim; nothing after close", async () => {
  const s = new SseStream("anthropic", { requestId: "req_1" });
  assert.equal(s.send("message_start", { text: "line1\nline2\r\u2028" }), true);
  s.send(undefined, "[DONE]");
  s.close();
  assert.equal(s.send("ping", {}), false);
  s.close();
  const body = await s.response.text();
  assert.equal(body, 'event: message_start\ndata: {"text":"line1\\nline2\\r\u2028"}\n\ndata: [DONE]\n\n');
  assert.equal(parseSse(body).length, 2);
  assert.equal(s.response.headers.get("content-type"), "text/event-stream; charset=utf-8");
  assert.equal(s.response.headers.get("request-id"), "req_1");
  const t = new SseStream("openai", { requestId: "r" });
  assert.throws(() => t.send("Bad Name", {}), /SSE event name "Bad Name" is not \[a-z_\]\+/);
  assert.throws(() => t.send(undefined, "a\nb"), /raw SSE data holds a line break/);
  t.close();
});

Deno.test("sse: an error after the first frame becomes the dialect's error event and ends the stream", async () => {
  for (const dialect of ["anthropic", "openai"] as const) {
    const res = await streamResponse(dialect, { requestId: "req_9" }, (sse) => {
      sse.send(dialect === "anthropic" ? "message_start" : undefined, { n: 1 });
      return Promise.reject(new ApiError("overloaded", "Engine went away"));
    });
    assert.equal(res.status, 200);
    const frames = parseSse(await res.text());
    assert.equal(frames.length, 2);
    const last = frames[1]!;
    const body = JSON.parse(last.data);
    if (dialect === "anthropic") {
      assert.equal(last.event, "error");
      assert.deepEqual(body, {
        type: "error",
        error: { type: "overloaded_error", message: "Engine went away" },
        request_id: "req_9",
      });
    } else {
      assert.equal(last.event, undefined);
      assert.deepEqual(body, {
        error: { message: "Engine went away", type: "server_error", param: null, code: "overloaded" },
      });
    }
  }
});

Deno.test("sse: a failure before the first frame is a plain JSON error response with its status", async () => {
  const res = await streamResponse(
    "openai",
    { requestId: "r" },
    () => Promise.reject(new ApiError("overloaded", "Queue full", { retryAfterSeconds: 2.2 })),
  );
  assert.equal(res.status, 503);
  assert.equal(res.headers.get("retry-after"), "3");
  assert.equal(res.headers.get("content-type"), "application/json");
  assert.equal((await res.json()).error.message, "Queue full");
});

Deno.test("sse: cancelling the body (client gone) or the request signal aborts the stream's signal", async () => {
  const s = new SseStream("openai", { requestId: "r" });
  s.send(undefined, { a: 1 });
  const reader = s.response.body!.getReader();
  await reader.read();
  assert.equal(s.signal.aborted, false);
  await reader.cancel();
  assert.equal(s.signal.aborted, true);
  assert.equal(s.closed, true);
  assert.equal(s.send(undefined, { a: 2 }), false);
  const ac = new AbortController();
  const t = new SseStream("openai", { requestId: "r", requestSignal: ac.signal });
  ac.abort();
  assert.equal(t.signal.aborted, true);
});
