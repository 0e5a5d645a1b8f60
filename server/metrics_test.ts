import assert from "node:assert/strict";
import { post, testApp } from "./_test_engine.ts";
import { Metrics } from "./metrics.ts";
import type { EngineStatus } from "../engine/mod.ts";

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
  // The request that generated: its queue time, prefill and batch size seen (the fake engine runs alone: 1).
  assert.equal(value("llm_queue_seconds_count"), 1);
  assert.ok(value("llm_queue_seconds_sum") >= 0);
  assert.equal(value("llm_prefilled_tokens_total"), 3);
  assert.ok(value("llm_prefill_seconds_total") > 0);
  assert.equal(value("llm_batch_size_count"), 1);
  assert.equal(value("llm_batch_size_sum"), 1);
  for (const line of text.trimEnd().split("\n")) {
    assert.match(line, /^(# (HELP|TYPE) llm_[a-z_]+ .+|llm_[a-z_]+(\{[^}]*\})? [0-9.e+-]+)$/, line);
  }
});

Deno.test("metrics: a split head's per-stage compute, wire, runs, up and draft series", () => {
  const times = (count: number, totalMs: number) => ({
    count,
    totalMs,
    lastMs: 1,
    recentMs: totalMs / count,
  });
  const status: EngineStatus = {
    state: "ready",
    loadedBytes: 1,
    totalBytes: 1,
    model: "m",
    arch: "qwen35moe",
    nCtx: 64,
    nSlots: 1,
    busySlots: 0,
    queued: 0,
    counters: {
      requests: 0,
      promptTokens: 0,
      generatedTokens: 0,
      prefixHits: 0,
      cachedTokens: 0,
      batchedTokens: 0,
    },
    stages: [
      { box: "head", layers: [0, 2], stepMs: 4, wireMs: 0, link: "local", compute: times(4, 16) },
      {
        box: 'evil"box\\\n',
        layers: [2, 4],
        stepMs: 3,
        wireMs: 0.5,
        link: "down",
        compute: times(4, 12),
        wire: times(4, 2),
        error: "closed",
      },
    ],
    drafts: { frames: 3, proposed: 9, accepted: 4 },
  };
  const text = new Metrics().render(status);
  const l0 = 'stage="0",box="head",layers="0:2"';
  const l1 = 'stage="1",box="evil\\"box\\\\\\n",layers="2:4"';
  for (
    const line of [
      `llm_stage_compute_seconds_total{${l0}} 0.016`,
      `llm_stage_compute_seconds_total{${l1}} 0.012`,
      `llm_stage_runs_total{${l1}} 4`,
      `llm_stage_wire_seconds_total{${l1}} 0.002`,
      `llm_stage_step_seconds{${l0}} 0.004`,
      `llm_stage_wire_step_seconds{${l1}} 0.0005`,
      `llm_stage_up{${l0}} 1`,
      `llm_stage_up{${l1}} 0`,
      "llm_draft_frames_total 3",
      "llm_draft_tokens_proposed_total 9",
      "llm_draft_tokens_accepted_total 4",
    ]
  ) assert.ok(text.split("\n").includes(line), `${line} missing in\n${text}`);
  assert.ok(!text.includes(`llm_stage_wire_seconds_total{${l0}}`), "the head's own range has no wire series");
  // Without stages (an unsplit engine) no stage series at all.
  const plain = new Metrics().render({ ...status, stages: undefined, drafts: undefined });
  assert.doesNotMatch(plain, /llm_stage_|llm_draft_|llm_gpu_pipelines/);
  // An engine that reports its compiled pipelines gets the gauge.
  const piped = new Metrics().render({
    ...status,
    pipelines: 79,
    readbacks: { early: 40, awaited: 3, fellBack: 0 },
  });
  for (
    const line of [
      "llm_gpu_pipelines 79",
      'llm_gpu_readbacks_total{path="early"} 40',
      'llm_gpu_readbacks_total{path="awaited"} 3',
      'llm_gpu_readbacks_total{path="fellback"} 0',
    ]
  ) assert.ok(piped.split("\n").includes(line), `${line} missing in\n${piped}`);
  assert.doesNotMatch(plain, /llm_gpu_readbacks/);
});
