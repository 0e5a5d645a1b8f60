/**
 * The float64 reference decoder of every supported ggml type, written straight from the formulas of spec
 * `quants.md` (readable before fast). Arithmetic follows ggml's f32 dequantizers: f16 scales are converted
 * to f32 and every f32 product or difference ggml computes is rounded with `Math.fround`, so each value
 * equals ggml's f32 output exactly; the results are returned as float64.
 * @module
 */

import { bf16ToF32, f16ToF32 } from "./f16.ts";
import { type GgmlTypeName, typeInfo } from "./types.ts";

/** The IQ4_NL / IQ4_XS non-linear codebook `kvalues_iq4nl` (int8), indexed by a 4-bit code. */
export const KVALUES_IQ4NL: readonly number[] = Object.freeze([
  -127,
  -104,
  -83,
  -65,
  -49,
  -35,
  -22,
  -10,
  1,
  13,
  25,
  38,
  53,
  69,
  89,
  113,
]);

const fr = Math.fround;

/**
 * Dequantizes `nElems` elements of `type` from `bytes` (exactly `nElems / blockElems` blocks).
 * @returns ne=[nElems] values equal to ggml's f32 dequantization
 * @throws {RangeError} when `nElems` is not a whole number of blocks or `bytes` has the wrong length
 * @example
 * ```ts
 * dequantize("Q8_0", blockBytes, 32); // Float64Array(32)
 * ```
 */
export function dequantize(type: GgmlTypeName, bytes: Uint8Array, nElems: number): Float64Array {
  const nBlocks = checkSize(type, bytes.length, nElems);
  const out = new Float64Array(nElems);
  if (type === "F32") {
    const dv = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength);
    for (let i = 0; i < nElems; i++) out[i] = dv.getFloat32(4 * i, true);
    return out;
  }
  const info = typeInfo(type);
  for (let b = 0; b < nBlocks; b++) {
    decodeBlock(type, bytes, b * info.blockBytes, out, b * info.blockElems);
  }
  return out;
}

/**
 * Dequantizes row `row` of a 2-D/3-D tensor of `type` whose rows hold `ne0` elements (`bytes` = the whole
 * tensor, a whole number of rows).
 * @returns ne=[ne0]
 * @throws {RangeError} when `ne0` is not a whole number of blocks, `bytes` is not a whole number of rows,
 *   or `row` is out of range
 */
export function dequantizeRow(
  type: GgmlTypeName,
  bytes: Uint8Array,
  ne0: number,
  row: number,
): Float64Array {
  const info = typeInfo(type);
  if (!Number.isInteger(ne0) || ne0 <= 0 || ne0 % info.blockElems !== 0) {
    throw new RangeError(
      `Row length ne0=${ne0} is not a positive whole number of ${type} blocks of ${info.blockElems} elements`,
    );
  }
  const rb = (ne0 / info.blockElems) * info.blockBytes;
  if (bytes.length % rb !== 0) {
    throw new RangeError(
      `${type} tensor of ${bytes.length} bytes is not a whole number of rows of ${rb} bytes (ne0=${ne0}): ` +
        `pass the whole tensor and its ne0`,
    );
  }
  const nRows = bytes.length / rb;
  if (!Number.isInteger(row) || row < 0 || row >= nRows) {
    throw new RangeError(`Row ${row} is out of range for a ${type} tensor of ${nRows} rows of ne0=${ne0}`);
  }
  return dequantize(type, bytes.subarray(row * rb, (row + 1) * rb), ne0);
}

/**
 * Checks that `nElems` is a whole number of `type` blocks stored in exactly `byteLength` bytes.
 * @returns the number of blocks
 * @throws {RangeError} naming the type, expected and actual sizes
 */
export function checkSize(type: GgmlTypeName, byteLength: number, nElems: number): number {
  const info = typeInfo(type);
  if (!Number.isInteger(nElems) || nElems < 0 || nElems % info.blockElems !== 0) {
    throw new RangeError(
      `${type}: ${nElems} elements is not a whole number of blocks of ${info.blockElems} elements`,
    );
  }
  const nBlocks = nElems / info.blockElems;
  const want = nBlocks * info.blockBytes;
  if (byteLength !== want) {
    throw new RangeError(
      `${type}: ${nElems} elements need ${want} bytes (${nBlocks} blocks of ${info.blockBytes}) ` +
        `but got ${byteLength} bytes`,
    );
  }
  return nBlocks;
}

