/**
 * The web dashboard the head serves at `/`: a chat over the head's own `POST /v1/chat/completions` stream
 * and a live view fed by `GET /dashboard/events`, one Server-Sent Event per second carrying a
 * {@linkcode DashboardSnapshot}. The page, its script and its style are strings from
 * `dashboard_page.ts` (no build step, no files read at run time, nothing from a CDN) and are public; the
 * events carry the server's state and need the API key like every other data endpoint (the page asks for
 * it and sends it as a Bearer token: an `EventSource` cannot send headers, so the page reads the stream
 * through `fetch`).
 *
 * The engine reports each slot (`status().slots`: idle, prefilling with progress, generating, ids, tok/s,
 * age), which the slot table draws; the head also keeps its own view of each request (for engines that do
 * not report slots, and for the queue): {@linkcode LiveRequests} wraps the {@linkcode Engine} the endpoints
 * call and notes when each request was admitted, when its first ids came and how many came since, and a
 * five-minute history of time to first token and generated tokens per second in 5-second buckets.
 *
 * @example
 * ```ts
 * import { dashboardEventsHandler, LiveRequests } from "./dashboard.ts";
 * const live = new LiveRequests(engine);
 * // the app's endpoints call live.engine; the events read live's view beside engine.status()
 * app.get("/dashboard/events", dashboardEventsHandler(live));
 * ```
 * @module
 */
import type { Context } from "hono";
import type { Engine, EngineStatus } from "../engine/mod.ts";
import type { AppEnv } from "./_generate.ts";
import { DASHBOARD_CSS, DASHBOARD_JS, dashboardHtml } from "./dashboard_page.ts";
import { SseStream } from "./sse.ts";

/** Milliseconds between two events of `GET /dashboard/events`. */
export const DASHBOARD_EVENT_MS = 1000;
/** Width of one history bucket in milliseconds. */
export const HISTORY_BUCKET_MS = 5000;
/** Buckets kept: five minutes of history. */
export const HISTORY_BUCKETS = 60;
/** A stage's step time is shown while its last batch of ids is at most this old (ms). */
const STEP_FRESH_MS = 10_000;

/** One request as the head sees it (`phase` from its ids so far and the engine's busy count). */
export interface DashboardRequest {
  /** Short id, stable while the request runs. */
  readonly id: string;
  /** `queued` (waiting for a slot), `prefilling` (in a slot, no id yet) or `generating`. */
  readonly phase: "queued" | "prefilling" | "generating";
  /** Prompt tokens. */
  readonly promptTokens: number;
  /** Ids generated so far. */
  readonly generatedTokens: number;
  /** Most ids it may generate. */
  readonly maxTokens: number;
  /** Milliseconds from admission to its first id (null before it). */
  readonly ttftMs: number | null;
  /** Ids per second since its first id (null before two batches of ids). */
  readonly tokPerS: number | null;
  /** Milliseconds since admission. */
  readonly ageMs: number;
}

/** One 5-second bucket of the history. */
export interface DashboardBucket {
  /** Start of the bucket (ms since the epoch). */
  readonly startMs: number;
  /** Mean time to first token of the requests whose first id came in the bucket (null: none did). */
  readonly ttftMs: number | null;
  /** Ids generated in the bucket per second (all requests together; the open bucket over its elapsed part). */
  readonly tokPerS: number;
}

/**
 * One pipeline stage as the live view draws it: the engine's `status().stages` when it reports them (a
 * split head, one entry per box in layer order), else one `local` stage.
 */
export interface DashboardStage {
  /** The box serving it: `local`, or a worker's `host:port`. */
  readonly box: string;
  /** Its layer range `[first, end)` (null when the engine does not report the layer count). */
  readonly layers: readonly [number, number] | null;
  /** Milliseconds of compute per decode step (null: no recent step). */
  readonly stepMs: number | null;
  /** Milliseconds on the wire per step, both ways (0 for a local stage, null: not measured). */
  readonly wireMs: number | null;
  /** The link's state: `local` (same process), `up`, `slow`, `down`, `reconnecting` or `idle` (not yet). */
  readonly link: "local" | "up" | "slow" | "down" | "reconnecting" | "idle";
  /** A split stage's compute aggregates per RUN frame (ms), when the engine reports them (the page's hover). */
  readonly compute?: NonNullable<EngineStatus["stages"]>[number]["compute"];
  /** The wire aggregates of the hop into it (ms), when measured. */
  readonly wire?: NonNullable<EngineStatus["stages"]>[number]["wire"];
  /** Why its link is down (untrusted text: the page shows it as a title). */
  readonly error?: string;
}

