/**
 * Load test of the head on the real engine (tiny synthetic qwen35moe, GPU worker) over loopback TCP:
 * 64 concurrent clients stream one sampled completion each, a random third of them disconnecting after
 * their first frame. Afterwards every completed stream equals its solo run with the same seed (on a fresh
 * engine, so no prefix reuse changes a prompt's chunking), no slot or queue entry is leaked (`/metrics`),
 * and client aborts are counted as aborts, never as 500s.
 *
 * Prompts are token ids whose first id differs per client, so no request reuses another's prefix.
 */
import assert from "node:assert/strict";
import { KEYS, openGguf, planModel, startEngine, synthesize, Tokenizer } from "../engine/mod.ts";
import { ChatTemplate } from "../engine/mod.ts";
import { createApp } from "../server/app.ts";
import { serveHttp1 } from "../server/http1.ts";
import { Metrics } from "../server/metrics.ts";
import { Rng } from "./util/rng.ts";

const CLIENTS = 64;
const N_PREDICT = 8;
const SLOTS = 4;

interface Head {
  base: string;
  metrics: () => Promise<string>;
  stop: () => Promise<void>;
}

async function startHead(path: string, tokenizer: Tokenizer, template: ChatTemplate): Promise<Head> {
  const engine = startEngine({ model: path, nCtx: 64, nSlots: SLOTS, queueSize: CLIENTS });
  while (engine.status().state === "loading") await new Promise((r) => setTimeout(r, 50));
  assert.equal(engine.status().state, "ready");
  const metrics = new Metrics();
  const app = createApp({
    engine,
    tokenizer,
    template,
    tempDefault: 0,
    tempCap: 2,
    bodyLimitBytes: 1 << 20,
    metrics,
  });
  const server = serveHttp1(
    { hostname: "127.0.0.1", port: 0, log: () => {}, onEvent: (e) => metrics.connection(e) },
    (req) => app.fetch(req),
  );
  const base = `http://127.0.0.1:${server.addr.port}`;
  return {
    base,
    metrics: async () => await (await fetch(`${base}/metrics`)).text(),
    stop: async () => {
      await server.shutdown();
      await engine.close();
    },
  };
}

function requestBody(i: number): string {
  return JSON.stringify({
    prompt: [200 + i, 11, 12, 13],
    n_predict: N_PREDICT,
    temperature: 0.8,
    top_k: 40,
    seed: 1000 + i,
    stream: true,
    return_tokens: true,
  });
}

/** Streams client `i`'s completion; returns its ids, or undefined when it hung up after the first frame. */
async function client(base: string, i: number, hangUp: boolean): Promise<number[] | undefined> {
  const ac = new AbortController();
  const r = await fetch(`${base}/completion`, { method: "POST", body: requestBody(i), signal: ac.signal });
  assert.equal(r.status, 200, `client ${i}: ${r.status}`);
  const reader = r.body!.pipeThrough(new TextDecoderStream()).getReader();
  let text = "";
  for (;;) {
    const { done, value } = await reader.read();
    if (done) break;
    text += value;
    if (hangUp) {
      ac.abort();
      await reader.cancel().catch(() => {});
      return undefined;
    }
  }
  const frames = text.split("\n\n").filter((f) => f.startsWith("data: ")).map((f) => JSON.parse(f.slice(6)));
  const last = frames.at(-1);
  assert.equal(last?.stop, true, `client ${i}: the stream ends with its final frame: ${text}`);
  assert.equal(last.tokens_predicted, frames.flatMap((f) => f.tokens).length, `client ${i}: token count`);
  return frames.flatMap((f) => f.tokens as number[]);
}

Deno.test("load: 64 concurrent streams, a third hanging up: completed ones equal their solo runs, no slot leaks", async () => {
  const rng = new Rng();
  const dir = await Deno.makeTempDir({ prefix: "load_test_" });
  const path = `${dir}/tiny.gguf`;
  await synthesize(planModel({ arch: "qwen35moe", preset: "tiny", quant: "q8_0", seed: 1 }), { out: path });
  let tokenizer: Tokenizer, template: ChatTemplate;
  {
    using f = await openGguf(path);
    assert.ok(f.metadata.has(KEYS.tokTokens));
    tokenizer = Tokenizer.fromGguf(f.metadata);
    template = ChatTemplate.fromGguf(f.metadata);
  }
  try {
    const hangUps = new Set<number>();
    while (hangUps.size < CLIENTS / 3) hangUps.add(rng.int(0, CLIENTS - 1));
    const head = await startHead(path, tokenizer, template);
    let loaded: (number[] | undefined)[];
    try {
      loaded = await Promise.all(
        Array.from({ length: CLIENTS }, (_, i) => client(head.base, i, hangUps.has(i))),
      );
      // Hung-up requests are cancelled within one readback batch; wait for the engine to settle.
      let m = "";
      for (let k = 0; k < 100; k++) {
        m = await head.metrics();
        if (/llm_slots_busy 0\n/.test(m) && /llm_queue_depth 0\n/.test(m)) break;
        await new Promise((r) => setTimeout(r, 50));
      }
      assert.match(m, /llm_slots_busy 0\n/, "every slot is free again");
      assert.match(m, /llm_queue_depth 0\n/, "nothing left queued");
      assert.doesNotMatch(m, /status="5\d\d"/, "no 5xx");
      const aborts = Number(
        /llm_http_client_aborts_total\{endpoint="\/completion"\} (\d+)/.exec(m)?.[1] ?? 0,
      );
      assert.ok(aborts >= 1 && aborts <= hangUps.size, `${aborts} aborts for ${hangUps.size} hang-ups`);
    } finally {
      await head.stop();
    }
    const solo = await startHead(path, tokenizer, template);
    try {
      let compared = 0;
      for (let i = 0; i < CLIENTS; i++) {
        const got = loaded[i];
        if (got === undefined) continue;
        const want = await client(solo.base, i, false);
        assert.deepEqual(got, want, `client ${i}: loaded run differs from its solo run (seed ${1000 + i})`);
        compared++;
      }
      assert.equal(compared, CLIENTS - hangUps.size);
    } finally {
      await solo.stop();
    }
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});
