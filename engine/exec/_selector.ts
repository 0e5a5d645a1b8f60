/**
 * The selection of a sequence's next id inside a decode step: the argmax (or the GPU sampler) on the step's
 * logits row writing the id into the next step's token buffer and the id ring, then the top-k pairs when asked.
 * Built once per (slot, column, batch, top, sampling) by the decode driver and cached with its buffers.
 * @module
 */
import type { PipelineCache } from "../../wgsl/kernel.ts";
import type { Binding } from "../../wgsl/kernel.ts";
import { assert } from "../errors.ts";
import { type Op, padWords } from "../graph/builder.ts";
import { STORAGE } from "./activations.ts";
import { SAMPLE_HIST, sampleConstantsFor, sampleParamWords } from "../sampling.ts";
import type { GenerateOptions } from "./slot_decoder.ts";
import { packSampleState, SAMPLE, sampleBindGroups, sampleGrids, sampleVariants } from "../../wgsl/sample.ts";
import {
  ARGMAX,
  argmaxBindGroups,
  type ArgmaxConstants,
  argmaxGrids,
  argmaxVariants,
} from "../../wgsl/argmax.ts";
import {
  ARGMAX_TOPK,
  argmaxTopkBindGroups,
  type ArgmaxTopkConstants,
  argmaxTopkGrids,
  argmaxTopkVariants,
} from "../../wgsl/argmax_topk.ts";

/** What a selector is built with: the stage's device, pipelines, logits and sampler mask. */
export interface SelectorBuffers {
  readonly device: GPUDevice;
  readonly cache: PipelineCache;
  /** Receives the selector's buffers (destroyed with the stage). */
  readonly owned: GPUBuffer[];
  /** The logits rows (a last stage has them). */
  readonly logits: GPUBuffer | undefined;
  /** Sampler mask words (UNUSED token types and padding rows), when the file has token types. */
  readonly unusedMask: Uint32Array<ArrayBuffer> | undefined;
}

/** The selection of one sequence's next id (see {@linkcode buildSelector}) and the buffers it feeds. */
export interface Selector {
  /** Argmax or sampler on the step's logits row, then the top-k pairs when asked. */
  readonly stepOps: Op[];
  /** u32 ne=[batch]: the argmax's id of step j of a batch at word j. */
  readonly idRing: GPUBuffer;
  /** ArgmaxParams: the ring word of the current step (copied in at each step's start). */
  readonly argmaxParams: GPUBuffer;
  /** u32 ne=[2, top]: (value bits, id) pairs of the current step. */
  readonly topResult: GPUBuffer;
  /** u32 ne=[2, top, batch]: each step's pairs, copied out of `topResult` after its pass. */
  readonly topBatch: GPUBuffer;
  /** The selection dispatches alone (argmax or sampler) on logits row 0: the first id after a prefill. */
  readonly firstOps: readonly Op[];
  /** Sampler params (word 0: ring slot, like ArgmaxParams) and state (RNG step, penalty history), if sampling. */
  readonly sampler?: { readonly params: GPUBuffer; readonly state: GPUBuffer };
}

/**
 * The selection of one sequence's next id: argmax or the sampler on logits row `row` (the row's id goes to
 * word 0 of `nextToken` and to the id ring), then the top-k pairs when `top` > 0. Its buffers are its own.
 */