/** The JSON of one `status` event of `GET /dashboard/events`. */
export interface DashboardSnapshot {
  /** When it was taken (ms since the epoch). */
  readonly timeMs: number;
  /** The engine's state. */
  readonly state: EngineStatus["state"];
  /** Load progress in bytes. */
  readonly load: { readonly loadedBytes: number; readonly totalBytes: number };
  /** The model; null fields are ones the engine does not report. */
  readonly model: {
    readonly name: string;
    readonly arch: string;
    readonly quant: string | null;
    readonly sizeBytes: number;
    readonly fingerprint: string | null;
    readonly nCtx: number;
    readonly nLayer: number | null;
  };
  /** The GPU; null fields are ones the engine does not report. */
  readonly gpu: { readonly adapter: string | null; readonly memoryBytes: number | null };
  /** Slots: counts, and the engine's per-slot view when it gives one (null: the live view uses `requests`). */
  readonly slots: {
    readonly total: number;
    readonly busy: number;
    readonly queued: number;
    readonly perSlot: EngineStatus["slots"] | null;
  };
  /** Requests in flight (queued ones included), oldest first. */
  readonly requests: readonly DashboardRequest[];
  /** Time to first token and throughput over the last minutes, oldest bucket first. */
  readonly history: { readonly bucketMs: number; readonly buckets: readonly DashboardBucket[] };
  /** The pipeline's stages, in layer order. */
  readonly stages: readonly DashboardStage[];
  /** The engine's counters since start. */
  readonly counters: EngineStatus["counters"];
}

interface Tracked {
  id: string;
  admittedMs: number;
  firstMs: number | undefined;
  firstBatch: number;
  lastMs: number;
  tokens: number;
  promptTokens: number;
  maxTokens: number;
}

interface Bucket {
  startMs: number;
  ttftSumMs: number;
  ttftCount: number;
  tokens: number;
}

/**
 * The head's live view of its requests: wraps an {@linkcode Engine} (use {@linkcode LiveRequests.engine}
 * where the endpoints call the engine) and records each request's admission, first ids and id count, and
 * the history buckets.
 */
export class LiveRequests {
  /** The wrapped engine: the same contract, with every generation recorded. */
  readonly engine: Engine;
  readonly #inner: Engine;
  readonly #now: () => number;
  readonly #live = new Map<string, Tracked>();
  readonly #buckets: Bucket[] = [];
  #nextId = 1;
  #lastStep: { atMs: number; stepMs: number } | undefined;

  /**
   * @param inner the engine service
   * @param opts `now`: the clock in ms since the epoch (tests pass their own)
   */
  constructor(inner: Engine, opts: { now?: () => number } = {}) {
    this.#inner = inner;
    this.#now = opts.now ?? Date.now;
    this.engine = {
      status: () => inner.status(),
      generate: (req) => this.#generate(req),
      close: (o) => inner.close(o),
    };
  }

