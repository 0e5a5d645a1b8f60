import assert from "node:assert/strict";
import { type Json } from "./_parse.ts";
import { parseSse, post, testApp } from "./_test_engine.ts";
import { parseMessagesRequest } from "./messages.ts";

// deno-lint-ignore no-explicit-any
type Loose = any;

const USER = [{ role: "user", content: "Hi" }];

/** Event names with block types and delta types, for exact sequence checks. */
function sequence(body: string): string[] {
  return parseSse(body).map((f) => {
    const d: Loose = JSON.parse(f.data);
    assert.equal(d.type, f.event);
    if (d.type === "content_block_start") return `start:${d.index}:${d.content_block.type}`;
    if (d.type === "content_block_delta") return `delta:${d.index}:${d.delta.type}`;
    if (d.type === "content_block_stop") return `stop:${d.index}`;
    if (d.type === "message_delta") return `message_delta:${d.delta.stop_reason}`;
    return d.type;
  });
}

/** Collapses runs of equal entries (delta counts depend on token batching). */
function runs(seq: string[]): string[] {
  return seq.filter((s, i) => s !== seq[i - 1]);
}

Deno.test("messages: exact SSE event sequence for text, thinking + text + tool use, and empty output", async () => {
  const cases: { script: string; body?: Json; want: string[] }[] = [
    {
      script: "Hello world",
      want: [
        "message_start",
        "start:0:text",
        "ping",
        "delta:0:text_delta",
        "stop:0",
        "message_delta:end_turn",
        "message_stop",
      ],
    },
    {
      script:
        '<think>\nplan\n</think>\n\nCalling.\n<tool_call>\n{"name": "f", "arguments": {"a": [1, 2]}}\n</tool_call>',
      body: {
        tools: [{ name: "f", input_schema: { type: "object" } }],
        thinking: { type: "enabled", budget_tokens: 100 },
      },
      want: [
        "message_start",
        "start:0:thinking",
        "ping",
        "delta:0:thinking_delta",
        "delta:0:signature_delta",
        "stop:0",
        "start:1:text",
        "delta:1:text_delta",
        "stop:1",
        "start:2:tool_use",
        "delta:2:input_json_delta",
        "stop:2",
        "message_delta:tool_use",
        "message_stop",
      ],
    },
    { script: "", want: ["message_start", "ping", "message_delta:end_turn", "message_stop"] },
  ];
  for (const c of cases) {
    const { app } = testApp(() => c.script);
    const r = await post(app, "/v1/messages", {
      model: "m",
      max_tokens: 100,
      messages: USER,
      stream: true,
      ...c.body,
    });
    assert.equal(r.status, 200);
    assert.deepEqual(runs(sequence(await r.text())), c.want, c.script);
    const j: Loose =
      await (await post(app, "/v1/messages", { model: "m", max_tokens: 100, messages: USER, ...c.body }))
        .json();
    assert.equal(j.content.length, c.want.filter((s) => s.startsWith("start:")).length);
  }
});

Deno.test("messages: message_start carries id, model and input tokens; tool_use blocks start with empty input", async () => {
  const { app, engine } = testApp(() => '<tool_call>\n{"name": "f", "arguments": {"k": "v"}}\n</tool_call>');
  const r = await post(app, "/v1/messages", {
    model: "m",
    max_tokens: 50,
    stream: true,
    messages: USER,
    tools: [{ name: "f", input_schema: { type: "object" } }],
  });
  const frames = parseSse(await r.text()).map((f) => JSON.parse(f.data) as Loose);
  const start = frames[0].message;
  assert.match(start.id, /^msg_[0-9a-f]{24}$/);
  assert.equal(start.model, "fake-model");
  assert.equal(start.usage.input_tokens, engine.requests[0]!.prompt.length);
  const block = frames.find((f) => f.type === "content_block_start").content_block;
  assert.match(block.id, /^toolu_/);
  assert.deepEqual(block.input, {});
  assert.equal(block.name, "f");
  const json = frames.filter((f) => f.delta?.type === "input_json_delta").map((f) => f.delta.partial_json)
    .join("");
  assert.deepEqual(JSON.parse(json), { k: "v" });
});

Deno.test("messages: request conversion renders system, tool_use, tool_result and thinking into the template", async () => {
  const { app, engine, tokenizer } = testApp(() => "ok");
  const r = await post(app, "/v1/messages", {
    model: "m",
    max_tokens: 20,
    system: [{ type: "text", text: "Be brief." }],
    tools: [{
      name: "lookup",
      description: "Looks up",
      input_schema: { type: "object", properties: { q: { type: "string" } } },
    }],
    messages: [
      { role: "user", content: [{ type: "text", text: "Find cats" }] },
      {
        role: "assistant",
        content: [
          { type: "thinking", thinking: "search it", signature: "sig" },
          { type: "text", text: "Searching." },
          { type: "tool_use", id: "toolu_1", name: "lookup", input: { q: "cats" } },
        ],
      },
      {
        role: "user",
        content: [{
          type: "tool_result",
          tool_use_id: "toolu_1",
          content: [{ type: "text", text: "3 cats" }],
        }],
      },
    ],
    metadata: { user_id: "u1" },
  });
  assert.equal(r.status, 200, await r.clone().text());
  const prompt = tokenizer.decode(engine.requests[0]!.prompt);
  assert.ok(prompt.startsWith("<|im_start|>system\nBe brief.\n\n# Tools"), prompt);
  assert.ok(prompt.includes('"name": "lookup"'), prompt);
  assert.ok(prompt.includes("<|im_start|>user\nFind cats<|im_end|>"), prompt);
  assert.ok(
    prompt.includes('Searching.\n<tool_call>\n{"name": "lookup", "arguments": {"q": "cats"}}\n</tool_call>'),
    prompt,
  );
  assert.ok(prompt.includes("<|im_start|>user\n<tool_response>\n3 cats\n</tool_response><|im_end|>"), prompt);
});

