/**
 * Benchmark: serving throughput for 1, 2, 4, 8 and 16 parallel streams, over HTTP against a `head` process on
 * loopback and directly through the engine service in this process (`startEngine`: the Worker and the
 * scheduler without HTTP), beside the engine-level single-stream tok/s of the same model (`Stage.generate`).
 * HTTP minus direct is the HTTP path's cost; direct minus `bench/decode.ts --slots` is the scheduler's.
 *
 * Usage: `deno run -A bench/serve.ts [--model F.gguf] [--n 128] [--levels 1,2,4,8,16] [--prompt 64] [--port 8099]
 * [--ctx 2048] [--modes http,direct] [--batch-min N] [--prefill-turn N] [--batch N] [--piece-steps N] [--piece-gap F] [--late 2048]
 * [--head-flags="--cached-only --config C.json"] [--temp 0] [--int8-experts | --f32-experts] [--solo 5]`
 * - `--int8-experts` (int8 x for the expert passes alone) or `--f32-experts` (f32 x everywhere) in the head, the
 *   direct engine and the engine lines (default: int8 x for every mat-vec, the head's default; every line says
 *   which in `int8Activations` and `int8Experts`).
 * - `--temp T` (default 0, greedy): every stream samples at temperature T (top-k 40, top-p 0.95, min-p 0.05,
 *   seed 1) over HTTP, directly and in the engine lines, so the GPU sampler runs in every step.
 * - `--head-flags` (with `=` since its value starts with a dash): extra `deno run` flags for the head process,
 *   e.g. on a machine without network.
 * - `--batch-min`: the head's `--batch-min` and the direct engine's `batchMin` (default: theirs, 2: always
 *   batch; 0: turns, for comparison).
 * - `--prefill-turn N`, `--batch N` (direct mode only; the head has no flags for them): EngineOptions
 *   `prefillTurn` (prompt tokens per prefill round between decode turns; default one chunk) and `batch`
 *   (decode steps per readback, the length of a decode turn; default 8), and `--piece-steps N`: `pieceSteps`
 *   (decode steps per readback between a long prompt's pieces; default 2) and `--piece-gap F`: `pieceGap` (a
 *   round of pieces and its turn in the streams' steady gaps; default 2.5; 0: fixed `prefillTurn` pieces), and
 *   `--piece-parts 0|1`: `pieceParts` (chunk-wide pieces run a few layers per round; default on), to tune the
 *   fairness trade-off.
 * - `--late N`: in direct mode, at each level L ≥ 2, a request with an N-token prompt arrives once L − 1
 *   streams are generating: the streams' longest gap between id batches while it prefills against their
 *   steady gap, and its time to first token against its solo one (issue #20's fairness goals; `firstStreamGapsMs`:
 *   the first stream's gaps meanwhile, about one per round of pieces). Needs
 *   `--ctx` ≥ N + 17.
 *
 * - `--modes`: any of `http`, `direct` and `direct-nosnap` (direct with EngineOptions `snapshotBack: 0`: no
 *   prompt-boundary snapshot, so a short prompt prefills in one chunk instead of a piece and a rest; its
 *   TTFT against `direct`'s is the snapshot split's cost).
 *
 * Rates: `tokPerSecond` counts every id over the whole wall time (time to first id included);
 * `decodeTokPerSecond` sums each stream's ids after its first batch over the time from its first id to its
 * last, the way the engine's own figure is measured, so the two compare like with like. The engine lines
 * (`Stage.generate` on one slot, `Stage.generateBatch` at each level ≥ 2, same prompt length and ids per
 * stream) give `decodeTokPerSecond` and `ttftMs` (a warm slot: prefill plus the first id's readback; the
 * one-slot line's `tokPerSecond` is its decode rate, as before, and `wallTokPerSecond` the whole call's), and
 * for one slot also `ttftPieceMs` (the prompt as the service runs a burst's request: a piece to the last
 * token that takes the prompt-boundary snapshot inside, then the one-token rest; a lone request's prompt goes
 * whole to one call, as `ttftMs`), `ttftSplitMs` (the order before both: a piece up to 8 tokens before its
 * end, a snapshot, then the rest; `ttftSplit9Ms` and `ttftSplit16Ms` with a rest of 9 and 16 tokens, wider
 * than the mat-vec's 8 columns) and `ttftColdSlotMs` (a slot whose graphs of that prompt width are not built
 * yet). One stream (every mode and the engine) runs `--solo` times in turn (default 5): its line holds each
 * field's median, `ttftMsRuns` every run's TTFT, and over HTTP `serverTtftMsMedian`, the head's own `ttft_ms`
 * of those runs (admission to first id; the rest of the client's TTFT is HTTP); then `ttftNewWidthMsMedian`,
 * the TTFT of `--solo` more prompts whose widths no graph has yet (each built on the way, as for most prompts
 * a server meets; `ttftNewWidthMsRuns` each). A `ratio` line per level then sets each mode's decode rate
 * against the engine's and its median TTFT against the engine's warm `ttftMs` (issue #20: one stream >= 0.95x,
 * 8 streams >= 0.9x, TTFT <= prefill + 15 ms), and at one stream the same for the new widths.
 *
 * Each level uses fresh prompts (no prefix reuse between levels). Without `--model` the head and the direct
 * engine each serve their embedded tiny model. Prints one JSON line per measurement; never asserts.
 * @module
 */
