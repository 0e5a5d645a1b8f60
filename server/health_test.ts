import assert from "node:assert/strict";
import { testApp } from "./_test_engine.ts";

Deno.test("health: loading with progress (503), ok with slots (200), error after a failed load (500)", async () => {
  const { app, engine } = testApp(() => "x", { state: "loading", nSlots: 3 });
  let r = await app.request("/health");
  assert.equal(r.status, 503);
  assert.deepEqual(await r.json(), {
    status: "loading",
    progress: 0.25,
    loaded_bytes: 250,
    total_bytes: 1000,
  });
  engine.state = "ready";
  r = await app.request("/health");
  assert.equal(r.status, 200);
  assert.deepEqual(await r.json(), {
    status: "ok",
    model: "fake-model",
    slots_idle: 3,
    slots_processing: 0,
    queued: 0,
  });
  engine.state = "failed";
  r = await app.request("/health");
  assert.equal(r.status, 500);
  assert.equal((await r.json()).status, "error");
});
