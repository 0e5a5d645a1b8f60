/**
 * Live: the real engine service (tiny synthetic qwen35moe on the GPU adapter) behind the app on loopback,
 * driven by the official SDKs, unmodified. Greedy streamed ≡ non-streamed per API, four concurrent requests
 * on four slots each equal their solo output, and a client disconnect frees its slot.
 */
import assert from "node:assert/strict";
import Anthropic from "@anthropic-ai/sdk";
import OpenAI from "openai";
import { ChatTemplate, openGguf, planModel, startEngine, synthesize, Tokenizer } from "../engine/mod.ts";
import { createApp } from "./app.ts";

Deno.test("live: official SDKs against the real engine service on loopback", async (t) => {
  const dir = await Deno.makeTempDir({ prefix: "server_live_" });
  const path = `${dir}/tiny.gguf`;
  await synthesize(planModel({ arch: "qwen35moe", preset: "tiny", quant: "q8_0", seed: 3 }), { out: path });
  let tokenizer: Tokenizer, template: ChatTemplate;
  {
    using f = await openGguf(path);
    tokenizer = Tokenizer.fromGguf(f.metadata);
    template = ChatTemplate.fromGguf(f.metadata);
  }
  const engine = startEngine({
    model: path,
    nCtx: 128,
    nSlots: 4,
    queueSize: 4,
    warmUp: false,
    onLog: () => {},
  });
  const app = createApp({ engine, tokenizer, template, tempDefault: 0, tempCap: 2, bodyLimitBytes: 1 << 20 });
  const server = Deno.serve({ hostname: "127.0.0.1", port: 0, onListen: () => {} }, app.fetch);
  const base = `http://127.0.0.1:${server.addr.port}`;
  try {
    for (let i = 0; i < 600 && engine.status().state === "loading"; i++) {
      await new Promise((r) => setTimeout(r, 100));
    }
    assert.equal(engine.status().state, "ready");
    const health = await (await fetch(`${base}/health`)).json();
    assert.equal(health.status, "ok");

    await t.step("anthropic: streamed ≡ non-streamed (greedy)", async () => {
      const client = new Anthropic({ apiKey: "unused", baseURL: base, maxRetries: 0 });
      const params = {
        model: "m",
        max_tokens: 10,
        messages: [{ role: "user" as const, content: "Tell me a story" }],
      };
      const a = await client.messages.create(params);
      const b = await client.messages.stream(params).finalMessage();
      assert.deepEqual(b.content, a.content);
      assert.equal(b.stop_reason, a.stop_reason);
      assert.equal(b.usage.output_tokens, a.usage.output_tokens);
      assert.equal(b.usage.input_tokens, a.usage.input_tokens);
      assert.ok(a.usage.output_tokens >= 1);
    });

    await t.step("openai: streamed ≡ non-streamed (greedy), usage included", async () => {
      const client = new OpenAI({ apiKey: "unused", baseURL: `${base}/v1`, maxRetries: 0 });
      const params = {
        model: "m",
        max_tokens: 10,
        messages: [{ role: "user" as const, content: "Tell me a story" }],
      };
      const a = await client.chat.completions.create(params);
      let text = "", reasoning = "", finish: string | null = null;
      let usage: OpenAI.CompletionUsage | null | undefined;
      const stream = await client.chat.completions.create({
        ...params,
        stream: true,
        stream_options: { include_usage: true },
      });
      for await (const c of stream) {
        const d = c.choices[0]?.delta as { content?: string; reasoning_content?: string } | undefined;
        text += d?.content ?? "";
        reasoning += d?.reasoning_content ?? "";
        finish = c.choices[0]?.finish_reason ?? finish;
        usage = c.usage ?? usage;
      }
      const m = a.choices[0]!.message as { content: string | null; reasoning_content?: string };
      assert.equal(text, m.content ?? "");
      assert.equal(reasoning, m.reasoning_content ?? "");
      assert.equal(finish, a.choices[0]!.finish_reason);
      assert.equal(usage?.completion_tokens, a.usage?.completion_tokens);
    });

    await t.step("four concurrent requests on four slots each equal their solo output", async () => {
      const prompts = ["Once upon", "The capital of", "1, 2, 3,", "def main():"];
      const ask = async (prompt: string) => {
        const r = await fetch(`${base}/completion`, {
          method: "POST",
          body: JSON.stringify({ prompt, n_predict: 2, return_tokens: true }),
        });
        assert.equal(r.status, 200);
        return (await r.json()).tokens as number[];
      };
      const solo: number[][] = [];
      for (const p of prompts) solo.push(await ask(p));
      const together = await Promise.all(prompts.map(ask));
      assert.deepEqual(together, solo);
    });

    await t.step("a client that disconnects mid-stream frees its slot", async () => {
      // The model is random: take the first prompt whose generation is still running after one frame.
      let tried = 0;
      for (const prompt of ["Hello", "Tell me", "Why is", "List of"]) {
        tried++;
        const ac = new AbortController();
        const r = await fetch(`${base}/completion`, {
          method: "POST",
          body: JSON.stringify({ prompt, n_predict: 100, stream: true }),
          signal: ac.signal,
        });
        const reader = r.body!.getReader();
        const first = new TextDecoder().decode((await reader.read()).value);
        if (first.includes('"stop":true') || engine.status().busySlots === 0) {
          await reader.cancel();
          continue;
        }
        const before = engine.status().counters.generatedTokens;
        ac.abort();
        for (let i = 0; i < 400 && engine.status().busySlots > 0; i++) {
          await new Promise((r) => setTimeout(r, 25));
        }
        assert.equal(engine.status().busySlots, 0, "the slot is free again");
        const generated = engine.status().counters.generatedTokens;
        assert.ok(generated - before < 100, `went on for ${generated - before} tokens after the disconnect`);
        return;
      }
      assert.fail(`every one of ${tried} prompts ended after its first frame: cannot observe a disconnect`);
    });
  } finally {
    await server.shutdown();
    await engine.close({ cancel: true });
    await Deno.remove(dir, { recursive: true });
  }
});
