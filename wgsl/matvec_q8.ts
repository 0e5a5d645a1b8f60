/**
 * Twins of `quantize_q8.wgsl` and `matvec_q8.wgsl`: the batch-1 mat-vec with int8 x. `quantize_q8` rounds x to
 * int8 per 32-element chunk (one f32 scale each, in the byte order of the weight type); `matvec_q8` multiplies
 * Q8_0, Q4_K, Q5_K, Q6_K or IQ4_XS weights by it with integer dot products (`dot4I8Packed`).
 *
 * Numerics: the product is that of the dequantized weights with the *dequantized x* (d·q per element), up to
 * f32 rounding; the x rounding itself (a relative error up to 1/254 of the chunk's largest element per
 * element) is the price of the integer dot products, as in llama.cpp's quantized mat-vecs. The float64
 * reference of a test therefore takes the x that `quantize_q8` produced.
 *
 * Uniform params: quantize_q8 16 bytes (k, x_off, 0, 0); matvec_q8 32 bytes (k, n, row_bytes, w_off, y_off,
 * 0, 0, 0).
 * @module
 */
import { bindGroup, type Binding, type KernelSpec, type PipelineCache } from "./kernel.ts";
import { type GgmlTypeName, TYPE_ID } from "../engine/quant/types.ts";
import {
  bindingBytes,
  checkInt,
  checkShape,
  checkWorkgroupBytes,
  isPow2,
  MAX_WORKGROUPS_PER_DIM,
} from "./_twin.ts";
import { checkWeightRows } from "./_quant.ts";
import { normBindings } from "./matvec.ts";

/** Kernel description of `quantize_q8.wgsl`. */
export const QUANTIZE_Q8: KernelSpec = {
  name: "quantize_q8",
  url: new URL("./quantize_q8.wgsl", import.meta.url),
  lib: ["rms", "q8pack", "q8x"],
  constants: { LAYOUT: "u32", NORM: "u32", ROUND: "u32", QUADS: "u32", BOTH: "u32", EPS: "f32" },
};

/** Kernel description of `matvec_q8.wgsl`. */
export const MATVEC_Q8: KernelSpec = {
  name: "matvec_q8",
  url: new URL("./matvec_q8.wgsl", import.meta.url),
  lib: ["common", "iq4_xs", "q4_k", "q8chunk", "q8dot"],
  constants: {
    TYPE: "u32",
    TEAM: "u32",
    ROWS: "u32",
    ACC: "u32",
    RED: "u32",
    COPIES: "u32",
    GROUPS: "u32",
    PF: "u32",
  },
};

/** Kernel description of `matvec_q8_fused.wgsl` (matvec_q8 with quantize_q8 in its prologue). */
export const MATVEC_Q8_FUSED: KernelSpec = {
  name: "matvec_q8_fused",
  url: new URL("./matvec_q8_fused.wgsl", import.meta.url),
  lib: ["rms", "q8pack", "q8x", "common", "iq4_xs", "q4_k", "q8chunk", "q8dot"],
  constants: {
    TYPE: "u32",
    TEAM: "u32",
    ROWS: "u32",
    ACC: "u32",
    RED: "u32",
    COPIES: "u32",
    GROUPS: "u32",
    PF: "u32",
    NORM: "u32",
    EPS: "f32",
    KC: "u32",
  },
};

/** Weight types matvec_q8 reads. */
export const MATVEC_Q8_TYPES: readonly GgmlTypeName[] = ["Q8_0", "Q4_K", "Q5_K", "Q6_K", "IQ4_XS"];

/** Size of quantize_q8's uniform params in bytes. */
export const QUANTIZE_Q8_PARAMS_BYTES = 16;
/** Size of matvec_q8's uniform params in bytes. */
export const MATVEC_Q8_PARAMS_BYTES = 32;

/** The x byte order quantize_q8 writes for weights of `type` (its LAYOUT constant). */
export function q8Layout(type: GgmlTypeName): number {
  checkQ8Type("quantize_q8", type);
  return type === "IQ4_XS" ? 1 : 0;
}

