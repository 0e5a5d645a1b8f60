/**
 * Fields the server does not implement are refused by name, never silently ignored; tool_choice and tool
 * results are checked against the request's tools; wrong methods get 405 with Allow; `/v1/models/{id}`;
 * CORS preflight when enabled.
 */
import assert from "node:assert/strict";
import { post, testApp } from "./_test_engine.ts";
import { parseCorsOrigins } from "./cors.ts";

// deno-lint-ignore no-explicit-any
type Loose = any;

const USER = [{ role: "user", content: "Hi" }];
const TOOL_A = { name: "a", description: "A", input_schema: { type: "object", properties: {} } };
const FN_A = { type: "function", function: { name: "a", parameters: { type: "object" } } };

async function refused(r: Response, re: RegExp, param?: string): Promise<void> {
  const text = await r.text();
  assert.equal(r.status, 400, text);
  const j: Loose = JSON.parse(text);
  const msg = j.error.message as string;
  assert.match(msg, re);
  if (param !== undefined && j.error.param !== undefined) assert.equal(j.error.param, param);
}

Deno.test("refusals: chat completions refuses logprobs, top_logprobs, logit_bias, response_format", async () => {
  const { app, engine } = testApp(() => "x");
  const base = { messages: USER, max_tokens: 2 };
  await refused(
    await post(app, "/v1/chat/completions", { ...base, logprobs: true }),
    /^Field logprobs is not supported yet: .*log-probabilities: leave it out$/,
    "logprobs",
  );
  await refused(
    await post(app, "/v1/chat/completions", { ...base, top_logprobs: 3 }),
    /Field top_logprobs is not supported yet/,
  );
  await refused(
    await post(app, "/v1/chat/completions", { ...base, logit_bias: { "5": 10 } }),
    /Field logit_bias is not supported yet/,
  );
  await refused(
    await post(app, "/v1/chat/completions", { ...base, response_format: { type: "json_object" } }),
    /Field response_format is not supported yet: .*constrained/,
  );
  assert.equal(engine.requests.length, 0);
  // Values that ask for nothing are accepted (clients send them by default).
  for (
    const extra of [{ logprobs: false }, { logit_bias: {} }, { response_format: { type: "text" } }, {
      top_logprobs: null,
    }]
  ) {
    const r = await post(app, "/v1/chat/completions", { ...base, ...extra });
    assert.equal(r.status, 200, `${JSON.stringify(extra)}: ${await r.text()}`);
  }
});

Deno.test("refusals: /completion refuses n_probs, logit_bias, grammar, json_schema", async () => {
  const { app } = testApp(() => "x");
  for (
    const [k, v] of [["n_probs", 5], ["logit_bias", [[1, -100]]], ["grammar", "root ::= x"], ["json_schema", {
      type: "object",
    }]] as const
  ) {
    await refused(
      await post(app, "/completion", { prompt: "a", [k]: v }),
      new RegExp(`^Field ${k} is not supported yet`),
    );
  }
});

Deno.test("refusals: tool_choice names an unknown tool, any/required without tools, duplicate names", async () => {
  const { app } = testApp(() => "x");
  const m = { max_tokens: 2, messages: USER };
  await refused(
    await post(app, "/v1/messages", { ...m, tools: [TOOL_A], tool_choice: { type: "tool", name: "b" } }),
    /^Field tool_choice.name is "b", which is not a declared tool \(declared: a\)/,
  );
  await refused(
    await post(app, "/v1/messages", { ...m, tool_choice: { type: "any" } }),
    /^Field tool_choice asks for a tool call but the request declares no tools/,
  );
  await refused(
    await post(app, "/v1/messages", { ...m, tools: [TOOL_A, TOOL_A] }),
    /^Field tools\[1\].name is "a", a tool name declared earlier/,
  );
  const c = { max_tokens: 2, messages: USER };
  await refused(
    await post(app, "/v1/chat/completions", {
      ...c,
      tools: [FN_A],
      tool_choice: { type: "function", function: { name: "zz" } },
    }),
    /^Field tool_choice.function.name is "zz", which is not a declared tool/,
  );
  await refused(
    await post(app, "/v1/chat/completions", { ...c, tool_choice: "required" }),
    /^Field tool_choice asks for a tool call but the request declares no tools/,
  );
  await refused(
    await post(app, "/v1/chat/completions", { ...c, tools: [FN_A, FN_A] }),
    /^Field tools\[1\].function.name is "a", a tool name declared earlier/,
  );
  const ok = await post(app, "/v1/messages", {
    ...m,
    tools: [TOOL_A],
    tool_choice: { type: "tool", name: "a" },
  });
  assert.equal(ok.status, 200, await ok.text());
});

