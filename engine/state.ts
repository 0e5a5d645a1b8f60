/**
 * Per-slot sequence state on the GPU (KV caches of attention layers, conv and recurrent state of DeltaNet
 * layers), accounted in bytes, with numbered snapshots for prefix reuse, speculative rollback and split
 * cross-turn reuse.
 *
 * The layouts belong to the kernels: each state buffer is declared by a {@linkcode StateSpec} whose
 * `liveRanges(nPos)` says which byte ranges hold the state of a sequence `nPos` tokens long, so a snapshot of a
 * KV cache copies only the filled positions while a recurrent state is copied whole.
 *
 * Each (layer, state) is one pooled buffer holding every slot at a 256-byte-aligned stride, so that a batched
 * decode step can bind all slots' regions at once (one dispatch for every column), while a slot's own graphs,
 * snapshots and resets use its sub-range. A pool larger than the device can bind whole (big KV caches times
 * many slots) falls back to one buffer per slot; {@linkcode SlotStates.pool} then answers `undefined` and the
 * batched step dispatches per slot for that state.
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
  /** A rewind point: only the whole-live states (no KV rows), restored into its own slot alone. */
  readonly rewind: boolean;
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

/** Offset alignment of a storage binding (WebGPU's minStorageBufferOffsetAlignment is at most 256). */
export const STATE_ALIGN_BYTES = 256;

/** One slot's region of a state: a storage binding (offset a multiple of {@linkcode STATE_ALIGN_BYTES}). */
export interface StateBinding {
  /** The pool's buffer, or the slot's own. */
  readonly buffer: GPUBuffer;
  /** Byte offset of the slot's region. */
  readonly offset: number;
  /** Bytes of the region. */
  readonly size: number;
}

/** All slots of one (layer, state) in one buffer: slot s at byte `s·strideBytes`, `sizeBytes` long. */
export interface StatePool {
  /** The buffer holding every slot's region. */
  readonly buffer: GPUBuffer;
  /** Bytes from one slot's region to the next (a multiple of {@linkcode STATE_ALIGN_BYTES}). */
  readonly strideBytes: number;
  /** Bytes of one slot's region. */
  readonly sizeBytes: number;
}

/** Where one (layer, state) lives: a pool, or one buffer per slot (a pool too large to bind). */
type Storage =
  | { readonly pool: StatePool }
  | { readonly perSlot: readonly GPUBuffer[] };

/** Most bytes of dropped snapshots' buffers a SlotStates keeps for reuse. */
const SPARE_MAX_BYTES = 256 * 2 ** 20;

/** GPU state buffers for `nSlots` slots, plus snapshots of single slots. */
export class SlotStates {
  readonly #device: GPUDevice;
  readonly #specs: ReadonlyMap<string, StateSpec>;
  readonly #storage: ReadonlyMap<string, Storage>;
  readonly #snapshots = new Map<number, Snapshot>();
  /**
   * Buffers of dropped snapshots kept for the next snapshot of the same state (a drafted frame snapshots its
   * slot every frame: new GPU buffers each time cost more than the copies), one per state, at most
   * SPARE_MAX_BYTES in all.
   */
  readonly #spare = new Map<string, GPUBuffer>();
  #spareBytes = 0;
  /** Each whole-live state's tap (see {@linkcode SlotStates.tap}). */
  readonly #taps = new Map<string, GPUBuffer>();
  #nextSnapshot = 1;
  /** Number of slots. */
  readonly nSlots: number;
  /** Bytes of state per slot. */
  readonly bytesPerSlot: number;

