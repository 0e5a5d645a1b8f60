/**
 * The bounded HTTP/1.1 server against raw TCP clients on loopback: partial heads time out while normal
 * requests are served, 431 for a huge head, a connection cap, a body timeout, strict framing, keep-alive,
 * chunked bodies, `Expect: 100-continue`, client aborts counted (not 500s, one log line), and shutdown.
 */
import assert from "node:assert/strict";
import { type Http1Event, type Http1Options, serveHttp1 } from "./http1.ts";
import { Metrics } from "./metrics.ts";
import { testApp } from "./_test_engine.ts";

const enc = new TextEncoder();
const dec = new TextDecoder();

/** A server over a test app with small bounds; collects events and log lines. */
function start(opts: Partial<Http1Options> = {}, app = testApp(() => "Hello there, how are you").app) {
  const events: Http1Event[] = [];
  const logs: string[] = [];
  const server = serveHttp1({
    hostname: "127.0.0.1",
    port: 0,
    headerTimeoutMs: 400,
    bodyTimeoutMs: 400,
    ...opts,
    onEvent: (e) => events.push(e),
    log: (l) => logs.push(l),
  }, (req) => app.fetch(req));
  return { server, events, logs, port: server.addr.port };
}

/** Reads until the peer closes (or `ms` passes: then "TIMEOUT" is appended). */
async function readAll(conn: Deno.Conn, ms = 5000): Promise<string> {
  let out = "";
  const buf = new Uint8Array(65536);
  const stop = Date.now() + ms;
  for (;;) {
    const left = stop - Date.now();
    if (left <= 0) return out + "TIMEOUT";
    let timer: ReturnType<typeof setTimeout> | undefined;
    const n = await Promise.race([
      conn.read(buf).catch(() => null),
      new Promise<"t">((r) => timer = setTimeout(() => r("t"), left)),
    ]);
    clearTimeout(timer);
    if (n === "t") return out + "TIMEOUT";
    if (n === null) return out;
    out += dec.decode(buf.subarray(0, n));
  }
}

async function raw(port: number, bytes: string | Uint8Array, ms = 5000): Promise<string> {
  const conn = await Deno.connect({ hostname: "127.0.0.1", port });
  try {
    await conn.write(typeof bytes === "string" ? enc.encode(bytes) : bytes);
    return await readAll(conn, ms);
  } finally {
    try {
      conn.close();
    } catch {
      // closed by the server already
    }
  }
}

function statusOf(resp: string): number {
  return Number(/^HTTP\/1\.1 (\d{3})/.exec(resp)?.[1] ?? NaN);
}

/** The error message of a JSON error response. */
function bodyOf(resp: string): string {
  const body = resp.slice(resp.indexOf("\r\n\r\n") + 4);
  try {
    return JSON.parse(body).error.message;
  } catch {
    return body;
  }
}

Deno.test("http1: 200 clients with half a head are closed after the timeout; others are served meanwhile", async () => {
  const { server, port, events, logs } = start({ headerTimeoutMs: 600 });
  try {
    const idle = await Promise.all(
      Array.from({ length: 200 }, async () => {
        const c = await Deno.connect({ hostname: "127.0.0.1", port });
        await c.write(enc.encode("POST /v1/messages HTTP/1.1\r\nHost: x\r\n"));
        return c;
      }),
    );
    const t0 = performance.now();
    const ok = await fetch(`http://127.0.0.1:${port}/health`);
    assert.equal(ok.status, 200, "served while 200 clients hang");
    await ok.body?.cancel();
    const answers = await Promise.all(idle.map((c) => readAll(c, 5000)));
    const elapsed = performance.now() - t0;
    for (const a of answers) {
      assert.equal(statusOf(a), 408, a);
      assert.match(bodyOf(a), /Request head did not arrive within 0.6 s/);
    }
    assert.ok(elapsed < 4000, `closed after ${elapsed} ms`);
    for (const c of idle) c.close();
    assert.equal(events.filter((e) => e.type === "refused" && e.reason === "header_timeout").length, 200);
    assert.ok(logs.length < 10, `log lines are rate-limited: ${logs.length}`);
    assert.match(logs[0]!, /^HTTP: closed 127\.0\.0\.1:\d+: request head incomplete after 0.6 s/);
  } finally {
    await server.shutdown();
  }
});