/** Bytes of quantize_q8's output for K elements: K int8 values and K/32 f32 scales. */
export function q8xBytes(k: number): number {
  return k + (k / 32) * 4;
}

/** "A, B or C". */
export function typeList(types: readonly GgmlTypeName[]): string {
  return types.length < 2 ? types.join("") : `${types.slice(0, -1).join(", ")} or ${types.at(-1)}`;
}

function checkQ8Type(kernel: string, type: GgmlTypeName): void {
  checkShape(
    MATVEC_Q8_TYPES.includes(type),
    `Kernel ${kernel}: int8-x mat-vecs read ${typeList(MATVEC_Q8_TYPES)} weights, not ${type}: use matvec`,
  );
}

/**
 * quantize_q8's output bytes (`q8xBytes(k)`) for weights of `type` read back: the int8 values in element order
 * and the K/32 scales.
 */
export function decodeQ8x(
  type: GgmlTypeName,
  k: number,
  bytes: Uint8Array,
): { q: Int8Array; d: Float32Array } {
  const layout = q8Layout(type);
  const q = new Int8Array(k);
  const src = new Int8Array(bytes.buffer, bytes.byteOffset, k);
  for (let c = 0; c < k; c += 32) {
    for (let w = 0; w < 8; w++) {
      for (let b = 0; b < 4; b++) {
        // LAYOUT 1: words 2j, 2j+1 hold elements 4j, 4j+1, 16+4j, 17+4j and 4j+2, 4j+3, 18+4j, 19+4j.
        const e = layout === 0 ? 4 * w + b : 4 * (w >> 1) + 2 * (w & 1) + (b & 1) + 16 * (b >> 1);
        q[c + e] = src[c + 4 * w + b]!;
      }
    }
  }
  const d = new Float32Array(k / 32);
  new Uint8Array(d.buffer).set(bytes.subarray(k, k + k / 8));
  return { q, d };
}

/**
 * One quantize_q8 problem: `cols` columns of K elements of x, column c at element offset `xOffset + c·xStride`
 * of the x binding; output column c at byte `c·q8xBytes(k)` of xq.
 */
export interface QuantizeQ8Shape {
  /** Weight type the output is for (its byte order). */
  readonly type: GgmlTypeName;
  /** Elements (a multiple of 32). */
  readonly k: number;
  /** Element offset of x[0] (multiple of 4; default 0). */
  readonly xOffset?: number;
  /** Columns (default 1). */
  readonly cols?: number;
  /** Elements between columns of x (multiple of 4, ≥ k; default k). */
  readonly xStride?: number;
  /** RMSNorm x first with this epsilon (the `nw` and `xn` bindings then matter; each column on its own, xn
   * at x's places); default: no norm. */
  readonly norm?: { readonly eps: number };
  /** Write the rounded x (d·q, f32) to xn at x's place (not with a norm; one column per row of the grid). */
  readonly round?: boolean;
  /**
   * One invocation per quad word (each of a chunk's eight finds its scale), not per chunk: the same bits, 8x
   * the invocations (default {@linkcode QUANTIZE_Q8_QUADS}).
   */
  readonly quads?: boolean;
  /**
   * Also write the columns in the other byte order, `both` words after the first copy's start in xq (at least
   * the first copy's words; with quads): the same values for a mat-vec of weights in that order.
   */
  readonly both?: number;
}

/**
 * Whether quantize_q8 runs an invocation per quad word by default (QuantizeQ8Shape.quads): on the H100
 * (2026-12-06, bench/quantize.ts) 5.5 µs against 7.5 per chunk for a batched step's normed K = 2,048 columns,
 * 3.4 against 5.0 for K = 4,096, the same bits.
 */
export const QUANTIZE_Q8_QUADS = true;