import { expertsConflict, int8ActivationsFlag, int8ExpertsFlag, numericsFlag } from "../cli/experts.ts";
import { parseArgs } from "node:util";
import { acquireGpu } from "../engine/gpu/device.ts";
import { openGguf } from "../engine/gguf.ts";
import { buildWidthClasses } from "../engine/exec/_widths.ts";
import { Stage } from "../engine/exec/stage.ts";
import { type EngineService, startEngine } from "../engine/serve/service.ts";
import { GREEDY_SAMPLING, samplingParams } from "../engine/sampling.ts";
import { TRACE_DECODE } from "../engine/exec/_trace.ts";

const { values: args } = parseArgs({
  options: {
    model: { type: "string" },
    n: { type: "string", default: "128" },
    levels: { type: "string", default: "1,2,4,8,16" },
    prompt: { type: "string", default: "64" },
    port: { type: "string", default: "8099" },
    ctx: { type: "string", default: "2048" },
    modes: { type: "string", default: "http,direct" },
    "batch-min": { type: "string" },
    "prefill-turn": { type: "string" },
    batch: { type: "string" },
    "piece-steps": { type: "string" },
    "piece-gap": { type: "string" },
    "piece-parts": { type: "string" },
    late: { type: "string", default: "0" },
    "head-flags": { type: "string", default: "" },
    temp: { type: "string", default: "0" },
    "f32-experts": { type: "boolean", default: false },
    "int8-experts": { type: "boolean", default: false },
    solo: { type: "string", default: "5" },
  },
});
const conflict = expertsConflict(args);
if (conflict) throw new RangeError(conflict);
/** The numerics of the head, the direct engine and the engine lines, as the head takes its flags. */
const int8Activations = int8ActivationsFlag(args);
const int8Experts = int8ExpertsFlag(args);
const nNew = Number(args.n);
const levels = args.levels!.split(",").map(Number);
const nPrompt = Number(args.prompt);
const nCtx = Number(args.ctx);
const modes = new Set(args.modes!.split(","));
const batchMin = args["batch-min"] === undefined ? undefined : Number(args["batch-min"]);
const late = Number(args.late);
const soloRuns = Number(args.solo);
if (!(Number.isInteger(soloRuns) && soloRuns >= 1 && soloRuns <= 50)) {
  throw new RangeError(`--solo ${args.solo} must be a whole number of runs in 1..50`);
}
const optional = (v: string | undefined) => v === undefined ? undefined : Number(v);
const prefillTurn = optional(args["prefill-turn"]);
const batch = optional(args.batch);
const pieceSteps = optional(args["piece-steps"]);
const pieceGap = optional(args["piece-gap"]);
// `--piece-parts 0`: the late prompt's pieces whole (EngineOptions.pieceParts false); default the engine's.
const pieceParts = args["piece-parts"] === undefined ? undefined : args["piece-parts"] !== "0";
const base = `http://127.0.0.1:${args.port}`;
const maxLevel = Math.max(...levels);
for (const m of modes) {
  if (m !== "http" && m !== "direct" && m !== "direct-nosnap") {
    throw new RangeError(`--modes takes http, direct and/or direct-nosnap, got ${m}`);
  }
}
if (late > 0 && late + 17 > nCtx) {
  throw new RangeError(
    `--late ${late} needs --ctx of at least ${late + 17} (prompt, ids, margin), got ${nCtx}`,
  );
}
const temp = Number(args.temp);
if (!(temp >= 0 && temp <= 2)) throw new RangeError(`--temp ${args.temp} must be in 0..2`);
/** Every stream's settings: greedy, or with `--temp` the GPU sampler at that temperature. */
const SAMPLING = temp > 0
  ? samplingParams({ temperature: temp, topK: 40, topP: 0.95, minP: 0.05, seed: 1 })
  : GREEDY_SAMPLING;

