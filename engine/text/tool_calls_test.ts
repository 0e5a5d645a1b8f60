import assert from "node:assert/strict";
import { Rng } from "../../tests/util/rng.ts";
import { ChatTemplate, QWEN35_TEMPLATE, QWEN3_TEMPLATE, type ToolSpec } from "./template.ts";
import {
  type ChatEvent,
  type ChatParseOptions,
  ChatStreamParser,
  convertParameter,
  parseChatOutput,
  parseToolCallBody,
} from "./tool_calls.ts";

const TOOLS: ToolSpec[] = [{
  type: "function",
  function: {
    name: "search",
    parameters: {
      type: "object",
      properties: {
        query: { type: "string" },
        limit: { type: "integer" },
        score: { type: "number" },
        exact: { type: "boolean" },
        filters: { type: "object" },
        tags: { type: "array" },
        cursor: { type: ["string", "null"] },
        page: { anyOf: [{ type: "integer" }, { type: "null" }] },
        when: { type: "date" },
      },
    },
  },
}];

/** Events merged across pushes (adjacent text or thinking pieces joined), the form streaming must equal. */
function normalize(events: ChatEvent[]): ChatEvent[] {
  const out: ChatEvent[] = [];
  for (const e of events) {
    const last = out.at(-1);
    if (e.type !== "tool_call" && last !== undefined && last.type === e.type) last.text += e.text;
    else out.push(e.type === "tool_call" ? e : { ...e });
  }
  return out;
}

function run(pieces: string[], opts: ChatParseOptions = {}): ChatEvent[] {
  const p = new ChatStreamParser(opts);
  const events: ChatEvent[] = [];
  for (const piece of pieces) events.push(...p.push(piece));
  events.push(...p.end());
  return events;
}

/** Streaming at every single split point and one character at a time gives the events of one push. */
function assertSplitInvariant(text: string, opts: ChatParseOptions = {}, note = ""): ChatEvent[] {
  const whole = normalize(run([text], opts));
  for (let i = 0; i <= text.length; i++) {
    const got = normalize(run([text.slice(0, i), text.slice(i)], opts));
    assert.deepEqual(
      got,
      whole,
      `${note} split at ${i}: ${JSON.stringify([text.slice(0, i), text.slice(i)])}`,
    );
  }
  assert.deepEqual(normalize(run([...text], opts)), whole, `${note} one character per push`);
  return whole;
}

const HERMES = "Let me check.\n\n<tool_call>\n" +
  '{"name": "get_weather", "arguments": {"city": "Paris", "days": 2}}' +
  "\n</tool_call>\n<tool_call>\n" + '{"name": "get_time", "arguments": "{\\"tz\\": \\"CET\\"}"}' +
  "\n</tool_call>";

const XML =
  "I will search.\n\n<tool_call>\n<function=search>\n<parameter=query>\nline one\n  line two\n</parameter>\n" +
  "<parameter=limit>\n10\n</parameter>\n<parameter=score>\n0.5\n</parameter>\n<parameter=exact>\nTrue\n</parameter>\n" +
  '<parameter=filters>\n{"lang": "en"}\n</parameter>\n<parameter=tags>\n["a", 1]\n</parameter>\n' +
  "<parameter=cursor>\nnull\n</parameter>\n<parameter=page>\n3\n</parameter>\n</function>\n</tool_call>";

Deno.test("Hermes JSON calls (Qwen3-Next): content before, two calls, string arguments parsed", () => {
  const out = parseChatOutput(HERMES);
  assert.equal(out.content, "Let me check.");
  assert.equal(out.reasoning, "");
  assert.deepEqual(out.toolCalls, [
    { name: "get_weather", arguments: { city: "Paris", days: 2 }, format: "json" },
    { name: "get_time", arguments: { tz: "CET" }, format: "json" },
  ]);
  assertSplitInvariant(HERMES);
});

