/**
 * `GET /metrics`: Prometheus text exposition (format 0.0.4) of the head's own counters (requests by
 * endpoint and status, client aborts, open and refused connections, tokens in and out, generation throughput,
 * time-to-first-token histogram, queue time, prefill seconds and tokens, batch size seen) and the
 * engine's live gauges (queue depth, busy slots) and counters (prefix-cache hits); on a split head, per stage of the
 * chain (labels `stage`, `box`, `layers`) its compute and wire seconds, RUN frames, recent step times and
 * whether it is up, and the draft counts.
 * @module
 */
import type { Context } from "hono";
import type { EngineStatus } from "../engine/mod.ts";
import type { Http1Event } from "./http1.ts";
import { routeOf } from "./routes.ts";

/** Upper bounds (seconds) of the time-to-first-token histogram buckets. */
export const TTFT_BUCKETS_S: readonly number[] = [0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60];

/** What one finished generation adds to the counters. */
export interface GenerationSample {
  /** Prompt tokens. */
  promptTokens: number;
  /** Prompt tokens served from a cached prefix. */
  cachedTokens: number;
  /** Generated tokens. */
  generatedTokens: number;
  /** Milliseconds from admission to the first token (undefined when none came). */
  timeToFirstTokenMs: number | undefined;
  /** Milliseconds from the first token to the end. */
  decodeMs: number;
  /** Milliseconds it waited for a slot, when the engine reports it. */
  queueMs?: number;
  /** Milliseconds from the slot to the first token (its prefill), when tokens were prefilled and one came. */
  prefillMs?: number;
  /** Prompt tokens prefilled (prompt minus cached). */
  prefilledTokens?: number;
  /** Batch size seen (requests per decode step, weighted by its ids), when the engine reports it. */
  meanBatch?: number;
}

/** The head's counters since start. */
export class Metrics {
  #requests = new Map<string, number>();
  #promptTokens = 0;
  #cachedTokens = 0;
  #generatedTokens = 0;
  #decodeSeconds = 0;
  #ttftCounts: number[] = TTFT_BUCKETS_S.map(() => 0);
  #ttftSum = 0;
  #ttftCount = 0;
  #queue = { seconds: 0, count: 0 };
  #prefill = { seconds: 0, tokens: 0 };
  #batch = { sum: 0, count: 0 };
  #connectionsOpen = 0;
  #refused = new Map<string, number>();
  #aborts = new Map<string, number>();

  /** Counts one connection-level event of the HTTP server (opens, closes, refusals, client aborts). */
  connection(e: Http1Event): void {
    switch (e.type) {
      case "open":
        this.#connectionsOpen++;
        return;
      case "close":
        this.#connectionsOpen--;
        return;
      case "refused":
        this.#refused.set(e.reason, (this.#refused.get(e.reason) ?? 0) + 1);
        return;
      case "client_abort": {
        const route = routeOf(e.path);
        this.#aborts.set(route, (this.#aborts.get(route) ?? 0) + 1);
        return;
      }
      default: {
        const never: never = e;
        throw new Error(`Internal error: unknown HTTP event ${JSON.stringify(never)}`);
      }
    }
  }

  /** Counts one answered request. */
  request(endpoint: string, status: number): void {
    const key = `endpoint="${endpoint}",status="${status}"`;
    this.#requests.set(key, (this.#requests.get(key) ?? 0) + 1);
  }

  /** Adds one finished generation. */
  generation(s: GenerationSample): void {
    this.#promptTokens += s.promptTokens;
    this.#cachedTokens += s.cachedTokens;
    this.#generatedTokens += s.generatedTokens;
    this.#decodeSeconds += s.decodeMs / 1000;
    if (s.timeToFirstTokenMs !== undefined) {
      const t = s.timeToFirstTokenMs / 1000;
      TTFT_BUCKETS_S.forEach((b, i) => {
        if (t <= b) this.#ttftCounts[i]!++;
      });
      this.#ttftSum += t;
      this.#ttftCount++;
    }
    if (s.queueMs !== undefined) {
      this.#queue.seconds += s.queueMs / 1000;
      this.#queue.count++;
    }
    if (s.prefillMs !== undefined && s.prefilledTokens !== undefined) {
      this.#prefill.seconds += s.prefillMs / 1000;
      this.#prefill.tokens += s.prefilledTokens;
    }
    if (s.meanBatch !== undefined && s.meanBatch > 0) {
      this.#batch.sum += s.meanBatch;
      this.#batch.count++;
    }
  }

