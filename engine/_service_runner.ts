/**
 * The worker side of the engine service, without the Worker: runs one request at a time on a {@linkcode Stage},
 * picks its slot (the slot whose cached history the prompt extends, else the least recently used one), reuses
 * that history instead of prefilling it again, streams ids in batches and stops at the next batch boundary
 * when the request is cancelled.
 *
 * Prefix reuse keeps the slot's live state instead of a snapshot: after a request the slot holds exactly its
 * history (prompt and generated ids but the last, see {@linkcode Stage.generate}), and no other request
 * touches a slot's state buffers, so a prompt that strictly extends the history continues in place from
 * position `history.length` (the recurrent state cannot rewind: anything but an exact extension is a miss).
 * @module
 */
import { argmaxCpu, type Stage } from "./stage.ts";
import { assert } from "./errors.ts";
import type { JobResult } from "./_service_protocol.ts";

/** One request as the runner sees it. */
export interface RunnerJob {
  /** Prompt token ids (≥ 1; prompt + 1 fits the context: checked by the service). */
  readonly prompt: readonly number[];
  /** Most ids to generate (≥ 1). */
  readonly maxTokens: number;
  /** Ids that end generation (included in the output). */
  readonly stopIds: readonly number[];
  /** Polled at every batch boundary: true stops the request there. */
  readonly isCancelled: () => boolean;
  /** Each batch of new ids, in order (never called after a cancel is seen). */
  readonly onTokens: (ids: readonly number[]) => void;
}

/** Thrown from Stage.generate's `onTokens` to leave it at a batch boundary (it has no abort hook). */
const CANCELLED: unique symbol = Symbol("cancelled");

/** Runs requests on a Stage's slots with per-slot prefix reuse; see the module doc. */
export class SlotRunner {
  readonly #stage: Stage;
  readonly #device: GPUDevice;
  readonly #batch: number;
  /** Tokens each slot's state holds exactly (empty: unknown, the next request resets it). */
  readonly #history: number[][];
  readonly #lastUsed: number[];
  #clock = 0;

  /**
   * Wraps a loaded whole-model stage.
   * @param stage first and last stage (the whole model)
   * @param opts `device`: the stage's device; `batch`: decode steps per readback (1..64)
   */
  constructor(stage: Stage, opts: { device: GPUDevice; batch: number }) {
    assert(stage.first && stage.last, "the service runs a whole-model stage");
    this.#stage = stage;
    this.#device = opts.device;
    this.#batch = opts.batch;
    this.#history = Array.from({ length: stage.states.nSlots }, () => []);
    this.#lastUsed = new Array(stage.states.nSlots).fill(0);
  }

