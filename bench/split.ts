/**
 * Benchmark: split serving over loopback (issue #19's Benchmark section). For the unsplit head and for
 * chains of 2 and 3 stages (a head and worker processes of `mod.ts`, all on this machine's one GPU, layers
 * split evenly), over HTTP like a client: single-stream ms/token and time to first token, then the aggregate
 * tok/s of `--slots` parallel streams. With `--drafts 0,3` each split is also run with `--draft 3` (prompt
 * lookup drafts per decode frame); `--draft-cache N` gives drafted heads `--draft-cache N` and, after the
 * single stream, sends the same request twice more (the second is "single_repeat": its drafts come from the cache of the first
 * one's prompt and output; a random-weight model never repeats itself, so prompt lookup alone proposes
 * nothing). `--pipelines 2,0` (the default) runs each split with the head's `--pipeline 2`
 * (the pipelined multi-slot driver: two slot groups in flight, each a batched RUN_BATCH frame) and
 * `--pipeline 0` (the driver before it: generating requests take turns, one slot per frame), side by side;
 * `pipeline` in each line says which (null for the unsplit head).
 *
 * Usage: `deno run -A bench/split.ts [--model F.gguf] [--stages 1,2,3] [--n 128] [--prompt 64] [--slots 8]
 * [--ctx 1024] [--drafts 0] [--draft-cache 0] [--pipelines 2,0] [--temp 0] [--f32-experts] [--quick]`
 * - no `--model`: the 35B-A3B-shaped IQ4_XS model of bench/decode.ts (`--synth-out`, default
 *   `/tmp/bench-35b-a3b-iq4_xs.gguf`, synthesized once and reused);
 * - `--temp T` (default 0, greedy): requests sample at temperature T (top-k 40, top-p 0.95, a seed per
 *   prompt), so the last stage draws with the GPU sampler in its pass instead of the argmax;
 * - `--f32-experts`: every process (head and workers) runs with `--f32-experts`, f32 x for the expert passes
 *   (default: int8 x for the experts alone, the commands' default; `int8Experts` in each line says which);
 * - `--quick` (lavapipe, CI-sized): the tiny synthetic qwen35moe in a temporary folder, `--n 16 --prompt 16
 *   --ctx 128` unless given.
 *
 * Per-stage and wire times (split runs): the head's `/metrics` read before and after each measurement;
 * `perStageMs` lists each stage (head first: its box and layers) with the RUN frames it computed in the
 * measurement and its mean compute per frame, as the stage measured it; `wireMs` is the mean wire time per
 * frame (the head's round trip minus the workers' compute: every hop together); `draftAcceptance` the
 * accepted / proposed draft ids in the measurement (null without drafts). `phasesMs` breaks each stage
 * process's frames down by phase (issue #19: graph lookup, writeBuffer, encode, submit, the blocking `mapAsync`
 * call, the wait for its promise, the copy out, the last stage's CPU argmax / top-k / GPU sampler; the head's
 * pipelined driver adds `pipe.*`: lock, head step, chain round trip, take, step and between steps): calls and
 * mean ms per call, read from each process's profile (started with `LLM_STAGE_PROFILE=1`, printed on SIGUSR1). RUN frames are decode steps (one
 * per token, or per drafted frame) and prompt pieces. The unsplit head reports none of these (null).
 *
 * The aggregate line's `tokPerSecond` counts every id over the wall time (the prompts' prefill included);
 * `decodeTokPerSecond` sums each stream's ids after its first batch over its time from that batch to its last
 * id (as bench/serve.ts), the decode rate alone.
 *
 * One JSON line per measurement (commit, adapter, command, parameters, result with units); never asserts.
 * No npm imports: it runs with nothing but Deno (the lent H200 included).
 * @module
 */
import { parseArgs } from "node:util";
import { openGguf } from "../engine/gguf.ts";
import { archKey, KEYS } from "../engine/names.ts";
import { planModel, synthesize } from "../engine/synth.ts";
import { buildInfo } from "../version.ts";

const { values: args } = parseArgs({
  options: {
    model: { type: "string" },
    "synth-out": { type: "string", default: "/tmp/bench-35b-a3b-iq4_xs.gguf" },
    stages: { type: "string", default: "1,2,3" },
    n: { type: "string" },
    prompt: { type: "string" },
    slots: { type: "string", default: "8" },
    ctx: { type: "string" },
    drafts: { type: "string", default: "0" },
    "draft-cache": { type: "string", default: "0" },
    pipelines: { type: "string", default: "2,0" },
    temp: { type: "string", default: "0" },
    "f32-experts": { type: "boolean", default: false },
    quick: { type: "boolean", default: false },
  },
});

