/**
 * `mod.ts head`: the single-box HTTP server. Reads the tokenizer and chat template from the GGUF, starts the
 * engine service (model in a Worker; `/health` answers `loading` meanwhile), serves the Hono app on the
 * bounded HTTP/1.1 server (server/http1.ts: header and body timeouts, a connection cap), and on
 * SIGINT/SIGTERM answers new generation requests with 503, lets in-flight ones finish (cancelling them after a
 * grace period, or at once on a second signal), then stops listening and exits 0.
 * @module
 */
import type { Command } from "./command.ts";
import { parseArgs } from "node:util";
import {
  ChatTemplate,
  DEFAULT_BATCH_MIN,
  DEFAULT_MAX_CHUNK,
  DEFAULT_PIECE_GAP,
  DEFAULT_PIECE_STEPS,
  KEYS,
  openGguf,
  planModel,
  startEngine,
  synthesize,
  Tokenizer,
} from "../engine/mod.ts";
import { createApp, DEFAULT_BODY_LIMIT_BYTES } from "../server/app.ts";
import { HTTP1_DEFAULTS, serveHttp1 } from "../server/http1.ts";
import { Metrics } from "../server/metrics.ts";
import { parseCorsOrigins } from "../server/cors.ts";
import type { Engine } from "../engine/mod.ts";
import { parseAddress, readTlsFlags } from "../wire/mod.ts";
import { ChainLink, STAGE_LIMITS } from "../wire/chain.ts";
import { buildInfo } from "../version.ts";
import { parseLayers, parseLinkTimeout } from "./worker.ts";
import { progressMs } from "./generate.ts";
import { PrefillLog } from "../server/prefill_log.ts";
import { expertsConflict, int8ActivationsFlag, int8ExpertsFlag } from "./experts.ts";

