/**
 * Rewind points of the decode loop (engine/exec/decode.ts). A stop id or an abort seen at a readback is exact
 * because the steps that ran ahead of it can be undone: each readback batch starts with a copy of every member
 * slot's states that live whole (recurrent state, conv ring); the KV rows below the position stay where they
 * are, and a rewind clears the rows written since (SlotStates.clearRows).
 *
 * Where a state's slots share a pool, the copies go to one of two mirror buffers of the pool's layout (a
 * slot's consecutive points alternate between them: the loop holds at most the point of the batch in flight
 * and that of the batch encoded after it), in one copy_regions dispatch per state and mirror for every slot
 * of the batch. Region by region, copyBufferToBuffer cost 4 ms per 8-slot batch on the H100 (5% of the
 * 8-slot step, docs/PERF.md: bench/decode.ts --stop-points). A pool over the binding limit (one buffer per
 * slot) takes SlotStates' own rewind snapshots instead.
 * @module
 */
import { bindGroup, type PipelineCache } from "../../wgsl/kernel.ts";
import {
  checkCopyRegions,
  COPY_REGIONS,
  COPY_REGIONS_PER,
  copyRegionsGrid,
  copyRegionsParams,
} from "../../wgsl/copy_regions.ts";
import type { SlotStates, StatePool } from "../state.ts";
import { assert } from "../errors.ts";

/** A rewind point: a mirror of the pools, or a SlotStates snapshot (`id`). */
type Point =
  & { readonly slot: number; readonly nPos: number }
  & (
    | { readonly mirror: 0 | 1 }
    | { readonly id: number }
  );

/** Params buffers cycled over encode calls (each read by its batch before the ring comes round). */
const PARAMS_RING = 4;
/** Bytes of one dispatch's params entry (a storage binding offset: 256-byte aligned). */
const ENTRY_BYTES = 256;

/** The decode loop's rewind points of one stage; see the module doc. */
export class RewindPoints {
  readonly #device: GPUDevice;
  readonly #states: SlotStates;
  readonly #pipeline: GPUComputePipeline;
  /** Every whole-live state's pool (undefined: one is not pooled, or no memory for the mirrors). */
  #pools: readonly StatePool[] | undefined;
  /** Per pooled state, its two mirrors. */
  #mirrors: [GPUBuffer, GPUBuffer][] | undefined;
  readonly #params: GPUBuffer[] = [];
  #ring = 0;
  readonly #groups = new Map<string, GPUBindGroup>();
  readonly #points = new Map<number, Point>();
  #next = 1;
  /** Copies recorded by `take` for the next `encode`: slot and mirror. */
  #pending: { slot: number; mirror: 0 | 1 }[] = [];

  private constructor(device: GPUDevice, states: SlotStates, pipeline: GPUComputePipeline) {
    this.#device = device;
    this.#states = states;
    this.#pipeline = pipeline;
    const pools = states.wholeStates().map((s) => states.pool(s.layer, s.name));
    this.#pools = pools.every((p) => p !== undefined) ? pools as StatePool[] : undefined;
  }

  /**
   * The rewind points of `states` (compiles the copy kernel and makes the mirrors: two copies of every slot's
   * whole-live states; where the device has no memory for them, SlotStates' rewind snapshots instead).
   */
  static async create(device: GPUDevice, states: SlotStates, cache: PipelineCache): Promise<RewindPoints> {
    const r = new RewindPoints(device, states, await cache.get(COPY_REGIONS, { PER: COPY_REGIONS_PER }));
    if (r.#pools) {
      device.pushErrorScope("out-of-memory");
      const mirrors = r.#pools.map((p, i) =>
        [0, 1].map((m) => r.#own(p.buffer.size, `state ${i} mirror ${m}`)) as [GPUBuffer, GPUBuffer]
      );
      if (await device.popErrorScope()) {
        for (const b of mirrors.flat()) b.destroy();
        r.#pools = undefined;
      } else r.#mirrors = mirrors;
    }
    return r;
  }

  /**
   * A rewind point of `slot` at `nPos` as of the next `encode` into `encoder` (a SlotStates snapshot is
   * recorded into `encoder` at once); `reuse`: a point of the same slot no longer needed, whose mirror (or
   * snapshot buffers) this one takes. Returns its id.
   */
  take(encoder: GPUCommandEncoder, slot: number, nPos: number, reuse?: number): number {
    const old = reuse === undefined ? undefined : this.#point(reuse);
    assert(old === undefined || old.slot === slot, "a rewind point reused by its own slot");
    if (reuse !== undefined) this.#points.delete(reuse);
    const id = this.#next++;
    if (this.#pools) {
      const busy = [...this.#points.values()].filter((p) => p.slot === slot && "mirror" in p).map((p) =>
        (p as { mirror: 0 | 1 }).mirror
      );
      const mirror = old && "mirror" in old ? old.mirror : ([0, 1] as const).find((m) => !busy.includes(m));
      if (mirror !== undefined) {
        this.#points.set(id, { slot, nPos, mirror });
        this.#pending = this.#pending.filter((p) => p.slot !== slot);
        this.#pending.push({ slot, mirror });
        return id;
      }
    }
    const sid = old && "id" in old ? old.id : undefined;
    if (sid !== undefined) this.#states.retake(encoder, sid, slot, nPos, true);
    this.#points.set(id, { slot, nPos, id: sid ?? this.#states.snapshot(encoder, slot, nPos, true) });
    return id;
  }

