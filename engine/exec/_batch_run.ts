/**
 * `Stage.runBatch`: one decode row for each of several slots in one batched step (the decode driver's
 * batched graph, `Stage.#batchGraph`), with its output read back: the hidden rows of a head or middle stage,
 * or the logits of a last stage. A split's pipelined driver (engine/exec/_split_pipe.ts) runs a group of
 * slots through the head's layers with it, and a worker runs a group's frame (docs/WIRE.md RUN_BATCH).
 *
 * Each column's arithmetic is that of the slot's one-token `Stage.run` (the batched graph sums every
 * column in the solo order: tests/batch_test.ts), so the rows and logits are the same bits
 * (tests/split_batch_test.ts checks both against `run`).
 * @module
 */
import { encodeOps, type Op, padWords } from "../graph/builder.ts";
import type { Hparams } from "../models/mod.ts";
import { checkStageInput } from "./_load.ts";
import { MAX_BATCH_SLOTS } from "./activations.ts";
import type { StageInput, StageOutput } from "./options.ts";
import type { RunProfile } from "./_profile.ts";
import { type PendingRun, type RowArgmax, type Spare, startSampler } from "./_stage_run.ts";
import type { RowSampleOptions } from "./options.ts";
import type { LruMap } from "../graph/_lru.ts";
import type { StagingPool } from "../gpu/readback.ts";

/** Bytes per column of a batched graph's column table (each column's entry a bindable sub-range). */
const TABLE_COLUMN_BYTES = 256;

/** What `runBatch` needs of its stage (its private buffers, handed over by `Stage.runBatch`). */
export interface BatchRunParts {
  readonly stage: {
    readonly hp: Hparams;
    readonly layers: readonly [number, number];
    readonly first: boolean;
    readonly last: boolean;
    readonly nCtx: number;
    readonly canBatch: boolean;
  };
  readonly device: GPUDevice;
  readonly act: Record<string, GPUBuffer>;
  /** Per slot: the id buffer its batched steps embed. */
  readonly tok: readonly GPUBuffer[];
  /** Tokens held per slot (updated here). */
  readonly length: number[];
  /** The batched graph of `slots`: its column table ([pos, 1, slot] per 256 bytes), or per-column params. */
  readonly graph: (
    slots: readonly number[],
  ) => Promise<{ ops: readonly Op[]; table: GPUBuffer } | { ops: readonly Op[]; pos: readonly GPUBuffer[] }>;
  readonly gpuCheck: () => void;
  readonly profile: RunProfile;
  /** Staging buffers, reused so that readbacks are read early (engine/gpu/readback.ts). */
  readonly stagings: StagingPool;
  /** Per step shape: a command buffer and staging encoded ahead (absent: every step encodes its own). */
  readonly spares?: LruMap<string, Spare>;
  /** The argmax (`sampled`: the sampler) on logits row `row` writing word 0 of its ring (`ids` steps). */
  readonly argmax?: (row: number, sampled?: boolean) => Promise<RowArgmax>;
}

/** Throws unless `slots` are 2..MAX_BATCH_SLOTS distinct slots of the `nSlots` (a batched step's). */
export function batchSlotsCheck(slots: readonly number[], nSlots: number): void {
  for (const slot of slots) {
    if (!Number.isInteger(slot) || slot < 0 || slot >= nSlots) {
      throw new RangeError(`Slot ${slot} does not exist: this stage has ${nSlots} slots`);
    }
  }
  if (slots.length < 2 || slots.length > MAX_BATCH_SLOTS || new Set(slots).size !== slots.length) {
    throw new RangeError(`A batched step takes 2..${MAX_BATCH_SLOTS} distinct slots, got ${slots.join(",")}`);
  }
}

/**
 * Submits one row per slot of `slots` (2..MAX_BATCH_SLOTS distinct slots), each continuing its sequence at its
 * length: `tokens[b]` (first stage) or hidden row `b` of `hidden` (`nTokens` = slots.length) for slot
 * `slots[b]`, and starts the readback; its output (pending) is row `b` per slot in that order: ne=[nVocab, n]
 * logits (last stage) or ne=[nEmbd, n]; with `ids` (a last stage) each column's argmax id instead (`ids`), or
 * where `sample[b]` is given, column b's draw by the GPU sampler with those settings, RNG step and history
 * (each column a sequence of its own: the draw `Stage.sampleRows` makes from the same logits row).
 * @throws {RangeError} on repeated or missing slots, a stage that cannot batch, or input as Stage.run refuses
 */
