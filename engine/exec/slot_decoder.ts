/**
 * The slot decoder contract: what the service's scheduler (`engine/serve/_runner.ts`) drives, implemented by
 * the local decode driver (`decode.ts`) and by a split chain (`split.ts`), with its options, items and
 * results.
 * @module
 */
import type { SamplingParams } from "../sampling.ts";

/** Options of one sequence's generation (`DecodeDriver.generate`). */
export interface GenerateOptions {
  /** Tokens to generate (≥ 1). */
  readonly nNew: number;
  /** Also return the `top` highest logits of every step (1..64; 0 = none). */
  readonly top?: number;
  /** Token ids that end generation (included in the output); later tokens are dropped. */
  readonly stopIds?: readonly number[];
  /**
   * Sampling on the GPU (penalties → top-k → top-p → min-p → temperature → seeded draw); absent or greedy
   * (temperature 0, top_k 1): the argmax path, ties to the lowest id.
   */
  readonly sampling?: SamplingParams;
  /** Sampler RNG step to start at (a request continued over several calls keeps one random stream). */
  readonly samplerStep?: number;
  /** Ids the penalties look back on (default: the prompt); the last 256 are kept. */
  readonly samplerHistory?: readonly number[];
  /** Decode steps per readback (ids stream back in batches of this many; default 8). */
  readonly batch?: number;
  /** Called with each batch of new ids as they land. */
  readonly onTokens?: (ids: readonly number[]) => void;
  /**
   * Called as the prompt prefills, after each chunk the GPU has finished but the last: `doneTokens` of the
   * `promptTokens` of `prompt` (its first id then follows). With it the chunks go in one at a time, each
   * submitted once the one before has finished (no buffer is mapped; see DecodeDriver.prefill).
   */
  readonly onPrefill?: (doneTokens: number, promptTokens: number) => void;
  /**
   * Continue the slot's sequence: `prompt` is appended at this position, which must equal the slot's length
   * (default 0: the slot is reset and `prompt` is the whole sequence).
   */
  readonly base?: number;
  /**
   * Continue a sequence a previous call returned `paused`: `prompt` is exactly its last returned id (not
   * yet fed) at `base` = the slot's length. The driver feeds that id in the first decode step instead of
   * prefilling it (no prefill readback; the sampler state comes from `samplerStep` and `samplerHistory`);
   * the ids are the same either way, so a decoder without this path may prefill `prompt` as any
   * continuation. The id is not returned again.
   */
  readonly resume?: boolean;
  /**
   * Snapshot the slot at this position of the prompt's prefill (base < snapAt <= base + prompt length; not
   * with `resume`): the result's `snapshot` is its id, where the decoder takes one
   * ({@linkcode SlotDecoder.snapInPrefill}).
   */
  readonly snapAt?: number;
  /**
   * Ends generation after the batch that is landing when it fires (a stop string matched, a client left);
   * the tokens emitted so far are kept and the slot state is rewound to match them exactly.
   */
  readonly signal?: AbortSignal;
}

/**
 * Why a generation ended: a stop id, the token budget, the context's end, or a cancel (signal, client gone).
 */
export type FinishReason = "stop" | "length" | "context" | "cancelled";

/**
 * The end of one sequence's generation, the part every layer reports alike: the decode driver's
 * {@linkcode GenerateResult}, the engine worker's job result and the Engine contract's result (which add what
 * their layer knows: logits, slot and cache use, timings) all extend it.
 */
export interface Generated {
  /** Generated ids, in order, ending at a stop id when one was hit. */
  readonly tokens: readonly number[];
  /** Why generation ended. */
  readonly reason: FinishReason;
}

