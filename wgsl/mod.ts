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
export type { Binding, ConstType, ConstValues, KernelSpec, PipelineCache } from "./kernel.ts";
export type { GgmlTypeName } from "../engine/quant/types.ts";
export {
  checkMatmul,
  encodeMatmul,
  MATMUL,
  MATMUL_PARAMS_BYTES,
  MATMUL_THREAD_TILES,
  MATMUL_WIDE_MIN_WORKGROUPS,
  type MatmulBindings,
  type MatmulConstants,
  matmulConstants,
  matmulGrid,
  type MatmulOp,
  matmulParams,
  matmulPlan,
  type MatmulShape,
  matmulWorkgroupBytes,
  prepareMatmul,
} from "./matmul.ts";
export {
  checkMoeGroup,
  MOE_GROUP,
  moeGroupCount,
  moeGroupGrid,
  moeGroupParams,
  type MoeGroupShape,
  moeGroupWords,
} from "./moe_group.ts";
export {
  checkGroupedMatmul,
  checkGroupedPass,
  encodeGroupedMatmul,
  GROUPED_MATMUL_MAX_GROUPS,
  GROUPED_MATMUL_PARAMS_BYTES,
  GROUPED_MATMUL_TILE_TOKENS,
  type GroupedMatmulBindings,
  type GroupedMatmulConstants,
  groupedMatmulConstants,
  groupedMatmulFits,
  groupedMatmulGrid,
  type GroupedMatmulOp,
  groupedMatmulParams,
  type GroupedMatmulShape,
  groupedMatmulWorkgroupBytes,
  MOE_MATMUL,
  prepareGroupedMatmul,
} from "./moe_matmul.ts";
export {
  checkGroupedMatvec,
  type GroupedMatvecConstants,
  groupedMatvecConstants,
  groupedMatvecGrid,
  groupedMatvecRows,
  groupedMatvecWorkgroupBytes,
  MOE_GMV,
  prepareGroupedMatvec,
} from "./moe_gmv.ts";
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
  checkMatvecQ8,
  checkQuantizeQ8,
  encodeQ8,
  MATVEC_Q8,
  MATVEC_Q8_PARAMS_BYTES,
  MATVEC_Q8_TYPES,
  type MatvecQ8Bindings,
  type MatvecQ8Constants,
  matvecQ8Constants,
  matvecQ8Grid,
  matvecQ8Params,
  type MatvecQ8Shape,
  prepareMatvecQ8,
  prepareQuantizeQ8,
  q8Layout,
  type Q8Op,
  q8xBytes,
  QUANTIZE_Q8,
  QUANTIZE_Q8_PARAMS_BYTES,
  type QuantizeQ8Bindings,
  quantizeQ8Params,
  type QuantizeQ8Shape,
} from "./matvec_q8.ts";
export {
  checkMatvecQ8b,
  MATVEC_Q8B,
  MATVEC_Q8B_MAX_BATCH,
  MATVEC_Q8B_PARAMS_BYTES,
  type MatvecQ8bBindings,
  type MatvecQ8bConstants,
  matvecQ8bConstants,
  matvecQ8bGrid,
  matvecQ8bParams,
  type MatvecQ8bShape,
  prepareMatvecQ8b,
} from "./matvec_q8b.ts";
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
