import assert from "node:assert/strict";
import { post, testApp } from "./_test_engine.ts";

Deno.test("metrics: request, token and TTFT counters and engine gauges in Prometheus text", async () => {
  const { app } = testApp(() => "abcdef");
  await (await post(app, "/completion", { prompt: "xyz" })).json();
  await (await post(app, "/completion", { prompt: 5 })).json();
  const text = await (await app.request("/metrics")).text();
  const value = (name: string) => {
    const line = text.split("\n").find((l) => l.startsWith(name + " "));
    assert.ok(line, `${name} missing in\n${text}`);
    return Number(line.split(" ")[1]);
  };
  assert.ok(text.includes('llm_http_requests_total{endpoint="/completion",status="200"} 1'), text);
  assert.ok(text.includes('llm_http_requests_total{endpoint="/completion",status="400"} 1'), text);
  assert.equal(value("llm_prompt_tokens_total"), 3);
  assert.equal(value("llm_generated_tokens_total"), 7, "six letters and the end-of-generation id");
  assert.equal(value("llm_time_to_first_token_seconds_count"), 1);
  assert.ok(text.includes('llm_time_to_first_token_seconds_bucket{le="+Inf"} 1'));
  assert.equal(value("llm_queue_depth"), 0);
  assert.equal(value("llm_slots_total"), 1);
  assert.equal(value("llm_engine_requests_total"), 1);
  assert.equal(value("llm_batched_tokens_total"), 0, "one request at a time shares no step");
  for (const line of text.trimEnd().split("\n")) {
    assert.match(line, /^(# (HELP|TYPE) llm_[a-z_]+ .+|llm_[a-z_]+(\{[^}]*\})? [0-9.e+-]+)$/, line);
  }
});
