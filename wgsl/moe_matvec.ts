/**
 * Twin of `moe_matvec.wgsl`: expert mat-vecs whose expert comes from a GPU id buffer (routed experts), and
 * the shared expert through the same kernel with zero ids. Gate and up must share one weight binding.
 * @module
 */
import type { Binding, KernelSpec } from "./kernel.ts";
import { type GgmlTypeName, TYPE_ID } from "../engine/quant/types.ts";
import { checkBinding, checkInt, checkShape, isPow2, MAX_WORKGROUPS_PER_DIM } from "./_twin.ts";
import { checkWeightRows, QUANT_LIBS } from "./_quant.ts";

/** Kernel description of `moe_matvec.wgsl`. */
export const MOE_MATVEC: KernelSpec = {
  name: "moe_matvec",
  url: new URL("./moe_matvec.wgsl", import.meta.url),
  lib: [...QUANT_LIBS, "rows", "moe_cols", "route"],
  constants: {
    TYPE: "u32",
    WG: "u32",
    TEAM: "u32",
    ROWS: "u32",
    BLOCKS: "u32",
    UNROLL: "u32",
    SHARED_T: "u32",
    GATE_UP: "bool",
    ROUTE: "bool",
    N_EXPERT: "u32",
    N_EXPERT_USED: "u32",
    W_SCALE: "f32",
  },
};

/** Constants of one variant. */
export type MoeMatvecConstants = {
  readonly TYPE: number;
  /** Workgroup size: a power of two, 32..256, at least TEAM. */
  readonly WG: number;
  readonly TEAM: number;
  readonly ROWS: number;
  /** Row blocks of (WG / TEAM)·ROWS rows per workgroup, walked one after the other (1: one block). */
  readonly BLOCKS: number;
  /** Units per loop step of an invocation, their loads in flight together: 2 or 4. */
  readonly UNROLL: number;
  /**
   * 0, or the shared columns (at most 8), all run by one workgroup column that decodes each weight unit once
   * for every token (the same sum order, not the same bits: see {@linkcode moeMatvecSameBits}).
   */
  readonly SHARED_T: number;
  readonly GATE_UP: boolean;
  /** The routing runs in the prologue (gate·up of routed columns): ids and route weights are outputs. */
  readonly ROUTE: boolean;
  /** Routing: experts in the router (placeholder 4 without ROUTE). */
  readonly N_EXPERT: number;
  /** Routing: experts used per token (placeholder 1 without ROUTE). */
  readonly N_EXPERT_USED: number;
  /** Routing: the weights' scale (1 without ROUTE). */
  readonly W_SCALE: number;
};

/** Binding order of `moe_matvec.wgsl`. */
export const MOE_MATVEC_BINDINGS = ["params", "ids", "weights", "x", "y", "logits", "routeWeights"] as const;

/**
 * Buffers of one dispatch by binding name. Without ROUTE, `logits` may be any buffer and `routeWeights` any
 * buffer not bound elsewhere in the dispatch.
 */
export type MoeMatvecBindings = Readonly<Record<(typeof MOE_MATVEC_BINDINGS)[number], Binding>>;

/** One expert mat-vec problem: per expert W ne=[k, n]; `nCols` output columns; x column = col / xDiv. */
export interface MoeMatvecShape {
  /** Weight type (gate and up share it). */
  readonly type: GgmlTypeName;
  /** Row length K. */
  readonly k: number;
  /** Rows N per expert. */
  readonly n: number;
  /** Experts in the tensor (ids must be below it). */
  readonly nExpert: number;
  /** Routed output columns (tokens × experts used); shared columns follow (see `sharedCols`). */
  readonly nCols: number;
  /** Columns per x column (experts used per token for gate/up; 1 for down). */
  readonly xDiv: number;
  /** Byte offset of the gate (or only) tensor in the weight binding. */
  readonly offGateBytes: number;
  /** Byte offset of the up tensor (GATE_UP only). */
  readonly offUpBytes?: number;
  /** Whether y = silu(gate·x)·(up·x). */
  readonly gateUp: boolean;
  /**
   * Columns past the routed ones that run the shared expert (its matrices right after the routed experts',
   * expert index nExpert): one per token; their x column is the token (col − routed) for gate·up, the column
   * itself for down (the shared activations follow the routed ones).
   */
  readonly sharedCols?: number;
}

/**
 * TEAM and ROWS of a moe_matvec variant (see {@linkcode moeMatvecConstants}), and optionally BLOCKS and
 * UNROLL (default 1 and 2). Only TEAM changes a row's sum order: ROWS, BLOCKS and UNROLL change speed, not
 * bits (wgsl/moe_matvec_test.ts), so a batched step may take other ones than its solo step.
 */