  /**
   * Allocates and zeroes every state buffer for every slot: one pool per (layer, name) when all slots at
   * 256-byte strides fit in `maxPoolBytes` (default: the device's storage binding and buffer size limits),
   * else one buffer per slot.
   * @throws {RangeError} on a duplicate (layer, name) or a size that is not a positive multiple of 4
   */
  constructor(
    device: GPUDevice,
    opts: { specs: readonly StateSpec[]; nSlots: number; maxPoolBytes?: number },
  ) {
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
    const maxPool = opts.maxPoolBytes ??
      Math.min(device.limits.maxStorageBufferBindingSize, device.limits.maxBufferSize);
    const usage = GPUBufferUsage.STORAGE | GPUBufferUsage.COPY_SRC | GPUBufferUsage.COPY_DST;
    const storage = new Map<string, Storage>();
    for (const [k, s] of specs) {
      const strideBytes = Math.ceil(s.sizeBytes / STATE_ALIGN_BYTES) * STATE_ALIGN_BYTES;
      const poolBytes = strideBytes * (opts.nSlots - 1) + s.sizeBytes;
      if (poolBytes <= maxPool) {
        const buffer = device.createBuffer({ label: `L${s.layer}.${s.name}`, size: poolBytes, usage });
        storage.set(k, { pool: { buffer, strideBytes, sizeBytes: s.sizeBytes } });
      } else {
        const perSlot = Array.from(
          { length: opts.nSlots },
          (_, slot) =>
            device.createBuffer({ label: `slot${slot}.L${s.layer}.${s.name}`, size: s.sizeBytes, usage }),
        );
        storage.set(k, { perSlot });
      }
    }
    this.#storage = storage;
    for (const [k, s] of specs) {
      if (s.liveRanges) continue;
      this.#taps.set(k, device.createBuffer({ label: `tap.${k}`, size: s.sizeBytes, usage }));
    }
  }

