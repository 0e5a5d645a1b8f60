/**
 * `POST /v1/chat/completions`: the OpenAI Chat Completions API. The request is parsed whole into a
 * {@linkcode ChatCompletionsRequest} (messages with tool calls and tool results, tools, tool_choice,
 * max_tokens / max_completion_tokens, stop, seed, sampling, n = 1 only), rendered with the model's chat
 * template, generated, and answered as one `chat.completion` or as `data:` chunks ending in `[DONE]`
 * (with a usage chunk first when `stream_options.include_usage`). Reasoning comes back as
 * `reasoning_content` (the llama.cpp / DeepSeek convention); thinking is switched by
 * `chat_template_kwargs.enable_thinking` or `reasoning_effort: "none"`.
 * @module
 */
import type { Context } from "hono";
import {
  type ChatEvent,
  type ChatMessage,
  type ChatToolCall,
  opensThinking,
  renderPrompt,
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
  missing,
  objectAt,
  optArray,
  optBool,
  optNumber,
  optObject,
  optStops,
  optString,
  readJson,
  refuseUnsupported,
  reqArray,
  reqString,
  uniqueToolNames,
  wrongType,
} from "./_parse.ts";
import { ApiError } from "./errors.ts";
import { newId } from "./messages.ts";
import { streamResponse } from "./sse.ts";

/** A parsed Chat Completions request. */
export interface ChatCompletionsRequest {
  /** Requested model name (informational). */
  model: string | undefined;
  /** The conversation in template form. */
  messages: ChatMessage[];
  /** Tools offered (empty when none, or when tool_choice is `none`). */
  tools: ToolSpec[];
  /** max_completion_tokens ?? max_tokens. */
  maxTokens: number | undefined;
  /** Stop strings. */
  stops: string[];
  /** Stream chunks. */
  stream: boolean;
  /** Send a usage chunk before `[DONE]`. */
  includeUsage: boolean;
  /** Sampling fields sent. */
  sampling: SamplingInput;
  /** Template thinking switch when the request sets one. */
  enableThinking: boolean | undefined;
}

const ROLES = ["system", "developer", "user", "assistant", "tool"] as const;

/**
 * Parses a Chat Completions request body.
 * @throws {ApiError} 400 naming the first field that is missing or of the wrong type
 */
export function parseChatCompletionsRequest(body: Json): ChatCompletionsRequest {
  const raw = reqArray(body, "messages");
  if (raw.length === 0) {
    throw new ApiError("invalid_request", "Field messages is empty: send at least one message", {
      param: "messages",
    });
  }
  const callIds = new Set<string>();
  const messages = raw.map((_, i) => convertMessage(objectAt(raw, i, "messages"), `messages[${i}]`, callIds));
  const n = optNumber(body, "n", { min: 1, integer: true });
  if (n !== undefined && n !== 1) {
    throw new ApiError(
      "invalid_request",
      `Field n is ${n}: this server generates one choice per request (n=1)`,
      {
        param: "n",
      },
    );
  }
  const rawTools = optArray(body, "tools") ?? [];
  const tools = rawTools.map((_, i) => convertTool(objectAt(rawTools, i, "tools"), `tools[${i}]`));
  const names = uniqueToolNames(tools.map((t) => t.function.name), (i) => `tools[${i}].function.name`);
  const choice = body.tool_choice;
  if (typeof choice === "string") {
    if (!["none", "auto", "required"].includes(choice)) {
      throw new ApiError(
        "invalid_request",
        `Field tool_choice is ${JSON.stringify(choice)}, expected none, auto, required or an object`,
        { param: "tool_choice" },
      );
    }
    if (choice === "required") checkToolChoice(true, names, "tool_choice");
  } else {
    const o = optObject(body, "tool_choice");
    if (o !== undefined) {
      const type = optString(o, "type", "tool_choice");
      if (type !== undefined && type !== "function") {
        throw new ApiError(
          "invalid_request",
          `Field tool_choice.type is ${JSON.stringify(type)}, expected function`,
          { param: "tool_choice.type" },
        );
      }
      const fn = optObject(o, "function", "tool_choice");
      if (fn === undefined) throw missing("tool_choice.function", "an object with the tool's name");
      checkToolChoice(reqString(fn, "name", "tool_choice.function"), names, "tool_choice.function.name");
    }
  }
  refuseUnsupported(body, "logprobs", "this server does not return token log-probabilities");
  refuseUnsupported(body, "top_logprobs", "this server does not return token log-probabilities");
  refuseUnsupported(body, "logit_bias", "this server's sampler takes no per-token bias");
  if (isObject(body.response_format) && body.response_format.type !== "text") {
    refuseUnsupported(body, "response_format", "this server has no constrained (JSON) decoding");
  } else if (body.response_format !== undefined && body.response_format !== null) {
    optObject(body, "response_format");
  }
  const streamOptions = optObject(body, "stream_options");
  const kwargs = optObject(body, "chat_template_kwargs");
  const effort = optString(body, "reasoning_effort");
  const enableThinking =
    (kwargs === undefined ? undefined : optBool(kwargs, "enable_thinking", "chat_template_kwargs")) ??
      (effort === undefined ? undefined : effort !== "none");
  const maxTokens = optNumber(body, "max_completion_tokens", { min: 1, integer: true }) ??
    optNumber(body, "max_tokens", { min: 1, integer: true });
  return {
    model: optString(body, "model"),
    messages,
    tools: choice === "none" ? [] : tools,
    maxTokens,
    stops: optStops(body, "stop"),
    stream: optBool(body, "stream") ?? false,
    includeUsage: (streamOptions && optBool(streamOptions, "include_usage", "stream_options")) ?? false,
    sampling: {
      temperature: optNumber(body, "temperature", { min: 0, max: 2 }),
      topP: optNumber(body, "top_p", { min: 0, max: 1 }),
      topK: optNumber(body, "top_k", { min: 0, integer: true }),
      minP: optNumber(body, "min_p", { min: 0, max: 1 }),
      seed: optNumber(body, "seed", { integer: true }),
      repeatPenalty: optNumber(body, "repeat_penalty", { min: 0 }),
      presencePenalty: optNumber(body, "presence_penalty", { min: -2, max: 2 }),
      frequencyPenalty: optNumber(body, "frequency_penalty", { min: -2, max: 2 }),
    },
    enableThinking,
  };
}