export async function buildSelector(
  sb: SelectorBuffers,
  nVocab: number,
  o: { row: number; nextToken: GPUBuffer; S: number; top: number; sampling: boolean },
): Promise<Selector> {
  const { device } = sb;
  const { S, top, sampling } = o;
  const V = nVocab;
  const logitsBuf = sb.logits;
  assert(logitsBuf, "generation runs on a last stage, which has logits");
  const buf = (label: string, bytes: number) => {
    const b = device.createBuffer({ label, size: Math.max(16, bytes), usage: STORAGE });
    sb.owned.push(b);
    return b;
  };
  const idRing = buf("id_ring", 4 * S);
  const logitsRow = (row: number) => ({
    buffer: logitsBuf,
    offset: 4 * row * padWords(V),
    size: 4 * V,
  });
  const logits = logitsRow(o.row);
  let argmaxParams: GPUBuffer;
  let sampler: Selector["sampler"];
  // The selection on `logits` (a second set for row 0 when the step's row is another).
  let select: (logits: Binding) => Op[];
  if (sampling) {
    // The sampler's params start with the ring slot like ArgmaxParams, so the per-step copy is the same.
    const sc = sampleConstantsFor(V);
    const sv = sampleVariants(sc);
    const sp = {
      partial: await sb.cache.get(SAMPLE, sv.partial),
      final: await sb.cache.get(SAMPLE, sv.final),
    };
    const mask = buf("sample_mask", 4 * Math.ceil(V / 32));
    if (sb.unusedMask) device.queue.writeBuffer(mask, 0, sb.unusedMask);
    const s = {
      params: buf("sample_params", 48),
      state: buf("sample_state", 4 * packSampleState(sc.HIST).length),
    };
    sampler = s;
    argmaxParams = s.params;
    const pairs = buf("sample_pairs", 8 * (sc.K + 1) * sc.N_BLOCK);
    const result = buf("sample_result", 8 * (sc.K + 1));
    const sg = sampleGrids(sc);
    select = (logits) => {
      const sb = sampleBindGroups(device, {
        pipelines: sp,
        constants: sc,
        buffers: {
          logits,
          pairs,
          result,
          params: s.params,
          mask,
          state: s.state,
          nextToken: o.nextToken,
          ring: idRing,
        },
      });
      return [
        { label: "sample.partial", pipeline: sp.partial, bindGroup: sb.partial, grid: sg.partial },
        { label: "sample.final", pipeline: sp.final, bindGroup: sb.final, grid: sg.final },
      ];
    };
  } else {
    const params = buf("argmax_params", 16);
    argmaxParams = params;
    const ac: ArgmaxConstants = {
      N_VOCAB: V,
      N_BLOCK: Math.min(256, Math.ceil(V / 1024)),
      WG: 256,
      WRITE_IDS: true,
    };
    const av = argmaxVariants(ac);
    const ap = {
      partial: await sb.cache.get(ARGMAX, av.partial),
      final: await sb.cache.get(ARGMAX, av.final),
    };
    const pairs = buf("argmax_pairs", 8 * ac.N_BLOCK);
    const result = buf("argmax_result", 8);
    const ag = argmaxGrids(ac);
    select = (logits) => {
      const ab = argmaxBindGroups(device, {
        pipelines: ap,
        constants: ac,
        buffers: { logits, pairs, result, params, nextToken: o.nextToken, ring: idRing },
      });
      return [
        { label: "argmax.partial", pipeline: ap.partial, bindGroup: ab.partial, grid: ag.partial },
        { label: "argmax.final", pipeline: ap.final, bindGroup: ab.final, grid: ag.final },
      ];
    };
  }
  const stepOps = select(logits);
  const firstOps = o.row === 0 ? stepOps : select(logitsRow(0));
  const topResult = buf("top_result", 8 * Math.max(1, top));
  const topBatch = buf("top_batch", 8 * Math.max(1, top) * S);
  if (top > 0) {
    const tc: ArgmaxTopkConstants = {
      N_VOCAB: V,
      K: top,
      N_BLOCK: Math.min(64, Math.max(1, Math.ceil(V / 4096))),
      WG: 256,
      BUF: 2048,
    };
    const tv = argmaxTopkVariants(tc);
    const tp = {
      partial: await sb.cache.get(ARGMAX_TOPK, tv.partial),
      final: await sb.cache.get(ARGMAX_TOPK, tv.final),
    };
    const tb = argmaxTopkBindGroups(device, {
      pipelines: tp,
      constants: tc,
      buffers: { logits, pairs: buf("top_pairs", 8 * top * tc.N_BLOCK), result: topResult },
    });
    const tg = argmaxTopkGrids(tc);
    stepOps.push({ label: "topk.partial", pipeline: tp.partial, bindGroup: tb.partial, grid: tg.partial });
    stepOps.push({ label: "topk.final", pipeline: tp.final, bindGroup: tb.final, grid: tg.final });
  }
  return { stepOps, firstOps: firstOps.slice(0, 2), idRing, argmaxParams, topResult, topBatch, sampler };
}

/**
 * Writes a sequence's sampler settings, RNG step and penalty history into `s` (before its next draw): the
 * request's `sampling`, `samplerStep` (default 0) and `samplerHistory` (default: the prompt).
 */
export function samplerStart(
  b: { readonly device: GPUDevice; readonly unusedMask: Uint32Array | undefined },
  s: NonNullable<Selector["sampler"]>,
  o: Pick<GenerateOptions, "sampling" | "samplerStep" | "samplerHistory">,
  prompt: readonly number[],
): void {
  b.device.queue.writeBuffer(s.params, 0, sampleParamWords(o.sampling!, { maskUnused: !!b.unusedMask }));
  const history = (o.samplerHistory ?? prompt).slice(-SAMPLE_HIST);
  b.device.queue.writeBuffer(s.state, 0, packSampleState(SAMPLE_HIST, { step: o.samplerStep ?? 0, history }));
}
