/**
 * The split's interfaces (engine/exec/split.ts is the module that exports them): what a stage says about
 * itself, the chain behind the head (`NextStage`, `ChainClient`, implemented by `wire/chain.ts`), its runs and
 * results, and what the split decoder needs of the head's stage. A file of their own so that the decoder's
 * parts (split.ts, _split_pipe.ts) share them without importing each other.
 * @module
 */
import type { SamplingParams } from "../sampling.ts";
import type { StageInput, StageOutput } from "./options.ts";
import type { PendingRun } from "./_stage_run.ts";
import type { SlotStates } from "../state.ts";

/** What a stage says about itself to the stages around it (the wire hello is built from it). */
export interface StageInfo {
  /** GGUF `general.architecture`. */
  readonly arch: string;
  /** This stage's layers `[first, end)` of `total`. */
  readonly layers: { readonly first: number; readonly end: number; readonly total: number };
  /** Embedding width (hidden row length). */
  readonly nEmbd: number;
  /** Slots. */
  readonly nSlots: number;
  /** Positions per slot. */
  readonly nCtx: number;
  /** StageOptions.int8Activations. */
  readonly int8Activations: boolean;
  /** StageOptions.int8Experts (true with int8Activations). */
  readonly int8Experts: boolean;
  /** StageOptions.kvF16 (the KV cache's element type, part of the state layout every stage must share). */
  readonly kvF16: boolean;
  /** Model fingerprint (engine/fingerprint.ts). */
  readonly fingerprint: string;
}

/** What {@linkcode stageInfo} reads of a stage (engine/exec/stage.ts's Stage has it all). */
export interface StageInfoSource {
  /** Its layer range `[first, end)`. */
  readonly layers: readonly [number, number];
  /** The model's layer count and embedding width. */
  readonly hp: { readonly nLayer: number; readonly nEmbd: number };
  /** Its slots. */
  readonly states: { readonly nSlots: number };
  /** Positions per slot. */
  readonly nCtx: number;
  /** StageOptions.int8Activations. */
  readonly int8Activations: boolean;
  /** StageOptions.int8Experts. */
  readonly int8Experts: boolean;
  /** StageOptions.kvF16. */
  readonly kvF16: boolean;
  /** Model fingerprint. */
  readonly fingerprint: string;
}

/** What `stage` says about itself in a split's hello (the head's Worker and a worker's backend alike). */
export function stageInfo(stage: StageInfoSource, arch: string): StageInfo {
  return {
    arch,
    layers: { first: stage.layers[0], end: stage.layers[1], total: stage.hp.nLayer },
    nEmbd: stage.hp.nEmbd,
    nSlots: stage.states.nSlots,
    nCtx: stage.nCtx,
    int8Activations: stage.int8Activations,
    int8Experts: stage.int8Experts,
    kvF16: stage.kvF16,
    fingerprint: stage.fingerprint,
  };
}

/** One run through the stages after the head. */
export interface NextRun {
  /** Slot. */
  readonly slot: number;
  /** Position of the first row. */
  readonly basePos: number;
  /** Hidden rows `nRows × nEmbd` f32 (the head's output). */
  readonly rows: Float32Array;
  /** `ids`: the last row's next id (and top-k); `none`: only advance the state (prefill). */
  readonly want: "none" | "ids";
  /** (id, logit) pairs wanted with the id (0: none). */
  readonly topK: number;
  /**
   * The chain connection the slot's remote state lives on; when the link's epoch differs the run is not sent
   * and fails with {@linkcode StaleChainError}. Absent for a run from position 0 (it needs no old state).
   */
  readonly epoch?: number;
  /**
   * Draft ids (with `want: "ids"`): the last `drafts.length + 1` rows each produce an id; `drafts[j]` is the
   * token fed at row `nRows - drafts.length + j`. Absent: none.
   */
  readonly drafts?: readonly number[];
  /**
   * The last stage's sampler (absent: argmax), as docs/WIRE.md's sampling block: the request's settings, the
   * RNG step of the run's first id (ids the request drew before it), and the penalty history before that id,
   * oldest first (at most the last 256 ids).
   */
  readonly sampling?: {
    readonly params: SamplingParams;
    readonly step: number;
    readonly history: readonly number[];
  };
  /**
   * The head's own compute time in µs for these rows (its `Stage.run`, readback included, and any rollback
   * re-run before it), on the first remote run of a fed piece; absent on the later ones. For the per-stage
   * times of `/metrics` and the dashboard.
   */
  readonly headUs?: number;
}

/** {@linkcode NextRun.sampling}. */
export type NextSampling = NonNullable<NextRun["sampling"]>;

/**
 * One decode row per slot through the stages after the head, as one batched frame (each stage runs the rows
 * as one batched step; the last answers one id per entry, in entry order, each drawn with its settings).
 */
export interface NextBatchRun {
  /** Per row: its slot, position (the slot's length) and the last stage's sampler (absent: argmax). */
  readonly entries: readonly {
    readonly slot: number;
    readonly basePos: number;
    readonly sampling?: NextSampling;
  }[];
  /** Hidden rows `entries.length × nEmbd` f32 (the head's output). */
  readonly rows: Float32Array;
  /** (id, logit) pairs wanted per id (0: none). */
  readonly topK: number;
  /** The chain connection every entry's remote state lives on (else {@linkcode StaleChainError}). */
  readonly epoch: number;
  /** The head's compute time in µs for these rows (see {@linkcode NextRun.headUs}). */
  readonly headUs?: number;
}

