/**
 * The worker side of the engine service, without the Worker: runs the admitted requests on a
 * {@linkcode SlotDecoder}'s slots with continuous batching, one GPU call at a time (the stage's activation
 * buffers are shared by all slots). The loop alternates two kinds of work:
 * - prompt pieces of the new requests whose prompt has more left than one piece (or a snapshot point ahead),
 *   oldest first, at most the round's budget in all while other requests generate (their streams pause for
 *   it: `prefillTurn` tokens, or with `pieceGap` what the pacer of engine/serve/_pacer.ts allows, about that
 *   many of their steady gaps per round), else at most `prefillAlone` (wide chunks, fewer rounds: nothing
 *   waits but newcomers);
 * - one decode call ({@linkcode SlotDecoder.generate}) of every generating request together with the new ones
 *   whose prompt rest fits what the round's pieces left of its budget (they join with a fresh prompt, the
 *   driver prefills it and streams their first id before the step loop, and a call that such a request
 *   joins runs `pieceSteps` steps and returns at its first readback; the others wait one turn). The call
 *   is a turn: it returns at the first readback boundary where work
 *   waits outside it (a request arrived, a piece is due, a waiting request was cancelled) or a sequence
 *   ended; the others come back paused and rejoin the next call with `resume` (no prefill, the same ids as an
 *   uninterrupted run).
 * The runner yields to its thread's event loop once after a round's pieces (a decode call's readback blocks
 * the thread, so a request handed over while the pieces were encoded would otherwise wait for that readback):
 * requests of a burst that arrive one task apart start in one call.
 * So every generating request joins every decode step, a new request joins at the next readback, and a long
 * prompt costs the streams in flight one piece at a time: piece, one batch of steps, piece, ... Only when
 * more requests generate than one step can hold (above MAX_BATCH_SLOTS, a model that cannot batch, or fewer
 * than `batchMin`) do they take turns of `turnTokens` ids, the least recently run first. Ids stream as each
 * readback lands; an abort stops a request at the next readback with the slot's state exact (it keeps serving
 * as that conversation's cache).
 *
 * Each request gets a slot when the loop first sees it: the free slot whose cached history its prompt extends
 * (that history is not prefilled again), else the least recently used free slot. Prefix reuse has two
 * sources; the recurrent state cannot rewind, so each is used only when the new prompt strictly extends its
 * tokens, and the longest wins:
 * - the slot's live state: after a request the slot holds exactly its history (prompt and generated ids but
 *   the last, see {@linkcode SlotDecoder.generate}) and no other request touches it, so a next turn that sends
 *   that history back verbatim continues in place;
 * - a snapshot per slot taken `snapshotBack` tokens before the end of its last long prompt: a next turn
 *   whose template renders the previous reply differently (thinking dropped) or a regenerate of the same
 *   prompt still reuses everything before the generation cue. A snapshot can seed any free slot. A prompt
 *   with such a point ahead goes in pieces (as a long one does) before it joins a decode call. Where the
 *   decoder takes the snapshot inside a prefill ({@linkcode SlotDecoder.snapInPrefill}: the chunk holding
 *   the point runs whole, its DeltaNet layers write their state there to taps) the piece goes on to the
 *   prompt's last token, which joins the call alone; otherwise the piece ends at the point and the rest
 *   (`snapshotBack` tokens) joins.
 * A request alone in the runner, on such a decoder, whose prompt one idle round holds, skips the piece: its
 * whole prompt goes to a decode call of its own that takes the snapshot inside the prefill and makes its
 * first id only (time to first token: the engine's prefill and one readback, not a piece, a rest and a
 * readback). Requests arriving during that call are a burst: their pieces run and they start together in one
 * call, and the first one decodes on with them (its first id alone does not make it "generating"). While it
 * holds no request the runner gives the decoder's idle work (SlotDecoder.warmIdle) one step per event-loop
 * task: a slot prepared like the last request's, so its next request builds nothing first.
 * @module
 */
