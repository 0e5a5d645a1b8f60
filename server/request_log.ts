/**
 * The head's request log: one line per answered request, written when the answer is complete (for a stream,
 * when its generation ends), as `key=value` fields after the method, path and status:
 *
 * ```
 * POST /v1/messages 200 queue_ms=0 ttft_ms=412 prompt_tokens=29 cached_tokens=0 prefill_tok_s=70.4 gen_tokens=16 decode_tok_s=19.5 finish=max_tokens total_ms=1230 id=req_…
 * GET /v1/models 200 total_ms=1 id=req_…
 * ```
 *
 * A client that went away is logged with status 499 and `finish=cancelled`, never with a stack trace; a
 * stream that failed after its headers went out says `finish=error`. `GET /health` and `GET /metrics` are
 * not logged (monitors poll them). A rate that cannot be measured (no prompt token prefilled, fewer than two
 * batches of ids) is written `-`.
 *
 * @example
 * ```ts
 * import { requestLog } from "./request_log.ts";
 * app.use(requestLog((line) => console.error(line)));
 * ```
 * @module
 */
import type { MiddlewareHandler } from "hono";

/** Paths polled by monitors: not logged. */
const QUIET_PATHS: ReadonlySet<string> = new Set(["/health", "/metrics"]);

/** What one generation adds to its request's line. */
export interface GenerationStats {
  /** Milliseconds it waited for a slot (null: the engine does not report it). */
  readonly queueMs: number | null;
  /** Milliseconds from admission to the first id (null: no id came). */
  readonly ttftMs: number | null;
  /** Prompt tokens, and those served from a cached prefix. */
  readonly promptTokens: number;
  readonly cachedTokens: number;
  /** Prompt tokens prefilled per second (null: nothing prefilled, or no id came). */
  readonly prefillTokPerS: number | null;
  /** Ids generated (counted as the usage reports them). */
  readonly generatedTokens: number;
  /** Ids per second after the first batch (null: fewer than two batches). */
  readonly decodeTokPerS: number | null;
  /** Batch size seen: requests per decode step it shared, weighted by its ids (null: not reported). */
  readonly meanBatch: number | null;
  /** Why it ended: the head's end reason (`_generate.ts` EndReason: `eos`, `max_tokens`, `cancelled`, ...). */
  readonly finish: string;
}

/**
 * One request's trace: the log middleware creates it (`c.get("trace")`), a generation reports its numbers
 * to it ({@linkcode RequestTrace.generation}), and the middleware writes the line when both the response
 * and the generation are done.
 */
export class RequestTrace {
  /** `performance.now()` when the request arrived. */
  readonly startMs: number = performance.now();
  #stats: GenerationStats | undefined;
  #failed = false;
  #work: Promise<unknown> | undefined;

  /**
   * Registers a generation of this request: its numbers join the line, which waits for it to settle (a
   * stream's generation outlives the handler). A rejected generation logs `finish=error` unless it
   * reported its numbers first.
   */
  generation(work: Promise<GenerationStats>): void {
    this.#work = work.then(
      (s) => this.#stats = s,
      () => this.#failed = true,
    );
  }

  /** Resolves when the registered generation (if any) has settled. */
  settled(): Promise<unknown> {
    return this.#work ?? Promise.resolve();
  }

  /** The log line for `method path` answered with `status`, at `nowMs` (`performance.now()`). */
  line(o: { method: string; path: string; status: number; requestId: string; nowMs: number }): string {
    const parts = [o.method, o.path, String(o.status)];
    const s = this.#stats;
    if (s !== undefined) {
      parts.push(
        `queue_ms=${ms(s.queueMs)}`,
        `ttft_ms=${ms(s.ttftMs)}`,
        `prompt_tokens=${s.promptTokens}`,
        `cached_tokens=${s.cachedTokens}`,
        `prefill_tok_s=${rate(s.prefillTokPerS)}`,
        `gen_tokens=${s.generatedTokens}`,
        `decode_tok_s=${rate(s.decodeTokPerS)}`,
        `batch=${s.meanBatch === null ? "-" : s.meanBatch.toFixed(1)}`,
        `finish=${s.finish}`,
      );
    } else if (this.#failed) parts.push("finish=error");
    parts.push(`total_ms=${Math.round(o.nowMs - this.startMs)}`, `id=${o.requestId}`);
    return parts.join(" ");
  }
}

function ms(v: number | null): string {
  return v === null ? "-" : String(Math.round(v));
}

function rate(v: number | null): string {
  return v === null || !Number.isFinite(v) ? "-" : v.toFixed(1);
}

/**
 * The log middleware: put it right after the request-id middleware. It gives each request a
 * {@linkcode RequestTrace} and writes one line to `log` when the answer and its generation are done (499 when
 * the client went away first).
 */
export function requestLog(
  log: (line: string) => void,
): MiddlewareHandler<{ Variables: { requestId: string; trace?: RequestTrace } }> {
  return async (c, next) => {
    const trace = new RequestTrace();
    c.set("trace", trace);
    await next();
    if (QUIET_PATHS.has(c.req.path)) return;
    const { method, path } = c.req;
    const requestId = c.get("requestId");
    const status = c.res.status;
    // A stream's generation runs on after the handler returned its Response: the line waits for it.
    void trace.settled().then(() => {
      const gone = c.req.raw.signal.aborted;
      log(trace.line({ method, path, status: gone ? 499 : status, requestId, nowMs: performance.now() }));
    });
  };
}