/** Message content: a string, null, or an array of text parts. */
function contentText(v: unknown, path: string): string | null {
  if (v === undefined || v === null) return null;
  if (typeof v === "string") return v;
  if (!Array.isArray(v)) throw wrongType(path, v, "a string, null or an array of content parts");
  return v.map((_, j) => {
    const p = objectAt(v, j, path);
    const type = reqString(p, "type", at(path, j));
    if (type !== "text") {
      throw new ApiError(
        "invalid_request",
        `Field ${at(path, j)}.type is ${
          JSON.stringify(type)
        }: this server runs a text-only model (text parts only)`,
        { param: `${at(path, j)}.type` },
      );
    }
    return reqString(p, "text", at(path, j));
  }).join("");
}

function convertMessage(m: Json, path: string, callIds: Set<string>): ChatMessage {
  const role = reqString(m, "role", path);
  if (!(ROLES as readonly string[]).includes(role)) {
    throw new ApiError(
      "invalid_request",
      `Field ${path}.role is ${JSON.stringify(role)}, expected one of ${ROLES.join(", ")}`,
      { param: `${path}.role` },
    );
  }
  const content = contentText(m.content, `${path}.content`);
  switch (role) {
    case "system":
    case "developer":
      return { role: "system", content: content ?? "" };
    case "user":
      return { role: "user", content: content ?? "" };
    case "tool": {
      const id = optString(m, "tool_call_id", path);
      if (id !== undefined && !callIds.has(id)) {
        throw new ApiError(
          "invalid_request",
          `Field ${path}.tool_call_id is ${JSON.stringify(id)}, which no earlier assistant tool call has: ` +
            `answer only tool calls made in this conversation`,
          { param: `${path}.tool_call_id` },
        );
      }
      return { role: "tool", content: content ?? "", toolCallId: id };
    }
    default: {
      const msg: ChatMessage = { role: "assistant", content };
      const reasoning = optString(m, "reasoning_content", path);
      if (reasoning !== undefined) msg.reasoningContent = reasoning;
      const calls = optArray(m, "tool_calls", path);
      if (calls !== undefined && calls.length > 0) {
        msg.toolCalls = calls.map((_, k): ChatToolCall => {
          const cp = `${path}.tool_calls[${k}]`;
          const call = objectAt(calls, k, `${path}.tool_calls`);
          const fn = optObject(call, "function", cp);
          if (fn === undefined) throw wrongType(`${cp}.function`, call.function, "an object");
          const args = fn.arguments;
          if (
            typeof args !== "string" && (typeof args !== "object" || args === null || Array.isArray(args))
          ) {
            throw wrongType(`${cp}.function.arguments`, args, "a JSON object text");
          }
          const id = optString(call, "id", cp);
          if (id !== undefined) callIds.add(id);
          return {
            id,
            name: reqString(fn, "name", `${cp}.function`),
            arguments: args as string | Record<string, unknown>,
          };
        });
      }
      return msg;
    }
  }
}

function convertTool(t: Json, path: string): ToolSpec {
  const type = reqString(t, "type", path);
  if (type !== "function") {
    throw new ApiError(
      "invalid_request",
      `Field ${path}.type is ${JSON.stringify(type)}, expected function`,
      {
        param: `${path}.type`,
      },
    );
  }
  const fn = optObject(t, "function", path);
  if (fn === undefined) throw wrongType(`${path}.function`, t.function, "an object");
  const name = reqString(fn, "name", `${path}.function`);
  optString(fn, "description", `${path}.function`);
  optObject(fn, "parameters", `${path}.function`);
  return { type: "function", function: { ...fn, name } };
}