  /** Tokens slot `slot`'s state holds (a copy; empty when it holds nothing reusable). */
  history(slot: number): number[] {
    return [...this.#history[slot]!];
  }

  /**
   * Runs `job` to its end (stop id, length, context or cancel).
   * @throws {RangeError} from the stage (a token id out of the vocabulary)
   */
  async run(job: RunnerJob): Promise<JobResult> {
    const stage = this.#stage;
    const { slot, base } = this.#pick(job.prompt);
    this.#lastUsed[slot] = ++this.#clock;
    const history = this.#history[slot]!;
    // Until the request ends cleanly the slot's contents are unknown: an error leaves it to be reset.
    this.#history[slot] = [];
    const got: number[] = [];
    const done = (reason: JobResult["reason"], prefilled: number): JobResult => ({
      tokens: got,
      reason,
      slot,
      cachedTokens: base,
      prefilledTokens: prefilled,
      snapshotBytes: stage.states.snapshotBytes,
    });
    if (job.isCancelled()) {
      this.#history[slot] = history;
      return done("cancelled", 0);
    }
    const emit = (ids: readonly number[]) => {
      if (job.isCancelled()) throw CANCELLED;
      got.push(...ids);
      job.onTokens(ids);
    };
    const prefilled = job.prompt.length - base;
    const made: number[] = [];
    let reason: JobResult["reason"];
    try {
      if (base === 0) {
        reason = (await stage.generate(slot, job.prompt, {
          nNew: job.maxTokens,
          stopIds: job.stopIds,
          batch: this.#batch,
          onTokens: emit,
        })).reason;
      } else {
        reason = await this.#continue(slot, job, { base, emit, made });
      }
    } catch (e) {
      if (e !== CANCELLED) throw e;
      if (base === 0) {
        // Stage.generate was left mid-flight: its next batch may still be queued and the snapshots it
        // takes per batch (when stop ids are set) were never dropped. Wait for the queue, then drop them.
        await this.#device.queue.onSubmittedWorkDone();
        this.#dropOrphanSnapshots();
      } else {
        // The stepwise path leaves the slot consistent: it holds the prompt and every id fed so far.
        this.#history[slot] = [...job.prompt, ...made].slice(0, stage.length(slot));
      }
      return done("cancelled", prefilled);
    }
    const held = stage.length(slot);
    assert(held === job.prompt.length + got.length - 1, `slot ${slot} holds ${held} tokens after a request`);
    this.#history[slot] = [...job.prompt, ...got.slice(0, -1)];
    return done(reason, prefilled);
  }

  /** The slot whose history `prompt` strictly extends (longest wins), else the least recently used slot. */
  #pick(prompt: readonly number[]): { slot: number; base: number } {
    let best = -1;
    let bestLen = 0;
    for (const [s, h] of this.#history.entries()) {
      if (h.length === 0 || h.length >= prompt.length || h.length <= bestLen) continue;
      let same = true;
      for (let i = 0; i < h.length && same; i++) same = h[i] === prompt[i];
      if (same) [best, bestLen] = [s, h.length];
    }
    if (best >= 0) return { slot: best, base: bestLen };
    let lru = 0;
    for (let s = 1; s < this.#lastUsed.length; s++) if (this.#lastUsed[s]! < this.#lastUsed[lru]!) lru = s;
    return { slot: lru, base: 0 };
  }

  /**
   * Greedy generation continuing the slot's state at `base`: prefills `prompt[base..]`, then one
   * `Stage.run` per id. Same tokens as Stage.generate (same decode graph, ties to the lowest id), but each
   * step awaits a readback. Every id made goes into `made` at once (streamed or not), so a cancel knows
   * what the slot holds.
   * TODO(stage-base): use Stage.generate once it can start from a prefilled slot (`base` option).
   */
  async #continue(
    slot: number,
    job: RunnerJob,
    { base, emit, made }: { base: number; emit: (ids: readonly number[]) => void; made: number[] },
  ): Promise<JobResult["reason"]> {
    const stage = this.#stage;
    const stops = new Set(job.stopIds);
    const nNew = Math.min(job.maxTokens, stage.nCtx - job.prompt.length + 1);
    let out = await stage.run(slot, { tokens: job.prompt.slice(base) }, base);
    let id = argmaxCpu(out.data);
    made.push(id);
    emit([id]);
    let n = 1;
    let pending: number[] = [];
    while (n < nNew && !stops.has(id)) {
      if (job.isCancelled()) throw CANCELLED;
      out = await stage.run(slot, { tokens: [id] }, stage.length(slot));
      id = argmaxCpu(out.data);
      made.push(id);
      n++;
      pending.push(id);
      if (pending.length >= this.#batch || stops.has(id) || n === nNew) {
        emit(pending);
        pending = [];
      }
    }
    return stops.has(id) ? "stop" : nNew < job.maxTokens ? "context" : "length";
  }

  /**
   * Drops snapshots a cancelled Stage.generate left behind. The runner takes none of its own, so every
   * snapshot is an orphan; their ids are the most recent ones (ids count up), found by probing downwards from
   * a fresh id until no snapshot bytes remain.
   * TODO(stage-signal): remove once Stage.generate takes an AbortSignal and cleans up itself.
   */
  #dropOrphanSnapshots(): void {
    const states = this.#stage.states;
    if (states.snapshotBytes === 0) return;
    // A snapshot recorded into an encoder that is never submitted copies nothing: it only yields the next id.
    const probe = states.snapshot(this.#device.createCommandEncoder(), 0, 0);
    states.drop(probe);
    for (let id = probe - 1; id > 0 && states.snapshotBytes > 0; id--) {
      if (snapshotExists(this.#stage, id)) states.drop(id);
    }
  }
}

function snapshotExists(stage: Stage, id: number): boolean {
  try {
    stage.states.snapshotLength(id);
    return true;
  } catch (e) {
    if (e instanceof RangeError) return false;
    throw e;
  }
}