/** Bindings of quantize_q8. */
export interface QuantizeQ8Bindings {
  /** Uniform params ({@linkcode quantizeQ8Params}); offset a multiple of 256. */
  readonly params: Binding;
  /** x, f32 (storage, read). */
  readonly x: Binding;
  /** The int8 x and scales, {@linkcode q8xBytes} bytes (storage, read_write). */
  readonly xq: Binding;
  /** With a norm: its weight, K f32 (storage, read). */
  readonly nw?: Binding;
  /** With a norm: receives the normed x at the x offset; with round, the rounded x (storage, read_write; not
   * aliasing x). */
  readonly xn?: Binding;
}

/** A checked, ready-to-encode dispatch. */
export interface Q8Op {
  /** The variant's pipeline. */
  readonly pipeline: GPUComputePipeline;
  /** Bind group 0. */
  readonly bindGroup: GPUBindGroup;
  /** Workgroups in x and y. */
  readonly grid: readonly [number, number];
}

/** The uniform params of a quantize_q8 shape. */
export function quantizeQ8Params(shape: QuantizeQ8Shape): Uint32Array<ArrayBuffer> {
  return new Uint32Array([shape.k, shape.xOffset ?? 0, shape.xStride ?? shape.k, shape.both ?? 0]);
}

/**
 * Throws before anything is encoded when the shape and bindings do not fit together.
 * @throws {RangeError} naming the kernel, the value and what to change
 */
export function checkQuantizeQ8(shape: QuantizeQ8Shape, b: QuantizeQ8Bindings): void {
  checkQ8Type("quantize_q8", shape.type);
  checkShape(
    Number.isInteger(shape.k) && shape.k >= 32 && shape.k % 32 === 0 &&
      shape.k / 4 <= 256 * MAX_WORKGROUPS_PER_DIM,
    `Kernel quantize_q8: K=${shape.k} must be a positive multiple of 32 (whole chunks)`,
  );
  const xOff = shape.xOffset ?? 0;
  checkShape(
    Number.isInteger(xOff) && xOff >= 0 && xOff % 4 === 0,
    `Kernel quantize_q8: x offset ${xOff} must be a non-negative multiple of 4 (vec4 loads)`,
  );
  const cols = shape.cols ?? 1;
  const xStride = shape.xStride ?? shape.k;
  checkShape(
    Number.isInteger(cols) && cols >= 1 && cols <= MAX_WORKGROUPS_PER_DIM && Number.isInteger(xStride) &&
      xStride >= shape.k && xStride % 4 === 0,
    `Kernel quantize_q8: ${cols} columns (1..${MAX_WORKGROUPS_PER_DIM}) with x stride ${xStride} (a multiple ` +
      `of 4, ≥ K=${shape.k})`,
  );
  checkShape(!(shape.round && shape.norm), "Kernel quantize_q8: round and norm both write xn: take one");
  const need = (what: string, bind: Binding, bytes: number) =>
    checkShape(
      bindingBytes(bind) >= bytes,
      `Kernel quantize_q8: binding ${what} holds ${bindingBytes(bind)} bytes but K=${shape.k} × ${cols} ` +
        `columns needs ${bytes}`,
    );
  const xEnd = 4 * (xOff + (cols - 1) * xStride + shape.k);
  need("params", b.params, QUANTIZE_Q8_PARAMS_BYTES);
  need("x", b.x, xEnd);
  if (shape.both !== undefined) {
    checkShape(
      (shape.quads ?? QUANTIZE_Q8_QUADS) && Number.isInteger(shape.both) &&
        shape.both >= (cols * q8xBytes(shape.k)) / 4,
      `Kernel quantize_q8: the other byte order's copy ${shape.both} words in must follow the first copy's ` +
        `${(cols * q8xBytes(shape.k)) / 4} words, with quads`,
    );
  }
  need("xq", b.xq, 4 * (shape.both ?? 0) + cols * q8xBytes(shape.k));
  if (shape.round) {
    checkShape(b.xn !== undefined, "Kernel quantize_q8: round needs the xn binding");
    need("xn", b.xn!, xEnd);
  }
  if (shape.norm) {
    checkShape(
      b.nw !== undefined && b.xn !== undefined,
      "Kernel quantize_q8: a norm needs the nw and xn bindings",
    );
    checkShape(
      Number.isFinite(shape.norm.eps) && shape.norm.eps > 0,
      `Kernel quantize_q8: norm epsilon ${shape.norm.eps} must be a positive number`,
    );
    need("nw", b.nw!, 4 * shape.k);
    need("xn", b.xn!, xEnd);
  }
}