Deno.test("refusals: a tool result for an id no assistant tool call has", async () => {
  const { app } = testApp(() => "x");
  await refused(
    await post(app, "/v1/messages", {
      max_tokens: 2,
      messages: [
        { role: "user", content: "go" },
        { role: "assistant", content: [{ type: "tool_use", id: "t1", name: "a", input: {} }] },
        { role: "user", content: [{ type: "tool_result", tool_use_id: "t2", content: "r" }] },
      ],
    }),
    /^Field messages\[2\].content\[0\].tool_use_id is "t2", which no earlier assistant tool_use block has/,
  );
  await refused(
    await post(app, "/v1/chat/completions", {
      messages: [
        { role: "user", content: "go" },
        {
          role: "assistant",
          content: null,
          tool_calls: [{ id: "c1", type: "function", function: { name: "a", arguments: "{}" } }],
        },
        { role: "tool", tool_call_id: "c9", content: "r" },
      ],
    }),
    /^Field messages\[2\].tool_call_id is "c9", which no earlier assistant tool call has/,
  );
});

Deno.test("methods: 405 with Allow on known paths, 404 on unknown ones, HEAD on GET routes", async () => {
  const { app } = testApp(() => "x");
  for (
    const [method, path, allow] of [
      ["GET", "/v1/messages", "POST"],
      ["PUT", "/v1/chat/completions", "POST"],
      ["DELETE", "/completion", "POST"],
      ["POST", "/health", "GET, HEAD"],
      ["POST", "/v1/models", "GET, HEAD"],
      ["DELETE", "/v1/models/fake-model", "GET, HEAD"],
      ["OPTIONS", "/v1/messages", "POST"],
    ] as const
  ) {
    const r = await app.request(path, { method });
    assert.equal(r.status, 405, `${method} ${path}`);
    assert.equal(r.headers.get("allow"), allow, `${method} ${path}`);
    const j: Loose = await r.json();
    assert.match(j.error.message, new RegExp(`^Method ${method} is not allowed on ${path}: use `));
  }
  assert.equal((await app.request("/nope", { method: "PUT" })).status, 404);
  const h = await app.request("/health", { method: "HEAD" });
  assert.equal(h.status, 200);
});

Deno.test("models: GET /v1/models/{id} gives the entry, 404 for another id", async () => {
  const { app } = testApp(() => "x");
  const r = await app.request("/v1/models/fake-model");
  assert.equal(r.status, 200);
  const j: Loose = await r.json();
  assert.equal(j.id, "fake-model");
  assert.equal(j.object, "model");
  const n = await app.request("/v1/models/other%2Fmodel");
  assert.equal(n.status, 404);
  assert.match(
    ((await n.json()) as Loose).error.message,
    /^Model "other\/model" is not served here: this server serves "fake-model" only$/,
  );
});

Deno.test("cors: preflight and response headers with --cors; preflight 405 without; other origins 403", async () => {
  const { app } = testApp(() => "x", { corsOrigins: ["https://app.example"], apiKey: "k" });
  const pre = await app.request("/v1/messages", {
    method: "OPTIONS",
    headers: { origin: "https://app.example", "access-control-request-method": "POST" },
  });
  assert.equal(pre.status, 204, "preflight needs no API key");
  assert.equal(pre.headers.get("access-control-allow-origin"), "https://app.example");
  assert.equal(pre.headers.get("access-control-allow-methods"), "POST, OPTIONS");
  assert.match(pre.headers.get("access-control-allow-headers") ?? "", /x-api-key/);
  const r = await post(app, "/v1/messages", { max_tokens: 2, messages: USER }, {
    origin: "https://app.example",
    "x-api-key": "k",
  });
  assert.equal(r.status, 200);
  assert.equal(r.headers.get("access-control-allow-origin"), "https://app.example");
  assert.match(r.headers.get("access-control-expose-headers") ?? "", /request-id/);
  await r.body?.cancel();
  const unauth = await post(app, "/v1/messages", {}, { origin: "https://app.example" });
  assert.equal(unauth.status, 401);
  assert.equal(unauth.headers.get("access-control-allow-origin"), "https://app.example", "errors readable");
  const other = await app.request("/v1/messages", {
    method: "OPTIONS",
    headers: { origin: "https://evil.example", "access-control-request-method": "POST" },
  });
  assert.equal(other.status, 403);
  assert.match(((await other.json()) as Loose).error.message, /Origin https:\/\/evil.example is not allowed/);

  const { app: closed } = testApp(() => "x");
  const no = await closed.request("/v1/messages", {
    method: "OPTIONS",
    headers: { origin: "https://app.example" },
  });
  assert.equal(no.status, 405);
  assert.equal(no.headers.get("access-control-allow-origin"), null);
});

Deno.test("cors: --cors values are origins or *", () => {
  assert.deepEqual(parseCorsOrigins("https://a.example, http://localhost:3000"), [
    "https://a.example",
    "http://localhost:3000",
  ]);
  assert.deepEqual(parseCorsOrigins("*"), ["*"]);
  assert.throws(
    () => parseCorsOrigins("https://a.example/path"),
    /--cors https:\/\/a.example\/path is not an origin/,
  );
  assert.throws(() => parseCorsOrigins("nope"), /--cors nope is not an origin: give scheme:\/\/host/);
  assert.throws(() => parseCorsOrigins(" , "), /--cors is empty/);
});
