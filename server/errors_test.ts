import assert from "node:assert/strict";
import { ChatTemplateError } from "../engine/mod.ts";
import { QueueFullError } from "../engine/mod.ts";
import { API_ERRORS, ApiError, dialectOf, errorResponse, toApiError } from "./errors.ts";

Deno.test("errors: table rows map each kind to its status and both dialects' types", async () => {
  const want: Record<string, number> = {
    invalid_request: 400,
    authentication: 401,
    not_found: 404,
    request_too_large: 413,
    overloaded: 503,
    unavailable: 503,
    internal: 500,
  };
  for (const [kind, status] of Object.entries(want)) {
    const err = new ApiError(kind as keyof typeof API_ERRORS, `m ${kind}`, { param: "p" });
    assert.equal(err.status, status);
    const a = errorResponse(err, "anthropic", "req_a");
    assert.equal(a.status, status);
    assert.equal(a.headers.get("request-id"), "req_a");
    assert.deepEqual(await a.json(), {
      type: "error",
      error: { type: API_ERRORS[err.kind].anthropic, message: `m ${kind}` },
      request_id: "req_a",
    });
    const o = errorResponse(err, "openai", "req_o");
    assert.deepEqual(await o.json(), {
      error: {
        message: `m ${kind}`,
        type: API_ERRORS[err.kind].openai,
        param: "p",
        code: API_ERRORS[err.kind].openaiCode,
      },
    });
  }
});

Deno.test("errors: queue full → 503 + Retry-After, template rejection → 400, anything else → 500 naming only the request id", () => {
  const q = toApiError(new QueueFullError("All 4 slots busy", 7), "r1");
  assert.equal(q.status, 503);
  assert.equal(q.retryAfterSeconds, 7);
  assert.equal(errorResponse(q, "openai", "r1").headers.get("retry-after"), "7");
  assert.equal(toApiError(new ChatTemplateError("rejected", "No user query"), "r").status, 400);
  assert.equal(toApiError(new ChatTemplateError("bad_request", "args"), "r").status, 400);
  const originalError = console.error;
  const logged: unknown[] = [];
  console.error = (...a: unknown[]) => logged.push(a);
  try {
    const tpl = toApiError(new ChatTemplateError("render", "interpreter broke"), "req_x");
    assert.equal(tpl.status, 500);
    const bug = toApiError(new TypeError("secret internals"), "req_y");
    assert.equal(bug.status, 500);
    assert.equal(bug.message, "Internal server error (request id req_y): the server log has the details");
    assert.ok(!bug.message.includes("secret"));
    // Broken numerics cross the engine's Worker as an Error named NumericsError: a 500 that names them.
    const nf = new Error("The model produced non-finite logits (NaN or Inf) at decode step 3 of slot 0");
    nf.name = "NumericsError";
    const num = toApiError(nf, "req_z");
    assert.equal(num.status, 500);
    assert.match(num.message, /^Model failure \(request id req_z\): The model produced non-finite logits/);
    assert.equal(logged.length, 3);
  } finally {
    console.error = originalError;
  }
  assert.equal(dialectOf("/v1/messages"), "anthropic");
  assert.equal(dialectOf("/v1/messages/count_tokens"), "anthropic");
  assert.equal(dialectOf("/v1/chat/completions"), "openai");
  assert.equal(dialectOf("/completion"), "openai");
});