/** The constants of a quantize_q8 problem. */
export function quantizeQ8Constants(
  shape: QuantizeQ8Shape,
): { LAYOUT: number; NORM: number; ROUND: number; QUADS: number; BOTH: number; EPS: number } {
  return {
    LAYOUT: q8Layout(shape.type),
    NORM: shape.norm ? 1 : 0,
    ROUND: shape.round ? 1 : 0,
    QUADS: (shape.quads ?? QUANTIZE_Q8_QUADS) ? 1 : 0,
    BOTH: shape.both !== undefined ? 1 : 0,
    EPS: shape.norm?.eps ?? 0,
  };
}

/**
 * Workgroups of a quantize_q8 problem (one invocation per chunk, or per quad word with `quads`, 256 per
 * workgroup; y: columns).
 */
export function quantizeQ8Grid(shape: QuantizeQ8Shape): [number, number] {
  const perColumn = (shape.quads ?? QUANTIZE_Q8_QUADS) ? shape.k / 4 : shape.k / 32;
  return [Math.ceil(perColumn / 256), shape.cols ?? 1];
}

/** Checks, compiles (or reuses) and binds one quantize_q8 dispatch. */
export async function prepareQuantizeQ8(
  cache: PipelineCache,
  opts: { device: GPUDevice; shape: QuantizeQ8Shape; bindings: QuantizeQ8Bindings },
): Promise<Q8Op> {
  checkQuantizeQ8(opts.shape, opts.bindings);
  const pipeline = await cache.get(QUANTIZE_Q8, quantizeQ8Constants(opts.shape));
  const b = opts.bindings;
  return {
    pipeline,
    bindGroup: bindGroup(opts.device, pipeline, [b.params, b.x, b.xq, ...normBindings(opts.device, b)]),
    grid: quantizeQ8Grid(opts.shape),
  };
}

/** Constants of one matvec_q8 variant. */
export interface MatvecQ8Constants {
  /** ggml type id of the weights (8, 12, 13, 14 or 23: MATVEC_Q8_TYPES). */
  readonly TYPE: number;
  /** Invocations per row team (power of two, 1..256). */
  readonly TEAM: number;
  /** Rows per team (1..4). */
  readonly ROWS: number;
  /** 1: y += W·x; 0: y = W·x. */
  readonly ACC: number;
  /** Team reduction: 0 one invocation per row adds the TEAM partials; 1 runs of 8 in parallel first. */
  readonly RED: number;
  /** Interleaved copies of the IQ4_XS codebook table (1, 2, 4, 8 or 16): fewer bank conflicts, more memory. */
  readonly COPIES: number;
  /** Row groups per workgroup, run one after another (the table is built once for all). */
  readonly GROUPS: number;
  /** 1: the weight loads of a lane's next chunk are issued before the math of this one. */
  readonly PF: number;
  /** Index signature: the constants object is a `ConstValues` for the kernel loader. */
  [key: string]: number;
}

/** One matvec_q8 problem: W ne=[k, n] of `type` at a byte offset of the weight binding, y at an offset. */
export interface MatvecQ8Shape {
  /** Weight type (one of MATVEC_Q8_TYPES). */
  readonly type: GgmlTypeName;
  /** Row length K. */
  readonly k: number;
  /** Rows N. */
  readonly n: number;
  /** Byte offset of row 0 in the weight binding (multiple of 4, of 8 for IQ4_XS; default 0). */
  readonly wOffsetBytes?: number;
  /** Element offset of y[0] (default 0). */
  readonly yOffset?: number;
  /** matvec_q8_fused: element offset of x[0] in the x binding (multiple of 4; default 0). */
  readonly xOffset?: number;
}

