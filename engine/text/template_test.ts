import { fixturePath } from "../../tests/util/fixtures.ts";
import assert from "node:assert/strict";
import { GgufError } from "../errors.ts";
import { GGUF_VALUE_TYPE, type GgufKv, GgufMetadata, openGguf } from "../gguf.ts";
import { KEYS } from "../names.ts";
import { CASES } from "../../tests/golden/chat_template_cases.ts";
import type { GoldenRender } from "../../tests/golden/gen_chat_template.ts";
import {
  BUILTIN_TEMPLATES,
  type ChatRenderRequest,
  ChatTemplate,
  ChatTemplateError,
  type ChatTemplateErrorCode,
  opensThinking,
  QWEN35_TEMPLATE,
  QWEN3_TEMPLATE,
  renderChat,
  type ToolSpec,
} from "./template.ts";

const VOCAB_PATH = fixturePath("vocab-qwen3.gguf");
const GOLDEN_PATH = new URL("../../tests/golden/chat_template_qwen3.json", import.meta.url).pathname;
const GOLDEN35_PATH = new URL("../../tests/golden/chat_template_qwen35.json", import.meta.url).pathname;

const gguf = await openGguf(VOCAB_PATH);
const fileTpl = ChatTemplate.fromGguf(gguf.metadata);
const golden = JSON.parse(Deno.readTextFileSync(GOLDEN_PATH)) as { renders: Record<string, string> };
const golden35 = JSON.parse(Deno.readTextFileSync(GOLDEN35_PATH)) as {
  renders: Record<string, GoldenRender>;
};
const q35 = new ChatTemplate(QWEN35_TEMPLATE, { origin: "built-in qwen35", builtin: true });

function renderOrError(tpl: ChatTemplate, req: ChatRenderRequest): GoldenRender {
  try {
    return tpl.render(req);
  } catch (e) {
    if (!(e instanceof ChatTemplateError)) throw e;
    return { error: e.code, message: e.message };
  }
}

function metaWithout(key: string, extra: [string, GgufKv][] = []): GgufMetadata {
  const entries = new Map(gguf.metadata.entries);
  entries.delete(key);
  for (const [k, v] of extra) entries.set(k, v);
  return new GgufMetadata(entries, "synthetic.gguf");
}

function assertTemplateError(fn: () => unknown, code: ChatTemplateErrorCode, ...needles: string[]): void {
  assert.throws(fn, (e: unknown) => {
    assert.ok(e instanceof ChatTemplateError, `expected ChatTemplateError, got ${String(e)}`);
    assert.equal(e.code, code, e.message);
    for (const n of needles) {
      assert.ok(e.message.includes(n), `message lacks ${JSON.stringify(n)}: ${e.message}`);
    }
    return true;
  });
}

Deno.test("golden: the GGUF's Qwen3 template renders every case as recorded", () => {
  assert.equal(fileTpl.builtin, false);
  assert.ok(fileTpl.origin.includes(VOCAB_PATH), fileTpl.origin);
  assert.deepEqual(Object.keys(golden.renders).sort(), Object.keys(CASES).sort());
  for (const [name, req] of Object.entries(CASES)) {
    assert.equal(renderChat(fileTpl, req), golden.renders[name], `case ${name}`);
  }
});

Deno.test("golden: the built-in Qwen3 template renders every case byte-identical to the GGUF's", () => {
  const builtin = new ChatTemplate(QWEN3_TEMPLATE, { origin: "built-in qwen3", builtin: true });
  for (const [name, req] of Object.entries(CASES)) {
    assert.equal(builtin.render(req), golden.renders[name], `case ${name}`);
  }
});