Deno.test("XML calls (Qwen3.5): values typed by the tool schema, multi-line strings kept raw", () => {
  const out = parseChatOutput(XML, { tools: TOOLS });
  assert.equal(out.content, "I will search.");
  assert.deepEqual(out.toolCalls, [{
    name: "search",
    format: "xml",
    arguments: {
      query: "line one\n  line two",
      limit: 10,
      score: 0.5,
      exact: true,
      filters: { lang: "en" },
      tags: ["a", 1],
      cursor: null,
      page: 3,
    },
  }]);
  assertSplitInvariant(XML, { tools: TOOLS });
  // Without the tools, values that are JSON become JSON and the rest stay text.
  const bare = parseChatOutput(XML).toolCalls[0]!.arguments;
  assert.equal(bare.limit, 10);
  assert.equal(bare.exact, "True");
  assert.equal(bare.query, "line one\n  line two");
});

Deno.test("convertParameter: each schema type, fallbacks to the raw text, unions, unknown types", () => {
  const t = (type: unknown) => ({ type });
  assert.equal(convertParameter("42", t("string")), "42");
  assert.equal(convertParameter(" 42 ", t("integer")), 42);
  assert.equal(convertParameter("4.5", t("integer")), "4.5", "not an integer: raw text");
  assert.equal(convertParameter("1e3", t("number")), 1000);
  assert.equal(convertParameter("abc", t("number")), "abc");
  assert.equal(convertParameter("FALSE", t("boolean")), false);
  assert.equal(convertParameter("yes", t("boolean")), "yes");
  assert.deepEqual(convertParameter('{"a": [1]}', t("object")), { a: [1] });
  assert.equal(convertParameter("[1]", t("object")), "[1]", "an array is not an object");
  assert.deepEqual(convertParameter("[1, 2]", t("array")), [1, 2]);
  assert.equal(convertParameter("{bad", t("array")), "{bad");
  assert.equal(convertParameter("null", t(["string", "null"])), null);
  assert.equal(convertParameter("7", t(["string", "integer"])), "7", "string wins in a union");
  assert.equal(
    convertParameter("None", t(["integer", "null"])),
    null,
    "Python spelling from the Qwen3.5 template",
  );
  assert.equal(convertParameter("None", t("string")), "None");
  assert.equal(convertParameter("7", t(["boolean", "integer"])), 7);
  assert.equal(convertParameter("7", { anyOf: [{ type: "null" }, { type: "number" }] }), 7);
  // Unknown or missing types: JSON when it parses, else the raw text.
  assert.equal(convertParameter("12", t("date")), 12);
  assert.equal(convertParameter("2024-01-01", t("date")), "2024-01-01");
  assert.deepEqual(convertParameter("[1]", undefined), [1]);
  assert.equal(convertParameter("hello", undefined), "hello");
  assert.equal(convertParameter(" spaced ", t("string")), " spaced ", "strings are not trimmed");
});

Deno.test("thinking: reasoning split from the answer, prompt-opened or model-opened, newlines stripped", () => {
  const a = "Need weather.\n\n</think>\n\nIt is sunny.";
  assert.deepEqual(parseChatOutput(a, { startInThinking: true }), {
    content: "It is sunny.",
    reasoning: "Need weather.",
    toolCalls: [],
  });
  assertSplitInvariant(a, { startInThinking: true });
  const b = "<think>\nStep 1.\nStep 2.\n</think>\n\nDone" + "\n<tool_call>\n" +
    '{"name": "f", "arguments": {}}' +
    "\n</tool_call>";
  assert.deepEqual(parseChatOutput(b), {
    content: "Done",
    reasoning: "Step 1.\nStep 2.",
    toolCalls: [{ name: "f", arguments: {}, format: "json" }],
  });
  assertSplitInvariant(b);
  // A `<think>` repeated after the prompt's is dropped; tool-call tags inside reasoning are reasoning.
  const c = "<think>\nMaybe <tool_call>x</tool_call>?\n</think>\n\nNo.";
  assert.deepEqual(parseChatOutput(c, { startInThinking: true }), {
    content: "No.",
    reasoning: "Maybe <tool_call>x</tool_call>?",
    toolCalls: [],
  });
  assertSplitInvariant(c, { startInThinking: true });
  // Unfinished reasoning (max_tokens) stays reasoning; parseThinking false keeps the tags as text.
  assert.deepEqual(
    parseChatOutput("Still thinking\n", { startInThinking: true }).reasoning,
    "Still thinking",
  );
  assert.equal(parseChatOutput("<think>x</think>y", { parseThinking: false }).content, "<think>x</think>y");
  // `<think>` counts only at the start of the output.
  assert.equal(parseChatOutput("Hi <think>x</think>").content, "Hi <think>x</think>");
});