const USAGE = `Usage: deno run -A mod.ts head [--model FILE.gguf] [options]
  --model F         GGUF (first part of a split set); default: a tiny synthetic qwen35moe
  --host H          listen address (default 127.0.0.1)
  --port N          listen port (default 8080; 0 picks a free one)
  --slots N         requests admitted at once (default 4)
  --ctx N           context positions per slot (default 8192)
  --queue N         requests that may wait for a slot before 503 (default 16)
  --api-key K       require this key (x-api-key or Authorization: Bearer); default: open
  --cors ORIGINS    allow browser clients from these origins (comma-separated, or *): OPTIONS preflight
                    and Access-Control-* headers; default: off (docs/SECURITY.md)
  --temp-default T  temperature when a request sends none (default 0: greedy)
  --temp-cap T      highest temperature a request gets (default 2)
  --body-limit N    request body limit in bytes (default ${DEFAULT_BODY_LIMIT_BYTES})
  --max-connections N  connections open at once; one more gets 503 (default ${HTTP1_DEFAULTS.maxConnections})
  --header-timeout S   seconds to receive a request's head; also the keep-alive idle limit (default ${
  HTTP1_DEFAULTS.headerTimeoutMs / 1000
})
  --body-timeout S     seconds to receive a request's body (default ${HTTP1_DEFAULTS.bodyTimeoutMs / 1000})
  --grace S         seconds in-flight requests may run after a shutdown signal (default 30)
  --chunk N         prompt tokens per prefill chunk (default ${DEFAULT_MAX_CHUNK}; memory grows with it)
  --batch-min N     fewest generating requests decoded together in one GPU step (default ${DEFAULT_BATCH_MIN}:
                    every one joins every step; fewer take turns of 64 ids; 0: never batch)
  --piece-steps N   decode steps per readback between a long prompt's pieces and while a newcomer waits
                    (1..8, default ${DEFAULT_PIECE_STEPS}): more lengthens the streams' gap and the prompt's
                    wait per piece; fewer costs the streams one readback per N steps
  --piece-gap F     while requests stream, a long prompt's pieces and the decode turn after each take about F
                    times the streams' steady gap (default ${DEFAULT_PIECE_GAP}; 1..64, or 0: fixed 256-token
                    pieces): larger gets the prompt its first token sooner and pauses the streams longer
  --no-piece-parts  run a long prompt's pieces whole while requests stream (default: chunk-wide pieces run a
                    few layers per round, the prompt's first token sooner for the same pause of the streams)
  --layers 0:a      split serving: run only layers 0:a here, the rest on the chain at --next
  --next H:P        the first worker of the chain (with --layers); connects lazily, reconnects with backoff
  --link-key K      shared key of the chain (or LLM_LINK_KEY)
  --tls-ca F        connect to --next over TLS, trusting this CA (PEM)
  --link-timeout S  seconds the chain may take to answer a frame before the link is dropped as stalled and
                    the requests on it end with an error (default 30; raise it on a slow or loaded box)
  --pipeline N      split serving: slot groups in flight at once, each a batched frame (0..8, default 2;
                    0: the generating requests take turns, one slot per frame; 1 where the stages share
                    one GPU, which then runs one group at a time anyway)
  --draft K         guess up to K ids per decode frame by prompt lookup (0..7, default 0: off); output is
                    the same with drafts on or off. Split serving: every frame carries them, the last stage
                    checks them. Unsplit: a lone generating request leaves the pipelined steps for frames of
                    its last id and the guesses where the guesses are long (--draft-min), while they hold
  --draft-min M     unsplit serving with --draft: fewest guesses that make a frame, and accepted ones that
                    keep frames going (1..K, default 4 or K)
  --draft-cache N   with --draft: also draft from the n-grams of earlier requests' prompts and outputs (N:
                    most 3-id n-grams kept, about 100 bytes each; default 0: off). Helps repeated or quoted
                    text; makes one request's speed depend on others' (a timing side channel)
  --no-warm-up      ready sooner: skip the load-time warm-up run, so the first requests of each prompt width
                    and slot count compile their GPU pipelines inside their time to first token
  --kv-f16          KV cache in f16: half the memory per position (K and V round to f16); every stage of a
                    split must agree
  --int8-experts    x rounded to int8 for the expert mat-vecs alone; the projections and the LM head keep f32
                    x. By default x is rounded to int8 before every quantized mat-vec (Q8_0, K-quants,
                    IQ4_XS), as llama.cpp's quantized mat-vecs do: on an H100 248, 882 and 1,088 tok/s at 1, 8
                    and 16 streams against 236, 846 and 1,025 with --int8-experts (docs/PERF.md). Batched
                    steps run each projection as one int8 mat-vec for all streams (matvec_q8b); prefill
                    rounds x alike, so a prompt's chunking moves only f32 rounding. Every stage of a split
                    must agree
  --f32-experts     f32 x everywhere: the exact path (the library's default); every stage of a split must
                    agree
  --int8            the default (int8 x for every mat-vec): a no-op, taken for old command lines
A prompt that prefills for more than a second logs its progress per slot, at most one line a second
(LLM_PROGRESS_MS sets both, in ms; default 1000).`;

/** Seconds between progress lines while loading on a non-terminal. */
const PROGRESS_EVERY_MS = 1000;

function int(flag: string, value: string, min: number): number {
  const n = Number(value);
  if (!Number.isInteger(n) || n < min) {
    throw new RangeError(`--${flag} ${value} must be an integer >= ${min}`);
  }
  return n;
}

function num(flag: string, value: string, min: number, max: number): number {
  const n = Number(value);
  if (!Number.isFinite(n) || n < min || n > max) {
    throw new RangeError(`--${flag} ${value} must be a number in [${min}, ${max}]`);
  }
  return n;
}

/** The embedded default model, written into a temporary folder removed at exit. */
async function defaultModel(): Promise<{ path: string; dir: string }> {
  const dir = await Deno.makeTempDir({ prefix: "llm_head_" });
  const path = `${dir}/tiny-qwen35moe.gguf`;
  await synthesize(planModel({ arch: "qwen35moe", preset: "tiny", quant: "q8_0", seed: 1 }), { out: path });
  console.error(`No --model given: serving the embedded default, a tiny synthetic qwen35moe (${path})`);
  return { path, dir };
}

