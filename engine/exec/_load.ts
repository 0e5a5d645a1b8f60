/**
 * What `Stage.load` checks before it touches the GPU (ranges of the options, the device's binding limits,
 * the training context) and the error scopes every allocation of a load runs under, so that an out-of-memory
 * or validation error fails the load with the numbers instead of leaving invalid buffers that compute zeros;
 * and the reader of the int8 rounding log a stage loaded with `int8Log` keeps.
 * @module
 */
import type { Hparams } from "../models/_arch.ts";
import type { GpuTensor } from "../gpu/weights.ts";
import { GpuError } from "../errors.ts";
import { checkStageFits, stateSpecs } from "./activations.ts";
import {
  COMBINE_NORM_MIN_ROWS,
  GROUPED_MATVEC_MAX_TOKENS_PER_EXPERT,
  GROUPED_MIN_TOKENS_PER_EXPERT,
  int8ExpertsOf,
  type Int8Logged,
  type StageInput,
  type StageOptions,
} from "./options.ts";
import { type Int8LogEntry, NORM_PROLOGUE_MAX_ROWS } from "../graph/builder.ts";
import { decodeQ8x, q8xBytes } from "../../wgsl/matvec_q8.ts";
import { gdnCompactSolve } from "../../wgsl/gdn_chunk.ts";

/** The norm fusion and expert grouping limits and int8 x of a stage's graphs, defaults applied (StageOptions). */
export interface GraphSettings {
  readonly normPrologueMaxRows: number;
  readonly combineNormMinRows: number;
  /** StageOptions.gdnBatchedSplit (undefined: the solo step's SPLIT). */
  readonly gdnBatchedSplit?: number;
  /** StageOptions.routerTakesNorm (default true). */
  readonly routerTakesNorm: boolean;
  /** StageOptions.gdnCompactSolve, by default whether the adapter is a CPU one (gdnCompactSolve). */
  readonly gdnCompactSolve: boolean;
  readonly groupedMinTokensPerExpert: number;
  readonly groupedMatvecMaxTokensPerExpert: number;
  readonly int8Activations: boolean;
  /** StageOptions.int8Experts, or int8Activations (which rounds the experts' x too). */
  readonly int8Experts: boolean;
}

/**
 * The load's layer range, chunk and graph settings, checked; warns (through `opts.onLog`) when the context
 * exceeds the model's training context.
 * @throws {RangeError} on an option out of range or a buffer the device cannot bind (see checkStageFits)
 */
