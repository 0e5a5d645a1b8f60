/**
 * Split serving, the head's side: {@linkcode SplitDecoder} implements the scheduler's {@linkcode SlotDecoder}
 * over the head's own first layer range (a {@linkcode Stage}) and the stages after it, reached through an
 * injected {@linkcode NextStage}. The engine defines only these interfaces; the link that implements them
 * over TCP lives in `wire/chain.ts`, and `cli/head.ts` passes it in (the engine never imports `wire/`).
 *
 * Per token the head runs its layers on the fed ids, sends the hidden rows (f32, bit for bit) to the next
 * stage, and the last stage answers the next id (argmax, ties to the lowest id) and, when asked, its top-k
 * (id, logit) pairs. Every remote operation (runs, snapshot save, restore and drop) goes out in the order the
 * scheduler made it, one at a time, so the far side applies them in the same order as the head.
 *
 * The chain may restart behind the head (a worker killed and started again): its state is then gone. Every
 * reply carries the link's `epoch` (raised at each new connection); a slot or snapshot whose remote state
 * belongs to an older epoch is rebuilt by replaying the tokens the head knows it holds ({@linkcode
 * StaleChainError} tells the decoder), so the scheduler's cached prefixes stay valid across a restart.
 * @module
 */
import type { BatchItem, GenerateResult, SlotDecoder } from "./decode.ts";
import { isGreedy } from "../sampling.ts";
import type { StageInput, StageOutput } from "./options.ts";
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
  /** StageOptions.kvF16 (the KV cache's element type, part of the state layout every stage must share). */
  readonly kvF16: boolean;
  /** Model fingerprint (engine/fingerprint.ts). */
  readonly fingerprint: string;
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
}

/**
 * The stages after the head's range, as one remote stage. Implemented over the wire by `wire/chain.ts`
 * (through the engine worker's message port in the service). Calls are made one at a time, in order.
 */
export interface NextStage {
  /** Runs rows through the rest of the chain. @throws {StaleChainError} on an epoch mismatch */
  run(req: NextRun): Promise<NextResult>;
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
}

/** The main-thread side of the chain the service drives (implemented by `wire/chain.ts`). */
export interface ChainClient extends NextStage {
  /** Called once the head's stage is loaded: what the head is (its hello). */
  attach(head: StageInfo): void;
  /** Connects unless connected (after the backoff, when the last attempt failed). @throws when it cannot */
  ready(): Promise<void>;
  /** Each stage behind the head. */
  stages(): ChainStageStatus[];
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
  run(slot: number, input: StageInput, base: number, opts?: { rows?: "all" | "last" }): Promise<StageOutput>;
  /** Saves `slot`'s state; returns the snapshot id. */
  snapshot(slot: number): number;
  /** Restores snapshot `id` into `slot`. */
  restore(id: number, slot: number): void;
}

/** Rows per remote run: a long prefill goes out in pieces (each within any sane frame limit). */
const FORWARD_ROWS = 256;

interface Snap {
  /** Tokens the snapshot holds. */
  readonly tokens: readonly number[];
  /** Remote snapshot and its connection, once saved. */
  remote?: { id: number; epoch: number };
}

/** The scheduler's slots over the head's stage and the chain behind it; see the module doc. */
export class SplitDecoder implements SlotDecoder {
  readonly #stage: SplitStage;
  readonly #next: NextStage;
  /** Tokens each slot holds (as far as the head knows; the head stage's length agrees). */
  readonly #held: number[][];
  /** Connection each slot's remote state lives on (undefined: none or unknown, replay before use). */
  readonly #epoch: (number | undefined)[];
  readonly #snaps = new Map<number, Snap>();
  /** Remote operations in scheduler order, one at a time. */
  #tail: Promise<unknown> = Promise.resolve();

  /**
   * Drives `stage` (layers `0:a`) followed by `next`.
   * @param stage the head's stage
   * @param next the rest of the chain
   */
  constructor(stage: SplitStage, next: NextStage) {
    this.#stage = stage;
    this.#next = next;
    this.#held = Array.from({ length: stage.states.nSlots }, () => []);
    this.#epoch = new Array(stage.states.nSlots).fill(undefined);
  }

