/**
 * What the three generation endpoints share: the server's dependencies, sampling defaults and caps, the
 * admission checks (model ready, prompt fits, max_tokens within the limit), and the one pipeline from
 * engine ids to output events: ids → incremental UTF-8 decode → stop strings (a match aborts the engine
 * request; the matched text is never emitted) → chat parser (thinking / text / tool calls).
 * Streamed and non-streamed responses both consume these events, so they cannot disagree.
 * @module
 */
import {
  type ChatEvent,
  type ChatParseOptions,
  ChatStreamParser,
  type ChatTemplate,
  StopMatcher,
  type Tokenizer,
} from "../engine/mod.ts";
import { type Engine, SAMPLING_DEFAULTS, type SamplingParams } from "../engine/mod.ts";
import { ApiError } from "./errors.ts";
import type { Metrics } from "./metrics.ts";
import type { GenerationStats, RequestTrace } from "./request_log.ts";

/** Everything a handler needs. */
export interface ServerDeps {
  /** The engine service. */
  readonly engine: Engine;
  /** The model's tokenizer. */
  readonly tokenizer: Tokenizer;
  /** The model's chat template. */
  readonly template: ChatTemplate;
  /** Temperature when a request sends none (0: greedy). */
  readonly tempDefault: number;
  /** Highest temperature a request may get (larger values are lowered to it). */
  readonly tempCap: number;
  /** Request body limit in bytes (413 above). */
  readonly bodyLimitBytes: number;
  /** Counters for `/metrics`. */
  readonly metrics: Metrics;
}

/** Hono environment of the app: the per-request id, and its log trace when the request log is on. */
export type AppEnv = { Variables: { requestId: string; trace?: RequestTrace } };

/** Sampling fields as a request gave them (absent: server default / off): the engine's type, partial. */
export type SamplingInput = { -readonly [K in keyof SamplingParams]?: SamplingParams[K] };

/** Engine sampling settings: temperature defaults to `tempDefault` and is capped at `tempCap`. */
export function samplingFor(
  s: SamplingInput,
  deps: Pick<ServerDeps, "tempDefault" | "tempCap">,
): SamplingParams {
  return {
    temperature: Math.min(s.temperature ?? deps.tempDefault, deps.tempCap),
    topK: s.topK ?? 0,
    topP: s.topP ?? 1,
    minP: s.minP ?? 0,
    repeatPenalty: s.repeatPenalty ?? 1,
    presencePenalty: s.presencePenalty ?? 0,
    frequencyPenalty: s.frequencyPenalty ?? 0,
    penaltyLastN: s.penaltyLastN ?? SAMPLING_DEFAULTS.penaltyLastN,
    seed: s.seed ?? crypto.getRandomValues(new Uint32Array(1))[0]!,
  };
}

/**
 * Checks the engine can take a request now and returns its context size.
 * @throws {ApiError} 503 while loading, after a failed load
 */
export function readyContext(engine: Engine): number {
  const st = engine.status();
  if (st.state === "loading") {
    const pct = st.totalBytes > 0 ? Math.floor((100 * st.loadedBytes) / st.totalBytes) : 0;
    throw new ApiError(
      "unavailable",
      `Model ${st.model} is still loading (${pct}% of ${st.totalBytes} bytes): retry when GET /health says ok`,
      { retryAfterSeconds: 5 },
    );
  }
  if (st.state === "failed") {
    throw new ApiError("unavailable", `Model ${st.model} failed to load: see the server log and restart it`);
  }
  return st.nCtx;
}

/**
 * Resolves the number of tokens to generate: `requested` (absent: what is left of the context) after
 * checking the prompt fits with room for one token and `requested` is within the context.
 * @throws {ApiError} 400 with both numbers
 */