Deno.test("http1: a 100 KB header gets 431; too many fields 431; malformed heads 400; HTTP/2 preface 400", async () => {
  const { server, port } = start();
  try {
    const big = await raw(port, `GET /health HTTP/1.1\r\nHost: x\r\nX-Big: ${"a".repeat(100_000)}\r\n\r\n`);
    assert.equal(statusOf(big), 431, big.slice(0, 200));
    assert.match(bodyOf(big), /Request head is over 32768 bytes: send shorter headers/);
    const many = await raw(
      port,
      `GET /health HTTP/1.1\r\n${Array.from({ length: 150 }, (_, i) => `X-${i}: 1\r\n`).join("")}\r\n`,
    );
    assert.equal(statusOf(many), 431);
    assert.match(bodyOf(many), /150 header fields, over the limit of 100/);
    const cases: [string, RegExp][] = [
      ["GARBAGE\r\n\r\n", /request line "GARBAGE" is not METHOD TARGET HTTP\/1.1/],
      ["GET /health HTTP/1.1\r\nBad Header: x\r\n\r\n", /header name "Bad Header" is not a token/],
      ["GET /health HTTP/1.1\r\n folded\r\n\r\n", /header line 1 has no "name:"|not a token/],
      [
        "POST /completion HTTP/1.1\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n",
        /both Content-Length and Transfer-Encoding/,
      ],
      [
        "POST /completion HTTP/1.1\r\nContent-Length: 5, 6\r\n\r\n",
        /Content-Length "5, 6" is not one number/,
      ],
      ["POST /completion HTTP/1.1\r\nContent-Length: -1\r\n\r\n", /Content-Length "-1" is not one number/],
      ["GET /health HTTP/2.0\r\n\r\n", /HTTP\/2.0 is not supported/],
      ["PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n", /HTTP\/2.0 is not supported/],
      ["GET health HTTP/1.1\r\n\r\n", /request target "health" is not a path/],
      [
        "POST /completion HTTP/1.1\r\nTransfer-Encoding: gzip\r\n\r\n",
        /Transfer-Encoding gzip is not supported/,
      ],
    ];
    for (const [req, re] of cases) {
      const r = await raw(port, req);
      assert.equal(statusOf(r), 400, `${JSON.stringify(req)} -> ${JSON.stringify(r)}`);
      assert.match(bodyOf(r), re, JSON.stringify(req));
    }
    const ok = await fetch(`http://127.0.0.1:${port}/health`);
    assert.equal(ok.status, 200, "still serving");
    await ok.body?.cancel();
  } finally {
    await server.shutdown();
  }
});

Deno.test("http1: connection cap answers 503 to one more; a slow body gets 408", async () => {
  const { server, port, events } = start({ maxConnections: 4, headerTimeoutMs: 3000 });
  try {
    const held = await Promise.all(
      Array.from({ length: 4 }, () => Deno.connect({ hostname: "127.0.0.1", port })),
    );
    await new Promise((r) => setTimeout(r, 100));
    const over = await raw(port, "GET /health HTTP/1.1\r\n\r\n");
    assert.equal(statusOf(over), 503);
    assert.match(bodyOf(over), /Server has 4 connections open, its limit: retry later/);
    assert.ok(events.some((e) => e.type === "refused" && e.reason === "connection_cap"));
    for (const c of held) c.close();
    await new Promise((r) => setTimeout(r, 100));
    const body = JSON.stringify({ prompt: "hello", n_predict: 2 });
    const slow = await raw(
      port,
      `POST /completion HTTP/1.1\r\nHost: x\r\nContent-Length: ${body.length}\r\n\r\n${body.slice(0, 5)}`,
    );
    assert.equal(statusOf(slow), 408, slow);
    assert.match(bodyOf(slow), /Request body did not arrive within 0.4 s/);
  } finally {
    await server.shutdown();
  }
});

Deno.test("http1: keep-alive, chunked bodies, Expect: 100-continue, HEAD, pipelining", async () => {
  const { server, port } = start();
  try {
    const body = JSON.stringify({ prompt: "hello", n_predict: 3 });
    const conn = await Deno.connect({ hostname: "127.0.0.1", port });
    const chunked = `${(10).toString(16)}\r\n${body.slice(0, 10)}\r\n${
      (body.length - 10).toString(16)
    };ext=1\r\n${body.slice(10)}\r\n0\r\nX-Trailer: 1\r\n\r\n`;
    await conn.write(enc.encode(
      `POST /completion HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n${chunked}` +
        `HEAD /health HTTP/1.1\r\nHost: x\r\n\r\n` +
        `GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n`,
    ));
    const all = await readAll(conn);
    conn.close();
    const statuses = [...all.matchAll(/HTTP\/1\.1 (\d{3})/g)].map((m) => Number(m[1]));
    assert.deepEqual(statuses, [200, 200, 200], all);
    assert.match(all, /"content":"Hel"/);
    assert.equal(all.split('"status":"ok"').length, 2, "HEAD has no body; GET has one");

    const c2 = await Deno.connect({ hostname: "127.0.0.1", port });
    await c2.write(enc.encode(
      `POST /completion HTTP/1.1\r\nHost: x\r\nContent-Length: ${body.length}\r\nExpect: 100-continue\r\n` +
        `Connection: close\r\n\r\n`,
    ));
    const buf = new Uint8Array(1024);
    const n = await c2.read(buf);
    assert.match(dec.decode(buf.subarray(0, n ?? 0)), /^HTTP\/1\.1 100 Continue\r\n\r\n/);
    await c2.write(enc.encode(body));
    const rest = await readAll(c2);
    c2.close();
    assert.equal(statusOf(rest), 200, rest);
    const bad = await raw(port, `POST /completion HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n`);
    assert.equal(statusOf(bad), 400);
    assert.match(bodyOf(bad), /Malformed chunked request body: chunk size "zz" is not hex/);
  } finally {
    await server.shutdown();
  }
});