function int(flag: string, value: string, min: number): number {
  const n = Number(value);
  if (!Number.isInteger(n) || n < min) {
    throw new RangeError(`--${flag} ${value} must be an integer >= ${min}`);
  }
  return n;
}

const quick = args.quick!;
const nNew = int("n", args.n ?? (quick ? "16" : "128"), 2);
const nPrompt = int("prompt", args.prompt ?? (quick ? "16" : "64"), 1);
const nSlots = int("slots", args.slots!, 1);
const nCtx = int("ctx", args.ctx ?? (quick ? "128" : "1024"), 2);
const stageCounts = args.stages!.split(",").map((s) => int("stages", s, 1));
const drafts = args.drafts!.split(",").map((s) => int("drafts", s, 0));
const draftCache = int("draft-cache", args["draft-cache"]!, 0);
const pipelines = args.pipelines!.split(",").map((s) => int("pipelines", s, 0));
const temp = Number(args.temp);
if (!(temp >= 0 && temp <= 2)) throw new RangeError(`--temp ${args.temp} must be in 0..2`);
if (nPrompt + nNew + 1 > nCtx) {
  throw new RangeError(`--prompt ${nPrompt} plus --n ${nNew} does not fit --ctx ${nCtx}: raise --ctx`);
}
const MOD = new URL("../mod.ts", import.meta.url).pathname;
const COMMAND = ["bench/split.ts", ...Deno.args].join(" ");
const build = buildInfo();
/** Longest wait for a process's expected log line (a 35B model's load and warm-up included). */
const WAIT_MS = 20 * 60_000;

let adapter: string | undefined;

function emit(what: string, result: Record<string, unknown>): void {
  console.log(JSON.stringify({
    bench: "split",
    what,
    commit: build.commit,
    adapter: adapter ?? null,
    command: COMMAND,
    ...result,
  }));
}

// ---- the model ----

let tempDir: string | undefined;
let model = args.model;
if (model === undefined) {
  if (quick) {
    tempDir = await Deno.makeTempDir({ prefix: "bench_split_" });
    model = `${tempDir}/tiny-qwen35moe.gguf`;
    await synthesize(planModel({ arch: "qwen35moe", preset: "tiny", quant: "q8_0", seed: 1 }), {
      out: model,
    });
  } else {
    model = args["synth-out"]!;
    if (!(await Deno.stat(model).then(() => true, () => false))) {
      const r = await synthesize(
        planModel({ arch: "qwen35moe", preset: "35b-a3b", quant: "iq4_xs", seed: 7 }),
        { out: model },
      );
      emit("synth", { path: model, dataBytes: r.dataBytes, seconds: r.seconds });
    }
  }
}
const nLayer = await (async () => {
  using f = await openGguf(model);
  const arch = f.metadata.getString(KEYS.architecture);
  return f.metadata.getInt(archKey(arch, "blockCount"));
})();

/** Layer ranges of `n` stages, as even as whole layers allow (the first range is the head's). */
function ranges(n: number): [number, number][] {
  return Array.from(
    { length: n },
    (_, i) => [Math.round((i * nLayer) / n), Math.round(((i + 1) * nLayer) / n)],
  );
}

// ---- processes ----

interface Proc {
  readonly log: string[];
  /** Sends SIGUSR1: the stage prints its phase profile (`LLM_STAGE_PROFILE=1`, engine/exec/_profile.ts). */
  usr1(): void;
  waitFor(re: RegExp): Promise<RegExpMatchArray>;
  stop(): Promise<void>;
}

function spawn(argv: string[]): Proc {
  const child = new Deno.Command(Deno.execPath(), {
    args: ["run", "-A", MOD, ...argv],
    stdout: "null",
    stderr: "piped",
    env: { LLM_STAGE_PROFILE: "1" },
  }).spawn();
  const log: string[] = [];
  let exited = false;
  const done = (async () => {
    let buf = "";
    for await (const chunk of child.stderr.pipeThrough(new TextDecoderStream())) {
      buf += chunk;
      const lines = buf.split("\n");
      buf = lines.pop()!;
      log.push(...lines);
    }
    exited = true;
  })();
  return {
    log,
    usr1() {
      if (!exited) child.kill("SIGUSR1");
    },
    async waitFor(re) {
      const end = Date.now() + WAIT_MS;
      for (;;) {
        for (const l of log) {
          const m = l.match(re);
          if (m) return m;
        }
        if (exited) throw new Error(`${argv[0]} exited before printing ${re}:\n${log.slice(-30).join("\n")}`);
        if (Date.now() > end) throw new Error(`${argv[0]} printed no ${re} within ${WAIT_MS} ms`);
        await new Promise((r) => setTimeout(r, 100));
      }
    },
    async stop() {
      if (!exited) {
        try {
          child.kill("SIGTERM");
        } catch {
          // It exited between the check and the signal.
        }
      }
      await child.status;
      await done;
    },
  };
}

