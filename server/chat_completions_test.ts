import assert from "node:assert/strict";
import { parseChatCompletionsRequest } from "./chat_completions.ts";
import type { Json } from "./_parse.ts";
import { parseSse, post, testApp } from "./_test_engine.ts";

// deno-lint-ignore no-explicit-any
type Loose = any;

const USER = [{ role: "user", content: "Hi" }];

Deno.test("chat completions: chunk stream shape: role first, deltas, finish, usage chunk, [DONE]", async () => {
  const { app } = testApp(() => "<think>\nhmm\n</think>\n\nAnswer");
  const r = await post(app, "/v1/chat/completions", {
    model: "m",
    messages: USER,
    stream: true,
    stream_options: { include_usage: true },
  });
  const frames = parseSse(await r.text());
  assert.equal(frames.at(-1)!.data, "[DONE]");
  const chunks: Loose[] = frames.slice(0, -1).map((f) => JSON.parse(f.data));
  assert.ok(chunks.every((c) => c.object === "chat.completion.chunk" && c.id === chunks[0].id));
  assert.deepEqual(chunks[0].choices[0].delta, { role: "assistant", content: "" });
  const usage = chunks.at(-1);
  assert.deepEqual(usage.choices, []);
  assert.equal(usage.usage.total_tokens, usage.usage.prompt_tokens + usage.usage.completion_tokens);
  const fin = chunks.at(-2);
  assert.deepEqual(fin.choices[0].delta, {});
  assert.equal(fin.choices[0].finish_reason, "stop");
  assert.ok(chunks.slice(0, -1).every((c) => c.usage === null), "usage is null on every other chunk");
  const reasoning = chunks.map((c) => c.choices[0]?.delta.reasoning_content ?? "").join("");
  const content = chunks.map((c) => c.choices[0]?.delta.content ?? "").join("");
  assert.equal(reasoning, "hmm");
  assert.equal(content, "Answer");
});

Deno.test("chat completions: tool calls stream with indices and ids; content null when only calls", async () => {
  const script =
    '<tool_call>\n{"name": "a", "arguments": {"x": 1}}\n</tool_call>\n<tool_call>\n{"name": "b", "arguments": {}}\n</tool_call>';
  const tools = [{ type: "function", function: { name: "a" } }, {
    type: "function",
    function: { name: "b" },
  }];
  const { app } = testApp(() => script);
  const j: Loose = await (await post(app, "/v1/chat/completions", { messages: USER, tools })).json();
  const m = j.choices[0].message;
  assert.equal(m.content, null);
  assert.deepEqual(m.tool_calls.map((c: Loose) => [c.type, c.function.name, c.function.arguments]), [
    ["function", "a", '{"x":1}'],
    ["function", "b", "{}"],
  ]);
  assert.ok(m.tool_calls.every((c: Loose) => /^call_[0-9a-f]{24}$/.test(c.id)));
  assert.equal(j.choices[0].finish_reason, "tool_calls");
  const r = await post(app, "/v1/chat/completions", { messages: USER, tools, stream: true });
  const calls = parseSse(await r.text()).slice(0, -1).map((f) => JSON.parse(f.data) as Loose)
    .flatMap((c) => c.choices[0].delta.tool_calls ?? []);
  assert.deepEqual(calls.map((c: Loose) => [c.index, c.function.name]), [[0, "a"], [1, "b"]]);
});

Deno.test("chat completions: tool_choice none withholds tools; seed, penalties and thinking switch reach the engine", async () => {
  const { app, engine, tokenizer } = testApp(() => "ok");
  const tools = [{ type: "function", function: { name: "f", parameters: { type: "object" } } }];
  await (await post(app, "/v1/chat/completions", {
    messages: USER,
    tools,
    tool_choice: "none",
    seed: 42,
    presence_penalty: 1.5,
    min_p: 0.05,
    chat_template_kwargs: { enable_thinking: false },
  })).json();
  await (await post(app, "/v1/chat/completions", { messages: USER, tools, reasoning_effort: "high" })).json();
  const [a, b] = engine.requests.map((r) => ({ ...r, text: tokenizer.decode(r.prompt) }));
  assert.ok(!a!.text.includes("# Tools"));
  assert.ok(a!.text.endsWith("<|im_start|>assistant\n<think>\n\n</think>\n\n"), a!.text);
  assert.equal(a!.sampling.seed, 42);
  assert.equal(a!.sampling.presencePenalty, 1.5);
  assert.equal(a!.sampling.minP, 0.05);
  assert.ok(b!.text.includes("# Tools"));
  assert.ok(b!.text.endsWith("<|im_start|>assistant\n"), b!.text);
});

Deno.test("chat completions: max_tokens absent means the rest of the context; max_completion_tokens wins", async () => {
  const { app, engine } = testApp(() => "ok", { nCtx: 200 });
  await (await post(app, "/v1/chat/completions", { messages: USER })).json();
  await (await post(app, "/v1/chat/completions", { messages: USER, max_tokens: 9, max_completion_tokens: 7 }))
    .json();
  const [a, b] = engine.requests;
  assert.equal(a!.maxTokens, 200 - a!.prompt.length);
  assert.equal(b!.maxTokens, 7);
});

Deno.test("chat completions: request parser names the field for every malformed part", () => {
  const cases: [Json, RegExp][] = [
    [{ messages: USER, n: 2 }, /Field n is 2: this server generates one choice per request \(n=1\)/],
    [{ messages: [{ role: "user", content: [{ type: "image_url", image_url: {} }] }] }, /text-only model/],
    [{
      messages: [{
        role: "assistant",
        content: null,
        tool_calls: [{ id: "1", type: "function", function: { name: "f", arguments: 5 } }],
      }],
    }, /Field messages\[0\]\.tool_calls\[0\]\.function\.arguments is number, expected a JSON object text/],
    [
      { messages: [{ role: "assistant", content: null, tool_calls: [{ id: "1" }] }] },
      /Field messages\[0\]\.tool_calls\[0\]\.function is undefined/,
    ],
    [
      { messages: USER, tools: [{ type: "retrieval" }] },
      /Field tools\[0\]\.type is "retrieval", expected function/,
    ],
    [
      { messages: USER, tools: [{ type: "function", function: { parameters: {} } }] },
      /Field tools\[0\]\.function\.name is required/,
    ],
    [{ messages: USER, tool_choice: "maybe" }, /Field tool_choice is "maybe"/],
    [{ messages: USER, tool_choice: 3 }, /Field tool_choice is number, expected an object/],
    [
      { messages: USER, stream_options: { include_usage: "yes" } },
      /Field stream_options\.include_usage is string/,
    ],
    [{ messages: USER, seed: 1.5 }, /Field seed is number, expected an integer/],
    [{ messages: USER, stop: 5 }, /Field stop is number, expected a string or an array of strings/],
    [{ messages: USER, presence_penalty: 3 }, /Field presence_penalty is 3, expected a value in \[-2, 2\]/],
    [
      { messages: USER, chat_template_kwargs: { enable_thinking: "no" } },
      /Field chat_template_kwargs\.enable_thinking is string/,
    ],
  ];
  for (const [body, msg] of cases) {
    assert.throws(() => parseChatCompletionsRequest(body), msg, JSON.stringify(body));
  }
  const ok = parseChatCompletionsRequest({
    messages: [
      { role: "developer", content: [{ type: "text", text: "a" }, { type: "text", text: "b" }] },
      ...USER,
    ],
    stop: "END",
    n: 1,
  });
  assert.deepEqual(ok.messages[0], { role: "system", content: "ab" });
  assert.deepEqual(ok.stops, ["END"]);
});
