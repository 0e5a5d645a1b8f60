/**
 * Drafted decoding in the unsplit engine: {@linkcode DraftingDecoder} wraps a whole-model stage's decode driver
 * (any {@linkcode SlotDecoder}) and, for a call with one sequence, swaps the pipelined step loop for drafted
 * frames where the drafter has long guesses. A frame feeds the slot's last id plus K guessed ids as one chunk
 * of 1 + K <= 8 rows (its attention runs as the columns of a batched step, so every row's logits and the slot's
 * state are the bits of one-token steps: tests/chunk_exact_test.ts), draws one id per row in the chunk's pass
 * (the GPU argmax, or the sampler at the rows' RNG steps and penalty history: the undrafted draws), and keeps
 * the ids up to the first that differs from the guess fed after it. A rejected tail is rolled back exactly:
 * the slot is restored from a snapshot taken before the frame and the kept rows re-run (queued, no readback).
 * So output is the same with drafts on or off, and after the call the slot holds what the undrafted run
 * leaves (every id but the last).
 *
 * Where drafts help (the cost model, docs/PLATFORM.md): the pipelined loop never awaits per step (H200: ~4.5
 * ms per one-slot step), a frame must await its ids (the >= 10 ms readback floor) on top of a chunk of 1 + K
 * rows (about a batched step of 1 + K columns, ~12-14 ms at 8). A frame of 8 rows pays off when it makes more
 * than ~5 ids, i.e. when most guesses are right (a repeated request drafting from the draft cache). Hence:
 * - the pipelined loop runs with a `pause` that stops it at a readback boundary once the drafter proposes at
 *   least `minDraft` ids (default {@linkcode DEFAULT_MIN_DRAFT});
 * - frames follow while the drafter proposes `minDraft` or more and each frame accepts at least `minDraft`;
 *   then the pipelined loop continues (`resume`: no prefill, the sampler at the same RNG step and window);
 * - after a frame that accepted fewer, the slot drafts no more for a while (BACKOFF_MIN positions, doubling
 *   up to BACKOFF_MAX), so a stream whose guesses keep failing pays one frame per that many ids at most;
 * - on the argmax path frames are chained: while a frame's ids come back, the next frame is already submitted
 *   on the assumption that the frame keeps every guess, its first row a guess of the frame's last id (the
 *   drafter continues past the guesses). The GPU runs it during the readback's wait, so a run of right
 *   guesses costs about one chunk per 1 + K ids instead of a chunk plus the floor. A chained frame counts
 *   only when the frame before kept all and its first row was right; else the slot goes back to the chained
 *   frame's snapshot (the frame kept all) or the frame's own (it kept fewer) and the chained one is dropped.
 *   Sampled frames are not chained (a row's draw needs the ids before it in its penalty history);
 * - the default drafter wants a 3-id match (the slot's own history, then the draft cache's n-grams): the
 *   split's 1- and 2-id matches guess too often wrong for a frame that costs more than it does there.
 * Calls of several sequences (batched steps) and calls asking for top-k pairs run undrafted.
 * @module
 */
import type { BatchItem, FinishReason, GenerateResult, SlotDecoder } from "./slot_decoder.ts";
import type { StageOutput } from "./options.ts";
import type { RowSampleOptions } from "./_row_sampler.ts";
import { isGreedy, SAMPLE_HIST, type SamplingParams } from "../sampling.ts";
import { type DraftCache, lookupDrafts } from "./draft_cache.ts";
import { MAX_DRAFT } from "./split.ts";
import { NumericsError } from "../errors.ts";

/** Fewest guesses a frame carries by default (the cost model in the module doc). */
export const DEFAULT_MIN_DRAFT = 4;
/** Positions without frames after the first frame that accepted fewer than `minDraft` guesses. */
const BACKOFF_MIN = 32;
/** Most positions without frames after a run of poor frames (the wait doubles per poor frame). */
const BACKOFF_MAX = 1024;
/** n-gram length the default drafter matches. */
const MATCH_IDS = 3;

