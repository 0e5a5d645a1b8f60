/**
 * Readbacks: the ring of staging buffers the decode loop reads ids through, a pool of staging buffers for
 * runs, and `mapRead`, which returns a staging buffer's bytes without Deno's 10 ms readback floor where the
 * runtime allows it (PLATFORM.md "The 10 ms readback floor").
 *
 * Early reads. Deno's `mapAsync` (ext/webgpu/buffer.rs) polls the device with a blocking wait inside the call,
 * so when the call returns every submitted command has finished and wgpu has mapped the buffer; its promise
 * then resolves only after a `sleep(10 ms)` in its poll loop. `getMappedRange` asks wgpu, not the promise, so
 * it returns the finished bytes right after the call. `mapRead` reads them then, and unmaps (the buffer is free
 * again) once the promise resolves. Two guards:
 * - Deno 2.9.6's `getMappedRange` panics (a process abort, not an exception) on a buffer whose map never
 *   resolved before (it unwraps the map mode that the promise sets), so a buffer is read early only after one
 *   map of it resolved (`mappedOnce`); the first read of each buffer waits for its promise.
 * - Early reads are on only for the Deno versions they were checked on (`EARLY_READ_VERSIONS`, tests
 *   engine/gpu/readback_test.ts); another version waits for the promise, as does `LLM_EARLY_READ=0`. A read
 *   whose `getMappedRange` throws (the map not done) also falls back to the promise.
 *
 * The early bytes resolve one event-loop task later (`nextTask`, ~0.5 ms): Deno dispatches a GPU error of the
 * submitted work as a task of its own, and a caller checks for errors once the bytes land (the 10 ms wait
 * used to cover that; engine/gpu/readback_test.ts checks the order).
 * @module
 */

/** Deno versions whose `mapAsync`/`getMappedRange` behave as the module doc says (checked by its test). */
export const EARLY_READ_VERSIONS: readonly string[] = ["2.9.6"];

function earlyReadsOn(): boolean {
  let env: string | undefined;
  try {
    env = Deno.env.get("LLM_EARLY_READ");
  } catch {
    env = undefined; // no env permission: the version decides
  }
  if (env === "0") return false;
  return EARLY_READ_VERSIONS.includes(Deno.version.deno);
}

/** Whether `mapRead` reads a buffer as soon as `mapAsync`'s call returns (module doc). */
export const EARLY_READS: boolean = earlyReadsOn();

/** Buffers one of whose maps resolved: only these are read early (module doc). */
const mappedOnce = new WeakSet<GPUBuffer>();

/** Counts of `mapRead` calls by path, for tests and benches. */
export const readStats: { early: number; awaited: number; fellBack: number } = {
  early: 0,
  awaited: 0,
  fellBack: 0,
};

/**
 * Resolves in a later task of the event loop (a message through a fresh channel: about 0.5 ms on lavapipe,
 * where `setTimeout(0)` takes 2.5 ms), after every task queued before it, such as Deno's GPU error events or
 * a worker's incoming messages.
 */
export function nextTask(): Promise<void> {
  const { port1, port2 } = new MessageChannel();
  return new Promise<void>((resolve) => {
    port1.onmessage = () => {
      port1.close();
      port2.close();
      resolve();
    };
    port2.postMessage(0);
  });
}

/** A started read of a staging buffer: its bytes, and when the buffer is unmapped (or broken). */
export interface MapRead {
  /** A copy of bytes [0, size) of the buffer: at once on the early path, else once the map resolves. */
  readonly bytes: Promise<ArrayBuffer>;
  /** Resolves true once the buffer is unmapped and may be mapped again, false when its map failed. */
  readonly released: Promise<boolean>;
}

/**
 * Maps `buf` (MAP_READ; the command that fills it submitted) and reads bytes [0, size). The call blocks until
 * the queue is idle, as Deno's `mapAsync` does: encode and submit the next work around it.
 */
export function mapRead(buf: GPUBuffer, size: number): MapRead {
  const mapped = buf.mapAsync(GPUMapMode.READ);
  if (EARLY_READS && mappedOnce.has(buf)) {
    let copy: ArrayBuffer | undefined;
    try {
      copy = buf.getMappedRange(0, size).slice(0);
    } catch {
      readStats.fellBack++;
    }
    if (copy) {
      readStats.early++;
      // The buffer may be destroyed meanwhile (its owner gone): then there is nothing to unmap.
      const released = mapped.then(() => {
        try {
          buf.unmap();
          return true;
        } catch {
          return false;
        }
      }, () => false);
      // The bytes after one macrotask: Deno dispatches a GPU error of the work just submitted (an
      // "uncapturederror" event) as a task of its own, which the caller's error check must see first.
      return { bytes: nextTask().then(() => copy), released };
    }
  } else readStats.awaited++;
  const bytes = mapped.then(() => {
    const copy = buf.getMappedRange(0, size).slice(0);
    buf.unmap();
    mappedOnce.add(buf);
    return copy;
  });
  return { bytes, released: bytes.then(() => true, () => false) };
}