/**
 * Logs load progress until the engine is ready or failed (a bar on a terminal, plain lines otherwise);
 * resolves to the final state, or undefined when stopped first.
 */
async function showProgress(engine: Engine, stop: AbortSignal): Promise<"ready" | "failed" | undefined> {
  const tty = Deno.stderr.isTerminal();
  const enc = new TextEncoder();
  let lastLine = 0;
  let lastText = "";
  while (!stop.aborted) {
    const st = engine.status();
    if (st.state !== "loading") {
      if (tty) Deno.stderr.writeSync(enc.encode("\n"));
      if (st.state === "failed") console.error(`Model ${st.model} failed to load: see the messages above`);
      else console.error(`Model ${st.model} (${st.arch}) ready: ${st.nSlots} slots of ${st.nCtx} positions`);
      return st.state;
    }
    const frac = st.totalBytes > 0 ? st.loadedBytes / st.totalBytes : 0;
    const mib = (b: number) => (b / 2 ** 20).toFixed(0);
    const text = `Loading ${st.model || "model"}: ${mib(st.loadedBytes)}/${mib(st.totalBytes)} MiB`;
    const pct = `${(frac * 100).toFixed(0)}%`;
    if (tty) {
      const bar = "#".repeat(Math.round(frac * 30)).padEnd(30, ".");
      Deno.stderr.writeSync(enc.encode(`\r[${bar}] ${pct.padStart(4)} ${text}`));
    } else if (performance.now() - lastLine >= PROGRESS_EVERY_MS && `${text} (${pct})` !== lastText) {
      // Only lines that say something new: once the weights are up the engine logs its pipeline warm-up.
      lastLine = performance.now();
      lastText = `${text} (${pct})`;
      if (st.totalBytes > 0) console.error(lastText);
    }
    await new Promise((r) => setTimeout(r, 200));
  }
  return undefined;
}

/** `--draft K`: drafts per decode frame, 0..7 (a drafted frame's rows fit the mat-vec's 8 columns). */
function draftFlag(value: string): number {
  const n = int("draft", value, 0);
  if (n > STAGE_LIMITS.maxDraft) {
    throw new RangeError(
      `--draft ${value} must be at most ${STAGE_LIMITS.maxDraft} (rows per frame: 1 + drafts <= 8)`,
    );
  }
  return n;
}

/**
 * `--draft K` (with `--draft-min M`, `--draft-cache N`) without `--next`: the unsplit engine's drafted frames
 * (EngineOptions.draft); undefined when off or when a split chain drafts (splitOptions reads the flags then).
 */
function unsplitDraft(
  v: { draft?: string; "draft-min"?: string; "draft-cache"?: string; next?: string },
): { k: number; min?: number; cache?: number } | undefined {
  if (v["draft-cache"] !== undefined && v.draft === undefined) {
    throw new RangeError(`--draft-cache ${v["draft-cache"]} feeds the drafts: give it with --draft`);
  }
  if (v["draft-min"] !== undefined && (v.draft === undefined || v.next !== undefined)) {
    throw new RangeError(
      `--draft-min ${
        v["draft-min"]
      } sets when the unsplit engine drafts: give it with --draft, without --next`,
    );
  }
  if (v.draft === undefined || v.next !== undefined) return undefined;
  const k = draftFlag(v.draft);
  if (k === 0) return undefined;
  const min = v["draft-min"] === undefined ? undefined : int("draft-min", v["draft-min"], 1);
  if (min !== undefined && min > k) throw new RangeError(`--draft-min ${min} must be at most --draft ${k}`);
  const cache = v["draft-cache"] === undefined ? 0 : int("draft-cache", v["draft-cache"], 0);
  return { k, ...(min !== undefined ? { min } : {}), ...(cache > 0 ? { cache } : {}) };
}

