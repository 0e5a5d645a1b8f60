/**
 * The embedded default model's chat template (issue #22: it dropped `tools`, so a request's input tokens
 * were the same with and without them): the tiny synthetic qwen35moe the head serves without `--model`
 * renders the tool block, tool calls and tool results as the built-in Qwen3.5 template does (the one that
 * renders as the published template, tests/golden/chat_template_qwen35.json).
 */
import assert from "node:assert/strict";
import {
  ChatTemplate,
  openGguf,
  planModel,
  QWEN35_TEMPLATE,
  renderPrompt,
  synthesize,
  Tokenizer,
  type ToolSpec,
} from "../engine/mod.ts";

const WEATHER: ToolSpec = {
  type: "function",
  function: {
    name: "get_weather",
    description: "Current weather for a city",
    parameters: { type: "object", properties: { city: { type: "string" } }, required: ["city"] },
  },
};

Deno.test("default model template: tools are rendered, as the built-in Qwen3.5 template renders them", async () => {
  const dir = await Deno.makeTempDir({ prefix: "default_template_test_" });
  try {
    const path = `${dir}/tiny.gguf`;
    // The model the head and the engine serve when no --model is given (cli/head.ts, engine/serve/worker.ts).
    await synthesize(planModel({ arch: "qwen35moe", preset: "tiny", quant: "q8_0", seed: 1 }), { out: path });
    using f = await openGguf(path);
    const template = ChatTemplate.fromGguf(f.metadata);
    const tokenizer = Tokenizer.fromGguf(f.metadata);
    const builtin = new ChatTemplate(QWEN35_TEMPLATE, { origin: "built-in qwen35", builtin: true });
    const messages = [
      { role: "system" as const, content: "Be brief." },
      { role: "user" as const, content: "Weather in Paris?" },
    ];
    const plain = renderPrompt(template, tokenizer, { messages, addGenerationPrompt: true });
    const withTools = renderPrompt(template, tokenizer, {
      messages,
      tools: [WEATHER],
      addGenerationPrompt: true,
    });
    assert.ok(withTools.ids.length > plain.ids.length, "tools add input tokens");
    assert.match(
      withTools.text,
      /<tools>\n\{"type": ?"function".*"get_weather".*Current weather for a city/s,
    );
    assert.match(withTools.text, /Be brief\.<\|im_end\|>/, "the system prompt follows the tool block");
    const conversation = {
      messages: [
        ...messages,
        {
          role: "assistant" as const,
          content: "",
          toolCalls: [{ id: "c1", name: "get_weather", arguments: { city: "Paris" } }],
        },
        { role: "tool" as const, content: "18 C, sunny", toolCallId: "c1" },
      ],
      tools: [WEATHER],
      addGenerationPrompt: true,
    };
    assert.equal(template.render(conversation), builtin.render(conversation));
    assert.match(template.render(conversation), /<function=get_weather>\n<parameter=city>\nParis/);
    assert.match(template.render(conversation), /<tool_response>\n18 C, sunny\n<\/tool_response>/);
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});