import type { BatchItem, SlotDecoder } from "../exec/slot_decoder.ts";
import { MAX_BATCH_SLOTS } from "../exec/activations.ts";
import { assert } from "../errors.ts";
import type { SamplingParams } from "../sampling.ts";
import type { JobResult } from "./_protocol.ts";
import { PiecePacer } from "./_pacer.ts";
import { trace } from "../exec/_trace.ts";
import { nextTask } from "../gpu/readback.ts";

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
  /** Stops the request at the next readback (checked between calls too). */
  readonly signal: AbortSignal;
  /** Each batch of new ids, in order, as its readback lands (never called once the signal is aborted). */
  readonly onTokens: (ids: readonly number[]) => void;
  /**
   * Called when the request gets its slot (with the prompt tokens found cached there) and after each prompt
   * piece (with the prompt tokens the slot holds so far): the service's per-slot view.
   */
  readonly onSlot?: (slot: number, heldTokens: number) => void;
}

/** Options of {@linkcode SlotRunner}. */
export interface SlotRunnerOptions {
  /** Decode steps per readback (1..64). */
  readonly batch: number;
  /**
   * Decode steps per readback in a turn that ends at its first readback because work waits outside it (a
   * prompt's next piece, a newcomer): the streams' gap while a long prompt is prefilled is one piece plus
   * these steps, and the prompt's time to first token grows by these steps per piece (1..`batch`; absent:
   * `batch`).
   */
  readonly pieceSteps?: number;
  /**
   * Most ids a request makes per call while other generating requests wait for a place in the step (more
   * than one step holds; 0: no limit).
   */
  readonly turnTokens: number;
  /**
   * Snapshot each slot this many tokens before the end of a prompt with more new tokens than that
   * (0: no snapshots; prefix reuse then comes from live slot state only).
   */
  readonly snapshotBack: number;
  /**
   * Prompt tokens per piece between the others' decode turns (0: a whole prompt at once): the pieces of a
   * round with `pieceGap`, their grain and smallest size.
   */
  readonly prefillTurn: number;
  /**
   * Pieces sized by time (engine/serve/_pacer.ts): a round of pieces and its decode turn takes about this
   * many times the streams' steady gap (`batch` steps), in multiples of `prefillTurn` up to `prefillAlone`.
   * Absent or 0: every round takes `prefillTurn` tokens.
   */
  readonly pieceGap?: number;
  /**
   * Pieces split by depth where the decoder can (`SlotDecoder.prefillPart`): while others generate, a long
   * prompt's piece is as wide as a chunk and runs in parts of a few layers, one part per round, as many parts
   * as the round's budget of whole pieces asks for (default false).
   */
  readonly pieceParts?: boolean;
  /** The pacer's clock in ms (default `performance.now`; tests give a clock that GPU calls advance). */
  readonly now?: () => number;
  /**
   * Most prompt tokens prefilled per round while no request generates (0: a whole prompt at once; below
   * `prefillTurn`: `prefillTurn`). Absent: `prefillTurn`.
   */
  readonly prefillAlone?: number;
  /**
   * Fewest generating requests that share one batched GPU step (2..MAX_BATCH_SLOTS: 2 always batches; or 0:
   * never batch); fewer take turns, one request per call.
   */
  readonly batchMin: number;
}