/** What the drafting decoder needs of a whole-model stage (a `Stage`). */
export interface DraftingStage {
  /** Positions per slot. */
  readonly nCtx: number;
  /** Most tokens per chunk: a frame's rows must be one chunk (its `ids` take an argmax per row of one chunk). */
  readonly maxChunk: number;
  /** The model's vocabulary size (an id at or above it: no usable logit). */
  readonly hp: { readonly nVocab: number };
  /** Its slot states (a frame's snapshot is dropped there). */
  readonly states: { drop(id: number): void };
  /** Tokens held by `slot`. */
  length(slot: number): number;
  /** A rollback's re-run (`rows: "none"`). */
  run(
    slot: number,
    input: { readonly tokens: readonly number[] },
    base: number,
    opts: { rows: "all" | "none"; ids?: boolean },
  ): Promise<StageOutput>;
  /**
   * A frame's chunk, its ids drawn in its pass (the argmax, or with `sample` the sampler: the undrafted
   * steps' draws), resolving once submitted with the output pending (a chained frame goes in meanwhile).
   */
  submit(
    slot: number,
    input: { readonly tokens: readonly number[] },
    base: number,
    opts: { rows: "all"; ids: true; sample?: RowSampleOptions },
  ): Promise<{ readonly output: Promise<StageOutput> }>;
  /** Saves `slot`'s state (before a frame). */
  snapshot(slot: number): number;
  /** Restores a frame's snapshot into `slot` (its tail was rejected). */
  restore(id: number, slot: number): void;
}

/** A submitted frame: its position, fed ids, the slot's snapshot before it, and its pending output. */
interface Flight {
  readonly pos: number;
  readonly fed: readonly number[];
  readonly anchor: number;
  readonly output: Promise<StageOutput>;
}

/** Options of {@linkcode DraftingDecoder}. */
export interface DraftingOptions {
  /** Most guesses per frame (1..MAX_DRAFT). */
  readonly draft: number;
  /** Fewest guesses that make a frame, and accepted ones that keep frames going (1..draft; default 4). */
  readonly minDraft?: number;
  /** Guesses up to `k` ids to follow `seq` (the slot's whole sequence); default: see the module doc. */
  readonly drafter?: (seq: readonly number[], k: number) => number[];
  /** Remembers every sequence the decoder ran and drafts from it (the default drafter's second source). */
  readonly draftCache?: DraftCache;
  /** Chain frames on the argmax path (default true; false: a benchmark's comparison point). */
  readonly chain?: boolean;
  /** Called with the draft counts after each frame. */
  readonly onDrafts?: (stats: { frames: number; proposed: number; accepted: number }) => void;
}

/** Drafted frames for lone sequences over a whole-model decoder; see the module doc. */
export class DraftingDecoder implements SlotDecoder {
  readonly #inner: SlotDecoder;
  readonly #stage: DraftingStage;
  readonly #draft: number;
  readonly #min: number;
  readonly #drafter: (seq: readonly number[], k: number) => number[];
  readonly #cache: DraftCache | undefined;
  readonly #onDrafts: DraftingOptions["onDrafts"];
  readonly #chain: boolean;
  /** Tokens each slot holds as far as this wrapper knows (a prefix of them when not: guesses only). */
  readonly #held: number[][];
  /** Tokens each snapshot holds. */
  readonly #snaps = new Map<number, number[]>();
  /** Per slot: no frames before the sequence is `until` long; the current wait after poor frames. */
  readonly #cool: { until: number; wait: number }[];
  /**
   * Draft counts since the decoder was made: frames run, guesses fed, and those that matched the produced
   * id (each saved one step).
   */
  readonly draftStats: { frames: number; proposed: number; accepted: number } = {
    frames: 0,
    proposed: 0,
    accepted: 0,
  };