  /** Records the copies of the points taken since the last call: one dispatch per state and mirror. */
  encode(encoder: GPUCommandEncoder): void {
    if (this.#pending.length === 0 || !this.#pools) return;
    const pools = this.#pools;
    const mirrors = this.#mirrors!;
    const ring = this.#ring++ % PARAMS_RING;
    const params = this.#params[ring] ??= this.#own(2 * pools.length * ENTRY_BYTES, "params", true);
    const words = new Uint32Array((2 * pools.length * ENTRY_BYTES) / 4);
    const pass = encoder.beginComputePass();
    for (const mirror of [0, 1] as const) {
      const slots = this.#pending.filter((p) => p.mirror === mirror).map((p) => p.slot);
      if (slots.length === 0) continue;
      for (const [i, pool] of pools.entries()) {
        const shape = { lenBytes: pool.sizeBytes, strideBytes: pool.strideBytes, slots };
        const at = (2 * i + mirror) * ENTRY_BYTES;
        words.set(copyRegionsParams(shape), at / 4);
        const key = `${i}/${mirror}/${ring}`;
        let g = this.#groups.get(key);
        if (!g) {
          const b = {
            params: { buffer: params, offset: at, size: ENTRY_BYTES },
            src: pool.buffer,
            dst: mirrors[i]![mirror],
          };
          checkCopyRegions(shape, b);
          g = bindGroup(this.#device, this.#pipeline, [b.params, b.src, b.dst]);
          this.#groups.set(key, g);
        }
        pass.setPipeline(this.#pipeline);
        pass.setBindGroup(0, g);
        pass.dispatchWorkgroups(...copyRegionsGrid(shape));
      }
    }
    pass.end();
    // Written before the submit that holds `encoder` (a queue write lands before the work submitted after it).
    this.#device.queue.writeBuffer(params, 0, words);
    this.#pending = [];
  }

  /**
   * Submits restoring point `id` into its slot, which wrote positions up to `heldPos` since (their KV rows are
   * cleared); the slot then holds the point's `nPos` tokens (the caller sets the stage's length).
   */
  restore(id: number, slot: number, heldPos: number): number {
    const p = this.#point(id);
    assert(p.slot === slot && heldPos >= p.nPos, "a rewind point restores its own slot, forward of it");
    const enc = this.#device.createCommandEncoder();
    if ("id" in p) this.#states.restore(enc, p.id, slot, heldPos);
    else {
      for (const [i, pool] of this.#pools!.entries()) {
        const at = slot * pool.strideBytes;
        enc.copyBufferToBuffer(this.#mirrors![i]![p.mirror], at, pool.buffer, at, pool.sizeBytes);
      }
      this.#states.clearRows(enc, slot, p.nPos, heldPos);
    }
    this.#device.queue.submit([enc.finish()]);
    return p.nPos;
  }

  /** Frees point `id` (a snapshot's buffers; a mirror's place of its slot). */
  drop(id: number): void {
    const p = this.#point(id);
    if ("id" in p) this.#states.drop(p.id);
    else this.#pending = this.#pending.filter((q) => q.slot !== p.slot || q.mirror !== p.mirror);
    this.#points.delete(id);
  }

  /** Destroys the mirrors and params buffers (the stage's destroy). */
  destroy(): void {
    for (const [a, b] of this.#mirrors ?? []) {
      a.destroy();
      b.destroy();
    }
    for (const b of this.#params) b.destroy();
    this.#mirrors = undefined;
    this.#groups.clear();
  }

  #point(id: number): Point {
    const p = this.#points.get(id);
    if (!p) throw new RangeError(`Rewind point ${id} does not exist (dropped, or never taken)`);
    return p;
  }

  #own(size: number, label: string, params = false): GPUBuffer {
    return this.#device.createBuffer({
      label: `rewind ${label}`,
      size,
      usage: GPUBufferUsage.STORAGE | (params ? GPUBufferUsage.COPY_DST : GPUBufferUsage.COPY_SRC),
    });
  }
}
