/**
 * A stage's chunk graphs by (slot, width, rows), least recently used dropped first, where a slot's first graph
 * of a width another slot has built is that graph with the other slot's own buffers swapped for its own
 * (its position params, and the regions of its KV caches and recurrent states): no blocks rebuilt, and bind
 * groups only for the dispatches that bind per-slot state (the rest come from the stage's bind group cache).
 * A graph's dispatches are the same for every slot by construction (the builder reads the slot only through
 * those buffers); `tests/slot_graphs_test.ts` checks a clone against a fresh build of the same slot.
 * @module
 */
import { bindGroup, type BindGroupCache, type Binding, withBindGroups } from "../../wgsl/kernel.ts";
import { type Op, ownerBindGroups } from "../graph/builder.ts";
import { LruMap } from "../graph/_lru.ts";
import type { SlotStates } from "../state.ts";
import { GRAPHS_KEPT } from "./_stage_run.ts";

export { graphCache, spareCache, type Spares } from "./_stage_run.ts";

/** Rows returned, and a layer sub-range's graph marked after them (`none@0:20`). */
type Rows = string;

/** What a clone swaps: each slot's position params buffer and state regions. */
export interface SlotBuffers {
  readonly device: GPUDevice;
  readonly posParams: readonly GPUBuffer[];
  readonly states: SlotStates;
  /** The stage's shared bind groups. */
  readonly groups: BindGroupCache;
}

/** See the module doc. */
export class SlotGraphs {
  readonly #graphs = new LruMap<string, Op[]>(GRAPHS_KEPT);
  /** The latest slot built fresh per width and rows, and its graph (as many widths as graphs are kept). */
  readonly #donors = new LruMap<string, { slot: number; ops: Op[] }>(GRAPHS_KEPT);
  readonly #b: SlotBuffers;
  /** The widths (`n/rows`, whole stage) used last by any slot, newest first: what `spread` copies. */
  readonly #recent: string[] = [];
  #built = 0;

  /** @param owned the stage's owned buffers (their bind group cache serves the clones) */
  constructor(device: GPUDevice, posParams: readonly GPUBuffer[], states: SlotStates, owned: GPUBuffer[]) {
    this.#b = { device, posParams, states, groups: ownerBindGroups(owned) };
  }

  /** Graphs built fresh or cloned so far (tests: a slot that `spread` prepared builds none). */
  get built(): number {
    return this.#built;
  }

  /** `slot`'s graph of `n` tokens and `rows`: cached, else cloned from another slot's (`clone`), else none. */
  get(slot: number, n: number, rows: Rows, clone: boolean): Op[] | undefined {
    const hit = this.#graphs.get(`${slot}/${n}/${rows}`);
    if (hit || !clone) {
      if (hit) this.#touch(`${n}/${rows}`);
      return hit;
    }
    return this.#clone(slot, `${n}/${rows}`);
  }

  /** Keeps `slot`'s freshly built graph (and offers it to other slots). */
  set(slot: number, n: number, rows: Rows, ops: Op[]): void {
    this.#built++;
    this.#graphs.set(`${slot}/${n}/${rows}`, ops);
    if (ops.every((op) => op.bindings)) this.#donors.set(`${n}/${rows}`, { slot, ops });
    this.#touch(`${n}/${rows}`);
  }

  /**
   * Clones, for the first slot of `slots` that lacks one, a graph of a width used last ({@linkcode RECENT_WIDTHS}
   * of them, newest first) from the slot that built it; returns whether it did. Idle-time work: the next
   * request on that slot then builds nothing before its prefill (a clone of a 40-layer graph takes
   * milliseconds).
   */
  spread(slots: Iterable<number>): boolean {
    for (const slot of slots) {
      for (const key of this.#recent) {
        if (!this.#graphs.has(`${slot}/${key}`) && this.#clone(slot, key)) return true;
      }
    }
    return false;
  }

  #clone(slot: number, key: string): Op[] | undefined {
    const d = this.#donors.get(key);
    const ops = d && d.slot !== slot ? cloneForSlot(d.ops, d.slot, slot, this.#b) : undefined;
    if (ops) {
      this.#built++;
      this.#graphs.set(`${slot}/${key}`, ops);
      this.#touch(key);
    }
    return ops;
  }

  /** Marks width `key` used (whole-stage graphs only: a layer sub-range is a piece's part). */
  #touch(key: string): void {
    if (key.includes("@")) return;
    const at = this.#recent.indexOf(key);
    if (at === 0) return;
    if (at > 0) this.#recent.splice(at, 1);
    this.#recent.unshift(key);
    this.#recent.length = Math.min(this.#recent.length, RECENT_WIDTHS);
  }
}

/** Widths `SlotGraphs.spread` copies to every slot: a lone request's prompt and decode step, a piece's. */
export const RECENT_WIDTHS = 3;

/**
 * `ops` (built for slot `from`) with `from`'s buffers swapped for slot `to`'s; undefined where an op's
 * bindings are unknown. A binding inside one of `from`'s state regions moves by the same offset into `to`'s
 * region; bindings of whole pools, activations, weights and params stay.
 */
export function cloneForSlot(ops: readonly Op[], from: number, to: number, b: SlotBuffers): Op[] | undefined {
  const src = b.states.regions(from);
  const dst = b.states.regions(to);
  const byBuffer = new Map<GPUBuffer, number[]>();
  src.forEach((r, i) => byBuffer.set(r.buffer, [...(byBuffer.get(r.buffer) ?? []), i]));
  const [posFrom, posTo] = [b.posParams[from]!, b.posParams[to]!];
  const swap = (x: Binding): Binding => {
    const buffer = x instanceof GPUBuffer ? x : x.buffer;
    if (buffer === posFrom) return x instanceof GPUBuffer ? posTo : { ...x, buffer: posTo };
    const offset = x instanceof GPUBuffer ? 0 : x.offset ?? 0;
    const size = x instanceof GPUBuffer ? buffer.size : x.size ?? buffer.size - offset;
    for (const i of byBuffer.get(buffer) ?? []) {
      const [r, t] = [src[i]!, dst[i]!];
      if (offset >= r.offset && offset + size <= r.offset + r.size) {
        return { buffer: t.buffer, offset: t.offset + offset - r.offset, size };
      }
    }
    return x;
  };
  const out: Op[] = [];
  for (const op of ops) {
    if (!op.bindings) return undefined;
    const bindings = op.bindings.map(swap);
    const same = bindings.every((x, i) => x === op.bindings![i]);
    const group = same
      ? op.bindGroup
      : withBindGroups(b.groups, () => bindGroup(b.device, op.pipeline, bindings));
    out.push({ ...op, bindGroup: group, bindings });
  }
  return out;
}
