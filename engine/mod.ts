/**
 * The engine's public surface: GGUF access, quantized types, GPU device and kernels, models.
 * Other folders import the engine only through this module.
 *
 * @example
 * ```ts
 * import { acquireGpu } from "./engine/mod.ts";
 * const gpu = await acquireGpu();
 * console.log(gpu.summary);
 * ```
 * @module
 */
export { acquireGpu, type Gpu } from "./gpu/device.ts";
export {
  bindGroup,
  type Binding,
  buildSource,
  type ConstType,
  type ConstValues,
  type KernelSpec,
  PipelineCache,
  variantKey,
} from "../wgsl/kernel.ts";
export type { MoeMatvecTuning } from "../wgsl/moe_matvec.ts";
export { assert, GgufError, type GgufErrorCode, GpuError, NumericsError } from "./errors.ts";
export {
  GGML_TYPES,
  type GgmlTypeInfo,
  type GgmlTypeName,
  rowBytes,
  TYPE_ID,
  typeInfo,
} from "./quant/types.ts";
export {
  ARCH_KEYS,
  archKey,
  type ArchKeyId,
  KEYS,
  parseTensorName,
  type TensorId,
  tensorName,
  TENSORS,
} from "./names.ts";
export * from "./gguf.ts";
export {
  type GgufArrayInput,
  type GgufChunkSink,
  type GgufWriteSpec,
  type GgufWriteTensor,
  kv,
  writeGguf,
  writeGgufSplit,
} from "./gguf_write.ts";
export * from "./models/mod.ts";
export * from "./synth.ts";
export * from "./fingerprint.ts";
export * from "./inspect.ts";
export * from "./plan.ts";
export * from "./exec/stage.ts";
export { int8ExpertsOf } from "./exec/options.ts";
export { type PhaseTotal, printProfileOnSignal, RunProfile } from "./exec/_profile.ts";
export { ARGMAX_RING } from "./exec/_stage_run.ts";
export { DecodeDriver } from "./exec/decode.ts";
export { argmaxCpu, topCpu } from "./sampling.ts";
export type {
  BatchItem,
  Generated,
  GenerateOptions,
  GenerateResult,
  SlotDecoder,
} from "./exec/slot_decoder.ts";
export { MAX_BATCH_SLOTS, MAX_SLOTS } from "./exec/activations.ts";
export { MATVEC_MAX_COLS } from "./graph/builder.ts";
export { buildWidthClasses, prefillWidthClasses } from "./exec/_widths.ts";
export {
  type ChainClient,
  type ChainStageStatus,
  type NextBatchRun,
  type NextResult,
  type NextRun,
  type NextSampling,
  type NextStage,
  SplitDecoder,
  type SplitStage,
  type StageInfo,
  stageInfo,
  type StageInfoSource,
  StaleChainError,
} from "./exec/split.ts";
export {
  DEFAULT_MIN_DRAFT,
  DraftingDecoder,
  type DraftingOptions,
  type DraftingStage,
} from "./exec/drafting.ts";
export { DraftCache, lookupDrafts } from "./exec/draft_cache.ts";
export { encodeOps, type Op } from "./graph/builder.ts";
export { legacyRowOrder } from "./models/qwen3next.ts";
export { SlotStates, type StateBinding, type StatePool, type StateSpec } from "./state.ts";
export {
  type GpuTensor,
  type GpuTensorPart,
  PACK_ALIGN_BYTES,
  type UploadProgress,
  uploadTensors,
} from "./gpu/weights.ts";
export { type ReadbackCopy, ReadbackRing } from "./gpu/readback.ts";
export {
  checkSampling,
  GREEDY_SAMPLING,
  isGreedy,
  resolveTemperature,
  SAMPLING_DEFAULTS,
  type SamplingParams,
  samplingParams,
} from "./sampling.ts";
export * from "./text/mod.ts";
export {
  type CloseOptions,
  DEFAULT_BATCH_MIN,
  DEFAULT_MAX_CHUNK,
  DEFAULT_PIECE_GAP,
  DEFAULT_PIECE_STEPS,
  type Engine,
  type EngineOptions,
  EngineService,
  type EngineStatus,
  type FinishReason,
  type GenerateRequest as EngineGenerateRequest,
  type GenerateResult as EngineGenerateResult,
  QueueFullError,
  startEngine,
} from "./serve/service.ts";
