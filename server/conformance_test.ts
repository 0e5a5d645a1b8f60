/**
 * One conformance suite run against both chat dialects (STYLE.md "Server and wire"): streamed ≡ non-streamed,
 * every bad input's status and message, queue full, loading, disconnect, stop strings.
 */
import assert from "node:assert/strict";
import { ChatTemplate, QWEN35_TEMPLATE } from "../engine/mod.ts";
import { type FakeEngineOptions, parseSse, post, type Script, testApp } from "./_test_engine.ts";

/** What a response means, independent of dialect and of streaming. */
interface Outcome {
  text: string;
  thinking: string;
  toolCalls: { name: string; args: unknown }[];
  stop: string;
  inputTokens: number;
  outputTokens: number;
}

interface Dialect {
  name: string;
  path: string;
  body(
    messages: { role: string; content: string }[],
    extra?: Record<string, unknown>,
  ): Record<string, unknown>;
  maxField: string;
  stopField: string;
  fromJson(j: Record<string, unknown>): Outcome;
  fromStream(body: string): Outcome;
  errorMessage(j: Record<string, unknown>): string;
  errorType(j: Record<string, unknown>): string;
}

// deno-lint-ignore no-explicit-any
type Loose = any;

const anthropic: Dialect = {
  name: "anthropic",
  path: "/v1/messages",
  body: (messages, extra = {}) => ({ model: "m", max_tokens: 200, messages, ...extra }),
  maxField: "max_tokens",
  stopField: "stop_sequences",
  fromJson(j: Loose) {
    const o: Outcome = {
      text: "",
      thinking: "",
      toolCalls: [],
      stop: j.stop_reason,
      inputTokens: 0,
      outputTokens: 0,
    };
    for (const b of j.content) {
      if (b.type === "text") o.text += b.text;
      else if (b.type === "thinking") o.thinking += b.thinking;
      else o.toolCalls.push({ name: b.name, args: b.input });
    }
    o.inputTokens = j.usage.input_tokens;
    o.outputTokens = j.usage.output_tokens;
    return o;
  },
  fromStream(body) {
    const o: Outcome = { text: "", thinking: "", toolCalls: [], stop: "", inputTokens: 0, outputTokens: 0 };
    const blocks: Loose[] = [];
    for (const f of parseSse(body)) {
      const d: Loose = JSON.parse(f.data);
      assert.equal(d.type, f.event, "event name equals data.type");
      if (d.type === "message_start") o.inputTokens = d.message.usage.input_tokens;
      if (d.type === "content_block_start") blocks[d.index] = { ...d.content_block, json: "" };
      if (d.type === "content_block_delta") {
        const b = blocks[d.index];
        if (d.delta.type === "text_delta") o.text += d.delta.text;
        if (d.delta.type === "thinking_delta") o.thinking += d.delta.thinking;
        if (d.delta.type === "input_json_delta") b.json += d.delta.partial_json;
      }
      if (d.type === "content_block_stop" && blocks[d.index].type === "tool_use") {
        o.toolCalls.push({ name: blocks[d.index].name, args: JSON.parse(blocks[d.index].json) });
      }
      if (d.type === "message_delta") {
        o.stop = d.delta.stop_reason;
        o.outputTokens = d.usage.output_tokens;
      }
    }
    return o;
  },
  errorMessage: (j: Loose) => j.error.message,
  errorType: (j: Loose) => `${j.type}/${j.error.type}`,
};

