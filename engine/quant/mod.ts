/**
 * Quantized tensor types: block geometry, f16/bf16 conversion, the float64 reference decoder, reference
 * quantizers and fast random-block generators (spec `quants.md`).
 *
 * @example
 * ```ts
 * import { dequantize, quantize } from "./engine/quant/mod.ts";
 * const bytes = quantize("IQ4_XS", new Float32Array(256).fill(0.5));
 * const values = dequantize("IQ4_XS", bytes, 256); // Float64Array(256), each ≈ 0.5
 * ```
 * @module
 */
export { GGML_TYPES, type GgmlTypeInfo, type GgmlTypeName, rowBytes, TYPE_ID, typeInfo } from "./types.ts";
export { bf16ToF32, f16ToF32, f32ToBf16, f32ToF16 } from "./f16.ts";
export { checkSize, dequantize, dequantizeRow, KVALUES_IQ4NL, scaleMinK4 } from "./dequant.ts";
export { quantize } from "./quantize.ts";
export { fillRandomBlocks, randomBlocks, RandomState } from "./random.ts";