/** Each summary line by mode and level, for the ratio lines at the end. */
const results = new Map<string, Record<string, unknown>>();

function emit(what: string, result: Record<string, unknown>): void {
  if (typeof result.streams === "number") results.set(`${what}/${result.streams}`, result);
  console.log(JSON.stringify({ bench: "serve", what, int8Activations, int8Experts, ...result }));
}

/** A deterministic prompt of `n` ids in 1..900, distinct per `seed` (no prefix shared across seeds). */
function prompt(seed: number, n = nPrompt): number[] {
  return Array.from({ length: n }, (_, j) => 1 + ((seed * 7919 + j * 104729 + seed * j) % 900));
}

/** One stream's timings: first id, then each later batch of ids (ms since the request started). */
interface Timed {
  ttftMs: number;
  tokens: number;
  ms: number;
  /** Ids in the first batch, and when the last batch came (ms since the request started). */
  firstIds: number;
  lastMs: number;
  /** Gaps between consecutive id batches after the first (ms). */
  gaps: number[];
}

function median(v: number[]): number | undefined {
  const s = [...v].sort((a, b) => a - b);
  return s[Math.floor(s.length / 2)];
}

/** The summary line of one level: aggregate and per-stream rates, TTFT, inter-batch gaps. */
function summary(level: number, wallMs: number, rs: Timed[]): Record<string, unknown> {
  const tokens = rs.reduce((a, r) => a + r.tokens, 0);
  const ttft = rs.map((r) => r.ttftMs).sort((a, b) => a - b);
  const gaps = rs.flatMap((r) => r.gaps);
  const decode = decodeRate(rs);
  return {
    streams: level,
    promptTokens: nPrompt,
    newTokensPerStream: nNew,
    tokPerSecond: tokens / (wallMs / 1000),
    tokPerSecondPerStream: tokens / (wallMs / 1000) / level,
    decodeTokPerSecond: decode,
    decodeTokPerSecondPerStream: decode / level,
    ttftMsMedian: median(ttft),
    ttftMsMax: ttft.at(-1),
    gapMsMedian: median(gaps),
    gapMsMax: Math.max(0, ...gaps),
  };
}

/** Σ over streams of the ids after the first batch per second between the first batch and the last. */
function decodeRate(rs: readonly Timed[]): number {
  return rs.reduce(
    (a, r) => a + (r.lastMs > r.ttftMs ? (r.tokens - r.firstIds) / ((r.lastMs - r.ttftMs) / 1000) : 0),
    0,
  );
}

/**
 * The level-1 line from `--solo` sequential single-stream runs (one sample of a ~80 ms TTFT is too noisy to
 * judge a 15 ms goal by): each field the median over the runs, `ttftMsMax` the worst, `ttftMsRuns` each
 * run's.
 */
