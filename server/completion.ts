/**
 * `POST /completion`: llama.cpp-style raw completion. The prompt is text (no template; control-token
 * spellings such as `<|im_start|>` become control tokens unless `parse_special` is false) or token ids; the output is raw text (no thinking or tool-call parsing), with the ids
 * when `return_tokens` is set. Streaming sends `data: {"content", "tokens", "stop": false}` frames and a final
 * `stop: true` frame with the counts; errors use the OpenAI error shape, as llama.cpp does.
 * @module
 */
import type { Context } from "hono";
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
  type Json,
  missing,
  optBool,
  optNumber,
  optStops,
  readJson,
  refuseUnsupported,
  wrongType,
} from "./_parse.ts";
import { ApiError } from "./errors.ts";
import { streamResponse } from "./sse.ts";

/** A parsed `/completion` request. */
export interface CompletionRequest {
  /** Prompt text or ids. */
  prompt: string | number[];
  /** Tokenize prompt text with control-token spellings as control tokens (default true, as llama.cpp). */
  parseSpecial: boolean;
  /** Tokens to generate; undefined: until the context is full. */
  nPredict: number | undefined;
  /** Stop strings. */
  stops: string[];
  /** Stream frames. */
  stream: boolean;
  /** Include generated ids in the response. */
  returnTokens: boolean;
  /** Sampling fields sent. */
  sampling: SamplingInput;
}

/**
 * Parses a `/completion` body.
 * @throws {ApiError} 400 naming the field
 */
export function parseCompletionRequest(body: Json, nVocab: number): CompletionRequest {
  const p = body.prompt;
  let prompt: string | number[];
  if (p === undefined || p === null) throw missing("prompt", "a string or an array of token ids");
  if (typeof p === "string") prompt = p;
  else if (Array.isArray(p)) {
    prompt = p.map((id, i) => {
      if (typeof id !== "number" || !Number.isInteger(id) || id < 0 || id >= nVocab) {
        throw new ApiError(
          "invalid_request",
          `Field ${at("prompt", i)} is ${JSON.stringify(id)}, expected a token id in [0, ${nVocab})`,
          { param: "prompt" },
        );
      }
      return id;
    });
  } else throw wrongType("prompt", p, "a string or an array of token ids");
  const n = optNumber(body, "n_predict", { min: -1, integer: true }) ??
    optNumber(body, "max_tokens", { min: 1, integer: true });
  if (n === 0) {
    throw new ApiError(
      "invalid_request",
      "Field n_predict is 0: ask for at least one token (-1: until the context is full)",
      {
        param: "n_predict",
      },
    );
  }
  refuseUnsupported(body, "n_probs", "this server does not return token probabilities");
  refuseUnsupported(body, "logit_bias", "this server's sampler takes no per-token bias");
  refuseUnsupported(body, "grammar", "this server has no constrained decoding");
  refuseUnsupported(body, "json_schema", "this server has no constrained decoding");
  refuseUnsupported(body, "response_format", "this server has no constrained decoding");
  const seed = optNumber(body, "seed", { min: -1, integer: true });
  return {
    prompt,
    parseSpecial: optBool(body, "parse_special") ?? true,
    nPredict: n === undefined || n === -1 ? undefined : n,
    stops: optStops(body, "stop"),
    stream: optBool(body, "stream") ?? false,
    returnTokens: optBool(body, "return_tokens") ?? false,
    sampling: {
      temperature: optNumber(body, "temperature", { min: 0, max: 2 }),
      topK: optNumber(body, "top_k", { min: 0, integer: true }),
      topP: optNumber(body, "top_p", { min: 0, max: 1 }),
      minP: optNumber(body, "min_p", { min: 0, max: 1 }),
      seed: seed === undefined || seed === -1 ? undefined : seed,
      repeatPenalty: optNumber(body, "repeat_penalty", { min: 0 }),
      presencePenalty: optNumber(body, "presence_penalty", { min: -2, max: 2 }),
      frequencyPenalty: optNumber(body, "frequency_penalty", { min: -2, max: 2 }),
    },
  };
}

/** llama.cpp `stop_type` of an end reason. */
function stopType(r: EndReason): string {
  switch (r) {
    case "eos":
    case "tool_use":
      return "eos";
    case "stop":
      return "word";
    case "max_tokens":
    case "context":
      return "limit";
    case "cancelled":
      return "none";
    default: {
      const never: never = r;
      throw new Error(`Internal error: unknown end reason ${String(never)}`);
    }
  }
}

function finalFields(r: RunResult, model: string): Record<string, unknown> {
  return {
    stop: true,
    model,
    stop_type: stopType(r.reason),
    stopping_word: r.stopSequence ?? "",
    tokens_predicted: r.outputTokens,
    tokens_evaluated: r.promptTokens,
    tokens_cached: r.cachedTokens,
    truncated: r.reason === "context",
  };
}

/** The `POST /completion` handler. */
export function completionHandler(deps: ServerDeps): (c: Context<AppEnv>) => Promise<Response> {
  return async (c) => {
    const requestId = c.get("requestId");
    const body = await readJson(c.req.raw, deps.bodyLimitBytes);
    const req = parseCompletionRequest(body, deps.tokenizer.nVocab);
    const nCtx = readyContext(deps.engine);
    const prompt = typeof req.prompt === "string"
      ? deps.tokenizer.encode(req.prompt, { parseSpecial: req.parseSpecial })
      : req.prompt;
    const maxTokens = checkLengths(prompt.length, req.nPredict, nCtx, "n_predict");
    const model = deps.engine.status().model;
    const sampling = samplingFor(req.sampling, deps);

    if (!req.stream) {
      let content = "";
      const tokens: number[] = [];
      const r = await runGeneration(deps, {
        prompt,
        maxTokens,
        sampling,
        stops: req.stops,
        parse: undefined,
        signal: c.req.raw.signal,
        trace: c.get("trace"),
        onEvent: (e) => {
          if (e.type !== "raw") return;
          content += e.text;
          tokens.push(...e.ids);
        },
      });
      return c.json({ content, ...(req.returnTokens ? { tokens } : {}), ...finalFields(r, model) }, 200, {
        "request-id": requestId,
      });
    }
    return await streamResponse("openai", { requestId, requestSignal: c.req.raw.signal }, async (sse) => {
      const r = await runGeneration(deps, {
        prompt,
        maxTokens,
        sampling,
        stops: req.stops,
        parse: undefined,
        signal: sse.signal,
        trace: c.get("trace"),
        onEvent: (e) => {
          if (e.type !== "raw") return;
          sse.send(undefined, {
            content: e.text,
            ...(req.returnTokens ? { tokens: e.ids } : {}),
            stop: false,
          });
        },
      });
      sse.send(undefined, {
        content: "",
        ...(req.returnTokens ? { tokens: [] } : {}),
        ...finalFields(r, model),
      });
    });
  };
}
