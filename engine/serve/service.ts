/**
 * The engine service: the main-thread side of {@linkcode Engine} (`engine/serve/api.ts`). The model runs in a
 * Worker (`engine/serve/worker.ts`) that owns the GPU; this side validates requests, admits up to `nSlots` of them
 * into the worker, holds the rest in a bounded FIFO queue, forwards streamed ids, turns an `AbortSignal` into
 * a cancel and keeps the status and counters.
 *
 * Scheduling: up to `nSlots` requests are admitted into the worker, each on its own slot, and run with
 * continuous batching (`_runner.ts`): every generating request joins every decode step (one batched GPU step
 * for up to 16), a new request joins the running set at the next readback (its first id streams as soon as its
 * prompt is prefilled), and a long prompt is prefilled one `prefillTurn` piece at a time between the others'
 * decode turns. A slot keeps its conversation's state after the request, plus a snapshot a few tokens before
 * the end of its prompt, for prefix reuse.
 *
 * @example
 * ```ts
 * const engine = startEngine({ model: "model.gguf", nCtx: 4096, nSlots: 4, queueSize: 16 });
 * const r = await engine.generate({ prompt: [1, 2, 3], maxTokens: 16, sampling, stopIds: [2] });
 * await engine.close();
 * ```
 * @module
 */
import { checkSampling, samplingParams } from "../sampling.ts";
import {
  type CloseOptions,
  type Engine,
  type EngineStatus,
  type FinishReason,
  type GenerateRequest,
  type GenerateResult,
  QueueFullError,
} from "./api.ts";
import {
  decodeError,
  encodeError,
  type FromWorker,
  type JobResult,
  type NextCall,
  type ToWorker,
} from "./_protocol.ts";
import type { ChainClient, ChainStageStatus, NextResult } from "../exec/split.ts";
import { type EngineOptions, resolveOptions } from "./_options.ts";
import { trace } from "../exec/_trace.ts";
export type { EngineOptions } from "./_options.ts";
export {
  DEFAULT_BATCH_MIN,
  DEFAULT_MAX_CHUNK,
  DEFAULT_PIECE_GAP,
  DEFAULT_PIECE_STEPS,
  DEFAULT_PREFILL_ALONE,
  DEFAULT_PREFILL_TURN,
} from "./_options.ts";

export type {
  CloseOptions,
  Engine,
  EngineStatus,
  FinishReason,
  GenerateRequest,
  GenerateResult,
} from "./api.ts";
export { QueueFullError };

/** Time between completions assumed for the Retry-After estimate before any request has finished. */
const DEFAULT_SERVICE_MS = 1000;
/** Weight of the newest completion in the average time between completions. */
const EWMA_ALPHA = 0.2;

interface Pending {
  readonly id: number;
  readonly req: GenerateRequest;
  readonly startMs: number;
  readonly resolve: (r: GenerateResult) => void;
  readonly reject: (e: unknown) => void;
  /** Ids forwarded to `onTokens` so far. */
  readonly tokens: number[];
  firstMs: number;
  /** Ids in the first batch (tok/s counts the ids after it) and when the latest batch came. */
  firstBatch: number;
  lastMs: number;
  sentMs: number;
  /** The worker's slot once it has one (-1 before) and the prompt tokens that slot holds so far. */
  slot: number;
  heldTokens: number;
  aborted: boolean;
  /** An error thrown by the request's `onTokens`: the request is cancelled and rejects with it. */
  callbackError?: unknown;
  detach: () => void;
}

/**
 * Starts the engine: returns at once with status `loading` while the worker opens the GGUF (or synthesizes the
 * default model) and uploads the weights.
 * @throws {RangeError} on a context, slot count or queue size out of range
 * @example
 * ```ts
 * const engine = startEngine({ nCtx: 256, nSlots: 2, queueSize: 4 }); // the tiny default model
 * ```
 */
export function startEngine(opts: EngineOptions): EngineService {
  return new EngineService(opts);
}

