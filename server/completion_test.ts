import assert from "node:assert/strict";
import { parseSse, post, testApp } from "./_test_engine.ts";

// deno-lint-ignore no-explicit-any
type Loose = any;

Deno.test("completion: text prompt (special tokens parsed), ids prompt, tokens returned, stop word", async () => {
  const { app, engine, tokenizer } = testApp(() => "The answer is 42. Done");
  const j: Loose =
    await (await post(app, "/completion", { prompt: "<|im_start|>Q", return_tokens: true, stop: [". D"] }))
      .json();
  assert.deepEqual(engine.requests[0]!.prompt, tokenizer.encode("<|im_start|>Q", { parseSpecial: true }));
  assert.equal(engine.requests[0]!.prompt[0], tokenizer.tokenId("<|im_start|>"));
  assert.equal(j.content, "The answer is 42");
  assert.equal(j.stop, true);
  assert.equal(j.stop_type, "word");
  assert.equal(j.stopping_word, ". D");
  assert.equal(j.tokens_evaluated, 2);
  assert.equal(tokenizer.decode(j.tokens), "The answer is 42. D", "ids up to the token completing the stop");
  assert.equal(j.tokens_predicted, j.tokens.length);

  const k: Loose = await (await post(app, "/completion", { prompt: [1, 2, 3], n_predict: 3, seed: -1 }))
    .json();
  assert.deepEqual(engine.requests[1]!.prompt, [1, 2, 3]);
  assert.equal(engine.requests[1]!.maxTokens, 3);
  assert.equal(k.content, "The");
  assert.equal(k.stop_type, "limit");
  assert.equal(k.tokens, undefined);
});

Deno.test("completion: streamed frames concatenate to the non-streamed content and ids", async () => {
  const { app } = testApp(() => "héllo wörld — ok");
  const body = { prompt: "x", return_tokens: true };
  const whole: Loose = await (await post(app, "/completion", body)).json();
  const r = await post(app, "/completion", { ...body, stream: true });
  const frames: Loose[] = parseSse(await r.text()).map((f) => JSON.parse(f.data));
  const last = frames.at(-1);
  assert.equal(last.stop, true);
  assert.ok(frames.slice(0, -1).every((f) => f.stop === false));
  assert.equal(frames.map((f) => f.content).join(""), whole.content);
  assert.deepEqual(frames.flatMap((f) => f.tokens), whole.tokens);
  assert.equal(last.stop_type, "eos");
  assert.equal(whole.content, "héllo wörld — ok");
});

Deno.test("completion: bad inputs name their field", async () => {
  const { app } = testApp(() => "x", { nCtx: 16 });
  const cases: [unknown, number, RegExp][] = [
    [{}, 400, /Field prompt is required/],
    [{ prompt: 5 }, 400, /Field prompt is number, expected a string or an array of token ids/],
    [{ prompt: [1, 99999] }, 400, /Field prompt\[1\] is 99999, expected a token id in \[0, 265\)/],
    [{ prompt: [1, -1] }, 400, /Field prompt\[1\] is -1/],
    [{ prompt: "a", n_predict: 0 }, 400, /Field n_predict is 0/],
    [{ prompt: "a", n_predict: 17 }, 400, /Field n_predict is 17, over the limit of 16/],
    [{ prompt: "a".repeat(20) }, 400, /Prompt is 20 tokens but the context holds 16/],
    [{ prompt: "" }, 400, /Prompt is empty/],
    [{ prompt: "a", return_tokens: 1 }, 400, /Field return_tokens is number, expected a boolean/],
  ];
  for (const [body, status, msg] of cases) {
    const r = await post(app, "/completion", body);
    const j: Loose = await r.json();
    assert.equal(r.status, status, JSON.stringify(body));
    assert.match(j.error.message, msg);
    assert.equal(j.error.type, "invalid_request_error");
  }
});
