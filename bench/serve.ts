/**
 * Benchmark: time to first token and tok/s through HTTP for 1, 4 and 8 concurrent streams against a `head`
 * process on loopback, beside the engine-level tok/s of the same model in the same run (the HTTP and
 * scheduling overhead is the difference).
 *
 * Usage: `deno run -A bench/serve.ts [--model F.gguf] [--n 128] [--levels 1,4,8] [--prompt 64] [--port 8099]
 * [--head-flags="--cached-only --config C.json"]` (`--head-flags`, with `=` since its value starts with a dash: extra `deno run` flags for the head
 * process, e.g. on a machine without network).
 * Without `--model` the head serves its embedded tiny model. Prints one JSON line per measurement; never asserts.
 * @module
 */
import { parseArgs } from "node:util";
import { acquireGpu } from "../engine/gpu/device.ts";
import { openGguf } from "../engine/gguf.ts";
import { Stage } from "../engine/mod.ts";

const { values: args } = parseArgs({
  options: {
    model: { type: "string" },
    n: { type: "string", default: "128" },
    levels: { type: "string", default: "1,4,8" },
    prompt: { type: "string", default: "64" },
    port: { type: "string", default: "8099" },
    ctx: { type: "string", default: "2048" },
    "head-flags": { type: "string", default: "" },
  },
});
const nNew = Number(args.n);
const levels = args.levels!.split(",").map(Number);
const nPrompt = Number(args.prompt);
const base = `http://127.0.0.1:${args.port}`;
const maxLevel = Math.max(...levels);

function emit(what: string, result: Record<string, unknown>): void {
  console.log(JSON.stringify({ bench: "serve", what, ...result }));
}

const head = new Deno.Command(Deno.execPath(), {
  args: [
    "run",
    "-A",
    ...args["head-flags"]!.split(" ").filter((f) => f !== ""),
    new URL("../mod.ts", import.meta.url).pathname,
    "head",
    "--port",
    args.port!,
    "--slots",
    String(maxLevel),
    "--ctx",
    args.ctx!,
    ...(args.model ? ["--model", args.model] : []),
  ],
  stdout: "null",
  stderr: "piped",
}).spawn();
// The head's log names the model file it serves (its embedded default is written to a temp folder).
let log = "";
const logDone = (async () => {
  for await (const chunk of head.stderr.pipeThrough(new TextDecoderStream())) log += chunk;
})();

async function waitReady(): Promise<void> {
  for (let i = 0; i < 600; i++) {
    try {
      const r = await fetch(`${base}/health`);
      const j = await r.json();
      if (j.status === "ok") return;
    } catch {
      // Not listening yet: retry below.
    }
    await new Promise((r) => setTimeout(r, 500));
  }
  throw new Error(`The head did not become ready: ${log.slice(-2000)}`);
}

/** One streamed /completion request: time to first content frame, tokens, total time. */
async function stream(prompt: number[]): Promise<{ ttftMs: number; tokens: number; ms: number }> {
  const t0 = performance.now();
  const r = await fetch(`${base}/completion`, {
    method: "POST",
    headers: { "content-type": "application/json" },
    body: JSON.stringify({ prompt, n_predict: nNew, stream: true, temperature: 0, return_tokens: true }),
  });
  if (!r.ok || !r.body) throw new Error(`HTTP ${r.status}: ${await r.text()}`);
  let ttft = -1;
  let tokens = 0;
  let buf = "";
  for await (const chunk of r.body.pipeThrough(new TextDecoderStream())) {
    buf += chunk;
    let at;
    while ((at = buf.indexOf("\n\n")) >= 0) {
      const frame = buf.slice(0, at);
      buf = buf.slice(at + 2);
      const data = frame.split("\n").find((l) => l.startsWith("data: "));
      if (!data || data === "data: [DONE]") continue;
      const j = JSON.parse(data.slice(6));
      const got = Array.isArray(j.tokens) ? j.tokens.length : 0;
      if (got > 0 && ttft < 0) ttft = performance.now() - t0;
      tokens += got;
    }
  }
  return { ttftMs: ttft, tokens, ms: performance.now() - t0 };
}

try {
  await waitReady();
  const prompt = (i: number) =>
    Array.from({ length: nPrompt }, (_, j) => 1 + ((i * 7919 + j * 104729) % 900));
  await stream(prompt(999));
  for (const level of levels) {
    const t0 = performance.now();
    const rs = await Promise.all(Array.from({ length: level }, (_, i) => stream(prompt(i))));
    const wall = (performance.now() - t0) / 1000;
    const tokens = rs.reduce((a, r) => a + r.tokens, 0);
    const ttft = rs.map((r) => r.ttftMs).sort((a, b) => a - b);
    emit("http", {
      streams: level,
      newTokensPerStream: nNew,
      tokPerSecond: tokens / wall,
      tokPerSecondPerStream: tokens / wall / level,
      ttftMsMedian: ttft[Math.floor(ttft.length / 2)],
      ttftMsMax: ttft.at(-1),
    });
  }
} finally {
  head.kill("SIGTERM");
  await head.status;
  await logDone;
}

// Engine level, same model and lengths, no HTTP: one stream through Stage.generate.
const path = args.model ?? /\(([^)]+\.gguf)\)/.exec(log)?.[1] ?? /(\/\S+\.gguf)/.exec(log)?.[1];
if (path && await Deno.stat(path).then(() => true, () => false)) {
  const gpu = await acquireGpu();
  using file = await openGguf(path);
  const stage = await Stage.load(gpu, file, { nCtx: Number(args.ctx), nSlots: 1 });
  const p = Array.from({ length: nPrompt }, (_, j) => 1 + ((j * 104729) % 900));
  await stage.generate(0, p, { nNew: 16 });
  let tFirst = 0;
  const g = await stage.generate(0, p, {
    nNew,
    onTokens: () => {
      if (tFirst === 0) tFirst = performance.now();
    },
  });
  const tokPerSecond = (g.tokens.length - 1) / ((performance.now() - tFirst) / 1000);
  emit("engine", { streams: 1, newTokens: g.tokens.length, tokPerSecond, adapter: gpu.summary });
  stage.destroy();
} else {
  emit("engine", { skipped: "the served model file was not found after the head exited (temporary file)" });
}