  /** Bytes held by all slots and the taps (snapshots excluded). */
  get totalBytes(): number {
    let taps = 0;
    for (const b of this.#taps.values()) taps += b.size;
    return this.bytesPerSlot * this.nSlots + taps;
  }

  /** Bytes held by snapshots. */
  get snapshotBytes(): number {
    let n = 0;
    for (const s of this.#snapshots.values()) n += s.sizeBytes;
    return n;
  }

  /** `slot`'s region of state `name` of `layer` (a sub-range of its pool, or its own buffer). */
  binding(slot: number, layer: number, name: string): StateBinding {
    return this.#region(this.#slotChecked(slot), this.#storageOf(layer, name));
  }

  /** Every region of `slot`'s state, one per (layer, name), in the same order for every slot. */
  regions(slot: number): StateBinding[] {
    this.#slotChecked(slot);
    return [...this.#storage.values()].map((st) => this.#region(slot, st));
  }

  /**
   * All slots of state `name` of `layer` in one buffer, or `undefined` where that pool would exceed the
   * binding limit and each slot has a buffer of its own (then a batched step dispatches per slot).
   */
  pool(layer: number, name: string): StatePool | undefined {
    const st = this.#storageOf(layer, name);
    return "pool" in st ? st.pool : undefined;
  }

  /**
   * The tap of state `name` of `layer` (one live whole: a recurrent state or a conv ring), a buffer of one
   * slot's size shared by all slots: a prefill chunk cut at a position writes there the state as it stands
   * after the cut (wgsl/gdn_chunk.wgsl, gdn_conv_ring.wgsl), and {@linkcode SlotStates.snapshot} with
   * `fromTaps` copies it instead of the slot's own. One chunk at a time uses it.
   * @throws {RangeError} for a state with live ranges (a KV cache needs no tap: its rows below the cut stay)
   */
  tap(layer: number, name: string): StateBinding {
    this.#storageOf(layer, name);
    const b = this.#taps.get(key(layer, name));
    if (!b) {
      throw new RangeError(
        `State ${name} of layer ${layer} has live ranges: its rows below a cut need no tap`,
      );
    }
    return { buffer: b, offset: 0, size: b.size };
  }

  /** Records zeroing of every state buffer of `slot` (a sequence restarting at position 0). */
  reset(encoder: GPUCommandEncoder, slot: number): void {
    this.#slotChecked(slot);
    for (const st of this.#storage.values()) {
      const r = this.#region(slot, st);
      encoder.clearBuffer(r.buffer, r.offset, r.size);
    }
  }

  /**
   * Records a copy of `slot`'s state for a sequence `nPos` tokens long into a new snapshot; returns its id.
   * The copy happens when the encoder's commands run, so it captures the state as of that point in the queue.
   * With `rewind`, a rewind point of this slot: the states live whole (recurrent state, conv ring) are copied
   * and the KV rows are not, since the steps after it only write rows from `nPos` on (restore clears those):
   * a decode loop's per-batch stop points cost the recurrent state, not the whole context.
   * With `fromTaps`, the states live whole come from their taps ({@linkcode SlotStates.tap}: a chunk cut at
   * `nPos` wrote them there) and the KV rows below `nPos` from the slot: the slot's state at the cut.
   */
  snapshot(encoder: GPUCommandEncoder, slot: number, nPos: number, rewind = false, fromTaps = false): number {
    this.#slotChecked(slot);
    const id = this.#nextSnapshot++;
    this.#snapshots.set(id, this.#record(encoder, slot, nPos, undefined, rewind, fromTaps));
    return id;
  }

  /**
   * Records a copy of `slot`'s state for a sequence `nPos` tokens long into snapshot `id`, replacing what it
   * held, in its own buffers where they hold the copy (a loop that snapshots every few steps and needs only
   * the latest few recycles them instead of creating buffers each time). Its earlier contents must no longer
   * be needed by work recorded after this, and no work not yet submitted may use it: a buffer too small for
   * the new copy is destroyed.
   */
  retake(encoder: GPUCommandEncoder, id: number, slot: number, nPos: number, rewind = false): void {
    const old = this.#get(id);
    this.#slotChecked(slot);
    this.#snapshots.set(id, this.#record(encoder, slot, nPos, old, rewind));
  }

  /** The copies of a snapshot of `slot` at `nPos`, into `old`'s buffers where they are large enough. */
  #record(
    encoder: GPUCommandEncoder,
    slot: number,
    nPos: number,
    old: Snapshot | undefined,
    rewind: boolean,
    fromTaps = false,
  ): Snapshot {
    const out = new Map<string, { buffer: GPUBuffer; ranges: Range[] }>();
    let total = 0;
    for (const [k, spec] of this.#specs) {
      if (rewind && spec.liveRanges) continue;
      const live = spec.liveRanges?.(nPos) ?? [{ offsetBytes: 0, sizeBytes: spec.sizeBytes }];
      const ranges: Range[] = [];
      let at = 0;
      for (const r of live) {
        if (r.sizeBytes === 0) continue;
        ranges.push({ ...r, atBytes: at });
        at += r.sizeBytes;
      }
      const mine = old?.buffers.get(k)?.buffer;
      if (mine !== undefined && mine.size < at) mine.destroy();
      const buffer = (mine !== undefined && mine.size >= at ? mine : undefined) ?? this.#takeSpare(k, at) ??
        this.#device.createBuffer({
          label: `snapshot.${k}`,
          // Room to grow: the next snapshot of a slot a few tokens longer reuses this buffer once dropped.
          size: Math.min(
            Math.max(4, spec.sizeBytes),
            Math.max(4, 2 ** Math.ceil(Math.log2(Math.max(4, at)))),
          ),
          usage: GPUBufferUsage.COPY_SRC | GPUBufferUsage.COPY_DST,
        });
      const tap = fromTaps && !spec.liveRanges ? this.#taps.get(k) : undefined;
      const src = tap ? { buffer: tap, offset: 0 } : this.#region(slot, this.#storage.get(k)!);
      for (const r of ranges) {
        encoder.copyBufferToBuffer(src.buffer, src.offset + r.offsetBytes, buffer, r.atBytes, r.sizeBytes);
      }
      out.set(k, { buffer, ranges });
      total += at;
    }
    // The old snapshot's buffers of states this one does not hold (a full snapshot retaken as a rewind point).
    for (const [k, { buffer }] of old?.buffers ?? []) if (!out.has(k)) buffer.destroy();
    return { slot, nPos, rewind, buffers: out, sizeBytes: total };
  }

  /** Sequence length a snapshot was taken at. */
  snapshotLength(id: number): number {
    return this.#get(id).nPos;
  }

  /**
   * Records restoring snapshot `id` into `slot` (any slot: a snapshot can seed another sequence). A rewind
   * point restores into its own slot only, whose KV rows below its length are those it was taken with:
   * `heldPos` (≥ its length) says how many positions the slot wrote since, and those rows are cleared.
   * @throws {RangeError} on a rewind point restored into another slot or without a valid `heldPos`
   */
  restore(encoder: GPUCommandEncoder, id: number, slot: number, heldPos?: number): void {
    const snap = this.#get(id);
    this.#slotChecked(slot);
    if (snap.rewind) {
      if (slot !== snap.slot || heldPos === undefined || !(heldPos >= snap.nPos)) {
        throw new RangeError(
          `Snapshot ${id} is a rewind point of slot ${snap.slot} at ${snap.nPos} tokens: it restores into ` +
            `that slot with the positions held since (>= ${snap.nPos}), not slot ${slot} at ${heldPos}`,
        );
      }
      this.clearRows(encoder, slot, snap.nPos, heldPos);
    }
    for (const [k, { buffer, ranges }] of snap.buffers) {
      const dst = this.#region(slot, this.#storage.get(k)!);
      // Positions past the snapshot's length must read as empty, exactly as after a reset (a rewind point
      // holds whole states only: the copy overwrites them).
      if (!snap.rewind) encoder.clearBuffer(dst.buffer, dst.offset, dst.size);
      for (const r of ranges) {
        encoder.copyBufferToBuffer(buffer, r.atBytes, dst.buffer, dst.offset + r.offsetBytes, r.sizeBytes);
      }
    }
  }