// Expected strings typed in from spec/chat.md, independent of any template source.
Deno.test("hand-checked against chat.md §5: example, tool header, tool calls, tool results, thinking cues", () => {
  assert.equal(
    golden.renders.system_user_cue,
    "<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n",
  );
  const header =
    "<|im_start|>system\nYou are helpful.\n\n# Tools\n\nYou may call one or more functions to assist " +
    "with the user query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>" +
    '\n{"type": "function", "function": {"name": "get_weather", "description": "Current weather for a city", ' +
    '"parameters": {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}}, ' +
    '"required": ["city"]}}}' +
    '\n{"type": "function", "function": {"name": "get_time", "description": "Heure locale à Zürich, 日本", ' +
    '"parameters": {"type": "object", "properties": {"tz": {"type": "string"}}}}}' +
    "\n</tools>\n\nFor each function call, return a json object with function name and arguments within " +
    '<tool_call></tool_call> XML tags:\n<tool_call>\n{"name": <function-name>, "arguments": ' +
    "<args-json-object>}\n</tool_call><|im_end|>\n";
  const turns = "<|im_start|>user\nWeather and time in Paris?<|im_end|>\n" +
    "<|im_start|>assistant\nLet me check." +
    '\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "days": 2}}\n</tool_call>' +
    '\n<tool_call>\n{"name": "get_time", "arguments": {"tz": "Europe/Paris"}}\n</tool_call><|im_end|>\n' +
    "<|im_start|>user\n<tool_response>\n" + '{"temp": 18}' + "\n</tool_response>" +
    "\n<tool_response>\n12:00\n</tool_response><|im_end|>\n" +
    "<|im_start|>assistant\n18°C, noon.<|im_end|>\n<|im_start|>user\nThanks<|im_end|>\n<|im_start|>assistant\n";
  assert.equal(golden.renders.tools_calls_results, header + turns);
  assert.equal(
    golden.renders.tool_call_null_content_last!.split("<|im_start|>user\nWeather in Oslo?<|im_end|>\n")[1],
    '<|im_start|>assistant\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>' +
      "<|im_end|>\n<|im_start|>user\n<tool_response>\n-3\n</tool_response><|im_end|>\n<|im_start|>assistant\n",
  );
  assert.equal(
    golden.renders.typed_arguments,
    "<|im_start|>user\nSearch<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n<tool_call>\n" +
      '{"name": "search", "arguments": {"q": "two\\nlines", "n": 3, "x": 1.5, "ok": true, "no": false, ' +
      '"none": null, "o": {"a": [1]}, "l": ["é"]}}\n</tool_call><|im_end|>\n',
  );
  assert.equal(
    golden.renders.current_turn_reasoning,
    "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<think>\nGreet back.\n</think>\n\nHello!<|im_end|>\n",
  );
  assert.ok(
    golden.renders.multi_turn!.includes("<|im_start|>assistant\n4<|im_end|>\n"),
    "old reasoning dropped",
  );
  assert.ok(
    golden.renders.multi_turn!.includes("<|im_start|>assistant\n6<|im_end|>\n"),
    "old <think> dropped",
  );
  assert.ok(golden.renders.thinking_off!.endsWith("<|im_start|>assistant\n<think>\n\n</think>\n\n"));
  assert.ok(golden.renders.thinking_on!.endsWith("<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"));
});

Deno.test("golden: the built-in Qwen3.5 template renders every case as recorded (refusals included)", () => {
  assert.deepEqual(Object.keys(golden35.renders).sort(), Object.keys(CASES).sort());
  for (const [name, req] of Object.entries(CASES)) {
    assert.deepEqual(renderOrError(q35, req), golden35.renders[name], `case ${name}`);
  }
});