const openai: Dialect = {
  name: "openai",
  path: "/v1/chat/completions",
  body: (messages, extra = {}) => ({ model: "m", messages, ...extra }),
  maxField: "max_tokens",
  stopField: "stop",
  fromJson(j: Loose) {
    const m = j.choices[0].message;
    return {
      text: m.content ?? "",
      thinking: m.reasoning_content ?? "",
      toolCalls: (m.tool_calls ?? []).map((c: Loose) => ({
        name: c.function.name,
        args: JSON.parse(c.function.arguments),
      })),
      stop: j.choices[0].finish_reason,
      inputTokens: j.usage.prompt_tokens,
      outputTokens: j.usage.completion_tokens,
    };
  },
  fromStream(body) {
    const o: Outcome = { text: "", thinking: "", toolCalls: [], stop: "", inputTokens: 0, outputTokens: 0 };
    const frames = parseSse(body);
    assert.equal(frames.at(-1)?.data, "[DONE]");
    for (const f of frames.slice(0, -1)) {
      assert.equal(f.event, undefined);
      const d: Loose = JSON.parse(f.data);
      if (d.usage) {
        o.inputTokens = d.usage.prompt_tokens;
        o.outputTokens = d.usage.completion_tokens;
      }
      const c = d.choices[0];
      if (!c) continue;
      if (c.delta.content) o.text += c.delta.content;
      if (c.delta.reasoning_content) o.thinking += c.delta.reasoning_content;
      for (const t of c.delta.tool_calls ?? []) {
        o.toolCalls.push({ name: t.function.name, args: JSON.parse(t.function.arguments) });
      }
      if (c.finish_reason) o.stop = c.finish_reason;
    }
    return o;
  },
  errorMessage: (j: Loose) => j.error.message,
  errorType: (j: Loose) => j.error.type,
};

const stopNames = {
  anthropic: { eos: "end_turn", length: "max_tokens", stop: "stop_sequence", tool: "tool_use" },
  openai: { eos: "stop", length: "length", stop: "stop", tool: "tool_calls" },
} as const;

const TOOLS_OPENAI = [{
  type: "function",
  function: { name: "get_weather", parameters: { type: "object", properties: { city: { type: "string" } } } },
}];
const TOOLS_ANTHROPIC = [{
  name: "get_weather",
  input_schema: { type: "object", properties: { city: { type: "string" } } },
}];

const USER = [{ role: "user", content: "What is the weather in Paris?" }];

async function both(
  d: Dialect,
  script: Script,
  extra: Record<string, unknown> = {},
  opts: Partial<FakeEngineOptions> = {},
) {
  const { app } = testApp(script, opts);
  const r1 = await post(app, d.path, d.body(USER, extra));
  assert.equal(r1.status, 200, await r1.clone().text());
  const r2 = await post(
    app,
    d.path,
    d.body(USER, {
      ...extra,
      stream: true,
      stream_options: d.name === "openai" ? { include_usage: true } : undefined,
    }),
  );
  assert.equal(r2.status, 200);
  assert.match(r2.headers.get("content-type") ?? "", /^text\/event-stream/);
  return { json: d.fromJson(await r1.json()), stream: d.fromStream(await r2.text()) };
}

