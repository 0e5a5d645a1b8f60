/**
 * The link to the next stage as the engine's {@linkcode ChainClient} (the head) and as a middle worker's
 * forwarder: connects lazily, reconnects with backoff after a failure, checks the whole chain at connect
 * ({@linkcode connectLink} runs {@linkcode checkWholeChain}), and counts connections in an `epoch` so that
 * state left on a dead connection is never used (engine/exec/split.ts replays it instead).
 *
 * A stage that cannot serve a run because its own next stage restarted since the slot's state was built
 * answers ERROR `backend` with a message starting {@linkcode STALE_MARK}; the link before it turns that into
 * {@linkcode StaleChainError}, which makes the head replay the slot's tokens.
 * @module
 */
import {
  type ChainClient,
  type ChainStageStatus,
  type NextBatchRun,
  type NextResult,
  type NextRun,
  type StageInfo,
  StaleChainError,
} from "../engine/mod.ts";
import { WireError } from "./errors.ts";
import {
  DEFAULT_MAX_FRAME_BYTES,
  MAX_HISTORY,
  type RunBatchRequest,
  type RunRequest,
  type RunResult,
  type WireSampling,
} from "./frame.ts";
import { type HelloInfo, PROTOCOL_VERSION } from "./hello.ts";
import { connectLink, type Link, type LinkAddress } from "./link.ts";
import { ChainTimes } from "./stats.ts";

/** Start of the message of a stage's ERROR when the slot's state behind it is gone (see the module doc). */
export const STALE_MARK = "Stale slot state:";
/**
 * The KV cache and recurrent state layout a stage allocates (engine/state.ts): the KV element type follows
 * StageOptions.kvF16, the recurrent state is f32. Stages of one chain must agree (hello check).
 */
export function stateLayout(kvF16: boolean): string {
  return `kv=${kvF16 ? "f16" : "f32"};ssm=f32`;
}
/**
 * Rows, drafts and top-k pairs a stage of this build accepts per frame. Drafts: at most 7, so a drafted run's
 * rows fit the mat-vec's 8 columns, where a chunk computes the bits of one-token steps (engine MAX_DRAFT).
 */
export const STAGE_LIMITS = {
  maxFrameBytes: DEFAULT_MAX_FRAME_BYTES,
  maxRows: 4096,
  maxDraft: 7,
  maxTopK: 64,
};

const BACKOFF_MIN_MS = 250;
const BACKOFF_MAX_MS = 2000;

/** The hello of a stage described by `info`. */
export function helloOf(
  info: StageInfo,
  opts: {
    build: { readonly version: string; readonly commit: string };
    last: boolean;
    downstream?: readonly HelloInfo[];
  },
): HelloInfo {
  return {
    protocol: PROTOCOL_VERSION,
    build: { version: opts.build.version, commit: opts.build.commit },
    arch: info.arch,
    layers: { ...info.layers },
    last: opts.last,
    nEmbd: info.nEmbd,
    nSlots: info.nSlots,
    nCtx: info.nCtx,
    stateLayout: stateLayout(info.kvF16),
    numerics: { int8Activations: info.int8Activations, int8Experts: info.int8Experts, hiddenDtype: "f32" },
    fingerprint: info.fingerprint,
    limits: STAGE_LIMITS,
    downstream: opts.downstream ?? [],
  };
}

/** Options of {@linkcode ChainLink}. */
export interface ChainLinkOptions {
  /** This build (the hello's `build`). */
  readonly build: { readonly version: string; readonly commit: string };
  /** Shared link key (`--link-key`). */
  readonly linkKey?: string;
  /** TLS with these extra CAs (`--tls-ca`). */
  readonly tls?: { readonly caCerts?: readonly string[] };
  /** Per-request reply timeout (wire default 30 s). */
  readonly timeoutMs?: number;
  /** Log lines (connects, failures); default `console.error`. */
  readonly log?: (line: string) => void;
  /**
   * Drafts per decode frame the head should send (`--draft`, 0..7; default 0), capped by every stage's
   * `limits.maxDraft`; told to the decoder with each run's result ({@linkcode NextResult.draft}).
   */
  readonly draft?: number;
}

