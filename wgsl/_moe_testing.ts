/**
 * Test helpers of the expert mat-vec kernels (private; tests only): the float64 reference of a pass, random
 * cases of the int8-x passes and the check of their output against it.
 * @module
 */
import { dequantize } from "../engine/quant/dequant.ts";
import type { MoeMatvecShape } from "./moe_matvec.ts";
import { DOT_ATOL, DOT_RTOL, randomWeights } from "./_quant_testing.ts";
import { type GgmlTypeName, typeInfo } from "../engine/quant/types.ts";
import { q8Layout } from "./matvec_q8.ts";
import { q8ColumnWords } from "./moe_matvec_q8.ts";
import { GUARD_WORDS, POISON_F32 } from "../tests/util/gpu.ts";
import { assertPoisoned } from "../tests/util/close.ts";
import type { Rng } from "../tests/util/rng.ts";
import assert from "node:assert/strict";

/**
 * Float64 reference of an expert pass (moe_matvec's column rule: routed columns by `ids`, shared columns
 * after them) on x columns ne=[K, ·], and a tolerance per element: DOT_RTOL on each dot product's Σ|terms|,
 * carried through silu and the product for gate·up.
 */
export function moeReference(
  c: { shape: MoeMatvecShape; ids: ArrayLike<number>; w: Uint8Array; x: ArrayLike<number> },
): { ref: Float64Array; tol: Float64Array } {
  const { type, k, n, nExpert, xDiv, gateUp } = c.shape;
  const shared = c.shape.sharedCols ?? 0;
  const nCols = c.shape.nCols + shared;
  const nMats = nExpert + (shared > 0 ? 1 : 0);
  const rb = (k / typeInfo(type).blockElems) * typeInfo(type).blockBytes;
  const mat = (off: number) => dequantize(type, c.w.subarray(off, off + rb * n * nMats), k * n * nMats);
  const g = mat(c.shape.offGateBytes);
  const u = gateUp ? mat(c.shape.offUpBytes!) : undefined;
  const ref = new Float64Array(n * nCols);
  const tol = new Float64Array(n * nCols);
  for (let col = 0; col < nCols; col++) {
    const routed = col < c.shape.nCols;
    const e = routed ? c.ids[col]! : nExpert;
    const xc = routed ? Math.floor(col / xDiv) : gateUp ? col - c.shape.nCols : col;
    for (let r = 0; r < n; r++) {
      let sg = 0, mg = 0, su = 0, mu = 0;
      for (let i = 0; i < k; i++) {
        const xv = c.x[xc * k + i]!;
        sg += g[(e * n + r) * k + i]! * xv;
        mg += Math.abs(g[(e * n + r) * k + i]! * xv);
        if (u) {
          su += u[(e * n + r) * k + i]! * xv;
          mu += Math.abs(u[(e * n + r) * k + i]! * xv);
        }
      }
      if (u) {
        const sig = 1 / (1 + Math.exp(-sg));
        ref[col * n + r] = sg * sig * su;
        // DOT_RTOL on each dot, carried through silu (derivative ≤ 1.1) and the product.
        tol[col * n + r] = DOT_RTOL * (1.1 * mg * Math.abs(su) + Math.abs(sg * sig) * mu) + DOT_ATOL;
      } else {
        ref[col * n + r] = sg;
        tol[col * n + r] = DOT_RTOL * mg + DOT_ATOL;
      }
    }
  }
  return { ref, tol };
}

/** Element index (within its 32-chunk) of byte `b` of quad word `w` in quantize_q8's byte order for `type`. */
function elementOf(type: GgmlTypeName, w: number, b: number): number {
  if (q8Layout(type) === 0) return 4 * w + b;
  const base = (w & 1) === 0 ? 4 * (w >> 1) : 4 * (w >> 1) + 2;
  return [base, base + 1, base + 16, base + 17][b]!;
}

