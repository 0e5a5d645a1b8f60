/**
 * Prefill chunks without a readback: whole (`DecodeDriver.prefill`, every layer) or a prompt piece run a few
 * layers at a time (`DecodeDriver.prefillPart`, SlotDecoder.prefillPart). While
 * others stream, the service runs a chunk-wide piece of a long prompt in parts of a few layers, one per round
 * before the streams' decode turn (engine/serve/_runner.ts). The first part embeds the tokens (and resets the
 * slot at base 0); each part but the last copies the piece's hidden rows (the residual stream) aside, since
 * the decode steps in between reuse the activations, and the next part copies them back. Each part is its
 * own graph of the stage's layers `from..to` (Stage.graph with a layer range): the first of them norms the
 * hidden rows itself, as a split worker's first layer does, so the parts give the whole piece's bits
 * (tests/piece_parts_test.ts).
 * @module
 */
import type { SlotStates } from "../state.ts";
import { encodeOps, MATVEC_MAX_COLS, type Op, writeChunkPos } from "../graph/builder.ts";
import { assert } from "../errors.ts";

/** One chunk of a prefill, from {@linkcode chunkSteps}. */
export interface ChunkStep {
  /** Its first token (in the prefill's tokens). */
  readonly at: number;
  /** Its tokens. */
  readonly n: number;
  /** A snapshot after its first `cut` tokens, from its taps (0: none; else a chunk wider than MATVEC_MAX_COLS). */
  readonly cut: number;
  /** A snapshot after it. */
  readonly after: boolean;
}

/**
 * Checks a snapshot point asked of a prefill of `n` tokens at `base`: inside it or at its end.
 * @throws {RangeError} naming the point and the range it must fall in
 */
export function snapCheck(snapAt: number | undefined, base: number, n: number): void {
  if (snapAt !== undefined && !(Number.isInteger(snapAt) && snapAt > base && snapAt <= base + n)) {
    throw new RangeError(
      `A snapshot at position ${snapAt} is outside the prefill of positions ${base}..${base + n - 1}: ` +
        `ask for one in ${base + 1}..${base + n}`,
    );
  }
}

/**
 * The chunks of a prefill of `total` tokens at `maxChunk` a pass, with a snapshot after its first `snapAt`
 * tokens (1..total) where asked: cut inside the chunk holding that point when the chunk runs the chunked
 * form (wider than MATVEC_MAX_COLS: its DeltaNet layers write the state at the cut to their taps, so the
 * prefill keeps its passes), else after the chunk ending there, a short chunk split at the point.
 */
export function chunkSteps(total: number, maxChunk: number, snapAt?: number): ChunkStep[] {
  assert(
    snapAt === undefined || (Number.isInteger(snapAt) && snapAt >= 1 && snapAt <= total),
    "snapAt in 1..total",
  );
  const out: ChunkStep[] = [];
  for (let at = 0; at < total; at += maxChunk) {
    const n = Math.min(maxChunk, total - at);
    if (snapAt === undefined || snapAt <= at || snapAt > at + n) out.push({ at, n, cut: 0, after: false });
    else if (snapAt === at + n) out.push({ at, n, cut: 0, after: true });
    else if (n > MATVEC_MAX_COLS) out.push({ at, n, cut: snapAt - at, after: false });
    else {out.push({ at, n: snapAt - at, cut: 0, after: true }, {
        at: snapAt,
        n: at + n - snapAt,
        cut: 0,
        after: false,
      });}
  }
  return out;
}

/** What the parts need of the stage. */
export interface PartsStage {
  readonly layers: readonly [number, number];
  readonly maxChunk: number;
  readonly hp: { readonly nEmbd: number };
  readonly states: SlotStates;
}

/** What the parts need of the stage's buffers. */
export interface PartsBuffers {
  readonly device: GPUDevice;
  readonly owned: GPUBuffer[];
  readonly tokens: GPUBuffer;
  readonly hidden: GPUBuffer;
  readonly posParams: readonly GPUBuffer[];
  graph(slot: number, n: number, rows: "none", layers: readonly [number, number]): Promise<readonly Op[]>;
  setLength(slot: number, n: number): void;
}

/** Prefill chunks, whole or one piece's parts at a time; see the module doc. */
export class PieceParts {
  readonly #stage: PartsStage;
  readonly #b: PartsBuffers;
  /** The piece between its parts: where it runs and the layer its next part starts at. */
  #parked: { slot: number; base: number; n: number; to: number } | undefined;
  /** Its hidden rows meanwhile (a chunk's at most; the stage owns the buffer). */
  #rows: GPUBuffer | undefined;

  constructor(stage: PartsStage, b: PartsBuffers) {
    this.#stage = stage;
    this.#b = b;
  }