/** Decodes one block of `type` at byte offset `o` into `y[yo ..]`. */
function decodeBlock(type: GgmlTypeName, x: Uint8Array, o: number, y: Float64Array, yo: number): void {
  switch (type) {
    case "F32":
      y[yo] = new DataView(x.buffer, x.byteOffset + o, 4).getFloat32(0, true); // dequantize() has a faster loop
      return;
    case "F16":
      y[yo] = f16ToF32(u16(x, o));
      return;
    case "BF16":
      y[yo] = bf16ToF32(u16(x, o));
      return;
    case "Q8_0": {
      const d = f16ToF32(u16(x, o));
      for (let j = 0; j < 32; j++) y[yo + j] = fr(d * i8(x[o + 2 + j]!));
      return;
    }
    case "Q4_0": {
      const d = f16ToF32(u16(x, o));
      for (let j = 0; j < 16; j++) {
        const q = x[o + 2 + j]!;
        y[yo + j] = fr(d * ((q & 0xf) - 8));
        y[yo + j + 16] = fr(d * ((q >> 4) - 8));
      }
      return;
    }
    case "IQ4_NL": {
      const d = f16ToF32(u16(x, o));
      for (let j = 0; j < 16; j++) {
        const q = x[o + 2 + j]!;
        y[yo + j] = fr(d * KVALUES_IQ4NL[q & 0xf]!);
        y[yo + j + 16] = fr(d * KVALUES_IQ4NL[q >> 4]!);
      }
      return;
    }
    case "IQ4_XS": {
      const d = f16ToF32(u16(x, o));
      const scalesH = u16(x, o + 2);
      for (let ib = 0; ib < 8; ib++) {
        const ls = ((x[o + 4 + (ib >> 1)]! >> (4 * (ib & 1))) & 0xf) | (((scalesH >> (2 * ib)) & 3) << 4);
        const dl = fr(d * (ls - 32));
        for (let j = 0; j < 16; j++) {
          const q = x[o + 8 + 16 * ib + j]!;
          y[yo + 32 * ib + j] = fr(dl * KVALUES_IQ4NL[q & 0xf]!);
          y[yo + 32 * ib + 16 + j] = fr(dl * KVALUES_IQ4NL[q >> 4]!);
        }
      }
      return;
    }
    case "Q4_K":
    case "Q5_K": {
      const five = type === "Q5_K";
      const d = f16ToF32(u16(x, o));
      const dmin = f16ToF32(u16(x, o + 2));
      const qh = o + 16;
      const qs = o + (five ? 48 : 16);
      for (let c = 0; c < 4; c++) {
        const [sc1, m1i] = scaleMinK4(x, o + 4, 2 * c);
        const [sc2, m2i] = scaleMinK4(x, o + 4, 2 * c + 1);
        const d1 = fr(d * sc1);
        const m1 = fr(dmin * m1i);
        const d2 = fr(d * sc2);
        const m2 = fr(dmin * m2i);
        for (let l = 0; l < 32; l++) {
          const q = x[qs + 32 * c + l]!;
          const h = five ? x[qh + l]! : 0;
          const lo = (q & 0xf) + 16 * ((h >> (2 * c)) & 1);
          const hi = (q >> 4) + 16 * ((h >> (2 * c + 1)) & 1);
          y[yo + 64 * c + l] = fr(fr(d1 * lo) - m1);
          y[yo + 64 * c + 32 + l] = fr(fr(d2 * hi) - m2);
        }
      }
      return;
    }
    case "Q6_K": {
      const d = f16ToF32(u16(x, o + 208));
      for (let n = 0; n < 2; n++) {
        const ql = o + 64 * n;
        const qh = o + 128 + 32 * n;
        const sc = o + 192 + 8 * n;
        for (let l = 0; l < 32; l++) {
          const is = l >> 4;
          const h = x[qh + l]!;
          const q1 = ((x[ql + l]! & 0xf) | (((h >> 0) & 3) << 4)) - 32;
          const q2 = ((x[ql + l + 32]! & 0xf) | (((h >> 2) & 3) << 4)) - 32;
          const q3 = ((x[ql + l]! >> 4) | (((h >> 4) & 3) << 4)) - 32;
          const q4 = ((x[ql + l + 32]! >> 4) | (((h >> 6) & 3) << 4)) - 32;
          // ggml evaluates `d * sc[is] * q` left to right in f32.
          y[yo + 128 * n + l] = fr(fr(d * i8(x[sc + is]!)) * q1);
          y[yo + 128 * n + l + 32] = fr(fr(d * i8(x[sc + is + 2]!)) * q2);
          y[yo + 128 * n + l + 64] = fr(fr(d * i8(x[sc + is + 4]!)) * q3);
          y[yo + 128 * n + l + 96] = fr(fr(d * i8(x[sc + is + 6]!)) * q4);
        }
      }
      return;
    }
    default: {
      const never: never = type;
      throw new TypeError(`Unsupported ggml type ${String(never)}`);
    }
  }
}

/**
 * `get_scale_min_k4`: the 6-bit scale and min of sub-block `j` (0..7) from the 12 packed bytes at `o`.
 * @returns [scale, min]
 */
export function scaleMinK4(x: Uint8Array, o: number, j: number): [number, number] {
  if (j < 4) return [x[o + j]! & 63, x[o + j + 4]! & 63];
  return [
    (x[o + j + 4]! & 0xf) | ((x[o + j - 4]! >> 6) << 4),
    (x[o + j + 4]! >> 4) | ((x[o + j]! >> 6) << 4),
  ];
}

function u16(x: Uint8Array, o: number): number {
  return x[o]! | (x[o + 1]! << 8);
}

function i8(b: number): number {
  return (b << 24) >> 24;
}