/** The link to the next stage; see the module doc. */
export class ChainLink implements ChainClient {
  /** Where the next stage listens. */
  readonly address: LinkAddress;
  readonly #opts: ChainLinkOptions;
  readonly #name: string;
  readonly #log: (line: string) => void;
  #self: HelloInfo | undefined;
  #link: Link | undefined;
  #peer: HelloInfo | undefined;
  #epoch = 0;
  #connecting: Promise<Link> | undefined;
  #retryAtMs = 0;
  #backoffMs = BACKOFF_MIN_MS;
  /** The link whose reply timeout already set a backoff (once per dropped link). */
  #stalled: Link | undefined;
  #lastError: string | undefined;
  #closed = false;
  readonly #times = new ChainTimes();

  /** A link to `address`, not yet connected (call {@linkcode attach} first). */
  constructor(address: LinkAddress, opts: ChainLinkOptions) {
    this.address = address;
    this.#opts = opts;
    this.#name = `worker ${address.hostname}:${address.port}`;
    this.#log = opts.log ?? ((line) => console.error(line));
  }

  /** Sets this side's hello (the head's, or a middle worker's own with its downstream left empty). */
  attach(self: StageInfo): void {
    this.#self = helloOf(self, { build: this.#opts.build, last: false });
  }

  /** Connections made so far (state on an older one is gone). */
  get epoch(): number {
    return this.#epoch;
  }

  /** The next stage's hello, as of the latest connection (kept while down). */
  get peer(): HelloInfo | undefined {
    return this.#peer;
  }

  /** Drafts per frame the head may send: the `draft` option within every stage's `limits.maxDraft`. */
  get draft(): number {
    const peer = this.#peer;
    const want = this.#opts.draft ?? 0;
    if (!peer || want === 0) return 0;
    return Math.min(want, peer.limits.maxDraft, ...peer.downstream.map((h) => h.limits.maxDraft));
  }

  /** True while connected. */
  get isUp(): boolean {
    return this.#link !== undefined && !this.#link.isClosed;
  }

  /** Connects unless connected. @throws {WireError} when the next stage is down or refuses the chain */
  async ready(): Promise<void> {
    await this.#ensure();
  }

  async #ensure(): Promise<Link> {
    if (this.#link && !this.#link.isClosed) return this.#link;
    if (this.#connecting) return await this.#connecting;
    if (this.#closed) throw new WireError("closed", `The link to ${this.#name} is closed`);
    const self = this.#self;
    if (!self) throw new Error("Internal error: ChainLink used before attach()");
    const now = performance.now();
    // A link dropped because the stage stopped answering: the stage counts as down, as after a refused connect,
    // so the next attempt waits one backoff step instead of meeting the stalled peer's handshake timeout
    // inside the request that just timed out.
    const dropped = this.#link?.closedWith;
    if (dropped?.code === "timeout" && this.#stalled !== this.#link) {
      this.#stalled = this.#link;
      this.#lastError = dropped.message;
      this.#retryAtMs = now + this.#backoffMs;
      this.#backoffMs = Math.min(BACKOFF_MAX_MS, this.#backoffMs * 2);
    }
    if (now < this.#retryAtMs) {
      throw new WireError(
        "closed",
        `${this.#name} is down (${this.#lastError}); next attempt in ${
          Math.ceil((this.#retryAtMs - now) / 100) / 10
        } s`,
      );
    }
    this.#connecting = (async () => {
      try {
        const link = await connectLink(this.address, {
          hello: self,
          linkKey: this.#opts.linkKey,
          tls: this.#opts.tls,
          timeoutMs: this.#opts.timeoutMs,
          peerName: this.#name,
          selfName: `this stage (layers ${self.layers.first}:${self.layers.end})`,
        });
        this.#link = link;
        this.#peer = link.peer;
        this.#epoch++;
        this.#backoffMs = BACKOFF_MIN_MS;
        this.#retryAtMs = 0;
        this.#lastError = undefined;
        const chain = [link.peer, ...link.peer.downstream].map((h) => `${h.layers.first}:${h.layers.end}`);
        this.#log(`Connected to ${this.#name}: chain layers ${chain.join(" → ")}`);
        void link.closed.then((e) => {
          if (this.#link !== link || this.#closed) return;
          this.#lastError = e?.message ?? "closed";
          this.#log(`Link to ${this.#name} closed: ${this.#lastError}`);
        });
        return link;
      } catch (e) {
        this.#lastError = e instanceof Error ? e.message : String(e);
        this.#retryAtMs = performance.now() + this.#backoffMs;
        this.#backoffMs = Math.min(BACKOFF_MAX_MS, this.#backoffMs * 2);
        this.#log(`Cannot reach ${this.#name}: ${this.#lastError}`);
        throw e;
      } finally {
        this.#connecting = undefined;
      }
    })();
    return await this.#connecting;
  }

  /** Fails with StaleChainError unless connection `epoch` is the live one (connecting first if needed). */
  async #live(epoch: number | undefined, what: string): Promise<Link> {
    const link = await this.#ensure();
    if (epoch !== undefined && epoch !== this.#epoch) {
      throw new StaleChainError(
        `${STALE_MARK} ${what}: its state was on connection ${epoch} to ${this.#name}, now ${this.#epoch}`,
      );
    }
    return link;
  }

