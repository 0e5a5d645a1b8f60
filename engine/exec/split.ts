/**
 * Split serving, the head's side: {@linkcode SplitDecoder} implements the scheduler's {@linkcode SlotDecoder}
 * over the head's own first layer range (a {@linkcode Stage}) and the stages after it, reached through an
 * injected {@linkcode NextStage}. The engine defines only these interfaces; the link that implements them
 * over TCP lives in `wire/chain.ts`, and `cli/head.ts` passes it in (the engine never imports `wire/`).
 *
 * Per token the head runs its layers on the fed ids, sends the hidden rows (f32, bit for bit) to the next
 * stage, and the last stage answers the next id (argmax, ties to the lowest id, or the GPU sampler with the
 * request's settings, seed, RNG step and penalty history carried in the run: the unsplit engine's draw, bit for
 * bit) and, when asked, its top-k (id, logit) pairs. Every remote operation (runs, snapshot save, restore and
 * drop) goes out in the order the scheduler made it, one at a time, so the far side applies them in the same
 * order as the head.
 *
 * Drafts (`draft` > 0): a decode frame carries the fed id plus up to `draft` ids guessed by prompt lookup
 * ({@linkcode lookupDrafts}: the slot's own history), and the last stage answers one id per fed row. The head
 * keeps ids up to the first that differs from its draft (sampled or greedy, each row is the draw the undrafted
 * run makes there, so the output is the same with drafts on or off). Every stage snapshots a slot before a
 * drafted run (its "anchor") and keeps the run's input; a later run of that slot at a position inside the
 * drafted rows rolls back: restore the anchor, re-run the kept rows up to that position, then run the new rows.
 * So a rejection costs no extra round trip (the next frame carries the rollback), and a generation that ends
 * inside a drafted frame re-sends the kept rows once to settle every stage.
 *
 * The chain may restart behind the head (a worker killed and started again): its state is then gone. Every
 * reply carries the link's `epoch` (raised at each new connection); a slot or snapshot whose remote state
 * belongs to an older epoch is rebuilt by replaying the tokens the head knows it holds ({@linkcode
 * StaleChainError} tells the decoder), so the scheduler's cached prefixes stay valid across a restart.
 * @module
 */
import type { BatchItem, GenerateResult, SlotDecoder } from "./slot_decoder.ts";
import { isGreedy, SAMPLE_HIST } from "../sampling.ts";
import type { StageOutput } from "./options.ts";
import { type DraftCache, lookupDrafts } from "./draft_cache.ts";
import { generateMany, MAX_GROUPS, type PipeParts } from "./_split_pipe.ts";
import {
  type FeedExtra,
  type NextResult,
  type NextStage,
  type SplitStage,
  StaleChainError,
} from "./_split_api.ts";

export { lookupDrafts } from "./draft_cache.ts";
export {
  type ChainClient,
  type ChainStageStatus,
  type FeedExtra,
  type NextBatchRun,
  type NextResult,
  type NextRun,
  type NextSampling,
  type NextStage,
  type SplitStage,
  type StageInfo,
  stageInfo,
  type StageInfoSource,
  StaleChainError,
} from "./_split_api.ts";

/** Rows per remote run: a long prefill goes out in pieces (each within any sane frame limit). */
const FORWARD_ROWS = 256;

/**
 * Most drafts per frame: a drafted frame's rows (1 + drafts) must be at most the mat-vec's 8 columns, where a
 * chunk's state and hidden rows are the bits of one-token steps (wider chunks run the tiled matmul and the
 * chunked DeltaNet form, which sum in another order).
 */
export const MAX_DRAFT = 7;

/** Runs a frame's head part under the pipelined driver's GPU lock (or directly). */
type HeadLock = <T>(f: () => Promise<T>) => Promise<T>;

