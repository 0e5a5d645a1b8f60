/**
 * The contract between the HTTP head (`server/*`) and the engine service that owns the GPU (`engine/serve/service.ts`,
 * running the model in a `Worker`). The head tokenizes and templates; the service schedules token ids onto
 * slots, reuses cached prefixes and streams ids back. Types only.
 * @module
 */
import type { SamplingParams } from "../sampling.ts";
import type { FinishReason, Generated } from "../exec/slot_decoder.ts";

export type { SamplingParams };

/** One generation request, already tokenized by the head. */
export interface GenerateRequest {
  /** Prompt token ids (the rendered chat template, tokenized). */
  readonly prompt: readonly number[];
  /** Most tokens to generate (≥ 1). */
  readonly maxTokens: number;
  /** Sampling parameters (temperature 0: greedy, bit-identical to argmax), checked at admission. */
  readonly sampling: SamplingParams;
  /** Token ids that end generation (EOS/EOT); the id that ends it is reported, not streamed as text. */
  readonly stopIds: readonly number[];
  /** Aborts the request (client disconnect, a stop string matched by the head): frees the slot. */
  readonly signal?: AbortSignal;
  /** Called with each batch of new ids as they land on the CPU, in order. */
  readonly onTokens?: (ids: readonly number[]) => void;
}

/** Why a generation ended. */
export type { FinishReason };

/** Outcome of one request. */
export interface GenerateResult extends Generated {
  /** Prompt tokens. */
  readonly promptTokens: number;
  /** Prompt tokens served from a cached prefix (not prefilled again). */
  readonly cachedTokens: number;
  /** Milliseconds from admission to the first id. */
  readonly timeToFirstTokenMs: number;
  /**
   * Milliseconds of that spent waiting for a slot (in the queue) before the model saw it, when the engine
   * reports it.
   */
  readonly queueMs?: number;
  /**
   * Batch size seen: requests per decode step it shared, weighted by its ids (1: it always ran alone), when
   * the engine reports it.
   */
  readonly meanBatch?: number;
}

