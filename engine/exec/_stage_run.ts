/**
 * `Stage.run` and `Stage.submit`: a run of one slot's rows in chunks, its work submitted at once and its
 * readback (one `mapAsync`, read early where the runtime allows: engine/gpu/readback.ts) left pending, so a
 * caller can submit the next frame's work while this frame's readback lands (docs/PLATFORM.md "The 10 ms
 * readback floor"). GPU work is ordered by submission, so a later submission that reuses the activation
 * buffers runs after this frame's copy out.
 * @module
 */
import {
  encodeOps,
  MATVEC_MAX_COLS,
  type OnLayer,
  type Op,
  OpStream,
  writeChunkPos,
} from "../graph/builder.ts";
import type { Hparams } from "../models/mod.ts";
import type { SlotStates } from "../state.ts";
import type { RunProfile } from "./_profile.ts";
import type { PipelineCache } from "../../wgsl/kernel.ts";
import { buildSelector } from "./_selector.ts";
import { STORAGE } from "./activations.ts";
import type { StageInput, StageOutput } from "./options.ts";
import { LruMap } from "../graph/_lru.ts";
import type { StagingPool } from "../gpu/readback.ts";
import type { RowSampleOptions } from "./options.ts";
import { SAMPLE_HIST, sampleParamWords } from "../sampling.ts";
import { packSampleState } from "../../wgsl/sample.ts";

/**
 * Graphs a stage keeps per kind (chunk graphs by slot, width and rows; batched steps by slot set), least
 * recently used dropped first: a server meets endless prompt widths, and each graph holds bind groups.
 */
export const GRAPHS_KEPT = 128;
/** Runs encoded ahead a stage keeps (each holds a staging buffer of its output: up to a logits row). */
export const SPARES_KEPT = 32;

/** A run's command buffer and staging, encoded ahead. */
export interface Spare {
  readonly cmd: GPUCommandBuffer;
  readonly staging: GPUBuffer;
}

/** A stage's cache of graphs of one kind, by key. */
export function graphCache<V>(): LruMap<string, V> {
  return new LruMap<string, V>(GRAPHS_KEPT);
}

/** A stage's runs encoded ahead by shape, and the staging pool their stagings come from and go back to. */
export type Spares = LruMap<string, Spare> & { readonly stagings: StagingPool };

/** A stage's runs encoded ahead, by shape (an evicted one's staging goes back to `pool`). */
export function spareCache(pool: StagingPool): Spares {
  return Object.assign(new LruMap<string, Spare>(SPARES_KEPT, (s) => pool.give(s.staging)), {
    stagings: pool,
  });
}

/** What `submitRun` needs of its stage (its private buffers, handed over by `Stage.submit`). */
export interface RunParts {
  readonly hp: Hparams;
  readonly last: boolean;
  readonly device: GPUDevice;
  readonly act: Record<string, GPUBuffer>;
  readonly pos: GPUBuffer;
  readonly states: SlotStates;
  /** Tokens held per slot (updated here). */
  readonly length: number[];
  /** Rows the logits buffer holds (every-row logits go in pieces of it). */
  readonly logitsRows: number;
  /** A chunk graph; `onLayer` while it is built fresh (OpStream). */
  readonly graph: (n: number, rows: "all" | "last" | "none", onLayer?: OnLayer) => Promise<readonly Op[]>;
  readonly gpuCheck: () => void;
  readonly profile: RunProfile;
  /** Staging buffers, reused so that readbacks are read early (engine/gpu/readback.ts). */
  readonly stagings: StagingPool;
  /** Per run shape: a command buffer and staging encoded ahead (absent: every run encodes its own). */
  readonly spares?: LruMap<string, Spare>;
  /**
   * The argmax (or with `sampled` the GPU sampler) on logits row `row` writing ring word `params[0]` (a last
   * stage's `ids` runs).
   */
  readonly argmax?: (row: number, sampled?: boolean) => Promise<RowArgmax>;
}

/** Most ids one `ids` run returns (its argmax ring's words). */
export const ARGMAX_RING = 256;

