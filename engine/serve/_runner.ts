/**
 * The worker side of the engine service, without the Worker: runs the admitted requests on a
 * a {@linkcode SlotDecoder}'s slots in turns, one turn on the GPU at a time (the stage's activation buffers are shared
 * by all slots). Each request gets a slot on its first turn: the free slot whose cached history its prompt
 * extends (that history is not prefilled again), else the least recently used free slot. New requests queue
 * ahead of the generating ones and their first turn ends at their first id (time to first token is their own
 * prefill, not the others' turns). A turn either
 * prefills one piece of at most `prefillTurn` prompt tokens for one request, or generates: then every request
 * that has no prompt piece due joins it (up to MAX_BATCH_SLOTS), each makes at most `turnTokens` ids, and
 * their decode steps run together in one batched GPU step ({@linkcode SlotDecoder.generate}). Ids stream in
 * batches; an abort stops the request at the next batch boundary with the slot's state exact (it keeps
 * serving as that conversation's cache).
 *
 * Prefix reuse has two sources; the recurrent state cannot rewind, so each is used only when the new prompt
 * strictly extends its tokens, and the longest wins:
 * - the slot's live state: after a request the slot holds exactly its history (prompt and generated ids but
 *   the last, see {@linkcode SlotDecoder.generate}) and no other request touches it, so a next turn that sends
 *   that history back verbatim continues in place;
 * - a snapshot per slot taken `snapshotBack` tokens before the end of its last long prompt (the prefill
 *   stops there once): a next turn whose template renders the previous reply differently (thinking
 *   dropped) or a regenerate of the same prompt still reuses everything before the generation cue. A
 *   snapshot can seed any free slot.
 * @module
 */
import type { BatchItem, SlotDecoder } from "../exec/decode.ts";
import { MAX_BATCH_SLOTS } from "../exec/activations.ts";
import { assert } from "../errors.ts";
import type { SamplingParams } from "../sampling.ts";
import type { JobResult } from "./_protocol.ts";

/** One request as the runner sees it. */
export interface RunnerJob {
  /** Prompt token ids (≥ 1; prompt + 1 fits the context: checked by the service). */
  readonly prompt: readonly number[];
  /** Most ids to generate (≥ 1). */
  readonly maxTokens: number;
  /** Ids that end generation (included in the output). */
  readonly stopIds: readonly number[];
  /** Sampling settings (greedy when temperature is 0 and no penalty is set). */
  readonly sampling: SamplingParams;
  /** Stops the request at the next batch boundary (checked between turns too). */
  readonly signal: AbortSignal;
  /** Each batch of new ids, in order (never called once the signal is aborted). */
  readonly onTokens: (ids: readonly number[]) => void;
}

/** Options of {@linkcode SlotRunner}. */
export interface SlotRunnerOptions {
  /** Decode steps per readback (1..64). */
  readonly batch: number;
  /** Most ids a request makes per turn before the next active request runs (0: the whole request). */
  readonly turnTokens: number;
  /**
   * Snapshot each slot this many tokens before the end of a prompt with more new tokens than that
   * (0: no snapshots; prefix reuse then comes from live slot state only).
   */
  readonly snapshotBack: number;
  /** Most prompt tokens prefilled per turn (0: a whole prompt in one turn). */
  readonly prefillTurn: number;
  /**
   * Fewest generating requests that share one batched GPU step (2..MAX_BATCH_SLOTS, or 0: never batch);
   * fewer take turns, one request per turn.
   */
  readonly batchMin: number;
}

interface Active {
  readonly job: RunnerJob;
  readonly resolve: (r: JobResult) => void;
  readonly reject: (e: unknown) => void;
  /** Slot, from the first turn on (-1 before). */
  slot: number;
  /** Prompt tokens found in the slot's history or a snapshot. */
  base: number;
  /** Prompt tokens the slot holds before the first generate (the hit, or the boundary snapshot's). */
  held: number;
  /** Every id made so far, streamed or not. */
  readonly made: number[];
  /** Ids handed to `onTokens`. */
  readonly got: number[];
  /** Whether the slot holds exactly the first `stage.length(slot)` tokens of prompt ++ made. */
  consistent: boolean;
  /** Ids made in turns shared with other requests. */
  batched: number;
}