/** `--layers 0:a --next HOST:PORT` (both or neither): the head's range and its chain link. */
async function splitOptions(
  v: {
    layers?: string;
    next?: string;
    "link-key"?: string;
    "tls-ca"?: string;
    "link-timeout"?: string;
    draft?: string;
    "draft-cache"?: string;
    pipeline?: string;
  },
): Promise<{ layers: [number, number]; next: ChainLink; groups?: number; draftCache?: number } | undefined> {
  const draftCache = v["draft-cache"] === undefined ? undefined : int("draft-cache", v["draft-cache"], 0);
  if (v.pipeline !== undefined && v.next === undefined) {
    throw new RangeError(
      `--pipeline ${v.pipeline} groups the frames of a split chain: give it with --layers and --next`,
    );
  }
  const timeoutMs = parseLinkTimeout(v["link-timeout"]);
  if (timeoutMs !== undefined && v.next === undefined) {
    throw new RangeError(`--link-timeout bounds the wait for the chain: give it with --layers and --next`);
  }
  const groups = v.pipeline === undefined ? undefined : int("pipeline", v.pipeline, 0);
  if (groups !== undefined && groups > 8) throw new RangeError(`--pipeline ${v.pipeline} must be at most 8`);
  if ((v.layers === undefined) !== (v.next === undefined)) {
    throw new RangeError(
      `--layers and --next go together (split serving) but only ${
        v.layers ? "--layers" : "--next"
      } was given`,
    );
  }
  if (v.layers === undefined || v.next === undefined) return undefined;
  const layers = parseLayers(v.layers);
  if (layers[0] !== 0) throw new RangeError(`--layers ${v.layers}: the head runs the first range, 0:a`);
  const linkKey = v["link-key"] ?? Deno.env.get("LLM_LINK_KEY");
  if (linkKey === "") throw new RangeError("--link-key is empty: give a key or leave the flag out");
  const tls = await readTlsFlags({ tlsCa: v["tls-ca"] });
  return {
    layers,
    next: new ChainLink(parseAddress(v.next), {
      build: buildInfo(),
      linkKey,
      tls: tls.connect,
      timeoutMs,
      draft: v.draft === undefined ? 0 : draftFlag(v.draft),
    }),
    ...(groups !== undefined ? { groups } : {}),
    ...(draftCache ? { draftCache } : {}),
  };
}

/** `/health` of a split head: the app's answer plus `stages`, each stage of the chain and its state. */
async function withChainHealth(
  req: Request,
  res: Response | Promise<Response>,
  engine: { chain(): unknown },
): Promise<Response> {
  const r = await res;
  if (new URL(req.url).pathname !== "/health" || !r.headers.get("content-type")?.includes("json")) return r;
  const body = await r.json();
  const headers = new Headers(r.headers);
  headers.delete("content-length");
  return new Response(JSON.stringify({ ...body, stages: engine.chain() }), { status: r.status, headers });
}