/**
 * An argmax (or the sampler) on one logits row: its dispatches, its params (word 0: the ring word; a
 * sampler's settings after it) and its id ring.
 */
export interface RowArgmax {
  readonly ops: readonly Op[];
  readonly params: GPUBuffer;
  readonly ring: GPUBuffer;
  /** A sampled row's: the sampler's state (RNG step, penalty history) and whether it masks UNUSED ids. */
  readonly sampler?: { readonly state: GPUBuffer; readonly maskUnused: boolean };
}

/**
 * Writes a sampled row's settings (ring word `ringSlot`) and its stream's start (`o.step`, `o.history`):
 * the first row of a run (later rows continue its state, as consecutive decode steps do).
 */
export function startSampler(queue: GPUQueue, a: RowArgmax, o: RowSampleOptions, ringSlot = 0): void {
  const { state, maskUnused } = a.sampler!;
  queue.writeBuffer(a.params, 0, sampleParamWords(o.sampling, { ringSlot, maskUnused }));
  queue.writeBuffer(
    state,
    0,
    packSampleState(SAMPLE_HIST, { step: o.step, history: o.history.slice(-SAMPLE_HIST) }),
  );
}

/** A submitted run: its output once the readback lands (wrapped so `await submit()` does not wait for it). */
export interface PendingRun {
  /** The run's output, once its readback lands (rejects as `Stage.run` would). */
  readonly output: Promise<StageOutput>;
}

/**
 * Submits every chunk of the run (checked by the caller: slot, input, base, chunk) and starts its readback;
 * `mapAsync` is called here (it blocks until the GPU is idle), its promise is the pending output. With `ids`
 * (a last stage, rows `last`, or `all` in one-token chunks) each output row's argmax runs in the row's pass and
 * only the ids come back; with `sample` too, the sampler instead, row after row as one sequence's steps (one
 * chunk of several rows: each row's sampler in a pass of its own, its state copied from the row before).
 */
