/**
 * The one table that turns an error into an HTTP status and each API dialect's error body (STYLE.md
 * "Errors": boundaries convert, once). Handlers throw {@linkcode ApiError}; anything else becomes a 500
 * whose body shows only a request id, while the server log gets the error itself.
 * @module
 */
import { ChatTemplateError } from "../engine/mod.ts";
import { QueueFullError } from "../engine/mod.ts";

/** The error shapes the head speaks: Anthropic Messages, or OpenAI (also used by llama.cpp `/completion`). */
export type Dialect = "anthropic" | "openai";

/** Kinds of client-visible errors; each has one row in {@linkcode API_ERRORS}. */
export type ApiErrorKind =
  | "invalid_request"
  | "authentication"
  | "forbidden"
  | "not_found"
  | "method_not_allowed"
  | "request_timeout"
  | "request_too_large"
  | "headers_too_large"
  | "client_closed"
  | "overloaded"
  | "unavailable"
  | "internal";

/** Per kind: HTTP status, Anthropic `error.type`, OpenAI `error.type` and `error.code`. */
export const API_ERRORS: Readonly<
  Record<ApiErrorKind, { status: number; anthropic: string; openai: string; openaiCode: string | null }>
> = {
  invalid_request: {
    status: 400,
    anthropic: "invalid_request_error",
    openai: "invalid_request_error",
    openaiCode: null,
  },
  authentication: {
    status: 401,
    anthropic: "authentication_error",
    openai: "invalid_request_error",
    openaiCode: "invalid_api_key",
  },
  forbidden: {
    status: 403,
    anthropic: "permission_error",
    openai: "invalid_request_error",
    openaiCode: null,
  },
  not_found: { status: 404, anthropic: "not_found_error", openai: "invalid_request_error", openaiCode: null },
  method_not_allowed: {
    status: 405,
    anthropic: "invalid_request_error",
    openai: "invalid_request_error",
    openaiCode: "method_not_allowed",
  },
  request_timeout: {
    status: 408,
    anthropic: "timeout_error",
    openai: "invalid_request_error",
    openaiCode: "request_timeout",
  },
  request_too_large: {
    status: 413,
    anthropic: "request_too_large",
    openai: "invalid_request_error",
    openaiCode: "request_too_large",
  },
  headers_too_large: {
    status: 431,
    anthropic: "request_too_large",
    openai: "invalid_request_error",
    openaiCode: "request_header_fields_too_large",
  },
  client_closed: {
    status: 499,
    anthropic: "invalid_request_error",
    openai: "invalid_request_error",
    openaiCode: "client_closed_request",
  },
  overloaded: {
    status: 503,
    anthropic: "overloaded_error",
    openai: "server_error",
    openaiCode: "overloaded",
  },
  unavailable: {
    status: 503,
    anthropic: "overloaded_error",
    openai: "server_error",
    openaiCode: "unavailable",
  },
  internal: { status: 500, anthropic: "api_error", openai: "server_error", openaiCode: null },
};

/** A client-visible error: its kind fixes the status and the error types of both dialects. */
export class ApiError extends Error {
  /** Row of {@linkcode API_ERRORS}. */
  readonly kind: ApiErrorKind;
  /** Request field the error is about (OpenAI `param`), e.g. `messages[1].content`. */
  readonly param: string | null;
  /** Seconds to wait before retrying (sent as `Retry-After`). */
  readonly retryAfterSeconds: number | undefined;
  /** Methods the path takes (sent as `Allow` with a 405). */
  readonly allow: readonly string[] | undefined;

  /**
   * Creates the error.
   * @param kind which row of the table
   * @param message full human message: what failed, expected vs got, what to do
   * @param opts request field, retry delay, allowed methods (405) and cause
   */
  constructor(
    kind: ApiErrorKind,
    message: string,
    opts: { param?: string; retryAfterSeconds?: number; allow?: readonly string[]; cause?: unknown } = {},
  ) {
    super(message, { cause: opts.cause });
    this.name = "ApiError";
    this.kind = kind;
    this.param = opts.param ?? null;
    this.retryAfterSeconds = opts.retryAfterSeconds;
    this.allow = opts.allow;
  }