export interface MoeMatvecTuning {
  /** Invocations per row (a power of two): fixes each row's summation order. */
  readonly team: number;
  /** Rows per team (1..4). */
  readonly rows: number;
  /** Row blocks a workgroup walks in turn (default 1). */
  readonly blocks?: number;
  /** Units whose loads are issued together per loop step (2 or 4; default 2). */
  readonly unroll?: number;
  /** Workgroup size (default 256); the bits stay while {@linkcode moeMatvecSameBits} holds. */
  readonly wg?: number;
  /**
   * Run the shared columns (when there are 1 to 8) in one workgroup column, each unit decoded once (other
   * bits: see {@linkcode moeMatvecSameBits}).
   */
  readonly sharedOnce?: boolean;
}

/**
 * Default constants from the H200 sweep (bench/moe.ts, docs/PERF.md): TEAM = largest power of two ≤
 * min(64, K/32) (at least 4 units per invocation), ROWS 2, or 4 with the routing prologue (half the
 * workgroups repeat it). Prefill passes (`prefill`: chunks wider than the engine's batched decode) take half
 * that TEAM and ROWS 4 (faster per chunk in bench/decode.ts, docs/PERF.md; decode is slower with them).
 * `tuning` overrides both (benchmarks).
 */
export function moeMatvecConstants(
  shape: MoeMatvecShape,
  route?: { nExpert: number; nExpertUsed: number; wScale: number },
  tuning?: MoeMatvecTuning,
  prefill = false,
): MoeMatvecConstants {
  // H200 sweep (bench/moe.ts, docs/PERF.md): 4 units per invocation at least; ROWS 2, or 4 with the routing
  // prologue (fewer workgroups repeat it).
  let team = 1;
  while (team * 2 <= Math.min(64, shape.k / 32)) team *= 2;
  prefill &&= !route;
  return {
    TYPE: TYPE_ID[shape.type],
    WG: tuning?.wg ?? 256,
    TEAM: tuning?.team ?? (prefill ? Math.max(1, team / 2) : team),
    ROWS: tuning?.rows ?? (route || prefill ? 4 : 2),
    BLOCKS: tuning?.blocks ?? 1,
    UNROLL: tuning?.unroll ?? 2,
    SHARED_T: tuning?.sharedOnce && (shape.sharedCols ?? 0) <= 8 ? (shape.sharedCols ?? 0) : 0,
    GATE_UP: shape.gateUp,
    ROUTE: route !== undefined,
    N_EXPERT: route?.nExpert ?? 4,
    N_EXPERT_USED: route?.nExpertUsed ?? 1,
    W_SCALE: route?.wScale ?? 1,
  };
}

/** Rows of one row block: (WG / TEAM)·ROWS. */
export function moeMatvecBlockRows(c: Pick<MoeMatvecConstants, "WG" | "TEAM" | "ROWS">): number {
  return (c.WG / c.TEAM) * c.ROWS;
}

/**
 * Whether variant `c` gives the bits of `ref` (a SHARED_T 0 variant): the same TEAM, a row block whose
 * reduction rotation is a function of the row ((WG_ROWS·GROUPS) % GROUP_LEN == 0, true of every WG 256
 * variant), and SHARED_T 0 (the decode-once code sums in the same order, but drivers fuse other products into
 * FMAs: it differs in the last bits on lavapipe).
 */
export function moeMatvecSameBits(
  c: Pick<MoeMatvecConstants, "WG" | "TEAM" | "ROWS" | "SHARED_T">,
  ref: Pick<MoeMatvecConstants, "TEAM">,
): boolean {
  const groups = c.TEAM >= 8 ? c.TEAM / 8 : 1;
  return c.TEAM === ref.TEAM && (moeMatvecBlockRows(c) * groups) % (c.TEAM / groups) === 0 &&
    c.SHARED_T === 0;
}

/** The params words of `shape`. */
export function moeMatvecParams(shape: MoeMatvecShape): Uint32Array<ArrayBuffer> {
  const rowBytes = checkWeightRows("moe_matvec", shape.type, shape.k, shape.offGateBytes);
  return new Uint32Array([
    shape.k,
    shape.n,
    rowBytes,
    rowBytes * shape.n,
    shape.offGateBytes,
    shape.offUpBytes ?? 0,
    shape.nCols + (shape.sharedCols ?? 0),
    shape.xDiv,
    shape.nCols,
    shape.nExpert,
    shape.gateUp ? 0 : shape.nCols,
  ]);
}

/** Dispatch grid: groups of BLOCKS row blocks × columns (routed, then shared: one for all with SHARED_T). */
export function moeMatvecGrid(shape: MoeMatvecShape, c: MoeMatvecConstants): [number, number, number] {
  return [
    Math.ceil(Math.ceil(shape.n / moeMatvecBlockRows(c)) / c.BLOCKS),
    shape.nCols + (c.SHARED_T > 0 ? 1 : (shape.sharedCols ?? 0)),
    1,
  ];
}

/**
 * Throws before encoding when shape, constants and bindings do not fit. `opts.kernel` names the kernel in the
 * errors (moe_matvec_q8 reuses these checks); `opts.skipXY` leaves x and y to the caller's own checks.
 * @throws {RangeError} naming the kernel, the value and what to change
 */
