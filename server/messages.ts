/**
 * `POST /v1/messages`: the Anthropic Messages API. The request is parsed whole into a
 * {@linkcode MessagesRequest} (system, text / tool_use / tool_result / thinking blocks, tools, tool_choice,
 * max_tokens, stop_sequences, thinking, sampling), rendered with the model's chat template, generated, and
 * answered as one JSON message or as the SSE event sequence message_start, content_block_start, ping,
 * content_block_delta…, content_block_stop, message_delta, message_stop.
 *
 * `tool_choice` `none` withholds the tools from the prompt; `any` and `tool` are checked against the tools
 * sent (some tools; a declared name) but cannot be enforced without constrained decoding and are treated as
 * `auto`. Tool names must be unique and a tool_result must answer an earlier tool_use id. `metadata` is
 * accepted and ignored.
 * @module
 */
import type { Context } from "hono";
import {
  type ChatEvent,
  type ChatMessage,
  type ChatPrompt,
  type ChatTemplate,
  type ChatToolCall,
  opensThinking,
  renderPrompt,
  type Tokenizer,
  type ToolSpec,
} from "../engine/mod.ts";
import {
  type AppEnv,
  checkLengths,
  type EndReason,
  readyContext,
  runGeneration,
  type RunResult,
  samplingFor,
  type SamplingInput,
  type ServerDeps,
} from "./_generate.ts";
import {
  at,
  checkToolChoice,
  isObject,
  type Json,
  objectAt,
  optArray,
  optBool,
  optNumber,
  optObject,
  optStops,
  optString,
  readJson,
  reqArray,
  reqString,
  uniqueToolNames,
  wrongType,
} from "./_parse.ts";
import { ApiError } from "./errors.ts";
import { streamResponse } from "./sse.ts";

/** A parsed Messages request. */
export interface MessagesRequest {
  /** Requested model name (informational: the server serves one model). */
  model: string | undefined;
  /** The conversation in template form (system first when given). */
  messages: ChatMessage[];
  /** Tools offered (empty when none, or when tool_choice is `none`). */
  tools: ToolSpec[];
  /** Most tokens to generate. */
  maxTokens: number;
  /** Stop strings. */
  stops: string[];
  /** Stream SSE events. */
  stream: boolean;
  /** Sampling fields sent. */
  sampling: SamplingInput;
  /** `thinking.type` when sent. */
  thinking: "enabled" | "disabled" | "adaptive" | undefined;
}

/**
 * Parses a Messages request body.
 * @throws {ApiError} 400 naming the first field that is missing or of the wrong type
 */
export function parseMessagesRequest(body: Json): MessagesRequest {
  const model = optString(body, "model");
  const maxTokens = optNumber(body, "max_tokens", { min: 1, integer: true });
  if (maxTokens === undefined) {
    throw new ApiError("invalid_request", "Field max_tokens is required: send an integer >= 1", {
      param: "max_tokens",
    });
  }
  const messages: ChatMessage[] = [];
  const system = body.system;
  if (system !== undefined && system !== null) {
    messages.push({ role: "system", content: textOf(system, "system") });
  }
  const raw = reqArray(body, "messages");
  if (raw.length === 0) {
    throw new ApiError("invalid_request", "Field messages is empty: send at least one user message", {
      param: "messages",
    });
  }
  const toolUseIds = new Set<string>();
  raw.forEach((_, i) =>
    messages.push(...convertMessage(objectAt(raw, i, "messages"), `messages[${i}]`, toolUseIds))
  );

  const rawTools = optArray(body, "tools") ?? [];
  const tools = rawTools.map((_, i) => convertTool(objectAt(rawTools, i, "tools"), `tools[${i}]`));
  const names = uniqueToolNames(tools.map((t) => t.function.name), (i) => `tools[${i}].name`);
  const toolChoice = optObject(body, "tool_choice");
  let choice = "auto";
  if (toolChoice !== undefined) {
    choice = optString(toolChoice, "type", "tool_choice") ?? "auto";
    if (!["auto", "any", "tool", "none"].includes(choice)) {
      throw new ApiError(
        "invalid_request",
        `Field tool_choice.type is ${JSON.stringify(choice)}, expected one of auto, any, tool, none`,
        { param: "tool_choice.type" },
      );
    }
    if (choice === "any") checkToolChoice(true, names, "tool_choice");
    if (choice === "tool") {
      checkToolChoice(reqString(toolChoice, "name", "tool_choice"), names, "tool_choice.name");
    }
  }

  const thinkingObj = optObject(body, "thinking");
  let thinking: MessagesRequest["thinking"];
  if (thinkingObj !== undefined) {
    const t = reqString(thinkingObj, "type", "thinking");
    if (t !== "enabled" && t !== "disabled" && t !== "adaptive") {
      throw new ApiError(
        "invalid_request",
        `Field thinking.type is ${JSON.stringify(t)}, expected enabled, disabled or adaptive`,
        { param: "thinking.type" },
      );
    }
    optNumber(thinkingObj, "budget_tokens", { min: 0, integer: true }, "thinking");
    thinking = t;
  }
  optObject(body, "metadata");
  return {
    model,
    messages,
    tools: choice === "none" ? [] : tools,
    maxTokens,
    stops: optStops(body, "stop_sequences"),
    stream: optBool(body, "stream") ?? false,
    sampling: {
      temperature: optNumber(body, "temperature", { min: 0, max: 2 }),
      topP: optNumber(body, "top_p", { min: 0, max: 1 }),
      topK: optNumber(body, "top_k", { min: 0, integer: true }),
    },
    thinking,
  };
}