function soloSummary(runs: readonly { wallMs: number; t: Timed }[]): Record<string, unknown> {
  const lines = runs.map((r) => summary(1, r.wallMs, [r.t]));
  const out: Record<string, unknown> = { ...lines[0] };
  for (const [k, v] of Object.entries(out)) {
    if (typeof v === "number" && k !== "streams") out[k] = median(lines.map((l) => l[k] as number));
  }
  out.ttftMsMax = Math.max(...runs.map((r) => r.t.ttftMs));
  out.ttftMsRuns = runs.map((r) => Math.round(r.t.ttftMs * 10) / 10);
  return out;
}

/**
 * The TTFT of `soloRuns` prompts in turn whose widths no graph has yet (`nPrompt` + 3, + 5, ...: none of the
 * warm-up's width classes), as most prompts a server meets: their chunk graph is built on the way. `one(i,
 * n)` gets prompt i's tokens; each starts with an id no other prompt of this bench starts with (901 + i), so
 * no slot's cached prefix serves it (`prompt`'s ids repeat for seeds equal modulo 900).
 */
async function freshWidths(one: (ids: number[]) => Promise<Timed>): Promise<Record<string, unknown>> {
  const runs: number[] = [];
  for (let i = 0; i < soloRuns; i++) {
    const n = nPrompt + 3 + 2 * i;
    runs.push((await one([901 + i, ...prompt(300 + i * 1000, n - 1)])).ttftMs);
  }
  return { ttftNewWidthMsMedian: median(runs), ttftNewWidthMsRuns: runs.map((t) => Math.round(t * 10) / 10) };
}

/** `soloRuns` sequential runs of `one(i)`, each timed. */
async function solo(one: (i: number) => Promise<Timed>): Promise<{ wallMs: number; t: Timed }[]> {
  const runs: { wallMs: number; t: Timed }[] = [];
  for (let i = 0; i < soloRuns; i++) {
    const t0 = performance.now();
    const t = await one(i);
    runs.push({ wallMs: performance.now() - t0, t });
  }
  return runs;
}

// ---- over HTTP ----

/** One streamed /completion request: time to first content frame, tokens, total time, gaps between frames. */
async function stream(ids: number[], maxTokens = nNew): Promise<Timed> {
  const t0 = performance.now();
  const r = await fetch(`${base}/completion`, {
    method: "POST",
    headers: { "content-type": "application/json" },
    body: JSON.stringify({
      prompt: ids,
      n_predict: maxTokens,
      stream: true,
      temperature: temp,
      ...(temp > 0 ? { top_k: 40, top_p: 0.95, min_p: 0.05, seed: 1 } : {}),
      return_tokens: true,
    }),
  });
  if (!r.ok || !r.body) throw new Error(`HTTP ${r.status}: ${await r.text()}`);
  let ttft = -1;
  let tokens = 0;
  let firstIds = 0;
  let buf = "";
  let last = 0;
  const gaps: number[] = [];
  for await (const chunk of r.body.pipeThrough(new TextDecoderStream())) {
    buf += chunk;
    let at;
    let got = 0;
    while ((at = buf.indexOf("\n\n")) >= 0) {
      const frame = buf.slice(0, at);
      buf = buf.slice(at + 2);
      const data = frame.split("\n").find((l) => l.startsWith("data: "));
      if (!data || data === "data: [DONE]") continue;
      const j = JSON.parse(data.slice(6));
      got += Array.isArray(j.tokens) ? j.tokens.length : 0;
    }
    if (got === 0) continue;
    tokens += got;
    // A readback's ids go out as frames written back to back: reads less than 1 ms apart are one batch.
    const now = performance.now() - t0;
    if (ttft < 0) [ttft, firstIds] = [now, got];
    else if (now - last >= 1) gaps.push(now - last);
    else if (last === ttft) firstIds += got;
    last = now;
  }
  return { ttftMs: ttft, tokens, ms: performance.now() - t0, gaps, firstIds, lastMs: last };
}