/** One matvec_q8_fused problem: a matvec_q8 one whose f32 x is quantized (RMSNorm-ed first with `norm`) in it. */
export interface MatvecQ8FusedShape extends MatvecQ8Shape {
  /** RMSNorm x first with this epsilon (the `nw` and `xn` bindings then matter); default: no norm. */
  readonly norm?: { readonly eps: number };
}

/** Bindings of matvec_q8_fused (the weight buffer is bound twice by {@linkcode prepareMatvecQ8Fused}). */
export interface MatvecQ8FusedBindings {
  /** Uniform params ({@linkcode matvecQ8Params}); offset a multiple of 256. */
  readonly params: Binding;
  /** Weight bytes (storage, read). */
  readonly weights: Binding;
  /** x, f32 (storage, read). */
  readonly x: Binding;
  /** With a norm: its weight, K f32 (storage, read). */
  readonly nw?: Binding;
  /** With a norm: receives the normed x at the x offset (storage, read_write; not aliasing x). */
  readonly xn?: Binding;
  /** Receives quantize_q8's output for this type, {@linkcode q8xBytes} bytes (storage, read_write). */
  readonly xo: Binding;
  /** Output, f32 (storage, read_write). */
  readonly y: Binding;
}

/** Bindings of matvec_q8 (the weight and xq buffers are bound twice by {@linkcode prepareMatvecQ8}). */
export interface MatvecQ8Bindings {
  /** Uniform params ({@linkcode matvecQ8Params}); offset a multiple of 256. */
  readonly params: Binding;
  /** Weight bytes (storage, read). */
  readonly weights: Binding;
  /** quantize_q8's output for this type (storage, read). */
  readonly xq: Binding;
  /** Output, f32 (storage, read_write). */
  readonly y: Binding;
}

/**
 * The default variant (docs/PERF.md). Tall matrices (N ≥ 8192): TEAM = the chunks
 * per row up to 16, RED 0 (one invocation per row adds the partials while other workgroups stream); IQ4_XS
 * from N = 32768 on ROWS 4 (rows share each x chunk and the codebook work; at N = 8192 its 128 workgroups
 * leave SMs idle: 42% of the ceiling against 62% at ROWS 1), else ROWS 1. Short ones (a few hundred
 * workgroups, where each workgroup's tail shows): TEAM up to 32, ROWS 1, RED 1. PF (the next chunk's loads
 * before this one's math) stays 0: it lost on the tall shapes and went either way on the short ones.
 */
export function matvecQ8Constants(
  shape: MatvecQ8Shape,
  opts: {
    acc?: boolean;
    team?: number;
    rows?: number;
    red?: number;
    copies?: number;
    groups?: number;
    pf?: number;
  } = {},
): MatvecQ8Constants {
  const tall = shape.n >= 8192;
  const maxTeam = tall ? 16 : 32;
  let team = 1;
  while (team < maxTeam && 2 * team <= shape.k / 32) team *= 2;
  return {
    TYPE: TYPE_ID[shape.type],
    TEAM: opts.team ?? team,
    ROWS: opts.rows ?? (shape.n >= 32768 && shape.type === "IQ4_XS" ? 4 : 1),
    ACC: opts.acc ? 1 : 0,
    RED: opts.red ?? (tall ? 0 : 1),
    COPIES: opts.copies ?? 1,
    GROUPS: opts.groups ?? 1,
    PF: opts.pf ?? 0,
  };
}