/** Text of a `system` value or tool_result content: a string or an array of text blocks. */
function textOf(v: unknown, path: string): string {
  if (typeof v === "string") return v;
  if (!Array.isArray(v)) throw wrongType(path, v, "a string or an array of text blocks");
  return v.map((_, j) => {
    const b = objectAt(v, j, path);
    const type = reqString(b, "type", at(path, j));
    if (type !== "text") throw unsupportedBlock(at(path, j), type, "text");
    return reqString(b, "text", at(path, j));
  }).join("\n");
}

function unsupportedBlock(path: string, type: string, allowed: string): ApiError {
  const why = type === "image" || type === "document"
    ? ": this server runs a text-only model"
    : `, expected one of ${allowed}`;
  return new ApiError("invalid_request", `Field ${path}.type is ${JSON.stringify(type)}${why}`, {
    param: `${path}.type`,
  });
}

/** One API message → template messages (tool results become `tool` messages before the user's text). */
function convertMessage(m: Json, path: string, toolUseIds: Set<string>): ChatMessage[] {
  const role = reqString(m, "role", path);
  if (role !== "user" && role !== "assistant") {
    throw new ApiError(
      "invalid_request",
      `Field ${path}.role is ${JSON.stringify(role)}, expected user or assistant`,
      {
        param: `${path}.role`,
      },
    );
  }
  const content = m.content;
  if (typeof content === "string") return [{ role, content }];
  if (!Array.isArray(content)) {
    throw wrongType(`${path}.content`, content, "a string or an array of content blocks");
  }
  const texts: string[] = [];
  const out: ChatMessage[] = [];
  const calls: ChatToolCall[] = [];
  let reasoning: string | undefined;
  content.forEach((_, j) => {
    const bp = `${path}.content[${j}]`;
    const b = objectAt(content, j, `${path}.content`);
    const type = reqString(b, "type", bp);
    if (type === "text") texts.push(reqString(b, "text", bp));
    else if (type === "tool_result" && role === "user") {
      const id = reqString(b, "tool_use_id", bp);
      if (!toolUseIds.has(id)) {
        throw new ApiError(
          "invalid_request",
          `Field ${bp}.tool_use_id is ${
            JSON.stringify(id)
          }, which no earlier assistant tool_use block has: ` +
            `answer only tool calls made in this conversation`,
          { param: `${bp}.tool_use_id` },
        );
      }
      const c = b.content === undefined || b.content === null ? "" : textOf(b.content, `${bp}.content`);
      optBool(b, "is_error", bp);
      out.push({ role: "tool", content: c, toolCallId: id });
    } else if (type === "tool_use" && role === "assistant") {
      const input = b.input;
      if (!isObject(input)) throw wrongType(`${bp}.input`, input, "an object");
      const id = reqString(b, "id", bp);
      toolUseIds.add(id);
      calls.push({ id, name: reqString(b, "name", bp), arguments: input });
    } else if (type === "thinking" && role === "assistant") {
      reasoning = (reasoning ?? "") + reqString(b, "thinking", bp);
    } else if (type !== "redacted_thinking") {
      throw unsupportedBlock(bp, type, role === "user" ? "text, tool_result" : "text, tool_use, thinking");
    }
  });
  if (role === "user") {
    if (texts.length > 0 || out.length === 0) out.push({ role: "user", content: texts.join("\n") });
    return out;
  }
  const msg: ChatMessage = { role: "assistant", content: texts.join("\n") };
  if (calls.length > 0) msg.toolCalls = calls;
  if (reasoning !== undefined) msg.reasoningContent = reasoning;
  return [msg];
}