/**
 * Polls the head's /health until it answers ok; throws with its log at once if the head exits first (`logDone`:
 * its stderr read to the end).
 */
async function waitReady(head: Deno.ChildProcess, logDone: Promise<void>, log: () => string): Promise<void> {
  let exited: Deno.CommandStatus | undefined;
  head.status.then((s) => exited = s, () => {});
  for (let i = 0; i < 600; i++) {
    if (exited) {
      await logDone;
      throw new Error(`The head exited with code ${exited.code} before it was ready: ${log().slice(-2000)}`);
    }
    try {
      const r = await fetch(`${base}/health`);
      const j = await r.json();
      if (j.status === "ok") return;
    } catch {
      // Not listening yet: retry below.
    }
    await new Promise((r) => setTimeout(r, 500));
  }
  throw new Error(`The head did not become ready: ${log().slice(-2000)}`);
}

/** Runs the levels over HTTP; returns the head's log (it names the model file it served). */
async function overHttp(): Promise<string> {
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
      String(nCtx),
      ...(batchMin === undefined ? [] : ["--batch-min", String(batchMin)]),
      ...numericsFlag(args).split(" ").filter((f) => f !== ""),
      ...(args.model ? ["--model", args.model] : []),
    ],
    stdout: "null",
    stderr: "piped",
  }).spawn();
  let log = "";
  const logDone = (async () => {
    for await (const chunk of head.stderr.pipeThrough(new TextDecoderStream())) log += chunk;
  })();
  try {
    await waitReady(head, logDone, () => log);
    await stream(prompt(999));
    for (const level of levels) {
      await Promise.all(Array.from({ length: level }, (_, i) => stream(prompt(level * 100 + 50 + i), 4)));
      if (level === 1) {
        const from = log.length;
        const line = soloSummary(await solo((i) => stream(prompt(100 + i * 1000))));
        // The head's own ttft_ms (admission to first id) of these runs: the rest of the client's is HTTP.
        await new Promise((r) => setTimeout(r, 100));
        const server = [...log.slice(from).matchAll(/POST \/completion 200 .*?ttft_ms=([\d.]+)/g)].map((m) =>
          Number(m[1])
        );
        const fresh = await freshWidths((ids) => stream(ids));
        emit("http", { ...line, ...fresh, serverTtftMsMedian: median(server), serverTtftMsRuns: server });
        continue;
      }
      const t0 = performance.now();
      const rs = await Promise.all(Array.from({ length: level }, (_, i) => stream(prompt(level * 100 + i))));
      emit("http", summary(level, performance.now() - t0, rs));
    }
  } finally {
    try {
      head.kill("SIGTERM");
    } catch {
      // It has exited already (waitReady's error says why).
    }
    await head.status;
    await logDone;
  }
  return log;
}

// ---- directly through the engine service ----

/** One request through `e` with the timestamps of its id batches. */
async function direct(e: EngineService, ids: number[], maxTokens = nNew): Promise<Timed> {
  const t0 = performance.now();
  let ttft = -1;
  let last = 0;
  let firstIds = 0;
  const gaps: number[] = [];
  const r = await e.generate({
    prompt: ids,
    maxTokens,
    sampling: SAMPLING,
    stopIds: [],
    onTokens: (got) => {
      const now = performance.now() - t0;
      if (ttft < 0) [ttft, firstIds] = [now, got.length];
      else gaps.push(now - last);
      last = now;
    },
  });
  return { ttftMs: ttft, tokens: r.tokens.length, ms: performance.now() - t0, gaps, firstIds, lastMs: last };
}

/**
 * L − 1 streams generate; a request with a `late`-token prompt arrives once each has had four batches (the
 * last stream's join, its prompt rest and first id inside the others' call, is over: the gap spanning the
 * arrival is then the late prompt's doing, not the streams' start; with two it measured the start). Reports
 * the streams' steady gap (median before the arrival), their longest gap between the arrival and the late
 * request's first id, and its TTFT against `soloTtftMs`.
 */