  /**
   * Sends a RUN on connection `epoch` (any when undefined) and returns its result and the connection.
   * @throws {StaleChainError} on an epoch mismatch, or when the next stage reports stale state itself
   * @throws {WireError} when the link fails or the stage refuses the run
   */
  async forward(
    req: RunRequest,
    epoch: number | undefined,
  ): Promise<{ result: RunResult; epoch: number; roundTripUs: number }> {
    const link = await this.#live(epoch, `run of slot ${req.slot}`);
    const at = this.#epoch;
    try {
      const t0 = performance.now();
      const result = await link.run(req);
      return { result, epoch: at, roundTripUs: Math.round((performance.now() - t0) * 1000) };
    } catch (e) {
      throw stale(e);
    }
  }

  /**
   * Sends a RUN_BATCH on connection `epoch` and returns its result and the connection.
   * @throws {StaleChainError} on an epoch mismatch, or when the next stage reports stale state itself
   * @throws {WireError} when the link fails or the stage refuses the run
   */
  async forwardBatch(
    req: RunBatchRequest,
    epoch: number,
  ): Promise<{ result: RunResult; epoch: number; roundTripUs: number }> {
    const link = await this.#live(epoch, `batched run of slots ${req.entries.map((e) => e.slot).join(",")}`);
    const at = this.#epoch;
    try {
      const t0 = performance.now();
      const result = await link.runBatch(req);
      return { result, epoch: at, roundTripUs: Math.round((performance.now() - t0) * 1000) };
    } catch (e) {
      throw stale(e);
    }
  }

  /** One row per slot through the rest of the chain as one batched frame (ChainClient). */
  async runBatch(req: NextBatchRun): Promise<NextResult> {
    const self = this.#self;
    if (!self) throw new Error("Internal error: ChainLink used before attach()");
    const { result, epoch, roundTripUs } = await this.forwardBatch({
      entries: req.entries.map((e) => ({
        slot: e.slot,
        basePos: e.basePos,
        ...(e.sampling ? { sampling: wireSampling(e.sampling) } : {}),
      })),
      nEmbd: self.nEmbd,
      rows: req.rows,
      dtype: "f32",
      want: "ids",
      topK: req.topK,
    }, req.epoch);
    this.#times.record({ headUs: req.headUs, timesUs: result.timesUs, roundTripUs });
    if (result.kind !== "ids" || result.ids.length !== req.entries.length) {
      throw new WireError("unexpected", `${this.#name} answered a batched run without one id per slot`);
    }
    return {
      epoch,
      ids: result.ids,
      topIds: result.topIds,
      topLogits: result.topLogits,
      timesUs: result.timesUs,
    };
  }

  /** Runs rows through the rest of the chain (ChainClient). */
  async run(req: NextRun): Promise<NextResult> {
    const self = this.#self;
    if (!self) throw new Error("Internal error: ChainLink used before attach()");
    const { result, epoch, roundTripUs } = await this.forward({
      slot: req.slot,
      basePos: req.basePos,
      nEmbd: self.nEmbd,
      rows: req.rows,
      dtype: "f32",
      want: req.want,
      topK: req.topK,
      drafts: Uint32Array.from(req.drafts ?? []),
      ...(req.sampling ? { sampling: wireSampling(req.sampling) } : {}),
    }, req.epoch);
    this.#times.record({ headUs: req.headUs, timesUs: result.timesUs, roundTripUs });
    switch (result.kind) {
      case "ids":
        return {
          epoch,
          ids: result.ids,
          topIds: result.topIds,
          topLogits: result.topLogits,
          timesUs: result.timesUs,
          draft: this.draft,
        };
      case "none":
        return {
          epoch,
          ids: new Uint32Array(0),
          topIds: new Uint32Array(0),
          topLogits: new Float32Array(0),
          timesUs: result.timesUs,
        };
      case "hidden":
        throw new WireError("unexpected", `${this.#name} answered a run with hidden rows, not ids`);
      default: {
        const never: never = result;
        throw new Error(`Internal error: unknown result ${JSON.stringify(never)}`);
      }
    }
  }

