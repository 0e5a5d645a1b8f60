/**
 * The head's HTTP/1.1 server: an accept loop on `Deno.listen` with its own request reader in front of the
 * Hono app, because `Deno.serve` has no header or body timeouts and no connection cap (measured: a client
 * that sends half a header stays connected for good, and 3,000 of them hold 3,000 sockets).
 *
 * Bounds, each answered once and logged as one line (lines of one kind are rate-limited to one a second
 * with a count of the rest):
 * - connections: at most `maxConnections` open; one more gets 503 and is closed;
 * - request head: complete within `headerTimeoutMs` of the connection (or the previous response) being
 *   ready, else 408 (or a silent close when nothing was sent: an idle keep-alive), at most
 *   `maxHeaderBytes`, else 431;
 * - body: complete within `bodyTimeoutMs` of the head, else 408; `Content-Length` or `chunked` only;
 * - writes: each within `writeTimeoutMs`, else the client is treated as gone.
 *
 * Parsing is strict, to leave no room for request smuggling: CRLF line ends, no obs-fold, token header
 * names, one `Content-Length` value, never both `Content-Length` and `Transfer-Encoding`.
 *
 * A client that disconnects aborts the request's `signal` (the engine cancels its generation and frees the
 * slot) and is counted in `/metrics` as an abort, never as a 500.
 *
 * @example
 * ```ts
 * import { serveHttp1 } from "./http1.ts";
 * const server = serveHttp1({ hostname: "127.0.0.1", port: 8080 }, app.fetch);
 * await server.shutdown(); // stop accepting, let in-flight requests finish
 * ```
 * @module
 */
import { ApiError, type ApiErrorKind, dialectOf, errorResponse } from "./errors.ts";

/** Default bounds (see {@linkcode Http1Options}). */
export const HTTP1_DEFAULTS = {
  maxConnections: 512,
  headerTimeoutMs: 10_000,
  bodyTimeoutMs: 30_000,
  writeTimeoutMs: 30_000,
  maxHeaderBytes: 32 << 10,
  maxHeaderCount: 100,
} as const;

/** Options of {@linkcode serveHttp1}. */
export interface Http1Options {
  /** Listen address. */
  hostname: string;
  /** Listen port (0: any free one). */
  port: number;
  /** Most connections open at once. */
  maxConnections?: number;
  /** Milliseconds to receive a request's head (request line and headers). */
  headerTimeoutMs?: number;
  /** Milliseconds to receive a request's body after its head. */
  bodyTimeoutMs?: number;
  /** Milliseconds one response write may take. */
  writeTimeoutMs?: number;
  /** Most bytes of request head (431 above). */
  maxHeaderBytes?: number;
  /** Most header fields (431 above). */
  maxHeaderCount?: number;
  /** Called with the bound address once listening. */
  onListen?: (addr: Deno.NetAddr) => void;
  /** Connection-level events, for `/metrics`. */
  onEvent?: (e: Http1Event) => void;
  /** Where event lines go (default `console.error`). */
  log?: (line: string) => void;
}

/** What the connection layer reports. */
export type Http1Event =
  | { type: "open" }
  | { type: "close" }
  | { type: "refused"; reason: RefuseReason }
  /** The client went away before its response was complete (`path`: the request's path). */
  | { type: "client_abort"; path: string };

/** A running server. */
export interface Http1Server {
  /** The bound address. */
  readonly addr: Deno.NetAddr;
  /** Connections open now. */
  readonly connections: number;
  /** Requests being answered now. */
  readonly activeRequests: number;
  /**
   * Stops accepting, closes idle connections, waits for in-flight responses to end, then closes the rest.
   */
  shutdown(): Promise<void>;
  /** Resolves when the server has shut down. */
  readonly finished: Promise<void>;
}

/** Request handler: Hono's `app.fetch`. */
export type Http1Handler = (req: Request) => Response | Promise<Response>;

