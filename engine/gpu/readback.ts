/**
 * The readback ring: a fixed set of MAP_READ staging buffers through which the engine returns small results
 * (sampled ids, top-k logits, hidden rows at a stage boundary) without an awaited readback between two GPU
 * steps (PLATFORM.md "The 10 ms readback floor").
 *
 * Order of use per slot: `record` copies into a free slot inside a command encoder; the caller submits; then
 * `map` starts the map (Deno's `mapAsync` blocks the calling thread until the queue is idle, so encode the next
 * step BEFORE calling it) and resolves with a copy of the bytes, freeing the slot. Several slots in flight
 * cost about one readback floor in total.
 * @module
 */

/** One region to copy into a ring slot: `sizeBytes` bytes of `src` from `srcOffsetBytes`. */
export interface ReadbackCopy {
  /** Source buffer (needs COPY_SRC usage). */
  readonly src: GPUBuffer;
  /** Byte offset in `src`, a multiple of 4. */
  readonly srcOffsetBytes: number;
  /** Bytes to copy, a multiple of 4. */
  readonly sizeBytes: number;
}

/** A fixed ring of staging buffers; see the module doc for the order of use. */
export class ReadbackRing {
  readonly #slots: GPUBuffer[];
  readonly #busy: boolean[];
  readonly #used: number[];
  /** Bytes each slot can hold. */
  readonly slotBytes: number;

  /**
   * Allocates the staging buffers.
   * @param opts.slots number of staging buffers (8 in flight cost about one readback floor)
   * @param opts.slotBytes capacity of each, a multiple of 4
   */
  constructor(device: GPUDevice, opts: { slots: number; slotBytes: number }) {
    if (!Number.isInteger(opts.slots) || opts.slots < 1) {
      throw new RangeError(`Ring needs >= 1 slot, got ${opts.slots}`);
    }
    if (opts.slotBytes <= 0 || opts.slotBytes % 4 !== 0) {
      throw new RangeError(`Ring slot size must be a positive multiple of 4, got ${opts.slotBytes}`);
    }
    this.slotBytes = opts.slotBytes;
    this.#slots = Array.from({ length: opts.slots }, (_, i) =>
      device.createBuffer({
        label: `readback_ring[${i}]`,
        size: opts.slotBytes,
        usage: GPUBufferUsage.MAP_READ | GPUBufferUsage.COPY_DST,
      }));
    this.#busy = new Array(opts.slots).fill(false);
    this.#used = new Array(opts.slots).fill(0);
  }

  /** Number of slots not holding an unread result. */
  get free(): number {
    return this.#busy.filter((b) => !b).length;
  }

  /**
   * Records copies of `copies` (packed back to back) into a free slot; returns the slot index, or
   * `undefined` when every slot is in flight (the caller must `map` one first).
   * @throws {RangeError} when the copies exceed the slot size or are not 4-byte aligned
   */
  record(encoder: GPUCommandEncoder, copies: readonly ReadbackCopy[]): number | undefined {
    const slot = this.#busy.indexOf(false);
    if (slot < 0) return undefined;
    let at = 0;
    for (const c of copies) {
      if (c.srcOffsetBytes % 4 !== 0 || c.sizeBytes % 4 !== 0) {
        throw new RangeError(
          `Readback copy offset ${c.srcOffsetBytes} / size ${c.sizeBytes} not 4-byte aligned`,
        );
      }
      if (at + c.sizeBytes > this.slotBytes) {
        throw new RangeError(
          `Readback of ${at + c.sizeBytes} bytes exceeds the ring slot size ${this.slotBytes}`,
        );
      }
      encoder.copyBufferToBuffer(c.src, c.srcOffsetBytes, this.#slots[slot]!, at, c.sizeBytes);
      at += c.sizeBytes;
    }
    this.#busy[slot] = true;
    this.#used[slot] = at;
    return slot;
  }

  /**
   * Maps slot `slot` (after the encoder that recorded it was submitted) and resolves with a copy of its
   * recorded bytes; the slot is free again once this resolves.
   */
  async map(slot: number): Promise<Uint8Array> {
    const buf = this.#slots[slot];
    if (!buf || !this.#busy[slot]) throw new Error(`Internal error: readback slot ${slot} holds no result`);
    const n = this.#used[slot]!;
    await buf.mapAsync(GPUMapMode.READ, 0, this.slotBytes);
    const out = new Uint8Array(buf.getMappedRange(0, this.slotBytes).slice(0, n));
    buf.unmap();
    this.#busy[slot] = false;
    return out;
  }

  /** Destroys the staging buffers. */
  destroy(): void {
    for (const b of this.#slots) b.destroy();
  }
}
