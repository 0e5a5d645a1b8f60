/**
 * Twin of `moe_matvec_q8.wgsl`: moe_matvec's expert mat-vecs (experts from a GPU id buffer, the shared expert
 * as extra columns) with int8 x and integer dot products, as matvec_q8. With XIN the x is f32 and every
 * workgroup rounds its column itself (the engine's down pass); with QOUT the gate·up pass also writes its
 * output rounded to int8, the down pass's x. Params are moe_matvec's words (`moeMatvecParams`).
 *
 * Numerics: as matvec_q8's. The products are those of the dequantized weights with the dequantized int8 x,
 * up to f32 rounding. A float64 reference takes the x that quantize_q8 (or QOUT, or the XIN log) produced.
 * @module
 */
import type { Binding, KernelSpec } from "./kernel.ts";
import { type GgmlTypeName, rowBytes, TYPE_ID } from "../engine/quant/types.ts";
import { checkBinding, checkInt, checkShape } from "./_twin.ts";
import { checkMoeMatvec, type MoeMatvecShape, type MoeMatvecTuning } from "./moe_matvec.ts";
import { MATVEC_Q8_TYPES, q8Layout, typeList } from "./matvec_q8.ts";

/** Kernel description of `moe_matvec_q8.wgsl`. */
export const MOE_MATVEC_Q8: KernelSpec = {
  name: "moe_matvec_q8",
  url: new URL("./moe_matvec_q8.wgsl", import.meta.url),
  lib: ["common", "iq4_xs", "q4_k", "q8chunk", "q8pack"],
  constants: {
    TYPE: "u32",
    TEAM: "u32",
    ROWS: "u32",
    OUT_LAYOUT: "u32",
    GATE_UP: "bool",
    QOUT: "bool",
    XIN: "bool",
    KC: "u32",
  },
};

/** Constants of one variant. */
export type MoeMatvecQ8Constants = {
  readonly TYPE: number;
  readonly TEAM: number;
  readonly ROWS: number;
  /** QOUT's byte order: `q8Layout` of the down weights' type (0 without QOUT). */
  readonly OUT_LAYOUT: number;
  readonly GATE_UP: boolean;
  /** Also write y rounded to int8 per 32 rows into `yq`. */
  readonly QOUT: boolean;
  /** x is f32, rounded to int8 in every workgroup's prologue (`xq` holds f32 bits; `yq` gets the int8 x). */
  readonly XIN: boolean;
  /** XIN: K / 32 (the chunks held in workgroup memory); 1 otherwise. */
  readonly KC: number;
};

/** Binding order of `moe_matvec_q8.wgsl`. */
export const MOE_MATVEC_Q8_BINDINGS = ["params", "ids", "weights", "weights2", "xq", "y", "yq"] as const;

/**
 * Buffers of one dispatch by binding name; `weights2` is `weights` again. Without QOUT, `yq` may be any
 * buffer not bound elsewhere in the dispatch.
 */
export type MoeMatvecQ8Bindings = Readonly<Record<(typeof MOE_MATVEC_Q8_BINDINGS)[number], Binding>>;

/** Words of one int8 x column of K elements (K/4 quad words and K/32 scales: quantize_q8's format). */
export function q8ColumnWords(k: number): number {
  return (9 * k) / 32;
}

/**
 * Default constants, from the H200 sweep (bench/moe.ts, docs/PERF.md; decode shapes): TEAM the largest power
 * of two ≤ min(16, K/128), ROWS 1 (gate·up [2048 → 2×512] at T16 R1: 10.8 µs with int8 x read, 13.7 with XIN;
 * down [512 → 2048] at T4 R1: 10.7 and 12.8), or 2 at TEAM 16 with QOUT (whole 32-row chunks per workgroup).
 * `outType`: the down weights' type when the gate·up pass should write their int8 x (QOUT); `tuning`
 * overrides TEAM and ROWS and asks for XIN.
 */
export function moeMatvecQ8Constants(
  shape: MoeMatvecShape,
  outType?: GgmlTypeName,
  tuning?: Partial<MoeMatvecTuning> & { xin?: boolean },
): MoeMatvecQ8Constants {
  let team = 1;
  while (team * 2 <= Math.min(16, shape.k / 128)) team *= 2;
  const qout = outType !== undefined;
  return {
    TYPE: TYPE_ID[shape.type],
    TEAM: tuning?.team ?? team,
    ROWS: tuning?.rows ?? (qout && team === 16 ? 2 : 1),
    OUT_LAYOUT: qout ? q8Layout(outType) : 0,
    GATE_UP: shape.gateUp,
    QOUT: qout,
    XIN: tuning?.xin ?? false,
    KC: tuning?.xin ? shape.k / 32 : 1,
  };
}

/**
 * Whether moe_matvec_q8 takes this expert pass: Q8_0, Q4_K, Q5_K, Q6_K or IQ4_XS weights, K a multiple of 128, and matrix
 * offsets the kernel's word-pair loads allow (8 bytes for IQ4_XS, 4 for Q8_0).
 */