for (const d of [anthropic, openai]) {
  const names = stopNames[d.name as "anthropic" | "openai"];

  Deno.test(`${d.name}: streamed ≡ non-streamed for text, thinking, tool calls, stop strings and length`, async () => {
    const cases: { script: string; extra?: Record<string, unknown>; expect: Partial<Outcome> }[] = [
      {
        script: "Sunny and 21°C — enjoy! 日本",
        expect: { text: "Sunny and 21°C — enjoy! 日本", stop: names.eos },
      },
      {
        script: "<think>\nweather lookup\n</think>\n\nIt is sunny.",
        expect: { text: "It is sunny.", thinking: "weather lookup", stop: names.eos },
      },
      {
        script:
          'Let me check.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>',
        extra: { tools: d.name === "openai" ? TOOLS_OPENAI : TOOLS_ANTHROPIC },
        expect: {
          text: "Let me check.",
          toolCalls: [{ name: "get_weather", args: { city: "Paris" } }],
          stop: names.tool,
        },
      },
      {
        script: "one two STOP three four",
        extra: { [d.stopField]: ["STOP", "zzz"] },
        expect: { text: "one two ", stop: names.stop },
      },
      {
        script: "abcdefghijklmnop",
        extra: { [d.maxField]: 5 },
        expect: { text: "abcde", stop: names.length, outputTokens: 5 },
      },
    ];
    for (const c of cases) {
      const { json, stream } = await both(d, () => c.script, c.extra);
      assert.deepEqual(stream, json, `case ${JSON.stringify(c.script)}`);
      for (const [k, v] of Object.entries(c.expect)) {
        assert.deepEqual(json[k as keyof Outcome], v, `case ${JSON.stringify(c.script)} field ${k}`);
      }
      assert.ok(json.inputTokens > 10);
    }
  });

  Deno.test(`${d.name}: a stop string aborts the engine and its text is never emitted`, async () => {
    const long = "keep " + "x".repeat(300) + " END tail";
    for (const stream of [false, true]) {
      const { app, engine } = testApp(() => "abc END " + long, { batch: 2 });
      const usage = stream && d.name === "openai" ? { stream_options: { include_usage: true } } : {};
      const r = await post(app, d.path, d.body(USER, { [d.stopField]: ["END"], stream, ...usage }));
      const o = stream ? d.fromStream(await r.text()) : d.fromJson(await r.json());
      assert.equal(o.text, "abc ");
      assert.equal(o.stop, names.stop);
      assert.equal(o.outputTokens, 7, "tokens up to the one completing the stop");
      const res = engine.results[0]!;
      assert.equal(res.reason, "cancelled");
      assert.ok(res.tokens.length < 20, `engine went on for ${res.tokens.length} tokens`);
    }
  });

  Deno.test(`${d.name}: bad inputs get their status, error type and a specific message`, async () => {
    const { app } = testApp(() => "ok", { nCtx: 64 });
    const cases: { body: unknown; status: number; msg: RegExp; headers?: Record<string, string> }[] = [
      { body: "{not json", status: 400, msg: /Malformed JSON in request body/ },
      { body: "[1,2]", status: 400, msg: /Request body is array, expected a JSON object/ },
      {
        body: d.body(USER, { messages: "hi" }),
        status: 400,
        msg: /Field messages is string "hi", expected an array/,
      },
      { body: d.body(USER, { messages: [] }), status: 400, msg: /Field messages is empty/ },
      {
        body: d.body([{ role: "user", content: 5 } as never]),
        status: 400,
        msg: /Field messages\[0\]\.content is number/,
      },
      {
        body: d.body([{ role: "robot", content: "x" }]),
        status: 400,
        msg: /Field messages\[0\]\.role is "robot"/,
      },
      {
        body: d.body(USER, { temperature: "hot" }),
        status: 400,
        msg: /Field temperature is string "hot", expected a number/,
      },
      {
        body: d.body(USER, { temperature: 7 }),
        status: 400,
        msg: /Field temperature is 7, expected a value in \[0, 2\]/,
      },
      {
        body: d.body(USER, { stream: "yes" }),
        status: 400,
        msg: /Field stream is string "yes", expected a boolean/,
      },
      {
        body: d.body(USER, { [d.stopField]: [1] }),
        status: 400,
        msg: new RegExp(`Field ${d.stopField}\\[0\\] is number`),
      },
      {
        body: d.body(USER, { [d.maxField]: 1.5 }),
        status: 400,
        msg: new RegExp(`Field ${d.maxField} is number, expected an integer`),
      },
      {
        body: d.body(USER, { [d.maxField]: 100 }),
        status: 400,
        msg: new RegExp(`Field ${d.maxField} is 100, over the limit of 64`),
      },
      {
        body: d.body([{ role: "user", content: "x".repeat(100) }]),
        status: 400,
        msg: /Prompt is 1\d\d tokens but the context holds 64/,
      },
      { body: d.body(USER, { unknown_field: { anything: [1] }, [d.maxField]: 10 }), status: 200, msg: /./ },
    ];
    for (const c of cases) {
      const r = await post(app, d.path, c.body);
      const j = await r.json();
      assert.equal(r.status, c.status, `${JSON.stringify(c.body).slice(0, 80)}: ${JSON.stringify(j)}`);
      if (c.status === 200) continue;
      assert.match(d.errorMessage(j), c.msg);
      assert.equal(
        d.errorType(j),
        d.name === "anthropic" ? "error/invalid_request_error" : "invalid_request_error",
      );
    }
  });

  Deno.test(`${d.name}: body over the limit is 413, wrong or missing key is 401`, async () => {
    const { app } = testApp(() => "ok", { bodyLimitBytes: 200, apiKey: "sekret" });
    const auth: Record<string, string> = d.name === "anthropic"
      ? { "x-api-key": "sekret" }
      : { authorization: "Bearer sekret" };
    let r = await post(app, d.path, d.body([{ role: "user", content: "y".repeat(300) }]), auth);
    assert.equal(r.status, 413);
    assert.match(
      d.errorMessage(await r.json()),
      /Request body of (\d+|more than 200) bytes is over the limit of 200 bytes/,
    );
    r = await post(app, d.path, d.body(USER));
    assert.equal(r.status, 401);
    let j = await r.json();
    assert.match(d.errorMessage(j), /Missing API key/);
    assert.equal(
      d.errorType(j),
      d.name === "anthropic" ? "error/authentication_error" : "invalid_request_error",
    );
    r = await post(
      app,
      d.path,
      d.body(USER),
      d.name === "anthropic" ? { "x-api-key": "wrong" } : { authorization: "Bearer wrong" },
    );
    assert.equal(r.status, 401);
    j = await r.json();
    assert.match(d.errorMessage(j), /Invalid API key/);
    r = await post(app, d.path, d.body(USER), auth);
    assert.equal(r.status, 200);
    await r.body?.cancel();
  });

  Deno.test(`${d.name}: queue full is 503 with Retry-After, before any stream starts`, async () => {
    const { app, engine } = testApp(() => "hello", { nSlots: 1, queueSize: 1 });
    let open!: () => void;
    engine.gate = new Promise((r) => open = r);
    const first = post(app, d.path, d.body(USER, { stream: true }));
    const second = post(app, d.path, d.body(USER));
    await new Promise((r) => setTimeout(r, 10));
    for (const stream of [false, true]) {
      const r = await post(app, d.path, d.body(USER, { stream }));
      assert.equal(r.status, 503);
      assert.equal(r.headers.get("retry-after"), "2");
      const j = await r.json();
      assert.match(d.errorMessage(j), /All 1 slots busy and 1 queued/);
      assert.equal(d.errorType(j), d.name === "anthropic" ? "error/overloaded_error" : "server_error");
    }
    open();
    assert.equal((await first).status, 200);
    assert.equal((await second).status, 200);
    await (await first).text();
  });

  Deno.test(`${d.name}: while the model loads, generation is 503 with progress`, async () => {
    const { app } = testApp(() => "x", { state: "loading" });
    const r = await post(app, d.path, d.body(USER));
    assert.equal(r.status, 503);
    assert.match(d.errorMessage(await r.json()), /Model fake-model is still loading \(25% of 1000 bytes\)/);
  });

  Deno.test(`${d.name}: a client that disconnects mid-stream aborts its engine request`, async () => {
    const { app, engine } = testApp(() => "z".repeat(400), { batch: 1, delayMs: 2 });
    const r = await post(app, d.path, d.body(USER, { stream: true }));
    const reader = r.body!.getReader();
    await reader.read();
    await reader.read();
    await reader.cancel();
    for (let i = 0; i < 100 && engine.results.length === 0; i++) await new Promise((r) => setTimeout(r, 5));
    const res = engine.results[0]!;
    assert.equal(res.reason, "cancelled");
    assert.ok(res.tokens.length < 100, `generated ${res.tokens.length} tokens after the disconnect`);
    assert.equal(engine.requests[0]!.signal?.aborted, true);
  });

  Deno.test(`${d.name}: temperature defaults to --temp-default and is capped by --temp-cap`, async () => {
    const { app, engine } = testApp(() => "ok", { tempDefault: 0.3, tempCap: 0.8 });
    await (await post(app, d.path, d.body(USER))).json();
    await (await post(app, d.path, d.body(USER, { temperature: 1.5, top_p: 0.9, top_k: 20 }))).json();
    await (await post(app, d.path, d.body(USER, { temperature: 0 }))).json();
    const s = engine.requests.map((r) => r.sampling);
    assert.equal(s[0]!.temperature, 0.3);
    assert.equal(s[0]!.topK, 0);
    assert.equal(s[0]!.topP, 1);
    assert.equal(s[1]!.temperature, 0.8);
    assert.equal(s[1]!.topP, 0.9);
    assert.equal(s[1]!.topK, 20);
    assert.equal(s[2]!.temperature, 0);
  });

  Deno.test(`${d.name}: a conversation the chat template rejects is a 400 with the template's reason`, async () => {
    const { app, engine } = testApp(() => "ok", { template: new ChatTemplate(QWEN35_TEMPLATE) });
    const r = await post(app, d.path, d.body([{ role: "assistant", content: "I spoke first" }]));
    assert.equal(r.status, 400);
    const j = await r.json();
    assert.match(
      d.errorMessage(j),
      /rejected the conversation: No user query found in messages: fix the request/,
    );
    assert.equal(engine.requests.length, 0);
  });
}