/** A drafted run's rollback point on the head: its snapshot, position and fed tokens. */
interface Anchor {
  readonly id: number;
  readonly base: number;
  readonly tokens: readonly number[];
}

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
  /** Per slot: the head's rollback point of its latest drafted run. */
  readonly #anchor: (Anchor | undefined)[];
  readonly #snaps = new Map<number, Snap>();
  /** Remote operations in scheduler order, one at a time. */
  #tail: Promise<unknown> = Promise.resolve();
  /** The head stage's GPU calls, one at a time (its activations are shared by its slots). */
  #gpuTail: Promise<unknown> = Promise.resolve();
  /** Slot groups in flight at once in a multi-slot generate (0: one slot at a time, canBatch false). */
  readonly #groups: number;
  #draft: number;
  readonly #drafter: (seq: readonly number[], k: number) => number[];
  readonly #onDrafts: ((stats: SplitDecoder["draftStats"]) => void) | undefined;
  readonly #cache: DraftCache | undefined;
  /**
   * Draft counts since the decoder was made: frames that carried drafts, draft ids sent, and those that
   * matched the produced id (each saved one frame).
   */
  readonly draftStats: { frames: number; proposed: number; accepted: number } = {
    frames: 0,
    proposed: 0,
    accepted: 0,
  };

  /**
   * Drives `stage` (layers `0:a`) followed by `next`.
   * @param stage the head's stage
   * @param next the rest of the chain
   * @param opts `draft`: drafts per decode frame (0..MAX_DRAFT, default 0); a {@linkcode NextResult.draft}
   *   from the link replaces it from then on. `drafter`: guesses up to `k` ids to follow `seq` (the slot's
   *   whole sequence; default {@linkcode lookupDrafts}); wrong guesses cost time, never output.
   *   `onDrafts`: called with {@linkcode draftStats} after each frame that carried drafts (the engine's
   *   Worker posts them to the main thread for `/metrics`). `draftCache`: remembers every finished sequence
   *   (prompt and output) and drafts from them where the slot's own history has no 3-id match (a drafter
   *   given beside it replaces the cache's)
   * @throws {RangeError} on a draft count outside 0..MAX_DRAFT
   */
  constructor(
    stage: SplitStage,
    next: NextStage,
    opts: {
      readonly draft?: number;
      readonly drafter?: (seq: readonly number[], k: number) => number[];
      readonly onDrafts?: (stats: { frames: number; proposed: number; accepted: number }) => void;
      readonly groups?: number;
      readonly draftCache?: DraftCache;
    } = {},
  ) {
    this.#groups = opts.groups ?? 2;
    if (!Number.isInteger(this.#groups) || this.#groups < 0 || this.#groups > MAX_GROUPS) {
      throw new RangeError(`Pipeline groups must be an integer in 0..${MAX_GROUPS}, got ${opts.groups}`);
    }
    this.#cache = opts.draftCache;
    this.#drafter = opts.drafter ?? opts.draftCache?.drafter() ?? lookupDrafts;
    this.#onDrafts = opts.onDrafts;
    this.#stage = stage;
    this.#next = next;
    this.#held = Array.from({ length: stage.states.nSlots }, () => []);
    this.#epoch = new Array(stage.states.nSlots).fill(undefined);
    this.#anchor = new Array(stage.states.nSlots).fill(undefined);
    this.#draft = draftCheck(opts.draft ?? 0);
  }

  /** Positions per slot. */
  get nCtx(): number {
    return this.#stage.nCtx;
  }

  /** Slots. */
  get nSlots(): number {
    return this.#stage.states.nSlots;
  }

  /** True with pipeline groups (the default): several slots generate together (see generateMany). */
  get canBatch(): boolean {
    return this.#groups > 0;
  }

  /** Bytes held by the head's snapshots. */
  get snapshotBytes(): number {
    return this.#stage.states.snapshotBytes;
  }

  /** Drafts per decode frame now. */
  get draft(): number {
    return this.#draft;
  }

  /** Tokens held by `slot`. */
  length(slot: number): number {
    return this.#stage.length(slot);
  }

  /** Feeds `tokens` to `slot` at `base` (0 resets it) on the head and the chain. */
  prefill(slot: number, tokens: readonly number[], base: number): Promise<void> {
    return this.#queue(async () => {
      await this.#feed(slot, tokens, base, { want: "none", topK: 0 });
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
    this.#dropAnchor(slot);
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
   * Generation on `items`: greedy on the last stage's argmax, or its GPU sampler with the request's settings,
   * RNG step and history. One item runs frame by frame with drafts; several run together in pipeline groups
   * ({@linkcode generateMany}), or one after the other without groups. With `pause`, the call returns once it
   * is true (asked before each frame) or a sequence ended, the others `paused` (continue with `resume`).
   * @throws {RangeError} as Stage.run
   * @throws the chain's error when a stage fails or the link drops
   */
  generate(items: readonly BatchItem[], opts: { pause?: () => boolean } = {}): Promise<GenerateResult[]> {
    return this.#queue(async () => {
      const cache = this.#cache;
      const before = cache && items.map((it) => this.#held[it.slot]!.slice(0, it.opts.base ?? 0));
      let out: GenerateResult[] = [];
      if (items.length > 1 && this.#groups > 0) out = await generateMany(this.#pipe(), items, opts.pause);
      else for (const it of items) out.push(await this.#generateOne(it, opts.pause));
      if (cache) items.forEach((it, i) => cache.add([...before![i]!, ...it.prompt, ...out[i]!.tokens]));
      return out;
    });
  }

  /** What the pipelined driver (engine/exec/_split_pipe.ts) uses of this decoder. */
  #pipe(): PipeParts {
    return {
      stage: this.#stage,
      next: this.#next,
      groups: this.#groups,
      held: this.#held,
      epoch: this.#epoch,
      gpu: (f) => this.#gpu(f),
      // The head's GPU lock covers each frame's head part only: another lane's head step runs while this
      // frame's rows cross the chain.
      feed: (slot, tokens, base, x) => this.#feed(slot, tokens, base, x, (f) => this.#gpu(f)),
      dropAnchor: (slot) => this.#dropAnchor(slot),
    };
  }

  /** Runs `f` (head GPU work) after the head's GPU calls before it. */
  #gpu<T>(f: () => Promise<T>): Promise<T> {
    const p = this.#gpuTail.then(f);
    this.#gpuTail = p.catch(() => {});
    return p;
  }

  async #generateOne(it: BatchItem, pause?: () => boolean): Promise<GenerateResult> {
    const { slot, opts: o } = it;
    const p = o.sampling;
    // Plain greedy (no penalties) is the argmax; anything else the sampler, as the decode driver decides.
    const sampler = p && !(isGreedy(p) && p.repeatPenalty === 1 && p.presencePenalty === 0 &&
        p.frequencyPenalty === 0)
      ? p
      : undefined;
    const top = o.top ?? 0;
    if (!Number.isInteger(o.nNew) || o.nNew < 1) throw new RangeError(`nNew must be >= 1, got ${o.nNew}`);
    const base = o.base ?? 0;
    const start = base + it.prompt.length;
    const nNew = Math.min(o.nNew, this.#stage.nCtx - start + 1);
    const stops = new Set(o.stopIds ?? []);
    const step0 = o.samplerStep ?? 0;
    // The penalty window as the decode driver seeds it, then every id drawn (the kernel appends them).
    const history = [...(o.samplerHistory ?? it.prompt)].slice(-SAMPLE_HIST);
    const tokens: number[] = [];
    const tops: [number, number][][] = [];
    let reason: GenerateResult["reason"] = nNew < o.nNew ? "context" : "length";
    let feed: readonly number[] = it.prompt;
    let pos = base;
    let paused = false;
    for (;;) {
      // Drafts only after a single fed id (a decode frame), never past the ids still wanted or the context.
      const room = Math.min(this.#draft, nNew - tokens.length - 1, this.#stage.nCtx - pos - feed.length);
      const drafts = feed.length === 1 && room > 0
        ? this.#drafter([...this.#held[slot]!.slice(0, pos), ...feed], room).slice(0, room)
        : [];
      const fed = [...feed, ...drafts];
      const r = await this.#feed(slot, fed, pos, {
        want: "ids",
        topK: top,
        drafts,
        ...(sampler ? { sampling: { params: sampler, step: step0 + tokens.length, history } } : {}),
      });
      if (r.draft !== undefined) this.#draft = Math.min(MAX_DRAFT, r.draft);
      if (r.ids.length !== drafts.length + 1) {
        throw new Error(
          `Internal error: the chain answered ${r.ids.length} ids for a run with ${drafts.length} drafts`,
        );
      }
      // Ids up to the first that is not the draft fed after it (that one is the correction, still exact).
      const got: number[] = [];
      let ended = false;
      for (let j = 0; j < r.ids.length && !ended; j++) {
        const id = r.ids[j]!;
        tokens.push(id);
        got.push(id);
        history.push(id);
        if (top > 0) {
          const k = r.topIds.length / r.ids.length;
          tops.push(Array.from({ length: k }, (_, i) => [r.topIds[j * k + i]!, r.topLogits[j * k + i]!]));
        }
        if (stops.has(id)) {
          reason = "stop";
          ended = true;
        } else if (tokens.length >= nNew) ended = true;
        if (j < drafts.length && id !== drafts[j]) break;
      }
      if (history.length > SAMPLE_HIST) history.splice(0, history.length - SAMPLE_HIST);
      if (drafts.length > 0) {
        this.draftStats.frames++;
        this.draftStats.proposed += drafts.length;
        this.draftStats.accepted += got.length - 1;
        this.#onDrafts?.({ ...this.draftStats });
      }
      o.onTokens?.(got);
      // The slot must hold the fed ids up to the last kept id (not fed yet): the rest is rolled back by the
      // next frame, or at the end by re-sending the kept rows (the settle).
      const kept = feed.length + got.length - 1;
      if (!ended && o.signal?.aborted) {
        reason = "cancelled";
        ended = true;
      }
      if (!ended && pause?.()) paused = ended = true;
      if (ended) {
        if (kept < fed.length) await this.#feed(slot, fed.slice(0, kept), pos, { want: "none", topK: 0 });
        else this.#dropAnchor(slot);
        break;
      }
      pos += kept;
      feed = [got.at(-1)!];
    }
    return { tokens, top: tops, reason, steps: tokens.length - 1, ...(paused ? { paused } : {}) };
  }

  /**
   * Runs `tokens` at `base` on the head's stage and the chain (replaying the slot's older tokens first when
   * its remote state is gone); the last piece asks `x.want` and carries the drafts and sampling.
   */
  async #feed(
    slot: number,
    tokens: readonly number[],
    base: number,
    x: FeedExtra,
    lock: HeadLock = (f) => f(),
  ): Promise<NextResult> {
    if (base > 0 && this.#epoch[slot] === undefined) await this.#replay(slot, base, lock);
    try {
      return await this.#forward(slot, tokens, base, x, lock);
    } catch (e) {
      if (!(e instanceof StaleChainError)) throw e;
      await this.#replay(slot, base, lock);
      return await this.#forward(slot, tokens, base, x, lock);
    }
  }

  /** Rebuilds `slot`'s first `base` tokens on the head and the chain (after the chain restarted). */
  async #replay(slot: number, base: number, lock: HeadLock): Promise<void> {
    const held = this.#held[slot]!.slice(0, base);
    if (held.length !== base) {
      throw new Error(
        `Internal error: slot ${slot} should hold ${base} tokens but the head knows ${held.length}`,
      );
    }
    this.#epoch[slot] = undefined;
    await this.#forward(slot, held, 0, { want: "none", topK: 0 }, lock);
  }

  /**
   * `tokens` at `base` through the head's layers (under `lock`: the head's GPU work of the pipelined driver
   * goes one call at a time), then their rows through the chain.
   */
  async #forward(
    slot: number,
    tokens: readonly number[],
    base: number,
    x: FeedExtra,
    lock: HeadLock,
  ): Promise<NextResult> {
    const t0 = performance.now();
    const h = await lock(() => this.#headRun(slot, tokens, base, x));
    const headUs = Math.round((performance.now() - t0) * 1000);
    const nEmbd = h.data.length / tokens.length;
    const drafts = x.drafts ?? [];
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
          want: last ? x.want : "none",
          topK: last ? x.topK : 0,
          epoch: pos === 0 ? undefined : this.#epoch[slot],
          ...(last && drafts.length > 0 ? { drafts } : {}),
          ...(last && x.sampling ? { sampling: x.sampling } : {}),
          ...(at === 0 ? { headUs } : {}),
        });
        this.#epoch[slot] = result.epoch;
      }
    } catch (e) {
      if (!(e instanceof StaleChainError)) this.#epoch[slot] = undefined;
      throw e;
    }
    return result!;
  }

  /** The head's part of a frame: `tokens` at `base` through its layers (rolling a drafted run back first). */
  async #headRun(slot: number, tokens: readonly number[], base: number, x: FeedExtra): Promise<StageOutput> {
    const stage = this.#stage;
    const anchor = this.#anchor[slot];
    if (base > 0 && stage.length(slot) > base) {
      // Inside the latest drafted run: back to its start, then its kept tokens up to base.
      if (!anchor || base < anchor.base || base > anchor.base + anchor.tokens.length) {
        throw new Error(
          `Internal error: slot ${slot} holds ${
            stage.length(slot)
          } tokens, a run at ${base} has no drafted run ` +
            `to roll back`,
        );
      }
      stage.restore(anchor.id, slot);
      const pre = anchor.tokens.slice(0, base - anchor.base);
      if (pre.length > 0) await stage.run(slot, { tokens: pre }, anchor.base, { rows: "none" });
    }
    this.#dropAnchor(slot);
    if ((x.drafts ?? []).length > 0) {
      this.#anchor[slot] = { id: stage.snapshot(slot), base, tokens: [...tokens] };
    }
    const h = await stage.run(slot, { tokens }, base, { rows: "all" });
    this.#held[slot] = [...this.#held[slot]!.slice(0, base), ...tokens];
    return h;
  }

  /** Forgets `slot`'s rollback point (its state moved on or was replaced). */
  #dropAnchor(slot: number): void {
    const a = this.#anchor[slot];
    if (!a) return;
    this.#stage.states.drop(a.id);
    this.#anchor[slot] = undefined;
  }

  /** Runs `f` after every remote operation queued before it. */
  #queue<T>(f: () => Promise<T>): Promise<T> {
    const p = this.#tail.then(f);
    this.#tail = p.catch(() => {});
    return p;
  }
}

function draftCheck(k: number): number {
  if (!Number.isInteger(k) || k < 0 || k > MAX_DRAFT) {
    throw new RangeError(`--draft must be an integer in 0..${MAX_DRAFT}, got ${k}`);
  }
  return k;
}