export async function submitBatch(
  p: BatchRunParts,
  slots: readonly number[],
  input: StageInput,
  ids = false,
  sample?: readonly (RowSampleOptions | undefined)[],
): Promise<PendingRun> {
  const { stage, device, act, profile: prof } = p;
  const n = slots.length;
  batchSlotsCheck(slots, p.length.length);
  if (!stage.canBatch) {
    throw new RangeError("This model's activation rows cannot be bound per slot: no batching");
  }
  const nEmbd = stage.hp.nEmbd;
  if ("tokens" in input ? input.tokens.length !== n : input.nTokens !== n) {
    throw new RangeError(`A batched step takes one row per slot: ${n} slots`);
  }
  for (const [b, slot] of slots.entries()) {
    const one: StageInput = "tokens" in input
      ? { tokens: [input.tokens[b]!] }
      : { hidden: input.hidden.subarray(b * nEmbd, (b + 1) * nEmbd), nTokens: 1 };
    const held = p.length[slot]!;
    checkStageInput(stage, { slot, held, input: one, base: held, nTokens: 1 });
  }
  if (ids && (!stage.last || !p.argmax)) throw new RangeError("Only a last stage's step returns ids");
  if (sample && (!ids || sample.length !== n)) {
    throw new RangeError(`A sampled step returns ids and takes one entry per slot: ${n} slots`);
  }
  prof.start();
  const g = await p.graph(slots);
  const sampled = (b: number) => sample?.[b] !== undefined;
  const argmax = ids ? await Promise.all(slots.map((_, b) => p.argmax!(b, sampled(b)))) : undefined;
  prof.lap("batch.graph");
  for (const [b, slot] of slots.entries()) {
    const at = "table" in g
      ? { buffer: g.table, offset: b * TABLE_COLUMN_BYTES }
      : { buffer: g.pos[b]!, offset: 0 };
    device.queue.writeBuffer(at.buffer, at.offset, Uint32Array.of(p.length[slot]!, 1, slot));
    if ("tokens" in input) device.queue.writeBuffer(p.tok[slot]!, 0, Uint32Array.of(input.tokens[b]!));
  }
  if (!("tokens" in input)) device.queue.writeBuffer(act.h!, 0, input.hidden, 0, n * nEmbd);
  // Each column's id to word 0 of its argmax's ring (row 0's argmax also serves solo runs' other words); a
  // sampled column's sampler starts its sequence's stream.
  for (const [b, a] of (argmax ?? []).entries()) {
    if (sampled(b)) startSampler(device.queue, a, sample![b]!);
    else device.queue.writeBuffer(a.params, 0, Uint32Array.of(0));
  }
  prof.lap("batch.writeBuffer");
  // A batched step's logits columns start 256-byte aligned; hidden columns are contiguous.
  const width = stage.last ? stage.hp.nVocab : nEmbd;
  const stride = stage.last ? padWords(width) : width;
  const newStaging = () => p.stagings.take(argmax ? Math.max(16, 4 * n) : n * stride * 4);
  const encode = (to: GPUBuffer) => {
    const enc = device.createCommandEncoder();
    const pass = enc.beginComputePass();
    encodeOps(pass, argmax ? [...g.ops, ...argmax.flatMap((a) => a.ops)] : g.ops);
    pass.end();
    if (argmax) argmax.forEach((a, b) => enc.copyBufferToBuffer(a.ring, 0, to, 4 * b, 4));
    else enc.copyBufferToBuffer(stage.last ? act.logits! : act.h!, 0, to, 0, n * stride * 4);
    return enc.finish();
  };
  // The step's command buffer and staging encoded ahead for these slots (as engine/exec/_stage_run.ts does).
  const selects = argmax ? slots.map((_, b) => sampled(b) ? "s" : "a").join("") : "";
  const key = `batch/${slots.join(",")}/${selects}`;
  const spare = p.spares?.get(key);
  if (spare) p.spares!.delete(key);
  const staging = spare?.staging ?? newStaging();
  let read: Promise<ArrayBuffer>;
  try {
    const cmd = spare?.cmd ?? encode(staging);
    prof.lap("batch.encode");
    device.queue.submit([cmd]);
    prof.lap("batch.submit");
    for (const slot of slots) p.length[slot]!++;
    // The bytes once the GPU is done (the call blocks until then); the staging goes back to the pool.
    read = p.stagings.read(staging);
    prof.lap("batch.mapAsyncCall");
  } catch (e) {
    p.stagings.give(staging);
    throw e;
  }
  if (p.spares) {
    setTimeout(() => {
      try {
        const t0 = performance.now();
        const st = newStaging();
        const next = { cmd: encode(st), staging: st };
        const old = p.spares!.get(key);
        if (old) p.stagings.give(old.staging);
        p.spares!.set(key, next);
        prof.add("batch.preEncode", performance.now() - t0);
      } catch {
        // The stage is gone (destroyed buffers): no spare.
      }
    }, 0);
  }
  const t = performance.now();
  const output = (async (): Promise<StageOutput> => {
    const bytes = await read;
    prof.add("batch.mapWait", performance.now() - t);
    const t1 = performance.now();
    p.gpuCheck();
    const kind = stage.last ? "logits" as const : "hidden" as const;
    if (argmax) {
      prof.add("batch.copyOut", performance.now() - t1);
      return { kind, data: new Float32Array(0), rows: n, ids: new Uint32Array(bytes, 0, n) };
    }
    const all = new Float32Array(bytes);
    const out = new Float32Array(n * width);
    for (let b = 0; b < n; b++) out.set(all.subarray(b * stride, b * stride + width), b * width);
    prof.add("batch.copyOut", performance.now() - t1);
    return { kind, data: out, rows: n };
  })();
  output.catch(() => {/* the caller awaits it */});
  return { output };
}