/** Random int8 x columns in quantize_q8's format for `type`, and their dequantized values (d·q). */
export function randomXq(
  rng: Rng,
  type: GgmlTypeName,
  k: number,
  cols: number,
): { words: Uint32Array; x: Float64Array } {
  const cw = q8ColumnWords(k);
  const words = new Uint32Array(cw * cols);
  const x = new Float64Array(k * cols);
  for (let col = 0; col < cols; col++) {
    const bytes = new Int8Array(words.buffer, 4 * cw * col, k);
    const d = new Float32Array(words.buffer, 4 * cw * col + k, k / 32);
    for (let c = 0; c < k / 32; c++) {
      d[c] = c === 1 ? 0 : 10 ** rng.int(-3, 1) * (0.5 + rng.float()); // chunk 1: an all-zero chunk
      for (let w = 0; w < 8; w++) {
        for (let b = 0; b < 4; b++) {
          const q = c === 1 ? 0 : rng.int(-127, 128);
          bytes[32 * c + 4 * w + b] = q;
          x[col * k + 32 * c + elementOf(type, w, b)] = d[c]! * q;
        }
      }
    }
  }
  return { words, x };
}

/** One int8-x expert pass: its shape, ids, weight bytes and x. */
export interface MoeCase {
  shape: MoeMatvecShape;
  ids: Uint32Array;
  w: Uint8Array;
  /** x columns as int8 words (null: the gate·up pass's QOUT output feeds this down pass). */
  xq: Uint32Array | null;
  /** Dequantized x columns. */
  x: Float64Array;
}

/**
 * A random pass of `type` weights (`o` fixes K, N, the experts, the ids, the tokens and shared columns): its
 * int8 x columns are the tokens (gate·up) or every column (down).
 */
export function makeMoeCase(
  rng: Rng,
  type: GgmlTypeName,
  gateUp: boolean,
  o: { k?: number; n?: number; nExpert?: number; ids?: Uint32Array; tokens?: number; shared: boolean },
): MoeCase {
  const k = o.k ?? 256 * rng.int(1, 4);
  const n = o.n ?? rng.int(1, 70);
  const nExpert = o.nExpert ?? rng.int(2, 9);
  const ids = o.ids ??
    Uint32Array.from({ length: rng.int(1, 4) * (o.tokens ?? 1) }, () => rng.int(0, nExpert));
  const tokens = o.tokens ?? 1;
  const nCols = ids.length;
  const sharedCols = o.shared ? tokens : 0;
  const nMats = nExpert + (o.shared ? 1 : 0);
  const expertBytes = (k / typeInfo(type).blockElems) * typeInfo(type).blockBytes * n * nMats;
  const offGate = 8 * rng.int(0, 8);
  const offUp = gateUp ? Math.ceil((offGate + expertBytes) / 8) * 8 + 8 * rng.int(0, 8) : undefined;
  const w = new Uint8Array((offUp ?? offGate) + expertBytes);
  w.set(randomWeights(rng, type, k, n * nMats, 0.1), offGate);
  if (offUp !== undefined) w.set(randomWeights(rng, type, k, n * nMats, 0.1), offUp);
  const xDiv = gateUp ? nCols / tokens : 1;
  const { words, x } = randomXq(rng, type, k, gateUp ? tokens : nCols + sharedCols);
  return {
    shape: { type, k, n, nExpert, nCols, xDiv, offGateBytes: offGate, offUpBytes: offUp, gateUp, sharedCols },
    ids,
    w,
    xq: words,
    x,
  };
}

/** y (and its poisoned guard) against the reference, element by element. */
export function checkMoeY(got: ArrayBuffer, c: MoeCase, what: string): void {
  const { ref, tol } = moeReference(c);
  const g = new Float32Array(got, 0, ref.length);
  const bad = [...g].findIndex((v, j) => !(Math.abs(v - ref[j]!) <= tol[j]!));
  assert.equal(bad, -1, `${what}: y[${bad}] = ${g[bad]}, want ${ref[bad]} ± ${tol[bad]}`);
  assertPoisoned(new Uint32Array(got, 4 * ref.length, GUARD_WORDS), POISON_F32, `${what}: y guard`);
}
