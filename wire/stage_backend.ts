/**
 * A worker's stage as the link's {@linkcode StageBackend}: runs received hidden rows through its layers; a
 * last stage then picks one id per producing row (argmax on the logits, ties to the lowest id, or the GPU
 * sampler with the run's settings, seed, RNG step and history: `Stage.sampleRows`, the unsplit engine's draw)
 * with top-k pairs; a middle stage forwards its own output rows to the next stage ({@linkcode ChainLink}) and
 * prepends its time.
 *
 * Drafted runs (docs/WIRE.md "Drafts and rollback"): before a run with drafts the stage snapshots the slot
 * (its anchor) and keeps the run's rows; a later run of the slot at a position inside those rows restores the
 * anchor and re-runs the kept rows up to it first. A last stage computes a drafted run's rows (at most
 * MATVEC_MAX_COLS) as one chunk, whose attention runs its rows as the columns of a batched step, so each
 * row's logits are the bits of the undrafted run's (longer runs: the id rows as one-token steps); greedy ids
 * without top-k pairs come from an argmax per row in the chunk's pass.
 *
 * Requests are applied one at a time in arrival order (the stage's activation buffers are shared by all
 * slots), but a last stage's argmax frame (greedy, no sampler) holds that turn only while it submits: its ids
 * are drawn on the GPU in the frame's pass (only the ids come back when no top-k pairs are asked), and the
 * next frame's work is submitted while its readback waits out the ~10 ms poll (docs/PLATFORM.md). A later
 * request on the same slot, and every other kind of request, waits for the readbacks in flight first. A middle stage remembers, per slot and per snapshot, the connection to its next stage the state
 * behind it lives on; when that connection is gone it answers {@linkcode STALE_MARK} so the head replays.
 * @module
 */
import {
  ARGMAX_RING,
  argmaxCpu,
  checkSampling,
  isGreedy,
  MATVEC_MAX_COLS,
  type PendingRun,
  type RowSampleOptions,
  type SamplingParams,
  type Stage,
  stageInfo,
  type StageOutput,
  topCpu,
} from "../engine/mod.ts";
import { WireError } from "./errors.ts";
import type { RunBatchRequest, RunRequest, RunResult, WireSampling } from "./frame.ts";
import type { HelloInfo } from "./hello.ts";
import type { StageBackend } from "./link.ts";
import { type ChainLink, helloOf, STALE_MARK } from "./chain.ts";

/** Options of {@linkcode stageBackend}. */
export interface StageBackendOptions {
  /** This build (the hello's `build`). */
  readonly build: { readonly version: string; readonly commit: string };
  /** GGUF `general.architecture`. */
  readonly arch: string;
  /** The next stage, for a middle worker (its range must not end at the last layer). */
  readonly next?: ChainLink;
}

/**
 * Serves `stage` (layers `a:b`, a > 0) over the link; see the module doc.
 * @throws {RangeError} when the stage starts at layer 0 (that is the head's range), or a middle stage has no
 *   next stage, or a last stage has one
 */
