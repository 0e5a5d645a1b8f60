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
import { encodeOps, type Op, writeChunkPos } from "../graph/builder.ts";

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
   * Queues `tokens` (one chunk) on `slot` at `base` through `layers` only (every layer: a whole chunk, as
   * `prefill` queues them), after the work before it has finished (`idle`: the driver's pacing). The slot
   * holds the tokens once the last part is queued.
   * @throws {RangeError} on layers outside the stage, a piece wider than a chunk, or parts out of order
   */
  async run(
    slot: number,
    tokens: readonly number[],
    base: number,
    layers: readonly number[],
    idle: (device: GPUDevice) => void,
  ): Promise<void> {
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
    const cb = enc.finish();
    idle(device);
    writeChunkPos(device.queue, this.#b.posParams[slot]!, slot, base, n);
    if (from === a) device.queue.writeBuffer(this.#b.tokens, 0, Uint32Array.from(tokens));
    device.queue.submit([cb]);
    // A whole chunk (every layer) leaves a piece between its parts where it was.
    if (rows) this.#parked = to < b ? { slot, base, n, to } : undefined;
    if (to === b) this.#b.setLength(slot, base + n);
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