export function checkMoeMatvec(
  shape: MoeMatvecShape,
  c: MoeMatvecConstants,
  b: MoeMatvecBindings,
  opts: { kernel?: string; skipXY?: boolean } = {},
): void {
  const kernel = opts.kernel ?? "moe_matvec";
  const rowBytes = checkWeightRows(kernel, shape.type, shape.k, shape.offGateBytes);
  checkShape(
    c.TYPE === TYPE_ID[shape.type],
    `Kernel ${kernel}: TYPE=${c.TYPE} but the shape says ${shape.type}`,
  );
  checkShape(
    c.GATE_UP === shape.gateUp,
    `Kernel ${kernel}: GATE_UP=${c.GATE_UP} but the shape says ${shape.gateUp}`,
  );
  checkShape(
    isPow2(c.WG) && c.WG >= 32 && c.WG <= 256,
    `Kernel ${kernel}: WG=${c.WG} must be a power of two from 32 to 256`,
  );
  checkShape(
    isPow2(c.TEAM) && c.TEAM <= c.WG,
    `Kernel ${kernel}: TEAM=${c.TEAM} must be a power of two ≤ WG (${c.WG})`,
  );
  checkInt(`Kernel ${kernel}: ROWS`, c.ROWS, 1, 4);
  checkInt(`Kernel ${kernel}: BLOCKS`, c.BLOCKS, 1, 64);
  checkShape(c.UNROLL === 2 || c.UNROLL === 4, `Kernel ${kernel}: UNROLL=${c.UNROLL} must be 2 or 4`);
  checkShape(
    c.SHARED_T === 0 || (c.SHARED_T === shape.sharedCols && c.SHARED_T <= 8),
    `Kernel ${kernel}: SHARED_T=${c.SHARED_T} must be 0 or the shared columns (${
      shape.sharedCols ?? 0
    }, ≤ 8)`,
  );
  checkInt(`Kernel ${kernel}: nCols`, shape.nCols, 1, MAX_WORKGROUPS_PER_DIM);
  checkInt(`Kernel ${kernel}: xDiv`, shape.xDiv, 1, shape.nCols);
  checkShape(
    shape.nCols % shape.xDiv === 0,
    `Kernel ${kernel}: nCols ${shape.nCols} not a multiple of xDiv`,
  );
  checkShape(
    Math.ceil(shape.n / moeMatvecBlockRows(c)) <= MAX_WORKGROUPS_PER_DIM,
    `Kernel ${kernel}: N=${shape.n} needs too many workgroups: split it`,
  );
  const shared = shape.sharedCols ?? 0;
  checkInt(`Kernel ${kernel}: sharedCols`, shared, 0, MAX_WORKGROUPS_PER_DIM - shape.nCols);
  checkShape(
    shared === 0 || (shape.gateUp ? shared * shape.xDiv === shape.nCols : shape.xDiv === 1),
    `Kernel ${kernel}: ${shared} shared columns need one per token (gate·up) and xDiv 1 (down)`,
  );
  const expertBytes = rowBytes * shape.n * (shape.nExpert + (shared > 0 ? 1 : 0));
  const ends = [shape.offGateBytes + expertBytes];
  if (shape.gateUp) {
    const up = shape.offUpBytes ?? -1;
    checkShape(up >= 0 && up % 4 === 0, `Kernel ${kernel}: GATE_UP needs offUpBytes, a multiple of 4`);
    ends.push(up + expertBytes);
  }
  checkBinding(kernel, "params", b.params, [11]);
  checkBinding(kernel, "ids", b.ids, [shape.nCols]);
  checkBinding(kernel, "weights", b.weights, [Math.ceil(Math.max(...ends) / 4)]);
  if (!opts.skipXY) {
    checkBinding(kernel, "x", b.x, [
      shape.k,
      shape.gateUp ? shape.nCols / shape.xDiv : shape.nCols + shared,
    ]);
    checkBinding(kernel, "y", b.y, [shape.n, shape.nCols + shared]);
  }
  if (c.ROUTE) {
    checkShape(
      shape.gateUp && c.N_EXPERT === shape.nExpert && c.N_EXPERT_USED === shape.xDiv,
      `Kernel ${kernel}: ROUTE runs on the gate·up pass with N_EXPERT = nExpert (${shape.nExpert}) and ` +
        `N_EXPERT_USED = xDiv (${shape.xDiv}), got ${c.N_EXPERT} and ${c.N_EXPERT_USED}`,
    );
    checkInt(`Kernel ${kernel}: N_EXPERT`, c.N_EXPERT, 1, 4096);
    checkBinding(kernel, "logits", b.logits, [c.N_EXPERT, shape.nCols / shape.xDiv]);
    checkBinding(kernel, "routeWeights", b.routeWeights, [shape.nCols]);
  }
}