Deno.test("http1: a client leaving mid-stream aborts the generation, counts as an abort, logs one line", async () => {
  const t = testApp(() => "word ".repeat(400), { delayMs: 5, nSlots: 2 });
  const metrics = new Metrics();
  const { server, port, logs, events } = start({}, t.app);
  try {
    for (const stream of [true, false]) {
      const conn = await Deno.connect({ hostname: "127.0.0.1", port });
      const body = JSON.stringify({ prompt: "hi", n_predict: 300, stream });
      await conn.write(enc.encode(
        `POST /completion HTTP/1.1\r\nHost: x\r\nContent-Length: ${body.length}\r\n\r\n${body}`,
      ));
      if (stream) await conn.read(new Uint8Array(4096));
      else await new Promise((r) => setTimeout(r, 100));
      conn.close();
    }
    for (let i = 0; i < 100 && t.engine.results.length < 2; i++) await new Promise((r) => setTimeout(r, 20));
    assert.deepEqual(
      t.engine.results.map((r) => r.reason),
      ["cancelled", "cancelled"],
      "both freed their slot",
    );
    for (let i = 0; i < 50 && events.filter((e) => e.type === "client_abort").length < 2; i++) {
      await new Promise((r) => setTimeout(r, 20));
    }
    const aborts = events.filter((e) => e.type === "client_abort");
    assert.equal(aborts.length, 2);
    for (const e of events) metrics.connection(e);
    const text = metrics.render(t.engine.status());
    assert.match(text, /llm_http_client_aborts_total\{endpoint="\/completion"\} 2/);
    const m = await (await t.app.request("/metrics")).text();
    assert.doesNotMatch(m, /status="500"/);
    assert.match(m, /endpoint="\/completion",status="499"/, "the non-streamed one");
    for (let i = 0; i < 50 && server.activeRequests > 0; i++) await new Promise((r) => setTimeout(r, 20));
    assert.equal(server.activeRequests, 0, "the abandoned responses ended");
    assert.equal(logs.filter((l) => /went away/.test(l)).length, 1, `one line (rate-limited): ${logs}`);
    assert.ok(logs.every((l) => !l.includes("\n") && !/at .*\.ts:\d+/.test(l)), "no stack traces");
  } finally {
    await server.shutdown();
  }
});

Deno.test("http1: shutdown lets the in-flight response finish and refuses new connections", async () => {
  const t = testApp(() => "word ".repeat(50), { delayMs: 5 });
  const { server, port } = start({}, t.app);
  const r = fetch(`http://127.0.0.1:${port}/completion`, {
    method: "POST",
    body: JSON.stringify({ prompt: "hi", n_predict: 40 }),
  });
  await new Promise((res) => setTimeout(res, 30));
  const down = server.shutdown();
  const j = await (await r).json();
  assert.equal(j.stop, true);
  assert.equal(j.tokens_predicted, 40);
  await down;
  await assert.rejects(() => Deno.connect({ hostname: "127.0.0.1", port }));
});

Deno.test("http1: a stream's small frames go out as written on a kept-alive connection (no 40 ms ACK wait)", async () => {
  // Three frames 5 ms apart; without TCP_NODELAY each frame after the head waits for the client's delayed
  // ACK (40 ms on Linux loopback) from the second request of a connection on.
  const sse = () => {
    const e = new TextEncoder();
    return new Response(
      new ReadableStream<Uint8Array>({
        async start(c) {
          for (const x of ["a", "b", "c"]) {
            c.enqueue(e.encode(`data: ${x}\n\n`));
            await new Promise((r) => setTimeout(r, 5));
          }
          c.close();
        },
      }),
      { headers: { "content-type": "text/event-stream" } },
    );
  };
  const server = serveHttp1({ hostname: "127.0.0.1", port: 0, log: () => {} }, () => sse());
  const conn = await Deno.connect({ hostname: "127.0.0.1", port: server.addr.port });
  try {
    const spans: number[] = [];
    const buf = new Uint8Array(4096);
    for (let k = 0; k < 4; k++) {
      const t0 = performance.now();
      await conn.write(enc.encode("GET /s HTTP/1.1\r\nHost: x\r\n\r\n"));
      let got = "";
      while (!got.endsWith("0\r\n\r\n")) {
        const n = await conn.read(buf);
        assert.ok(n !== null, `the connection closed mid-response: ${got}`);
        got += dec.decode(buf.subarray(0, n));
      }
      assert.match(got, /data: c/);
      if (k > 0) spans.push(performance.now() - t0);
    }
    // About 10 ms each as written; at least 40 when frames wait for ACKs. The fastest of three bounds noise.
    assert.ok(Math.min(...spans) < 30, `request to last frame took ${spans.map((s) => s.toFixed(1))} ms`);
  } finally {
    conn.close();
    await server.shutdown();
  }
});
