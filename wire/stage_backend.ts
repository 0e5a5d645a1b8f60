/**
 * A worker's stage as the link's {@linkcode StageBackend}: runs received hidden rows through its layers; a
 * last stage then picks the next id (argmax on the logits, ties to the lowest id, with top-k pairs), a middle
 * stage forwards its own output rows to the next stage ({@linkcode ChainLink}) and prepends its time.
 *
 * Requests are applied one at a time in arrival order (the stage's activation buffers are shared by all
 * slots). A middle stage remembers, per slot and per snapshot, the connection to its next stage the state
 * behind it lives on; when that connection is gone it answers {@linkcode STALE_MARK} so the head replays.
 * @module
 */
import { argmaxCpu, isGreedy, type Stage, type StageInfo, topCpu } from "../engine/mod.ts";
import { WireError } from "./errors.ts";
import type { RunRequest, RunResult } from "./frame.ts";
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

/** What this stage says in its hello (for `next.attach` and the link). */
export function stageInfo(stage: Stage, arch: string): StageInfo {
  return {
    arch,
    layers: { first: stage.layers[0], end: stage.layers[1], total: stage.hp.nLayer },
    nEmbd: stage.hp.nEmbd,
    nSlots: stage.states.nSlots,
    nCtx: stage.nCtx,
    int8Activations: stage.int8Activations,
    kvF16: stage.kvF16,
    fingerprint: stage.fingerprint,
  };
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
  const staleError = (what: string) =>
    new WireError("backend", `${STALE_MARK} ${what} on layers ${range}: its next stage restarted: replay`);

  const runLast = async (req: RunRequest, nRows: number, t0: number): Promise<RunResult> => {
    if (req.want === "last" || req.want === "all") {
      throw new WireError("backend", `Layers ${range} are the last stage: they return ids, not hidden rows`);
    }
    const s = req.sampling;
    if (s && !isGreedy(s)) {
      throw new WireError(
        "backend",
        `Layers ${range}: sampling (temperature ${s.temperature}) is not carried by split serving yet: ` +
          `send temperature 0`,
      );
    }
    const nOut = req.drafts.length + 1;
    const out = await stage.run(
      req.slot,
      { hidden: req.rows as Float32Array<ArrayBuffer>, nTokens: nRows },
      req.basePos,
      {
        rows: nOut > 1 ? "all" : "last",
      },
    );
    const timesUs = [Math.round((performance.now() - t0) * 1000)];
    if (req.want === "none") return { kind: "none", timesUs };
    const V = stage.hp.nVocab;
    const rows = out.data.length / V;
    const ids = new Uint32Array(nOut);
    const topIds = new Uint32Array(nOut * req.topK);
    const topLogits = new Float32Array(nOut * req.topK);
    for (let j = 0; j < nOut; j++) {
      const row = out.data.subarray((rows - nOut + j) * V, (rows - nOut + j + 1) * V);
      ids[j] = argmaxCpu(row);
      if (req.topK > 0) {
        for (const [i, [id, logit]] of topCpu(row, req.topK).entries()) {
          topIds[j * req.topK + i] = id;
          topLogits[j * req.topK + i] = logit;
        }
      }
    }
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

  return {
    hello(): HelloInfo {
      const peer = next?.peer;
      const downstream = peer ? [{ ...peer, downstream: [] }, ...peer.downstream] : [];
      return helloOf(info, { build: opts.build, last: stage.last, downstream });
    },
    run(req: RunRequest): Promise<RunResult> {
      return serial(() => {
        const t0 = performance.now();
        const nRows = req.rows.length / stage.hp.nEmbd;
        return next ? runMiddle(req, nRows, t0, next) : runLast(req, nRows, t0);
      });
    },
    snapshot(slot: number): Promise<number> {
      return serial(async () => {
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
      return serial(async () => {
        if (!downSnaps.has(id)) {
          throw new WireError("backend", `Snapshot ${id} does not exist on layers ${range}`);
        }
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
      return serial(async () => {
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
      return serial(async () => {
        stage.reset(slot);
        if (next) {
          await next.reset(slot);
          slotEpoch[slot] = next.epoch;
        }
      });
    },
  };
}
