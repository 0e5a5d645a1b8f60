import assert from "node:assert/strict";
import { post, testApp } from "./_test_engine.ts";

// deno-lint-ignore no-explicit-any
type Loose = any;

Deno.test("app: unknown routes are 404 in the path's dialect; draining refuses new generations with 503", async () => {
  let draining = false;
  const { app } = testApp(() => "x", { draining: () => draining });
  const r = await app.request("/v1/nothing");
  assert.equal(r.status, 404);
  assert.match((await r.json() as Loose).error.message, /No route GET \/v1\/nothing/);
  draining = true;
  const d = await post(app, "/v1/messages", {
    model: "m",
    max_tokens: 5,
    messages: [{ role: "user", content: "x" }],
  });
  assert.equal(d.status, 503);
  assert.equal(d.headers.get("retry-after"), "5");
  assert.match((await d.json() as Loose).error.message, /Server is shutting down/);
  assert.equal((await app.request("/health")).status, 200, "health still answers while draining");
});

Deno.test("app: every answer carries a request-id; a client's x-request-id is kept", async () => {
  const { app } = testApp(() => "x");
  const a = await app.request("/health");
  assert.match(a.headers.get("request-id") ?? "", /^req_[0-9a-f]{32}$/);
  const b = await post(app, "/v1/messages", { model: "m", max_tokens: 3, messages: "bad" }, {
    "x-request-id": "abc",
  });
  assert.equal(b.status, 400);
  assert.equal(b.headers.get("request-id"), "abc");
  assert.equal((await b.json() as Loose).request_id, "abc");
  const c = await post(app, "/v1/chat/completions", {
    messages: [{ role: "user", content: "x" }],
    stream: true,
  });
  assert.match(c.headers.get("request-id") ?? "", /^req_/);
  await c.body?.cancel();
});
