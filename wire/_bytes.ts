/**
 * The byte-level pieces every frame codec shares: op codes, the receiver's limits, row and u32 writers and
 * readers, and the bounds-checked payload reader whose failures are specific WireErrors. Private to wire/.
 * @module
 */
import { f16BitsToF32, f32ToF16Bits } from "./_f16.ts";
import { WireError } from "./errors.ts";
import type { HiddenDtype } from "./hello.ts";

/** Op codes (docs/WIRE.md "Ops"). */
export const OP = {
  hello: 0x01,
  hello_ack: 0x02,
  hello_refuse: 0x03,
  auth: 0x04,
  ready: 0x05,
  run: 0x10,
  run_result: 0x11,
  run_batch: 0x12,
  snapshot_save: 0x20,
  snapshot_restore: 0x21,
  snapshot_drop: 0x22,
  reset: 0x23,
  done: 0x24,
  ping: 0x30,
  pong: 0x31,
  close: 0x3e,
  error: 0x3f,
} as const;

/** An op name. */
export type OpName = keyof typeof OP;

export const DTYPES: readonly HiddenDtype[] = ["f32", "f16"];

/** What the receiver accepts; frames beyond these are refused with `out_of_range` or `oversize`. */
export interface FrameLimits {
  /** Largest frame, header included. */
  readonly maxFrameBytes: number;
  /** Slots: a slot must be below this. */
  readonly nSlots: number;
  /** Row width every RUN and hidden RUN_RESULT must have. */
  readonly nEmbd: number;
  /** Context: `basePos + nRows` must not exceed it. */
  readonly nCtx: number;
  /** Most rows in a RUN, and ids or rows in a RUN_RESULT. */
  readonly maxRows: number;
  /** Most drafts in a RUN. */
  readonly maxDraft: number;
  /** Most (id, logit) pairs per id. */
  readonly maxTopK: number;
}

export const UTF8_ENC = new TextEncoder();

export const UTF8_DEC = new TextDecoder("utf-8", { fatal: true });

export const LITTLE_ENDIAN_HOST = new Uint8Array(new Uint16Array([1]).buffer)[0] === 1;

/** Bytes of the rows of `rows` in `dtype`. */
export function rowBytes(nElems: number, dtype: HiddenDtype): number {
  return nElems * (dtype === "f32" ? 4 : 2);
}

export function writeRows(dv: DataView, at: number, rows: Float32Array, dtype: HiddenDtype): number {
  if (dtype === "f32") {
    if (LITTLE_ENDIAN_HOST) {
      new Uint8Array(dv.buffer, dv.byteOffset + at, rows.length * 4).set(
        new Uint8Array(rows.buffer, rows.byteOffset, rows.length * 4),
      );
    } else {
      for (let i = 0; i < rows.length; i++) dv.setFloat32(at + 4 * i, rows[i]!, true);
    }
    return at + rows.length * 4;
  }
  for (let i = 0; i < rows.length; i++) dv.setUint16(at + 2 * i, f32ToF16Bits(rows[i]!), true);
  return at + rows.length * 2;
}

export function writeU32s(dv: DataView, at: number, xs: Uint32Array): number {
  for (let i = 0; i < xs.length; i++) dv.setUint32(at + 4 * i, xs[i]!, true);
  return at + 4 * xs.length;
}

export function checkEncode(cond: boolean, what: string): void {
  if (!cond) throw new RangeError(`Cannot encode frame: ${what}`);
}

export function u32ok(n: number): boolean {
  return Number.isInteger(n) && n >= 0 && n <= 0xffff_ffff;
}

/** Bounds-checked little-endian reader over one payload. */
export class Reader {
  readonly dv: DataView;
  readonly bytes: Uint8Array;
  readonly op: OpName;
  constructor(bytes: Uint8Array, op: OpName) {
    this.bytes = bytes;
    this.dv = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength);
    this.op = op;
  }
  get length(): number {
    return this.bytes.length;
  }
  need(n: number, what: string): void {
    if (this.bytes.length < n) {
      throw new WireError(
        "short_payload",
        `Frame ${this.op}: payload of ${this.bytes.length} bytes is shorter than the ${n} bytes of its ${what}`,
      );
    }
  }
  exact(n: number, what: string): void {
    if (this.bytes.length !== n) {
      throw new WireError(
        "bad_length",
        `Frame ${this.op}: payload is ${this.bytes.length} bytes but ${what} make ${n} bytes`,
      );
    }
  }
  zero(at: number, n: number): void {
    for (let i = at; i < at + n; i++) {
      if (this.bytes[i] !== 0) {
        throw new WireError(
          "bad_flags",
          `Frame ${this.op}: reserved byte ${i} of the payload is ${this.bytes[i]}, not 0`,
        );
      }
    }
  }
}

export function range(op: OpName, field: string, v: number, lo: number, hi: number, hint: string): void {
  if (!(v >= lo && v <= hi)) {
    throw new WireError("out_of_range", `Frame ${op}: ${field} ${v} is outside [${lo}, ${hi}]: ${hint}`);
  }
}

export function badValue(op: OpName, field: string, v: unknown, expected: string): WireError {
  return new WireError("bad_value", `Frame ${op}: ${field} is ${v} but must be ${expected}`);
}

export function readRows(r: Reader, at: number, n: number, dtype: HiddenDtype): Float32Array {
  if (dtype === "f32") {
    const abs = r.bytes.byteOffset + at;
    if (LITTLE_ENDIAN_HOST && abs % 4 === 0) return new Float32Array(r.bytes.buffer, abs, n);
    const out = new Float32Array(n);
    for (let i = 0; i < n; i++) out[i] = r.dv.getFloat32(at + 4 * i, true);
    return out;
  }
  const out = new Float32Array(n);
  for (let i = 0; i < n; i++) out[i] = f16BitsToF32(r.dv.getUint16(at + 2 * i, true));
  return out;
}

export function readU32s(r: Reader, at: number, n: number): Uint32Array {
  const out = new Uint32Array(n);
  for (let i = 0; i < n; i++) out[i] = r.dv.getUint32(at + 4 * i, true);
  return out;
}
