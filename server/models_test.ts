import assert from "node:assert/strict";
import { testApp } from "./_test_engine.ts";

// deno-lint-ignore no-explicit-any
type Loose = any;

Deno.test("models: one entry readable as an OpenAI and an Anthropic model list", async () => {
  const { app } = testApp(() => "x");
  const j: Loose = await (await app.request("/v1/models")).json();
  assert.equal(j.object, "list");
  assert.equal(j.has_more, false);
  assert.equal(j.data.length, 1);
  const m = j.data[0];
  assert.equal(m.id, "fake-model");
  assert.equal(m.object, "model");
  assert.equal(m.type, "model");
  assert.ok(Number.isInteger(m.created));
  assert.ok(!Number.isNaN(Date.parse(m.created_at)));
});