Deno.test("messages: thinking switches the template's thinking mode", async () => {
  const { app, engine, tokenizer } = testApp(() => "ok");
  for (const thinking of [undefined, { type: "enabled", budget_tokens: 1024 }, { type: "disabled" }]) {
    await (await post(app, "/v1/messages", { model: "m", max_tokens: 5, messages: USER, thinking })).json();
  }
  const cues = engine.requests.map((r) => tokenizer.decode(r.prompt).split("<|im_start|>assistant\n")[1]);
  assert.deepEqual(cues, ["<think>\n\n</think>\n\n", "", "<think>\n\n</think>\n\n"]);
});

Deno.test("messages: request parser names the field for every malformed part", () => {
  const base = { model: "m", max_tokens: 10, messages: USER };
  const cases: [Json, RegExp][] = [
    [{ model: "m", messages: USER }, /Field max_tokens is required/],
    [{ ...base, max_tokens: 0 }, /Field max_tokens is 0, expected a value in \[1, inf\]/],
    [{ ...base, model: 7 }, /Field model is number, expected a string/],
    [{ ...base, system: 3 }, /Field system is number, expected a string or an array of text blocks/],
    [
      { ...base, messages: [{ role: "user", content: [{ type: "image", source: {} }] }] },
      /messages\[0\]\.content\[0\]\.type is "image": this server runs a text-only model/,
    ],
    [{
      ...base,
      messages: [{ role: "user", content: [{ type: "tool_use", id: "a", name: "b", input: {} }] }],
    }, /expected one of text, tool_result/],
    [{
      ...base,
      messages: [{ role: "assistant", content: [{ type: "tool_use", id: "a", name: "b", input: "x" }] }],
    }, /Field messages\[0\]\.content\[0\]\.input is string "x", expected an object/],
    [
      { ...base, messages: [{ role: "user", content: [{ type: "text" }] }] },
      /Field messages\[0\]\.content\[0\]\.text is required/,
    ],
    [
      { ...base, tools: [{ name: "f" }] },
      /Field tools\[0\]\.input_schema is undefined, expected a JSON Schema object/,
    ],
    [{ ...base, tools: [{ type: "web_search_20250305", name: "web_search" }] }, /only custom tools/],
    [{ ...base, tool_choice: { type: "sometimes" } }, /Field tool_choice\.type is "sometimes"/],
    [{ ...base, tool_choice: "auto" }, /Field tool_choice is string "auto", expected an object/],
    [{ ...base, thinking: { type: "on" } }, /Field thinking\.type is "on"/],
    [
      { ...base, thinking: { type: "enabled", budget_tokens: "lots" } },
      /Field thinking\.budget_tokens is string/,
    ],
    [{ ...base, metadata: "x" }, /Field metadata is string "x", expected an object/],
    [{ ...base, top_k: 2.5 }, /Field top_k is number, expected an integer/],
    [{ ...base, stop_sequences: [""] }, /Field stop_sequences\[0\] is an empty string/],
  ];
  for (const [body, msg] of cases) assert.throws(() => parseMessagesRequest(body), msg, JSON.stringify(body));
  const ok = parseMessagesRequest({
    ...base,
    tool_choice: { type: "none" },
    tools: [{ name: "f", input_schema: {} }],
  });
  assert.deepEqual(ok.tools, [], "tool_choice none withholds the tools");
});

Deno.test("messages: a final assistant message is a prefill the reply continues", async () => {
  const { app, engine, tokenizer } = testApp(() => " 42.");
  const j: Loose = await (await post(app, "/v1/messages", {
    model: "m",
    max_tokens: 10,
    messages: [...USER, { role: "assistant", content: "The answer is" }],
  })).json();
  const prompt = tokenizer.decode(engine.requests[0]!.prompt);
  assert.ok(
    prompt.endsWith("<|im_start|>assistant\n<think>\n\n</think>\n\nThe answer is"),
    JSON.stringify(prompt),
  );
  assert.deepEqual(j.content, [{ type: "text", text: " 42." }]);
});

Deno.test("messages: count_tokens counts the rendered prompt without generating", async () => {
  const { app, engine, tokenizer } = testApp(() => "unused");
  const body = { model: "m", system: "Be brief.", messages: USER };
  const r = await post(app, "/v1/messages/count_tokens", body);
  assert.equal(r.status, 200);
  const text = "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n" +
    "<|im_start|>assistant\n<think>\n\n</think>\n\n";
  assert.deepEqual(await r.json(), { input_tokens: tokenizer.encode(text, { parseSpecial: true }).length });
  assert.equal(engine.requests.length, 0);
  const bad = await post(app, "/v1/messages/count_tokens", { model: "m", messages: 3 });
  assert.equal(bad.status, 400);
});