  async #generate(req: Parameters<Engine["generate"]>[0]): ReturnType<Engine["generate"]> {
    const t: Tracked = {
      id: `r${this.#nextId++}`,
      admittedMs: this.#now(),
      firstMs: undefined,
      firstBatch: 0,
      lastMs: 0,
      tokens: 0,
      promptTokens: req.prompt.length,
      maxTokens: req.maxTokens,
    };
    this.#live.set(t.id, t);
    const onTokens = (ids: readonly number[]) => {
      this.#note(t, ids.length);
      req.onTokens?.(ids);
    };
    try {
      return await this.#inner.generate({ ...req, onTokens });
    } finally {
      this.#live.delete(t.id);
    }
  }

  #note(t: Tracked, n: number): void {
    if (n === 0) return;
    const now = this.#now();
    const b = this.#bucket(now);
    if (t.firstMs === undefined) {
      t.firstMs = now;
      t.firstBatch = n;
      b.ttftSumMs += now - t.admittedMs;
      b.ttftCount++;
    } else {
      this.#lastStep = { atMs: now, stepMs: (now - t.lastMs) / n };
    }
    t.lastMs = now;
    t.tokens += n;
    b.tokens += n;
  }

  #bucket(now: number): Bucket {
    const start = now - (now % HISTORY_BUCKET_MS);
    const last = this.#buckets.at(-1);
    if (last !== undefined && last.startMs === start) return last;
    const b = { startMs: start, ttftSumMs: 0, ttftCount: 0, tokens: 0 };
    this.#buckets.push(b);
    while (this.#buckets.length > HISTORY_BUCKETS) this.#buckets.shift();
    return b;
  }

  /** The snapshot the live view draws, from the engine's status and the head's own records. */
  snapshot(): DashboardSnapshot {
    const st = this.#inner.status();
    const now = this.#now();
    const tracked = [...this.#live.values()].sort((a, b) => a.admittedMs - b.admittedMs);
    // The engine admits in FIFO order: of the requests without ids, the oldest hold the busy slots that
    // are not generating (prefilling), the rest wait in the queue.
    let prefilling = st.busySlots - tracked.filter((t) => t.firstMs !== undefined).length;
    const requests = tracked.map((t): DashboardRequest => {
      const phase = t.firstMs !== undefined ? "generating" : prefilling-- > 0 ? "prefilling" : "queued";
      const sinceFirst = t.firstMs === undefined ? 0 : t.lastMs - t.firstMs;
      return {
        id: t.id,
        phase,
        promptTokens: t.promptTokens,
        generatedTokens: t.tokens,
        maxTokens: t.maxTokens,
        ttftMs: t.firstMs === undefined ? null : t.firstMs - t.admittedMs,
        tokPerS: sinceFirst > 0 ? ((t.tokens - t.firstBatch) * 1000) / sinceFirst : null,
        ageMs: now - t.admittedMs,
      };
    });
    const current = now - (now % HISTORY_BUCKET_MS);
    const byStart = new Map(this.#buckets.map((b) => [b.startMs, b]));
    const buckets: DashboardBucket[] = [];
    for (let i = HISTORY_BUCKETS - 1; i >= 0; i--) {
      const startMs = current - i * HISTORY_BUCKET_MS;
      const b = byStart.get(startMs);
      const spanMs = i === 0 ? Math.max(now - startMs, 1) : HISTORY_BUCKET_MS;
      buckets.push({
        startMs,
        ttftMs: b !== undefined && b.ttftCount > 0 ? b.ttftSumMs / b.ttftCount : null,
        tokPerS: b === undefined ? 0 : (b.tokens * 1000) / spanMs,
      });
    }
    const step = this.#lastStep !== undefined && now - this.#lastStep.atMs <= STEP_FRESH_MS
      ? this.#lastStep.stepMs
      : null;
    return {
      timeMs: now,
      state: st.state,
      load: { loadedBytes: st.loadedBytes, totalBytes: st.totalBytes },
      model: {
        name: st.model,
        arch: st.arch,
        quant: st.quant ?? null,
        sizeBytes: st.totalBytes,
        fingerprint: st.fingerprint ?? null,
        nCtx: st.nCtx,
        nLayer: st.nLayer ?? null,
      },
      gpu: { adapter: st.adapter ?? null, memoryBytes: st.gpuMemoryBytes ?? null },
      slots: { total: st.nSlots, busy: st.busySlots, queued: st.queued, perSlot: st.slots ?? null },
      requests,
      history: { bucketMs: HISTORY_BUCKET_MS, buckets },
      stages: st.stages ?? [{
        box: "local",
        layers: st.nLayer === undefined ? null : [0, st.nLayer],
        stepMs: step,
        wireMs: 0,
        link: "local",
      }],
      counters: st.counters,
    };
  }
}

/** Headers of the page and its assets: nothing but same-origin script, style and fetches may run. */
const PAGE_HEADERS = {
  "content-security-policy": "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; " +
    "img-src 'self' data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'",
  "x-content-type-options": "nosniff",
  "referrer-policy": "no-referrer",
  "cache-control": "no-cache",
} as const;

/**
 * `GET /`, `/dashboard/app.js`, `/dashboard/app.css`: the page and its assets (public: they hold no data).
 * @param keyRequired whether the head has an API key (the page then asks for it before any data request)
 */
export function dashboardPageHandler(keyRequired: boolean): (c: Context) => Response {
  const html = dashboardHtml({ keyRequired });
  return (c) => {
    switch (c.req.path) {
      case "/dashboard/app.js":
        return c.body(DASHBOARD_JS, 200, {
          ...PAGE_HEADERS,
          "content-type": "text/javascript; charset=utf-8",
        });
      case "/dashboard/app.css":
        return c.body(DASHBOARD_CSS, 200, { ...PAGE_HEADERS, "content-type": "text/css; charset=utf-8" });
      default:
        return c.body(html, 200, { ...PAGE_HEADERS, "content-type": "text/html; charset=utf-8" });
    }
  };
}

/** Paths of {@linkcode dashboardPageHandler} (register them before the API-key middleware). */
export const DASHBOARD_PAGE_PATHS: readonly string[] = ["/", "/dashboard/app.js", "/dashboard/app.css"];

/**
 * `GET /dashboard/events`: a `status` event with a {@linkcode DashboardSnapshot} at once and then every
 * `intervalMs`, until the client goes away. Needs the API key (register it after the middleware).
 */
export function dashboardEventsHandler(
  live: LiveRequests,
  opts: { intervalMs?: number } = {},
): (c: Context<AppEnv>) => Response {
  const intervalMs = opts.intervalMs ?? DASHBOARD_EVENT_MS;
  return (c) => {
    const sse = new SseStream("openai", { requestId: c.get("requestId"), requestSignal: c.req.raw.signal });
    const send = () => {
      if (!sse.send("status", live.snapshot())) clearInterval(timer);
    };
    const timer = setInterval(send, intervalMs);
    sse.signal.addEventListener("abort", () => clearInterval(timer), { once: true });
    send();
    return sse.response;
  };
}