// Expected strings typed in from spec/chat.md §6, independent of the template source.
Deno.test("hand-checked against chat.md §6: example, tool header order, XML calls, empty think block", () => {
  assert.equal(
    golden35.renders.system_user_cue,
    "<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<think>\n",
  );
  const tools = golden35.renders.tools_calls_results as string;
  assert.ok(
    tools.startsWith(
      "<|im_start|>system\n# Tools\n\nYou have access to the following functions:\n\n<tools>\n",
    ),
  );
  assert.ok(
    tools.includes(
      "\n</tools>\n\nIf you choose to call a function ONLY reply in the following format with NO suffix:",
    ),
  );
  assert.ok(
    tools.includes("not tell the user about function calls\n</IMPORTANT>\n\nYou are helpful.<|im_end|>\n"),
  );
  assert.ok(tools.includes(
    "<|im_start|>assistant\nLet me check.\n\n<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n" +
      "</parameter>\n<parameter=days>\n2\n</parameter>\n</function>\n</tool_call>\n<tool_call>\n<function=get_time>\n" +
      "<parameter=tz>\nEurope/Paris\n</parameter>\n</function>\n</tool_call><|im_end|>\n<|im_start|>user\n" +
      '<tool_response>\n{"temp": 18}\n</tool_response>\n<tool_response>\n12:00\n</tool_response><|im_end|>\n',
  ));
  assert.ok(
    (golden35.renders.tool_call_null_content_last as string).includes(
      "<|im_start|>assistant\n<think>\n\n</think>\n\n<tool_call>\n<function=get_weather>\n",
    ),
    "the current turn keeps an empty think block and no blank line before the call",
  );
  assert.equal(
    golden35.renders.typed_arguments,
    "<|im_start|>user\nSearch<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n<tool_call>\n" +
      "<function=search>\n<parameter=q>\ntwo\nlines\n</parameter>\n<parameter=n>\n3\n</parameter>\n" +
      "<parameter=x>\n1.5\n</parameter>\n<parameter=ok>\nTrue\n</parameter>\n<parameter=no>\nFalse\n</parameter>\n" +
      '<parameter=none>\nNone\n</parameter>\n<parameter=o>\n{"a": [1]}\n</parameter>\n<parameter=l>\n["é"]\n' +
      "</parameter>\n</function>\n</tool_call><|im_end|>\n",
  );
  assert.ok(
    (golden35.renders.thinking_off as string).endsWith("<|im_start|>assistant\n<think>\n\n</think>\n\n"),
  );
  assert.deepEqual(golden35.renders.system_not_first, {
    error: "rejected",
    message:
      "Chat template (built-in qwen35) rejected the conversation: System message must be at the beginning: " +
      "fix the request",
  });
  assert.equal(q35.kind, "hybrid");
  assertTemplateError(() => q35.render({ messages: [] }), "rejected", "No messages provided");
  assertTemplateError(
    () => q35.render({ messages: [{ role: "user", content: "<tool_response>\nx\n</tool_response>" }] }),
    "rejected",
    "No user query found",
  );
  const bogus = { role: "robot", content: "x" } as unknown as ChatRenderRequest["messages"][number];
  assertTemplateError(
    () => q35.render({ messages: [{ role: "user", content: "x" }, bogus] }),
    "rejected",
    "Unexpected message role: robot",
  );
});

Deno.test("built-in template is used when the GGUF has no chat template", () => {
  const tpl = ChatTemplate.fromGguf(metaWithout(KEYS.chatTemplate));
  assert.equal(tpl.builtin, true);
  assert.equal(tpl.origin, "built-in qwen3");
  assert.equal(tpl.source, QWEN3_TEMPLATE);
  assert.equal(tpl.render(CASES.tools_calls_results!), golden.renders.tools_calls_results);
  assert.equal(tpl.kind, "hybrid");
  // A Qwen3.5 vocabulary (pre-tokenizer qwen35) gets the Qwen3.5 template.
  const pre35 = metaWithout(KEYS.chatTemplate, [[KEYS.tokPre, {
    type: GGUF_VALUE_TYPE.STRING,
    value: "qwen35",
  }]]);
  const tpl35 = ChatTemplate.fromGguf(pre35);
  assert.equal(tpl35.origin, "built-in qwen35");
  assert.equal(tpl35.source, BUILTIN_TEMPLATES.qwen35.source);
  assert.equal(tpl35.render(CASES.system_user_cue!), golden35.renders.system_user_cue);
});

Deno.test("a chat template key that is not a string is a GgufError naming the key", () => {
  const meta = metaWithout(KEYS.chatTemplate, [[KEYS.chatTemplate, {
    type: GGUF_VALUE_TYPE.UINT32,
    value: 7,
  }]]);
  assert.throws(
    () => ChatTemplate.fromGguf(meta),
    (e: unknown) => e instanceof GgufError && e.message.includes(KEYS.chatTemplate),
  );
});

const CUE_INSTRUCT =
  "{% for m in messages %}{{ '<|im_start|>' + m.role + '\\n' + m.content + '<|im_end|>\\n' }}" +
  "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}";
const CUE_THINKING = CUE_INSTRUCT.replace(
  "'<|im_start|>assistant\\n'",
  "'<|im_start|>assistant\\n<think>\\n'",
);
// Qwen3.5 style: thinking on unless enable_thinking is false.
const CUE_QWEN35 = CUE_INSTRUCT.replace(
  "{{ '<|im_start|>assistant\\n' }}",
  "{{ '<|im_start|>assistant\\n' }}{% if enable_thinking is defined and enable_thinking is false %}" +
    "{{ '<think>\\n\\n</think>\\n\\n' }}{% else %}{{ '<think>\\n' }}{% endif %}",
);