  /** Records clearing `slot`'s KV rows of positions [from, to) (as after a reset; states live whole untouched). */
  clearRows(encoder: GPUCommandEncoder, slot: number, from: number, to: number): void {
    for (const [k, spec] of this.#specs) {
      if (!spec.liveRanges) continue;
      const dst = this.#region(this.#slotChecked(slot), this.#storage.get(k)!);
      const below = spec.liveRanges(from);
      for (const [i, r] of spec.liveRanges(to).entries()) {
        const kept = below[i]?.sizeBytes ?? 0;
        if (r.sizeBytes > kept) {
          encoder.clearBuffer(dst.buffer, dst.offset + r.offsetBytes + kept, r.sizeBytes - kept);
        }
      }
    }
  }

  /** The (layer, name) of every state live whole (recurrent state, conv ring: no live ranges), in order. */
  wholeStates(): { layer: number; name: string }[] {
    return [...this.#specs.values()].filter((s) => !s.liveRanges).map((s) => ({
      layer: s.layer,
      name: s.name,
    }));
  }

  /** Frees a snapshot's GPU memory (up to SPARE_MAX_BYTES of it is kept for the next snapshots). */
  drop(id: number): void {
    const snap = this.#get(id);
    for (const [k, { buffer }] of snap.buffers) {
      const old = this.#spare.get(k);
      if (old === undefined && this.#spareBytes + buffer.size <= SPARE_MAX_BYTES) {
        this.#spare.set(k, buffer);
        this.#spareBytes += buffer.size;
      } else buffer.destroy();
    }
    this.#snapshots.delete(id);
  }

  /** The spare buffer of state `k` when it holds `bytes`; it leaves the spares. */
  #takeSpare(k: string, bytes: number): GPUBuffer | undefined {
    const b = this.#spare.get(k);
    if (b === undefined || b.size < bytes) return undefined;
    this.#spare.delete(k);
    this.#spareBytes -= b.size;
    return b;
  }

  /** Destroys every buffer, snapshots included. */
  destroy(): void {
    for (const id of [...this.#snapshots.keys()]) this.drop(id);
    for (const b of this.#spare.values()) b.destroy();
    this.#spare.clear();
    for (const b of this.#taps.values()) b.destroy();
    this.#taps.clear();
    this.#spareBytes = 0;
    for (const st of this.#storage.values()) {
      if ("pool" in st) st.pool.buffer.destroy();
      else for (const b of st.perSlot) b.destroy();
    }
  }

  #slotChecked(slot: number): number {
    if (!Number.isInteger(slot) || slot < 0 || slot >= this.nSlots) {
      throw new RangeError(
        `Slot ${slot} does not exist: this engine has ${this.nSlots} slots (0..${this.nSlots - 1})`,
      );
    }
    return slot;
  }

  #storageOf(layer: number, name: string): Storage {
    const st = this.#storage.get(key(layer, name));
    if (!st) throw new RangeError(`No state ${name} in layer ${layer}`);
    return st;
  }

  #region(slot: number, st: Storage): StateBinding {
    if ("pool" in st) {
      const p = st.pool;
      return { buffer: p.buffer, offset: slot * p.strideBytes, size: p.sizeBytes };
    }
    const b = st.perSlot[slot]!;
    return { buffer: b, offset: 0, size: b.size };
  }

  #get(id: number): Snapshot {
    const s = this.#snapshots.get(id);
    if (!s) throw new RangeError(`Snapshot ${id} does not exist (dropped, or never taken)`);
    return s;
  }
}