  /**
   * Queues `tokens` on `slot` at `base` in chunks of `maxChunk` (every layer), each submitted after the work
   * before it has finished (`idle`; `onDone(n)` before each chunk but the first: its first n tokens are
   * done). With `snapAt` (base < snapAt <= base + tokens) it takes a snapshot of the slot at that position
   * ({@linkcode chunkSteps}) and returns its id.
   */
  async queue(
    slot: number,
    tokens: readonly number[],
    base: number,
    o: {
      readonly snapAt?: number;
      readonly idle: (device: GPUDevice) => void;
      readonly onDone?: (n: number) => void;
    },
  ): Promise<number | undefined> {
    const { states, layers, maxChunk } = this.#stage;
    const { device } = this.#b;
    let snap: number | undefined;
    try {
      for (
        const c of chunkSteps(tokens.length, maxChunk, o.snapAt === undefined ? undefined : o.snapAt - base)
      ) {
        const chunk = tokens.slice(c.at, c.at + c.n);
        const id = await this.run(slot, chunk, base + c.at, layers, (d) => {
          o.idle(d);
          if (c.at > 0) o.onDone?.(c.at);
        }, c.cut);
        snap ??= id;
        if (c.after) {
          const enc = device.createCommandEncoder();
          snap = states.snapshot(enc, slot, base + c.at + c.n);
          device.queue.submit([enc.finish()]);
        }
      }
    } catch (e) {
      if (snap !== undefined) states.drop(snap);
      throw e;
    }
    return snap;
  }

  /**
   * Queues `tokens` (one chunk) on `slot` at `base` through `layers` only (every layer: a whole chunk, as
   * `prefill` queues them), after the work before it has finished (`idle`: the driver's pacing). The slot
   * holds the tokens once the last part is queued. With `cut` (every layer, a chunk wider than
   * MATVEC_MAX_COLS, 0 < cut < tokens) the same pass snapshots the slot at `base + cut` from the states'
   * taps; returns the snapshot's id.
   * @throws {RangeError} on layers outside the stage, a piece wider than a chunk, or parts out of order
   */
  async run(
    slot: number,
    tokens: readonly number[],
    base: number,
    layers: readonly number[],
    idle: (device: GPUDevice) => void,
    cut = 0,
  ): Promise<number | undefined> {
    const stage = this.#stage;
    const { device } = this.#b;
    const [a, b] = stage.layers;
    const [from, to] = layers as [number, number];
    const n = tokens.length;
    if (
      !(layers.length === 2 && Number.isInteger(from) && Number.isInteger(to) && a <= from && from < to &&
        to <= b)
    ) {
      throw new RangeError(`A piece's part runs layers inside ${a}:${b}, got ${layers.join(":")}`);
    }
    if (n > stage.maxChunk) {
      throw new RangeError(`A piece of parts is one chunk (${stage.maxChunk}), got ${n} tokens`);
    }
    const p = this.#parked;
    if (from > a && !(p && p.slot === slot && p.base === base && p.n === n && p.to === from)) {
      throw new RangeError(
        `Part ${from}:${to} of slot ${slot}'s piece at ${base} does not follow a part ending at layer ${from} ` +
          `of the same piece: run the parts in order from layer ${a}`,
      );
    }
    assert(
      cut === 0 || (from === a && to === b && n > MATVEC_MAX_COLS && cut > 0 && cut < n),
      "a cut inside a whole chunk of the chunked form",
    );
    const ops = await this.#b.graph(slot, n, "none", [from, to]);
    const bytes = 4 * n * stage.hp.nEmbd;
    const rows = from > a || to < b ? this.#partRows() : undefined;
    const enc = device.createCommandEncoder();
    if (from === a && base === 0) stage.states.reset(enc, slot);
    if (from > a) enc.copyBufferToBuffer(rows!, 0, this.#b.hidden, 0, bytes);
    const pass = enc.beginComputePass();
    encodeOps(pass, ops);
    pass.end();
    if (to < b) enc.copyBufferToBuffer(this.#b.hidden, 0, rows!, 0, bytes);
    const snap = cut > 0 ? stage.states.snapshot(enc, slot, base + cut, false, true) : undefined;
    try {
      const cb = enc.finish();
      idle(device);
      writeChunkPos(device.queue, this.#b.posParams[slot]!, slot, base, n, cut);
      if (from === a) device.queue.writeBuffer(this.#b.tokens, 0, Uint32Array.from(tokens));
      device.queue.submit([cb]);
    } catch (e) {
      if (snap !== undefined) stage.states.drop(snap);
      throw e;
    }
    // A whole chunk (every layer) leaves a piece between its parts where it was.
    if (rows) this.#parked = to < b ? { slot, base, n, to } : undefined;
    if (to === b) this.#b.setLength(slot, base + n);
    return snap;
  }

  /** The buffer of a piece's rows between its parts (a chunk's at most; made once, the stage owns it). */
  #partRows(): GPUBuffer {
    if (!this.#rows) {
      this.#rows = this.#b.device.createBuffer({
        label: "a piece's rows between its parts",
        size: 4 * this.#stage.maxChunk * this.#stage.hp.nEmbd,
        usage: GPUBufferUsage.STORAGE | GPUBufferUsage.COPY_SRC | GPUBufferUsage.COPY_DST,
      });
      this.#b.owned.push(this.#rows);
    }
    return this.#rows;
  }
}