  /** HTTP status of this error. */
  get status(): number {
    return API_ERRORS[this.kind].status;
  }
}

/**
 * Converts anything thrown while serving a request into an {@linkcode ApiError}: ApiError as is, a full
 * queue → 503 with Retry-After, an abort (the client went away) → 499 unlogged, a chat template's rejection of the conversation → 400, and everything else
 * (bugs) → 500 naming only the request id; the original error is logged with that id.
 */
export function toApiError(e: unknown, requestId: string): ApiError {
  if (e instanceof ApiError) return e;
  if (e instanceof QueueFullError) {
    return new ApiError("overloaded", e.message, { retryAfterSeconds: e.retryAfterSeconds, cause: e });
  }
  if (e instanceof DOMException && e.name === "AbortError") {
    // The client went away (its request signal aborted the work): not a server fault, nothing to log.
    return new ApiError("client_closed", `Client closed the connection: ${e.message}`, { cause: e });
  }
  if (e instanceof ChatTemplateError && (e.code === "rejected" || e.code === "bad_request")) {
    return new ApiError("invalid_request", e.message, { param: "messages", cause: e });
  }
  if (e instanceof Error && e.name === "NumericsError") {
    // The model's numerics broke (NaN/Inf logits): a server-side fault whose message names it, one log line.
    console.error(`Request ${requestId} failed: ${e.message}`);
    return new ApiError("internal", `Model failure (request id ${requestId}): ${e.message}`, { cause: e });
  }
  console.error(`Request ${requestId} failed:`, e);
  return new ApiError(
    "internal",
    `Internal server error (request id ${requestId}): the server log has the details`,
    { cause: e },
  );
}

/** The Anthropic error body: `{"type":"error","error":{"type","message"},"request_id"}`. */
export function anthropicErrorBody(err: ApiError, requestId: string): Record<string, unknown> {
  return {
    type: "error",
    error: { type: API_ERRORS[err.kind].anthropic, message: err.message },
    request_id: requestId,
  };
}

/** The OpenAI error body: `{"error":{"message","type","param","code"}}`. */
export function openaiErrorBody(err: ApiError): Record<string, unknown> {
  const row = API_ERRORS[err.kind];
  return { error: { message: err.message, type: row.openai, param: err.param, code: row.openaiCode } };
}

/** The error body of `dialect`. */
export function errorBody(err: ApiError, dialect: Dialect, requestId: string): Record<string, unknown> {
  switch (dialect) {
    case "anthropic":
      return anthropicErrorBody(err, requestId);
    case "openai":
      return openaiErrorBody(err);
    default: {
      const never: never = dialect;
      throw new Error(`Internal error: unknown dialect ${String(never)}`);
    }
  }
}

/** A JSON error response in `dialect` with its status, `Retry-After` when set, and `request-id`. */
export function errorResponse(e: unknown, dialect: Dialect, requestId: string): Response {
  const err = toApiError(e, requestId);
  const headers = new Headers({ "content-type": "application/json", "request-id": requestId });
  if (err.retryAfterSeconds !== undefined) {
    headers.set("retry-after", String(Math.max(1, Math.ceil(err.retryAfterSeconds))));
  }
  if (err.allow !== undefined) headers.set("allow", err.allow.join(", "));
  return new Response(JSON.stringify(errorBody(err, dialect, requestId)), { status: err.status, headers });
}

/** The dialect of a request path: Anthropic for `/v1/messages…`, OpenAI (and llama.cpp) otherwise. */
export function dialectOf(path: string): Dialect {
  return path.startsWith("/v1/messages") ? "anthropic" : "openai";
}