export function checkLoadOptions(
  hp: Hparams,
  path: string,
  opts: StageOptions,
  device: {
    readonly limits: Pick<GPUSupportedLimits, "maxStorageBufferBindingSize" | "maxBufferSize">;
    readonly adapterInfo?: Pick<GPUAdapterInfo, "isFallbackAdapter">;
  },
): { layers: readonly [number, number]; maxChunk: number; graphSettings: GraphSettings } {
  const [a, b] = opts.layers ?? [0, hp.nLayer];
  if (!Number.isInteger(a) || !Number.isInteger(b) || a < 0 || b > hp.nLayer || a >= b) {
    throw new RangeError(
      `Layer range ${a}:${b} is not within 0:${hp.nLayer} of ${path} (a < b required): pass --layers a:b`,
    );
  }
  if (!Number.isInteger(opts.nCtx) || opts.nCtx < 1 || opts.nCtx > 2 ** 24) {
    throw new RangeError(`Context of ${opts.nCtx} positions is out of range 1..${2 ** 24}`);
  }
  const maxChunk = opts.maxChunk ?? 64;
  if (!Number.isInteger(maxChunk) || maxChunk < 1 || maxChunk > 4096) {
    throw new RangeError(`Chunk size ${maxChunk} is out of range 1..4096`);
  }
  const npr = opts.normPrologueMaxRows;
  if (npr !== undefined && !(Number.isInteger(npr) && npr >= 0)) {
    throw new RangeError(`normPrologueMaxRows must be an integer ≥ 0 (0: never fuse), got ${npr}`);
  }
  const cnr = opts.combineNormMinRows;
  if (cnr !== undefined && !(Number.isInteger(cnr) && cnr >= 2)) {
    throw new RangeError(`combineNormMinRows must be an integer ≥ 2, got ${cnr}`);
  }
  const gs = opts.gdnBatchedSplit;
  const dV = hp.ssmDtRank > 0 ? hp.ssmInner / hp.ssmDtRank : 0;
  if (gs !== undefined && !([2, 4, 8].includes(gs) && dV % (16 * gs) === 0)) {
    throw new RangeError(
      `gdnBatchedSplit must be 2, 4 or 8 and divide the DeltaNet head dim ${dV} / 16, got ${gs}`,
    );
  }
  const gmt = opts.groupedMinTokensPerExpert;
  if (gmt !== undefined && !(Number.isFinite(gmt) && gmt >= 0)) {
    throw new RangeError(`groupedMinTokensPerExpert must be a number ≥ 0, got ${gmt}`);
  }
  const gmv = opts.groupedMatvecMaxTokensPerExpert;
  if (gmv !== undefined && !(Number.isFinite(gmv) && gmv >= 0)) {
    throw new RangeError(`groupedMatvecMaxTokensPerExpert must be a number ≥ 0, got ${gmv}`);
  }
  const kvF16 = opts.kvF16 ?? false;
  checkStageFits(
    hp,
    { layers: [a, b], nCtx: opts.nCtx, nSlots: opts.nSlots, maxChunk, kvF16 },
    device.limits,
  );
  if (opts.nCtx > hp.nCtxTrain) {
    (opts.onLog ?? ((line: string) => console.error(line)))(
      `Warning: --ctx ${opts.nCtx} exceeds the model's training context of ${hp.nCtxTrain} positions: ` +
        `output past position ${hp.nCtxTrain} is outside what the model was trained on`,
    );
  }
  const graphSettings = {
    normPrologueMaxRows: npr ?? NORM_PROLOGUE_MAX_ROWS,
    combineNormMinRows: cnr ?? COMBINE_NORM_MIN_ROWS,
    gdnBatchedSplit: gs,
    routerTakesNorm: opts.routerTakesNorm ?? true,
    gdnCompactSolve: opts.gdnCompactSolve ?? gdnCompactSolve(device.adapterInfo),
    groupedMinTokensPerExpert: gmt ?? GROUPED_MIN_TOKENS_PER_EXPERT,
    groupedMatvecMaxTokensPerExpert: gmv ?? GROUPED_MATVEC_MAX_TOKENS_PER_EXPERT,
    int8Activations: opts.int8Activations ?? false,
    int8Experts: int8ExpertsOf(opts),
  };
  return { layers: [a, b], maxChunk, graphSettings };
}

/**
 * Runs `load` (which allocates and uploads) under out-of-memory and validation error scopes; on an error,
 * destroys what it made and throws a GpuError with the planned state bytes.
 * @throws {GpuError} when the GPU ran out of memory or refused an allocation during the load
 */
export async function underLoadScopes<T extends { destroy(): void }>(
  device: GPUDevice,
  plan: { hp: Hparams; layers: readonly [number, number]; nCtx: number; nSlots: number; kvF16: boolean },
  load: () => Promise<T>,
): Promise<T> {
  device.pushErrorScope("out-of-memory");
  device.pushErrorScope("validation");
  let made: T | undefined;
  let failure: unknown;
  try {
    made = await load();
  } catch (e) {
    failure = e;
  }
  const invalid = await device.popErrorScope();
  const oom = await device.popErrorScope();
  if (invalid || oom) {
    made?.destroy();
    const [a, b] = plan.layers;
    const states = stateSpecs(plan.hp, plan.layers, plan.nCtx, plan.kvF16).reduce((s, x) =>
      s + x.sizeBytes, 0) *
      plan.nSlots;
    const gib = (n: number) => `${(n / 2 ** 30).toFixed(2)} GiB`;
    throw oom
      ? new GpuError(
        `The GPU ran out of memory loading layers ${a}:${b} (KV cache and state for ${plan.nSlots} slot(s) of ` +
          `${plan.nCtx} positions: ${
            gib(states)
          }, plus the weights): lower --ctx or --slots, or split the model ` +
          `across machines (--layers). GPU: ${oom.message}`,
      )
      : new GpuError(`The GPU refused the load of layers ${a}:${b}: ${invalid!.message}`);
  }
  if (failure !== undefined) throw failure;
  return made!;
}

