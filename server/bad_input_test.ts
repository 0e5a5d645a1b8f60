/**
 * The standing bad-input suite for HTTP, over loopback TCP through the real server (server/http1.ts) and
 * app: malformed and hostile bodies, fields of the wrong type and range, huge bodies and headers, wrong
 * methods, auth. Each case asserts the status AND the message, and the server must still serve a normal
 * request after every case.
 */
import assert from "node:assert/strict";
import { serveHttp1 } from "./http1.ts";
import { testApp } from "./_test_engine.ts";

const KEY = "secret-key";

interface Case {
  name: string;
  method?: string;
  path: string;
  body?: string | Uint8Array;
  headers?: Record<string, string>;
  status: number;
  message: RegExp;
}

const USER = [{ role: "user", content: "Hi" }];
const msg = (extra: Record<string, unknown>) => JSON.stringify({ max_tokens: 4, messages: USER, ...extra });
const chat = (extra: Record<string, unknown>) => JSON.stringify({ messages: USER, ...extra });

const CASES: Case[] = [
  {
    name: "no key",
    path: "/v1/messages",
    body: msg({}),
    headers: { "x-api-key": "" },
    status: 401,
    message: /^Missing API key: send it as the x-api-key header/,
  },
  {
    name: "wrong x-api-key",
    path: "/v1/messages",
    body: msg({}),
    headers: { "x-api-key": "guess" },
    status: 401,
    message: /^Invalid API key/,
  },
  {
    name: "wrong key",
    path: "/v1/chat/completions",
    body: chat({}),
    headers: { authorization: "Bearer nope" },
    status: 401,
    message: /^Invalid API key: the key sent does not match/,
  },
  {
    name: "empty body",
    path: "/v1/messages",
    body: "",
    status: 400,
    message: /^Malformed JSON in request body \(0 bytes\)/,
  },
  {
    name: "not JSON",
    path: "/v1/messages",
    body: "{'a':1}",
    status: 400,
    message: /^Malformed JSON in request body/,
  },
  {
    name: "JSON array",
    path: "/v1/chat/completions",
    body: "[1,2]",
    status: 400,
    message: /^Request body is array, expected a JSON object$/,
  },
  {
    name: "invalid UTF-8",
    path: "/completion",
    body: new Uint8Array([0x7b, 0xff, 0xfe, 0x7d]),
    status: 400,
    message: /^Malformed JSON in request body \(4 bytes\)/,
  },
  {
    name: "deep nesting",
    path: "/completion",
    body: "[".repeat(30_000) + "]".repeat(30_000),
    status: 400,
    message: /^Request body is array|^Malformed JSON/,
  },
  {
    name: "body over the limit",
    path: "/v1/messages",
    body: msg({ system: "x".repeat(70_000) }),
    status: 413,
    message: /^Request body of \d+ bytes is over the limit of 65536 bytes/,
  },
  {
    name: "max_tokens missing",
    path: "/v1/messages",
    body: JSON.stringify({ messages: USER }),
    status: 400,
    message: /^Field max_tokens is required: send an integer >= 1$/,
  },
  {
    name: "max_tokens string",
    path: "/v1/messages",
    body: msg({ max_tokens: "5" }),
    status: 400,
    message: /^Field max_tokens is string "5", expected an integer$/,
  },
  {
    name: "max_tokens zero",
    path: "/v1/messages",
    body: msg({ max_tokens: 0 }),
    status: 400,
    message: /^Field max_tokens is 0, expected a value in \[1, inf\]$/,
  },
  {
    name: "max_tokens over ctx",
    path: "/v1/messages",
    body: msg({ max_tokens: 1e9 }),
    status: 400,
    message: /^Field max_tokens is 1000000000, over the limit of 2048/,
  },
  {
    name: "temperature NaN-ish",
    path: "/v1/chat/completions",
    body: chat({ temperature: "hot" }),
    status: 400,
    message: /^Field temperature is string "hot", expected a number$/,
  },
  {
    name: "temperature range",
    path: "/v1/chat/completions",
    body: chat({ temperature: 9 }),
    status: 400,
    message: /^Field temperature is 9, expected a value in \[0, 2\]$/,
  },
  {
    name: "top_p range",
    path: "/completion",
    body: JSON.stringify({ prompt: "a", top_p: -1 }),
    status: 400,
    message: /^Field top_p is -1, expected a value in \[0, 1\]$/,
  },
  {
    name: "messages not array",
    path: "/v1/messages",
    body: msg({ messages: "hi" }),
    status: 400,
    message: /^Field messages is string "hi", expected an array$/,
  },
  {
    name: "messages empty",
    path: "/v1/chat/completions",
    body: chat({ messages: [] }),
    status: 400,
    message: /^Field messages is empty/,
  },
  {
    name: "bad role",
    path: "/v1/messages",
    body: msg({ messages: [{ role: "system", content: "x" }] }),
    status: 400,
    message: /^Field messages\[0\].role is "system", expected user or assistant$/,
  },
  {
    name: "image block",
    path: "/v1/messages",
    body: msg({ messages: [{ role: "user", content: [{ type: "image" }] }] }),
    status: 400,
    message: /^Field messages\[0\].content\[0\].type is "image": this server runs a text-only model$/,
  },
  {
    name: "token id out of range",
    path: "/completion",
    body: JSON.stringify({ prompt: [1, 99999] }),
    status: 400,
    message: /^Field prompt\[1\] is 99999, expected a token id in \[0, 265\)$/,
  },
  {
    name: "n > 1",
    path: "/v1/chat/completions",
    body: chat({ n: 3 }),
    status: 400,
    message: /^Field n is 3: this server generates one choice per request/,
  },
  {
    name: "empty stop",
    path: "/completion",
    body: JSON.stringify({ prompt: "a", stop: [""] }),
    status: 400,
    message: /^Field stop\[0\] is an empty string/,
  },
  {
    name: "logprobs",
    path: "/v1/chat/completions",
    body: chat({ logprobs: true }),
    status: 400,
    message: /^Field logprobs is not supported yet/,
  },
  {
    name: "wrong method",
    method: "GET",
    path: "/v1/messages",
    status: 405,
    message: /^Method GET is not allowed on \/v1\/messages: use POST$/,
  },
  { name: "unknown path", method: "GET", path: "/admin", status: 404, message: /^No route GET \/admin/ },
  {
    name: "unknown model",
    method: "GET",
    path: "/v1/models/nope",
    status: 404,
    message: /^Model "nope" is not served here/,
  },
  {
    name: "huge header",
    method: "GET",
    path: "/health",
    headers: { "x-big": "a".repeat(100_000) },
    status: 431,
    message: /^Request head is over 32768 bytes/,
  },
  {
    name: "prompt too long",
    path: "/completion",
    body: JSON.stringify({ prompt: "a".repeat(3000) }),
    status: 400,
    message: /^Prompt is 3000 tokens but the context holds 2048/,
  },
];