export function checkLengths(
  promptTokens: number,
  requested: number | undefined,
  nCtx: number,
  field: string,
): number {
  if (promptTokens + 1 > nCtx) {
    throw new ApiError(
      "invalid_request",
      `Prompt is ${promptTokens} tokens but the context holds ${nCtx} (with at least one more for the reply): ` +
        `shorten the conversation or restart the server with a larger --ctx`,
      { param: "messages" },
    );
  }
  if (promptTokens === 0) {
    throw new ApiError("invalid_request", "Prompt is empty (0 tokens): send at least one token", {
      param: "prompt",
    });
  }
  if (requested === undefined) return nCtx - promptTokens;
  if (requested > nCtx) {
    throw new ApiError(
      "invalid_request",
      `Field ${field} is ${requested}, over the limit of ${nCtx} (the context size per slot): lower ${field}`,
      { param: field },
    );
  }
  return requested;
}

/** One output event: parsed chat events, or raw text pieces when no chat parsing is asked for. */
export type OutputEvent = ChatEvent | { type: "raw"; text: string; ids: readonly number[] };

/** Why the head ended a generation (engine reason refined by stop strings and tool calls). */
export type EndReason = "eos" | "stop" | "max_tokens" | "context" | "tool_use" | "cancelled";

/** Outcome of {@linkcode runGeneration}. */
export interface RunResult {
  /** Why it ended. */
  reason: EndReason;
  /** The stop string that matched (reason `stop`) or undefined. */
  stopSequence: string | undefined;
  /** Prompt tokens. */
  promptTokens: number;
  /** Prompt tokens served from a cached prefix. */
  cachedTokens: number;
  /** Generated tokens counted up to the end (the end-of-generation id or the token completing a stop). */
  outputTokens: number;
}

/** What to generate and how to present it. */
export interface RunRequest {
  /** Prompt ids. */
  prompt: readonly number[];
  /** Tokens to generate at most. */
  maxTokens: number;
  /** Sampling settings. */
  sampling: SamplingParams;
  /** User stop strings. */
  stops: readonly string[];
  /** Chat output parsing; undefined: raw text events (`/completion`). */
  parse: ChatParseOptions | undefined;
  /** Client disconnect. */
  signal: AbortSignal;
  /** Receives every output event in order. */
  onEvent: (e: OutputEvent) => void;
  /** Called once when the first id lands (a stream sends its opening frame then). */
  onFirstToken?: () => void;
  /** The request's log trace (`c.get("trace")`): the generation's numbers join its log line. */
  trace?: RequestTrace;
}

/**
 * Runs one generation through the engine and the text pipeline, calling `onEvent` as ids land, and reports
 * its numbers to `req.trace` (the request log).
 * @throws {ApiError} 400 when the engine rejects the prompt length; QueueFullError when the queue is full
 */
export async function runGeneration(deps: ServerDeps, req: RunRequest): Promise<RunResult> {
  if (req.trace === undefined) return await generate(deps, req, () => {});
  const stats = Promise.withResolvers<GenerationStats>();
  req.trace.generation(stats.promise);
  try {
    return await generate(deps, req, stats.resolve);
  } catch (e) {
    stats.reject(e);
    throw e;
  }
}