/** The logged int8 roundings `entries` of one graph, read back from the log buffer (StageOptions.int8Log). */
export async function readInt8Log(
  device: GPUDevice,
  buffer: GPUBuffer,
  entries: readonly Int8LogEntry[],
): Promise<Int8Logged[]> {
  const end = entries.reduce((m, e) => Math.max(m, e.offset + q8xBytes(e.k)), 16);
  const size = Math.ceil(end / 4) * 4;
  const staging = device.createBuffer({ size, usage: GPUBufferUsage.MAP_READ | GPUBufferUsage.COPY_DST });
  const enc = device.createCommandEncoder();
  enc.copyBufferToBuffer(buffer, 0, staging, 0, size);
  device.queue.submit([enc.finish()]);
  await staging.mapAsync(GPUMapMode.READ);
  const bytes = new Uint8Array(staging.getMappedRange().slice(0));
  staging.unmap();
  staging.destroy();
  return entries.map((e) => ({
    label: e.label,
    col: e.col,
    ...decodeQ8x(e.type, e.k, bytes.subarray(e.offset, e.offset + q8xBytes(e.k))),
  }));
}

/**
 * Throws unless `input` (nTokens rows) can run on `slot`, which holds `held` tokens, from position `base`
 * of a stage with these layers and context: a clear message naming what is wrong and what to do.
 * @throws {RangeError} on an empty input, a gap or overlap with the slot's tokens, a sequence past the
 *   context, token ids on a later stage (or hidden rows on the first), ids outside the vocabulary, or hidden
 *   rows of the wrong size
 */
export function checkStageInput(
  stage: {
    readonly hp: Hparams;
    readonly layers: readonly [number, number];
    readonly first: boolean;
    readonly nCtx: number;
  },
  r: { slot: number; held: number; input: StageInput; base: number; nTokens: number },
): void {
  const { slot, held, input, base, nTokens } = r;
  const hp = stage.hp;
  if (nTokens < 1) throw new RangeError("Input has no tokens: give at least one");
  if (base !== 0 && base !== held) {
    throw new RangeError(
      `Slot ${slot} holds ${held} tokens but the run continues at position ${base}: ` +
        `start at 0, continue at ${held}, or restore a snapshot of length ${base} first`,
    );
  }
  if (base + nTokens > stage.nCtx) {
    throw new RangeError(
      `Sequence of ${
        base + nTokens
      } tokens does not fit the context of ${stage.nCtx}: raise --ctx or shorten it`,
    );
  }
  const range = stage.layers.join(":");
  if ("tokens" in input) {
    if (!stage.first) throw new RangeError(`Layers ${range} take hidden rows, not token ids`);
    for (const t of input.tokens) {
      if (!Number.isInteger(t) || t < 0 || t >= hp.nVocab) {
        throw new RangeError(`Token id ${t} is outside the vocabulary 0..${hp.nVocab - 1}`);
      }
    }
  } else {
    if (stage.first) throw new RangeError(`Layers ${range} start at 0 and take token ids`);
    if (input.hidden.length !== nTokens * hp.nEmbd) {
      throw new RangeError(
        `Hidden input has ${input.hidden.length} values but ${nTokens} rows of ${hp.nEmbd} need ` +
          `${nTokens * hp.nEmbd}`,
      );
    }
  }
}

/** The stage's results are void after a GPU error: what to do about it. */
export function stageVoidError(error: string): GpuError {
  return new GpuError(
    `The GPU reported an error, so this stage's results are void: ${error}. Restart the server; ` +
      `if it recurs, lower --ctx, --slots or --chunk, or report it with this message`,
  );
}

/** Vocabulary-wide rows the logits buffer holds (activations.ts LOGITS_ROWS, or a batched step's columns). */
export function logitsRows(logits: GPUBuffer, hp: Pick<Hparams, "nVocab">): number {
  return Math.floor(logits.size / 4 / hp.nVocab);
}

/** Bytes of the GPU buffers holding `weights` (a buffer several tensors share counted once). */
export function weightBytes(weights: ReadonlyMap<string, GpuTensor>): number {
  const seen = new Set<GPUBuffer>();
  for (const t of weights.values()) for (const p of t.parts) seen.add(p.buffer);
  return [...seen].reduce((s, b) => s + b.size, 0);
}
