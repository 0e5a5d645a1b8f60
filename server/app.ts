/**
 * The head's HTTP app: Hono routes over an {@linkcode Engine}, the model's tokenizer and chat template.
 * Middleware order: request id → metrics (counts every answer) → request log (when on) → CORS (when `--cors`) → shutdown gate →
 * API key → the endpoint. A known path asked with another method gets 405 with `Allow`. Every error leaves
 * through one table (errors.ts) in the dialect of its path.
 *
 * @example
 * ```ts
 * import { createApp } from "./app.ts";
 * const app = createApp({ engine, tokenizer, template, tempDefault: 0, tempCap: 2, bodyLimitBytes: 1 << 22 });
 * Deno.serve({ hostname: "127.0.0.1", port: 8080 }, app.fetch);
 * ```
 * @module
 */
import { Hono } from "hono";
import { type ChatTemplate, type Tokenizer } from "../engine/mod.ts";
import type { AppEnv, ServerDeps } from "./_generate.ts";
import { auth } from "./auth.ts";
import { chatCompletionsHandler } from "./chat_completions.ts";
import { completionHandler } from "./completion.ts";
import { cors } from "./cors.ts";
import {
  DASHBOARD_PAGE_PATHS,
  dashboardEventsHandler,
  dashboardPageHandler,
  LiveRequests,
} from "./dashboard.ts";
import type { Engine } from "../engine/mod.ts";
import { ApiError, dialectOf, errorResponse } from "./errors.ts";
import { healthHandler } from "./health.ts";
import { countTokensHandler, messagesHandler } from "./messages.ts";
import { Metrics, metricsHandler } from "./metrics.ts";
import { modelHandler, modelsHandler } from "./models.ts";
import { requestLog } from "./request_log.ts";
import { methodsOf, MODEL_PREFIX, routeOf } from "./routes.ts";

/** Default request body limit: 8 MiB (a long conversation with tool results fits easily). */
export const DEFAULT_BODY_LIMIT_BYTES = 8 << 20;

/** Options of {@linkcode createApp}. */
export interface AppOptions {
  /** The engine service. */
  engine: Engine;
  /** The model's tokenizer. */
  tokenizer: Tokenizer;
  /** The model's chat template. */
  template: ChatTemplate;
  /** Required API key (none: open). */
  apiKey?: string;
  /** Temperature when a request sends none (0: greedy). */
  tempDefault: number;
  /** Highest temperature a request gets. */
  tempCap: number;
  /** Request body limit in bytes (413 above). */
  bodyLimitBytes: number;
  /** Counters (a fresh set when absent). */
  metrics?: Metrics;
  /** True once the server is shutting down: generation endpoints answer 503 from then on. */
  draining?: () => boolean;
  /** Origins allowed by CORS (`*` for any; see cors.ts); undefined: CORS off. */
  corsOrigins?: readonly string[];
  /** Where the one line per request goes (request_log.ts; the head passes stderr); undefined: no log. */
  requestLog?: (line: string) => void;
}

const GENERATION_PATHS = new Set(["/v1/messages", "/v1/chat/completions", "/completion"]);
/** The built app: its fetch handler for `Deno.serve`, and Hono's in-process `request` for tests. */
export interface HeadApp {
  /** Answers one request (pass to `Deno.serve`). */
  fetch(req: Request, info?: Deno.ServeHandlerInfo): Response | Promise<Response>;
  /** Answers a request built from a path (relative to `http://localhost`) or a Request, in process. */
  request(input: string | Request | URL, init?: RequestInit): Response | Promise<Response>;
}

/** Builds the Hono app (serve it with `Deno.serve(app.fetch)`; test it with `app.request()`). */
export function createApp(opts: AppOptions): HeadApp {
  const live = new LiveRequests(opts.engine);
  const deps: ServerDeps = {
    engine: live.engine,
    tokenizer: opts.tokenizer,
    template: opts.template,
    tempDefault: opts.tempDefault,
    tempCap: opts.tempCap,
    bodyLimitBytes: opts.bodyLimitBytes,
    metrics: opts.metrics ?? new Metrics(),
  };
  const status = () => deps.engine.status();
  const app = new Hono<AppEnv>();
  app.use(async (c, next) => {
    const id = c.req.header("x-request-id") ?? `req_${crypto.randomUUID().replaceAll("-", "")}`;
    c.set("requestId", id);
    await next();
    c.header("request-id", id);
    // A client that went away is counted as such (499, nginx's "client closed request"), never as a 500.
    deps.metrics.request(routeOf(c.req.path), c.req.raw.signal.aborted ? 499 : c.res.status);
  });
  if (opts.requestLog !== undefined) app.use(requestLog(opts.requestLog));
  app.use(cors(opts.corsOrigins, methodsOf));
  app.use(async (c, next) => {
    if (opts.draining?.() && GENERATION_PATHS.has(c.req.path)) {
      const err = new ApiError(
        "unavailable",
        "Server is shutting down: retry on another server or after restart",
        {
          retryAfterSeconds: 5,
        },
      );
      return errorResponse(err, dialectOf(c.req.path), c.get("requestId"));
    }
    await next();
  });
  // The dashboard page and its assets hold no data: served before the key check.
  for (const p of DASHBOARD_PAGE_PATHS) app.get(p, dashboardPageHandler(opts.apiKey !== undefined));
  app.use(auth(opts.apiKey));
  app.post("/v1/messages", messagesHandler(deps));
  app.post("/v1/messages/count_tokens", countTokensHandler(deps));
  app.post("/v1/chat/completions", chatCompletionsHandler(deps));
  app.post("/completion", completionHandler(deps));
  const startedAt = new Date();
  app.get("/v1/models", modelsHandler(status, startedAt));
  app.get(`${MODEL_PREFIX}*`, modelHandler(status, startedAt));
  app.get("/health", healthHandler(status));
  app.get("/metrics", metricsHandler(deps.metrics, status));
  app.get("/dashboard/events", dashboardEventsHandler(live));
  app.notFound((c) => {
    const methods = methodsOf(c.req.path);
    if (methods !== undefined) {
      const allow = opts.corsOrigins === undefined ? methods : [...methods, "OPTIONS"];
      const err = new ApiError(
        "method_not_allowed",
        `Method ${c.req.method} is not allowed on ${c.req.path}: use ${allow.join(" or ")}`,
        { allow },
      );
      return errorResponse(err, dialectOf(c.req.path), c.get("requestId") ?? "req_none");
    }
    const err = new ApiError(
      "not_found",
      `No route ${c.req.method} ${c.req.path}: see GET /v1/models, POST /v1/messages, ` +
        `POST /v1/chat/completions, POST /completion, GET /health, GET /metrics`,
    );
    return errorResponse(err, dialectOf(c.req.path), c.get("requestId") ?? "req_none");
  });
  app.onError((e, c) => errorResponse(e, dialectOf(c.req.path), c.get("requestId") ?? "req_none"));
  return app;
}
