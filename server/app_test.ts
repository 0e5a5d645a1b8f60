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