/** Runs requests on a SlotDecoder's slots in turns, with per-slot prefix reuse; see the module doc. */
export class SlotRunner {
  readonly #stage: SlotDecoder;
  readonly #batch: number;
  readonly #turnTokens: number;
  readonly #snapshotBack: number;
  readonly #prefillTurn: number;
  readonly #batchMin: number;
  /** Tokens each slot's state holds exactly (empty: unknown, the next request resets it). */
  readonly #history: number[][];
  /** Each slot's latest prompt-boundary snapshot and the tokens it holds. */
  readonly #snaps: ({ id: number; tokens: readonly number[] } | undefined)[];
  readonly #lastUsed: number[];
  /** Slots of requests still running. */
  readonly #owned = new Set<number>();
  /** Requests waiting for their next turn, in turn order. */
  readonly #ring: Active[] = [];
  /** Requests submitted and not yet ended. */
  #active = 0;
  #clock = 0;
  #looping = false;

  /**
   * Wraps the slots of a whole model (a local stage's decode driver, or a split chain).
   * @param stage first and last stage (the whole model)
   */
  constructor(stage: SlotDecoder, opts: SlotRunnerOptions) {
    this.#stage = stage;
    this.#batch = opts.batch;
    this.#turnTokens = opts.turnTokens > 0 ? opts.turnTokens : Infinity;
    this.#snapshotBack = opts.snapshotBack;
    this.#prefillTurn = opts.prefillTurn > 0 ? opts.prefillTurn : Infinity;
    assert(
      opts.batchMin === 0 || (opts.batchMin >= 2 && opts.batchMin <= MAX_BATCH_SLOTS),
      "batchMin is 0 or 2..MAX_BATCH_SLOTS",
    );
    this.#batchMin = stage.canBatch && opts.batchMin > 0 ? opts.batchMin : Infinity;
    this.#snaps = new Array(stage.nSlots).fill(undefined);
    this.#history = Array.from({ length: stage.nSlots }, () => []);
    this.#lastUsed = new Array(stage.nSlots).fill(0);
  }

  /** Tokens slot `slot`'s state holds (a copy; empty when it holds nothing reusable). */
  history(slot: number): number[] {
    return [...this.#history[slot]!];
  }

  /**
   * Adds `job` to the turn ring; resolves when it ends (stop id, length, context or cancel). The caller
   * admits at most as many requests at once as the stage has slots.
   * @throws {RangeError} from the stage (a token id out of the vocabulary)
   */
  submit(job: RunnerJob): Promise<JobResult> {
    assert(this.#active < this.#history.length, "at most nSlots requests at once");
    this.#active++;
    return new Promise<JobResult>((resolve, reject) => {
      this.#ahead({
        job,
        resolve,
        reject,
        slot: -1,
        base: 0,
        held: 0,
        made: [],
        got: [],
        consistent: false,
        batched: 0,
      });
      void this.#loop();
    });
  }