/** Constants of one matvec_q8_fused variant: matvec_q8's and the prologue's. */
export interface MatvecQ8FusedConstants extends MatvecQ8Constants {
  /** 1: RMSNorm x first. */
  readonly NORM: number;
  /** The norm's epsilon (0 without a norm). */
  readonly EPS: number;
  /** K / 32: the int8 x chunks each workgroup holds. */
  readonly KC: number;
}

/**
 * The default variant of a matvec_q8_fused problem: matvec_q8's body constants, but IQ4_XS takes ROWS 4 from
 * 8192 rows on: every workgroup repeats the prologue, so fewer workgroups pay it fewer times (the decode
 * in-projection measured faster at ROWS 4, while the plain matvec_q8 is faster at ROWS 1: docs/PERF.md).
 */
export function matvecQ8FusedConstants(
  shape: MatvecQ8FusedShape,
  opts: Parameters<typeof matvecQ8Constants>[1] = {},
): MatvecQ8FusedConstants {
  const rows = shape.type === "IQ4_XS" && shape.n >= 8192 ? 4 : undefined;
  return {
    ...matvecQ8Constants(shape, { rows, ...opts }),
    NORM: shape.norm ? 1 : 0,
    EPS: shape.norm?.eps ?? 0,
    KC: shape.k / 32,
  };
}

/** Workgroup memory of a matvec_q8 variant in bytes (the codebook table copies and the partial sums). */
export function matvecQ8WorkgroupBytes(c: MatvecQ8Constants): number {
  return 1024 * c.COPIES + 1024 * c.ROWS;
}

/** Workgroup memory of a matvec_q8_fused variant in bytes: matvec_q8's, the int8 x and the norm's sums. */
export function matvecQ8FusedWorkgroupBytes(c: MatvecQ8FusedConstants): number {
  return matvecQ8WorkgroupBytes(c) + 36 * c.KC + 1024;
}

/** The uniform params of a matvec_q8 shape. */
export function matvecQ8Params(shape: MatvecQ8Shape): Uint32Array<ArrayBuffer> {
  const rowBytes = checkWeightRows("matvec_q8", shape.type, shape.k, shape.wOffsetBytes ?? 0);
  return new Uint32Array([
    shape.k,
    shape.n,
    rowBytes,
    shape.wOffsetBytes ?? 0,
    shape.yOffset ?? 0,
    shape.xOffset ?? 0,
    0,
    0,
  ]);
}

/** Workgroups in x and y: rows split into workgroups, the count folded into 2-D past 65535. */
export function matvecQ8Grid(shape: MatvecQ8Shape, c: MatvecQ8Constants): [number, number] {
  const wgs = Math.ceil(shape.n / ((256 / c.TEAM) * c.ROWS * c.GROUPS));
  const gx = Math.min(wgs, MAX_WORKGROUPS_PER_DIM);
  return [gx, Math.ceil(wgs / gx)];
}

/**
 * Throws before anything is encoded when the shape, constants and bindings do not fit together.
 * @throws {RangeError} naming the kernel, the value and what to change
 */
export function checkMatvecQ8(shape: MatvecQ8Shape, c: MatvecQ8Constants, b: MatvecQ8Bindings): void {
  checkQ8Body("matvec_q8", shape, c, b);
  need("matvec_q8", shape, "xq", b.xq, q8xBytes(shape.k));
}

/**
 * Throws before anything is encoded when the shape, constants and bindings of a matvec_q8_fused problem do not
 * fit together.
 * @throws {RangeError} naming the kernel, the value and what to change
 */