Deno.test("streaming: a possible tag prefix is held back, never emitted as text", () => {
  const p = new ChatStreamParser();
  assert.deepEqual(p.push("Hi <tool_"), [{ type: "text", text: "Hi" }]);
  assert.deepEqual(p.push("ca"), []);
  assert.deepEqual(p.push("ll>\n"), []);
  assert.deepEqual(p.push('{"name": "f", "arguments": {"a": 1}}\n</tool_call'), []);
  assert.deepEqual(p.push(">"), [{
    type: "tool_call",
    call: { name: "f", arguments: { a: 1 }, format: "json" },
  }]);
  assert.deepEqual(p.push("\n"), []);
  assert.deepEqual(p.end(), [], "whitespace after the last call is dropped");
  assert.throws(() => p.push("x"), /after end/);

  const q = new ChatStreamParser({ startInThinking: true });
  assert.deepEqual(q.push("a</th"), [{ type: "thinking", text: "a" }]);
  assert.deepEqual(q.push("ink>\n\nb <"), [{ type: "text", text: "b" }]);
  assert.deepEqual(q.push(" c"), [{ type: "text", text: " < c" }]);
  assert.deepEqual(q.push("<tool_call"), []);
  // The held prefix turns out to be text once the stream ends.
  assert.deepEqual(q.end(), [{ type: "text", text: "<tool_call" }]);

  const r = new ChatStreamParser();
  assert.deepEqual(r.push("<thi"), [], "a possible <think> at the start is held");
  assert.deepEqual(r.push("s is text"), [{ type: "text", text: "<this is text" }]);
});

const MALFORMED: [string, string][] = [
  ["bad JSON", 'A<tool_call>\n{"name": "f", "arguments": {oops}}\n</tool_call>B'],
  ["JSON without name", 'A<tool_call>{"arguments": {}}</tool_call>'],
  ["JSON arguments not an object", 'A<tool_call>{"name": "f", "arguments": [1]}</tool_call>'],
  ["JSON arguments text not JSON", 'A<tool_call>{"name": "f", "arguments": "x"}</tool_call>'],
  ["unknown body", "A <tool_call>call f(1)</tool_call>"],
  ["unclosed call", 'A\n<tool_call>\n{"name": "f", "arguments": {}}'],
  ["XML without </function>", "<tool_call>\n<function=f>\n<parameter=a>\n1\n</parameter>\n</tool_call>"],
  ["XML without </parameter>", "<tool_call>\n<function=f>\n<parameter=a>\n1\n</function>\n</tool_call>"],
  ["XML stray text", "<tool_call>\n<function=f>\nhello\n</function>\n</tool_call>"],
  [
    "XML duplicate key",
    "<tool_call><function=f><parameter=a>1</parameter><parameter=a>2</parameter></function></tool_call>",
  ],
  ["XML empty name", "<tool_call><function= >\n</function></tool_call>"],
];

