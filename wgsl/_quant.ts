/**
 * Shared by the weight-reading twins (private): the WGSL libraries of the chunk interface
 * (`lib/quant.wgsl`) and the checks on a weight type, row length and row alignment.
 * @module
 */
import { type GgmlTypeName, TYPE_ID, typeInfo } from "../engine/quant/types.ts";
import { checkShape } from "./_twin.ts";

/** Every library `lib/quant.wgsl` dispatches to, in dependency-free order. */
export const QUANT_LIBS: readonly string[] = [
  "common",
  "f32",
  "f16",
  "bf16",
  "q8_0",
  "q4_0",
  "iq4_nl",
  "iq4_xs",
  "q4_k",
  "q5_k",
  "q6_k",
  "quant",
];

/** Types the chunk interface decodes (all supported GgmlTypeName values). */
export const QUANT_TYPES: readonly GgmlTypeName[] = Object.keys(TYPE_ID) as GgmlTypeName[];

/**
 * Throws unless a `type` row of `k` elements is whole chunks of 32 and whole blocks, and `wOffsetBytes` is
 * 4-byte aligned (lib/quant.wgsl reads rows from word boundaries or through funnel shifts within them).
 * @returns bytes per row
 */
export function checkWeightRows(kernel: string, type: GgmlTypeName, k: number, wOffsetBytes: number): number {
  const info = typeInfo(type);
  checkShape(
    Number.isInteger(k) && k >= 32 && k % 32 === 0 && k % info.blockElems === 0,
    `Kernel ${kernel}: K=${k} must be a positive multiple of 32 and of the ${type} block (${info.blockElems}): ` +
      `pad or split the row`,
  );
  checkShape(
    Number.isInteger(wOffsetBytes) && wOffsetBytes >= 0 && wOffsetBytes % 4 === 0,
    `Kernel ${kernel}: weight offset ${wOffsetBytes} bytes must be a non-negative multiple of 4`,
  );
  return (k / info.blockElems) * info.blockBytes;
}