export function moeMatvecQ8Fits(shape: MoeMatvecShape): boolean {
  const align = shape.type === "IQ4_XS" ? 8 : 4;
  return MATVEC_Q8_TYPES.includes(shape.type) && shape.k % 128 === 0 && shape.offGateBytes % align === 0 &&
    (shape.offUpBytes ?? 0) % align === 0;
}

/** Dispatch grid: row blocks × columns (routed and shared). */
export function moeMatvecQ8Grid(shape: MoeMatvecShape, c: MoeMatvecQ8Constants): [number, number, number] {
  return [Math.ceil(shape.n / ((256 / c.TEAM) * c.ROWS)), shape.nCols + (shape.sharedCols ?? 0), 1];
}

/**
 * Throws before encoding when shape, constants and bindings do not fit (moe_matvec's checks, then the int8
 * ones).
 * @throws {RangeError} naming the kernel, the value and what to change
 */
export function checkMoeMatvecQ8(
  shape: MoeMatvecShape,
  c: MoeMatvecQ8Constants,
  b: MoeMatvecQ8Bindings,
): void {
  checkShape(
    MATVEC_Q8_TYPES.includes(shape.type),
    `Kernel moe_matvec_q8: int8-x expert mat-vecs read ${typeList(MATVEC_Q8_TYPES)} weights, not ` +
      `${shape.type}: use moe_matvec`,
  );
  // moe_matvec's checks of the constants, the shape and the shared bindings (x and y below: x is int8).
  checkMoeMatvec(
    shape,
    {
      TYPE: c.TYPE,
      WG: 256,
      TEAM: c.TEAM,
      ROWS: c.ROWS,
      BLOCKS: 1,
      UNROLL: 2,
      SHARED_T: 0,
      GATE_UP: c.GATE_UP,
      ROUTE: false,
      N_EXPERT: 4,
      N_EXPERT_USED: 1,
      W_SCALE: 1,
    },
    {
      params: b.params,
      ids: b.ids,
      weights: b.weights,
      x: b.y,
      y: b.y,
      logits: b.y,
      routeWeights: b.y,
    },
    { kernel: "moe_matvec_q8", skipXY: true },
  );
  checkShape(
    shape.k % 128 === 0,
    `Kernel moe_matvec_q8: K=${shape.k} must be a multiple of 128 (int8 x columns start on 16 bytes): use ` +
      `moe_matvec`,
  );
  const align = shape.type === "IQ4_XS" ? 8 : 4;
  for (const [what, off] of [["offGateBytes", shape.offGateBytes], ["offUpBytes", shape.offUpBytes ?? 0]]) {
    checkShape(
      (off as number) % align === 0,
      `Kernel moe_matvec_q8: ${what}=${off} must be a multiple of ${align} for ${shape.type}`,
    );
  }
  checkShape(
    shape.type !== "IQ4_XS" || rowBytes(shape.type, shape.k) % 8 === 0,
    `Kernel moe_matvec_q8: IQ4_XS rows of K=${shape.k} are not 8-byte aligned`,
  );
  const wgRows = (256 / c.TEAM) * c.ROWS;
  if (c.QOUT) {
    checkShape(
      wgRows % 32 === 0 && shape.n % 32 === 0,
      `Kernel moe_matvec_q8: QOUT rounds whole 32-row chunks: needs (256/TEAM)·ROWS = ${wgRows} and ` +
        `N = ${shape.n} multiples of 32`,
    );
    checkInt("Kernel moe_matvec_q8: OUT_LAYOUT", c.OUT_LAYOUT, 0, 1);
  }
  if (c.XIN) {
    checkShape(!c.QOUT, `Kernel moe_matvec_q8: XIN and QOUT both write yq: use one`);
    checkShape(
      c.KC === shape.k / 32,
      `Kernel moe_matvec_q8: XIN needs KC = K/32 = ${shape.k / 32}, got ${c.KC}`,
    );
  }
  const shared = shape.sharedCols ?? 0;
  const cols = shape.nCols + shared;
  const xCols = shape.gateUp ? shape.nCols / shape.xDiv : cols;
  if (c.XIN) {
    checkBinding("moe_matvec_q8", "xq (f32 x with XIN)", b.xq, [shape.k, xCols]);
    checkBinding("moe_matvec_q8", "yq (the int8 x with XIN)", b.yq, [q8ColumnWords(shape.k), xCols]);
  } else {
    checkBinding("moe_matvec_q8", "xq", b.xq, [q8ColumnWords(shape.k), xCols]);
  }
  checkBinding("moe_matvec_q8", "y", b.y, [shape.n, cols]);
  if (c.QOUT) checkBinding("moe_matvec_q8", "yq", b.yq, [q8ColumnWords(shape.n), cols]);
}