export function stageBackend(stage: Stage, opts: StageBackendOptions): StageBackend {
  const range = `${stage.layers[0]}:${stage.layers[1]}`;
  if (stage.first) {
    throw new RangeError(
      `--layers ${range} starts at layer 0: that range is the head's; a worker starts later`,
    );
  }
  if (!stage.last && !opts.next) {
    throw new RangeError(
      `--layers ${range} ends before the last layer ${stage.hp.nLayer}: give --next HOST:PORT of the stage ` +
        `running ${stage.layers[1]}:${stage.hp.nLayer}, or --layers ${stage.layers[0]}:${stage.hp.nLayer}`,
    );
  }
  if (stage.last && opts.next) {
    throw new RangeError(`--layers ${range} ends at the last layer: a last stage takes no --next`);
  }
  const info = stageInfo(stage, opts.arch);
  const next = opts.next;
  next?.attach(info);
  const nSlots = stage.states.nSlots;
  /** Per slot: the connection to the next stage its state behind this one lives on. */
  const slotEpoch: (number | undefined)[] = new Array(nSlots).fill(undefined);
  /** Per snapshot of this stage: the next stage's snapshot and its connection. */
  const downSnaps = new Map<number, { id: number; epoch: number } | undefined>();
  let tail: Promise<unknown> = Promise.resolve();
  const serial = <T>(f: () => Promise<T>): Promise<T> => {
    const p = tail.then(f);
    tail = p.catch(() => {});
    return p;
  };
  /** Per slot: the readback of its overlapped last-stage run still in flight (settles, never rejects). */
  const inflight = new Map<number, Promise<void>>();
  /** Waits for the in-flight readbacks of `slots` (all slots when absent). */
  const quiesce = async (slots?: readonly number[]) => {
    const ps = slots ? slots.map((s) => inflight.get(s)) : [...inflight.values()];
    for (const p of ps) if (p) await p;
  };
  /** Keeps `slots`' readback in flight until `output` settles (a later request on them waits for it). */
  const track = (slots: readonly number[], output: Promise<unknown>) => {
    const done = output.then(() => {}, () => {});
    for (const s of slots) inflight.set(s, done);
    done.then(() => {
      for (const s of slots) if (inflight.get(s) === done) inflight.delete(s);
    });
  };
  /** `serial` once no overlapped readback is in flight: the request sees the stage as the old serial one. */
  const serialQuiet = <T>(f: () => Promise<T>): Promise<T> =>
    serial(async () => {
      await quiesce();
      return await f();
    });
  const prof = stage.profile;
  const staleError = (what: string) =>
    new WireError("backend", `${STALE_MARK} ${what} on layers ${range}: its next stage restarted: replay`);
  const nEmbd = stage.hp.nEmbd;
  /** Per slot: the snapshot before its latest drafted run, that run's position and its input rows. */
  const anchors: ({ id: number; base: number; rows: Float32Array<ArrayBuffer> } | undefined)[] = new Array(
    nSlots,
  ).fill(undefined);
  const dropAnchor = (slot: number) => {
    const a = anchors[slot];
    if (a) stage.states.drop(a.id);
    anchors[slot] = undefined;
  };
  /**
   * Per slot (last stage): the penalty history of its latest sampled run, and the ids that run returned with
   * the position of the first (kept once a later run shows they were accepted).
   */
  const hists: ({ ids: number[]; pending: Uint32Array; pendingPos: number } | undefined)[] = new Array(nSlots)
    .fill(undefined);

  /** The rollback rule: a run inside the slot's latest drafted run restores its anchor and re-runs up to it. */
  const rollBack = async (req: RunRequest, nRows: number): Promise<void> => {
    const { slot, basePos: b } = req;
    const held = stage.length(slot);
    if (b > 0 && b < held) {
      const a = anchors[slot];
      if (!a || b < a.base || b > a.base + a.rows.length / nEmbd) {
        throw new WireError(
          "backend",
          `Run of slot ${slot} at position ${b}, but layers ${range} hold ${held} tokens and no drafted run ` +
            `covers position ${b}: a run starts at the slot's length or inside its latest drafted run`,
        );
      }
      stage.restore(a.id, slot);
      const m = b - a.base;
      if (m > 0) {
        await stage.run(slot, { hidden: a.rows.subarray(0, m * nEmbd), nTokens: m }, a.base, {
          rows: "none",
        });
      }
    }
    dropAnchor(slot);
    if (req.drafts.length > 0) {
      anchors[slot] = { id: stage.snapshot(slot), base: b, rows: req.rows.slice(0, nRows * nEmbd) };
    }
  };

  /** The penalty history a sampled run on `slot` starts from (docs/WIRE.md: HISTORY, or the kept one). */
  const historyOf = (req: SlotAt): number[] => {
    const s = req.sampling!;
    const h = hists[req.slot];
    if (s.history) return Array.from(s.history);
    if (!h) return [];
    // The previous run's ids up to the token at this run's first row were accepted; later ones were not.
    const keep = Math.max(0, Math.min(h.pending.length, req.basePos - h.pendingPos + 1));
    return [...h.ids, ...h.pending.subarray(0, keep)];
  };

  /**
   * Whether a last stage's run draws its ids in the run's own pass (argmax or the GPU sampler, only the ids
   * read back): no top-k pairs, and for a sampled one-chunk frame, every row an output row (a lead row would
   * take an RNG step).
   */
  const idsInPass = (req: RunRequest, nRows: number): boolean => {
    const nOut = req.drafts.length + 1;
    const sampled = sampledOf(req.sampling) !== undefined;
    const oneChunk = nOut > 1 && nRows <= MATVEC_MAX_COLS;
    return req.topK === 0 && nOut <= ARGMAX_RING && !(sampled && oneChunk && nRows > nOut);
  };

  /** The sampler's start for a sampled run's first output row (absent: greedy). */
  const sampleOf = (req: SlotAt): RowSampleOptions | undefined => {
    const params = sampledOf(req.sampling);
    if (!params) return undefined;
    try {
      checkSampling(params);
    } catch (e) {
      throw new WireError("backend", `Layers ${range} cannot sample: ${(e as Error).message}`, { cause: e });
    }
    return { sampling: params, step: req.sampling!.step, history: historyOf(req) };
  };

  /** The sampler's draws on logits rows read back (a frame whose logits come back for its top-k pairs). */
  const sampleReadRows = async (
    logits: Float32Array<ArrayBuffer>,
    o: RowSampleOptions,
  ): Promise<Uint32Array> => {
    try {
      return await stage.sampleRows(logits, o);
    } catch (e) {
      throw new WireError("backend", `Layers ${range} cannot sample: ${(e as Error).message}`, { cause: e });
    }
  };

  /** A last stage's run submitted (rollback, lead rows, the rows that produce ids), its output pending. */
  const submitLast = async (req: RunRequest, nRows: number): Promise<PendingRun> => {
    if (req.want === "last" || req.want === "all") {
      throw new WireError("backend", `Layers ${range} are the last stage: they return ids, not hidden rows`);
    }
    await rollBack(req, nRows);
    const hidden = req.rows as Float32Array<ArrayBuffer>;
    const nOut = req.drafts.length + 1;
    // Ids without top-k pairs: drawn on the GPU in the run's pass (the argmax, or the sampler at the rows' RNG
    // steps), only the ids read back.
    const ids = req.want !== "none" && idsInPass(req, nRows);
    const sample = ids ? sampleOf(req) : undefined;
    if (nOut === 1 || req.want === "none") {
      return await stage.submit(req.slot, { hidden, nTokens: nRows }, req.basePos, {
        rows: req.want === "none" ? "none" : "last",
        ids,
        sample,
      });
    }
    // A frame of at most MATVEC_MAX_COLS rows runs as one chunk, whose attention runs its rows as columns:
    // each row's logits are the bits of the undrafted one-token run (tests/chunk_exact_test.ts); the ids are
    // drawn from them. Longer frames run the rows that produce ids as one-token steps.
    if (nRows <= MATVEC_MAX_COLS) {
      const rows = "all";
      return await stage.submit(req.slot, { hidden, nTokens: nRows }, req.basePos, { rows, ids, sample });
    }
    const lead = nRows - nOut;
    if (lead > 0) {
      await stage.run(req.slot, { hidden: hidden.subarray(0, lead * nEmbd), nTokens: lead }, req.basePos, {
        rows: "none",
      });
    }
    return await stage.submit(
      req.slot,
      { hidden: hidden.subarray(lead * nEmbd), nTokens: nOut },
      req.basePos + lead,
      { rows: "all", chunk: 1, ids, sample },
    );
  };

  /** A last stage's ids (or nothing) from a run's logits. */
  const finishLast = async (
    req: RunRequest,
    nRows: number,
    out: StageOutput,
    t0: number,
  ): Promise<RunResult> => {
    const nOut = req.drafts.length + 1;
    if (req.want === "none") return { kind: "none", timesUs: [Math.round((performance.now() - t0) * 1000)] };
    const V = stage.hp.nVocab;
    const rows = out.data.length / V;
    const logits = out.data.subarray((rows - nOut) * V);
    let ids: Uint32Array;
    const params = sampledOf(req.sampling);
    const history = params ? historyOf(req) : [];
    if (out.ids) {
      // Drawn in the run's pass: the argmax or the sampler.
      ids = out.ids.subarray(out.ids.length - nOut);
    } else if (params) {
      const ts = performance.now();
      ids = await sampleReadRows(logits, { sampling: params, step: req.sampling!.step, history });
      prof.add("worker.sample", performance.now() - ts);
    } else {
      const ta = performance.now();
      ids = new Uint32Array(nOut);
      for (let j = 0; j < nOut; j++) ids[j] = argmaxCpu(logits.subarray(j * V, (j + 1) * V));
      prof.add("worker.argmax", performance.now() - ta);
    }
    // A sampled run's draws join the next run's penalty history.
    if (params) {
      hists[req.slot] = {
        ids: history.slice(-256),
        pending: ids.slice(),
        pendingPos: req.basePos + nRows - nOut + 1,
      };
    }
    const bad = ids.findIndex((id) => id >= V);
    if (bad >= 0) {
      throw new WireError(
        "backend",
        `Layers ${range}: the sampler found no usable logit (NaN, Inf or masked) at row ${
          nRows - nOut + bad
        } of slot ${req.slot}: check the model with \`inspect --check\``,
      );
    }
    const topIds = new Uint32Array(nOut * req.topK);
    const topLogits = new Float32Array(nOut * req.topK);
    if (req.topK > 0) prof.start();
    for (let j = 0; j < nOut && req.topK > 0; j++) {
      for (const [i, [id, logit]] of topCpu(logits.subarray(j * V, (j + 1) * V), req.topK).entries()) {
        topIds[j * req.topK + i] = id;
        topLogits[j * req.topK + i] = logit;
      }
    }
    if (req.topK > 0) prof.lap("worker.topK");
    const timesUs = [Math.round((performance.now() - t0) * 1000)];
    return { kind: "ids", ids, topK: req.topK, topIds, topLogits, timesUs };
  };

  const runMiddle = async (
    req: RunRequest,
    nRows: number,
    t0: number,
    down: ChainLink,
  ): Promise<RunResult> => {
    const epoch = req.basePos === 0 ? undefined : slotEpoch[req.slot];
    if (req.basePos > 0 && epoch === undefined) throw staleError(`slot ${req.slot}`);
    await rollBack(req, nRows);
    const out = await stage.run(
      req.slot,
      { hidden: req.rows as Float32Array<ArrayBuffer>, nTokens: nRows },
      req.basePos,
      {
        rows: "all",
      },
    );
    const own = Math.round((performance.now() - t0) * 1000);
    slotEpoch[req.slot] = undefined;
    let r: { result: RunResult; epoch: number };
    try {
      r = await down.forward({ ...req, rows: out.data }, epoch);
    } catch (e) {
      if (e instanceof Error && e.name === "StaleChainError") throw staleError(`slot ${req.slot}`);
      throw e;
    }
    slotEpoch[req.slot] = r.epoch;
    return { ...r.result, timesUs: [own, ...r.result.timesUs].slice(0, 16) };
  };

  /**
   * A batched frame's rows through this stage (docs/WIRE.md RUN_BATCH): every entry continues its slot at its
   * length, as one batched step (`Stage.runBatch`) or, for one entry or a shape that cannot batch, a run each.
   */
  const batchRows = async (req: RunBatchRequest, ids = false): Promise<{ output: Promise<StageOutput> }> => {
    for (const e of req.entries) {
      const held = stage.length(e.slot);
      if (e.basePos !== held) {
        throw new WireError(
          "backend",
          `Batched row of slot ${e.slot} at position ${e.basePos}, but layers ${range} hold ${held} tokens: ` +
            `a batched row continues its slot's sequence`,
        );
      }
    }
    for (const e of req.entries) dropAnchor(e.slot);
    const slots = req.entries.map((e) => e.slot);
    const hidden = req.rows as Float32Array<ArrayBuffer>;
    if (slots.length >= 2 && stage.canBatch) {
      // With ids, each sampled entry's draw runs in the step's pass too (its own settings, step and history).
      const sample = ids ? req.entries.map((e) => sampleOf(e)) : undefined;
      const pending = await stage.submitBatch(slots, { hidden, nTokens: slots.length }, { ids, sample });
      return { output: pending.output };
    }
    const width = stage.last ? stage.hp.nVocab : nEmbd;
    const out = new Float32Array(slots.length * width);
    for (const [b, e] of req.entries.entries()) {
      const row = hidden.subarray(b * nEmbd, (b + 1) * nEmbd);
      const r = await stage.run(e.slot, { hidden: row, nTokens: 1 }, e.basePos, { rows: "last" });
      out.set(r.data, b * width);
    }
    const kind = stage.last ? "logits" as const : "hidden" as const;
    return { output: Promise.resolve({ kind, data: out, rows: slots.length }) };
  };

  /** A last stage's ids of a batched frame: each entry drawn from its row's logits with its own settings. */
  const batchIds = async (req: RunBatchRequest, out: StageOutput, t0: number) => {
    const V = stage.hp.nVocab;
    const n = req.entries.length;
    const logits = out.data;
    const ids = new Uint32Array(n);
    const topIds = new Uint32Array(n * req.topK);
    const topLogits = new Float32Array(n * req.topK);
    for (const [b, e] of req.entries.entries()) {
      const row = logits.subarray(b * V, (b + 1) * V);
      const params = sampledOf(e.sampling);
      const history = params ? historyOf(e) : [];
      if (out.ids) {
        ids[b] = out.ids[b]!; // drawn in the step's pass: the argmax or the sampler
      } else if (params) {
        ids[b] = (await sampleReadRows(row, { sampling: params, step: e.sampling!.step, history }))[0]!;
      } else {
        const ta = performance.now();
        ids[b] = argmaxCpu(row);
        prof.add("worker.argmax", performance.now() - ta);
      }
      // A sampled entry's draw joins its slot's next penalty history.
      if (params) {
        hists[e.slot] = { ids: history.slice(-256), pending: ids.slice(b, b + 1), pendingPos: e.basePos + 1 };
      }
      if (ids[b]! >= V) {
        throw new WireError(
          "backend",
          `Layers ${range}: the sampler found no usable logit (NaN, Inf or masked) for slot ${e.slot}: ` +
            "check the model with `inspect --check`",
        );
      }
      for (const [i, [id, logit]] of (req.topK > 0 ? topCpu(row, req.topK) : []).entries()) {
        topIds[b * req.topK + i] = id;
        topLogits[b * req.topK + i] = logit;
      }
    }
    const timesUs = [Math.round((performance.now() - t0) * 1000)];
    if (req.want === "none") return { kind: "none" as const, timesUs };
    return { kind: "ids" as const, ids, topK: req.topK, topIds, topLogits, timesUs };
  };

  return {
    hello(): HelloInfo {
      const peer = next?.peer;
      const downstream = peer ? [{ ...peer, downstream: [] }, ...peer.downstream] : [];
      return helloOf(info, { build: opts.build, last: stage.last, downstream });
    },
    run(req: RunRequest): Promise<RunResult> {
      const nRows = req.rows.length / stage.hp.nEmbd;
      if (next) return serialQuiet(() => runMiddle(req, nRows, performance.now(), next));
      if (sampledOf(req.sampling) && !idsInPass(req, nRows)) {
        // The GPU sampler's draw on logits read back (one staging buffer, a history per slot) stays in turn.
        return serialQuiet(async () => {
          const t0 = performance.now();
          return await finishLast(req, nRows, await (await submitLast(req, nRows)).output, t0);
        });
      }
      // Ids drawn in the pass: the next frame's work goes in while this one's readback waits
      // (docs/PLATFORM.md).
      return (async () => {
        const { pending, t0 } = await serial(async () => {
          await quiesce([req.slot]);
          const t0 = performance.now();
          const pending = await submitLast(req, nRows);
          track([req.slot], pending.output);
          return { pending, t0 };
        });
        return await finishLast(req, nRows, await pending.output, t0);
      })();
    },
    async runBatch(req: RunBatchRequest): Promise<RunResult> {
      if (!next) {
        const slots = req.entries.map((e) => e.slot);
        const inPass = req.topK === 0 && slots.length >= 2 && stage.canBatch;
        if (!inPass && req.entries.some((e) => sampledOf(e.sampling))) {
          return await serialQuiet(async () => {
            const t0 = performance.now();
            return await batchIds(req, await (await batchRows(req)).output, t0);
          });
        }
        const { pending, t0 } = await serial(async () => {
          await quiesce(slots);
          const t0 = performance.now();
          const pending = await batchRows(req, req.topK === 0);
          track(slots, pending.output);
          return { pending, t0 };
        });
        return await batchIds(req, await pending.output, t0);
      }
      const t0 = performance.now();
      // A middle stage computes in turn, then sends the frame on and leaves the stage to the next frame while
      // the stages behind it work (frames of other slots overlap); sends keep arrival order.
      const sent = await serialQuiet(async () => {
        const epochs = new Set(req.entries.map((e) => slotEpoch[e.slot]));
        const epoch = slotEpoch[req.entries[0]!.slot];
        if (epoch === undefined || epochs.size !== 1) {
          throw staleError(`slots ${req.entries.map((e) => e.slot).join(",")}`);
        }
        const rows = (await (await batchRows(req)).output).data;
        const own = Math.round((performance.now() - t0) * 1000);
        for (const e of req.entries) slotEpoch[e.slot] = undefined;
        const forward = next.forwardBatch({ ...req, rows }, epoch);
        forward.catch(() => {/* awaited below */});
        return { own, forward };
      });
      let r: { result: RunResult; epoch: number };
      try {
        r = await sent.forward;
      } catch (e) {
        if (e instanceof Error && e.name === "StaleChainError") throw staleError("a batched run's slots");
        throw e;
      }
      for (const e of req.entries) slotEpoch[e.slot] = r.epoch;
      return { ...r.result, timesUs: [sent.own, ...r.result.timesUs].slice(0, 16) };
    },
    snapshot(slot: number): Promise<number> {
      return serialQuiet(async () => {
        const id = stage.snapshot(slot);
        const epoch = slotEpoch[slot];
        let down: { id: number; epoch: number } | undefined;
        if (next && epoch !== undefined) {
          try {
            down = { id: await next.snapshot(slot, epoch), epoch };
          } catch {
            down = undefined; // a restore of it answers stale: the head replays
          }
        }
        downSnaps.set(id, down);
        return id;
      });
    },
    restore(id: number, slot: number): Promise<void> {
      return serialQuiet(async () => {
        if (!downSnaps.has(id)) {
          throw new WireError("backend", `Snapshot ${id} does not exist on layers ${range}`);
        }
        dropAnchor(slot);
        hists[slot] = undefined;
        stage.restore(id, slot);
        if (!next) return;
        slotEpoch[slot] = undefined;
        const down = downSnaps.get(id);
        if (!down) throw staleError(`snapshot ${id}`);
        try {
          await next.restore(down.id, slot, down.epoch);
        } catch (e) {
          if (e instanceof Error && e.name === "StaleChainError") throw staleError(`snapshot ${id}`);
          throw e;
        }
        slotEpoch[slot] = down.epoch;
      });
    },
    drop(id: number): Promise<void> {
      return serialQuiet(async () => {
        if (!downSnaps.has(id)) {
          throw new WireError("backend", `Snapshot ${id} does not exist on layers ${range}`);
        }
        const down = downSnaps.get(id);
        downSnaps.delete(id);
        stage.states.drop(id);
        if (next && down) await next.drop(down.id, down.epoch).catch(() => {/* its connection is gone */});
      });
    },
    reset(slot: number): Promise<void> {
      return serialQuiet(async () => {
        dropAnchor(slot);
        hists[slot] = undefined;
        stage.reset(slot);
        if (next) {
          await next.reset(slot);
          slotEpoch[slot] = next.epoch;
        }
      });
    },
  };
}

/** Where a row's sampling block puts it: the slot and the position of its first row. */
type SlotAt = Pick<RunRequest, "slot" | "basePos" | "sampling">;

/**
 * The engine's settings of a sampling block when the sampler draws (absent, or plain greedy without
 * penalties, take the argmax, as the decode driver decides).
 */
function sampledOf(s: WireSampling | undefined): SamplingParams | undefined {
  if (!s) return undefined;
  const p = samplingOf(s);
  const plain = isGreedy(p) && p.repeatPenalty === 1 && p.presencePenalty === 0 && p.frequencyPenalty === 0;
  return plain ? undefined : p;
}

/** The engine's sampling settings of a RUN's sampling block. */
function samplingOf(s: WireSampling): SamplingParams {
  return {
    temperature: s.temperature,
    topK: s.topK,
    topP: s.topP,
    minP: s.minP,
    repeatPenalty: s.repeatPenalty,
    presencePenalty: s.presencePenalty,
    frequencyPenalty: s.frequencyPenalty,
    penaltyLastN: s.penaltyLastN,
    seed: s.seed,
  };
}