  async #loop(): Promise<void> {
    if (this.#looping) return;
    this.#looping = true;
    try {
      for (let a = this.#ring.shift(); a; a = this.#ring.shift()) {
        let group: Active[] = [a];
        try {
          const r = await this.#prepare(a);
          if (r === "again") {
            // More pieces wait behind the others' turns (a long prompt does not stall their streams); the
            // last one, before the first id, goes ahead again.
            if (this.#pieceDue(a)) this.#ring.push(a);
            else this.#ahead(a);
            continue;
          }
          if (r !== "ready") {
            a.resolve(r);
            continue;
          }
          // Every other request that is only generating (no prompt piece due) joins this turn, one batched
          // GPU step for all of them, when they are at least batchMin (below that, turns are faster: PERF.md).
          if (this.#readyCount() + 1 >= this.#batchMin) group = [a, ...this.#takeReady(MAX_BATCH_SLOTS - 1)];
          const outs = await this.#generate(group);
          for (const [i, m] of group.entries()) {
            const out = outs[i];
            if (out) m.resolve(out);
            else this.#ring.push(m);
          }
        } catch (e) {
          for (const m of group) {
            m.consistent = false;
            this.#finish(m, "cancelled");
            m.reject(e);
          }
        }
      }
    } finally {
      this.#looping = false;
    }
  }

  /**
   * Queues `a` ahead of the requests that are generating (FIFO among those that are not): a newcomer's first
   * turn is its prompt and first id only, so time to first token does not wait for others' 64-id turns.
   */
  #ahead(a: Active): void {
    const at = this.#ring.findIndex((r) => r.made.length > 0);
    this.#ring.splice(at < 0 ? this.#ring.length : at, 0, a);
  }

  /**
   * Readies `a` for a generating turn: ends it when cancelled, gives it a slot on its first turn, prefills
   * one prompt piece as a turn of its own when one is due ("again": back in the ring).
   */
  async #prepare(a: Active): Promise<JobResult | "again" | "ready"> {
    if (a.job.signal.aborted) return this.#finish(a, "cancelled");
    this.#assign(a);
    if (a.made.length === 0 && await this.#prefillPiece(a)) return "again";
    return "ready";
  }

  /** Requests in the ring that could join a generating turn now (slot assigned or free to assign). */
  #readyCount(): number {
    let n = 0;
    for (const b of this.#ring) {
      if (!b.job.signal.aborted && (b.slot < 0 || !this.#pieceDue(b))) n++;
    }
    return n;
  }

  /** Removes from the ring and returns up to `max` requests that can join a generating turn now. */
  #takeReady(max: number): Active[] {
    const out: Active[] = [];
    for (let i = 0; i < this.#ring.length && out.length < max;) {
      const b = this.#ring[i]!;
      if (!b.job.signal.aborted) this.#assign(b);
      if (!b.job.signal.aborted && !this.#pieceDue(b)) {
        out.push(b);
        this.#ring.splice(i, 1);
      } else {
        i++;
      }
    }
    return out;
  }

  /** Gives `a` its slot on its first turn (restoring the snapshot it reuses). */
  #assign(a: Active): void {
    if (a.slot >= 0) return;
    const { slot, base, snap } = this.#pick(a.job.prompt);
    [a.slot, a.base, a.held, a.consistent] = [slot, base, base, base > 0];
    this.#owned.add(slot);
    this.#lastUsed[slot] = ++this.#clock;
    // Until the request ends cleanly the slot's contents belong to it: an error leaves the slot unknown.
    this.#history[slot] = [];
    if (snap !== undefined) this.#stage.restore(snap, slot);
  }