/**
 * Staging buffers (MAP_READ | COPY_DST) kept for reuse by byte size, so that runs read them early
 * (`mapRead`: a buffer is read early from its second use on) and do not create one per readback. Buffers over
 * `maxBytes` are not kept, at most `perSize` per size and `totalBytes` in all (a split's frames keep a
 * staging per slot encoded ahead and one in flight, so 16 of a size).
 */
export class StagingPool {
  readonly #device: GPUDevice;
  readonly #free = new Map<number, GPUBuffer[]>();
  readonly #maxBytes: number;
  readonly #perSize: number;
  readonly #totalBytes: number;
  #kept = 0;
  #destroyed = false;

  /**
   * @param opts.maxBytes largest buffer kept (default 16 MiB)
   * @param opts.perSize buffers kept per size (default 16)
   * @param opts.totalBytes bytes kept in all (default 64 MiB; within plan.ts's headroom)
   */
  constructor(device: GPUDevice, opts: { maxBytes?: number; perSize?: number; totalBytes?: number } = {}) {
    this.#device = device;
    this.#maxBytes = opts.maxBytes ?? 16 << 20;
    this.#perSize = opts.perSize ?? 16;
    this.#totalBytes = opts.totalBytes ?? 64 << 20;
  }

  /** Bytes of the buffers the pool keeps now. */
  get keptBytes(): number {
    return this.#kept;
  }

  /** A staging buffer of `size` bytes (a multiple of 4), out of the pool or new. */
  take(size: number): GPUBuffer {
    const hit = this.#free.get(size)?.pop();
    if (hit) {
      this.#kept -= size;
      return hit;
    }
    return this.#device.createBuffer({
      label: `staging[${size}]`,
      size,
      usage: GPUBufferUsage.MAP_READ | GPUBufferUsage.COPY_DST,
    });
  }

  /** Puts `buf` (unmapped, from `take`) back, or destroys it when the pool keeps no more of its size. */
  give(buf: GPUBuffer): void {
    const list = this.#free.get(buf.size) ?? [];
    const full = list.length >= this.#perSize || this.#kept + buf.size > this.#totalBytes;
    if (this.#destroyed || buf.size > this.#maxBytes || full) {
      buf.destroy();
      return;
    }
    list.push(buf);
    this.#kept += buf.size;
    this.#free.set(buf.size, list);
  }

  /**
   * `mapRead` of `buf` (from `take`, its copy submitted): resolves to bytes [0, size); the buffer goes back to
   * the pool once unmapped (destroyed if its map failed).
   */
  read(buf: GPUBuffer, size: number = buf.size): Promise<ArrayBuffer> {
    const r = mapRead(buf, size);
    r.released.then((ok) => ok ? this.give(buf) : buf.destroy());
    return r.bytes;
  }

  /** Destroys the kept buffers; buffers given back later are destroyed too. */
  destroy(): void {
    this.#destroyed = true;
    for (const list of this.#free.values()) for (const b of list) b.destroy();
    this.#free.clear();
    this.#kept = 0;
  }
}

/** One region to copy into a ring slot: `sizeBytes` bytes of `src` from `srcOffsetBytes`. */
export interface ReadbackCopy {
  /** Source buffer (needs COPY_SRC usage). */
  readonly src: GPUBuffer;
  /** Byte offset in `src`, a multiple of 4. */
  readonly srcOffsetBytes: number;
  /** Bytes to copy, a multiple of 4. */
  readonly sizeBytes: number;
}

/**
 * A fixed ring of staging buffers through which the decode loop returns small results (sampled ids, top-k
 * pairs) without an awaited readback between two GPU steps. Order of use per slot: `record` copies into a free
 * slot inside a command encoder; the caller submits; then `map` starts the map (it blocks the calling thread
 * until the queue is idle, so encode the next step BEFORE calling it) and resolves with a copy of the bytes.
 * The slot is free again once its buffer is unmapped (`whenFree`), which on the early path (`mapRead`) comes
 * about 10 ms after the bytes.
 */
export class ReadbackRing {
  readonly #slots: GPUBuffer[];
  readonly #busy: boolean[];
  readonly #used: number[];
  #waiters: (() => void)[] = [];
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
   * recorded bytes; the slot is free again once its buffer is unmapped (`whenFree`).
   */
  async map(slot: number): Promise<Uint8Array> {
    const buf = this.#slots[slot];
    if (!buf || !this.#busy[slot]) throw new Error(`Internal error: readback slot ${slot} holds no result`);
    const n = this.#used[slot]!;
    const r = mapRead(buf, n);
    r.released.then(() => {
      this.#busy[slot] = false;
      for (const wake of this.#waiters.splice(0)) wake();
    });
    return new Uint8Array(await r.bytes);
  }

  /** Resolves once at least one slot is free (at once when one is). */
  whenFree(): Promise<void> {
    if (this.#busy.includes(false)) return Promise.resolve();
    return new Promise((resolve) => this.#waiters.push(resolve));
  }

  /** Destroys the staging buffers. */
  destroy(): void {
    for (const b of this.#slots) b.destroy();
  }
}