function convertTool(t: Json, path: string): ToolSpec {
  const type = optString(t, "type", path);
  if (type !== undefined && type !== "custom") {
    throw new ApiError(
      "invalid_request",
      `Field ${path}.type is ${
        JSON.stringify(type)
      }: only custom tools (name, description, input_schema) are ` +
        `supported`,
      { param: `${path}.type` },
    );
  }
  const name = reqString(t, "name", path);
  const description = optString(t, "description", path);
  const schema = optObject(t, "input_schema", path);
  if (schema === undefined) throw wrongType(`${path}.input_schema`, t.input_schema, "a JSON Schema object");
  return {
    type: "function",
    function: { name, ...(description === undefined ? {} : { description }), parameters: schema },
  };
}

/** Anthropic `stop_reason` of an end reason (`cancelled` never reaches a client that is still there). */
export function anthropicStopReason(r: EndReason): string {
  switch (r) {
    case "eos":
    case "cancelled":
      return "end_turn";
    case "stop":
      return "stop_sequence";
    case "max_tokens":
    case "context":
      return "max_tokens";
    case "tool_use":
      return "tool_use";
    default: {
      const never: never = r;
      throw new Error(`Internal error: unknown end reason ${String(never)}`);
    }
  }
}

type Block =
  | { type: "thinking"; thinking: string; signature: string }
  | { type: "text"; text: string }
  | { type: "tool_use"; id: string; name: string; input: Record<string, unknown> };

/** Random id with a prefix (`msg_…`, `toolu_…`). */
export function newId(prefix: string): string {
  const b = crypto.getRandomValues(new Uint8Array(12));
  return prefix + Array.from(b, (x) => x.toString(16).padStart(2, "0")).join("");
}

/**
 * Assembles content blocks from chat events and, when `send` is given, writes the matching stream events
 * (block starts, a ping after the first, deltas, block stops).
 */
class BlockAssembler {
  readonly content: Block[] = [];
  #open = false;
  #pinged = false;
  readonly #send: ((event: string, data: unknown) => void) | undefined;

  constructor(send?: (event: string, data: unknown) => void) {
    this.#send = send;
  }

  push(e: ChatEvent): void {
    const last = this.content.at(-1);
    if (e.type === "tool_call") {
      this.#close();
      const block: Block = {
        type: "tool_use",
        id: newId("toolu_"),
        name: e.call.name,
        input: e.call.arguments,
      };
      this.#start({ ...block, input: {} });
      this.content.push(block);
      this.#delta({ type: "input_json_delta", partial_json: JSON.stringify(block.input) });
      this.#close();
      return;
    }
    if (!this.#open || last === undefined || last.type !== e.type) {
      this.#close();
      const block: Block = e.type === "text"
        ? { type: "text", text: "" }
        : { type: "thinking", thinking: "", signature: "" };
      this.#start(e.type === "text" ? { type: "text", text: "" } : { type: "thinking", thinking: "" });
      this.content.push(block);
    }
    const cur = this.content.at(-1)!;
    if (cur.type === "text") {
      cur.text += e.text;
      this.#delta({ type: "text_delta", text: e.text });
    } else if (cur.type === "thinking") {
      cur.thinking += e.text;
      this.#delta({ type: "thinking_delta", thinking: e.text });
    }
  }

  /** Closes the open block; sends the ping when no block ever opened. */
  finish(): void {
    this.#close();
    if (!this.#pinged) {
      this.#pinged = true;
      this.#send?.("ping", { type: "ping" });
    }
  }

  #start(block: unknown): void {
    this.#open = true;
    this.#send?.("content_block_start", {
      type: "content_block_start",
      index: this.content.length,
      content_block: block,
    });
    if (!this.#pinged) {
      this.#pinged = true;
      this.#send?.("ping", { type: "ping" });
    }
  }

  #delta(delta: unknown): void {
    this.#send?.("content_block_delta", {
      type: "content_block_delta",
      index: this.content.length - 1,
      delta,
    });
  }

  #close(): void {
    if (!this.#open) return;
    this.#open = false;
    const index = this.content.length - 1;
    if (this.content[index]?.type === "thinking") {
      this.#send?.("content_block_delta", {
        type: "content_block_delta",
        index,
        delta: { type: "signature_delta", signature: "" },
      });
    }
    this.#send?.("content_block_stop", { type: "content_block_stop", index });
  }
}