function freePort(): number {
  const l = Deno.listen({ hostname: "127.0.0.1", port: 0 });
  const port = (l.addr as Deno.NetAddr).port;
  l.close();
  return port;
}

/** Starts the chain (workers last to first, then the head) and resolves with the head's URL once ready. */
async function startChain(n: number, draft: number, pipeline: number, procs: Proc[]): Promise<string> {
  const rs = ranges(n);
  const common = [
    "--model",
    model!,
    "--slots",
    String(nSlots),
    "--ctx",
    String(nCtx),
    ...(args["f32-experts"] ? ["--f32-experts"] : []),
  ];
  const ports = rs.map(() => freePort());
  for (let i = n - 1; i >= 1; i--) {
    const [a, b] = rs[i]!;
    const w = spawn([
      "worker",
      ...common,
      "--layers",
      `${a}:${b}`,
      "--listen",
      `127.0.0.1:${ports[i]}`,
      ...(i + 1 < n ? ["--next", `127.0.0.1:${ports[i + 1]}`] : []),
    ]);
    procs.push(w);
    await w.waitFor(/Listening on /);
  }
  const split = n > 1 ? ["--layers", `0:${rs[0]![1]}`, "--next", `127.0.0.1:${ports[1]}`] : [];
  const head = spawn([
    "head",
    ...common,
    "--port",
    "0",
    "--queue",
    String(nSlots),
    ...split,
    ...(draft > 0 ? ["--draft", String(draft)] : []),
    ...(draft > 0 && draftCache > 0 ? ["--draft-cache", String(draftCache)] : []),
    ...(n > 1 ? ["--pipeline", String(pipeline)] : []),
  ]);
  procs.push(head);
  const url = (await head.waitFor(/Listening on (http:\/\/\S+)/))[1]!;
  await head.waitFor(/ ready: /);
  adapter ??= (await head.waitFor(/^GPU: (.*)$/))[1];
  return url;
}

// ---- measurements over HTTP ----

/** A deterministic prompt of `n` ids in 1..900, distinct per `seed` (no prefix shared across seeds). */
function prompt(seed: number, n = nPrompt): number[] {
  return Array.from({ length: n }, (_, j) => 1 + ((seed * 7919 + j * 104729 + seed * j) % 900));
}

interface Timed {
  /** Milliseconds to the first id. */
  ttftMs: number;
  /** Ids received, and those in the first batch. */
  tokens: number;
  firstBatch: number;
  /** Milliseconds from the first id to the last. */
  decodeMs: number;
}

/**
 * One streamed `/completion` request of at most `maxTokens` ids (an end-of-generation id ends it early:
 * rates count the ids that came).
 */
async function stream(url: string, ids: number[], maxTokens = nNew): Promise<Timed> {
  const t0 = performance.now();
  const r = await fetch(`${url}/completion`, {
    method: "POST",
    headers: { "content-type": "application/json" },
    body: JSON.stringify({
      prompt: ids,
      n_predict: maxTokens,
      stream: true,
      temperature: temp,
      ...(temp > 0 ? { top_k: 40, top_p: 0.95, seed: ids.length + ids[0]! } : {}),
      return_tokens: true,
    }),
  });
  if (!r.ok || !r.body) throw new Error(`HTTP ${r.status}: ${await r.text()}`);
  let first = -1;
  let last = -1;
  let tokens = 0;
  let firstBatch = 0;
  let buf = "";
  for await (const chunk of r.body.pipeThrough(new TextDecoderStream())) {
    buf += chunk;
    let got = 0;
    for (let at = buf.indexOf("\n\n"); at >= 0; at = buf.indexOf("\n\n")) {
      const data = buf.slice(0, at).split("\n").find((l) => l.startsWith("data: "));
      buf = buf.slice(at + 2);
      if (!data || data === "data: [DONE]") continue;
      const j = JSON.parse(data.slice(6));
      if (j.error) throw new Error(`Stream error: ${JSON.stringify(j.error)}`);
      got += Array.isArray(j.tokens) ? j.tokens.length : 0;
    }
    if (got === 0) continue;
    const now = performance.now() - t0;
    if (first < 0) [first, firstBatch] = [now, got];
    last = now;
    tokens += got;
  }
  return { ttftMs: first, tokens, firstBatch, decodeMs: last - first };
}

