/**
 * Per-slot sequence state on the GPU (KV caches of attention layers, conv and recurrent state of DeltaNet
 * layers), accounted in bytes, with numbered snapshots for prefix reuse, speculative rollback and split
 * cross-turn reuse.
 *
 * The layouts belong to the kernels: each state buffer is declared by a {@linkcode StateSpec} whose
 * `liveRanges(nPos)` says which byte ranges hold the state of a sequence `nPos` tokens long, so a snapshot of a
 * KV cache copies only the filled positions while a recurrent state is copied whole.
 * @module
 */

/** One state buffer of one layer, per slot. */
export interface StateSpec {
  /** Layer index in the whole model. */
  readonly layer: number;
  /** Name within the layer (`k_cache`, `v_cache`, `conv`, `ssm`). */
  readonly name: string;
  /** Bytes per slot, a multiple of 4. */
  readonly sizeBytes: number;
  /**
   * Byte ranges that hold the state of a sequence of `nPos` tokens (offsets and sizes multiples of 4).
   * Omit for state that is live whole (recurrent state, conv ring).
   */
  readonly liveRanges?: (nPos: number) => ReadonlyArray<{ offsetBytes: number; sizeBytes: number }>;
}

interface Snapshot {
  readonly slot: number;
  readonly nPos: number;
  readonly buffers: ReadonlyMap<string, { buffer: GPUBuffer; ranges: ReadonlyArray<Range> }>;
  readonly sizeBytes: number;
}

interface Range {
  readonly offsetBytes: number;
  readonly sizeBytes: number;
  /** Offset of this range inside the snapshot buffer. */
  readonly atBytes: number;
}

function key(layer: number, name: string): string {
  return `${layer}/${name}`;
}

/** GPU state buffers for `nSlots` slots, plus snapshots of single slots. */
export class SlotStates {
  readonly #device: GPUDevice;
  readonly #specs: ReadonlyMap<string, StateSpec>;
  readonly #buffers: ReadonlyArray<ReadonlyMap<string, GPUBuffer>>;
  readonly #snapshots = new Map<number, Snapshot>();
  #nextSnapshot = 1;
  /** Number of slots. */
  readonly nSlots: number;
  /** Bytes of state per slot. */
  readonly bytesPerSlot: number;