/** The `head` command. */
export const command: Command = {
  usage: USAGE,
  summary:
    "HTTP server: Anthropic /v1/messages, OpenAI /v1/chat/completions, /completion (--model F --port N)",
  async run(argv: string[]): Promise<number> {
    const { values } = parseArgs({
      args: argv,
      options: {
        model: { type: "string" },
        host: { type: "string", default: "127.0.0.1" },
        port: { type: "string", default: "8080" },
        slots: { type: "string", default: "4" },
        ctx: { type: "string", default: "8192" },
        queue: { type: "string", default: "16" },
        "api-key": { type: "string" },
        cors: { type: "string" },
        "temp-default": { type: "string", default: "0" },
        "temp-cap": { type: "string", default: "2" },
        "body-limit": { type: "string", default: String(DEFAULT_BODY_LIMIT_BYTES) },
        "max-connections": { type: "string", default: String(HTTP1_DEFAULTS.maxConnections) },
        "header-timeout": { type: "string", default: String(HTTP1_DEFAULTS.headerTimeoutMs / 1000) },
        "body-timeout": { type: "string", default: String(HTTP1_DEFAULTS.bodyTimeoutMs / 1000) },
        grace: { type: "string", default: "30" },
        "batch-min": { type: "string", default: String(DEFAULT_BATCH_MIN) },
        "piece-steps": { type: "string", default: String(DEFAULT_PIECE_STEPS) },
        "piece-gap": { type: "string", default: String(DEFAULT_PIECE_GAP) },
        chunk: { type: "string", default: String(DEFAULT_MAX_CHUNK) },
        int8: { type: "boolean", default: false },
        "int8-experts": { type: "boolean", default: false },
        "f32-experts": { type: "boolean", default: false },
        "kv-f16": { type: "boolean", default: false },
        "no-warm-up": { type: "boolean", default: false },
        "no-piece-parts": { type: "boolean", default: false },
        layers: { type: "string" },
        next: { type: "string" },
        "link-key": { type: "string" },
        "tls-ca": { type: "string" },
        "link-timeout": { type: "string" },
        draft: { type: "string" },
        "draft-min": { type: "string" },
        pipeline: { type: "string" },
        "draft-cache": { type: "string" },
        debug: { type: "boolean", default: false },
        help: { type: "boolean", default: false },
      },
      strict: true,
    });
    if (values.help) {
      console.log(USAGE);
      return 0;
    }
    const conflict = expertsConflict(values);
    if (conflict !== undefined) {
      console.error(`error: ${conflict}`);
      return 2;
    }
    const port = int("port", values.port, 0);
    const nSlots = int("slots", values.slots, 1);
    const nCtx = int("ctx", values.ctx, 2);
    const queueSize = int("queue", values.queue, 0);
    const tempCap = num("temp-cap", values["temp-cap"], 0, 2);
    const tempDefault = num("temp-default", values["temp-default"], 0, 2);
    const bodyLimitBytes = int("body-limit", values["body-limit"], 1024);
    const graceMs = num("grace", values.grace, 0, 86400) * 1000;
    const maxConnections = int("max-connections", values["max-connections"], 1);
    const headerTimeoutMs = num("header-timeout", values["header-timeout"], 0.1, 3600) * 1000;
    const bodyTimeoutMs = num("body-timeout", values["body-timeout"], 0.1, 3600) * 1000;
    const batchMin = int("batch-min", values["batch-min"], 0);
    const maxChunk = int("chunk", values.chunk, 1);
    if (maxChunk > 4096) throw new RangeError(`--chunk must be 1..4096, got ${maxChunk}`);
    if (batchMin === 1 || batchMin > 16) {
      throw new RangeError(`--batch-min must be 0 or 2..16, got ${batchMin}`);
    }
    const pieceSteps = int("piece-steps", values["piece-steps"], 1);
    if (pieceSteps > 8) {
      throw new RangeError(`--piece-steps ${pieceSteps} must be at most 8 (the decode steps per readback)`);
    }
    const pieceGap = num("piece-gap", values["piece-gap"], 0, 64);
    if (pieceGap > 0 && pieceGap < 1) {
      throw new RangeError(
        `--piece-gap ${pieceGap} must be 0 (fixed pieces) or 1..64 (steady gaps per round)`,
      );
    }
    if (values["api-key"] === "") {
      throw new RangeError("--api-key is empty: give a key or leave the flag out");
    }

    const corsOrigins = values.cors === undefined ? undefined : parseCorsOrigins(values.cors);
    const everyMs = progressMs(Deno.env.get("LLM_PROGRESS_MS"));

    const synth = values.model === undefined ? await defaultModel() : undefined;
    // The default model's temporary folder goes on every exit path (a busy port, a bad flag, a failed load).
    try {
      const path = values.model ?? synth!.path;
      let tokenizer: Tokenizer, template: ChatTemplate;
      {
        using file = await openGguf(path);
        if (!file.metadata.has(KEYS.tokTokens)) {
          throw new RangeError(`${path} has no ${KEYS.tokTokens}: the head needs the model's tokenizer`);
        }
        tokenizer = Tokenizer.fromGguf(file.metadata);
        template = ChatTemplate.fromGguf(file.metadata);
      }
      console.error(`Chat template: ${template.origin} (${template.kind})`);

      const draft = unsplitDraft(values);
      const split = await splitOptions(values);
      const engine = startEngine({
        split,
        ...(draft ? { draft } : {}),
        model: path,
        nCtx,
        nSlots,
        queueSize,
        batchMin,
        pieceSteps,
        pieceGap,
        pieceParts: !values["no-piece-parts"],
        maxChunk,
        int8Activations: int8ActivationsFlag(values),
        int8Experts: int8ExpertsFlag(values),
        kvF16: values["kv-f16"],
        warmUp: !values["no-warm-up"],
      });
      let draining = false;
      const metrics = new Metrics();
      const app = createApp({
        metrics,
        engine,
        tokenizer,
        template,
        apiKey: values["api-key"],
        tempDefault,
        tempCap,
        bodyLimitBytes,
        draining: () => draining,
        corsOrigins,
        requestLog: (line) => console.error(line),
      });
      let server;
      try {
        server = serveHttp1({
          hostname: values.host,
          port,
          maxConnections,
          headerTimeoutMs,
          bodyTimeoutMs,
          onListen: ({ hostname, port }) => console.error(`Listening on http://${hostname}:${port}`),
          onEvent: (e) => metrics.connection(e),
        }, (req) => split ? withChainHealth(req, app.fetch(req), engine) : app.fetch(req));
      } catch (e) {
        await engine.close({ cancel: true });
        if (e instanceof Deno.errors.AddrInUse) {
          throw new Error(
            `Port ${port} on ${values.host} is already in use (another server?): stop it, or pick another ` +
              `--port (0 picks a free one)`,
            { cause: e },
          );
        }
        throw e;
      }
      const stopProgress = new AbortController();
      const loaded = showProgress(engine, stopProgress.signal);
      // Long prefills' progress from the engine's per-slot view, polled a few times per interval.
      const prefillLog = new PrefillLog(everyMs);
      const prefillPoll = setInterval(() => {
        const st = engine.status();
        if (st.state !== "ready") return;
        for (const line of prefillLog.update(st.slots ?? [], performance.now())) console.error(line);
      }, Math.min(250, Math.max(10, everyMs / 4)));

      let cancelTimer: ReturnType<typeof setTimeout> | undefined;
      const signals: Deno.Signal[] = Deno.build.os === "windows" ? ["SIGINT"] : ["SIGINT", "SIGTERM"];
      /** Stops listening once no request is being answered (new generations get 503 meanwhile). */
      const closeWhenIdle = async () => {
        while (server.activeRequests > 0) await new Promise((r) => setTimeout(r, 50));
        await server.shutdown();
      };
      const onSignal = () => {
        if (draining) {
          console.error("Second signal: cancelling in-flight requests");
          void engine.close({ cancel: true, exiting: true });
          return;
        }
        draining = true;
        const st = engine.status();
        console.error(
          `Shutting down: new requests get 503; ${st.busySlots} running and ${st.queued} queued may finish ` +
            `within ${graceMs / 1000} s`,
        );
        cancelTimer = setTimeout(() => {
          console.error("Grace period over: cancelling in-flight requests");
          void engine.close({ cancel: true, exiting: true });
        }, graceMs);
        void closeWhenIdle();
      };
      for (const s of signals) Deno.addSignalListener(s, onSignal);
      let failed = false;
      void loaded.then((state) => {
        if (state !== "failed") return;
        // A head that cannot generate should not linger: stop serving and report failure.
        failed = true;
        draining = true;
        void server.shutdown();
      });
      try {
        await server.finished;
        await engine.close({ exiting: true });
      } finally {
        stopProgress.abort();
        clearInterval(prefillPoll);
        await loaded;
        clearTimeout(cancelTimer);
        for (const s of signals) Deno.removeSignalListener(s, onSignal);
      }
      if (failed) {
        console.error("Stopped: the model failed to load");
        return 1;
      }
      console.error("Stopped");
      return 0;
    } finally {
      if (synth !== undefined) await Deno.remove(synth.dir, { recursive: true });
    }
  },
};