const CRLF2 = new Uint8Array([13, 10, 13, 10]);
const TOKEN = /^[!#$%&'*+\-.^_`|~0-9A-Za-z]+$/;
const FIELD_VALUE = /^[\t\x20-\x7e\x80-\xff]*$/;
const HOP_BY_HOP = new Set(["connection", "keep-alive", "transfer-encoding", "content-length", "upgrade"]);
const REASONS: Readonly<Record<number, string>> = {
  100: "Continue",
  200: "OK",
  204: "No Content",
  400: "Bad Request",
  401: "Unauthorized",
  403: "Forbidden",
  404: "Not Found",
  405: "Method Not Allowed",
  408: "Request Timeout",
  413: "Content Too Large",
  431: "Request Header Fields Too Large",
  499: "Client Closed Request",
  500: "Internal Server Error",
  501: "Not Implemented",
  503: "Service Unavailable",
  505: "HTTP Version Not Supported",
};
/** Response bodies up to this size are sent with `Content-Length`; longer or streamed ones chunked. */
const BUFFER_BODY_BYTES = 1 << 20;

/** Why the connection layer refused a connection or request (a `/metrics` label). */
export type RefuseReason = "connection_cap" | "header_timeout" | "headers_too_large" | "bad_request";

/** A request the connection layer refuses before the app sees it. */
class Refusal extends Error {
  constructor(readonly kind: ApiErrorKind, message: string, readonly reason?: RefuseReason) {
    super(message);
  }
}

/** Timer that rejects; `clear()` when the raced operation won. */
function deadline(ms: number, onTimeout: () => Error): { promise: Promise<never>; clear: () => void } {
  let timer: ReturnType<typeof setTimeout> | undefined;
  const promise = new Promise<never>((_, reject) => {
    timer = setTimeout(() => reject(onTimeout()), ms);
  });
  promise.catch(() => {});
  return { promise, clear: () => clearTimeout(timer) };
}

/**
 * Buffered reads from a connection, with one read in flight at most: a read started to notice a
 * disconnect is the same read the next request's head then consumes.
 */
class ConnReader {
  #conn: Deno.Conn;
  #buf: Uint8Array = new Uint8Array(0);
  #inflight: Promise<boolean> | undefined;
  #eof = false;

  constructor(conn: Deno.Conn) {
    this.#conn = conn;
  }

  /** Bytes buffered and not consumed (a view; consume before the next fill). */
  get buffered(): Uint8Array {
    return this.#buf;
  }

  /**
   * Reads more bytes into the buffer (joining the read in flight, if any); resolves false at the end of the
   * stream. The buffer is appended to once per socket read, however many callers wait on it.
   */
  fill(): Promise<boolean> {
    if (this.#eof) return Promise.resolve(false);
    if (this.#inflight === undefined) {
      const chunk = new Uint8Array(16 << 10);
      this.#inflight = this.#conn.read(chunk).then(
        (n) => {
          this.#inflight = undefined;
          if (n === null) {
            this.#eof = true;
            return false;
          }
          const c = chunk.subarray(0, n);
          this.#buf = this.#buf.length === 0 ? c : concat(this.#buf, c);
          return true;
        },
        () => {
          // A reset or a close by a timeout: the same as the end of the stream for every reader.
          this.#inflight = undefined;
          this.#eof = true;
          return false;
        },
      );
    }
    return this.#inflight;
  }

  /** Consumes `n` buffered bytes. */
  consume(n: number): Uint8Array {
    const out = this.#buf.subarray(0, n);
    this.#buf = this.#buf.subarray(n);
    return out;
  }
}

function concat(a: Uint8Array, b: Uint8Array): Uint8Array {
  const out = new Uint8Array(a.length + b.length);
  out.set(a);
  out.set(b, a.length);
  return out;
}

function indexOf(hay: Uint8Array, needle: Uint8Array, from = 0): number {
  outer: for (let i = Math.max(0, from); i + needle.length <= hay.length; i++) {
    for (let j = 0; j < needle.length; j++) if (hay[i + j] !== needle[j]) continue outer;
    return i;
  }
  return -1;
}

/** A parsed request head. */
interface Head {
  method: string;
  target: string;
  version: "1.0" | "1.1";
  headers: Headers;
  /** Body framing: a length, chunked, or none. */
  body: { type: "length"; n: number } | { type: "chunked" } | { type: "none" };
  keepAlive: boolean;
  expectContinue: boolean;
}

/** Parses the bytes of a request head (without the final CRLFCRLF). */
function parseHead(bytes: Uint8Array, maxHeaderCount: number): Head {
  const text = new TextDecoder("latin1").decode(bytes);
  const lines = text.split("\r\n");
  const bad = (why: string) =>
    new Refusal("invalid_request", `Malformed HTTP request: ${why}`, "bad_request");
  const m = /^([^ ]+) ([^ ]+) HTTP\/(\d\.\d)$/.exec(lines[0]!);
  if (m === null) {
    throw bad(`request line ${JSON.stringify(lines[0]!.slice(0, 80))} is not METHOD TARGET HTTP/1.1`);
  }
  const [, method, target, version] = m as unknown as [string, string, string, string];
  if (!TOKEN.test(method)) throw bad(`method ${JSON.stringify(method.slice(0, 20))} is not a token`);
  if (version !== "1.1" && version !== "1.0") {
    throw new Refusal("invalid_request", `HTTP/${version} is not supported: use HTTP/1.1`, "bad_request");
  }
  if (!target.startsWith("/") && !/^https?:\/\//i.test(target) && !(target === "*" && method === "OPTIONS")) {
    throw bad(`request target ${JSON.stringify(target.slice(0, 80))} is not a path`);
  }
  if (lines.length - 1 > maxHeaderCount) {
    throw new Refusal(
      "headers_too_large",
      `Request has ${lines.length - 1} header fields, over the limit of ${maxHeaderCount}: send fewer`,
      "headers_too_large",
    );
  }
  const headers = new Headers();
  const lengths: string[] = [];
  for (let i = 1; i < lines.length; i++) {
    const line = lines[i]!;
    const colon = line.indexOf(":");
    if (colon <= 0) throw bad(`header line ${i} has no "name:"`);
    const name = line.slice(0, colon);
    if (!TOKEN.test(name)) throw bad(`header name ${JSON.stringify(name.slice(0, 40))} is not a token`);
    const value = line.slice(colon + 1).replace(/^[ \t]+|[ \t]+$/g, "");
    if (!FIELD_VALUE.test(value)) throw bad(`header ${name} has a control character in its value`);
    if (name.toLowerCase() === "content-length") lengths.push(...value.split(",").map((v) => v.trim()));
    try {
      headers.append(name, value);
    } catch (e) {
      throw new Refusal("invalid_request", `Malformed HTTP request: header ${name}: ${(e as Error).message}`);
    }
  }
  const te = headers.get("transfer-encoding");
  let body: Head["body"] = { type: "none" };
  if (te !== null) {
    if (lengths.length > 0) throw bad("both Content-Length and Transfer-Encoding are set");
    if (te.toLowerCase() !== "chunked") {
      throw new Refusal(
        "invalid_request",
        `Transfer-Encoding ${te} is not supported: send chunked or a length`,
      );
    }
    body = { type: "chunked" };
  } else if (lengths.length > 0) {
    if (!lengths.every((l) => /^\d{1,15}$/.test(l)) || new Set(lengths).size !== 1) {
      throw bad(`Content-Length ${JSON.stringify(lengths.join(", ").slice(0, 40))} is not one number`);
    }
    const n = Number(lengths[0]);
    if (n > 0) body = { type: "length", n };
  }
  const conn = (headers.get("connection") ?? "").toLowerCase().split(",").map((s) => s.trim());
  const keepAlive = version === "1.1" ? !conn.includes("close") : conn.includes("keep-alive");
  return {
    method,
    target,
    version,
    headers,
    body,
    keepAlive,
    expectContinue: (headers.get("expect") ?? "").toLowerCase() === "100-continue",
  };
}

/** Per-kind rate limiter for log lines: one a second, with the count of the suppressed ones. */
class LogLimiter {
  #last = new Map<string, { at: number; suppressed: number }>();
  constructor(readonly log: (line: string) => void) {}

  line(kind: string, text: string): void {
    const now = performance.now();
    const s = this.#last.get(kind);
    if (s !== undefined && now - s.at < 1000) {
      s.suppressed++;
      return;
    }
    const more = s !== undefined && s.suppressed > 0 ? ` (and ${s.suppressed} more since the last line)` : "";
    this.#last.set(kind, { at: now, suppressed: 0 });
    this.log(`${text}${more}`);
  }
}

/**
 * Serves `handler` over HTTP/1.1 on a TCP listener with the bounds of {@linkcode Http1Options}.
 * @throws {Deno.errors.AddrInUse} when the port is taken
 */
export function serveHttp1(opts: Http1Options, handler: Http1Handler): Http1Server {
  const o = { ...HTTP1_DEFAULTS, ...opts };
  const listener = Deno.listen({ hostname: o.hostname, port: o.port, transport: "tcp" });
  const addr = listener.addr as Deno.NetAddr;
  const logs = new LogLimiter(o.log ?? ((l) => console.error(l)));
  const emit = (e: Http1Event) => o.onEvent?.(e);
  const conns = new Map<Deno.Conn, { busy: boolean }>();
  let active = 0;
  let closing = false;
  let idleWaiters: (() => void)[] = [];
  const notifyIdle = () => {
    if (active > 0) return;
    const w = idleWaiters;
    idleWaiters = [];
    for (const f of w) f();
  };
  o.onListen?.(addr);

  const write = async (conn: Deno.Conn, bytes: Uint8Array): Promise<void> => {
    const d = deadline(o.writeTimeoutMs, () => new Error(`write timed out after ${o.writeTimeoutMs} ms`));
    try {
      let off = 0;
      while (off < bytes.length) off += await Promise.race([conn.write(bytes.subarray(off)), d.promise]);
    } finally {
      d.clear();
    }
  };

  const refuse = async (conn: Deno.Conn, r: Refusal, path: string): Promise<void> => {
    const res = errorResponse(new ApiError(r.kind, r.message), dialectOf(path), "req_none");
    await writeResponse(conn, res, { head: false, close: true }).catch(() => {});
  };

  const writeResponse = async (
    conn: Deno.Conn,
    res: Response,
    w: { head: boolean; close: boolean; abort?: AbortSignal },
  ): Promise<boolean> => {
    const enc = new TextEncoder();
    const lines = [`HTTP/1.1 ${res.status} ${REASONS[res.status] ?? "Status"}`];
    res.headers.forEach((v, k) => {
      if (!HOP_BY_HOP.has(k)) lines.push(`${k}: ${v}`);
    });
    if (w.close) lines.push("connection: close");
    const noBody = res.status === 204 || res.status === 304 || (res.status >= 100 && res.status < 200);
    if (res.body === null || noBody) {
      if (!noBody) lines.push("content-length: 0");
      await write(conn, enc.encode(lines.join("\r\n") + "\r\n\r\n"));
      return true;
    }
    const reader = res.body.getReader();
    // A client that goes away mid-stream ends the body here, as a runtime server cancels it: the producer
    // (an SSE stream waiting for its next token) may never close it itself.
    const onAbort = () => void reader.cancel(new DOMException("Client closed the connection", "AbortError"));
    w.abort?.addEventListener("abort", onAbort, { once: true });
    try {
      // Buffer a short body to send it with its length; a long or streamed one goes chunked.
      const first: Uint8Array[] = [];
      let size = 0;
      let done = false;
      const streaming = (res.headers.get("content-type") ?? "").startsWith("text/event-stream");
      while (!streaming && size <= BUFFER_BODY_BYTES) {
        const r = await reader.read();
        if (r.done) {
          done = true;
          break;
        }
        first.push(r.value);
        size += r.value.length;
      }
      if (done) {
        lines.push(`content-length: ${size}`);
        await write(conn, enc.encode(lines.join("\r\n") + "\r\n\r\n"));
        if (!w.head) { for (const c of first) await write(conn, c); }
        return true;
      }
      lines.push("transfer-encoding: chunked");
      await write(conn, enc.encode(lines.join("\r\n") + "\r\n\r\n"));
      const chunk = async (c: Uint8Array) => {
        if (c.length === 0 || w.head) return;
        await write(conn, concat(enc.encode(c.length.toString(16) + "\r\n"), concat(c, enc.encode("\r\n"))));
      };
      for (const c of first) await chunk(c);
      for (;;) {
        const r = await reader.read();
        if (r.done) break;
        await chunk(r.value);
      }
      if (!w.head) await write(conn, enc.encode("0\r\n\r\n"));
      return true;
    } catch (e) {
      await reader.cancel(e).catch(() => {});
      throw e;
    } finally {
      w.abort?.removeEventListener("abort", onAbort);
    }
  };

  /** The request body as a stream with the body deadline; resolves `complete` once all of it was read. */
  const bodyStream = (
    conn: Deno.Conn,
    reader: ConnReader,
    head: Head,
    abort: AbortController,
  ): { stream: ReadableStream<Uint8Array> | null; complete: () => boolean } => {
    if (head.body.type === "none") return { stream: null, complete: () => true };
    const framing = head.body;
    let remaining = framing.type === "length" ? framing.n : 0;
    let chunkLeft = 0;
    let chunkCrlf = false;
    let finished = false;
    let continued = !head.expectContinue;
    const timer = deadline(o.bodyTimeoutMs, () =>
      new ApiError(
        "request_timeout",
        `Request body did not arrive within ${o.bodyTimeoutMs / 1000} s: send the body with the request`,
      ));
    /** Waits for more bytes; a closed connection aborts the request. */
    const need = async (): Promise<void> => {
      if (!await Promise.race([reader.fill(), timer.promise])) {
        abort.abort(new DOMException("Client closed the connection", "AbortError"));
        throw new ApiError("client_closed", "Client closed the connection while sending the request body");
      }
    };
    const bad = (why: string) => new ApiError("invalid_request", `Malformed chunked request body: ${why}`);
    /** One CRLF-terminated line of at most `max` bytes, without its CRLF. */
    const line = async (max: number, what: string): Promise<string> => {
      let eol: number;
      while ((eol = indexOf(reader.buffered, CRLF2.subarray(0, 2))) < 0) {
        if (reader.buffered.length > max) throw bad(`${what} over ${max} bytes`);
        await need();
      }
      return new TextDecoder().decode(reader.consume(eol + 2).subarray(0, eol));
    };
    const end = (c: ReadableStreamDefaultController<Uint8Array>) => {
      finished = true;
      timer.clear();
      c.close();
    };
    /** Enqueues the next piece of the body, or ends it. */
    const next = async (c: ReadableStreamDefaultController<Uint8Array>): Promise<void> => {
      if (!continued) {
        continued = true;
        await write(conn, new TextEncoder().encode("HTTP/1.1 100 Continue\r\n\r\n"));
      }
      if (framing.type === "length") {
        if (reader.buffered.length === 0) await need();
        const take = reader.consume(Math.min(remaining, reader.buffered.length));
        remaining -= take.length;
        c.enqueue(take.slice());
        if (remaining === 0) end(c);
        return;
      }
      // chunked (RFC 9112 §7.1): size line, data, CRLF ...; size 0 ends it after the trailers (ignored)
      if (chunkCrlf) {
        if ((await line(2, "chunk data end")) !== "") throw bad("chunk data is longer than its size");
        chunkCrlf = false;
      }
      if (chunkLeft === 0) {
        const sizeLine = await line(1024, "chunk size line");
        const m = /^([0-9A-Fa-f]{1,8})(;.*)?$/.exec(sizeLine);
        if (m === null) throw bad(`chunk size ${JSON.stringify(sizeLine.slice(0, 20))} is not hex`);
        chunkLeft = parseInt(m[1]!, 16);
        if (chunkLeft === 0) {
          while ((await line(8192, "trailer line")) !== "");
          end(c);
          return;
        }
      }
      if (reader.buffered.length === 0) await need();
      const data = reader.consume(Math.min(chunkLeft, reader.buffered.length));
      chunkLeft -= data.length;
      if (chunkLeft === 0) chunkCrlf = true;
      c.enqueue(data.slice());
    };
    const stream = new ReadableStream<Uint8Array>({
      pull: async (c) => {
        try {
          await next(c);
        } catch (e) {
          timer.clear();
          throw e;
        }
      },
      cancel: () => timer.clear(),
    });
    return { stream, complete: () => finished };
  };

  const serveConn = async (conn: Deno.Conn): Promise<void> => {
    const state = { busy: false };
    conns.set(conn, state);
    emit({ type: "open" });
    const reader = new ConnReader(conn);
    const remoteAddr = conn.remoteAddr as Deno.NetAddr;
    try {
      for (;;) {
        // ---- the request head, within the header deadline
        const started = reader.buffered.length > 0;
        const hd = deadline(o.headerTimeoutMs, () => new Refusal("request_timeout", "", "header_timeout"));
        let headEnd: number;
        try {
          for (;;) {
            headEnd = indexOf(reader.buffered, CRLF2, 0);
            if (headEnd >= 0) break;
            if (reader.buffered.length > o.maxHeaderBytes) {
              throw new Refusal(
                "headers_too_large",
                `Request head is over ${o.maxHeaderBytes} bytes: send shorter headers`,
                "headers_too_large",
              );
            }
            if (closing && reader.buffered.length === 0) return;
            if (!await Promise.race([reader.fill(), hd.promise])) return;
          }
        } catch (e) {
          if (!(e instanceof Refusal)) throw e;
          if (e.reason === "header_timeout") {
            if (reader.buffered.length === 0 && !started) return; // an idle keep-alive connection
            emit({ type: "refused", reason: "header_timeout" });
            logs.line(
              "header_timeout",
              `HTTP: closed ${remoteAddr.hostname}:${remoteAddr.port}: request head incomplete after ` +
                `${o.headerTimeoutMs / 1000} s (${reader.buffered.length} bytes)`,
            );
            await refuse(
              conn,
              new Refusal(
                "request_timeout",
                `Request head did not arrive within ${
                  o.headerTimeoutMs / 1000
                } s: send the whole head at once`,
              ),
              "/",
            );
            return;
          }
          emit({ type: "refused", reason: "headers_too_large" });
          logs.line("headers_too_large", `HTTP: refused ${remoteAddr.hostname}: ${e.message}`);
          await refuse(conn, e, "/");
          return;
        } finally {
          hd.clear();
        }
        if (headEnd > o.maxHeaderBytes) {
          const e = new Refusal(
            "headers_too_large",
            `Request head is ${headEnd} bytes, over the limit of ${o.maxHeaderBytes}: send shorter headers`,
          );
          emit({ type: "refused", reason: "headers_too_large" });
          logs.line("headers_too_large", `HTTP: refused ${remoteAddr.hostname}: ${e.message}`);
          await refuse(conn, e, "/");
          return;
        }
        let head: Head;
        try {
          head = parseHead(reader.consume(headEnd + 4).subarray(0, headEnd), o.maxHeaderCount);
        } catch (e) {
          if (!(e instanceof Refusal)) throw e;
          const reason = e.kind === "headers_too_large" ? "headers_too_large" : "bad_request";
          emit({ type: "refused", reason });
          logs.line(reason, `HTTP: refused ${remoteAddr.hostname}: ${e.message}`);
          await refuse(conn, e, "/");
          return;
        }

        // ---- the request
        const abort = new AbortController();
        const body = bodyStream(conn, reader, head, abort);
        const hostHeader = head.headers.get("host");
        const base = hostHeader !== null && /^[A-Za-z0-9.\-:[\]]+$/.test(hostHeader)
          ? `http://${hostHeader}`
          : `http://${o.hostname}:${addr.port}`;
        let url: URL;
        try {
          url = /^https?:\/\//i.test(head.target) ? new URL(head.target) : new URL(head.target, base);
        } catch {
          url = new URL("/", base);
        }
        const withBody = head.method !== "GET" && head.method !== "HEAD";
        const request = new Request(url, {
          method: head.method,
          headers: head.headers,
          body: withBody ? body.stream : null,
          signal: abort.signal,
        });
        state.busy = true;
        active++;
        let delivered = false;
        try {
          // A disconnect while the app works or streams aborts the request (the engine frees the slot):
          // the socket is watched once the body is in, until the response is written.
          let watching = true;
          const watch = async () => {
            while (watching && !body.complete()) await new Promise((r) => setTimeout(r, 50));
            if (!watching || reader.buffered.length > 0) return; // a pipelined request is not a disconnect
            const more = await reader.fill();
            if (!more && watching) {
              abort.abort(new DOMException("Client closed the connection", "AbortError"));
            }
          };
          void watch();
          let close = true;
          try {
            const res = await handler(request);
            close = !head.keepAlive || !body.complete() || closing || abort.signal.aborted;
            if (abort.signal.aborted) await res.body?.cancel().catch(() => {});
            else {
              delivered = await writeResponse(conn, res, {
                head: head.method === "HEAD",
                close,
                abort: abort.signal,
              })
                .catch(() => false);
            }
          } finally {
            watching = false;
          }
          delivered &&= !abort.signal.aborted;
          if (!delivered) {
            abort.abort(new DOMException("Client closed the connection", "AbortError"));
            emit({ type: "client_abort", path: url.pathname });
            logs.line(
              "client_abort",
              `HTTP: client ${remoteAddr.hostname}:${remoteAddr.port} went away before the response to ` +
                `${head.method} ${url.pathname} was complete`,
            );
          }
          if (close || !delivered) return;
        } finally {
          state.busy = false;
          active--;
          notifyIdle();
        }
      }
    } catch (e) {
      logs.line("internal", `HTTP: connection error: ${e instanceof Error ? e.message : String(e)}`);
    } finally {
      conns.delete(conn);
      try {
        conn.close();
      } catch {
        // already closed by a timeout or the peer: nothing left to release
      }
      emit({ type: "close" });
    }
  };

  const accepting = (async () => {
    for (;;) {
      let conn: Deno.Conn;
      try {
        conn = await listener.accept();
      } catch (e) {
        if (closing) return;
        logs.line("accept", `HTTP: accept failed: ${e instanceof Error ? e.message : String(e)}`);
        await new Promise((r) => setTimeout(r, 50));
        continue;
      }
      if (conns.size >= o.maxConnections) {
        emit({ type: "refused", reason: "connection_cap" });
        logs.line(
          "connection_cap",
          `HTTP: refused a connection from ${(conn.remoteAddr as Deno.NetAddr).hostname}: ` +
            `${o.maxConnections} connections open (the cap)`,
        );
        void refuse(
          conn,
          new Refusal(
            "overloaded",
            `Server has ${o.maxConnections} connections open, its limit: retry later or reuse a connection`,
          ),
          "/",
        ).finally(() => {
          try {
            conn.close();
          } catch {
            // the write failed and closed it
          }
        });
        continue;
      }
      // Without TCP_NODELAY a small write after an unacknowledged one (a stream's first frame after its
      // head, each next frame) waits for the client's delayed ACK: 40 ms on Linux loopback, measured on every
      // streamed request of a kept-alive connection (bench/serve.ts: HTTP TTFT 43 ms above direct's).
      try {
        (conn as Deno.TcpConn).setNoDelay(true);
      } catch {
        // not a TCP socket option here: streamed frames may then wait for the client's ACKs
      }
      void serveConn(conn);
    }
  })();

  let finishedResolve!: () => void;
  const finished = new Promise<void>((r) => finishedResolve = r);
  let shutdownPromise: Promise<void> | undefined;
  return {
    addr,
    get connections() {
      return conns.size;
    },
    get activeRequests() {
      return active;
    },
    finished,
    shutdown() {
      shutdownPromise ??= (async () => {
        closing = true;
        listener.close();
        await accepting;
        const closeIdle = () => {
          for (const [c, s] of conns) {
            if (!s.busy) {
              try {
                c.close();
              } catch {
                // closed meanwhile
              }
            }
          }
        };
        closeIdle();
        await new Promise<void>((r) => {
          idleWaiters.push(r);
          notifyIdle();
        });
        for (const c of conns.keys()) {
          try {
            c.close();
          } catch {
            // closed meanwhile
          }
        }
        finishedResolve();
      })();
      return shutdownPromise;
    },
  };
}
