/**
 * The HTTP head: a Hono app over the engine service speaking the Anthropic Messages API
 * (`POST /v1/messages`, `/v1/messages/count_tokens`), OpenAI Chat Completions (`POST /v1/chat/completions`),
 * llama.cpp-style `POST /completion`, plus `GET /v1/models`, `/health` and `/metrics`. It owns request
 * parsing and validation, chat templating and tokenization, stop strings, output parsing (thinking, tool
 * calls), SSE framing and the error table; the engine owns slots, scheduling and the GPU.
 *
 * @example
 * ```ts
 * import { createApp } from "./mod.ts";
 * import { startEngine } from "../engine/mod.ts";
 * const engine = startEngine({ model: "model.gguf", nCtx: 8192, nSlots: 4, queueSize: 16 });
 * const app = createApp({ engine, tokenizer, template, tempDefault: 0, tempCap: 2, bodyLimitBytes: 8 << 20 });
 * Deno.serve({ hostname: "127.0.0.1", port: 8080 }, app.fetch);
 * ```
 * @module
 */
export { type AppOptions, createApp, DEFAULT_BODY_LIMIT_BYTES, type HeadApp } from "./app.ts";
/** The text side's types the app's options name (tokenizer, chat template), re-exported for documentation. */
export type { ChatTemplate, Tokenizer } from "../engine/mod.ts";
export {
  API_ERRORS,
  ApiError,
  type ApiErrorKind,
  type Dialect,
  dialectOf,
  errorBody,
  errorResponse,
  toApiError,
} from "./errors.ts";
export { type GenerationSample, Metrics, TTFT_BUCKETS_S } from "./metrics.ts";
export { SseStream, streamResponse } from "./sse.ts";
export {
  type Engine,
  type EngineGenerateRequest as GenerateRequest,
  type EngineGenerateResult as GenerateResult,
  type EngineStatus,
  type FinishReason,
  QueueFullError,
  type SamplingParams,
} from "../engine/mod.ts";