async function lateArrival(e: EngineService, level: number, soloTtftMs: number): Promise<void> {
  const n = level - 1;
  const stamps: number[][] = Array.from({ length: n }, () => []);
  let arrived = -1;
  let first = -1;
  let lateDone: Promise<Timed> | undefined;
  const seeds = Array.from({ length: n }, (_, i) => 5000 + level * 100 + i);
  const streams = seeds.map((seed, i) =>
    e.generate({
      prompt: prompt(seed),
      maxTokens: nNew,
      sampling: SAMPLING,
      stopIds: [],
      onTokens: () => {
        stamps[i]!.push(performance.now());
        if (arrived < 0 && stamps.every((s) => s.length >= 4)) {
          arrived = performance.now();
          lateDone = direct(e, prompt(7000 + level, late), 16).then((t) => {
            first = arrived + t.ttftMs;
            return t;
          });
        }
      },
    })
  );
  await Promise.all(streams);
  const t = await lateDone;
  if (!t) {
    emit("direct-late", { streams: n, skipped: "the streams ended before four batches each" });
    return;
  }
  const steady: number[] = [];
  const during: number[] = [];
  const firstStream: number[] = [];
  for (const [i, s] of stamps.entries()) {
    for (let k = 1; k < s.length; k++) {
      const gap = s[k]! - s[k - 1]!;
      if (s[k]! <= arrived) steady.push(gap);
      else if (s[k - 1]! < first) {
        during.push(gap);
        if (i === 0) firstStream.push(Math.round(gap));
      }
    }
  }
  const steadyMs = median(steady);
  const worstMs = Math.max(0, ...during);
  emit("direct-late", {
    streams: n,
    latePromptTokens: late,
    steadyGapMs: steadyMs,
    worstGapDuringPrefillMs: worstMs,
    // The first stream's gaps from the arrival to the late request's first id: one per round of pieces.
    firstStreamGapsMs: firstStream,
    gapRatio: steadyMs ? worstMs / steadyMs : undefined,
    lateTtftMs: t.ttftMs,
    soloTtftMs,
    ttftRatio: t.ttftMs / soloTtftMs,
    streamsEndedBeforeFirstId: during.length === 0,
  });
}

async function overDirect(what: "direct" | "direct-nosnap"): Promise<void> {
  const e = startEngine({
    model: args.model,
    nCtx,
    nSlots: maxLevel,
    queueSize: 0,
    batchMin,
    prefillTurn,
    batch,
    pieceSteps,
    pieceGap,
    ...(pieceParts === undefined ? {} : { pieceParts }),
    int8Activations,
    int8Experts,
    ...(what === "direct-nosnap" ? { snapshotBack: 0 } : {}),
    onLog: () => {},
  });
  try {
    while (e.status().state === "loading") await new Promise((r) => setTimeout(r, 100));
    const st = e.status();
    if (st.state !== "ready") throw new Error(`The direct engine did not load: ${st.error ?? st.state}`);
    await direct(e, prompt(998));
    for (const level of levels) {
      // Warm this set size's batched graphs first (built once, on first use).
      await Promise.all(Array.from({ length: level }, (_, i) => direct(e, prompt(level * 100 + 50 + i), 4)));
      if (level === 1) {
        const line = soloSummary(await solo((i) => direct(e, prompt(101 + i * 1000))));
        emit(what, { ...line, ...await freshWidths((ids) => direct(e, ids)) });
        continue;
      }
      const t0 = performance.now();
      const rs = await Promise.all(
        Array.from({ length: level }, (_, i) => direct(e, prompt(level * 100 + 1 + i))),
      );
      emit(what, summary(level, performance.now() - t0, rs));
    }
    if (late > 0 && what === "direct") {
      // The second of two solo runs (the first builds the prefill graphs of the long prompt's chunk sizes).
      await direct(e, prompt(6998, late), 2);
      const solo = await direct(e, prompt(6999, late), 16);
      for (const level of levels.filter((l) => l >= 2)) await lateArrival(e, level, solo.ttftMs);
    }
  } finally {
    await e.close({ cancel: true });
  }
}