export function checkMatvecQ8Fused(
  shape: MatvecQ8FusedShape,
  c: MatvecQ8FusedConstants,
  b: MatvecQ8FusedBindings,
): void {
  const kernel = "matvec_q8_fused";
  checkQ8Body(kernel, shape, c, b);
  checkShape(
    c.KC === shape.k / 32,
    `Kernel ${kernel}: KC=${c.KC} but K=${shape.k} has ${shape.k / 32} chunks`,
  );
  checkShape(
    c.NORM === (shape.norm ? 1 : 0),
    `Kernel ${kernel}: NORM=${c.NORM} but the shape ${shape.norm ? "has" : "has no"} norm`,
  );
  const xOff = shape.xOffset ?? 0;
  checkShape(
    Number.isInteger(xOff) && xOff >= 0 && xOff % 4 === 0,
    `Kernel ${kernel}: x offset ${xOff} must be a non-negative multiple of 4 (vec4 loads)`,
  );
  need(kernel, shape, "x", b.x, 4 * (xOff + shape.k));
  need(kernel, shape, "xo", b.xo, q8xBytes(shape.k));
  if (shape.norm) {
    checkShape(
      b.nw !== undefined && b.xn !== undefined,
      `Kernel ${kernel}: a norm needs the nw and xn bindings`,
    );
    checkShape(
      Number.isFinite(shape.norm.eps) && shape.norm.eps > 0,
      `Kernel ${kernel}: norm epsilon ${shape.norm.eps} must be a positive number`,
    );
    need(kernel, shape, "nw", b.nw!, 4 * shape.k);
    need(kernel, shape, "xn", b.xn!, 4 * (xOff + shape.k));
  }
}

/**
 * The checks every int8-x mat-vec (matvec_q8, matvec_q8_fused, matvec_q8b) makes of its weights and of the
 * constants of its row loop: the type, the row bytes and offset, TYPE, TEAM, ACC and RED. Returns the row
 * bytes.
 * @throws {RangeError} naming the kernel, the value and what to change
 */
export function checkQ8Rows(
  kernel: string,
  shape: MatvecQ8Shape,
  c: { readonly TYPE: number; readonly TEAM: number; readonly ACC: number; readonly RED: number },
): number {
  checkQ8Type(kernel, shape.type);
  const wOff = shape.wOffsetBytes ?? 0;
  const rowBytes = checkWeightRows(kernel, shape.type, shape.k, wOff);
  checkShape(
    shape.type !== "IQ4_XS" || wOff % 8 === 0,
    `Kernel ${kernel}: IQ4_XS weight offset ${wOff} bytes must be a multiple of 8 (word-pair loads)`,
  );
  checkShape(
    c.TYPE === TYPE_ID[shape.type],
    `Kernel ${kernel}: TYPE=${c.TYPE} but the shape says ${shape.type}`,
  );
  checkShape(
    isPow2(c.TEAM) && c.TEAM <= 256,
    `Kernel ${kernel}: TEAM=${c.TEAM} must be a power of two ≤ 256`,
  );
  checkInt(`Kernel ${kernel}: ACC`, c.ACC, 0, 1);
  checkInt(`Kernel ${kernel}: RED`, c.RED, 0, 1);
  checkInt(`Kernel ${kernel}: n`, shape.n, 1, 2 ** 31);
  return rowBytes;
}

/** The checks matvec_q8 and matvec_q8_fused share (the weights, the constants of the body, y). */
function checkQ8Body(
  kernel: string,
  shape: MatvecQ8Shape,
  c: MatvecQ8Constants,
  b: { readonly params: Binding; readonly weights: Binding; readonly y: Binding },
): void {
  const rowBytes = checkQ8Rows(kernel, shape, c);
  const wOff = shape.wOffsetBytes ?? 0;
  checkInt(`Kernel ${kernel}: ROWS`, c.ROWS, 1, 4);
  checkShape(
    isPow2(c.COPIES) && c.COPIES <= 32,
    `Kernel ${kernel}: COPIES=${c.COPIES} must be 1, 2, 4, 8, 16 or 32`,
  );
  checkInt(`Kernel ${kernel}: GROUPS`, c.GROUPS, 1, 64);
  checkInt(`Kernel ${kernel}: PF`, c.PF, 0, 1);
  const yOff = shape.yOffset ?? 0;
  checkShape(Number.isInteger(yOff) && yOff >= 0, `Kernel ${kernel}: y offset ${yOff} must be ≥ 0`);
  const [gx, gy] = matvecQ8Grid(shape, c);
  checkShape(
    gy <= MAX_WORKGROUPS_PER_DIM,
    `Kernel ${kernel}: N=${shape.n} needs ${gx}×${gy} workgroups: split it`,
  );
  need(kernel, shape, "params", b.params, MATVEC_Q8_PARAMS_BYTES);
  need(kernel, shape, "weights", b.weights, Math.ceil((wOff + shape.n * rowBytes) / 4) * 4);
  need(kernel, shape, "y", b.y, 4 * (yOff + shape.n));
}