/** The engine service; see the module doc. Create it with {@linkcode startEngine}. */
export class EngineService implements Engine {
  readonly #worker: Worker;
  readonly #nCtx: number;
  readonly #nSlots: number;
  readonly #queueSize: number;
  readonly #log: (line: string) => void;
  #state: EngineStatus["state"] = "loading";
  #failure: Error | undefined;
  #loadedBytes = 0;
  #totalBytes = 0;
  #model = "";
  #arch = "";
  /** Resolves with the GGUF path once the worker has opened it (synthesized or given). */
  readonly #path: Promise<string>;
  #onPath: (path: string) => void = () => {};
  #onPathFailed: (e: Error) => void = () => {};
  #nVocab = 0;
  #pipelines: number | undefined;
  #readbacks: EngineStatus["readbacks"];
  #nextId = 1;
  readonly #inflight = new Map<number, Pending>();
  readonly #queue: Pending[] = [];
  #closing = false;
  /** Average GPU time per request: time between completions under load (one turn runs at a time). */
  #serviceMs = DEFAULT_SERVICE_MS;
  #lastDoneMs = -Infinity;
  #snapshotBytes = 0;
  /** Waiters for the moment no request is admitted or queued (close() calls). */
  readonly #idle: (() => void)[] = [];
  /** Resolves when the worker has released the GPU (its "closed" message) or was terminated. */
  readonly #closed: Promise<void>;
  #onClosed: () => void = () => {};
  #closeSent = false;
  #terminated = false;
  readonly #counters = {
    requests: 0,
    promptTokens: 0,
    generatedTokens: 0,
    prefixHits: 0,
    cachedTokens: 0,
    batchedTokens: 0,
  };
  #prefilledTokens = 0;
  readonly #chain: ChainClient | undefined;
  /** A drafting split head's counts (its Worker's latest `drafts` message). */
  #drafts: EngineStatus["drafts"];

  /** Starts the worker; prefer {@linkcode startEngine}. */
  constructor(opts: EngineOptions) {
    const o = resolveOptions(opts);
    this.#chain = opts.split?.next;
    this.#nCtx = opts.nCtx;
    this.#nSlots = opts.nSlots;
    this.#queueSize = opts.queueSize;
    this.#log = opts.onLog ?? ((line) => console.error(line));
    this.#closed = new Promise<void>((resolve) => this.#onClosed = resolve);
    this.#path = new Promise<string>((resolve, reject) => {
      this.#onPath = resolve;
      this.#onPathFailed = reject;
    });
    // A failed load before the file opened is reported by every waiter of modelPath(), not as unhandled.
    this.#path.catch(() => {});
    this.#worker = new Worker(new URL("./worker.ts", import.meta.url), { type: "module" });
    this.#worker.onmessage = (e: MessageEvent<FromWorker>) => this.#onMessage(e.data);
    this.#worker.onerror = (e: ErrorEvent) => {
      e.preventDefault();
      this.#fail(new Error(`The engine worker crashed: ${e.message}`), true);
    };
    this.#post({
      type: "init",
      model: opts.model,
      nCtx: opts.nCtx,
      nSlots: opts.nSlots,
      ...o,
      int8Activations: opts.int8Activations ?? false,
      int8Experts: opts.int8Experts ?? false,
      kvF16: opts.kvF16 ?? false,
      ...(opts.draft ? { draft: opts.draft } : {}),
      split: opts.split && {
        layers: opts.split.layers,
        ...(opts.split.groups !== undefined ? { groups: opts.split.groups } : {}),
        ...(opts.split.draftCache ? { draftCache: opts.split.draftCache } : {}),
      },
    });
  }

  /** Each stage behind a split head (undefined when the model runs whole here), for `/health`. */
  chain(): ChainStageStatus[] | undefined {
    return this.#chain?.stages();
  }

  /** Current status (no GPU work). */
  status(): EngineStatus {
    return {
      state: this.#state,
      ...(this.#failure ? { error: this.#failure.message } : {}),
      loadedBytes: this.#loadedBytes,
      totalBytes: this.#totalBytes,
      model: this.#model,
      arch: this.#arch,
      nCtx: this.#nCtx,
      nSlots: this.#nSlots,
      busySlots: this.#inflight.size,
      queued: this.#queue.length,
      counters: { ...this.#counters },
      slots: this.#slotView(),
      ...(this.#chain ? { stages: this.#stageView(this.#chain) } : {}),
      ...(this.#drafts ? { drafts: { ...this.#drafts } } : {}),
      ...(this.#pipelines !== undefined ? { pipelines: this.#pipelines } : {}),
      ...(this.#readbacks ? { readbacks: { ...this.#readbacks } } : {}),
    };
  }

  /** A split head's stages in layer order: its own range, then the chain's, with their times and links. */
  #stageView(chain: ChainClient): NonNullable<EngineStatus["stages"]> {
    const head = chain.head?.();
    const all = head ? [head, ...chain.stages()] : chain.stages();
    return all.map((s, i) => {
      const local = head !== undefined && i === 0;
      const link = local ? "local" : s.state === "up" ? "up" : s.connecting ? "reconnecting" : s.state;
      return {
        box: local ? "head" : s.address,
        // Before its first connection a worker's range is unknown; the first one continues the head's.
        layers: s.layers
          ? [s.layers.first, s.layers.end]
          : head?.layers && i === 1
          ? [head.layers.end, head.layers.total]
          : [0, 0],
        stepMs: s.compute ? s.compute.recentMs : null,
        wireMs: local ? 0 : s.wire ? s.wire.recentMs : null,
        link,
        ...(s.compute ? { compute: s.compute } : {}),
        ...(s.wire ? { wire: s.wire } : {}),
        ...(s.error !== undefined ? { error: s.error } : {}),
      };
    });
  }

  /** Each slot: the request running on it (by the worker's slot and prefill messages) or idle. */
  #slotView(): NonNullable<EngineStatus["slots"]> {
    const now = performance.now();
    const bySlot = new Map<number, Pending>();
    for (const p of this.#inflight.values()) if (p.slot >= 0) bySlot.set(p.slot, p);
    return Array.from({ length: this.#nSlots }, (_, slot) => {
      const p = bySlot.get(slot);
      if (p === undefined) {
        return { slot, phase: "idle", promptTokens: 0, prefilledTokens: 0, generatedTokens: 0, ageMs: 0 };
      }
      const generating = p.tokens.length > 0;
      const sinceFirst = p.lastMs - p.firstMs;
      return {
        slot,
        phase: generating ? "generating" : "prefilling",
        promptTokens: p.req.prompt.length,
        prefilledTokens: generating ? p.req.prompt.length : p.heldTokens,
        generatedTokens: p.tokens.length,
        ageMs: now - p.startMs,
        tokPerS: generating && sinceFirst > 0 ? ((p.tokens.length - p.firstBatch) * 1000) / sinceFirst : null,
      };
    });
  }

  /**
   * The GGUF the worker serves (the synthesized default's temp path when no model was given), once opened;
   * the head reads the tokenizer and chat template from it.
   * @throws {Error} when the model failed to load before its file was opened
   */
  modelPath(): Promise<string> {
    return this.#path;
  }

  /**
   * Bytes held by Stage snapshots after the last finished request (0 unless something leaked) and prompt
   * tokens actually prefilled (prompt tokens minus cached ones), for tests and `/metrics`.
   */
  internals(): { snapshotBytes: number; prefilledTokens: number } {
    return { snapshotBytes: this.#snapshotBytes, prefilledTokens: this.#prefilledTokens };
  }

  /**
   * Admits the request into a slot or the queue and resolves when it ends.
   * @throws {QueueFullError} when every slot is busy and the queue is full, or the engine is closing
   * @throws {RangeError} on a prompt that does not fit the context, a bad token id, length or sampling setting
   * @throws {Error} when the model failed to load
   */
  async generate(req: GenerateRequest): Promise<GenerateResult> {
    if (this.#closing) {
      throw new QueueFullError("The engine is shutting down and admits no new requests: retry elsewhere", 1);
    }
    // The failure names itself ("The model failed to load: ..." or "The engine worker crashed: ...").
    if (this.#state === "failed") throw new Error(this.#failure?.message ?? "The model failed to load");
    this.#validate(req);
    if (this.#chain && this.#state === "ready") {
      try {
        await this.#chain.ready();
      } catch (e) {
        throw chainDown(e);
      }
    }
    const startMs = performance.now();
    if (req.signal?.aborted) return result(req, [], "cancelled", { cachedTokens: 0, ttftMs: 0, queueMs: 0 });
    if (this.#inflight.size >= this.#nSlots && this.#queue.length >= this.#queueSize) {
      const s = this.#retryAfterSeconds();
      throw new QueueFullError(
        `All ${this.#nSlots} slots are busy and the queue of ${this.#queueSize} is full: retry after ${s} s`,
        s,
      );
    }
    this.#counters.requests++;
    return await new Promise<GenerateResult>((resolve, reject) => {
      const p: Pending = {
        id: this.#nextId++,
        req,
        startMs,
        resolve,
        reject,
        tokens: [],
        firstMs: -1,
        firstBatch: 0,
        lastMs: -1,
        sentMs: -1,
        slot: -1,
        heldTokens: 0,
        aborted: false,
        detach: () => {},
      };
      if (req.signal) {
        const onAbort = () => this.#abort(p);
        req.signal.addEventListener("abort", onAbort, { once: true });
        p.detach = () => req.signal!.removeEventListener("abort", onAbort);
      }
      trace("submit", { id: p.id, prompt: req.prompt.length, queued: this.#inflight.size >= this.#nSlots });
      if (this.#inflight.size < this.#nSlots) this.#send(p);
      else this.#queue.push(p);
    });
  }

  /**
   * Stops admitting, lets admitted and queued requests finish (or cancels them all, with `cancel`), then
   * destroys the stage and terminates the worker.
   */
  async close(opts: CloseOptions = {}): Promise<void> {
    if (this.#terminated) return;
    this.#closing = true;
    if (opts.cancel) {
      for (const p of this.#queue.splice(0)) this.#finishQueued(p);
      for (const p of this.#inflight.values()) this.#abort(p);
      if (this.#state === "loading") {
        // Nothing ran yet: no need to wait for the upload to finish.
        for (const p of [...this.#inflight.values()]) this.#settleCancelled(p);
        this.#terminate();
        return;
      }
    }
    if (this.#inflight.size > 0 || this.#queue.length > 0) {
      await new Promise<void>((resolve) => this.#idle.push(resolve));
    }
    this.#sendClose();
    await this.#closed;
    this.#terminate(opts.exiting);
    await this.#chain?.close();
  }

  /** Asks the worker to destroy the stage, close the file and remove its temp folder. */
  #sendClose(): void {
    if (this.#closeSent || this.#terminated) return;
    this.#closeSent = true;
    this.#post({ type: "close" });
  }

  #validate(req: GenerateRequest): void {
    const n = req.prompt.length;
    if (n === 0) throw new RangeError("The prompt is empty: send at least one token");
    if (n + 1 > this.#nCtx) {
      throw new RangeError(
        `Prompt of ${n} tokens plus 1 does not fit the context of ${this.#nCtx}: shorten the prompt, or ` +
          `restart the server with --ctx ${n + 1} or more`,
      );
    }
    const maxId = this.#nVocab > 0 ? this.#nVocab : 2 ** 32;
    const badId = (ids: readonly number[], max: number) =>
      ids.findIndex((t) => !Number.isInteger(t) || t < 0 || t >= max);
    let at = badId(req.prompt, maxId);
    if (at >= 0) {
      throw new RangeError(
        `Prompt token ${at} is ${req.prompt[at]}, not an id in 0..${
          maxId - 1
        }: tokenize with this model's vocabulary`,
      );
    }
    // A stop id past the output rows is harmless (never generated): tokenizers may list more ids than that.
    at = badId(req.stopIds, 2 ** 32);
    if (at >= 0) throw new RangeError(`Stop id ${req.stopIds[at]} is not a token id (an integer >= 0)`);
    if (!Number.isInteger(req.maxTokens) || req.maxTokens < 1) {
      throw new RangeError(`maxTokens must be an integer >= 1, got ${req.maxTokens}`);
    }
    // Range checks of every sampling setting (RangeError naming the field), before admission.
    checkSampling(samplingParams(req.sampling));
  }

  #retryAfterSeconds(): number {
    // The queue gets room when the next request completes: about one request's GPU time from now.
    return Math.min(60, Math.max(1, Math.ceil(this.#serviceMs / 1000)));
  }

  #send(p: Pending): void {
    this.#inflight.set(p.id, p);
    p.sentMs = performance.now();
    this.#post({
      type: "generate",
      id: p.id,
      prompt: [...p.req.prompt],
      maxTokens: p.req.maxTokens,
      stopIds: [...p.req.stopIds],
      sampling: samplingParams(p.req.sampling),
    });
  }

  #abort(p: Pending): void {
    if (p.aborted) return;
    p.aborted = true;
    const q = this.#queue.indexOf(p);
    if (q >= 0) {
      this.#queue.splice(q, 1);
      this.#finishQueued(p);
      this.#checkIdle();
    } else if (this.#inflight.has(p.id) && !this.#terminated) {
      this.#post({ type: "cancel", id: p.id });
    }
  }

  /** A request cancelled before it reached the worker. */
  #finishQueued(p: Pending): void {
    p.aborted = true;
    p.detach();
    p.resolve(
      result(p.req, [], "cancelled", { cachedTokens: 0, ttftMs: 0, queueMs: performance.now() - p.startMs }),
    );
  }

  #settleCancelled(p: Pending): void {
    this.#inflight.delete(p.id);
    p.detach();
    p.resolve(result(p.req, p.tokens, "cancelled", { cachedTokens: 0, ttftMs: ttft(p), queueMs: queued(p) }));
  }

  #onMessage(m: FromWorker): void {
    switch (m.type) {
      case "log":
        this.#log(m.line);
        break;
      case "meta":
        this.#onPath(m.path);
        this.#model = m.model;
        this.#arch = m.arch;
        break;
      case "progress":
        this.#loadedBytes = m.loadedBytes;
        this.#totalBytes = m.totalBytes;
        break;
      case "ready":
        this.#nVocab = m.nVocab;
        this.#pipelines = m.pipelines;
        this.#state = "ready";
        this.#loadedBytes = this.#totalBytes;
        break;
      case "failed":
        this.#fail(decodeError(m.error, "The model failed to load"));
        break;
      case "tokens": {
        const p = this.#inflight.get(m.id);
        if (!p || p.aborted) break;
        p.lastMs = performance.now();
        if (p.firstMs < 0) [p.firstMs, p.firstBatch] = [p.lastMs, m.ids.length];
        p.tokens.push(...m.ids);
        try {
          p.req.onTokens?.(m.ids);
        } catch (e) {
          p.callbackError = e;
          this.#abort(p);
        }
        break;
      }
      case "slot": {
        const p = this.#inflight.get(m.id);
        if (p) [p.slot, p.heldTokens] = [m.slot, m.heldTokens];
        break;
      }
      case "done":
        this.#pipelines = m.pipelines;
        this.#readbacks = m.readbacks;
        this.#done(m.id, m.result);
        break;
      case "error": {
        const p = this.#inflight.get(m.id);
        if (!p) break;
        this.#inflight.delete(m.id);
        p.detach();
        p.reject(m.error.name === "WireError" ? chainDown(decodeError(m.error)) : decodeError(m.error));
        this.#next();
        break;
      }
      case "stage":
        this.#chain?.attach(m.info);
        break;
      case "next":
        void this.#callNext(m.call, m.request);
        break;
      case "drafts":
        this.#drafts = { frames: m.frames, proposed: m.proposed, accepted: m.accepted };
        break;
      case "closed":
        this.#onClosed();
        if (this.#state === "failed") this.#terminate();
        break;
      default: {
        const never: never = m;
        throw new TypeError(`Unknown message ${JSON.stringify(never)} from the engine worker`);
      }
    }
  }

  #done(id: number, r: JobResult): void {
    const p = this.#inflight.get(id);
    if (!p) return;
    this.#inflight.delete(id);
    p.detach();
    const c = this.#counters;
    c.promptTokens += p.req.prompt.length;
    c.generatedTokens += r.tokens.length;
    if (r.cachedTokens > 0) c.prefixHits++;
    c.cachedTokens += r.cachedTokens;
    c.batchedTokens += r.batchedTokens;
    this.#prefilledTokens += r.prefilledTokens;
    this.#snapshotBytes = r.snapshotBytes;
    // Under load the time between completions is the GPU time per request (one turn runs at a time);
    // after an idle spell it is this request's own time.
    const now = performance.now();
    const ms = now - Math.max(this.#lastDoneMs, p.sentMs);
    this.#lastDoneMs = now;
    this.#serviceMs += EWMA_ALPHA * (ms - this.#serviceMs);
    if (p.callbackError !== undefined) p.reject(p.callbackError);
    else if (p.aborted) {
      const o = { cachedTokens: r.cachedTokens, ttftMs: ttft(p), queueMs: queued(p) };
      p.resolve(result(p.req, p.tokens, "cancelled", o));
    } else {
      if (p.firstMs < 0 && r.tokens.length > 0) p.firstMs = performance.now();
      p.resolve(
        result(p.req, r.tokens, r.reason, {
          cachedTokens: r.cachedTokens,
          ttftMs: ttft(p),
          queueMs: queued(p),
          meanBatch: r.meanBatch,
        }),
      );
    }
    this.#next();
  }

  /** Carries out one call of the worker's split decoder on the chain and posts the answer back. */
  async #callNext(call: number, r: NextCall): Promise<void> {
    const next = this.#chain;
    try {
      if (!next) throw new Error("Internal error: a split call on an engine without a chain");
      let value: number | NextResult | undefined;
      switch (r.op) {
        case "run":
          value = await next.run(r.req);
          break;
        case "runBatch":
          if (!next.runBatch) throw new Error("Internal error: a batched run on a chain without runBatch");
          value = await next.runBatch(r.req);
          break;
        case "snapshot":
          value = await next.snapshot(r.slot, r.epoch);
          break;
        case "restore":
          await next.restore(r.id, r.slot, r.epoch);
          break;
        case "drop":
          await next.drop(r.id, r.epoch);
          break;
        default: {
          const never: never = r;
          throw new TypeError(`Unknown chain call ${JSON.stringify(never)}`);
        }
      }
      if (!this.#terminated) this.#post({ type: "next-reply", call, value });
    } catch (e) {
      if (!this.#terminated) this.#post({ type: "next-reply", call, error: encodeError(e) });
    }
  }

  /** Admits the head of the queue into the freed slot. */
  #next(): void {
    while (this.#inflight.size < this.#nSlots && this.#queue.length > 0 && !this.#terminated) {
      this.#send(this.#queue.shift()!);
    }
    this.#checkIdle();
  }

  #checkIdle(): void {
    if (this.#inflight.size === 0 && this.#queue.length === 0) {
      for (const resolve of this.#idle.splice(0)) resolve();
    }
  }

  /** Fails every request and the engine; a crashed worker is terminated, a live one asked to clean up. */
  #fail(e: Error, crashed = false): void {
    if (this.#state === "failed") return;
    this.#state = "failed";
    this.#failure = e;
    this.#onPathFailed(e);
    this.#log(e.message);
    for (const p of [...this.#queue.splice(0), ...this.#inflight.values()]) {
      p.detach();
      p.reject(e);
    }
    this.#inflight.clear();
    this.#checkIdle();
    if (crashed) this.#terminate();
    else this.#sendClose();
  }

  /** Ends the worker (`leave`: only stops talking to it; see {@linkcode CloseOptions.exiting}). */
  #terminate(leave = false): void {
    if (this.#terminated) return;
    this.#terminated = true;
    if (!leave) this.#worker.terminate();
    this.#onClosed();
    this.#checkIdle();
  }

  #post(m: ToWorker): void {
    this.#worker.postMessage(m);
  }
}

/** A chain failure as the head reports it: 503 with Retry-After (the worker may come back). */
function chainDown(e: unknown): QueueFullError {
  const msg = e instanceof Error ? e.message : String(e);
  return new QueueFullError(`The split chain is down: ${msg}: retry shortly`, 2);
}

function ttft(p: Pending): number {
  return p.firstMs < 0 ? 0 : p.firstMs - p.startMs;
}

/** Milliseconds `p` waited for a slot before it was sent to the worker. */
function queued(p: Pending): number {
  return p.sentMs < 0 ? performance.now() - p.startMs : p.sentMs - p.startMs;
}

function result(
  req: GenerateRequest,
  tokens: readonly number[],
  reason: FinishReason,
  o: { cachedTokens: number; ttftMs: number; queueMs: number; meanBatch?: number },
): GenerateResult {
  return {
    tokens,
    reason,
    promptTokens: req.prompt.length,
    cachedTokens: o.cachedTokens,
    timeToFirstTokenMs: o.ttftMs,
    queueMs: o.queueMs,
    ...(o.meanBatch !== undefined ? { meanBatch: o.meanBatch } : {}),
  };
}
