/**
 * Chat-template golden cases: the requests rendered into `chat_template_qwen3.json` by
 * `gen_chat_template.ts` (beside this file) and checked by `engine/text/template_test.ts`.
 * @module
 */
import type { ChatRenderRequest, ToolSpec } from "../../engine/text/template.ts";

const WEATHER: ToolSpec = {
  type: "function",
  function: {
    name: "get_weather",
    description: "Current weather for a city",
    parameters: {
      type: "object",
      properties: { city: { type: "string" }, days: { type: "integer" } },
      required: ["city"],
    },
  },
};

const TIME: ToolSpec = {
  type: "function",
  function: {
    name: "get_time",
    description: "Heure locale à Zürich, 日本",
    parameters: { type: "object", properties: { tz: { type: "string" } } },
  },
};

/** Named render requests; names are stable keys of the golden file. */
export const CASES: Readonly<Record<string, ChatRenderRequest>> = {
  // spec/chat.md §5 "Example (Instruct, no tools)": hand-checked, see template_test.ts.
  system_user_cue: {
    messages: [{ role: "system", content: "You are helpful." }, { role: "user", content: "Hi" }],
    addGenerationPrompt: true,
  },
  user_only_no_cue: { messages: [{ role: "user", content: "Hi" }] },
  multi_turn: {
    messages: [
      { role: "system", content: "Be brief." },
      { role: "user", content: "What is 2+2?" },
      { role: "assistant", content: "4", reasoningContent: "Simple sum." },
      { role: "user", content: "And 3+3?" },
      { role: "assistant", content: "<think>\nAdd.\n</think>\n\n6" },
      { role: "user", content: "Thanks" },
    ],
    addGenerationPrompt: true,
  },
  tools_calls_results: {
    messages: [
      { role: "system", content: "You are helpful." },
      { role: "user", content: "Weather and time in Paris?" },
      {
        role: "assistant",
        content: "Let me check.",
        reasoningContent: "Two tools needed.",
        toolCalls: [
          { id: "c1", name: "get_weather", arguments: '{"city":"Paris","days":2}' },
          { id: "c2", name: "get_time", arguments: { tz: "Europe/Paris" } },
        ],
      },
      { role: "tool", content: '{"temp": 18}', toolCallId: "c1" },
      { role: "tool", content: "12:00", toolCallId: "c2" },
      { role: "assistant", content: "18°C, noon." },
      { role: "user", content: "Thanks" },
    ],
    tools: [WEATHER, TIME],
    addGenerationPrompt: true,
  },
  tools_no_system: {
    messages: [{ role: "user", content: "Weather?" }],
    tools: [WEATHER],
    addGenerationPrompt: true,
  },
  tool_call_null_content_last: {
    messages: [
      { role: "user", content: "Weather in Oslo?" },
      { role: "assistant", content: null, toolCalls: [{ name: "get_weather", arguments: { city: "Oslo" } }] },
      { role: "tool", content: "-3" },
    ],
    tools: [WEATHER],
    addGenerationPrompt: true,
  },
  thinking_off: {
    messages: [{ role: "user", content: "Hi" }],
    addGenerationPrompt: true,
    enableThinking: false,
  },
  thinking_on: {
    messages: [{ role: "user", content: "Hi" }],
    addGenerationPrompt: true,
    enableThinking: true,
  },
  current_turn_reasoning: {
    messages: [
      { role: "user", content: "Hi" },
      { role: "assistant", content: "\n<think>\n\nGreet back.\n\n</think>\n\nHello!" },
    ],
  },
  typed_arguments: {
    messages: [
      { role: "user", content: "Search" },
      {
        role: "assistant",
        content: "",
        toolCalls: [{
          name: "search",
          arguments: {
            q: "two\nlines",
            n: 3,
            x: 1.5,
            ok: true,
            no: false,
            none: null,
            o: { a: [1] },
            l: ["é"],
          },
        }],
      },
    ],
  },
  system_not_first: {
    messages: [
      { role: "user", content: "Hi" },
      { role: "system", content: "Switch to French." },
      { role: "user", content: "Bonjour ?" },
    ],
    addGenerationPrompt: true,
  },
};