/** Result of one sequence's generation on a slot. */
export interface GenerateResult extends Generated {
  /** Generated ids, ending at a stop id when one was hit. */
  readonly tokens: number[];
  /** Per generated token, the `top` highest `[id, logit]` pairs of its step, highest first. */
  readonly top: [number, number][][];
  /** Decode steps run (≥ tokens − 1: steps past a stop are dropped and the state is rewound). */
  readonly steps: number;
  /**
   * True when the call returned at a pause before this sequence ended (`reason` is then not final): the
   * slot holds every returned id but the last; continue with `resume`.
   */
  readonly paused?: boolean;
  /** The id of the snapshot `snapAt` asked for (the caller owns it: `drop` frees it). */
  readonly snapshot?: number;
}

/** One slot's request in a generate call. */
export interface BatchItem {
  /** The slot it runs on (distinct per call). */
  readonly slot: number;
  /** Tokens appended at `opts.base` (the whole sequence when base is 0). */
  readonly prompt: readonly number[];
  /** Its generation options; `batch` is the call's. */
  readonly opts: GenerateOptions;
}

/**
 * The slots of a model as the service's scheduler drives them: prefill, generate (one or several slots per
 * step), and snapshots for prefix reuse. The local `DecodeDriver` (decode.ts) implements it over one whole-model
 * stage; a split implements it over a chain of stages.
 */
export interface SlotDecoder {
  /** Positions per slot. */
  readonly nCtx: number;
  /** Slots. */
  readonly nSlots: number;
  /** Whether several slots can decode in one step. */
  readonly canBatch: boolean;
  /** Bytes held by snapshots. */
  readonly snapshotBytes: number;
  /** Tokens held by `slot`. */
  length(slot: number): number;
  /**
   * Feeds `tokens` to `slot` at position `base` (0 resets it); no output. With `snapAt` (base < snapAt <= base
   * + tokens; a decoder with {@linkcode SlotDecoder.snapInPrefill}) it also snapshots the slot at that
   * position and returns the snapshot's id.
   */
  prefill(
    slot: number,
    tokens: readonly number[],
    base: number,
    snapAt?: number,
  ): Promise<number | undefined | void>;
  /**
   * Whether `prefill` and `generate` take a snapshot at a position inside the prompt (`snapAt`) in the same
   * passes (a DeltaNet layer's state at that point comes from its tap). Without it a caller ends a prefill at
   * the point and calls `snapshot`.
   */
  readonly snapInPrefill?: boolean;
  /** Where a prompt piece can run a few layers at a time (`prefillPart`): its layers and widest piece. */
  readonly parts?: { readonly layers: readonly [number, number]; readonly maxTokens: number };
  /**
   * `prefill` of one piece (at most `parts.maxTokens`) through `layers` only: a piece's parts run in order
   * from the first layer to the last with the same tokens and base, other slots' steps between them; the
   * slot holds the tokens once the last part is queued.
   */
  prefillPart?(
    slot: number,
    tokens: readonly number[],
    base: number,
    layers: readonly [number, number],
  ): Promise<void>;
  /**
   * Idle-time work, asked while the scheduler holds no request: prepares one slot the way another was
   * prepared for its last request (its chunk graph of a recent width, its solo decode step), so that the next
   * request there builds nothing before its prefill. Returns whether it did any (false: nothing left).
   * @param order the slots in the order the next requests take them (the scheduler's least recently used
   *   first): each is prepared whole before the next; default 0, 1, ...
   */
  warmIdle?(order?: readonly number[]): Promise<boolean>;
  /** Saves `slot`'s state to a new snapshot; returns its id. */
  snapshot(slot: number): number;
  /** Restores snapshot `id` into `slot`. */
  restore(id: number, slot: number): void;
  /** Frees snapshot `id`. */
  drop(id: number): void;
  /**
   * Generation on 1..MAX_BATCH_SLOTS slots (see `DecodeDriver.generate` in decode.ts). A decoder may ignore
   * `pause` (the call then runs every sequence to its end) and `resume` (it prefills the id instead).
   */
  generate(
    items: readonly BatchItem[],
    opts?: { batch?: number; pause?: () => boolean },
  ): Promise<GenerateResult[]>;
}
