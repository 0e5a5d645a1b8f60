/**
 * The WGSL kernels and their host twins: each twin owns its kernel's constants, binding order, uniform
 * packing, dispatch grid and shape check, and records into a caller-owned compute pass.
 *
 * @example
 * ```ts
 * import { encodeMatvec, matvecParams, prepareMatvec } from "./wgsl/mod.ts";
 * ```
 * @module
 */
// The engine types the twins' signatures name, so that this surface documents completely.
export type { Binding, ConstType, ConstValues, KernelSpec, PipelineCache } from "../engine/gpu/kernel.ts";
export type { GgmlTypeName } from "../engine/quant/types.ts";
export {
  checkMatmul,
  encodeMatmul,
  MATMUL,
  MATMUL_PARAMS_BYTES,
  MATMUL_TILE,
  type MatmulBindings,
  type MatmulConstants,
  matmulConstants,
  matmulGrid,
  type MatmulOp,
  matmulParams,
  type MatmulShape,
  prepareMatmul,
} from "./matmul.ts";
export {
  checkMatvec,
  encodeMatvec,
  MATVEC,
  MATVEC_MAX_BATCH,
  MATVEC_PARAMS_BYTES,
  type MatvecBindings,
  type MatvecConstants,
  matvecConstants,
  matvecGrid,
  type MatvecOp,
  matvecParams,
  matvecRowsPerWorkgroup,
  type MatvecShape,
  prepareMatvec,
} from "./matvec.ts";
export {
  encodeStreamRead,
  prepareStreamRead,
  STREAM_READ,
  STREAM_READ_PARAMS_BYTES,
  STREAM_READ_WORKGROUPS,
  type StreamReadOp,
  streamReadParams,
  type StreamReadShape,
} from "./stream_read.ts";
