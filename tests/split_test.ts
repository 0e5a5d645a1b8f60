/**
 * Split serving end to end, real processes on loopback: heads and workers of `mod.ts` on the tiny synthetic
 * models of both architectures. A 2-stage and a 3-stage chain answer exactly what the unsplit head answers
 * (greedy and seeded sampling with penalties, text and usage; the 2-stage head also with `--draft 3`); the worker refuses hellos that cannot chain (context, layer range) and a wrong
 * link key, each with its own message; a worker SIGKILLed mid-stream ends the stream with an error event,
 * the head stays up and answers 503 while the chain is down, and serves again once the worker is back.
 * @module
 */
import assert from "node:assert/strict";
import { connectLink, type HelloInfo, type LinkAddress, WireError } from "../wire/mod.ts";
import { helloOf } from "../wire/chain.ts";
import { fingerprintFile, planModel, synthesize } from "../engine/mod.ts";
import { freePort, type Proc, spawnMod } from "./util/procs.ts";

const CTX = 256;

/**
 * A `mod.ts` child: its stderr lines waited for within 180 s. Up to seven processes build their pipelines at
 * once here; on a 2-core CI machine with other test files running beside them, a head's warm-up once took
 * over 60 s before its `ready:` line.
 */
const spawn = (args: string[]): Proc => spawnMod(args, 180_000);

function worker(model: string, layers: string, port: number, next?: number, extra: string[] = []): Proc {
  return spawn([
    "worker",
    "--model",
    model,
    "--layers",
    layers,
    "--listen",
    `127.0.0.1:${port}`,
    "--slots",
    "2",
    "--ctx",
    String(CTX),
    ...(next ? ["--next", `127.0.0.1:${next}`] : []),
    ...extra,
  ]);
}

async function head(
  model: string,
  split?: { layers: string; next: number; draft?: number; linkTimeout?: number },
): Promise<{ p: Proc; url: string }> {
  const p = spawn([
    "head",
    "--model",
    model,
    "--port",
    "0",
    "--slots",
    "2",
    "--ctx",
    String(CTX),
    // The answers do not depend on it, and a split head's warm-up through the chain runs in
    // dashboard_split_test and split_metrics_test: 42 s less CPU here on lavapipe (docs/PERF.md).
    "--no-warm-up",
    ...(split ? ["--layers", split.layers, "--next", `127.0.0.1:${split.next}`] : []),
    ...(split?.draft ? ["--draft", String(split.draft)] : []),
    ...(split?.linkTimeout ? ["--link-timeout", String(split.linkTimeout)] : []),
  ]);
  const m = await p.waitFor(/Listening on (http:\/\/\S+)/);
  await p.waitFor(/ready: /);
  return { p, url: m[1]! };
}

const PROMPTS = ["Hello", "Tell me a story about a fox"];
/** The stall drill's --link-timeout: seconds, far above a tiny model's frame even on a loaded CI machine. */
const STALL_S = 12;

async function ask(url: string, content: string, opts: { stream?: boolean; maxTokens?: number } = {}) {
  return await fetch(`${url}/v1/messages`, {
    method: "POST",
    headers: { "content-type": "application/json" },
    body: JSON.stringify({
      model: "m",
      max_tokens: opts.maxTokens ?? 12,
      stream: opts.stream ?? false,
      messages: [{ role: "user", content }],
    }),
  });
}

/** Text and usage of a non-streamed answer (asserting 200). */
async function answer(url: string, content: string): Promise<unknown> {
  const r = await ask(url, content);
  const body = await r.json();
  assert.equal(r.status, 200, JSON.stringify(body));
  return { content: body.content, usage: body.usage, stop: body.stop_reason };
}

/** A seeded, sampled chat completion (temperature, top-p, a repeat penalty): its text and usage. */
async function sampled(url: string, content: string): Promise<unknown> {
  const r = await fetch(`${url}/v1/chat/completions`, {
    method: "POST",
    headers: { "content-type": "application/json" },
    body: JSON.stringify({
      model: "m",
      max_tokens: 12,
      temperature: 0.9,
      top_p: 0.95,
      frequency_penalty: 0.3,
      seed: 4242,
      messages: [{ role: "user", content }],
    }),
  });
  const body = await r.json();
  assert.equal(r.status, 200, JSON.stringify(body));
  return { text: body.choices[0].message.content, usage: body.usage, finish: body.choices[0].finish_reason };
}

