/**
 * Property-based fuzzing of the request parsers (fast-check): arbitrary JSON, and near-valid requests whose
 * fields take random values of any type, never make the parsers throw anything but an ApiError (a 400 that
 * names a field); the body reader turns any bytes into a JSON object or an ApiError; and through the whole
 * app no body makes a 500. Each case is bounded in time.
 */
import assert from "node:assert/strict";
import fc from "fast-check";
import { readJson } from "./_parse.ts";
import { parseChatCompletionsRequest } from "./chat_completions.ts";
import { parseCompletionRequest } from "./completion.ts";
import { ApiError } from "./errors.ts";
import { parseMessagesRequest } from "./messages.ts";
import { post, testApp } from "./_test_engine.ts";

/** Most milliseconds one parse may take. */
const CASE_MS = 500;

function onlyApiErrors(f: () => unknown): void {
  const t0 = performance.now();
  try {
    f();
  } catch (e) {
    if (!(e instanceof ApiError)) throw new Error(`threw ${(e as Error)?.name}: ${e}`, { cause: e });
    assert.equal(e.status, 400, e.message);
    assert.match(e.message, /^[A-Z]/, "capitalised message");
  }
  assert.ok(performance.now() - t0 < CASE_MS);
}

const any = fc.oneof(
  fc.jsonValue({ maxDepth: 3 }),
  fc.constantFrom(null, "", 0, -1, 1e308, 0.5, true, [], {}, "user", "assistant", "tool", "text"),
);
const block = fc.record({
  type: fc.oneof(
    fc.constantFrom("text", "tool_use", "tool_result", "thinking", "image", "redacted_thinking"),
    any,
  ),
  text: any,
  id: fc.oneof(fc.constantFrom("t1", "c1"), any),
  tool_use_id: fc.oneof(fc.constantFrom("t1", "c1"), any),
  name: any,
  input: any,
  content: any,
  thinking: any,
}, { requiredKeys: ["type"] });
const message = fc.record({
  role: fc.oneof(fc.constantFrom("user", "assistant", "system", "tool", "developer"), any),
  content: fc.oneof(fc.string(), fc.array(block, { maxLength: 3 }), any),
  tool_calls: fc.oneof(
    fc.array(
      fc.record({
        id: any,
        type: fc.constant("function"),
        function: fc.oneof(fc.record({ name: any, arguments: fc.oneof(fc.string(), any) }), any),
      }),
      { maxLength: 2 },
    ),
    any,
  ),
  tool_call_id: any,
}, { requiredKeys: ["role"] });
const tool = fc.oneof(
  fc.record({ name: any, description: any, input_schema: any, type: any }, { requiredKeys: [] }),
  fc.record({
    type: fc.constant("function"),
    function: fc.oneof(fc.record({ name: any, parameters: any }), any),
  }),
  any,
);
const body = fc.record({
  model: any,
  max_tokens: fc.oneof(fc.integer({ min: -2, max: 5000 }), any),
  messages: fc.oneof(fc.array(message, { maxLength: 4 }), any),
  system: any,
  tools: fc.oneof(fc.array(tool, { maxLength: 3 }), any),
  tool_choice: fc.oneof(
    fc.constantFrom("auto", "none", "required", { type: "any" }, { type: "tool", name: "a" }),
    any,
  ),
  stop: any,
  stop_sequences: any,
  stream: any,
  temperature: any,
  top_p: any,
  top_k: any,
  seed: any,
  logprobs: any,
  logit_bias: any,
  response_format: any,
  prompt: fc.oneof(fc.string(), fc.array(fc.integer({ min: -5, max: 600 }), { maxLength: 5 }), any),
  n_predict: any,
  parse_special: any,
  thinking: any,
  chat_template_kwargs: any,
  stream_options: any,
}, { requiredKeys: [] });

Deno.test("fuzz parse: the three request parsers throw only ApiError 400s", () => {
  fc.assert(
    fc.property(fc.oneof(body, fc.dictionary(fc.string(), any)), (b) => {
      onlyApiErrors(() => parseMessagesRequest(b));
      onlyApiErrors(() => parseChatCompletionsRequest(b));
      onlyApiErrors(() => parseCompletionRequest(b, 300));
    }),
    { numRuns: 1500 },
  );
});

Deno.test("fuzz parse: readJson turns any bytes into an object or an ApiError", async () => {
  await fc.assert(
    fc.asyncProperty(
      fc.oneof(
        fc.uint8Array({ maxLength: 300 }),
        fc.jsonValue().map((v) => new TextEncoder().encode(JSON.stringify(v))),
      ),
      async (bytes) => {
        try {
          const v = await readJson(new Request("http://x/", { method: "POST", body: bytes }), 200);
          assert.equal(typeof v, "object");
        } catch (e) {
          if (!(e instanceof ApiError)) throw e;
          assert.ok(e.status === 400 || e.status === 413, e.message);
        }
      },
    ),
    { numRuns: 500 },
  );
});

Deno.test("fuzz parse: no request body makes the app answer 500", async () => {
  const { app } = testApp(() => "ok", { nSlots: 4, queueSize: 64 });
  await fc.assert(
    fc.asyncProperty(
      fc.constantFrom("/v1/messages", "/v1/chat/completions", "/completion", "/v1/messages/count_tokens"),
      body,
      async (path, b) => {
        const r = await post(app, path, { ...b, max_tokens: 2, n_predict: 2, stream: false });
        const text = await r.text();
        assert.ok(r.status < 500, `${r.status} for ${path} ${JSON.stringify(b)}: ${text}`);
      },
    ),
    { numRuns: 300 },
  );
});
