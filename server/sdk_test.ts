/**
 * The official `@anthropic-ai/sdk` and `openai` clients, unmodified, against the app served on loopback over
 * a fake engine: non-streamed, streamed (the SDKs' own stream accumulators), a tool-use round trip, and
 * errors surfacing as the SDKs' error classes.
 */
import assert from "node:assert/strict";
import Anthropic from "@anthropic-ai/sdk";
import OpenAI from "openai";
import { type Script, testApp } from "./_test_engine.ts";

const KEY = "test-key";

function serve(script: Script, opts: Parameters<typeof testApp>[1] = {}) {
  const t = testApp(script, { apiKey: KEY, ...opts });
  const server = Deno.serve({ hostname: "127.0.0.1", port: 0, onListen: () => {} }, t.app.fetch);
  const base = `http://127.0.0.1:${server.addr.port}`;
  return {
    ...t,
    base,
    anthropic: new Anthropic({ apiKey: KEY, baseURL: base, maxRetries: 0 }),
    openai: new OpenAI({ apiKey: KEY, baseURL: `${base}/v1`, maxRetries: 0 }),
    [Symbol.asyncDispose]: () => server.shutdown(),
  };
}

const WEATHER_CALL =
  'I will look it up.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "days": 2}}\n</tool_call>';

/** Scripts a tool call first, then an answer once the prompt carries the tool result. */
function toolScript(tokenizer: { decode(ids: readonly number[]): string }): Script {
  return (req) =>
    tokenizer.decode(req.prompt).includes("<tool_response>\n18 degrees") ? "It is 18 degrees." : WEATHER_CALL;
}

Deno.test("@anthropic-ai/sdk: create, stream, tool-use round trip", async () => {
  await using s = serve(() => "Bonjour, monde!");
  const params = {
    model: "fake-model",
    max_tokens: 64,
    messages: [{ role: "user" as const, content: "Say hello in French" }],
  };
  const msg = await s.anthropic.messages.create(params);
  assert.equal(msg.type, "message");
  assert.deepEqual(msg.content.map((b) => b.type === "text" ? b.text : b.type), ["Bonjour, monde!"]);
  assert.equal(msg.stop_reason, "end_turn");
  const streamed = await s.anthropic.messages.stream(params).finalMessage();
  assert.deepEqual(streamed.content, msg.content);
  assert.deepEqual(streamed.usage.output_tokens, msg.usage.output_tokens);
  assert.equal(streamed.stop_reason, msg.stop_reason);

  // Tool use round trip: the model calls get_weather, the client answers, the model replies.
  const tok = s.tokenizer;
  await using t = serve(toolScript(tok));
  const tools = [{
    name: "get_weather",
    description: "Weather for a city",
    input_schema: {
      type: "object" as const,
      properties: { city: { type: "string" }, days: { type: "integer" } },
    },
  }];
  const ask = { role: "user" as const, content: "Weather in Paris?" };
  for (const stream of [false, true]) {
    const first = stream
      ? await t.anthropic.messages.stream({ model: "m", max_tokens: 200, tools, messages: [ask] })
        .finalMessage()
      : await t.anthropic.messages.create({ model: "m", max_tokens: 200, tools, messages: [ask] });
    assert.equal(first.stop_reason, "tool_use");
    const use = first.content.find((b) => b.type === "tool_use");
    assert.ok(use && use.type === "tool_use");
    assert.equal(use.name, "get_weather");
    assert.deepEqual(use.input, { city: "Paris", days: 2 });
    const second = await t.anthropic.messages.create({
      model: "m",
      max_tokens: 200,
      tools,
      messages: [ask, { role: "assistant", content: first.content }, {
        role: "user",
        content: [{ type: "tool_result", tool_use_id: use.id, content: "18 degrees" }],
      }],
    });
    assert.deepEqual(second.content.map((b) => b.type === "text" ? b.text : b.type), ["It is 18 degrees."]);
  }
});

