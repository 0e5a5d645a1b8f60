/**
 * The ggml tensor data types: ids, block geometry and which ones this engine supports
 * (spec `gguf.md` §3, `quants.md`).
 * @module
 */

/** Names of the ggml types the engine decodes. */
export type GgmlTypeName =
  | "F32"
  | "F16"
  | "BF16"
  | "Q8_0"
  | "Q4_0"
  | "Q4_K"
  | "Q5_K"
  | "Q6_K"
  | "IQ4_NL"
  | "IQ4_XS";

/** Geometry of one ggml type: `blockElems` elements are stored in `blockBytes` bytes. */
export interface GgmlTypeInfo {
  /** ggml_type id as stored in a GGUF tensor info. */
  readonly id: number;
  /** ggml's name. */
  readonly name: string;
  /** Elements per block (1 for plain float types). */
  readonly blockElems: number;
  /** Bytes per block. */
  readonly blockBytes: number;
  /** True when the engine has a dequantizer and GPU kernels for it. */
  readonly supported: boolean;
}

/** Every ggml type id a GGUF may name (retired ids 4, 5, 31-33, 36-38 are absent on purpose). */
export const GGML_TYPES: ReadonlyMap<number, GgmlTypeInfo> = new Map(
  ([
    [0, "F32", 1, 4, true],
    [1, "F16", 1, 2, true],
    [2, "Q4_0", 32, 18, true],
    [3, "Q4_1", 32, 20, false],
    [6, "Q5_0", 32, 22, false],
    [7, "Q5_1", 32, 24, false],
    [8, "Q8_0", 32, 34, true],
    [9, "Q8_1", 32, 36, false],
    [10, "Q2_K", 256, 84, false],
    [11, "Q3_K", 256, 110, false],
    [12, "Q4_K", 256, 144, true],
    [13, "Q5_K", 256, 176, true],
    [14, "Q6_K", 256, 210, true],
    [15, "Q8_K", 256, 292, false],
    [16, "IQ2_XXS", 256, 66, false],
    [17, "IQ2_XS", 256, 74, false],
    [18, "IQ3_XXS", 256, 98, false],
    [19, "IQ1_S", 256, 50, false],
    [20, "IQ4_NL", 32, 18, true],
    [21, "IQ3_S", 256, 110, false],
    [22, "IQ2_S", 256, 82, false],
    [23, "IQ4_XS", 256, 136, true],
    [24, "I8", 1, 1, false],
    [25, "I16", 1, 2, false],
    [26, "I32", 1, 4, false],
    [27, "I64", 1, 8, false],
    [28, "F64", 1, 8, false],
    [29, "IQ1_M", 256, 56, false],
    [30, "BF16", 1, 2, true],
    [34, "TQ1_0", 256, 54, false],
    [35, "TQ2_0", 256, 66, false],
    [39, "MXFP4", 32, 17, false],
  ] as const).map(([id, name, blockElems, blockBytes, supported]) => [
    id,
    { id, name, blockElems, blockBytes, supported },
  ]),
);

/** ggml type id of each supported type name. */
export const TYPE_ID: Readonly<Record<GgmlTypeName, number>> = {
  F32: 0,
  F16: 1,
  BF16: 30,
  Q8_0: 8,
  Q4_0: 2,
  Q4_K: 12,
  Q5_K: 13,
  Q6_K: 14,
  IQ4_NL: 20,
  IQ4_XS: 23,
};

/** Geometry of a supported type by name. */
export function typeInfo(name: GgmlTypeName): GgmlTypeInfo {
  const info = GGML_TYPES.get(TYPE_ID[name]);
  if (!info) throw new Error(`Internal error: no ggml type table entry for ${name}`);
  return info;
}

/** Bytes of one row of `ne0` elements of type `name`; throws when `ne0` is not a whole number of blocks. */
export function rowBytes(name: GgmlTypeName, ne0: number): number {
  const t = typeInfo(name);
  if (ne0 % t.blockElems !== 0) {
    throw new RangeError(`Row of ${ne0} elements is not a whole number of ${name} blocks of ${t.blockElems}`);
  }
  return (ne0 / t.blockElems) * t.blockBytes;
}