interface Active {
  readonly job: RunnerJob;
  readonly resolve: (r: JobResult) => void;
  readonly reject: (e: unknown) => void;
  /** Slot, once the loop has seen it (-1 before). */
  slot: number;
  /** Prompt tokens found in the slot's history or a snapshot. */
  base: number;
  /** Prompt tokens the slot holds before the first generate (the hit, or the pieces prefilled). */
  held: number;
  /** Every id made so far, streamed or not. */
  readonly made: number[];
  /** Ids handed to `onTokens`. */
  readonly got: number[];
  /** Whether the slot holds exactly the first `stage.length(slot)` tokens of prompt ++ made. */
  consistent: boolean;
  /** Ids made in calls shared with other requests. */
  batched: number;
  /** Σ over its generate calls of (requests in the call × ids it made there): batch size seen, weighted. */
  batchIds: number;
  /** Whether a generate call holds it now. */
  running: boolean;
  /** When it last took part in a generate call (rotation order when not all fit one step). */
  lastRun: number;
  /** A piece in parts (`pieceParts`): its end in the prompt, its layer bounds and the next part's index. */
  part?: { readonly end: number; readonly bounds: readonly number[]; next: number };
  /**
   * It started alone (see `#lone`) and has made only that call's first id: a burst that arrived meanwhile
   * is gathered (its pieces) before it decodes on, as if it had not started.
   */
  firstOnly?: boolean;
}

/** Runs requests on a SlotDecoder's slots with continuous batching and per-slot prefix reuse; see the module doc. */
export class SlotRunner {
  readonly #stage: SlotDecoder;
  readonly #batch: number;
  readonly #pieceSteps: number;
  readonly #turnTokens: number;
  readonly #snapshotBack: number;
  readonly #prefillTurn: number;
  readonly #prefillAlone: number;
  readonly #batchMin: number;
  readonly #pacer: PiecePacer;
  readonly #pieceParts: boolean;
  /**
   * The decoder snapshots inside a prefill's passes (SlotDecoder.snapInPrefill): a piece past the point takes
   * it, and goes on to the prompt's last token.
   */
  readonly #snapIn: boolean;
  readonly #now: () => number;
  /** Prompt tokens of the current round's pieces (a rest up to this joins the decode call instead). */
  #roundBudget: number;
  /** Tokens each slot's state holds exactly (empty: unknown, the next request resets it). */
  readonly #history: number[][];
  /** Each slot's latest prompt-boundary snapshot and the tokens it holds. */
  readonly #snaps: ({ id: number; tokens: readonly number[] } | undefined)[];
  readonly #lastUsed: number[];
  /** Slots of requests still running. */
  readonly #owned = new Set<number>();
  /** Requests submitted and not yet ended, in arrival order. */
  readonly #jobs: Active[] = [];
  #clock = 0;
  #looping = false;
  /** The idle work's current step (SlotDecoder.warmIdle): a loop starting meanwhile waits for it. */
  #idleStep: Promise<unknown> | undefined;