function usage(r: RunResult): Record<string, number> {
  return {
    input_tokens: r.promptTokens,
    output_tokens: r.outputTokens,
    cache_read_input_tokens: r.cachedTokens,
  };
}

/**
 * Renders a request to a prompt (client strings can spell no control token). `thinking` switches a hybrid
 * template's thinking mode (off unless enabled, as in the Anthropic API). A final assistant message with
 * text and no tool calls is a prefill: the prompt ends right after its text, and the reply continues it.
 * @throws {ChatTemplateError} when the template rejects the conversation
 */
export function renderMessagesPrompt(
  template: ChatTemplate,
  tokenizer: Tokenizer,
  req: MessagesRequest,
): ChatPrompt {
  const enableThinking = template.kind === "hybrid"
    ? req.thinking === "enabled" || req.thinking === "adaptive"
    : undefined;
  const last = req.messages.at(-1);
  const prefill = last?.role === "assistant" && (last.toolCalls ?? []).length === 0
    ? (last.content ?? "").trimEnd()
    : "";
  return renderPrompt(template, tokenizer, {
    messages: req.messages,
    tools: req.tools,
    addGenerationPrompt: true,
    enableThinking,
  }, { prefill });
}

/** The `POST /v1/messages/count_tokens` handler: `{"input_tokens": n}` for a Messages request. */
export function countTokensHandler(deps: ServerDeps): (c: Context<AppEnv>) => Promise<Response> {
  return async (c) => {
    const body = await readJson(c.req.raw, deps.bodyLimitBytes);
    // count_tokens takes no max_tokens; the parser's other checks apply unchanged.
    const req = parseMessagesRequest({ ...body, max_tokens: 1 });
    return c.json({ input_tokens: renderMessagesPrompt(deps.template, deps.tokenizer, req).ids.length });
  };
}

/** The `POST /v1/messages` handler. */
export function messagesHandler(deps: ServerDeps): (c: Context<AppEnv>) => Promise<Response> {
  return async (c) => {
    const requestId = c.get("requestId");
    const body = await readJson(c.req.raw, deps.bodyLimitBytes);
    const req = parseMessagesRequest(body);
    const nCtx = readyContext(deps.engine);
    const { text, ids: prompt } = renderMessagesPrompt(deps.template, deps.tokenizer, req);
    const maxTokens = checkLengths(prompt.length, req.maxTokens, nCtx, "max_tokens");
    const model = deps.engine.status().model;
    const id = newId("msg_");
    const run = (signal: AbortSignal, onEvent: (e: ChatEvent) => void, onFirstToken?: () => void) =>
      runGeneration(deps, {
        onFirstToken,
        prompt,
        maxTokens,
        sampling: samplingFor(req.sampling, deps),
        stops: req.stops,
        parse: { tools: req.tools, startInThinking: opensThinking(text) },
        signal,
        trace: c.get("trace"),
        onEvent: (e) => {
          if (e.type !== "raw") onEvent(e);
        },
      });

    if (!req.stream) {
      const blocks = new BlockAssembler();
      const r = await run(c.req.raw.signal, (e) => blocks.push(e));
      return c.json(
        {
          id,
          type: "message",
          role: "assistant",
          model,
          content: blocks.content,
          stop_reason: anthropicStopReason(r.reason),
          stop_sequence: r.stopSequence ?? null,
          usage: usage(r),
        },
        200,
        { "request-id": requestId },
      );
    }
    return await streamResponse("anthropic", { requestId, requestSignal: c.req.raw.signal }, async (sse) => {
      let started = false;
      const begin = () => {
        if (started) return;
        started = true;
        sse.send("message_start", {
          type: "message_start",
          message: {
            id,
            type: "message",
            role: "assistant",
            model,
            content: [],
            stop_reason: null,
            stop_sequence: null,
            usage: { input_tokens: prompt.length, output_tokens: 0 },
          },
        });
      };
      const blocks = new BlockAssembler((event, data) => {
        begin();
        sse.send(event, data);
      });
      const r = await run(sse.signal, (e) => blocks.push(e), begin);
      begin();
      blocks.finish();
      sse.send("message_delta", {
        type: "message_delta",
        delta: { stop_reason: anthropicStopReason(r.reason), stop_sequence: r.stopSequence ?? null },
        usage: usage(r),
      });
      sse.send("message_stop", { type: "message_stop" });
    });
  };
}