/** What {@linkcode NextStage.run} answers. */
export interface NextResult {
  /** The link connection that served it. */
  readonly epoch: number;
  /** The produced id (empty for `want: "none"`). */
  readonly ids: Uint32Array;
  /** Top-k candidate ids, best first. */
  readonly topIds: Uint32Array;
  /** Their logits. */
  readonly topLogits: Float32Array;
  /** Each stage's own compute time in µs, nearest first. */
  readonly timesUs: readonly number[];
  /**
   * Drafts per frame the chain takes from now on (the head's `--draft`, within every stage's limit), when the
   * link sets it: how the head's option reaches the decoder, which runs in the engine's Worker.
   */
  readonly draft?: number;
}

/**
 * The stages after the head's range, as one remote stage. Implemented over the wire by `wire/chain.ts`
 * (through the engine worker's message port in the service). Calls are made one at a time, in order.
 */
export interface NextStage {
  /** Runs rows through the rest of the chain. @throws {StaleChainError} on an epoch mismatch */
  run(req: NextRun): Promise<NextResult>;
  /**
   * Runs one row per slot as one batched frame (ids: one per entry; top-k: `topK` pairs per id); absent, the
   * decoder sends a run per slot. @throws {StaleChainError} on an epoch mismatch
   */
  runBatch?(req: NextBatchRun): Promise<NextResult>;
  /** Saves `slot`'s remote state (of connection `epoch`). @throws {StaleChainError} on an epoch mismatch */
  snapshot(slot: number, epoch: number): Promise<number>;
  /** Restores remote snapshot `id` (of connection `epoch`) into `slot`. @throws {StaleChainError} as above */
  restore(id: number, slot: number, epoch: number): Promise<void>;
  /** Frees remote snapshot `id` (nothing when its connection is gone). */
  drop(id: number, epoch: number): Promise<void>;
}

/** Health of one stage of the chain, for `/health`. */
export interface ChainStageStatus {
  /** Where it listens (`HOST:PORT`), or `head` for the head's own range. */
  readonly address: string;
  /** `up` connected, `down` last connect or link failed, `idle` not connected yet. */
  readonly state: "up" | "down" | "idle";
  /** Its layers, when known (from its hello). */
  readonly layers?: { readonly first: number; readonly end: number; readonly total: number };
  /** Why it is down. */
  readonly error?: string;
  /** True while a (re)connection attempt to it is under way. */
  readonly connecting?: boolean;
  /**
   * Its own compute per RUN frame (a decode step or a prompt piece), as the stage measured it, in ms: frames
   * counted, their total, the latest, and the mean of the latest few; absent when not measured.
   */
  readonly compute?: Readonly<Record<"count" | "totalMs" | "lastMs" | "recentMs", number>>;
  /**
   * Wire time per RUN frame of the hop into this stage, in ms (both ways: the round trip seen by the stage
   * before it minus the compute of this stage and those after it), as `compute`; absent when not measured.
   */
  readonly wire?: Readonly<Record<"count" | "totalMs" | "lastMs" | "recentMs", number>>;
}

/** The main-thread side of the chain the service drives (implemented by `wire/chain.ts`). */
export interface ChainClient extends NextStage {
  /** Called once the head's stage is loaded: what the head is (its hello). */
  attach(head: StageInfo): void;
  /** Connects unless connected (after the backoff, when the last attempt failed). @throws when it cannot */
  ready(): Promise<void>;
  /** Each stage behind the head. */
  stages(): ChainStageStatus[];
  /**
   * The head's own range as a stage (address `head`, state `up`), with its compute per RUN frame as
   * {@linkcode NextRun.headUs} reported it; optional (a client that does not measure leaves it out).
   */
  head?(): ChainStageStatus;
  /** Closes the link. */
  close(): Promise<void>;
}

/** Thrown by a {@linkcode NextStage} when a request names a chain connection that is gone. */
export class StaleChainError extends Error {
  /** Creates the error. */
  constructor(message: string) {
    super(message);
    this.name = "StaleChainError";
  }
}

/** What the split decoder needs of the head's stage (a {@linkcode Stage} of layers `0:a`). */
export interface SplitStage {
  /** Positions per slot. */
  readonly nCtx: number;
  /** The stage's slot states (snapshots are dropped through it). */
  readonly states: SlotStates;
  /** Tokens held by `slot`. */
  length(slot: number): number;
  /** Runs `input` on `slot` from position `base` (see Stage.run). */
  run(
    slot: number,
    input: StageInput,
    base: number,
    opts?: { rows?: "all" | "last" | "none"; chunk?: number },
  ): Promise<StageOutput>;
  /** Whether `runBatch` can run several slots in one step (Stage.canBatch). */
  readonly canBatch?: boolean;
  /** One row per slot of `slots` at its length in one batched step (Stage.runBatch); absent: a run each. */
  runBatch?(slots: readonly number[], input: StageInput): Promise<StageOutput>;
  /** `runBatch` resolving once submitted, its output pending (Stage.submitBatch); absent: `runBatch`. */
  submitBatch?(slots: readonly number[], input: StageInput): Promise<PendingRun>;
  /** Saves `slot`'s state; returns the snapshot id. */
  snapshot(slot: number): number;
  /** Restores snapshot `id` into `slot`. */
  restore(id: number, slot: number): void;
  /** Phase times (Stage.profile): the pipelined driver adds its `pipe.*` phases here. */
  readonly profile?: { add(phase: string, ms: number): void };
}

/** What a fed run asks of the chain besides its rows. */
export interface FeedExtra {
  readonly want: "none" | "ids";
  readonly topK: number;
  readonly drafts?: readonly number[];
  readonly sampling?: NextSampling;
}