  /**
   * Allocates and zeroes every state buffer for every slot.
   * @throws {RangeError} on a duplicate (layer, name) or a size that is not a positive multiple of 4
   */
  constructor(device: GPUDevice, opts: { specs: readonly StateSpec[]; nSlots: number }) {
    if (!Number.isInteger(opts.nSlots) || opts.nSlots < 1) {
      throw new RangeError(`Slot count must be a positive integer, got ${opts.nSlots}`);
    }
    const specs = new Map<string, StateSpec>();
    for (const s of opts.specs) {
      const k = key(s.layer, s.name);
      if (specs.has(k)) throw new RangeError(`State ${s.name} of layer ${s.layer} is declared twice`);
      if (!(s.sizeBytes > 0) || s.sizeBytes % 4 !== 0) {
        throw new RangeError(
          `State ${s.name} of layer ${s.layer}: size ${s.sizeBytes} is not a positive multiple of 4`,
        );
      }
      specs.set(k, s);
    }
    this.#device = device;
    this.#specs = specs;
    this.nSlots = opts.nSlots;
    this.bytesPerSlot = opts.specs.reduce((a, s) => a + s.sizeBytes, 0);
    this.#buffers = Array.from({ length: opts.nSlots }, (_, slot) => {
      const m = new Map<string, GPUBuffer>();
      for (const [k, s] of specs) {
        m.set(
          k,
          device.createBuffer({
            label: `slot${slot}.L${s.layer}.${s.name}`,
            size: s.sizeBytes,
            usage: GPUBufferUsage.STORAGE | GPUBufferUsage.COPY_SRC | GPUBufferUsage.COPY_DST,
          }),
        );
      }
      return m;
    });
  }

  /** Bytes held by all slots (snapshots excluded). */
  get totalBytes(): number {
    return this.bytesPerSlot * this.nSlots;
  }

  /** Bytes held by snapshots. */
  get snapshotBytes(): number {
    let n = 0;
    for (const s of this.#snapshots.values()) n += s.sizeBytes;
    return n;
  }

  /** The buffer of state `name` of `layer` in `slot`. */
  buffer(slot: number, layer: number, name: string): GPUBuffer {
    const b = this.#slot(slot).get(key(layer, name));
    if (!b) throw new RangeError(`No state ${name} in layer ${layer}`);
    return b;
  }

  /** Records zeroing of every state buffer of `slot` (a sequence restarting at position 0). */
  reset(encoder: GPUCommandEncoder, slot: number): void {
    for (const b of this.#slot(slot).values()) encoder.clearBuffer(b);
  }

  /**
   * Records a copy of `slot`'s state for a sequence `nPos` tokens long into a new snapshot; returns its id.
   * The copy happens when the encoder's commands run, so it captures the state as of that point in the queue.
   */
  snapshot(encoder: GPUCommandEncoder, slot: number, nPos: number): number {
    const bufs = this.#slot(slot);
    const out = new Map<string, { buffer: GPUBuffer; ranges: Range[] }>();
    let total = 0;
    for (const [k, spec] of this.#specs) {
      const live = spec.liveRanges?.(nPos) ?? [{ offsetBytes: 0, sizeBytes: spec.sizeBytes }];
      const ranges: Range[] = [];
      let at = 0;
      for (const r of live) {
        if (r.sizeBytes === 0) continue;
        ranges.push({ ...r, atBytes: at });
        at += r.sizeBytes;
      }
      const buffer = this.#device.createBuffer({
        label: `snapshot.${k}`,
        size: Math.max(4, at),
        usage: GPUBufferUsage.COPY_SRC | GPUBufferUsage.COPY_DST,
      });
      for (const r of ranges) {
        encoder.copyBufferToBuffer(bufs.get(k)!, r.offsetBytes, buffer, r.atBytes, r.sizeBytes);
      }
      out.set(k, { buffer, ranges });
      total += at;
    }
    const id = this.#nextSnapshot++;
    this.#snapshots.set(id, { slot, nPos, buffers: out, sizeBytes: total });
    return id;
  }

  /** Sequence length a snapshot was taken at. */
  snapshotLength(id: number): number {
    return this.#get(id).nPos;
  }

  /** Records restoring snapshot `id` into `slot` (any slot: a snapshot can seed another sequence). */
  restore(encoder: GPUCommandEncoder, id: number, slot: number): void {
    const snap = this.#get(id);
    const bufs = this.#slot(slot);
    for (const [k, { buffer, ranges }] of snap.buffers) {
      const dst = bufs.get(k)!;
      // Positions past the snapshot's length must read as empty, exactly as after a reset.
      encoder.clearBuffer(dst);
      for (const r of ranges) encoder.copyBufferToBuffer(buffer, r.atBytes, dst, r.offsetBytes, r.sizeBytes);
    }
  }

  /** Frees a snapshot's GPU memory. */
  drop(id: number): void {
    const snap = this.#get(id);
    for (const { buffer } of snap.buffers.values()) buffer.destroy();
    this.#snapshots.delete(id);
  }

  /** Destroys every buffer, snapshots included. */
  destroy(): void {
    for (const id of [...this.#snapshots.keys()]) this.drop(id);
    for (const m of this.#buffers) for (const b of m.values()) b.destroy();
  }

  #slot(slot: number): ReadonlyMap<string, GPUBuffer> {
    const m = this.#buffers[slot];
    if (!m) {
      throw new RangeError(
        `Slot ${slot} does not exist: this engine has ${this.nSlots} slots (0..${this.nSlots - 1})`,
      );
    }
    return m;
  }

  #get(id: number): Snapshot {
    const s = this.#snapshots.get(id);
    if (!s) throw new RangeError(`Snapshot ${id} does not exist (dropped, or never taken)`);
    return s;
  }
}
