/**
 * The dashboard's routes and the head's live view of requests, in process over the fake engine. The page
 * in a real browser against the real engine: tests/dashboard_test.ts.
 */
import assert from "node:assert/strict";
import { type Engine, samplingParams } from "../engine/mod.ts";
import { parseSse, post, testApp } from "./_test_engine.ts";
import { type DashboardSnapshot, HISTORY_BUCKET_MS, HISTORY_BUCKETS, LiveRequests } from "./dashboard.ts";
import { DASHBOARD_JS, dashboardHtml } from "./dashboard_page.ts";

/** Reads SSE frames from a streamed body until `n` have come, then cancels it. */
async function frames(res: Response, n: number): Promise<DashboardSnapshot[]> {
  const reader = res.body!.pipeThrough(new TextDecoderStream()).getReader();
  let text = "";
  while (text.split("\n\n").length - 1 < n) {
    const r = await reader.read();
    if (r.done) break;
    text += r.value;
  }
  await reader.cancel();
  const whole = text.slice(0, text.lastIndexOf("\n\n") + 2);
  return parseSse(whole).map((f) => {
    assert.equal(f.event, "status");
    return JSON.parse(f.data) as DashboardSnapshot;
  });
}

Deno.test("dashboard: the page and its assets are public, the events need the key", async () => {
  const { app } = testApp(() => "hi", { apiKey: "k1" });
  const page = await app.request("/");
  assert.equal(page.status, 200);
  assert.match(page.headers.get("content-type") ?? "", /^text\/html/);
  assert.match(page.headers.get("content-security-policy") ?? "", /script-src 'self'/);
  const html = await page.text();
  assert.match(html, /data-key-required="1"/);
  assert.match(html, /<script src="\/dashboard\/app.js" defer><\/script>/);
  const js = await app.request("/dashboard/app.js");
  assert.equal(js.status, 200);
  assert.match(js.headers.get("content-type") ?? "", /^text\/javascript/);
  assert.equal(await js.text(), DASHBOARD_JS);
  const css = await app.request("/dashboard/app.css");
  assert.match(css.headers.get("content-type") ?? "", /^text\/css/);
  await css.body?.cancel();

  const refused = await app.request("/dashboard/events");
  assert.equal(refused.status, 401);
  assert.match((await refused.json() as { error: { message: string } }).error.message, /Missing API key/);
  const ok = await app.request("/dashboard/events", { headers: { authorization: "Bearer k1" } });
  assert.equal(ok.status, 200);
  assert.match(ok.headers.get("content-type") ?? "", /^text\/event-stream/);
  const [s] = await frames(ok, 1);
  assert.equal(s!.state, "ready");
  assert.equal(s!.model.name, "fake-model");
  assert.deepEqual(s!.slots, { total: 1, busy: 0, queued: 0, perSlot: null });
  assert.equal(s!.history.buckets.length, HISTORY_BUCKETS);
  assert.deepEqual(s!.stages.map((g) => [g.box, g.link, g.wireMs]), [["local", "local", 0]]);
});

Deno.test("dashboard: an open head says so to the page", async () => {
  const { app } = testApp(() => "hi");
  assert.match(await (await app.request("/")).text(), /data-key-required="0"/);
  assert.match(dashboardHtml({ keyRequired: true }), /data-key-required="1"/);
});

Deno.test("dashboard: the script parses and builds no markup from strings", () => {
  // Parsing only: a syntax error would leave the page dead in every browser.
  new Function(DASHBOARD_JS);
  for (const sink of ["innerHTML", "outerHTML", "insertAdjacentHTML", "document.write", "eval(", "srcdoc"]) {
    assert.ok(
      !DASHBOARD_JS.includes(sink),
      `the dashboard script uses ${sink}: build nodes with textContent`,
    );
  }
});

Deno.test("dashboard: the live view tells queued, prefilling and generating requests apart", async () => {
  let now = 1_000_000;
  const { app, engine } = testApp(() => "abcdefghijklmnopqrstuvwxyz", { nSlots: 1, queueSize: 2, batch: 2 });
  const live = new LiveRequests(engine, { now: () => now });
  let release!: () => void;
  engine.gate = new Promise((r) => release = r);
  const seen: number[] = [];
  const first = live.engine.generate({
    prompt: [1, 2, 3],
    maxTokens: 6,
    sampling: samplingParams({ seed: 1 }),
    stopIds: [],
    onTokens: (ids) => seen.push(...ids),
  });
  const second = live.engine.generate({
    prompt: [4],
    maxTokens: 2,
    sampling: samplingParams({ seed: 1 }),
    stopIds: [],
  });
  await new Promise((r) => setTimeout(r, 5));
  now += 100;
  let s = live.snapshot();
  assert.deepEqual(s.requests.map((r) => [r.phase, r.promptTokens, r.ageMs]), [
    ["prefilling", 3, 100],
    ["queued", 1, 100],
  ]);
  now += 400;
  release();
  const a = await first;
  assert.deepEqual(seen, a.tokens, "the wrapped onTokens still gets every id");
  assert.equal(a.tokens.length, 6);
  await second;
  s = live.snapshot();
  assert.deepEqual(s.requests, [], "finished requests leave the view");
  const bucket = s.history.buckets.at(-1)!;
  assert.equal(bucket.ttftMs, 500, "both first ids came 500 ms after admission");
  assert.equal(bucket.tokPerS, (8 * 1000) / Math.max(now % HISTORY_BUCKET_MS, 1));
  void app;
});

Deno.test("dashboard: a generating request shows its ids and rate; chat through the wrapped engine", async () => {
  const { app, engine } = testApp(() => "hello there", { delayMs: 20, batch: 1 });
  const res = await post(app, "/v1/chat/completions", {
    messages: [{ role: "user", content: "x" }],
    stream: true,
  });
  const ev = await app.request("/dashboard/events");
  // The first event comes at once; wait for one while the answer streams.
  let gen: DashboardSnapshot["requests"][number] | undefined;
  for (let i = 0; i < 50 && gen === undefined; i++) {
    await new Promise((r) => setTimeout(r, 10));
    const snap = await frames(await app.request("/dashboard/events"), 1);
    gen = snap[0]!.requests.find((r) => r.phase === "generating" && r.generatedTokens >= 2);
  }
  await ev.body?.cancel();
  assert.ok(gen !== undefined, "a generating request appears in the live view");
  assert.ok(gen.ttftMs !== null && gen.tokPerS !== null && gen.tokPerS > 0);
  const body = parseSse(await res.text());
  assert.equal(body.at(-1)!.data, "[DONE]");
  assert.equal(engine.results.length, 1);
});

Deno.test("dashboard: stages the engine reports replace the local one", () => {
  const { engine } = testApp(() => "x");
  const stages = [
    { box: "local", layers: [0, 20] as const, stepMs: 2.5, wireMs: 0, link: "local" as const },
    { box: "10.0.0.2:7000", layers: [20, 40] as const, stepMs: 2.4, wireMs: 0.3, link: "up" as const },
  ];
  const split: Engine = {
    status: () => ({ ...engine.status(), stages }),
    generate: (r) => engine.generate(r),
    close: () => engine.close(),
  };
  const live = new LiveRequests(split);
  assert.deepEqual(live.snapshot().stages, stages);
  assert.deepEqual(new LiveRequests(engine).snapshot().stages.map((s) => s.box), ["local"]);
});