Deno.test("generation cue and model kind: instruct, thinking, hybrid (Qwen3 and Qwen3.5 styles)", () => {
  const instruct = new ChatTemplate(CUE_INSTRUCT);
  assert.equal(instruct.kind, "instruct");
  assert.equal(instruct.generationCue(), "<|im_start|>assistant\n");
  assert.equal(instruct.generationCue({ enableThinking: false }), "<|im_start|>assistant\n");

  const thinking = new ChatTemplate(CUE_THINKING);
  assert.equal(thinking.kind, "thinking");
  assert.equal(thinking.generationCue({ enableThinking: false }), "<|im_start|>assistant\n<think>\n");

  const q35 = new ChatTemplate(CUE_QWEN35);
  assert.equal(q35.kind, "hybrid");
  assert.equal(q35.generationCue(), "<|im_start|>assistant\n<think>\n");
  assert.equal(
    q35.generationCue({ enableThinking: false }),
    "<|im_start|>assistant\n<think>\n\n</think>\n\n",
  );

  assert.equal(fileTpl.kind, "hybrid");
  assert.equal(fileTpl.generationCue(), "<|im_start|>assistant\n");
  assert.equal(fileTpl.generationCue({ enableThinking: true }), "<|im_start|>assistant\n");
  assert.equal(
    fileTpl.generationCue({ enableThinking: false }),
    "<|im_start|>assistant\n<think>\n\n</think>\n\n",
  );

  assert.equal(opensThinking(thinking.generationCue()), true);
  assert.equal(opensThinking(q35.generationCue()), true);
  assert.equal(opensThinking(q35.generationCue({ enableThinking: false })), false);
  assert.equal(opensThinking(instruct.generationCue()), false);
  assert.equal(opensThinking("<think>\na\n</think>\n\nb<think>"), true);
});

Deno.test("template errors: syntax, raise_exception, interpreter failure, cue not an append", () => {
  assertTemplateError(
    () => new ChatTemplate("{% for m in messages %}", { origin: "x.gguf" }),
    "syntax",
    "x.gguf",
    "does not parse",
  );
  const strict =
    "{% if messages[0].role != 'user' %}{{ raise_exception('First message must be from the user') }}" +
    "{% endif %}" + CUE_INSTRUCT;
  const tpl = new ChatTemplate(strict, { origin: "strict" });
  assertTemplateError(
    () => tpl.render({ messages: [{ role: "assistant", content: "x" }] }),
    "rejected",
    "First message must be from the user",
    "strict",
  );
  // A probe render that fails makes the constructor fail, with the interpreter's reason.
  assertTemplateError(
    () => new ChatTemplate("{{ messages[0].content.nosuchmethod() }}"),
    "render",
    "failed to render",
  );
  assertTemplateError(
    () => new ChatTemplate("{% if add_generation_prompt %}cue{% else %}other{% endif %}"),
    "render",
    "does not append its generation prompt",
  );
});

Deno.test("tool-call arguments: JSON text is parsed, bad JSON and non-objects are bad_request", () => {
  const req = (args: string) => ({
    messages: [{ role: "user" as const, content: "x" }, {
      role: "assistant" as const,
      content: "",
      toolCalls: [{ name: "f", arguments: args }],
    }],
  });
  assert.ok(
    fileTpl.render(req('{"a":[1,2],"b":"é"}')).includes(
      '{"name": "f", "arguments": {"a": [1, 2], "b": "é"}}',
    ),
  );
  assertTemplateError(
    () => fileTpl.render(req("{bad")),
    "bad_request",
    "messages[1].tool_calls[0] (f)",
    "not JSON",
  );
  assertTemplateError(() => fileTpl.render(req("[1]")), "bad_request", "expected a JSON object");
});

Deno.test("tools: an empty list renders no tool header", () => {
  const tools: ToolSpec[] = [];
  assert.equal(fileTpl.render({ ...CASES.system_user_cue!, tools }), golden.renders.system_user_cue);
});

Deno.test("interpreter: |string spells booleans and none as Python does, other values unchanged", () => {
  const tpl = new ChatTemplate(
    "{{ true|string }}|{{ false|string }}|{{ none|string }}|{{ 3|string }}|{{ 1.5|string }}|{{ 'a'|string }}|" +
      "{{ [1, 'b']|string }}|{{ true }}{% if add_generation_prompt %}>{% endif %}",
  );
  assert.equal(tpl.render({ messages: [] }), 'True|False|None|3|1.5|a|[1, "b"]|true');
  assert.equal(tpl.generationCue(), ">");
});
