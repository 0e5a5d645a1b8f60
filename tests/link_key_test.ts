/**
 * Two different link keys refuse each other, on both sides of the link (issue #19: "an unauthenticated or
 * wrong-key peer is refused and logged"):
 * - real processes on loopback: a worker with one key and a split head with another; the worker checks the
 *   head's proof first, logs the refusal and closes; the head answers 503 naming the wrong key and stays up;
 *   a head with the worker's key is then served by the same worker;
 * - the connector's own check (the head's link, `connectLink`): an acceptor that skips its check and proves
 *   with another key is refused by the connector with its own message, and told why in a `close` frame.
 * @module
 */
import assert from "node:assert/strict";
import {
  connectLink,
  type Frame,
  FrameConn,
  importLinkKey,
  limitsOf,
  makeProof,
  newNonce,
  transcriptHash,
  WireError,
} from "../wire/mod.ts";
import { payloadOf } from "../wire/_io.ts";
import { sampleHeadHello, sampleHello } from "../wire/_testing.ts";
import { planModel, synthesize } from "../engine/mod.ts";
import { type Proc, spawnMod } from "./util/procs.ts";

const KEY_A = "link-key-of-the-worker-0123456789";
const KEY_B = "another-link-key-of-the-head-9876";

async function head(model: string, workerPort: number, key: string): Promise<{ p: Proc; url: string }> {
  const p = spawnMod([
    "head",
    "--no-warm-up",
    "--model",
    model,
    "--port",
    "0",
    "--slots",
    "1",
    "--ctx",
    "128",
    "--layers",
    "0:2",
    "--next",
    `127.0.0.1:${workerPort}`,
    "--link-key",
    key,
  ]);
  const url = (await p.waitFor(/Listening on (http:\/\/\S+)/))[1]!;
  await p.waitFor(/ready: /);
  return { p, url };
}

function ask(url: string): Promise<Response> {
  return fetch(`${url}/v1/messages`, {
    method: "POST",
    headers: { "content-type": "application/json" },
    body: JSON.stringify({ model: "m", max_tokens: 4, messages: [{ role: "user", content: "Hi" }] }),
  });
}

Deno.test({
  name: "link keys: a worker and a head with different keys refuse each other; the same key is served",
  sanitizeResources: false,
  sanitizeOps: false,
  async fn() {
    const dir = await Deno.makeTempDir({ prefix: "link_key_test_" });
    const procs: Proc[] = [];
    try {
      const model = `${dir}/tiny.gguf`;
      await synthesize(planModel({ arch: "qwen35moe", preset: "tiny", quant: "q8_0", seed: 1 }), {
        out: model,
      });
      const listener = Deno.listen({ hostname: "127.0.0.1", port: 0 });
      const port = (listener.addr as Deno.NetAddr).port;
      listener.close();
      const w = spawnMod([
        "worker",
        "--model",
        model,
        "--layers",
        "2:4",
        "--listen",
        `127.0.0.1:${port}`,
        "--slots",
        "1",
        "--ctx",
        "128",
        "--link-key",
        KEY_A,
      ]);
      procs.push(w);
      await w.waitFor(/listening|Listening/);
      // The worker built its pipelines before it listened, as the head does before "ready".
      const warm = w.log.findIndex((l) => /^GPU pipelines built in [\d.]+ s$/.test(l));
      const listening = w.log.findIndex((l) => /listening|Listening/.test(l));
      assert.ok(warm >= 0 && warm < listening, w.log.join("\n"));

      const wrong = await head(model, port, KEY_B);
      procs.push(wrong.p);
      const r = await ask(wrong.url);
      const body = await r.json();
      assert.equal(r.status, 503, JSON.stringify(body));
      assert.match(
        body.error.message,
        /split chain is down: .*refused the connection: Wrong link key: .* does not match this worker's key: give both the same --link-key/,
      );
      await w.waitFor(
        /wire: closing connection from peer 127\.0\.0\.1:\d+: Wrong link key: peer 127\.0\.0\.1:\d+'s proof does not match this worker's key/,
      );
      assert.equal((await (await fetch(`${wrong.url}/health`)).json()).status, "ok", "the head stays up");
      await wrong.p.kill();

      const right = await head(model, port, KEY_A);
      procs.push(right.p);
      const ok = await ask(right.url);
      assert.equal(ok.status, 200, JSON.stringify(await ok.clone().json()));
      assert.equal((await ok.json()).usage.output_tokens, 4);
    } finally {
      for (const p of procs) await p.kill();
      await Deno.remove(dir, { recursive: true });
    }
  },
});

Deno.test("link keys: the connector refuses an acceptor whose proof comes from another key, and says why", async () => {
  const workerHello = sampleHello();
  const listener = Deno.listen({ hostname: "127.0.0.1", port: 0 });
  const port = (listener.addr as Deno.NetAddr).port;
  // An acceptor that takes any proof (no check of its own) and proves with KEY_A.
  const acceptor = (async (): Promise<Frame | undefined> => {
    const conn = await listener.accept();
    const io = new FrameConn(conn, limitsOf(workerHello));
    try {
      const hello = await io.next("the connector");
      if (hello?.op !== "hello") throw new Error(`Expected a hello, got ${hello?.op}`);
      const ack: Frame = {
        op: "hello_ack",
        id: 0,
        hello: { auth: true, nonce: newNonce(), info: workerHello },
      };
      await io.write(ack);
      const auth = await io.next("the connector");
      assert.equal(auth?.op, "auth");
      const transcript = await transcriptHash(hello.hello.payload ?? payloadOf(hello), payloadOf(ack));
      const proof = await makeProof(await importLinkKey(KEY_A), "acceptor", transcript);
      await io.write({ op: "ready", id: 0, proof });
      return await io.next("the connector");
    } finally {
      io.close();
    }
  })();
  try {
    const e = await connectLink({ hostname: "127.0.0.1", port }, { hello: sampleHeadHello(), linkKey: KEY_B })
      .then((l) => l.close(), (e) => e);
    assert.ok(e instanceof WireError, `expected a refusal, got ${e}`);
    assert.equal(e.code, "auth");
    assert.match(
      e.message,
      /^Wrong link key: worker 127\.0\.0\.1:\d+'s proof does not match this side's key: give both the same --link-key$/,
    );
    const last = await acceptor;
    if (last?.op !== "close") {
      throw new Error(`The connector should send close with its reason, not ${last?.op}`);
    }
    assert.equal(last.reason.code, "auth");
    assert.match(last.reason.message, /Wrong link key/);
  } finally {
    listener.close();
  }
});