let log = "";
if (modes.has("http")) log = await overHttp();
// With LLM_TRACE_DECODE=1 the head's trace lines (engine/exec/_trace.ts) follow on stderr.
if (TRACE_DECODE) console.error(log);
if (modes.has("direct")) await overDirect("direct");
if (modes.has("direct-nosnap")) await overDirect("direct-nosnap");

// ---- the engine itself: same model, lengths and ids per stream, no scheduler, no HTTP ----

/** `Stage.generate` on `slot` with the stamps of its id batches. */
async function engineOne(stage: Stage, slot: number, ids: number[], n: number, base = 0): Promise<Timed> {
  const t0 = performance.now();
  let ttft = -1;
  let last = 0;
  let firstIds = 0;
  const g = await stage.generate(slot, ids, {
    nNew: n,
    base,
    sampling: SAMPLING,
    onTokens: (got) => {
      last = performance.now() - t0;
      if (ttft < 0) [ttft, firstIds] = [last, got.length];
    },
  });
  return {
    ttftMs: ttft,
    tokens: g.tokens.length,
    ms: performance.now() - t0,
    gaps: [],
    firstIds,
    lastMs: last,
  };
}

/** `Stage.generateBatch` of one fresh prompt per slot 0..level-1 with each stream's stamps. */
async function engineBatch(stage: Stage, level: number, seed: number, n: number): Promise<Timed[]> {
  const t0 = performance.now();
  const ts = Array.from({ length: level }, () => ({ ttft: -1, last: 0, firstIds: 0 }));
  const rs = await stage.generateBatch(
    ts.map((t, slot) => ({
      slot,
      prompt: prompt(seed + slot),
      opts: {
        nNew: n,
        sampling: SAMPLING,
        onTokens: (got: readonly number[]) => {
          t.last = performance.now() - t0;
          if (t.ttft < 0) [t.ttft, t.firstIds] = [t.last, got.length];
        },
      },
    })),
    { batch: 8 },
  );
  return rs.map((r, i) => ({
    ttftMs: ts[i]!.ttft,
    tokens: r.tokens.length,
    ms: performance.now() - t0,
    gaps: [],
    firstIds: ts[i]!.firstIds,
    lastMs: ts[i]!.last,
  }));
}

/**
 * The prompt as the service runs a burst's request where the decoder snapshots inside a prefill: a piece to
 * the last token that takes the snapshot 8 tokens before the end, then the one-token rest and its first id;
 * returns the time to that id.
 */
async function enginePieceTtft(stage: Stage, slot: number, ids: number[]): Promise<number> {
  const t0 = performance.now();
  const snap = await stage.decoder.prefill(slot, ids.slice(0, -1), 0, ids.length - 8);
  const r = await engineOne(stage, slot, ids.slice(-1), 2, ids.length - 1);
  if (snap !== undefined) stage.decoder.drop(snap);
  return r.ttftMs + (performance.now() - t0 - r.ms);
}

/**
 * The prompt as the service runs it where the decoder cannot snapshot inside a prefill, the snapshot `back`
 * tokens before the end (its default is 8): a piece, the snapshot, the rest and its first id; returns the time
 * to that id.
 */
async function engineSplitTtft(stage: Stage, slot: number, ids: number[], back: number): Promise<number> {
  const at = ids.length - back;
  const t0 = performance.now();
  await stage.decoder.prefill(slot, ids.slice(0, at), 0);
  const snap = stage.snapshot(slot);
  const r = await engineOne(stage, slot, ids.slice(at), 2, at);
  stage.decoder.drop(snap);
  return r.ttftMs + (performance.now() - t0 - r.ms);
}