function need(kernel: string, shape: MatvecQ8Shape, what: string, bind: Binding, bytes: number): void {
  checkShape(
    bindingBytes(bind) >= bytes,
    `Kernel ${kernel}: binding ${what} holds ${bindingBytes(bind)} bytes but ${shape.type} ne=[${shape.k}, ` +
      `${shape.n}] needs ${bytes}: allocate or slice it for this shape`,
  );
}

/**
 * Checks the problem, compiles (or reuses) its variant and builds its bind group.
 * @throws {RangeError} from {@linkcode checkMatvecQ8}
 */
export async function prepareMatvecQ8(
  cache: PipelineCache,
  opts: {
    device: GPUDevice;
    shape: MatvecQ8Shape;
    bindings: MatvecQ8Bindings;
    constants?: MatvecQ8Constants;
  },
): Promise<Q8Op> {
  const c = opts.constants ?? matvecQ8Constants(opts.shape);
  checkMatvecQ8(opts.shape, c, opts.bindings);
  checkWorkgroupBytes(
    opts.device,
    `Kernel matvec_q8: COPIES=${c.COPIES}, ROWS=${c.ROWS}`,
    matvecQ8WorkgroupBytes(c),
    "use fewer copies",
  );
  const pipeline = await cache.get(MATVEC_Q8, c);
  const b = opts.bindings;
  return {
    pipeline,
    bindGroup: bindGroup(opts.device, pipeline, [b.params, b.weights, b.weights, b.xq, b.xq, b.y]),
    grid: matvecQ8Grid(opts.shape, c),
  };
}

/**
 * Checks a matvec_q8_fused problem, compiles (or reuses) its variant and builds its bind group.
 * @throws {RangeError} from {@linkcode checkMatvecQ8Fused}, or when the variant needs more workgroup memory than
 * the device has
 */
export async function prepareMatvecQ8Fused(
  cache: PipelineCache,
  opts: {
    device: GPUDevice;
    shape: MatvecQ8FusedShape;
    bindings: MatvecQ8FusedBindings;
    constants?: MatvecQ8FusedConstants;
  },
): Promise<Q8Op> {
  const c = opts.constants ?? matvecQ8FusedConstants(opts.shape);
  checkMatvecQ8Fused(opts.shape, c, opts.bindings);
  checkWorkgroupBytes(
    opts.device,
    `Kernel matvec_q8_fused: K=${opts.shape.k}, COPIES=${c.COPIES}, ROWS=${c.ROWS}`,
    matvecQ8FusedWorkgroupBytes(c),
    "use quantize_q8 and matvec_q8",
  );
  const pipeline = await cache.get(MATVEC_Q8_FUSED, c);
  const b = opts.bindings;
  return {
    pipeline,
    bindGroup: bindGroup(opts.device, pipeline, [
      b.params,
      b.weights,
      b.weights,
      b.x,
      ...normBindings(opts.device, b),
      b.xo,
      b.y,
    ]),
    grid: matvecQ8Grid(opts.shape, c),
  };
}

/** Records one quantize_q8, matvec_q8 or matvec_q8_fused dispatch into a caller-owned compute pass. */
export function encodeQ8(pass: GPUComputePassEncoder, op: Q8Op): void {
  pass.setPipeline(op.pipeline);
  pass.setBindGroup(0, op.bindGroup);
  pass.dispatchWorkgroups(op.grid[0], op.grid[1]);
}