  /** Saves `slot` on the next stage (connection `epoch`); returns its snapshot id. */
  async snapshot(slot: number, epoch: number): Promise<number> {
    const link = await this.#live(epoch, `snapshot of slot ${slot}`);
    return await link.snapshotSave(slot).catch((e) => Promise.reject(stale(e)));
  }

  /** Restores snapshot `id` (of connection `epoch`) into `slot` on the next stage. */
  async restore(id: number, slot: number, epoch: number): Promise<void> {
    const link = await this.#live(epoch, `restore of snapshot ${id}`);
    await link.snapshotRestore(id, slot).catch((e) => Promise.reject(stale(e)));
  }

  /** Frees snapshot `id` on the next stage; nothing when its connection is gone. */
  async drop(id: number, epoch: number): Promise<void> {
    if (epoch !== this.#epoch || !this.#link || this.#link.isClosed) return;
    await this.#link.snapshotDrop(id);
  }

  /** Empties `slot` on the next stage. */
  async reset(slot: number): Promise<void> {
    const link = await this.#ensure();
    await link.reset(slot);
  }

  /**
   * The next stage and those behind it, for `/health`, `/metrics` and the dashboard: state, layers, and the
   * compute and wire times of the RUN frames this head sent (wire only for the hop into the next stage, which
   * then holds the wire time of every hop behind it too: a middle worker reports only its compute).
   */
  stages(): ChainStageStatus[] {
    const state = this.isUp ? "up" : this.#lastError !== undefined ? "down" : "idle";
    const connecting = this.#connecting !== undefined;
    const times = (i: number) => {
      const compute = this.#times.compute(i);
      const wire = this.#times.wire(i);
      return { ...(compute ? { compute } : {}), ...(wire ? { wire } : {}) };
    };
    const first: ChainStageStatus = {
      address: `${this.address.hostname}:${this.address.port}`,
      state,
      ...(this.#peer ? { layers: this.#peer.layers } : {}),
      ...(state === "down" ? { error: this.#lastError } : {}),
      ...(connecting ? { connecting } : {}),
      ...times(1),
    };
    const rest = (this.#peer?.downstream ?? []).map((h, i): ChainStageStatus => ({
      address: `behind ${first.address} (${i + 1})`,
      state: state === "up" ? "up" : "idle",
      layers: h.layers,
      ...times(i + 2),
    }));
    return [first, ...rest];
  }

  /** The head's own range as a stage (its compute as the split decoder reported it with each run). */
  head(): ChainStageStatus {
    const self = this.#self;
    const compute = this.#times.compute(0);
    return {
      address: "head",
      state: "up",
      ...(self ? { layers: self.layers } : {}),
      ...(compute ? { compute } : {}),
    };
  }

  /** Closes the link for good. */
  async close(): Promise<void> {
    this.#closed = true;
    await this.#link?.close("the stage is shutting down");
  }
}

/**
 * A run's sampler settings as the RUN's sampling block: always with HISTORY (the last MAX_HISTORY ids), so the
 * last stage's draw never depends on what earlier runs, restores or replays left there.
 */
function wireSampling(s: NonNullable<NextRun["sampling"]>): WireSampling {
  const p = s.params;
  return {
    temperature: p.temperature,
    topK: p.topK,
    topP: p.topP,
    minP: p.minP,
    repeatPenalty: p.repeatPenalty,
    presencePenalty: p.presencePenalty,
    frequencyPenalty: p.frequencyPenalty,
    penaltyLastN: p.penaltyLastN,
    seed: p.seed,
    step: s.step,
    history: Uint32Array.from(s.history.slice(-MAX_HISTORY)),
  };
}

/** A WireError whose message carries {@linkcode STALE_MARK} as StaleChainError; others unchanged. */
function stale(e: unknown): unknown {
  return e instanceof WireError && e.code === "backend" && e.message.includes(STALE_MARK)
    ? new StaleChainError(e.message)
    : e;
}