async function synthModel(dir: string, arch: "qwen35moe" | "qwen3next", seed: number): Promise<string> {
  const out = `${dir}/${arch}.gguf`;
  await synthesize(planModel({ arch, preset: "tiny", quant: "q8_0", seed }), { out });
  return out;
}

for (const [arch, seed] of [["qwen35moe", 1], ["qwen3next", 2]] as const) {
  Deno.test(`split ${arch}: ${arch === "qwen35moe" ? "2 and " : ""}3 stages answer exactly as the unsplit head (greedy, text and usage)`, async () => {
    const dir = await Deno.makeTempDir({ prefix: "split_test_" });
    const procs: Proc[] = [];
    try {
      const model = await synthModel(dir, arch, seed);
      const [p24, p13, p34] = [freePort(), freePort(), freePort()];
      // The link, the chain and the drafts are the same code for both architectures (forward_test splits
      // every layer boundary of both): qwen3next runs the 3-stage chain only, qwen35moe every variant.
      const full = arch === "qwen35moe";
      const w24 = full ? worker(model, "2:4", p24) : undefined;
      const w34 = worker(model, "3:4", p34);
      procs.push(...w24 ? [w24] : [], w34);
      await w34.waitFor(/Listening on/);
      const w13 = worker(model, "1:3", p13, p34);
      procs.push(w13);
      const [u, h3, h2, h2d] = await Promise.all([
        head(model),
        // A stalled stage is dropped after --link-timeout (the drill below).
        w13.waitFor(/Listening on/).then(() =>
          head(model, { layers: "0:1", next: p13, linkTimeout: STALL_S })
        ),
        w24?.waitFor(/Listening on/).then(() => head(model, { layers: "0:2", next: p24 })),
        w24?.waitFor(/Listening on/).then(() => head(model, { layers: "0:2", next: p24, draft: 3 })),
      ]);
      procs.push(...[u, h3, h2, h2d].flatMap((h) => h ? [h.p] : []));
      const heads = [
        { what: "3 stages", url: h3.url },
        ...h2 && h2d
          ? [{ what: "2 stages", url: h2.url }, { what: "2 stages with --draft 3", url: h2d.url }]
          : [],
      ];
      for (const prompt of PROMPTS) {
        const want = await answer(u.url, prompt);
        const wantSampled = await sampled(u.url, prompt);
        for (const { what, url } of heads) {
          assert.deepEqual(await answer(url, prompt), want, `${what}, prompt ${prompt}`);
          assert.deepEqual(await sampled(url, prompt), wantSampled, `${what} sampled, prompt ${prompt}`);
        }
      }
      const health = await (await fetch(`${h3.url}/health`)).json();
      assert.deepEqual(
        health.stages.map((s: { layers: unknown; state: string }) => [s.layers, s.state]),
        [[{ first: 1, end: 3, total: 4 }, "up"], [{ first: 3, end: 4, total: 4 }, "up"]],
      );
      if (!w24 || !h2) {
        // qwen3next: a stalled middle worker (SIGSTOP: its socket stays open, nothing answers) is treated as a
        // dead one once --link-timeout passes: the request gets an error naming the stall, the head stays up;
        // after SIGCONT the head reconnects and the chain serves the same answer again.
        const want = await answer(u.url, PROMPTS[0]!);
        w13.signal("SIGSTOP");
        try {
          const r = await ask(h3.url, PROMPTS[0]!);
          const body = await r.json();
          assert.ok(r.status === 502 || r.status === 503, `${r.status} ${JSON.stringify(body)}`);
          // The reply wait of --link-timeout closed the link (the head's log), and the stage counts as down
          // at once (a backoff step, not a reconnect into the stalled peer's handshake timeout).
          const stalled = `did not answer .* within ${STALL_S * 1000} ms: the stage stalled`;
          assert.match(body.error.message, new RegExp(`split chain is down: .* is down \\(.*${stalled}`));
          await h3.p.waitFor(new RegExp(stalled));
          assert.equal((await fetch(`${h3.url}/health`)).status, 200);
        } finally {
          w13.signal("SIGCONT");
        }
        let back: unknown;
        for (let i = 0; i < 80; i++) {
          if (i > 0) await new Promise((r) => setTimeout(r, 250));
          const r = await ask(h3.url, PROMPTS[0]!);
          const body = await r.json();
          if (r.status !== 200) continue;
          back = { content: body.content, usage: body.usage, stop: body.stop_reason };
          break;
        }
        assert.deepEqual(back, want);
        return;
      }

      // Refusals at hello, straight at the worker (the head's link runs the same checks and says the same).
      // The build as the worker read it (a commit landing meanwhile must not fail the test).
      const built = await w24.waitFor(/build (\S+) commit (\S+)\)/);
      // int8 x for every mat-vec: the worker runs the commands' default, as the heads above do.
      const hello = helloOf({
        arch,
        layers: { first: 0, end: 2, total: 4 },
        nEmbd: 256,
        nSlots: 2,
        nCtx: CTX,
        int8Activations: true,
        int8Experts: true,
        kvF16: false,
        fingerprint: await fingerprintFile(model),
      }, { build: { version: built[1]!, commit: built[2]! }, last: false });
      const at: LinkAddress = { hostname: "127.0.0.1", port: p24 };
      const refused = async (h: HelloInfo, re: RegExp, linkKey?: string) => {
        const e = await connectLink(at, { hello: h, linkKey }).then((l) => l.close(), (e) => e);
        assert.ok(e instanceof WireError, `expected a refusal matching ${re}, got ${e}`);
        assert.match(e.message, re);
      };
      const ok = await connectLink(at, { hello });
      await ok.close();
      await refused({ ...hello, nCtx: CTX * 2 }, /Context too small: .* has --ctx 256 but .* has --ctx 512/);
      await refused(
        { ...hello, layers: { first: 0, end: 1, total: 4 } },
        /Layer ranges do not chain: .* ends at layer 1 but .* starts at layer 2/,
      );
      await refused(hello, /link key/i, "0123456789abcdef0123456789abcdef");
      // A head started with --f32-experts (f32 x everywhere) against a worker started without flags.
      await refused(
        { ...hello, numerics: { ...hello.numerics, int8Activations: false, int8Experts: false } },
        /int8 activations differ: .* runs f32 x everywhere \(--f32-experts\) but .* runs int8 x for every mat-vec \(the default\): start every stage with the same one of/,
      );

      // SIGKILL of the worker mid-stream, two streams generating together (one pipelined generate call):
      // an error event on each, the head stays up, 503 while down, then back.
      const want = await answer(u.url, PROMPTS[0]!);
      // (The second prompt is neither of PROMPTS: its prefix snapshot must not serve the request after it.)
      const readers = await Promise.all([PROMPTS[1]!, "Name three rivers"].map(async (prompt) => {
        const r = await ask(h2.url, prompt, { stream: true, maxTokens: CTX - 40 });
        assert.equal(r.status, 200);
        return r.body!.pipeThrough(new TextDecoderStream()).getReader();
      }));
      const texts = ["", ""];
      for (const [i, reader] of readers.entries()) {
        while (!texts[i]!.includes("content_block_delta")) texts[i] += (await reader.read()).value ?? "";
      }
      await w24.kill("SIGKILL");
      for (const [i, reader] of readers.entries()) {
        for (let c = await reader.read(); !c.done; c = await reader.read()) texts[i] += c.value;
        assert.match(texts[i]!, /event: error\ndata: .*split chain is down/, `stream ${i}`);
        assert.doesNotMatch(texts[i]!, /message_stop/, `stream ${i}`);
      }
      const down = await ask(h2.url, PROMPTS[0]!);
      const downBody = await down.json();
      assert.equal(down.status, 503, JSON.stringify(downBody));
      assert.ok(down.headers.get("retry-after"));
      assert.match(downBody.error.message, /split chain is down/);
      assert.equal((await fetch(`${h2.url}/health`)).status, 200);
      const w24b = worker(model, "2:4", p24);
      procs.push(w24b);
      await w24b.waitFor(/Listening on/);
      let status = 0;
      let backBody: { content?: unknown; usage?: unknown; stop_reason?: unknown; error?: unknown } = {};
      for (let i = 0; i < 80 && status !== 200; i++) {
        if (i > 0) await new Promise((r) => setTimeout(r, 250));
        const back = await ask(h2.url, PROMPTS[0]!);
        status = back.status;
        backBody = await back.json();
      }
      assert.equal(status, 200, JSON.stringify(backBody));
      assert.deepEqual(
        { content: backBody.content, usage: backBody.usage, stop: backBody.stop_reason },
        want,
      );
    } finally {
      await Promise.all(procs.map((p) => p.kill()));
      await Deno.remove(dir, { recursive: true });
    }
  });
}