Deno.test("openai: create, stream with usage, tool-call round trip", async () => {
  await using s = serve(() => "Hallo, Welt!");
  const params = {
    model: "fake-model",
    messages: [{ role: "user" as const, content: "Say hello in German" }],
  };
  const done = await s.openai.chat.completions.create(params);
  assert.equal(done.choices[0]!.message.content, "Hallo, Welt!");
  assert.equal(done.choices[0]!.finish_reason, "stop");
  let text = "";
  let finish: string | null = null;
  let usage: OpenAI.CompletionUsage | undefined | null;
  const stream = await s.openai.chat.completions.create({
    ...params,
    stream: true,
    stream_options: { include_usage: true },
  });
  for await (const chunk of stream) {
    text += chunk.choices[0]?.delta.content ?? "";
    finish = chunk.choices[0]?.finish_reason ?? finish;
    usage = chunk.usage ?? usage;
  }
  assert.equal(text, "Hallo, Welt!");
  assert.equal(finish, "stop");
  assert.equal(usage?.completion_tokens, done.usage?.completion_tokens);
  assert.equal(usage?.prompt_tokens, done.usage?.prompt_tokens);

  await using t = serve(toolScript(s.tokenizer));
  const tools = [{
    type: "function" as const,
    function: {
      name: "get_weather",
      parameters: { type: "object", properties: { city: { type: "string" } } },
    },
  }];
  const ask = { role: "user" as const, content: "Weather in Paris?" };
  const first = await t.openai.chat.completions.create({ model: "m", tools, messages: [ask] });
  const choice = first.choices[0]!;
  assert.equal(choice.finish_reason, "tool_calls");
  const call = choice.message.tool_calls?.[0];
  assert.ok(call && call.type === "function");
  assert.equal(call.function.name, "get_weather");
  assert.deepEqual(JSON.parse(call.function.arguments), { city: "Paris", days: 2 });
  const second = await t.openai.chat.completions.create({
    model: "m",
    tools,
    messages: [ask, choice.message, { role: "tool", tool_call_id: call.id, content: "18 degrees" }],
  });
  assert.equal(second.choices[0]!.message.content, "It is 18 degrees.");
  const models = await t.openai.models.list();
  assert.deepEqual(models.data.map((m) => m.id), ["fake-model"]);
});

Deno.test("SDK error classes: 401, 400, 413, 503", async () => {
  await using s = serve(() => "x", { nCtx: 64, bodyLimitBytes: 4096, state: "ready" });
  const bad = new Anthropic({ apiKey: "wrong", baseURL: s.base, maxRetries: 0 });
  await assert.rejects(
    bad.messages.create({ model: "m", max_tokens: 5, messages: [{ role: "user", content: "hi" }] }),
    (e) => e instanceof Anthropic.AuthenticationError && /Invalid API key/.test(e.message),
  );
  await assert.rejects(
    s.anthropic.messages.create({ model: "m", max_tokens: 500, messages: [{ role: "user", content: "hi" }] }),
    (e) =>
      e instanceof Anthropic.BadRequestError && /max_tokens is 500, over the limit of 64/.test(e.message),
  );
  await assert.rejects(
    s.openai.chat.completions.create({ model: "m", messages: [{ role: "user", content: "x".repeat(5000) }] }),
    (e) => e instanceof OpenAI.APIError && e.status === 413,
  );
  await assert.rejects(
    s.openai.chat.completions.create({ model: "m", n: 2, messages: [{ role: "user", content: "hi" }] }),
    (e) => e instanceof OpenAI.BadRequestError && /n=1/.test(e.message),
  );
  s.engine.state = "loading";
  await assert.rejects(
    s.openai.chat.completions.create({ model: "m", messages: [{ role: "user", content: "hi" }] }),
    (e) => e instanceof OpenAI.InternalServerError && e.status === 503 && /still loading/.test(e.message),
  );
});