const path = args.model ?? /\(([^)]+\.gguf)\)/.exec(log)?.[1] ?? /(\/\S+\.gguf)/.exec(log)?.[1];
if (path && await Deno.stat(path).then(() => true, () => false)) {
  const gpu = await acquireGpu();
  using file = await openGguf(path);
  const stage = await Stage.load(gpu, file, { nCtx, nSlots: maxLevel, int8Activations, int8Experts });
  const p = prompt(997);
  await engineOne(stage, 0, p, 16);
  const ones = await solo(() => engineOne(stage, 0, p, nNew));
  // As the service's warm-up: a graph of each width class on slot 0 (their pipelines compiled), so a fresh
  // width's TTFT holds its graph's build, not compiles.
  await buildWidthClasses(stage, 0);
  const split: Record<string, unknown> = await freshWidths((ids) => engineOne(stage, 0, ids, 2));
  // The service's order for a burst's request (engine/serve/_runner.ts): a piece to the last token taking the
  // snapshot inside, then the one-token rest and its first id.
  if (nPrompt > 9 && stage.decoder.snapInPrefill) {
    await enginePieceTtft(stage, 0, prompt(993)); // builds slot 0's graphs of the piece's width
    const runs: number[] = [];
    for (let i = 0; i < soloRuns; i++) runs.push(await enginePieceTtft(stage, 0, prompt(993 - 10 * (i + 1))));
    split.ttftPieceMs = median(runs);
    split.ttftPieceMsRuns = runs.map((t) => Math.round(t * 10) / 10);
  }
  // 8: the service's default; 9 and 16: a rest wider than the mat-vec's 8 columns (the tiled matmul path).
  for (const back of [8, 9, 16].filter((b) => b < nPrompt)) {
    await engineSplitTtft(stage, 0, prompt(995), back); // builds slot 0's graphs of the piece's width
    split[back === 8 ? "ttftSplitMs" : `ttftSplit${back}Ms`] = await engineSplitTtft(
      stage,
      0,
      prompt(994),
      back,
    );
  }
  // A slot not used yet: its graphs of this prompt width and its decode step are built on the way.
  if (maxLevel > 1) split.ttftColdSlotMs = (await engineOne(stage, maxLevel - 1, prompt(996), 2)).ttftMs;
  const s1 = soloSummary(ones);
  emit("engine", {
    ...s1,
    tokPerSecond: s1.decodeTokPerSecond,
    tokPerSecondPerStream: s1.decodeTokPerSecond,
    wallTokPerSecond: s1.tokPerSecond,
    ...split,
    adapter: gpu.summary,
  });
  for (const level of levels.filter((l) => l >= 2 && stage.canBatch)) {
    await engineBatch(stage, level, 9000 + level * 100 + 50, 4); // builds this slot set's batched graph
    const t0 = performance.now();
    const rs = await engineBatch(stage, level, 9000 + level * 100, nNew);
    emit("engine", summary(level, performance.now() - t0, rs));
  }
  stage.destroy();
  for (const level of levels) {
    const eng = results.get(`engine/${level}`);
    for (const m of ["http", "direct", "direct-nosnap"]) {
      const r = results.get(`${m}/${level}`);
      if (!eng || !r) continue;
      const num = (x: unknown) => x as number;
      emit("ratio", {
        streams: level,
        mode: m,
        decodeVsEngine: num(r.decodeTokPerSecond) / num(eng.decodeTokPerSecond),
        tokVsEngine: num(r.tokPerSecond) / num(eng.wallTokPerSecond ?? eng.tokPerSecond),
        ttftMsOverEngine: num(r.ttftMsMedian) - num(eng.ttftMsMedian),
        ...(level === 1
          ? { ttftNewWidthMsOverEngine: num(r.ttftNewWidthMsMedian) - num(eng.ttftNewWidthMsMedian) }
          : {}),
      });
    }
  }
} else {
  emit("engine", { skipped: "no model file: give --model (the served default is a temporary file)" });
}