/** OpenAI `finish_reason` of an end reason. */
export function openaiFinishReason(r: EndReason): string {
  switch (r) {
    case "eos":
    case "stop":
    case "cancelled":
      return "stop";
    case "max_tokens":
    case "context":
      return "length";
    case "tool_use":
      return "tool_calls";
    default: {
      const never: never = r;
      throw new Error(`Internal error: unknown end reason ${String(never)}`);
    }
  }
}

interface ToolCallOut {
  id: string;
  type: "function";
  function: { name: string; arguments: string };
}

function usage(r: RunResult): Record<string, unknown> {
  return {
    prompt_tokens: r.promptTokens,
    completion_tokens: r.outputTokens,
    total_tokens: r.promptTokens + r.outputTokens,
    prompt_tokens_details: { cached_tokens: r.cachedTokens },
  };
}

/** The `POST /v1/chat/completions` handler. */
export function chatCompletionsHandler(deps: ServerDeps): (c: Context<AppEnv>) => Promise<Response> {
  return async (c) => {
    const requestId = c.get("requestId");
    const body = await readJson(c.req.raw, deps.bodyLimitBytes);
    const req = parseChatCompletionsRequest(body);
    const nCtx = readyContext(deps.engine);
    const { text, ids: prompt } = renderPrompt(deps.template, deps.tokenizer, {
      messages: req.messages,
      tools: req.tools,
      addGenerationPrompt: true,
      enableThinking: req.enableThinking,
    });
    const field = body.max_completion_tokens !== undefined ? "max_completion_tokens" : "max_tokens";
    const maxTokens = checkLengths(prompt.length, req.maxTokens, nCtx, field);
    const model = deps.engine.status().model;
    const id = newId("chatcmpl-");
    const created = Math.floor(Date.now() / 1000);
    const run = (signal: AbortSignal, onEvent: (e: ChatEvent) => void, onFirstToken?: () => void) =>
      runGeneration(deps, {
        prompt,
        maxTokens,
        sampling: samplingFor(req.sampling, deps),
        stops: req.stops,
        parse: { tools: req.tools, startInThinking: opensThinking(text) },
        signal,
        trace: c.get("trace"),
        onFirstToken,
        onEvent: (e) => {
          if (e.type !== "raw") onEvent(e);
        },
      });
    const toolCall = (e: Extract<ChatEvent, { type: "tool_call" }>): ToolCallOut => ({
      id: newId("call_"),
      type: "function",
      function: { name: e.call.name, arguments: JSON.stringify(e.call.arguments) },
    });

    if (!req.stream) {
      let content = "";
      let reasoning = "";
      const calls: ToolCallOut[] = [];
      const r = await run(c.req.raw.signal, (e) => {
        if (e.type === "text") content += e.text;
        else if (e.type === "thinking") reasoning += e.text;
        else calls.push(toolCall(e));
      });
      const message: Record<string, unknown> = {
        role: "assistant",
        content: content === "" && calls.length > 0 ? null : content,
      };
      if (reasoning !== "") message.reasoning_content = reasoning;
      if (calls.length > 0) message.tool_calls = calls;
      return c.json(
        {
          id,
          object: "chat.completion",
          created,
          model,
          choices: [{ index: 0, message, finish_reason: openaiFinishReason(r.reason), logprobs: null }],
          usage: usage(r),
        },
        200,
        { "request-id": requestId },
      );
    }
    return await streamResponse("openai", { requestId, requestSignal: c.req.raw.signal }, async (sse) => {
      const chunk = (delta: Record<string, unknown>, finish: string | null) => {
        const out: Record<string, unknown> = {
          id,
          object: "chat.completion.chunk",
          created,
          model,
          choices: [{ index: 0, delta, finish_reason: finish, logprobs: null }],
        };
        if (req.includeUsage) out.usage = null;
        sse.send(undefined, out);
      };
      let started = false;
      const begin = () => {
        if (started) return;
        started = true;
        chunk({ role: "assistant", content: "" }, null);
      };
      let nCalls = 0;
      const r = await run(sse.signal, (e) => {
        begin();
        if (e.type === "text") chunk({ content: e.text }, null);
        else if (e.type === "thinking") chunk({ reasoning_content: e.text }, null);
        else chunk({ tool_calls: [{ index: nCalls++, ...toolCall(e) }] }, null);
      }, begin);
      begin();
      chunk({}, openaiFinishReason(r.reason));
      if (req.includeUsage) {
        sse.send(undefined, {
          id,
          object: "chat.completion.chunk",
          created,
          model,
          choices: [],
          usage: usage(r),
        });
      }
      sse.send(undefined, "[DONE]");
    });
  };
}