export async function submitRun(
  p: RunParts,
  slot: number,
  input: StageInput,
  base: number,
  nTokens: number,
  opts: { rows: "all" | "last" | "none"; chunk: number; ids?: boolean; sample?: RowSampleOptions },
): Promise<PendingRun> {
  const { device, hp, profile: prof } = p;
  const rows = opts.rows;
  const nIds = rows === "all" ? nTokens : rows === "last" ? 1 : 0;
  if (opts.sample && !opts.ids) throw new RangeError("A sampled run returns ids: give ids with sample");
  const sample = rows === "none" ? undefined : opts.sample;
  const argmax = opts.ids && rows !== "none"
    ? await argmaxOf(p, rows, opts.chunk, nIds, nTokens, sample !== undefined)
    : undefined;
  const width = p.last ? hp.nVocab : hp.nEmbd;
  const out = new Float32Array(argmax ? 0 : width * nIds);
  prof.start();
  if (base === 0) {
    const enc = device.createCommandEncoder();
    p.states.reset(enc, slot);
    device.queue.submit([enc.finish()]);
    p.length[slot] = 0;
  }
  const stagingSize = argmax ? Math.max(16, 4 * nIds) : out.byteLength;
  const newStaging = () => p.stagings.take(stagingSize);
  const step = p.last && rows === "all" ? Math.min(opts.chunk, p.logitsRows) : opts.chunk;
  // A one-chunk decode frame's command buffer (and staging) is encoded ahead, while the previous readback of
  // the same shape waits (its inputs live in buffers written before the submit): the encode leaves the path.
  const spareKey = p.spares && base > 0 && rows !== "none" && nTokens <= step
    ? `${slot}/${nTokens}/${rows}/${argmax ? (sample ? "sample" : "ids") : ""}`
    : undefined;
  const spare = spareKey === undefined ? undefined : p.spares!.get(spareKey);
  if (spare) p.spares!.delete(spareKey!);
  const staging = rows === "none" ? undefined : spare?.staging ?? newStaging();
  const encode = (
    ops: readonly Op[],
    at: number,
    n: number,
    outRows: "all" | "last" | "none",
    to?: GPUBuffer,
    enc = device.createCommandEncoder(),
  ) => {
    const pass = enc.beginComputePass();
    const chained = sample !== undefined && argmax !== undefined && argmax.length > 1 && outRows !== "none";
    const selects = chained ? argmax.slice(0, 1) : argmax && outRows !== "none" ? argmax : [];
    encodeOps(pass, [...ops, ...selects.flatMap((a) => a.ops)]);
    pass.end();
    for (let r = 1; chained && r < argmax.length; r++) {
      // Row r's draw continues row r - 1's stream: its settings, RNG step and history as the kernel left them.
      const [prev, cur] = [argmax[r - 1]!, argmax[r]!];
      enc.copyBufferToBuffer(prev.params, 0, cur.params, 0, prev.params.size);
      enc.copyBufferToBuffer(prev.sampler!.state, 0, cur.sampler!.state, 0, prev.sampler!.state.size);
      const pr = enc.beginComputePass();
      encodeOps(pr, cur.ops);
      pr.end();
    }
    if (argmax && to && at + n === nTokens && argmax.length > 1) {
      // One chunk, an argmax per row: each row's id is word 0 of its ring.
      argmax.forEach((a, r) => enc.copyBufferToBuffer(a.ring, 0, to, 4 * r, 4));
    } else if (argmax && to && at + n === nTokens) {
      enc.copyBufferToBuffer(argmax[0]!.ring, 0, to, 0, 4 * nIds);
    } else if (!argmax && outRows !== "none" && to) {
      const src = p.last ? p.act.logits! : p.act.h!;
      const srcOff = !p.last && outRows === "last" ? (n - 1) * width * 4 : 0;
      const size = (outRows === "all" ? n : 1) * width * 4;
      const dstOff = outRows === "all" ? at * width * 4 : 0;
      enc.copyBufferToBuffer(src, srcOff, to, dstOff, size);
    }
    return enc.finish();
  };
  // A sampled run's stream starts at its first output chunk; later one-token chunks continue its state.
  let sampling = false;
  for (let at = 0; at < nTokens; at += step) {
    const n = Math.min(step, nTokens - at);
    const lastChunk = at + n === nTokens;
    const outRows = rows === "all" ? "all" : lastChunk && rows === "last" ? "last" : "none";
    prof.lap("run.other");
    writeChunkPos(device.queue, p.pos, slot, base + at, n);
    if ("tokens" in input) {
      device.queue.writeBuffer(p.act.tokens!, 0, Uint32Array.from(input.tokens.slice(at, at + n)));
    } else {
      device.queue.writeBuffer(p.act.h!, 0, input.hidden, at * hp.nEmbd, n * hp.nEmbd);
    }
    prof.lap("run.writeBuffer");
    // The run's first chunk: a graph built fresh goes to the GPU layer by layer as it is built.
    const stream = at === 0 && !spare ? new OpStream(device, device.createCommandEncoder()) : undefined;
    const graph = spare ? [] : await p.graph(n, outRows, stream?.onLayer);
    const { enc, ops } = stream?.rest(graph) ?? { enc: undefined, ops: graph };
    prof.lap("run.graph");
    if (argmax && outRows !== "none") {
      const ringSlot = argmax.length > 1 ? 0 : rows === "all" ? at : 0;
      if (sample && !sampling) startSampler(device.queue, argmax[0]!, sample, ringSlot);
      else if (sample) device.queue.writeBuffer(argmax[0]!.params, 0, Uint32Array.of(ringSlot));
      else for (const a of argmax) device.queue.writeBuffer(a.params, 0, Uint32Array.of(ringSlot));
      sampling = sample !== undefined;
    }
    const cmd = spare?.cmd ?? encode(ops, at, n, outRows, staging, enc);
    prof.lap("run.encode");
    device.queue.submit([cmd]);
    prof.lap("run.submit");
    p.length[slot] = base + at + n;
  }
  if (spareKey !== undefined) {
    const outRows = rows === "all" ? "all" : "last";
    setTimeout(async () => {
      try {
        const t0 = performance.now();
        const ops = await p.graph(nTokens, outRows);
        const st = newStaging();
        const next = { cmd: encode(ops, 0, nTokens, outRows, st), staging: st };
        const old = p.spares!.get(spareKey);
        if (old) p.stagings.give(old.staging);
        p.spares!.set(spareKey, next);
        prof.add("run.preEncode", performance.now() - t0);
      } catch {
        // The stage is gone (destroyed buffers): no spare.
      }
    }, 0);
  }
  const kind = p.last ? "logits" as const : "hidden" as const;
  if (!staging) return { output: Promise.resolve({ kind, data: out, rows: 0 }) };
  // The bytes once the GPU is done (the call blocks until then); the staging goes back to the pool.
  const read = p.stagings.read(staging);
  prof.lap("run.mapAsyncCall");
  const t = performance.now();
  const output = (async () => {
    const bytes = await read;
    prof.add("run.mapWait", performance.now() - t);
    const t1 = performance.now();
    p.gpuCheck();
    const ids = argmax && new Uint32Array(bytes, 0, nIds);
    if (!argmax) out.set(new Float32Array(bytes, 0, out.length));
    prof.add("run.copyOut", performance.now() - t1);
    return { kind, data: out, rows: nIds, ...(ids ? { ids } : {}) };
  })();
  output.catch(() => {/* the caller awaits it */});
  return { output };
}