/** What the service reports for `/health`, `/v1/models` and `/metrics`. */
export interface EngineStatus {
  /** `loading` until the weights are on the GPU. */
  readonly state: "loading" | "ready" | "failed";
  /** Why it failed (`state` failed): the load's error or the worker's crash. */
  readonly error?: string;
  /** Load progress in bytes (when loading). */
  readonly loadedBytes: number;
  /** Bytes to load in all. */
  readonly totalBytes: number;
  /** Model name (general.name or the file name) and architecture. */
  readonly model: string;
  /** `general.architecture`. */
  readonly arch: string;
  /** Positions per slot. */
  readonly nCtx: number;
  /** Slots. */
  readonly nSlots: number;
  /** Slots running a request now. */
  readonly busySlots: number;
  /** Requests waiting for a slot. */
  readonly queued: number;
  /** Counters since start. */
  readonly counters: {
    readonly requests: number;
    readonly promptTokens: number;
    readonly generatedTokens: number;
    readonly prefixHits: number;
    readonly cachedTokens: number;
    /** Ids made in GPU steps shared by several requests (batched decode). */
    readonly batchedTokens: number;
  };
  /** The GPU adapter (vendor, device, driver), when the engine reports it (the dashboard shows it). */
  readonly adapter?: string;
  /** Bytes of GPU memory the engine holds (weights, slot state, activations), when reported. */
  readonly gpuMemoryBytes?: number;
  /** The weights' main quantization type (`IQ4_XS`, `Q8_0`), when reported. */
  readonly quant?: string;
  /** The model fingerprint (hex, engine/fingerprint.ts), when computed. */
  readonly fingerprint?: string;
  /** Layers of the model, when reported. */
  readonly nLayer?: number;
  /**
   * GPU pipelines the engine has compiled, when reported (after the warm-up, then as requests finish): the
   * warm-up compiles every shape a request can meet, so it should not grow while serving.
   */
  readonly pipelines?: number;
  /**
   * The engine's GPU readbacks by path, when reported (as requests finish): `early` read as soon as the GPU was
   * done, `awaited` through Deno's 10 ms poll (each staging buffer's first read, or early reads off), and
   * `fellBack` early reads the runtime refused (engine/gpu/readback.ts).
   */
  readonly readbacks?: { readonly early: number; readonly awaited: number; readonly fellBack: number };
  /**
   * Each slot's state, when the engine reports it; without it the dashboard shows the head's own view of
   * each request (tokens streamed so far) and the busy/queued counts.
   */
  readonly slots?: readonly {
    /** Slot index. */
    readonly slot: number;
    /** What the slot is doing. */
    readonly phase: "idle" | "prefilling" | "generating";
    /** Prompt tokens of its request. */
    readonly promptTokens: number;
    /** Prompt tokens prefilled so far (cached ones included). */
    readonly prefilledTokens: number;
    /** Tokens generated so far. */
    readonly generatedTokens: number;
    /** Milliseconds since its request was admitted. */
    readonly ageMs: number;
    /**
     * Ids per second since its first batch of ids (null before a second batch), when the engine reports it.
     */
    readonly tokPerS?: number | null;
  }[];
  /**
   * The pipeline's stages in layer order, when the model is split over boxes (the dashboard shows one
   * `local` stage without it).
   */
  readonly stages?: readonly {
    /** The box serving it: `local`, or a worker's `host:port`. */
    readonly box: string;
    /** Its layer range `[first, end)`. */
    readonly layers: readonly [number, number];
    /** Milliseconds of compute per decode step (null: no recent step). */
    readonly stepMs: number | null;
    /** Milliseconds on the wire per step, both ways (null: not measured). */
    readonly wireMs: number | null;
    /**
     * The link's state: `local` (same process), `up`, `slow`, `down`, `reconnecting` (a new connection is
     * being made) or `idle` (not connected yet: the head connects at its first request).
     */
    readonly link: "local" | "up" | "slow" | "down" | "reconnecting" | "idle";
    /**
     * Its compute per RUN frame (a decode step or a prompt piece) in ms, as the stage measured it: frames
     * counted, their total, the latest and the mean of the latest few, when reported.
     */
    readonly compute?: Readonly<Record<"count" | "totalMs" | "lastMs" | "recentMs", number>>;
    /**
     * The wire time per RUN frame of the hop into it (round trip minus compute), as `compute`, when measured;
     * with several workers the first one's holds every hop behind it.
     */
    readonly wire?: Readonly<Record<"count" | "totalMs" | "lastMs" | "recentMs", number>>;
    /** Why its link is down, when it is. */
    readonly error?: string;
  }[];
  /**
   * Drafted frames since start (`--draft`: a split head's frames, or the unsplit engine's): frames that
   * carried drafts, draft ids fed (proposed) and those the output matched (accepted), when the engine drafts.
   */
  readonly drafts?: { readonly frames: number; readonly proposed: number; readonly accepted: number };
}

/** Thrown by {@linkcode Engine.generate} when every slot is busy and the queue is full (HTTP 503). */
export class QueueFullError extends Error {
  /** Seconds a client should wait before retrying. */
  readonly retryAfterSeconds: number;
  /** Creates the error. */
  constructor(message: string, retryAfterSeconds: number) {
    super(message);
    this.name = "QueueFullError";
    this.retryAfterSeconds = retryAfterSeconds;
  }
}

/** The engine as the head sees it. */
export interface Engine {
  /** Current status (cheap; no GPU work). */
  status(): EngineStatus;
  /**
   * Admits the request into a free slot or the bounded FIFO queue and resolves when it ends.
   * @throws {QueueFullError} when the queue is full
   * @throws {RangeError} when the prompt plus one token does not fit the context (message has both numbers)
   */
  generate(req: GenerateRequest): Promise<GenerateResult>;
  /** Stops admitting; finishes (or cancels, when `cancel`) running requests; releases the GPU. */
  close(opts?: CloseOptions): Promise<void>;
}

/** How {@linkcode Engine.close} ends. */
export interface CloseOptions {
  /** Cancel running and queued requests instead of letting them finish. */
  readonly cancel?: boolean;
  /**
   * The process exits right after: the engine's buffers and file are released, but its worker thread is
   * left to the exit. A worker torn down while the process exits races the Vulkan driver's exit handlers
   * (lavapipe: SIGSEGV, exit code 139, in 7 of 50 probe exits on a loaded machine).
   */
  readonly exiting?: boolean;
}