  /** Positions per slot. */
  get nCtx(): number {
    return this.#stage.nCtx;
  }

  /** Slots. */
  get nSlots(): number {
    return this.#stage.states.nSlots;
  }

  /** False: a split decodes one slot per step (the pipelined multi-slot driver is not built yet). */
  get canBatch(): boolean {
    return false;
  }

  /** Bytes held by the head's snapshots. */
  get snapshotBytes(): number {
    return this.#stage.states.snapshotBytes;
  }

  /** Tokens held by `slot`. */
  length(slot: number): number {
    return this.#stage.length(slot);
  }

  /** Feeds `tokens` to `slot` at `base` (0 resets it) on the head and the chain. */
  prefill(slot: number, tokens: readonly number[], base: number): Promise<void> {
    return this.#queue(async () => {
      await this.#feed(slot, tokens, base, "none", 0);
    });
  }

  /** Saves `slot`'s state (head and chain) to a new snapshot; returns its id. */
  snapshot(slot: number): number {
    const id = this.#stage.snapshot(slot);
    const snap: Snap = { tokens: this.#held[slot]!.slice(0, this.#stage.length(slot)) };
    this.#snaps.set(id, snap);
    void this.#queue(async () => {
      const epoch = this.#epoch[slot];
      if (epoch === undefined) return;
      try {
        snap.remote = { id: await this.#next.snapshot(slot, epoch), epoch };
      } catch {
        // No remote copy: a restore of this snapshot replays its tokens instead (exact, only slower).
        snap.remote = undefined;
      }
    });
    return id;
  }

  /** Restores snapshot `id` into `slot` (head and chain). */
  restore(id: number, slot: number): void {
    const snap = this.#snaps.get(id);
    if (!snap) throw new RangeError(`Snapshot ${id} does not exist on this split head`);
    this.#stage.restore(id, slot);
    this.#held[slot] = [...snap.tokens];
    this.#epoch[slot] = undefined;
    void this.#queue(async () => {
      const r = snap.remote;
      if (!r) return;
      try {
        await this.#next.restore(r.id, slot, r.epoch);
        this.#epoch[slot] = r.epoch;
      } catch {
        // The chain restarted (or lost the snapshot): the next run on the slot replays its tokens.
        this.#epoch[slot] = undefined;
      }
    });
  }

  /** Frees snapshot `id` (head and chain). */
  drop(id: number): void {
    const snap = this.#snaps.get(id);
    this.#snaps.delete(id);
    this.#stage.states.drop(id);
    const r = snap?.remote;
    if (r) {
      void this.#queue(() => this.#next.drop(r.id, r.epoch).catch(() => {/* its connection is gone */}));
    }
  }

  /**
   * Generation on `items`, one after the other (canBatch is false, so the scheduler sends one). Greedy only:
   * sampling would need the last stage's GPU sampler and the seed and RNG step in the frame.
   * @throws {RangeError} on sampling settings other than greedy, or as Stage.run
   * @throws the chain's error when a stage fails or the link drops
   */
  generate(items: readonly BatchItem[]): Promise<GenerateResult[]> {
    return this.#queue(async () => {
      const out: GenerateResult[] = [];
      for (const it of items) out.push(await this.#generateOne(it));
      return out;
    });
  }

  async #generateOne(it: BatchItem): Promise<GenerateResult> {
    const { slot, opts: o } = it;
    const p = o.sampling;
    if (
      p && !(isGreedy(p) && p.repeatPenalty === 1 && p.presencePenalty === 0 && p.frequencyPenalty === 0)
    ) {
      throw new RangeError(
        `Split serving decodes greedily only: temperature ${p.temperature}, repeat/presence/frequency ` +
          `penalties ${p.repeatPenalty}/${p.presencePenalty}/${p.frequencyPenalty} need the last stage's ` +
          `sampler, which the split does not carry yet: send temperature 0 and no penalties`,
      );
    }
    const top = o.top ?? 0;
    if (!Number.isInteger(o.nNew) || o.nNew < 1) throw new RangeError(`nNew must be >= 1, got ${o.nNew}`);
    const base = o.base ?? 0;
    const start = base + it.prompt.length;
    const nNew = Math.min(o.nNew, this.#stage.nCtx - start + 1);
    const stops = new Set(o.stopIds ?? []);
    const tokens: number[] = [];
    const tops: [number, number][][] = [];
    let reason: GenerateResult["reason"] = nNew < o.nNew ? "context" : "length";
    let feed: readonly number[] = it.prompt;
    let pos = base;
    for (;;) {
      const r = await this.#feed(slot, feed, pos, "ids", top);
      pos += feed.length;
      const id = r.ids[0]!;
      tokens.push(id);
      if (top > 0) {
        tops.push(Array.from({ length: r.topIds.length }, (_, i) => [r.topIds[i]!, r.topLogits[i]!]));
      }
      o.onTokens?.([id]);
      if (stops.has(id)) {
        reason = "stop";
        break;
      }
      if (tokens.length >= nNew) break;
      if (o.signal?.aborted) {
        reason = "cancelled";
        break;
      }
      feed = [id];
    }
    return { tokens, top: tops, reason, steps: tokens.length - 1 };
  }

  /**
   * Runs `tokens` at `base` on the head's stage and the chain (replaying the slot's older tokens first when
   * its remote state is gone); the last piece asks `want`.
   */
  async #feed(
    slot: number,
    tokens: readonly number[],
    base: number,
    want: "none" | "ids",
    topK: number,
  ): Promise<NextResult> {
    if (base > 0 && this.#epoch[slot] === undefined) await this.#replay(slot, base);
    try {
      return await this.#forward(slot, tokens, base, want, topK);
    } catch (e) {
      if (!(e instanceof StaleChainError)) throw e;
      await this.#replay(slot, base);
      return await this.#forward(slot, tokens, base, want, topK);
    }
  }

  /** Rebuilds `slot`'s first `base` tokens on the head and the chain (after the chain restarted). */
  async #replay(slot: number, base: number): Promise<void> {
    const held = this.#held[slot]!.slice(0, base);
    if (held.length !== base) {
      throw new Error(
        `Internal error: slot ${slot} should hold ${base} tokens but the head knows ${held.length}`,
      );
    }
    this.#epoch[slot] = undefined;
    await this.#forward(slot, held, 0, "none", 0);
  }

  async #forward(
    slot: number,
    tokens: readonly number[],
    base: number,
    want: "none" | "ids",
    topK: number,
  ): Promise<NextResult> {
    const h = await this.#stage.run(slot, { tokens }, base, { rows: "all" });
    this.#held[slot] = [...this.#held[slot]!.slice(0, base), ...tokens];
    const nEmbd = h.data.length / tokens.length;
    let result: NextResult | undefined;
    try {
      for (let at = 0; at < tokens.length; at += FORWARD_ROWS) {
        const n = Math.min(FORWARD_ROWS, tokens.length - at);
        const last = at + n === tokens.length;
        const pos = base + at;
        result = await this.#next.run({
          slot,
          basePos: pos,
          rows: h.data.slice(at * nEmbd, (at + n) * nEmbd),
          want: last ? want : "none",
          topK: last ? topK : 0,
          epoch: pos === 0 ? undefined : this.#epoch[slot],
        });
        this.#epoch[slot] = result.epoch;
      }
    } catch (e) {
      if (!(e instanceof StaleChainError)) this.#epoch[slot] = undefined;
      throw e;
    }
    return result!;
  }

  /** Runs `f` after every remote operation queued before it. */
  #queue<T>(f: () => Promise<T>): Promise<T> {
    const p = this.#tail.then(f);
    this.#tail = p.catch(() => {});
    return p;
  }
}