/**
 * The argmax on logits row `row` of `logits` (the decode driver's selector, `buildSelector`; its id also lands
 * in a 16-byte buffer of its own that no graph embeds): `ARGMAX_RING` ring words for row 0, one for the others.
 */
export async function rowArgmax(
  sb: {
    device: GPUDevice;
    cache: PipelineCache;
    owned: GPUBuffer[];
    logits: GPUBuffer | undefined;
    unusedMask?: Uint32Array<ArrayBuffer>;
  },
  nVocab: number,
  row: number,
  sampled = false,
): Promise<RowArgmax> {
  const nextToken = sb.device.createBuffer({ label: `argmax${row}.id`, size: 16, usage: STORAGE });
  sb.owned.push(nextToken);
  const S = row === 0 ? ARGMAX_RING : 1;
  const o = { row, nextToken, S, top: 0, sampling: sampled };
  const mask = sampled ? sb.unusedMask : undefined;
  const sel = await buildSelector({ ...sb, unusedMask: mask }, nVocab, o);
  const sampler = sel.sampler && { state: sel.sampler.state, maskUnused: mask !== undefined };
  return { ops: sel.stepOps, params: sel.argmaxParams, ring: sel.idRing, ...(sampler ? { sampler } : {}) };
}

/**
 * The argmaxes of an `ids` run, checked: a last stage, rows `last`, one-token `all` chunks (row 0's argmax
 * into successive ring words), or `all` rows of one chunk of at most MATVEC_MAX_COLS (an argmax per row).
 */
async function argmaxOf(
  p: RunParts,
  rows: "all" | "last",
  chunk: number,
  nIds: number,
  nTokens: number,
  sampled: boolean,
): Promise<RowArgmax[]> {
  if (!p.last || !p.argmax) throw new RangeError("Only a last stage's run returns ids");
  if (rows === "all" && chunk !== 1) {
    if (nTokens > chunk || nTokens > MATVEC_MAX_COLS) {
      throw new RangeError(
        `Every row's ids take one-token chunks (chunk: 1) or one chunk of at most ${MATVEC_MAX_COLS} rows`,
      );
    }
    return await Promise.all(Array.from({ length: nTokens }, (_, r) => p.argmax!(r, sampled)));
  }
  if (nIds > ARGMAX_RING) throw new RangeError(`One run returns at most ${ARGMAX_RING} ids, got ${nIds}`);
  return [await p.argmax(0, sampled)];
}