  /**
   * Drafts on `stage` around `inner` (the stage's decode driver).
   * @throws {RangeError} on `draft` outside 1..MAX_DRAFT or `minDraft` outside 1..draft
   */
  constructor(inner: SlotDecoder, stage: DraftingStage, opts: DraftingOptions) {
    if (!Number.isInteger(opts.draft) || opts.draft < 1 || opts.draft > MAX_DRAFT) {
      throw new RangeError(`--draft must be an integer in 1..${MAX_DRAFT} to draft, got ${opts.draft}`);
    }
    const min = opts.minDraft ?? Math.min(DEFAULT_MIN_DRAFT, opts.draft);
    if (!Number.isInteger(min) || min < 1 || min > opts.draft) {
      throw new RangeError(`The fewest drafts per frame must be an integer in 1..${opts.draft}, got ${min}`);
    }
    this.#inner = inner;
    this.#stage = stage;
    this.#draft = opts.draft;
    this.#min = min;
    this.#cache = opts.draftCache;
    const cache = this.#cache;
    this.#drafter = opts.drafter ?? ((seq, k) => {
      const own = lookupDrafts(seq, k, MATCH_IDS);
      return own.length > 0 ? own : cache?.lookup(seq, k) ?? [];
    });
    this.#onDrafts = opts.onDrafts;
    this.#chain = opts.chain ?? true;
    this.#held = Array.from({ length: inner.nSlots }, () => []);
    this.#cool = Array.from({ length: inner.nSlots }, () => ({ until: 0, wait: 0 }));
  }

  /** Positions per slot. */
  get nCtx(): number {
    return this.#inner.nCtx;
  }

  /** Slots. */
  get nSlots(): number {
    return this.#inner.nSlots;
  }

  /** Whether several slots can decode in one step (those calls run undrafted). */
  get canBatch(): boolean {
    return this.#inner.canBatch;
  }

  /** Bytes held by snapshots. */
  get snapshotBytes(): number {
    return this.#inner.snapshotBytes;
  }

  /** Tokens held by `slot`. */
  length(slot: number): number {
    return this.#inner.length(slot);
  }

  /** Feeds `tokens` to `slot` at `base` (0 resets it). */
  async prefill(slot: number, tokens: readonly number[], base: number): Promise<void> {
    const before = this.#known(slot, base);
    this.#held[slot] = [];
    await this.#inner.prefill(slot, tokens, base);
    this.#held[slot] = before ? [...before, ...tokens] : [];
  }

  /** Saves `slot`'s state to a new snapshot; returns its id. */
  snapshot(slot: number): number {
    const id = this.#inner.snapshot(slot);
    this.#snaps.set(id, this.#known(slot, this.#inner.length(slot)) ?? []);
    return id;
  }

  /** Restores snapshot `id` into `slot`. */
  restore(id: number, slot: number): void {
    this.#inner.restore(id, slot);
    this.#held[slot] = [...this.#snaps.get(id) ?? []];
  }

  /** Frees snapshot `id`. */
  drop(id: number): void {
    this.#inner.drop(id);
    this.#snaps.delete(id);
  }

  /** Idle-time work (SlotDecoder.warmIdle): the inner decoder's; it prepares the slots frames run on too. */
  warmIdle(order?: readonly number[]): Promise<boolean> {
    return this.#inner.warmIdle?.(order) ?? Promise.resolve(false);
  }

  /**
   * Generation as the inner decoder's `generate` (the same ids, stops, reasons and slot contents); one item
   * without top-k pairs may run drafted frames (see the module doc). With `pause`, asked before every frame
   * too: the call then returns at the frame boundary, the sequence `paused`.
   * @throws as the inner decoder's generate; {@linkcode NumericsError} on non-finite logits in a frame
   */
  async generate(
    items: readonly BatchItem[],
    opts: { batch?: number; pause?: () => boolean } = {},
  ): Promise<GenerateResult[]> {
    const before = items.map((it) => this.#known(it.slot, it.opts.base ?? 0));
    for (const it of items) this.#held[it.slot] = [];
    const it = items[0]!;
    const out = items.length === 1 && (it.opts.top ?? 0) === 0
      ? [await this.#solo(it, before[0], opts)]
      : await this.#inner.generate(items, opts);
    items.forEach((it, i) => {
      const b = before[i];
      if (!b) return;
      const seq = [...b, ...it.prompt, ...out[i]!.tokens];
      this.#held[it.slot] = seq.slice(0, -1);
      this.#cache?.add(seq);
    });
    return out;
  }

  /** The first `base` tokens `slot` holds, when known. */
  #known(slot: number, base: number): number[] | undefined {
    const h = this.#held[slot]!;
    return h.length >= base ? h.slice(0, base) : undefined;
  }

  /** One sequence: pipelined until the drafter has long guesses, then frames while they hold, and so on. */
  async #solo(
    it: BatchItem,
    before: readonly number[] | undefined,
    opts: { batch?: number; pause?: () => boolean },
  ): Promise<GenerateResult> {
    const { slot, opts: o } = it;
    const stage = this.#stage;
    if (!o.resume) this.#cool[slot] = { until: 0, wait: 0 };
    // The drafter's view: the slot's sequence and every id made (only guesses depend on it).
    const seq = [...before ?? [], ...it.prompt];
    const tokens: number[] = [];
    const step0 = o.samplerStep ?? 0;
    const hist0 = o.samplerHistory ?? it.prompt;
    // Ids landed in the pipelined call in flight (not yet in `tokens`).
    let landed = 0;
    const onTokens = (ids: readonly number[]) => {
      seq.push(...ids);
      landed += ids.length;
      o.onTokens?.(ids);
    };
    // A pause lets the batch in flight land first: frames need room for minDraft guesses after it.
    const S = opts.batch ?? o.batch ?? 8;
    let steps = 0;
    let framesNext = o.resume === true;
    for (;;) {
      if (framesNext) {
        const f = await this.#frames(it, seq, tokens, opts.pause);
        steps += f.ids;
        if (f.end) return { tokens, top: [], reason: f.end, steps };
        if (f.paused) return { tokens, top: [], reason: "length", steps, paused: true };
        // The pipelined loop paused for guesses that were gone once its last batch landed: a stream whose
        // guesses keep vanishing waits as long as one whose frames fail.
        if (f.frames === 0 && tokens.length > 0) this.#poor(slot, seq.length);
      }
      // The pipelined loop from the slot's state: the item itself first, then its continuation.
      const pos = stage.length(slot);
      const item: BatchItem = tokens.length === 0 && !framesNext ? { ...it, opts: { ...o, onTokens } } : {
        slot,
        prompt: [tokens.at(-1) ?? it.prompt[0]!],
        opts: {
          ...o,
          onTokens,
          nNew: o.nNew - tokens.length,
          base: pos,
          resume: true,
          samplerStep: step0 + tokens.length,
          samplerHistory: [...hist0, ...tokens].slice(-SAMPLE_HIST),
        },
      };
      let callerPaused = false;
      landed = 0;
      const pause = () => {
        if (opts.pause?.()) return callerPaused = true;
        return o.nNew - tokens.length - landed - S > this.#min && this.#wants(slot, seq);
      };
      const [r] = await this.#inner.generate([item], { ...opts, pause });
      tokens.push(...r!.tokens);
      steps += r!.steps;
      if (!r!.paused || callerPaused) return { ...r!, tokens, steps };
      framesNext = true;
    }
  }

  /** Whether the drafter would fill a frame for `slot` at the end of `seq` (the pipelined loop's pause). */
  #wants(slot: number, seq: readonly number[]): boolean {
    return seq.length >= this.#cool[slot]!.until && this.#drafter(seq, this.#draft).length >= this.#min;
  }

  /**
   * Drafted frames of `it` while the drafter proposes `minDraft` ids or more and frames accept that many;
   * appends the ids made to `tokens` (and `seq`). On the argmax path the next frame is chained while a frame's
   * ids come back: it assumes the frame keeps every guess and guesses its last id too (fed as its first row),
   * so the GPU runs it during the readback's wait; it counts only if both hold, else it is rolled back with
   * the frame's tail. Returns the ids made and frames run, and the finish reason when the sequence ended, or
   * `paused` when the caller's pause fired.
   */
  async #frames(
    it: BatchItem,
    seq: number[],
    tokens: number[],
    pause: (() => boolean) | undefined,
  ): Promise<{ ids: number; frames: number; end?: FinishReason; paused?: boolean }> {
    const { slot, opts: o } = it;
    const stage = this.#stage;
    const V = stage.hp.nVocab;
    const stops = new Set(o.stopIds ?? []);
    const sampling = samplerOf(o.sampling);
    const step0 = o.samplerStep ?? 0;
    const hist0 = o.samplerHistory ?? it.prompt;
    const cool = this.#cool[slot]!;
    /** Guesses for a frame at `pos` after `made` ids (none when it cannot carry minDraft). */
    const guess = (known: readonly number[], pos: number, made: number, first: number): number[] => {
      // Ids still to make: the request's, within the context (each id but the last is fed at pos, pos+1, ...).
      const limit = Math.min(o.nNew - made, stage.nCtx - pos);
      const room = Math.min(this.#draft, limit - 1, stage.maxChunk - 1);
      if (room < this.#min || known.length < cool.until) return [];
      const g = this.#drafter(known, room + first).slice(0, room + first);
      return g.length >= this.#min + first ? g : [];
    };
    const live = new Set<number>();
    const drop = (anchor: number) => {
      if (live.delete(anchor)) stage.states.drop(anchor);
    };
    const submit = async (fed: number[], pos: number): Promise<Flight> => {
      const anchor = stage.snapshot(slot);
      live.add(anchor);
      // A sampled frame's rows draw at the RNG steps and history of the ids made so far (frames of a sampled
      // call are never chained, so these are all the ids before its first row).
      const sample = sampling && {
        sampling,
        step: step0 + tokens.length,
        history: [...hist0, ...tokens].slice(-SAMPLE_HIST),
      };
      const run = await stage.submit(slot, { tokens: fed }, pos, { rows: "all", ids: true, sample });
      return { pos, fed, anchor, output: run.output };
    };
    let made = 0;
    let frames = 0;
    let cur: Flight | undefined;
    try {
      for (;;) {
        if (!cur) {
          if (o.signal?.aborted) return { ids: made, frames, end: "cancelled" };
          // The caller's pause after any progress in this call (a call makes some, as the pipelined loop does).
          if (tokens.length > 0 && pause?.()) return { ids: made, frames, paused: true };
          const pos = stage.length(slot);
          const g = guess(seq, pos, tokens.length, 0);
          if (g.length === 0) return { ids: made, frames };
          cur = await submit([tokens.at(-1) ?? it.prompt[0]!, ...g], pos);
        }
        // The chained frame: after every guess of `cur` and a guess of its last id, which must not end it.
        let next: Flight | undefined;
        const drafts = cur.fed.slice(1);
        if (
          this.#chain && !sampling && !o.signal?.aborted && !drafts.some((id) => stops.has(id)) && !pause?.()
        ) {
          const g = guess([...seq, ...drafts], cur.pos + cur.fed.length, tokens.length + cur.fed.length, 1);
          if (g.length > 0 && !stops.has(g[0]!)) next = await submit(g, cur.pos + cur.fed.length);
        }
        const ids = (await cur.output).ids!;
        // Ids up to the first that is not the guess fed after it (that one is still the exact next id).
        const got: number[] = [];
        let end: FinishReason | undefined;
        const limit = Math.min(o.nNew - tokens.length, stage.nCtx - cur.pos);
        for (let j = 0; j < cur.fed.length; j++) {
          const id = ids[j]!;
          if (id >= V) {
            throw new NumericsError(
              `The model produced non-finite logits (NaN or Inf) at a drafted frame's row ${j} of slot ${slot}: ` +
                `check the file with \`inspect --check\``,
            );
          }
          got.push(id);
          if (stops.has(id)) end = "stop";
          else if (got.length === limit) end = tokens.length + got.length < o.nNew ? "context" : "length";
          if (end || (j < drafts.length && id !== drafts[j])) break;
        }
        const chained = next !== undefined && !end && got.length === cur.fed.length &&
          next.fed[0] === got.at(-1);
        if (!chained) {
          // The slot holds the fed rows up to the last kept id (not fed): the rest goes back. After every row
          // of `cur`, the chained frame's snapshot holds exactly that.
          if (next && got.length === cur.fed.length) stage.restore(next.anchor, slot);
          else if (got.length < cur.fed.length) {
            stage.restore(cur.anchor, slot);
            await stage.run(slot, { tokens: cur.fed.slice(0, got.length) }, cur.pos, { rows: "none" });
          }
          if (next) {
            drop(next.anchor);
            next.output.catch(() => {/* its ids are not needed */});
            this.#count(next.fed.length - 1, 0);
          }
        }
        drop(cur.anchor);
        tokens.push(...got);
        made += got.length;
        frames++;
        seq.push(...got);
        this.#count(drafts.length, got.length - 1);
        if (got.length - 1 < this.#min) this.#poor(slot, seq.length);
        else cool.wait = 0;
        o.onTokens?.(got);
        if (end) return { ids: made, frames, end };
        cur = chained ? next : undefined;
      }
    } finally {
      for (const a of [...live]) drop(a);
    }
  }

  /** Counts a frame: its guesses and those kept. */
  #count(proposed: number, accepted: number): void {
    this.draftStats.frames++;
    this.draftStats.proposed += proposed;
    this.draftStats.accepted += accepted;
    this.#onDrafts?.({ ...this.draftStats });
  }

  /** No frames on `slot` for the next wait (doubled from the last) after a poor frame at length `at`. */
  #poor(slot: number, at: number): void {
    const cool = this.#cool[slot]!;
    cool.wait = Math.min(BACKOFF_MAX, cool.wait > 0 ? 2 * cool.wait : BACKOFF_MIN);
    cool.until = at + cool.wait;
  }
}

/** The sampler's settings, or undefined for plain greedy (the argmax path, as the decode driver decides). */
function samplerOf(p: SamplingParams | undefined): SamplingParams | undefined {
  const plain = p === undefined ||
    (isGreedy(p) && p.repeatPenalty === 1 && p.presencePenalty === 0 && p.frequencyPenalty === 0);
  return plain ? undefined : p;
}
