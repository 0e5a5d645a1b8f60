/**
 * Twin of `get_rows.wgsl`: dequantizes the rows named by a GPU id buffer (the token embedding lookup, whose
 * ids may be written by the previous step's sampler on the GPU).
 * @module
 */
import { type Binding, type KernelSpec } from "./kernel.ts";
import { type GgmlTypeName, TYPE_ID } from "../engine/quant/types.ts";
import { checkBinding, checkInt, MAX_WORKGROUPS_PER_DIM } from "./_twin.ts";
import { checkWeightRows, QUANT_LIBS } from "./_quant.ts";

/** Kernel description of `get_rows.wgsl`. */
export const GET_ROWS: KernelSpec = {
  name: "get_rows",
  url: new URL("./get_rows.wgsl", import.meta.url),
  lib: QUANT_LIBS,
  constants: { TYPE: "u32", ID_OFF: "u32" },
};

/** Constants of one variant: weight type id and the word offset of token 0's id. */
export type GetRowsConstants = { readonly TYPE: number; readonly ID_OFF: number };

/** Binding order of `get_rows.wgsl`. */
export const GET_ROWS_BINDINGS = ["params", "ids", "weights", "y"] as const;

/** Buffers of one dispatch by binding name. */
export type GetRowsBindings = Readonly<Record<(typeof GET_ROWS_BINDINGS)[number], Binding>>;

/** One lookup: W ne=[k, n] of `type`, `nTokens` ids. */
export interface GetRowsShape {
  /** Weight type. */
  readonly type: GgmlTypeName;
  /** Row length (a multiple of 32 and of the block). */
  readonly k: number;
  /** Rows of W (the vocabulary). */
  readonly n: number;
  /** Ids to look up. */
  readonly nTokens: number;
}

/** The params words of `shape` (a storage buffer of 4 u32). */
export function getRowsParams(shape: GetRowsShape): Uint32Array<ArrayBuffer> {
  const rowBytes = checkWeightRows("get_rows", shape.type, shape.k, 0);
  return new Uint32Array([shape.k, shape.n, rowBytes, shape.nTokens]);
}

/** Default constants for `shape` with ids starting at word `idOffset`. */
export function getRowsConstants(shape: GetRowsShape, idOffset = 0): GetRowsConstants {
  return { TYPE: TYPE_ID[shape.type], ID_OFF: idOffset };
}

/**
 * Throws before encoding when the shape and bindings do not fit.
 * @throws {RangeError} naming the binding and the bytes it needs
 */
export function checkGetRows(shape: GetRowsShape, c: GetRowsConstants, b: GetRowsBindings): void {
  const rowBytes = checkWeightRows("get_rows", shape.type, shape.k, 0);
  checkInt("Kernel get_rows: nTokens", shape.nTokens, 1, MAX_WORKGROUPS_PER_DIM);
  checkInt("Kernel get_rows: n", shape.n, 1, 2 ** 31);
  checkBinding("get_rows", "params", b.params, [4]);
  checkBinding("get_rows", "ids", b.ids, [c.ID_OFF + shape.nTokens]);
  checkBinding("get_rows", "weights", b.weights, [Math.ceil((shape.n * rowBytes) / 4)]);
  checkBinding("get_rows", "y", b.y, [shape.k, shape.nTokens]);
}

/** Dispatch grid: one workgroup per token. */
export function getRowsGrid(shape: GetRowsShape): [number, number, number] {
  return [shape.nTokens, 1, 1];
}