async function generate(
  deps: ServerDeps,
  req: RunRequest,
  onStats: (s: GenerationStats) => void,
): Promise<RunResult> {
  const { tokenizer, engine } = deps;
  const abort = new AbortController();
  const onClient = () => abort.abort(req.signal.reason);
  if (req.signal.aborted) onClient();
  else req.signal.addEventListener("abort", onClient, { once: true });

  const decoder = tokenizer.incrementalDecoder({ skipControl: true });
  const matcher = new StopMatcher(req.stops);
  const parser = req.parse === undefined ? undefined : new ChatStreamParser(req.parse);
  let seen = 0;
  let counted = 0;
  let stopped: string | undefined;
  let firstAt: number | undefined;
  let firstBatch = 0;
  let lastAt = 0;
  const started = performance.now();
  let sawToolCall = false;
  const emit = (e: OutputEvent) => {
    if (e.type === "tool_call") sawToolCall = true;
    req.onEvent(e);
  };

  const emitText = (text: string, ids: readonly number[]) => {
    if (parser === undefined) {
      if (text !== "" || ids.length > 0) emit({ type: "raw", text, ids });
      return;
    }
    if (text === "") return;
    for (const e of parser.push(text)) emit(e);
  };
  const take = (ids: readonly number[]) => {
    lastAt = performance.now();
    if (firstAt === undefined) {
      [firstAt, firstBatch] = [lastAt, ids.length];
      req.onFirstToken?.();
    }
    for (const id of ids) {
      seen++;
      if (stopped !== undefined) continue;
      counted++;
      if (tokenizer.eogIds.has(id)) continue;
      const r = matcher.push(decoder.push(id));
      emitText(r.text, [id]);
      if (r.stop !== undefined) {
        stopped = r.stop;
        abort.abort(new DOMException("Stop string matched", "AbortError"));
      }
    }
  };

  let result;
  try {
    result = await engine.generate({
      prompt: req.prompt,
      maxTokens: req.maxTokens,
      sampling: req.sampling,
      stopIds: [...tokenizer.eogIds],
      signal: abort.signal,
      onTokens: take,
    });
  } catch (e) {
    if (e instanceof RangeError) {
      throw new ApiError("invalid_request", e.message, { param: "messages", cause: e });
    }
    throw e;
  } finally {
    req.signal.removeEventListener("abort", onClient);
  }
  // Ids the engine reported only in its result (none when every batch went through onTokens).
  if (result.tokens.length > seen) take(result.tokens.slice(seen));
  if (stopped === undefined) {
    const tail = matcher.push(decoder.flush());
    emitText(tail.text + matcher.flush(), []);
  }
  if (parser !== undefined) {
    for (const e of parser.end()) emit(e);
  }
  const reason: EndReason = (() => {
    if (stopped !== undefined) return "stop";
    switch (result.reason) {
      case "stop":
        return "eos";
      case "length":
        return "max_tokens";
      case "context":
        return "context";
      case "cancelled":
        return "cancelled";
      default: {
        const never: never = result.reason;
        throw new Error(`Internal error: unknown engine finish reason ${String(never)}`);
      }
    }
  })();
  const end = performance.now();
  const queueMs = result.queueMs ?? null;
  const prefillMs = result.timeToFirstTokenMs - (queueMs ?? 0);
  const prefilled = result.promptTokens - result.cachedTokens;
  deps.metrics.generation({
    promptTokens: result.promptTokens,
    cachedTokens: result.cachedTokens,
    generatedTokens: counted,
    timeToFirstTokenMs: firstAt === undefined ? undefined : result.timeToFirstTokenMs,
    decodeMs: firstAt === undefined ? 0 : end - Math.max(firstAt, started),
    queueMs: queueMs ?? undefined,
    prefillMs: firstAt !== undefined && prefilled > 0 && prefillMs > 0 ? prefillMs : undefined,
    prefilledTokens: prefilled,
    meanBatch: result.meanBatch,
  });
  const finish = reason === "eos" && sawToolCall ? "tool_use" : reason;
  const decodeMs = firstAt === undefined ? 0 : lastAt - firstAt;
  onStats({
    queueMs,
    ttftMs: firstAt === undefined ? null : result.timeToFirstTokenMs,
    promptTokens: result.promptTokens,
    cachedTokens: result.cachedTokens,
    prefillTokPerS: firstAt !== undefined && prefilled > 0 && prefillMs > 0
      ? (prefilled * 1000) / prefillMs
      : null,
    generatedTokens: counted,
    decodeTokPerS: decodeMs > 0 ? ((seen - firstBatch) * 1000) / decodeMs : null,
    meanBatch: result.meanBatch !== undefined && result.meanBatch > 0 ? result.meanBatch : null,
    finish,
  });
  return {
    reason: finish,
    stopSequence: stopped,
    promptTokens: result.promptTokens,
    cachedTokens: result.cachedTokens,
    outputTokens: counted,
  };
}
