/**
 * The one server-sent-events writer: every frame is well formed (an optional `event:` line, one `data:`
 * line of JSON, a blank line), nothing is written after the stream ends, an error after the headers are out
 * becomes the dialect's error event followed by the end of the stream, and a client that goes away aborts
 * {@linkcode SseStream.signal}.
 *
 * Headers are sent only when the first frame is written: {@linkcode streamResponse} answers with a plain JSON
 * error (400, 503 …) when the work fails before that, so a full queue is a 503, not an error event.
 * @module
 */
import { type ApiError, type Dialect, errorBody, errorResponse, toApiError } from "./errors.ts";

const EVENT_NAME = /^[a-z_]+$/;

/** A server-sent-events stream of JSON frames. */
export class SseStream {
  /** The response carrying the stream. */
  readonly response: Response;
  /** Aborted when the client disconnects (the stream is cancelled) or the request signal aborts. */
  readonly signal: AbortSignal;
  readonly #dialect: Dialect;
  readonly #requestId: string;
  readonly #abort = new AbortController();
  readonly #enc = new TextEncoder();
  #controller!: ReadableStreamDefaultController<Uint8Array>;
  #closed = false;
  #started = false;
  #onStart: () => void = () => {};
  /** Resolves when the first frame is written. */
  readonly started: Promise<void>;

  /**
   * Creates the stream (nothing is sent until the first frame).
   * @param dialect error-event shape
   * @param opts request id (header and error bodies) and the request's own abort signal
   */
  constructor(dialect: Dialect, opts: { requestId: string; requestSignal?: AbortSignal }) {
    this.#dialect = dialect;
    this.#requestId = opts.requestId;
    this.signal = this.#abort.signal;
    this.started = new Promise((resolve) => this.#onStart = resolve);
    const req = opts.requestSignal;
    if (req !== undefined) {
      if (req.aborted) this.#abort.abort(req.reason);
      else req.addEventListener("abort", () => this.#disconnect(), { once: true });
    }
    const body = new ReadableStream<Uint8Array>({
      start: (c) => {
        this.#controller = c;
      },
      cancel: () => this.#disconnect(),
    });
    this.response = new Response(body, {
      headers: {
        "content-type": "text/event-stream; charset=utf-8",
        "cache-control": "no-cache",
        "request-id": opts.requestId,
      },
    });
  }

  /** True once the stream has ended (closed, failed or cancelled by the client). */
  get closed(): boolean {
    return this.#closed;
  }

  /** True once a frame has been written. */
  get isStarted(): boolean {
    return this.#started;
  }

  /**
   * Writes one frame: `event: <event>` (when given) and `data: <JSON of data>`; a string `data` is written
   * verbatim (for OpenAI's `[DONE]`) and must not contain a line break. Returns false after the end.
   * @throws {Error} internal error on a malformed event name or multi-line raw data
   */
  send(event: string | undefined, data: unknown): boolean {
    if (this.#closed) return false;
    if (event !== undefined && !EVENT_NAME.test(event)) {
      throw new Error(`Internal error: SSE event name ${JSON.stringify(event)} is not [a-z_]+`);
    }
    // JSON.stringify escapes every control character, so a JSON frame is always one line.
    const line = typeof data === "string" ? data : JSON.stringify(data);
    if (/[\r\n]/.test(line)) throw new Error("Internal error: raw SSE data holds a line break");
    const frame = (event === undefined ? "" : `event: ${event}\n`) + `data: ${line}\n\n`;
    this.#controller.enqueue(this.#enc.encode(frame));
    if (!this.#started) {
      this.#started = true;
      this.#onStart();
    }
    return true;
  }

  /** Writes the dialect's error event (Anthropic `event: error`, OpenAI a `data: {"error":…}` frame) and ends. */
  fail(err: ApiError): void {
    if (this.#closed) return;
    const body = errorBody(err, this.#dialect, this.#requestId);
    this.send(this.#dialect === "anthropic" ? "error" : undefined, body);
    this.close();
  }

  /** Ends the stream (idempotent). */
  close(): void {
    if (this.#closed) return;
    this.#closed = true;
    this.#controller.close();
  }

  #disconnect(): void {
    this.#closed = true;
    if (!this.#abort.signal.aborted) {
      this.#abort.abort(new DOMException("Client disconnected", "AbortError"));
    }
  }
}

/**
 * Runs `work` on a new stream and answers with the stream once its first frame is written, or with a JSON
 * error response when `work` fails before writing anything. An error after the first frame becomes the
 * closing error event; the stream always ends when `work` settles.
 */
export async function streamResponse(
  dialect: Dialect,
  opts: { requestId: string; requestSignal?: AbortSignal },
  work: (sse: SseStream) => Promise<void>,
): Promise<Response> {
  const sse = new SseStream(dialect, opts);
  let failure: { error: unknown } | undefined;
  const done = work(sse).then(
    () => sse.close(),
    (e: unknown) => {
      if (!sse.isStarted) {
        failure = { error: e };
        sse.close();
        return;
      }
      sse.fail(toApiError(e, opts.requestId));
    },
  );
  await Promise.race([sse.started, done]);
  if (failure !== undefined) return errorResponse(failure.error, dialect, opts.requestId);
  return sse.response;
}
