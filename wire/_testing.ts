/**
 * Test helpers of wire/: a valid hello to vary field by field, the limits it implies, and a fake
 * {@linkcode StageBackend} that answers from arithmetic on its inputs (so replies can be checked).
 * Not part of the public surface.
 * @module
 */
import type { HelloInfo } from "./hello.ts";
import { PROTOCOL_VERSION } from "./hello.ts";
import type { RunRequest, RunResult } from "./frame.ts";
import type { StageBackend } from "./link.ts";

/** A worker's hello for layers [first, end) of a 12-layer, width-8 model; `over` replaces fields. */
export function sampleHello(over: Partial<HelloInfo> = {}): HelloInfo {
  return {
    protocol: PROTOCOL_VERSION,
    build: { version: "0.1.0", commit: "abc1234" },
    arch: "qwen35moe",
    layers: { first: 6, end: 12, total: 12 },
    last: true,
    nEmbd: 8,
    nSlots: 4,
    nCtx: 256,
    stateLayout: "kv=f32;ssm=f32",
    numerics: { int8Activations: false, int8Experts: false, hiddenDtype: "f32" },
    fingerprint: "ab".repeat(32),
    limits: { maxFrameBytes: 1 << 20, maxRows: 64, maxDraft: 4, maxTopK: 8 },
    downstream: [],
    ...over,
  };
}

/** The head's hello matching {@linkcode sampleHello}: layers [0, 6), not last. */
export function sampleHeadHello(over: Partial<HelloInfo> = {}): HelloInfo {
  return sampleHello({ layers: { first: 0, end: 6, total: 12 }, last: false, ...over });
}

/**
 * A backend whose `run` answers `want: "ids"` with id = slot × 1000 + basePos + row for each producing row
 * (top-k pairs (id + k, -k)), hidden wants with the rows plus 1, after `delayMs` (or never, while
 * `stall` is true). Snapshot ids count up from 1.
 */
export class FakeBackend implements StageBackend {
  readonly #hello: HelloInfo;
  /** Milliseconds each run waits before answering (a number, or one per request). */
  delayMs: number | ((req: RunRequest) => number) = 0;
  /** When true, runs never answer (a stalled stage). */
  stall = false;
  /** Every call, in order, as `op:args`. */
  readonly calls: string[] = [];
  #nextSnapshot = 1;
  readonly #snapshots = new Map<number, number>();

  /** @param hello what {@linkcode hello} returns */
  constructor(hello: HelloInfo) {
    this.#hello = hello;
  }

  /** The stage's hello. */
  hello(): HelloInfo {
    return this.#hello;
  }

  /** See the class comment. */
  async run(req: RunRequest): Promise<RunResult> {
    const nRows = req.rows.length / req.nEmbd;
    this.calls.push(`run:${req.slot}:${req.basePos}:${nRows}`);
    if (this.stall) await new Promise(() => {});
    const ms = typeof this.delayMs === "number" ? this.delayMs : this.delayMs(req);
    if (ms > 0) await new Promise((r) => setTimeout(r, ms));
    switch (req.want) {
      case "none":
        return { kind: "none", timesUs: [7] };
      case "last":
      case "all": {
        const from = req.want === "last" ? nRows - 1 : 0;
        const rows = req.rows.slice(from * req.nEmbd).map((x) => x + 1);
        return { kind: "hidden", rows, nEmbd: req.nEmbd, dtype: req.dtype, timesUs: [7] };
      }
      case "ids": {
        const n = req.drafts.length + 1;
        const ids = new Uint32Array(n).map((_, j) => req.slot * 1000 + req.basePos + nRows - n + j);
        const topIds = new Uint32Array(n * req.topK).map((_, i) =>
          ids[Math.floor(i / req.topK)]! + (i % req.topK)
        );
        const topLogits = new Float32Array(n * req.topK).map((_, i) => -(i % req.topK));
        return { kind: "ids", ids, topK: req.topK, topIds, topLogits, timesUs: [7] };
      }
    }
  }

  /** Records the call; returns a fresh id. */
  snapshot(slot: number): number {
    this.calls.push(`snapshot:${slot}`);
    const id = this.#nextSnapshot++;
    this.#snapshots.set(id, slot);
    return id;
  }

  /** Records the call; throws for an unknown id. */
  restore(snapshotId: number, slot: number): void {
    this.calls.push(`restore:${snapshotId}:${slot}`);
    if (!this.#snapshots.has(snapshotId)) throw new RangeError(`Snapshot ${snapshotId} does not exist`);
  }

  /** Records the call. */
  drop(snapshotId: number): void {
    this.calls.push(`drop:${snapshotId}`);
    this.#snapshots.delete(snapshotId);
  }

  /** Records the call. */
  reset(slot: number): void {
    this.calls.push(`reset:${slot}`);
  }
}