Deno.test("malformed calls become plain text with their tags, never an exception", () => {
  for (const [what, text] of MALFORMED) {
    const out = parseChatOutput(text, { tools: TOOLS });
    assert.deepEqual(out.toolCalls, [], what);
    assert.equal(out.content, text, what);
    assertSplitInvariant(text, { tools: TOOLS }, what);
  }
  // A call reopened before the first closed: the first is text, the second a call.
  const reopened = 'x <tool_call>{"name": "f"\n<tool_call>{"name": "g", "arguments": {}}</tool_call>';
  const out = parseChatOutput(reopened);
  assert.equal(out.content, 'x <tool_call>{"name": "f"');
  assert.deepEqual(out.toolCalls, [{ name: "g", arguments: {}, format: "json" }]);
  assertSplitInvariant(reopened);
  // A good call after a bad one still parses.
  const mixed = 'Q<tool_call>{bad}</tool_call>\n<tool_call>{"name": "f", "arguments": {"n": 1}}</tool_call>';
  const m = parseChatOutput(mixed);
  assert.equal(m.content, "Q<tool_call>{bad}</tool_call>");
  assert.deepEqual(m.toolCalls, [{ name: "f", arguments: { n: 1 }, format: "json" }]);
  assertSplitInvariant(mixed);
});

Deno.test("parseToolCallBody: both formats, parameters alias, empty XML call", () => {
  assert.deepEqual(parseToolCallBody(' {"name": "f", "parameters": {"a": 1}} '), {
    name: "f",
    arguments: { a: 1 },
    format: "json",
  });
  assert.deepEqual(parseToolCallBody('{"name": "f"}'), { name: "f", arguments: {}, format: "json" });
  assert.deepEqual(parseToolCallBody("\n<function=ping>\n</function>\n"), {
    name: "ping",
    arguments: {},
    format: "xml",
  });
  assert.equal(parseToolCallBody("[]"), undefined);
});

Deno.test("fuzz: random tag soup never throws and streams like one push", () => {
  const rng = new Rng();
  const atoms = [
    "<tool_call>",
    "</tool_call>",
    "<think>",
    "</think>",
    "<function=search>",
    "</function>",
    "<parameter=limit>",
    "</parameter>",
    '{"name": "f", "arguments": {"a": 1}}',
    "\n",
    " ",
    "<",
    "</",
    "<tool",
    "text",
    "7",
    "{",
    "}",
  ];
  for (let n = 0; n < 200; n++) {
    let text = "";
    const len = rng.int(1, 12);
    for (let i = 0; i < len; i++) text += atoms[rng.int(0, atoms.length)]!;
    const opts = { tools: TOOLS, startInThinking: rng.int(0, 2) === 1 };
    const whole = normalize(run([text], opts));
    const pieces: string[] = [];
    for (let i = 0; i < text.length;) {
      const k = rng.int(1, 6);
      pieces.push(text.slice(i, i + k));
      i += k;
    }
    assert.deepEqual(normalize(run(pieces, opts)), whole, `seed ${rng.seed} text ${JSON.stringify(text)}`);
  }
});

Deno.test("round trip: calls rendered by both built-in templates parse back to the same calls", () => {
  const args = {
    query: "two\nlines",
    limit: 3,
    score: 1.5,
    exact: false,
    filters: { k: ["v"] },
    tags: [],
    cursor: null,
  };
  for (const [source, format] of [[QWEN3_TEMPLATE, "json"], [QWEN35_TEMPLATE, "xml"]] as const) {
    const tpl = new ChatTemplate(source);
    const prompt = tpl.render({
      messages: [
        { role: "user", content: "Find it" },
        {
          role: "assistant",
          content: "Searching.",
          toolCalls: [{ name: "search", arguments: args }, { name: "search", arguments: { query: "again" } }],
        },
      ],
      tools: TOOLS,
    });
    const turn = prompt.slice(
      prompt.lastIndexOf("<|im_start|>assistant\n") + 22,
      prompt.lastIndexOf("<|im_end|>"),
    );
    const out = parseChatOutput(turn, { tools: TOOLS });
    assert.equal(out.content, "Searching.", format);
    assert.deepEqual(out.toolCalls, [
      { name: "search", arguments: args, format },
      { name: "search", arguments: { query: "again" }, format },
    ], `${format}: ${JSON.stringify(turn)}`);
  }
});
