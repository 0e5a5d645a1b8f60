/**
 * `mod.ts demo [--stages N]`: split serving in one command. Writes the embedded tiny model (synthetic
 * qwen35moe), starts an unsplit head and a split one (head plus N-1 worker processes on loopback), sends the
 * same requests through both APIs to each, and prints whether the answers are identical and the tok/s of each.
 * @module
 */
import type { Command } from "./command.ts";
import { parseArgs } from "node:util";
import { planModel, synthesize } from "../engine/mod.ts";

const USAGE = `Usage: deno run -A mod.ts demo [--stages N]
  --stages N   stages of the split chain, 2..4 (default 2): the head plus N-1 workers`;

const MOD = new URL("../mod.ts", import.meta.url);
const N_LAYER = 4;
const REQUESTS: readonly { path: string; body: Record<string, unknown> }[] = [
  { path: "/v1/messages", body: { max_tokens: 24, messages: [{ role: "user", content: "Hello" }] } },
  {
    path: "/v1/chat/completions",
    body: { max_tokens: 24, messages: [{ role: "user", content: "Tell me about foxes" }] },
  },
  { path: "/v1/messages", body: { max_tokens: 24, messages: [{ role: "user", content: "What is 2 + 2?" }] } },
];

interface Child {
  readonly proc: Deno.ChildProcess;
  readonly line: (re: RegExp) => Promise<RegExpMatchArray>;
}

function start(args: string[], label: string): Child {
  const proc = new Deno.Command(Deno.execPath(), {
    args: ["run", "-A", MOD.href, ...args],
    stdout: "null",
    stderr: "piped",
  }).spawn();
  const lines: string[] = [];
  const waiters: { re: RegExp; resolve: (m: RegExpMatchArray) => void }[] = [];
  void (async () => {
    let buf = "";
    for await (const chunk of proc.stderr.pipeThrough(new TextDecoderStream())) {
      buf += chunk;
      for (let i = buf.indexOf("\n"); i >= 0; i = buf.indexOf("\n")) {
        const l = buf.slice(0, i);
        buf = buf.slice(i + 1);
        lines.push(l);
        console.error(`  [${label}] ${l}`);
        for (const w of [...waiters]) {
          const m = l.match(w.re);
          if (m) {
            waiters.splice(waiters.indexOf(w), 1);
            w.resolve(m);
          }
        }
      }
    }
  })();
  return {
    proc,
    line: (re) => {
      const hit = lines.map((l) => l.match(re)).find((m) => m);
      return hit ? Promise.resolve(hit) : new Promise((resolve) => waiters.push({ re, resolve }));
    },
  };
}

function freePort(): number {
  const l = Deno.listen({ hostname: "127.0.0.1", port: 0 });
  const port = (l.addr as Deno.NetAddr).port;
  l.close();
  return port;
}

async function serveHead(model: string, label: string, split?: string[]): Promise<{ c: Child; url: string }> {
  const c = start(
    ["head", "--model", model, "--port", "0", "--slots", "1", "--ctx", "512", ...(split ?? [])],
    label,
  );
  const m = await c.line(/Listening on (http:\/\/\S+)/);
  await c.line(/ready: /);
  return { c, url: m[1]! };
}

/** Sends every request; returns the texts and the generated tokens per second (wall time). */
async function run(url: string): Promise<{ texts: string[]; tokS: number }> {
  const texts: string[] = [];
  let tokens = 0;
  const t0 = performance.now();
  for (const r of REQUESTS) {
    const res = await fetch(url + r.path, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify({ model: "m", temperature: 0, ...r.body }),
    });
    const j = await res.json();
    if (res.status !== 200) throw new Error(`${url}${r.path} answered ${res.status}: ${JSON.stringify(j)}`);
    texts.push(JSON.stringify(j.content ?? j.choices?.[0]?.message?.content));
    tokens += j.usage?.output_tokens ?? j.usage?.completion_tokens ?? 0;
  }
  return { texts, tokS: tokens / ((performance.now() - t0) / 1000) };
}

/** The `demo` command. */
export const command: Command = {
  usage: USAGE,
  summary: "Split serving on loopback: tiny model, head + workers vs unsplit, identical tokens, tok/s",
  async run(argv: string[]): Promise<number> {
    const { values } = parseArgs({ args: argv, options: { stages: { type: "string", default: "2" } } });
    const stages = Number(values.stages);
    if (!Number.isInteger(stages) || stages < 2 || stages > N_LAYER) {
      throw new RangeError(
        `--stages ${values.stages} must be an integer in 2..${N_LAYER} (the tiny model has ${N_LAYER} layers)`,
      );
    }
    const dir = await Deno.makeTempDir({ prefix: "llm_demo_" });
    const children: Child[] = [];
    try {
      const model = `${dir}/tiny-qwen35moe.gguf`;
      await synthesize(planModel({ arch: "qwen35moe", preset: "tiny", quant: "q8_0", seed: 1 }), {
        out: model,
      });
      // Layer boundaries as even as 4 layers allow: stage i runs [cuts[i], cuts[i+1]).
      const cuts = Array.from({ length: stages + 1 }, (_, i) => Math.round((i * N_LAYER) / stages));
      const ports = cuts.slice(1, -1).map(() => freePort());
      // Workers from the last stage back, so that each middle one finds its next.
      for (let s = stages - 1; s >= 1; s--) {
        const w = start([
          "worker",
          "--model",
          model,
          "--layers",
          `${cuts[s]}:${cuts[s + 1]}`,
          "--listen",
          `127.0.0.1:${ports[s - 1]}`,
          "--slots",
          "1",
          "--ctx",
          "512",
          ...(s < stages - 1 ? ["--next", `127.0.0.1:${ports[s]}`] : []),
        ], `worker ${cuts[s]}:${cuts[s + 1]}`);
        children.push(w);
        await w.line(/Listening on/);
      }
      const [whole, split] = await Promise.all([
        serveHead(model, "unsplit head"),
        serveHead(model, `head 0:${cuts[1]}`, [
          "--layers",
          `0:${cuts[1]}`,
          "--next",
          `127.0.0.1:${ports[0]}`,
        ]),
      ]);
      children.push(whole.c, split.c);
      const a = await run(whole.url);
      const b = await run(split.url);
      const same = a.texts.every((t, i) => t === b.texts[i]);
      console.log(
        `\nSplit serving demo: tiny qwen35moe, ${stages} stages (layers ${
          cuts.slice(0, -1).map((c, i) => `${c}:${cuts[i + 1]}`).join(" → ")
        })`,
      );
      for (const [i, r] of REQUESTS.entries()) {
        console.log(
          `  ${r.path.padEnd(22)} ${a.texts[i] === b.texts[i] ? "identical" : "DIFFERENT"}: ${
            b.texts[i]!.slice(0, 60)
          }`,
        );
      }
      console.log(
        `  unsplit ${a.tokS.toFixed(1)} tok/s, split ${
          b.tokS.toFixed(1)
        } tok/s (loopback, this machine's GPU)`,
      );
      console.log(same ? "  Tokens identical." : "  Tokens DIFFER: this is a bug, please report it.");
      return same ? 0 : 1;
    } finally {
      for (const c of children.reverse()) {
        try {
          c.proc.kill("SIGTERM");
        } catch { /* exited */ }
        await c.proc.status;
      }
      await Deno.remove(dir, { recursive: true });
    }
  },
};
