import assert from "node:assert/strict";
import { post, testApp } from "./_test_engine.ts";

// deno-lint-ignore no-explicit-any
type Loose = any;

Deno.test("auth: /health is public; every other path needs the key in either header form", async () => {
  const { app } = testApp(() => "x", { apiKey: "k1" });
  assert.equal((await app.request("/health")).status, 200);
  for (const path of ["/v1/models", "/metrics"]) {
    const r = await app.request(path);
    assert.equal(r.status, 401, path);
    assert.match((await r.json() as Loose).error.message, /Missing API key/);
    assert.equal((await app.request(path, { headers: { "x-api-key": "k1" } })).status, 200);
    assert.equal((await app.request(path, { headers: { authorization: "Bearer k1" } })).status, 200);
    assert.equal((await app.request(path, { headers: { authorization: "Bearer k12" } })).status, 401);
    assert.equal((await app.request(path, { headers: { "x-api-key": "" } })).status, 401);
  }
  const r = await post(app, "/v1/messages", {});
  const j: Loose = await r.json();
  assert.equal(j.type, "error", "Anthropic shape on /v1/messages");
  assert.equal(j.error.type, "authentication_error");
});