/** The per-stage and draft series of a head's `/metrics`: `name` → labels → value. */
type Series = Map<string, Map<string, number>>;

async function scrape(url: string): Promise<Series> {
  const out: Series = new Map();
  const text = await (await fetch(`${url}/metrics`)).text();
  for (const m of text.matchAll(/^(llm_(?:stage|draft)_[a-z_]+)(?:\{([^}]*)\})? (\S+)$/gm)) {
    const byLabels = out.get(m[1]!) ?? new Map<string, number>();
    byLabels.set(m[2] ?? "", Number(m[3]));
    out.set(m[1]!, byLabels);
  }
  return out;
}

/** A process's stage profile: its label and phase → summed ms and count. */
type Profile = { label: string; phases: Record<string, { ms: number; count: number }> };

/** Each process's stage profile now (SIGUSR1, then its next `stage profile:` line; null when none came). */
async function profiles(procs: readonly Proc[]): Promise<(Profile | null)[]> {
  return await Promise.all(procs.map(async (p) => {
    const from = p.log.length;
    p.usr1();
    for (let t = 0; t < 50; t++) {
      const line = p.log.slice(from).find((l) => l.startsWith("stage profile: "));
      if (line) return JSON.parse(line.slice("stage profile: ".length)) as Profile;
      await new Promise((r) => setTimeout(r, 100));
    }
    return null;
  }));
}

/**
 * `phasesMs`: per stage process (head first), each phase's calls and mean ms per call in the interval between
 * two profiles (run.* / batch.*: `Stage.run` / `Stage.runBatch` phases; worker.*: the last stage's CPU argmax,
 * top-k and GPU sampler; mapWait: from the blocking `mapAsync` call's return to its promise).
 */
function phaseTimes(a: readonly (Profile | null)[], b: readonly (Profile | null)[]) {
  const out = b.map((pb, i) => {
    const pa = a[i];
    if (!pb) return null;
    const phases: Record<string, { calls: number; msPerCall: number; msTotal: number }> = {};
    for (const [k, v] of Object.entries(pb.phases)) {
      const calls = v.count - (pa?.phases[k]?.count ?? 0);
      const ms = v.ms - (pa?.phases[k]?.ms ?? 0);
      if (calls > 0) {
        phases[k] = { calls, msPerCall: Math.round((ms / calls) * 1000) / 1000, msTotal: Math.round(ms) };
      }
    }
    return { stage: pb.label, phases };
  });
  return out.some((x) => x) ? out : null;
}

/** `perStageMs`, `wireMs` and `draftAcceptance` of the interval between two scrapes (see the module doc). */
function stageTimes(a: Series, b: Series) {
  const delta = (name: string, labels: string) =>
    (b.get(name)?.get(labels) ?? 0) - (a.get(name)?.get(labels) ?? 0);
  const perStageMs = [...(b.get("llm_stage_runs_total")?.keys() ?? [])].map((labels) => {
    const l = Object.fromEntries([...labels.matchAll(/(\w+)="((?:[^"\\]|\\.)*)"/g)].map((m) => [m[1], m[2]]));
    const runs = delta("llm_stage_runs_total", labels);
    const ms = delta("llm_stage_compute_seconds_total", labels) * 1000;
    return {
      stage: Number(l.stage),
      box: l.box,
      layers: l.layers,
      runs,
      msPerRun: runs > 0 ? ms / runs : null,
    };
  });
  const wire = [...(b.get("llm_stage_wire_seconds_total")?.keys() ?? [])];
  const wireRuns = wire.reduce((t, l) => t + delta("llm_stage_runs_total", l), 0);
  const wireS = wire.reduce((t, l) => t + delta("llm_stage_wire_seconds_total", l), 0);
  const proposed = delta("llm_draft_tokens_proposed_total", "");
  return {
    perStageMs: perStageMs.length > 0 ? perStageMs : null,
    wireMs: wireRuns > 0 ? (wireS * 1000) / wireRuns : null,
    draftAcceptance: proposed > 0 ? delta("llm_draft_tokens_accepted_total", "") / proposed : null,
  };
}