  /**
   * One generating turn of every request in `group` (one batched GPU step for all of them when there are
   * several); per request, its result when it has ended.
   */
  async #generate(group: readonly Active[]): Promise<(JobResult | undefined)[]> {
    const stage = this.#stage;
    const items: BatchItem[] = group.map((a) => {
      const { job } = a;
      // Ids this request can make in all: the context holds the prompt and all of them but the last.
      const limit = Math.min(job.maxTokens, stage.nCtx - job.prompt.length + 1);
      // The first turn ends at the first id (see submit); later turns make up to turnTokens.
      const nNew = Math.min(a.made.length === 0 ? 1 : this.#turnTokens, limit - a.made.length);
      const emit = (ids: readonly number[]) => {
        if (job.signal.aborted) return;
        a.got.push(...ids);
        job.onTokens(ids);
      };
      // The slot holds the cached prefix (first turn) or all of prompt ++ made but the last id (later turns).
      const seq = [...job.prompt, ...a.made];
      const base = a.made.length > 0 ? seq.length - 1 : a.held;
      assert(
        base === 0 || stage.length(a.slot) === base,
        `slot ${a.slot} holds ${stage.length(a.slot)} tokens, not ${base}`,
      );
      a.consistent = false;
      return {
        slot: a.slot,
        prompt: seq.slice(base),
        opts: {
          nNew,
          base,
          stopIds: job.stopIds,
          signal: job.signal,
          onTokens: emit,
          // Later turns continue the same random stream and penalty window.
          sampling: job.sampling,
          samplerStep: a.made.length,
          samplerHistory: seq,
        },
      };
    });
    const rs = await stage.generate(items, { batch: this.#batch });
    return group.map((a, i) => {
      const r = rs[i]!;
      const { job } = a;
      // The slot now holds base, the new tokens and every returned id but the last, cancelled or not.
      a.made.push(...r.tokens);
      a.consistent = true;
      if (group.length > 1) a.batched += r.tokens.length;
      const limit = Math.min(job.maxTokens, stage.nCtx - job.prompt.length + 1);
      if (r.reason === "stop" || r.reason === "cancelled") return this.#finish(a, r.reason);
      if (a.made.length >= job.maxTokens) return this.#finish(a, "length");
      if (a.made.length >= limit) return this.#finish(a, "context");
      return undefined;
    });
  }

  /** Ends `a`: frees its slot and records what the slot holds; returns the result. */
  #finish(a: Active, reason: JobResult["reason"]): JobResult {
    this.#active--;
    if (a.slot >= 0) {
      this.#owned.delete(a.slot);
      if (a.consistent) {
        const held = this.#stage.length(a.slot);
        const seq = [...a.job.prompt, ...a.made];
        assert(held <= seq.length && held >= a.base, `slot ${a.slot} holds ${held} of ${seq.length} tokens`);
        this.#history[a.slot] = seq.slice(0, held);
      }
    }
    return {
      tokens: a.got,
      reason,
      slot: a.slot,
      cachedTokens: a.base,
      prefilledTokens: a.slot >= 0 ? a.job.prompt.length - a.base : 0,
      snapshotBytes: this.#stage.snapshotBytes,
      batchedTokens: a.batched,
    };
  }

  /**
   * The longest prefix of `prompt` (strictly shorter than it) held by a free slot's live state or by any
   * slot's snapshot, and the slot to run on: the live slot; for a snapshot its own slot when free (its live
   * state missed anyway), else the least recently used free slot; with no hit, the least recently used.
   */
  #pick(prompt: readonly number[]): { slot: number; base: number; snap?: number } {
    const isPrefix = (h: readonly number[]) => {
      if (h.length === 0 || h.length >= prompt.length) return false;
      for (let i = 0; i < h.length; i++) if (h[i] !== prompt[i]) return false;
      return true;
    };
    let lru = -1;
    for (let s = 0; s < this.#lastUsed.length; s++) {
      if (!this.#owned.has(s) && (lru < 0 || this.#lastUsed[s]! < this.#lastUsed[lru]!)) lru = s;
    }
    assert(lru >= 0, "a free slot for every admitted request");
    let best: { slot: number; base: number; snap?: number } = { slot: lru, base: 0 };
    for (const [s, h] of this.#history.entries()) {
      if (!this.#owned.has(s) && h.length > best.base && isPrefix(h)) best = { slot: s, base: h.length };
    }
    for (const [s, snap] of this.#snaps.entries()) {
      if (snap && snap.tokens.length > best.base && isPrefix(snap.tokens)) {
        best = { slot: this.#owned.has(s) ? lru : s, base: snap.tokens.length, snap: snap.id };
      }
    }
    return best;
  }

  /** Whether `a` (slot assigned) has a prompt piece to prefill as a turn of its own before it generates. */
  #pieceDue(a: Active): boolean {
    if (a.made.length > 0) return false;
    const prompt = a.job.prompt;
    const at = this.#snapshotBack > 0 ? prompt.length - this.#snapshotBack : 0;
    const snapAhead = at > a.base && a.held < at;
    return snapAhead || prompt.length - a.held > this.#prefillTurn;
  }

  /**
   * Prefills one piece of a long prompt as a turn of its own, so other requests keep streaming meanwhile:
   * up to `prefillTurn` tokens, ending early at the snapshot point (`snapshotBack` before the prompt's end,
   * when the prompt has more new tokens than that), where the slot's snapshot is replaced. Returns false
   * when what is left goes to SlotDecoder.generate (it prefills at least the prompt's last token itself).
   */
  async #prefillPiece(a: Active): Promise<boolean> {
    const stage = this.#stage;
    const prompt = a.job.prompt;
    const at = this.#snapshotBack > 0 ? prompt.length - this.#snapshotBack : 0;
    const snapAhead = at > a.base && a.held < at;
    if (!this.#pieceDue(a)) return false;
    const end = Math.min(a.held + this.#prefillTurn, snapAhead ? at : prompt.length - 1);
    a.consistent = false;
    await stage.prefill(a.slot, prompt.slice(a.held, end), a.held);
    a.consistent = true;
    a.held = end;
    if (snapAhead && end === at) {
      const old = this.#snaps[a.slot];
      if (old) stage.drop(old.id);
      this.#snaps[a.slot] = { id: stage.snapshot(a.slot), tokens: prompt.slice(0, at) };
    }
    return true;
  }
}