  /** The exposition text, with the engine's gauges from `status`. */
  render(status: EngineStatus): string {
    const out: string[] = [];
    const metric = (name: string, type: string, help: string, lines: string[]) => {
      out.push(`# HELP ${name} ${help}`, `# TYPE ${name} ${type}`, ...lines);
    };
    metric(
      "llm_http_requests_total",
      "counter",
      "HTTP requests answered, by endpoint and status.",
      [...this.#requests].map(([k, v]) => `llm_http_requests_total{${k}} ${v}`),
    );
    metric(
      "llm_http_client_aborts_total",
      "counter",
      "Requests whose client went away before the response was complete, by endpoint.",
      [...this.#aborts].map(([k, v]) => `llm_http_client_aborts_total{endpoint="${k}"} ${v}`),
    );
    metric("llm_http_connections_open", "gauge", "HTTP connections open.", [
      `llm_http_connections_open ${this.#connectionsOpen}`,
    ]);
    metric(
      "llm_http_refused_total",
      "counter",
      "Connections or requests refused by the HTTP server's bounds, by reason.",
      [...this.#refused].map(([k, v]) => `llm_http_refused_total{reason="${k}"} ${v}`),
    );
    metric("llm_prompt_tokens_total", "counter", "Prompt tokens of finished generations.", [
      `llm_prompt_tokens_total ${this.#promptTokens}`,
    ]);
    metric("llm_cached_prompt_tokens_total", "counter", "Prompt tokens served from a cached prefix.", [
      `llm_cached_prompt_tokens_total ${this.#cachedTokens}`,
    ]);
    metric("llm_generated_tokens_total", "counter", "Generated tokens.", [
      `llm_generated_tokens_total ${this.#generatedTokens}`,
    ]);
    metric("llm_decode_seconds_total", "counter", "Seconds spent generating after the first token.", [
      `llm_decode_seconds_total ${this.#decodeSeconds}`,
    ]);
    const tps = this.#decodeSeconds > 0 ? this.#generatedTokens / this.#decodeSeconds : 0;
    metric("llm_tokens_per_second", "gauge", "Generated tokens per decode second since start.", [
      `llm_tokens_per_second ${tps}`,
    ]);
    const buckets = TTFT_BUCKETS_S.map((b, i) =>
      `llm_time_to_first_token_seconds_bucket{le="${b}"} ${this.#ttftCounts[i]}`
    );
    buckets.push(`llm_time_to_first_token_seconds_bucket{le="+Inf"} ${this.#ttftCount}`);
    buckets.push(`llm_time_to_first_token_seconds_sum ${this.#ttftSum}`);
    buckets.push(`llm_time_to_first_token_seconds_count ${this.#ttftCount}`);
    metric(
      "llm_time_to_first_token_seconds",
      "histogram",
      "Time from admission to the first token.",
      buckets,
    );
    metric("llm_queue_seconds", "summary", "Time requests waited for a slot before the model saw them.", [
      `llm_queue_seconds_sum ${this.#queue.seconds}`,
      `llm_queue_seconds_count ${this.#queue.count}`,
    ]);
    metric(
      "llm_prefill_seconds_total",
      "counter",
      "Seconds from a slot to the first token, over requests that prefilled (prefill tok/s: tokens over this).",
      [`llm_prefill_seconds_total ${this.#prefill.seconds}`],
    );
    metric(
      "llm_prefilled_tokens_total",
      "counter",
      "Prompt tokens prefilled (not served from a cached prefix).",
      [
        `llm_prefilled_tokens_total ${this.#prefill.tokens}`,
      ],
    );
    metric(
      "llm_batch_size",
      "summary",
      "Batch size each request saw: requests per decode step it shared, weighted by its tokens (1: alone).",
      [`llm_batch_size_sum ${this.#batch.sum}`, `llm_batch_size_count ${this.#batch.count}`],
    );
    metric("llm_queue_depth", "gauge", "Requests waiting for a slot.", [`llm_queue_depth ${status.queued}`]);
    metric("llm_slots_busy", "gauge", "Slots running a request.", [`llm_slots_busy ${status.busySlots}`]);
    metric("llm_slots_total", "gauge", "Slots.", [`llm_slots_total ${status.nSlots}`]);
    metric("llm_engine_requests_total", "counter", "Requests the engine admitted.", [
      `llm_engine_requests_total ${status.counters.requests}`,
    ]);
    metric("llm_prefix_cache_hits_total", "counter", "Requests that reused a cached prefix.", [
      `llm_prefix_cache_hits_total ${status.counters.prefixHits}`,
    ]);
    metric(
      "llm_batched_tokens_total",
      "counter",
      "Tokens generated in GPU steps shared by several requests (batched decode).",
      [`llm_batched_tokens_total ${status.counters.batchedTokens}`],
    );
    if (status.pipelines !== undefined) {
      metric(
        "llm_gpu_pipelines",
        "gauge",
        "GPU pipelines compiled (after the warm-up it should not grow: a rise means a request waited for one).",
        [`llm_gpu_pipelines ${status.pipelines}`],
      );
    }
    if (status.readbacks) {
      const r = status.readbacks;
      metric(
        "llm_gpu_readbacks_total",
        "counter",
        "GPU readbacks by path: early (as soon as the GPU is done), awaited (Deno's 10 ms poll), fellback (early refused).",
        [
          `llm_gpu_readbacks_total{path="early"} ${r.early}`,
          `llm_gpu_readbacks_total{path="awaited"} ${r.awaited}`,
          `llm_gpu_readbacks_total{path="fellback"} ${r.fellBack}`,
        ],
      );
    }
    if (status.stages) renderStages(status.stages, metric);
    if (status.drafts) {
      const d = status.drafts;
      metric(
        "llm_draft_frames_total",
        "counter",
        "Decode frames that carried drafts (a split head's, or the unsplit engine's --draft frames).",
        [
          `llm_draft_frames_total ${d.frames}`,
        ],
      );
      metric("llm_draft_tokens_proposed_total", "counter", "Draft ids fed in drafted frames.", [
        `llm_draft_tokens_proposed_total ${d.proposed}`,
      ]);
      metric("llm_draft_tokens_accepted_total", "counter", "Draft ids the output matched (kept).", [
        `llm_draft_tokens_accepted_total ${d.accepted}`,
      ]);
    }
    metric("llm_model_loaded_ratio", "gauge", "Fraction of the model's bytes on the GPU.", [
      `llm_model_loaded_ratio ${status.totalBytes > 0 ? status.loadedBytes / status.totalBytes : 0}`,
    ]);
    return out.join("\n") + "\n";
  }
}

/**
 * A label value as the exposition format writes it: backslash, double quote and newline escaped (a stage's
 * box comes from the command line and is not trusted to be plain).
 */
function labelValue(v: string): string {
  return v.replace(/\\/g, "\\\\").replace(/"/g, '\\"').replace(/\n/g, "\\n");
}

/** The per-stage series of a split head: compute and wire seconds and frames, link up, recent step times. */
function renderStages(
  stages: NonNullable<EngineStatus["stages"]>,
  metric: (name: string, type: string, help: string, lines: string[]) => void,
): void {
  const labels = stages.map((g, i) =>
    `stage="${i}",box="${labelValue(g.box)}",layers="${g.layers[0]}:${g.layers[1]}"`
  );
  const series = (name: string, value: (g: (typeof stages)[number]) => number | undefined) =>
    stages.flatMap((g, i) => {
      const v = value(g);
      return v === undefined ? [] : [`${name}{${labels[i]}} ${v}`];
    });
  metric(
    "llm_stage_compute_seconds_total",
    "counter",
    "Seconds each stage of the split chain spent computing RUN frames, as the stage measured it.",
    series("llm_stage_compute_seconds_total", (g) => g.compute && g.compute.totalMs / 1000),
  );
  metric(
    "llm_stage_runs_total",
    "counter",
    "RUN frames (decode steps and prompt pieces) each stage computed.",
    series("llm_stage_runs_total", (g) => g.compute?.count),
  );
  metric(
    "llm_stage_wire_seconds_total",
    "counter",
    "Seconds on the wire of the hop into each stage, both ways (round trip minus the compute behind it; " +
      "the first worker's holds every hop behind it).",
    series("llm_stage_wire_seconds_total", (g) => g.wire && g.wire.totalMs / 1000),
  );
  metric(
    "llm_stage_step_seconds",
    "gauge",
    "Mean compute per RUN frame over each stage's latest frames.",
    series("llm_stage_step_seconds", (g) => g.compute && g.compute.recentMs / 1000),
  );
  metric(
    "llm_stage_wire_step_seconds",
    "gauge",
    "Mean wire time per RUN frame over the latest frames of the hop into each stage.",
    series("llm_stage_wire_step_seconds", (g) => g.wire && g.wire.recentMs / 1000),
  );
  metric(
    "llm_stage_up",
    "gauge",
    "1 while the stage is reachable (the head's own range, or a worker whose link is up), else 0.",
    series("llm_stage_up", (g) => g.link === "local" || g.link === "up" || g.link === "slow" ? 1 : 0),
  );
}

/** The `GET /metrics` handler. */
export function metricsHandler(metrics: Metrics, status: () => EngineStatus): (c: Context) => Response {
  return (c) =>
    c.body(metrics.render(status()), 200, { "content-type": "text/plain; version=0.0.4; charset=utf-8" });
}