async function measure(n: number, draft: number, pipeline: number): Promise<void> {
  const procs: Proc[] = [];
  const config = {
    stages: n,
    layers: ranges(n),
    draft,
    pipeline: n > 1 ? pipeline : null,
    model,
    nLayer,
    promptTokens: nPrompt,
    newTokens: nNew,
    ctx: nCtx,
    int8Experts: !args["f32-experts"],
  };
  try {
    const url = await startChain(n, draft, pipeline, procs);
    // Connect the chain and build every graph the runs use (one stream, then a full set of slots).
    await stream(url, prompt(999), 4);
    await Promise.all(Array.from({ length: nSlots }, (_, i) => stream(url, prompt(900 + i), 4)));

    // The head first (procs hold the workers last to first, then the head).
    const stageProcs = [...procs].reverse();
    const before = await scrape(url);
    const profBefore = await profiles(stageProcs);
    const solo = await stream(url, prompt(1));
    const decoded = solo.tokens - solo.firstBatch;
    let mid = await scrape(url);
    let profMid = await profiles(stageProcs);
    emit("single", {
      ...config,
      ...stageTimes(before, mid),
      phasesMs: phaseTimes(profBefore, profMid),
      streams: 1,
      tokens: solo.tokens,
      ttftMs: solo.ttftMs,
      msPerToken: decoded > 0 ? solo.decodeMs / decoded : null,
      tokPerSecond: decoded > 0 ? (decoded * 1000) / solo.decodeMs : null,
    });
    if (draft > 0 && draftCache > 0) {
      // The same request again: its drafts come from the cache of the first one's output (module doc). Once
      // unmeasured: it builds the drafted frame's graphs on the slot (the prefix cache keeps the prompt there).
      await stream(url, prompt(1));
      mid = await scrape(url);
      profMid = await profiles(stageProcs);
      const again = await stream(url, prompt(1));
      const left = again.tokens - again.firstBatch;
      const end = await scrape(url);
      const profEnd = await profiles(stageProcs);
      emit("single_repeat", {
        ...config,
        ...stageTimes(mid, end),
        phasesMs: phaseTimes(profMid, profEnd),
        streams: 1,
        tokens: again.tokens,
        ttftMs: again.ttftMs,
        msPerToken: left > 0 ? again.decodeMs / left : null,
        tokPerSecond: left > 0 ? (left * 1000) / again.decodeMs : null,
      });
      mid = end;
      profMid = profEnd;
    }

    const t0 = performance.now();
    const rs = await Promise.all(Array.from({ length: nSlots }, (_, i) => stream(url, prompt(10 + i))));
    const wallMs = performance.now() - t0;
    const tokens = rs.reduce((a, r) => a + r.tokens, 0);
    const ttft = rs.map((r) => r.ttftMs).sort((a, b) => a - b);
    const after = await scrape(url);
    emit("aggregate", {
      ...config,
      ...stageTimes(mid, after),
      phasesMs: phaseTimes(profMid, await profiles(stageProcs)),
      streams: nSlots,
      tokens,
      wallMs,
      tokPerSecond: (tokens * 1000) / wallMs,
      // Each stream's ids after its first batch per second from that batch to its last id, summed (as
      // bench/serve.ts' decodeTokPerSecond): the decode rate without the prompts' prefill.
      decodeTokPerSecond: rs.reduce(
        (a, r) => a + (r.decodeMs > 0 ? ((r.tokens - r.firstBatch) * 1000) / r.decodeMs : 0),
        0,
      ),
      ttftMsMedian: ttft[Math.floor(ttft.length / 2)],
      ttftMsMax: ttft.at(-1),
    });
  } catch (e) {
    emit("failed", {
      ...config,
      perStageMs: null,
      phasesMs: null,
      wireMs: null,
      draftAcceptance: null,
      error: e instanceof Error ? e.message : String(e),
    });
  } finally {
    for (const p of procs.reverse()) await p.stop();
  }
}

try {
  for (const n of stageCounts) {
    if (n > nLayer) {
      emit("skipped", { stages: n, nLayer, reason: `${n} stages need at least ${n} layers` });
      continue;
    }
    // Drafts are a split chain's (the unsplit head has no --draft).
    for (const draft of n === 1 ? [0] : drafts) {
      for (const pipeline of n === 1 ? [0] : pipelines) await measure(n, draft, pipeline);
    }
  }
} finally {
  if (tempDir !== undefined) await Deno.remove(tempDir, { recursive: true });
}