/** One raw HTTP/1.1 exchange on a fresh connection. */
async function exchange(port: number, c: Case): Promise<{ status: number; body: string }> {
  const enc = new TextEncoder();
  const body = typeof c.body === "string" ? enc.encode(c.body) : c.body ?? new Uint8Array(0);
  const headers: Record<string, string> = { host: "x", "x-api-key": KEY, ...c.headers };
  // An empty x-api-key in a case means "send no key at all".
  if (headers["x-api-key"] === "" || headers.authorization !== undefined) delete headers["x-api-key"];
  const method = c.method ?? "POST";
  const lines = [`${method} ${c.path} HTTP/1.1`, ...Object.entries(headers).map(([k, v]) => `${k}: ${v}`)];
  if (method === "POST") lines.push(`content-length: ${body.length}`, "content-type: application/json");
  lines.push("connection: close");
  const conn = await Deno.connect({ hostname: "127.0.0.1", port });
  try {
    const head = enc.encode(lines.join("\r\n") + "\r\n\r\n");
    const all = new Uint8Array(head.length + body.length);
    all.set(head);
    all.set(body, head.length);
    await conn.write(all).catch(() => 0);
    let text = "";
    const buf = new Uint8Array(65536);
    for (;;) {
      const n = await conn.read(buf).catch(() => null);
      if (n === null) break;
      text += new TextDecoder().decode(buf.subarray(0, n));
    }
    const status = Number(/^HTTP\/1\.1 (\d{3})/.exec(text)?.[1] ?? 0);
    return { status, body: text.slice(text.indexOf("\r\n\r\n") + 4) };
  } finally {
    try {
      conn.close();
    } catch {
      // closed by the server
    }
  }
}

Deno.test("bad input: every case gets its status and message, and the server still serves", async () => {
  const { app } = testApp(() => "ok", { apiKey: KEY, bodyLimitBytes: 65536 });
  const server = serveHttp1({ hostname: "127.0.0.1", port: 0, log: () => {} }, (req) => app.fetch(req));
  const port = server.addr.port;
  const failures: string[] = [];
  try {
    for (const c of CASES) {
      const r = await exchange(port, c);
      let message = r.body;
      try {
        message = JSON.parse(r.body).error.message;
      } catch {
        // not JSON: compared as text, and the status check reports it
      }
      if (r.status !== c.status || !c.message.test(message)) {
        failures.push(
          `${c.name}: got ${r.status} ${
            JSON.stringify(message.slice(0, 200))
          }, want ${c.status} ${c.message}`,
        );
      }
      const ok = await exchange(port, {
        name: "normal",
        path: "/v1/messages",
        body: msg({}),
        status: 200,
        message: /./,
      });
      if (ok.status !== 200) failures.push(`after ${c.name}: a normal request got ${ok.status} ${ok.body}`);
    }
  } finally {
    await server.shutdown();
  }
  assert.deepEqual(failures, []);
});