  /**
   * Wraps the slots of a whole model (a local stage's decode driver, or a split chain).
   * @param stage first and last stage (the whole model)
   */
  constructor(stage: SlotDecoder, opts: SlotRunnerOptions) {
    this.#stage = stage;
    this.#batch = opts.batch;
    this.#pieceSteps = Math.min(opts.pieceSteps ?? opts.batch, opts.batch);
    this.#turnTokens = opts.turnTokens > 0 ? opts.turnTokens : Infinity;
    this.#snapshotBack = opts.snapshotBack;
    this.#prefillTurn = opts.prefillTurn > 0 ? opts.prefillTurn : Infinity;
    const alone = opts.prefillAlone ?? opts.prefillTurn;
    this.#prefillAlone = Math.max(this.#prefillTurn, alone > 0 ? alone : Infinity);
    this.#roundBudget = this.#prefillTurn;
    this.#now = opts.now ?? (() => performance.now());
    this.#pieceParts = (opts.pieceParts ?? false) && stage.prefillPart !== undefined &&
      stage.parts !== undefined;
    this.#snapIn = stage.snapInPrefill === true;
    this.#pacer = new PiecePacer({
      gap: opts.pieceGap ?? 0,
      minPiece: this.#prefillTurn,
      maxPiece: this.#prefillAlone,
      batch: this.#batch,
      pieceSteps: this.#pieceSteps,
    });
    assert(
      opts.batchMin === 0 || (opts.batchMin >= 2 && opts.batchMin <= MAX_BATCH_SLOTS),
      "batchMin is 0 or 2..MAX_BATCH_SLOTS",
    );
    this.#batchMin = stage.canBatch && opts.batchMin > 0 ? opts.batchMin : Infinity;
    this.#snaps = new Array(stage.nSlots).fill(undefined);
    this.#history = Array.from({ length: stage.nSlots }, () => []);
    this.#lastUsed = new Array(stage.nSlots).fill(0);
    // The decoder's warm-up prepared one slot: the others while no request is here yet.
    void this.#idle();
  }

  /** Tokens slot `slot`'s state holds (a copy; empty when it holds nothing reusable). */
  history(slot: number): number[] {
    return [...this.#history[slot]!];
  }

  /**
   * Adds `job` to the running set; resolves when it ends (stop id, length, context or cancel). The caller
   * admits at most as many requests at once as the stage has slots.
   * @throws {RangeError} from the stage (a token id out of the vocabulary)
   */
  submit(job: RunnerJob): Promise<JobResult> {
    assert(this.#jobs.length < this.#history.length, "at most nSlots requests at once");
    return new Promise<JobResult>((resolve, reject) => {
      this.#jobs.push({
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
        batchIds: 0,
        running: false,
        lastRun: 0,
      });
      void this.#loop();
    });
  }

  async #loop(): Promise<void> {
    if (this.#looping) return;
    this.#looping = true;
    try {
      // Requests submitted in the same task (the worker hands over all that waited) start in one call.
      await Promise.resolve();
      // One slot's preparation (milliseconds): the decoder is not shared mid-step. Its failure is #idle's.
      if (this.#idleStep) {
        const t0 = this.#now();
        await this.#idleStep.catch(() => {});
        trace("idle-wait", { ms: this.#now() - t0 });
      }
      while (this.#sweep()) {
        // Prompt pieces of the new requests, oldest first, up to the round's budget in all (short pieces up to
        // a snapshot point of several requests share one), then one decode turn of everything generating: a
        // long prompt does not freeze the streams in flight. With no stream in flight, prefillAlone tokens.
        // While others stream, the pacer sizes the round (its pieces and its turn: about pieceGap times their
        // steady gap) from what the rounds and turns before it took.
        const generating = this.#generating();
        this.#roundBudget = generating ? this.#pacer.budget() : this.#prefillTurn;
        let budget = generating ? this.#roundBudget : this.#prefillAlone;
        const t0 = this.#now();
        let pieced = 0;
        for (let n = this.#nextPiece(); n && budget > 0; n = this.#nextPiece()) {
          try {
            // A part of a piece in parts fills its round (its tokens: the piece's times its share of layers).
            // (A piece begun in parts ends in parts, whether or not the others still generate.)
            const part = generating || n.part ? await this.#prefillPart(n, budget) : undefined;
            const done = part ?? await this.#prefillPiece(n, budget);
            budget = part === undefined ? budget - done : 0;
            pieced += done;
            trace("piece", { slot: n.slot, done });
          } catch (e) {
            n.part = undefined;
            this.#fail([n], e);
          }
        }
        // The pieces were encoded in this task, and the decode call's readback blocks the thread: a request
        // handed over meanwhile (the worker's message) still waits in the event loop's queue. One macrotask
        // lets it in before the call is formed (it starts with these, or ends the call at its first readback).
        if (pieced > 0) await nextTask();
        // Nothing generated yet and requests arrived during these pieces (a burst whose requests came in
        // separate tasks): their pieces first, so that all start in one decode call. A stream started alone
        // would have the others join it one by one, each join a short call, and its gaps would hold their
        // pieces. Ends: the runner holds at most nSlots requests, and each round prefills some of them.
        if (!generating && pieced > 0 && this.#jobs.some((a) => a.slot < 0 && !a.job.signal.aborted)) {
          continue;
        }
        const { group, rotating } = this.#group(budget);
        if (group.length > 0) {
          try {
            const tTurn = this.#now();
            const t = await this.#turn(group, rotating);
            trace("turn", { group: group.length, pieced, piecesMs: tTurn - t0, turnMs: this.#now() - tTurn });
            // Rounds with pieces only: a round of a joining rest alone is mostly fixed cost and would shrink
            // the next long prompt's first pieces to the smallest.
            if (generating && pieced > 0) this.#pacer.round(pieced + t.prefilled, t.steps, this.#now() - t0);
          } catch (e) {
            this.#fail(group.filter((a) => this.#jobs.includes(a)), e);
          }
        }
      }
    } finally {
      this.#looping = false;
    }
    void this.#idle();
  }

  /**
   * While no request is held: the decoder's idle work (SlotDecoder.warmIdle), one step per event-loop task, so
   * that a request arriving meanwhile waits for one step at most. A failure only leaves that work undone.
   */
  async #idle(): Promise<void> {
    const warm = this.#stage.warmIdle?.bind(this.#stage);
    if (!warm || this.#idleStep) return;
    try {
      while (this.#jobs.length === 0 && !this.#looping) {
        const t0 = this.#now();
        this.#idleStep = warm(this.#pickOrder());
        const did = await this.#idleStep;
        trace("idle-step", { did, ms: this.#now() - t0 });
        if (!did) break;
        await nextTask();
      }
    } catch {
      // Idle work is optional: the next request on that slot prepares it itself.
    } finally {
      this.#idleStep = undefined;
    }
  }

  /** Every slot in the order requests without a prefix hit take them: least recently used first. */
  #pickOrder(): number[] {
    const at = this.#lastUsed;
    return at.map((_, s) => s).sort((a, b) => at[a]! - at[b]! || a - b);
  }

  /**
   * Between GPU calls: ends the requests cancelled meanwhile and gives the new ones their slots, in arrival
   * order. Returns whether any request is left.
   */
  #sweep(): boolean {
    for (const a of [...this.#jobs]) {
      if (a.job.signal.aborted) a.resolve(this.#finish(a, "cancelled"));
      else this.#assign(a);
    }
    return this.#jobs.length > 0;
  }

  /**
   * The requests of the next decode call: the generating ones and the new ones whose prompt rest fits one
   * piece and what is left of this round's prefill `budget` (the call prefills it before its steps: a new
   * one beyond the budget waits one turn), new ones first, then the least recently run, as many as one step
   * holds (all of them from `batchMin` on, else one). `rotating`: others could run too (counting requests not
   * seen yet), so the members take a turn of `turnTokens` ids, a new one only its first.
   */
  #group(budget: number): { group: Active[]; rotating: boolean } {
    // A request that arrived during this round's pieces gets its slot at the next sweep.
    const ready = this.#jobs.filter((a) => {
      if (a.slot < 0 || a.job.signal.aborted || this.#pieceDue(a)) return false;
      if (a.made.length > 0) return true;
      budget -= a.job.prompt.length - a.held;
      return budget >= 0;
    });
    const unseen = this.#jobs.filter((a) => a.slot < 0).length;
    const max = ready.length + unseen >= this.#batchMin ? MAX_BATCH_SLOTS : 1;
    ready.sort((x, y) =>
      (x.made.length === 0 ? 0 : 1) - (y.made.length === 0 ? 0 : 1) || x.lastRun - y.lastRun
    );
    // A decoder that cannot batch may also ignore pause (a split chain): turns bound the others' wait there.
    return { group: ready.slice(0, max), rotating: ready.length + unseen > max || !this.#stage.canBatch };
  }

  /** Ends `group`'s requests with `e` (the slot state is unknown after a failed GPU call). */
  #fail(group: readonly Active[], e: unknown): void {
    for (const m of group) {
      m.consistent = false;
      m.running = false;
      this.#finish(m, "cancelled");
      m.reject(e);
    }
  }

  /** Gives `a` its slot when the loop first sees it (restoring the snapshot it reuses). */
  #assign(a: Active): void {
    if (a.slot >= 0) return;
    const { slot, base, snap } = this.#pick(a.job.prompt);
    [a.slot, a.base, a.held, a.consistent] = [slot, base, base, base > 0];
    this.#owned.add(slot);
    this.#lastUsed[slot] = ++this.#clock;
    // Until the request ends cleanly the slot's contents belong to it: an error leaves the slot unknown.
    this.#history[slot] = [];
    if (snap !== undefined) this.#stage.restore(snap, slot);
    a.job.onSlot?.(slot, base);
  }

  /**
   * One decode call of `group`: new requests join with their prompt rest, generating ones resume; the call
   * returns at the first readback where work waits outside it or a sequence ended (see the module doc).
   * With `rotating` (others wait for a place in the step) a member makes at most `turnTokens` ids, a new one
   * only its first (time to first token is its own prefill, not the others' turns).
   */
  async #turn(group: readonly Active[], rotating: boolean): Promise<{ steps: number; prefilled: number }> {
    const stage = this.#stage;
    let prefilled = 0;
    // A lone start's snapshot point, taken inside its prefill.
    const snapAts: (number | undefined)[] = [];
    const lone = group.length === 1 && this.#lone(group[0]!);
    const items: BatchItem[] = group.map((a) => {
      const { job } = a;
      a.running = true;
      a.lastRun = ++this.#clock;
      a.firstOnly = lone;
      // Ids this request can make in all: the context holds the prompt and all of them but the last.
      const rest = limitOf(a, stage.nCtx) - a.made.length;
      const nNew = lone ? 1 : !rotating ? rest : a.made.length === 0 ? 1 : Math.min(this.#turnTokens, rest);
      // Batches landing one after another in one call are the streams' steady gap: the pacer's step time.
      let landed: number | undefined;
      const emit = (ids: readonly number[]) => {
        const now = this.#now();
        if (landed !== undefined) this.#pacer.steady(ids.length, now - landed);
        landed = now;
        if (job.signal.aborted) return;
        a.got.push(...ids);
        job.onTokens(ids);
      };
      // The slot holds the cached prefix and pieces (new request) or all of prompt ++ made but the last id.
      const seq = [...job.prompt, ...a.made];
      const resume = a.made.length > 0;
      const base = resume ? seq.length - 1 : a.held;
      if (!resume) prefilled += seq.length - base;
      const snapAt = lone ? this.#snapPoint(a) : undefined;
      snapAts.push(snapAt);
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
          resume,
          stopIds: job.stopIds,
          signal: job.signal,
          onTokens: emit,
          // A resumed request continues the same random stream and penalty window.
          sampling: job.sampling,
          samplerStep: a.made.length,
          samplerHistory: seq,
          snapAt,
          // A lone start's prompt is prefilled in this call: its progress, chunk by chunk, as a piece's.
          onPrefill: lone && job.onSlot ? (done: number) => job.onSlot!(a.slot, base + done) : undefined,
        },
      };
    });
    // The turn ends at the first readback after work appears outside it: a new request (not seen yet, with a
    // piece due, or waiting for prefill budget: pieces and turns alternate), or a waiting request cancelled.
    // Generating requests waiting for a place in the step do not end it: turnTokens bounds it for them.
    const waiting = () => this.#jobs.some((b) => !b.running && (b.made.length === 0 || b.job.signal.aborted));
    // A request joining streams in flight (its prompt rest is prefilled in this call, before the steps) ends
    // the call at its first readback too: the streams' gap then holds the rest and pieceSteps steps, like a
    // round of pieces, not the rest and a whole batch (on the H200 the late prompt's last round, its rest
    // joining with 8 steps of 7 streams, was the streams' worst gap). The next call runs whole batches again.
    const joining = prefilled > 0 && items.some((it) => it.opts.resume);
    const pause = joining ? () => true : waiting;
    // Work waiting already: the call ends at its first readback, which comes after pieceSteps steps.
    const batch = joining || waiting() ? this.#pieceSteps : this.#batch;
    const rs = await stage.generate(items, { batch, pause });
    let steps = 0;
    for (const [i, a] of group.entries()) {
      const r = rs[i]!;
      const { job } = a;
      a.running = false;
      const snapAt = snapAts[i];
      if (r.snapshot !== undefined && snapAt !== undefined) {
        this.#setSnap(a.slot, r.snapshot, job.prompt, snapAt);
      }
      // The slot now holds base, the new tokens and every returned id but the last, whatever the reason.
      a.made.push(...r.tokens);
      a.consistent = true;
      if (group.length > 1) a.batched += r.tokens.length;
      a.batchIds += group.length * r.tokens.length;
      let end: JobResult["reason"] | undefined;
      if (!r.paused && (r.reason === "stop" || r.reason === "cancelled")) end = r.reason;
      else if (a.made.length >= job.maxTokens) end = "length";
      else if (a.made.length >= limitOf(a, stage.nCtx)) end = "context";
      if (end) a.resolve(this.#finish(a, end));
      steps = Math.max(steps, r.steps);
    }
    return { steps, prefilled };
  }

  /** Ends `a`: frees its slot and records what the slot holds; returns the result. */
  #finish(a: Active, reason: JobResult["reason"]): JobResult {
    const at = this.#jobs.indexOf(a);
    assert(at >= 0, "a request ends once");
    this.#jobs.splice(at, 1);
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
      meanBatch: a.made.length > 0 ? a.batchIds / a.made.length : 0,
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
    const lru = this.#pickOrder().find((s) => !this.#owned.has(s)) ?? -1;
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

  /**
   * Whether some request (slot assigned, not cancelled) has made ids and so waits for decode turns (a lone
   * start's first id alone does not count: `firstOnly`).
   */
  #generating(): boolean {
    return this.#jobs.some((a) => a.slot >= 0 && !a.job.signal.aborted && a.made.length > 0 && !a.firstOnly);
  }

  /**
   * Whether `a` starts alone: the only request the runner holds, new, its whole rest within what an idle
   * round prefills, on a decoder that snapshots inside a prefill. Its whole prompt then goes to one decode
   * call that makes its first id only (the snapshot taken inside that prefill): its time to first token is the
   * engine's, not a piece's and a one-token rest's with a readback between. A request arriving meanwhile is
   * pieced and gathered as in a burst (`firstOnly`).
   */
  #lone(a: Active): boolean {
    return this.#snapIn && this.#jobs.length === 1 && a.made.length === 0 && !a.part &&
      a.job.prompt.length - a.held <= this.#prefillAlone;
  }

  /** The request with a piece in parts, else the oldest (slot assigned, not cancelled) with a piece due. */
  #nextPiece(): Active | undefined {
    const due = (a: Active) => a.slot >= 0 && !a.job.signal.aborted && this.#pieceDue(a);
    return this.#jobs.find((a) => a.part && due(a)) ?? this.#jobs.find(due);
  }

  /** Whether `a` (slot assigned) has a prompt piece to prefill as a turn of its own before it generates. */
  #pieceDue(a: Active): boolean {
    if (a.made.length > 0) return false;
    if (a.part) return true;
    if (this.#lone(a)) return false;
    return this.#snapPoint(a) !== undefined || a.job.prompt.length - a.held > this.#roundBudget;
  }

  /**
   * The prompt-boundary snapshot point still ahead of `a`'s pieces (`snapshotBack` before the prompt's end,
   * when the prompt has more new tokens than that), or undefined.
   */
  #snapPoint(a: Active): number | undefined {
    const at = this.#snapshotBack > 0 ? a.job.prompt.length - this.#snapshotBack : 0;
    return at > a.base && a.held < at ? at : undefined;
  }

  /**
   * Prefills one piece of a long prompt between the others' decode turns: up to `max` tokens, ending before
   * the prompt's last token (SlotDecoder.generate prefills the rest itself) and, where the decoder cannot
   * snapshot inside a prefill, at the snapshot point (`snapshotBack` before the prompt's end, when the prompt
   * has more new tokens than that). The slot's snapshot is replaced at that point. Returns the tokens
   * prefilled.
   */
  async #prefillPiece(a: Active, max: number): Promise<number> {
    assert(this.#pieceDue(a) && max >= 1, "a piece is due");
    const end = this.#pieceEnd(a, max);
    const n = end - a.held;
    const at = this.#snapPoint(a);
    const snapAt = this.#snapIn && at !== undefined && at <= end ? at : undefined;
    a.consistent = false;
    const id = await this.#stage.prefill(a.slot, a.job.prompt.slice(a.held, end), a.held, snapAt);
    if (snapAt !== undefined && typeof id === "number") this.#setSnap(a.slot, id, a.job.prompt, snapAt);
    this.#pieceDone(a, end, snapAt !== undefined);
    return n;
  }

  /**
   * Where a piece of at most `max` tokens from `a.held` ends: before the last token, and at the snapshot
   * point where the decoder cannot take it inside the piece (`parts`: a piece run in parts never does).
   */
  #pieceEnd(a: Active, max: number, parts = false): number {
    const stop = this.#snapIn && !parts ? undefined : this.#snapPoint(a);
    return Math.min(a.held + max, stop ?? a.job.prompt.length - 1);
  }

  /**
   * After a piece up to `end`: the slot holds it; a piece ending at the snapshot point replaces the slot's
   * snapshot there (unless the piece took it, `snapped`).
   */
  #pieceDone(a: Active, end: number, snapped = false): void {
    const at = this.#snapPoint(a);
    a.consistent = true;
    a.held = end;
    a.job.onSlot?.(a.slot, end);
    if (!snapped && at !== undefined && end === at) {
      this.#setSnap(a.slot, this.#stage.snapshot(a.slot), a.job.prompt, at);
    }
  }

  /** Makes snapshot `id` (of `prompt`'s first `at` tokens) `slot`'s prompt-boundary snapshot, dropping the old. */
  #setSnap(slot: number, id: number, prompt: readonly number[], at: number): void {
    const old = this.#snaps[slot];
    if (old) this.#stage.drop(old.id);
    this.#snaps[slot] = { id, tokens: prompt.slice(0, at) };
  }

  /**
   * With `pieceParts`, while others generate: the next part of `a`'s piece in parts, or the first part of a
   * new one where a chunk-wide piece needs two parts or more at `max` tokens of thin pieces per round (the
   * parts split the layers evenly). Returns the part's tokens (the piece's times its share of the layers),
   * or undefined where the piece runs whole.
   */
  async #prefillPart(a: Active, max: number): Promise<number | undefined> {
    if (!this.#pieceParts) return undefined;
    const { layers: [l0, l1], maxTokens } = this.#stage.parts!;
    if (!a.part) {
      const end = this.#pieceEnd(a, maxTokens, true);
      const s = Math.min(l1 - l0, Math.ceil((end - a.held) / max));
      if (s < 2) return undefined;
      a.part = {
        end,
        bounds: Array.from({ length: s + 1 }, (_, i) => l0 + Math.round(i * (l1 - l0) / s)),
        next: 0,
      };
    }
    const p = a.part;
    const [from, to] = [p.bounds[p.next]!, p.bounds[p.next + 1]!];
    a.consistent = false;
    await this.#stage.prefillPart!(a.slot, a.job.prompt.slice(a.held, p.end), a.held, [from, to]);
    const tokens = (p.end - a.held) * (to - from) / (l1 - l0);
    if (++p.next === p.bounds.length - 1) {
      a.part = undefined;
      this.#pieceDone(a, p.end);
    }
    return tokens;
  }
}

/** Ids `a` can make in all: its maximum, or what the context holds (the prompt and all ids but the last). */
function limitOf(a: Active, nCtx: number): number {
  return Math.min(a.job.maxTokens, nCtx - a.job.prompt.length + 1);
}
