/**
 * Binary frames of the stage link (docs/WIRE.md is the spec; the tables here are its summary): a 16-byte
 * little-endian header, then an op-specific payload. {@linkcode encodeFrame} writes one frame,
 * {@linkcode decodeFrame} reads one, and {@linkcode FrameDecoder} cuts a byte stream into frames.
 *
 * Header (16 bytes, little-endian):
 *
 * | offset | type | field |
 * | --- | --- | --- |
 * | 0 | u32 | magic `0x4D4C4C57` (bytes `W L L M`) |
 * | 4 | u32 | payload length in bytes (header excluded) |
 * | 8 | u8 | op ({@linkcode OP}) |
 * | 9 | u8 | flags (none defined: must be 0) |
 * | 10 | u16 | reserved, 0 |
 * | 12 | u32 | request id (a reply carries its request's id; 0 for connection-level frames) |
 *
 * Every decode validates before it allocates: the header's length against `maxFrameBytes` as soon as 16
 * bytes are in, each payload's fixed part, enumerations, counts against the receiver's
 * {@linkcode FrameLimits}, then the exact length. Any fault is a {@linkcode WireError} with its code; no
 * other exception leaves this module for any input bytes.
 *
 * @example
 * ```ts
 * import { encodeFrame, FrameDecoder, type FrameLimits } from "./frame.ts";
 * declare const limits: FrameLimits;
 * const bytes = encodeFrame({ op: "ping", id: 7, sentMs: 1 });
 * const frames = new FrameDecoder(limits).push(bytes); // [{ op: "ping", id: 7, sentMs: 1 }]
 * ```
 * @module
 */
import { f16BitsToF32, f32ToF16Bits } from "./_f16.ts";
import { WIRE_ERROR_CODES, WireError, type WireErrorCode, wireErrorCodeOf } from "./errors.ts";
import { type HelloInfo, type HiddenDtype, parseHelloInfo, PROTOCOL_VERSION } from "./hello.ts";

/** The frame magic as a little-endian u32: the bytes `W L L M`. */
export const FRAME_MAGIC = 0x4d4c4c57;
/** Bytes of the frame header. */
export const HEADER_BYTES = 16;
/** Default largest frame: 64 MiB holds 2048 rows of width 8192 in f32. */
export const DEFAULT_MAX_FRAME_BYTES = 64 * 2 ** 20;
/** Largest UTF-8 message in a HELLO_REFUSE, CLOSE or ERROR frame. */
export const MAX_MESSAGE_BYTES = 4096;
/** Largest penalty history in a RUN (the sampler's window). */
export const MAX_HISTORY = 256;
/** Most per-stage times in a RUN_RESULT. */
export const MAX_TIMES = 16;
/** Bytes of a hello nonce. */
export const NONCE_BYTES = 32;
/** Bytes of an authentication proof (HMAC-SHA256). */
export const PROOF_BYTES = 32;

/** Op codes (docs/WIRE.md "Ops"). */
export const OP = {
  hello: 0x01,
  hello_ack: 0x02,
  hello_refuse: 0x03,
  auth: 0x04,
  ready: 0x05,
  run: 0x10,
  run_result: 0x11,
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

const OP_BY_CODE: ReadonlyMap<number, OpName> = new Map(
  Object.entries(OP).map(([k, v]) => [v, k as OpName]),
);

/** What a RUN asks back: nothing, the last hidden row, every hidden row, or sampled ids (+ top-k). */
export type RunWant = "none" | "last" | "all" | "ids";
const WANTS: readonly RunWant[] = ["none", "last", "all", "ids"];
const DTYPES: readonly HiddenDtype[] = ["f32", "f16"];

/**
 * Sampling settings a RUN carries to the last stage, so that it samples exactly as the unsplit engine
 * would. Floats travel as f64: the JS values arrive unchanged.
 */
export interface WireSampling {
  /** Softmax temperature; 0 = greedy. */
  readonly temperature: number;
  /** Keep the k most likely ids; 0 = all. */
  readonly topK: number;
  /** Nucleus threshold; 1 = off. */
  readonly topP: number;
  /** Min-p threshold; 0 = off. */
  readonly minP: number;
  /** Repeat penalty; 1 = off. */
  readonly repeatPenalty: number;
  /** Presence penalty; 0 = off. */
  readonly presencePenalty: number;
  /** Frequency penalty; 0 = off. */
  readonly frequencyPenalty: number;
  /** Penalty window: 0 none, -1 all kept. */
  readonly penaltyLastN: number;
  /** Seed of the request's random stream, an integer in [0, 2^53). */
  readonly seed: number;
  /** RNG step of the first id this frame produces (the request's count of ids drawn so far). */
  readonly step: number;
  /**
   * When present, replaces the slot's penalty history (oldest first) before this frame; absent, the stage
   * keeps the history it has (it appends every id it produces).
   */
  readonly history?: Uint32Array;
}

/**
 * One RUN: `nRows` hidden rows of the previous stage's output for `slot` at positions
 * `basePos .. basePos + nRows - 1`.
 */
export interface RunRequest {
  /** Sequence slot, < the receiver's nSlots. */
  readonly slot: number;
  /** Position of the first row. */
  readonly basePos: number;
  /** Row width (must equal the receiver's nEmbd). */
  readonly nEmbd: number;
  /** The rows, `nRows × nEmbd` f32 (row-major); `nRows = rows.length / nEmbd`. */
  readonly rows: Float32Array;
  /** How the rows travel: `f32` exact, `f16` rounded to nearest (docs/WIRE.md "Hidden rows"). */
  readonly dtype: HiddenDtype;
  /** What the chain returns. */
  readonly want: RunWant;
  /** (id, logit) pairs wanted per id, with `want: "ids"` (0 otherwise). */
  readonly topK: number;
  /**
   * Draft ids: the last `drafts.length + 1` rows each produce an id; `drafts[j]` is the token fed at row
   * `nRows - drafts.length + j`, the head's guess for the id produced at the row before it.
   */
  readonly drafts: Uint32Array;
  /** Sampling settings for a last stage (absent: greedy argmax, ties to the lowest id). */
  readonly sampling?: WireSampling;
}

/** What a RUN returns. `timesUs` lists each stage's own compute time in µs, nearest stage first. */
export type RunResult =
  | { readonly kind: "none"; readonly timesUs: readonly number[] }
  | {
    readonly kind: "hidden";
    /** Rows `nRows × nEmbd` f32. */
    readonly rows: Float32Array;
    /** Row width. */
    readonly nEmbd: number;
    /** How the rows travel. */
    readonly dtype: HiddenDtype;
    readonly timesUs: readonly number[];
  }
  | {
    readonly kind: "ids";
    /** One id per producing row (1 + drafts). */
    readonly ids: Uint32Array;
    /** Pairs per id. */
    readonly topK: number;
    /** `ids.length × topK` candidate ids, best first per id. */
    readonly topIds: Uint32Array;
    /** Their logits (f32, as the LM head wrote them). */
    readonly topLogits: Float32Array;
    readonly timesUs: readonly number[];
  };

/** HELLO and HELLO_ACK content. */
export interface Hello {
  /** True when this side has a link key and will prove it. */
  readonly auth: boolean;
  /** 32 fresh random bytes (the challenge the other side's proof covers). */
  readonly nonce: Uint8Array;
  /** The stage description. */
  readonly info: HelloInfo;
  /** The payload bytes as received (set by the decoder, ignored by the encoder): the auth transcript covers them. */
  readonly payload?: Uint8Array;
}

/** HELLO_REFUSE, CLOSE and ERROR content. */
export interface Reason {
  /** Stable code. */
  readonly code: WireErrorCode;
  /** Human message (at most {@linkcode MAX_MESSAGE_BYTES} UTF-8 bytes; longer ones are cut on encode). */
  readonly message: string;
}

/** One decoded frame: its op, request id and content. */
export type Frame =
  | { readonly op: "hello" | "hello_ack"; readonly id: number; readonly hello: Hello }
  | { readonly op: "hello_refuse" | "close" | "error"; readonly id: number; readonly reason: Reason }
  | { readonly op: "auth" | "ready"; readonly id: number; readonly proof: Uint8Array }
  | { readonly op: "run"; readonly id: number; readonly run: RunRequest }
  | { readonly op: "run_result"; readonly id: number; readonly result: RunResult }
  | { readonly op: "snapshot_save" | "reset"; readonly id: number; readonly slot: number }
  | {
    readonly op: "snapshot_restore";
    readonly id: number;
    readonly snapshotId: number;
    readonly slot: number;
  }
  | { readonly op: "snapshot_drop"; readonly id: number; readonly snapshotId: number }
  | { readonly op: "done"; readonly id: number; readonly value: number }
  | { readonly op: "ping" | "pong"; readonly id: number; readonly sentMs: number };

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

/** The limits a side with hello `h` decodes with (its own hello: what it told the peer it accepts). */
export function limitsOf(h: HelloInfo): FrameLimits {
  return {
    maxFrameBytes: h.limits.maxFrameBytes,
    nSlots: h.nSlots,
    nEmbd: h.nEmbd,
    nCtx: h.nCtx,
    maxRows: h.limits.maxRows,
    maxDraft: h.limits.maxDraft,
    maxTopK: h.limits.maxTopK,
  };
}

const UTF8_ENC = new TextEncoder();
const UTF8_DEC = new TextDecoder("utf-8", { fatal: true });
const LITTLE_ENDIAN_HOST = new Uint8Array(new Uint16Array([1]).buffer)[0] === 1;

// ---------------------------------------------------------------------------------------------------------
// Encoding

/** Bytes of the rows of `rows` in `dtype`. */
function rowBytes(nElems: number, dtype: HiddenDtype): number {
  return nElems * (dtype === "f32" ? 4 : 2);
}

function writeRows(dv: DataView, at: number, rows: Float32Array, dtype: HiddenDtype): number {
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

function writeU32s(dv: DataView, at: number, xs: Uint32Array): number {
  for (let i = 0; i < xs.length; i++) dv.setUint32(at + 4 * i, xs[i]!, true);
  return at + 4 * xs.length;
}

function encodeMessage(message: string): Uint8Array {
  const bytes = UTF8_ENC.encode(message);
  if (bytes.length <= MAX_MESSAGE_BYTES) return bytes;
  // Cut on a character boundary: drop continuation bytes (10xxxxxx) at the cut.
  let end = MAX_MESSAGE_BYTES;
  while (end > 0 && (bytes[end]! & 0xc0) === 0x80) end--;
  return bytes.subarray(0, end);
}

function checkEncode(cond: boolean, what: string): void {
  if (!cond) throw new RangeError(`Cannot encode frame: ${what}`);
}

function u32ok(n: number): boolean {
  return Number.isInteger(n) && n >= 0 && n <= 0xffff_ffff;
}

/** Payload of each op (without header). */
function encodePayload(f: Frame): Uint8Array {
  switch (f.op) {
    case "hello":
    case "hello_ack": {
      const json = UTF8_ENC.encode(JSON.stringify(f.hello.info));
      checkEncode(f.hello.nonce.length === NONCE_BYTES, `hello nonce has ${f.hello.nonce.length} bytes`);
      const out = new Uint8Array(4 + NONCE_BYTES + json.length);
      const dv = new DataView(out.buffer);
      dv.setUint16(0, f.hello.info.protocol, true);
      out[2] = f.hello.auth ? 1 : 0;
      out.set(f.hello.nonce, 4);
      out.set(json, 4 + NONCE_BYTES);
      return out;
    }
    case "hello_refuse":
    case "close":
    case "error": {
      const msg = encodeMessage(f.reason.message);
      const out = new Uint8Array(4 + msg.length);
      new DataView(out.buffer).setUint16(0, WIRE_ERROR_CODES[f.reason.code], true);
      out.set(msg, 4);
      return out;
    }
    case "auth":
    case "ready":
      checkEncode(
        f.proof.length === 0 || f.proof.length === PROOF_BYTES,
        `proof has ${f.proof.length} bytes`,
      );
      return f.proof.slice();
    case "run":
      return encodeRun(f.run);
    case "run_result":
      return encodeResult(f.result);
    case "snapshot_save":
    case "reset": {
      checkEncode(Number.isInteger(f.slot) && f.slot >= 0 && f.slot <= 0xffff, `slot ${f.slot}`);
      const out = new Uint8Array(4);
      new DataView(out.buffer).setUint16(0, f.slot, true);
      return out;
    }
    case "snapshot_restore": {
      checkEncode(u32ok(f.snapshotId) && Number.isInteger(f.slot) && f.slot >= 0 && f.slot <= 0xffff, "ids");
      const out = new Uint8Array(8);
      const dv = new DataView(out.buffer);
      dv.setUint32(0, f.snapshotId, true);
      dv.setUint16(4, f.slot, true);
      return out;
    }
    case "snapshot_drop":
    case "done": {
      const v = f.op === "done" ? f.value : f.snapshotId;
      checkEncode(u32ok(v), `value ${v}`);
      const out = new Uint8Array(4);
      new DataView(out.buffer).setUint32(0, v, true);
      return out;
    }
    case "ping":
    case "pong": {
      const out = new Uint8Array(8);
      new DataView(out.buffer).setFloat64(0, f.sentMs, true);
      return out;
    }
    default: {
      const never: never = f;
      throw new Error(`Internal error: unhandled op ${(never as Frame).op}`);
    }
  }
}

/** Fixed part of a RUN payload, and of its sampling block. */
const RUN_FIXED = 24;
const SAMPLING_BYTES = 72;
const SAMPLING_FLAG = 1;
const HISTORY_FLAG = 2;

function encodeRun(r: RunRequest): Uint8Array {
  checkEncode(Number.isInteger(r.nEmbd) && r.nEmbd > 0, `nEmbd ${r.nEmbd}`);
  checkEncode(
    r.rows.length % r.nEmbd === 0 && r.rows.length > 0,
    `${r.rows.length} values for nEmbd ${r.nEmbd}`,
  );
  const nRows = r.rows.length / r.nEmbd;
  checkEncode(
    r.drafts.length <= 0xffff && r.drafts.length < nRows,
    `${r.drafts.length} drafts for ${nRows} rows`,
  );
  checkEncode(Number.isInteger(r.topK) && r.topK >= 0 && r.topK <= 0xffff, `topK ${r.topK}`);
  checkEncode(Number.isInteger(r.slot) && r.slot >= 0 && r.slot <= 0xffff, `slot ${r.slot}`);
  checkEncode(u32ok(r.basePos), `basePos ${r.basePos}`);
  const s = r.sampling;
  const hist = s?.history;
  checkEncode(!hist || hist.length <= MAX_HISTORY, `history of ${hist?.length} ids`);
  const size = RUN_FIXED + (s ? SAMPLING_BYTES + 4 * (hist?.length ?? 0) : 0) + 4 * r.drafts.length +
    rowBytes(r.rows.length, r.dtype);
  const out = new Uint8Array(size);
  const dv = new DataView(out.buffer);
  dv.setUint16(0, r.slot, true);
  out[2] = WANTS.indexOf(r.want);
  out[3] = DTYPES.indexOf(r.dtype);
  dv.setUint32(4, nRows, true);
  dv.setUint32(8, r.basePos, true);
  dv.setUint32(12, r.nEmbd, true);
  dv.setUint16(16, r.drafts.length, true);
  dv.setUint16(18, r.topK, true);
  out[20] = (s ? SAMPLING_FLAG : 0) | (hist ? HISTORY_FLAG : 0);
  let at = RUN_FIXED;
  if (s) {
    checkEncode(Number.isSafeInteger(s.seed) && s.seed >= 0, `seed ${s.seed}`);
    checkEncode(u32ok(s.topK) && u32ok(s.step), `sampler topK ${s.topK} / step ${s.step}`);
    checkEncode(Number.isInteger(s.penaltyLastN) && s.penaltyLastN >= -1, `penaltyLastN ${s.penaltyLastN}`);
    dv.setFloat64(at, s.temperature, true);
    dv.setFloat64(at + 8, s.topP, true);
    dv.setFloat64(at + 16, s.minP, true);
    dv.setFloat64(at + 24, s.repeatPenalty, true);
    dv.setFloat64(at + 32, s.presencePenalty, true);
    dv.setFloat64(at + 40, s.frequencyPenalty, true);
    dv.setBigUint64(at + 48, BigInt(s.seed), true);
    dv.setUint32(at + 56, s.topK, true);
    dv.setInt32(at + 60, s.penaltyLastN, true);
    dv.setUint32(at + 64, s.step, true);
    dv.setUint32(at + 68, hist?.length ?? 0, true);
    at = writeU32s(dv, at + SAMPLING_BYTES, hist ?? new Uint32Array(0));
  }
  at = writeU32s(dv, at, r.drafts);
  writeRows(dv, at, r.rows, r.dtype);
  return out;
}

const RESULT_FIXED = 16;
const RESULT_KINDS = ["none", "hidden", "ids"] as const;

function encodeResult(r: RunResult): Uint8Array {
  checkEncode(r.timesUs.length <= MAX_TIMES && r.timesUs.every(u32ok), `timesUs ${r.timesUs}`);
  let n = 0, nEmbd = 0, topK = 0, body = 0, dtype: HiddenDtype = "f32";
  switch (r.kind) {
    case "none":
      break;
    case "hidden":
      checkEncode(
        r.nEmbd > 0 && r.rows.length % r.nEmbd === 0,
        `${r.rows.length} values for nEmbd ${r.nEmbd}`,
      );
      n = r.rows.length / r.nEmbd;
      nEmbd = r.nEmbd;
      dtype = r.dtype;
      body = rowBytes(r.rows.length, r.dtype);
      break;
    case "ids":
      n = r.ids.length;
      topK = r.topK;
      checkEncode(topK >= 0 && topK <= 0xffff, `topK ${topK}`);
      checkEncode(r.topIds.length === n * topK && r.topLogits.length === n * topK, "top-k arrays");
      body = 4 * n + 8 * n * topK;
      break;
    default: {
      const never: never = r;
      throw new Error(`Internal error: unhandled result ${(never as RunResult).kind}`);
    }
  }
  const out = new Uint8Array(RESULT_FIXED + 4 * r.timesUs.length + body);
  const dv = new DataView(out.buffer);
  out[0] = RESULT_KINDS.indexOf(r.kind);
  out[1] = DTYPES.indexOf(dtype);
  out[2] = r.timesUs.length;
  dv.setUint32(4, n, true);
  dv.setUint32(8, nEmbd, true);
  dv.setUint16(12, topK, true);
  let at = RESULT_FIXED;
  for (const t of r.timesUs) {
    dv.setUint32(at, t, true);
    at += 4;
  }
  if (r.kind === "hidden") writeRows(dv, at, r.rows, r.dtype);
  if (r.kind === "ids") {
    at = writeU32s(dv, at, r.ids);
    for (let i = 0; i < n * topK; i++) {
      dv.setUint32(at, r.topIds[i]!, true);
      dv.setFloat32(at + 4, r.topLogits[i]!, true);
      at += 8;
    }
  }
  return out;
}

/**
 * Encodes one frame (header + payload).
 * @throws {RangeError} when a field cannot be represented (a slot above 65535, rows not a multiple of
 *   nEmbd, a wrong nonce length): a bug in the caller, never the peer's fault
 */
export function encodeFrame(f: Frame): Uint8Array {
  checkEncode(u32ok(f.id), `request id ${f.id}`);
  const payload = encodePayload(f);
  const out = new Uint8Array(HEADER_BYTES + payload.length);
  const dv = new DataView(out.buffer);
  dv.setUint32(0, FRAME_MAGIC, true);
  dv.setUint32(4, payload.length, true);
  out[8] = OP[f.op];
  dv.setUint32(12, f.id, true);
  out.set(payload, HEADER_BYTES);
  return out;
}

// ---------------------------------------------------------------------------------------------------------
// Decoding

/** A parsed frame header. */
export interface FrameHeader {
  /** Op name. */
  readonly op: OpName;
  /** Payload length in bytes. */
  readonly length: number;
  /** Request id. */
  readonly id: number;
}

/**
 * Validates the 16 header bytes at `bytes[0..16)`: magic, length against `maxFrameBytes`, op, flags and
 * reserved bytes.
 * @throws {WireError} `bad_magic`, `oversize`, `unknown_op` or `bad_flags`
 */
export function decodeHeader(bytes: Uint8Array, limits: Pick<FrameLimits, "maxFrameBytes">): FrameHeader {
  const dv = new DataView(bytes.buffer, bytes.byteOffset, HEADER_BYTES);
  const magic = dv.getUint32(0, true);
  if (magic !== FRAME_MAGIC) {
    throw new WireError(
      "bad_magic",
      `Frame magic is 0x${magic.toString(16).padStart(8, "0")} but must be 0x${FRAME_MAGIC.toString(16)} ` +
        `("WLLM"): the peer is not a stage link (wrong port?) or the stream lost sync`,
    );
  }
  const length = dv.getUint32(4, true);
  if (length + HEADER_BYTES > limits.maxFrameBytes) {
    throw new WireError(
      "oversize",
      `Frame of ${length + HEADER_BYTES} bytes exceeds the maximum frame size of ${limits.maxFrameBytes} ` +
        `bytes: send fewer rows per frame`,
    );
  }
  const code = bytes[8]!;
  const op = OP_BY_CODE.get(code);
  if (op === undefined) {
    throw new WireError(
      "unknown_op",
      `Frame op 0x${code.toString(16).padStart(2, "0")} is not an op of wire protocol ${PROTOCOL_VERSION}: ` +
        `run the same build on every box`,
    );
  }
  if (bytes[9] !== 0 || dv.getUint16(10, true) !== 0) {
    throw new WireError(
      "bad_flags",
      `Frame ${op} has flags 0x${bytes[9]!.toString(16)} and reserved 0x${
        dv.getUint16(10, true).toString(16)
      } ` +
        `but both must be 0 in protocol ${PROTOCOL_VERSION}: run the same build on every box`,
    );
  }
  return { op, length, id: dv.getUint32(12, true) };
}

/** Bounds-checked little-endian reader over one payload. */
class Reader {
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

function range(op: OpName, field: string, v: number, lo: number, hi: number, hint: string): void {
  if (!(v >= lo && v <= hi)) {
    throw new WireError("out_of_range", `Frame ${op}: ${field} ${v} is outside [${lo}, ${hi}]: ${hint}`);
  }
}

function badValue(op: OpName, field: string, v: unknown, expected: string): WireError {
  return new WireError("bad_value", `Frame ${op}: ${field} is ${v} but must be ${expected}`);
}

function readRows(r: Reader, at: number, n: number, dtype: HiddenDtype): Float32Array {
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

function readU32s(r: Reader, at: number, n: number): Uint32Array {
  const out = new Uint32Array(n);
  for (let i = 0; i < n; i++) out[i] = r.dv.getUint32(at + 4 * i, true);
  return out;
}

function decodeHello(r: Reader): Hello {
  r.need(4 + NONCE_BYTES + 2, "protocol, auth flag, nonce and JSON");
  const protocol = r.dv.getUint16(0, true);
  if (protocol !== PROTOCOL_VERSION) {
    throw new WireError(
      "refused",
      `Wire protocol differs: the peer speaks version ${protocol} but this side speaks version ` +
        `${PROTOCOL_VERSION}: run the same build on every box`,
    );
  }
  const auth = r.bytes[2]!;
  if (auth > 1) throw badValue(r.op, "auth flag", auth, "0 or 1");
  r.zero(3, 1);
  let json: unknown;
  try {
    json = JSON.parse(UTF8_DEC.decode(r.bytes.subarray(4 + NONCE_BYTES)));
  } catch (e) {
    throw new WireError(
      "bad_hello",
      `Frame ${r.op}: the hello is not valid UTF-8 JSON (${e}): run the same build on every box`,
      {
        cause: e,
      },
    );
  }
  const info = parseHelloInfo(json, "the peer");
  if (info.protocol !== protocol) {
    throw new WireError(
      "bad_hello",
      `Frame ${r.op}: header protocol ${protocol} but the hello JSON says ${info.protocol}`,
    );
  }
  return { auth: auth === 1, nonce: r.bytes.slice(4, 4 + NONCE_BYTES), info, payload: r.bytes.slice() };
}

function decodeReason(r: Reader): Reason {
  r.need(4, "code");
  const n = r.dv.getUint16(0, true);
  const code = wireErrorCodeOf(n);
  if (code === undefined) throw badValue(r.op, "error code", n, 'a code of docs/WIRE.md "Error codes"');
  r.zero(2, 2);
  const len = r.length - 4;
  range(r.op, "message length", len, 0, MAX_MESSAGE_BYTES, "the peer sent an overlong message");
  let message: string;
  try {
    message = UTF8_DEC.decode(r.bytes.subarray(4));
  } catch {
    throw badValue(r.op, "message", "not UTF-8", "UTF-8 text");
  }
  return { code, message };
}

function decodeRun(r: Reader, lim: FrameLimits): RunRequest {
  const op = r.op;
  r.need(RUN_FIXED, "fixed fields");
  const dv = r.dv;
  const slot = dv.getUint16(0, true);
  const want = WANTS[r.bytes[2]!];
  if (want === undefined) throw badValue(op, "want", r.bytes[2], "0 none, 1 last, 2 all or 3 ids");
  const dtype = DTYPES[r.bytes[3]!];
  if (dtype === undefined) throw badValue(op, "dtype", r.bytes[3], "0 f32 or 1 f16");
  const nRows = dv.getUint32(4, true);
  const basePos = dv.getUint32(8, true);
  const nEmbd = dv.getUint32(12, true);
  const nDraft = dv.getUint16(16, true);
  const topK = dv.getUint16(18, true);
  const flags = r.bytes[20]!;
  if ((flags & ~(SAMPLING_FLAG | HISTORY_FLAG)) !== 0 || flags === HISTORY_FLAG) {
    throw badValue(op, "sampling flags", flags, "0, 1 (sampling) or 3 (sampling with history)");
  }
  r.zero(21, 3);
  range(op, "slot", slot, 0, lim.nSlots - 1, "the receiver has fewer slots");
  range(op, "nRows", nRows, 1, lim.maxRows, "send fewer rows per frame");
  if (nEmbd !== lim.nEmbd) throw badValue(op, "nEmbd", nEmbd, `the receiver's width ${lim.nEmbd}`);
  range(op, "basePos + nRows", basePos + nRows, 1, lim.nCtx, "the context of the receiver is smaller");
  range(op, "nDraft", nDraft, 0, Math.min(lim.maxDraft, nRows - 1), "fewer drafts, and fewer than the rows");
  range(op, "topK", topK, 0, want === "ids" ? lim.maxTopK : 0, "top-k pairs come only with ids");
  let at = RUN_FIXED;
  let sampling: WireSampling | undefined;
  if (flags & SAMPLING_FLAG) {
    if (want !== "ids") throw badValue(op, "sampling flags", flags, `0 when want is ${want}`);
    r.need(RUN_FIXED + SAMPLING_BYTES, "sampling block");
    const f = (o: number, name: string, lo: number, hi: number) => {
      const v = dv.getFloat64(at + o, true);
      if (!(v >= lo && v <= hi)) throw badValue(op, name, v, `a number in [${lo}, ${hi}]`);
      return v;
    };
    const temperature = f(0, "temperature", 0, 1e6);
    const topP = f(8, "topP", 0, 1);
    const minP = f(16, "minP", 0, 1);
    const repeatPenalty = f(24, "repeatPenalty", 0, 1e6);
    const presencePenalty = f(32, "presencePenalty", -1e6, 1e6);
    const frequencyPenalty = f(40, "frequencyPenalty", -1e6, 1e6);
    const seed = dv.getBigUint64(at + 48, true);
    if (seed > BigInt(Number.MAX_SAFE_INTEGER)) throw badValue(op, "seed", seed, "below 2^53");
    const sTopK = dv.getUint32(at + 56, true);
    const penaltyLastN = dv.getInt32(at + 60, true);
    if (penaltyLastN < -1) throw badValue(op, "penaltyLastN", penaltyLastN, "-1 or more");
    const step = dv.getUint32(at + 64, true);
    const nHistory = dv.getUint32(at + 68, true);
    if (!(flags & HISTORY_FLAG) && nHistory !== 0) {
      throw badValue(op, "nHistory", nHistory, "0 without the history flag");
    }
    range(op, "nHistory", nHistory, 0, MAX_HISTORY, "send at most the penalty window");
    at += SAMPLING_BYTES;
    r.need(at + 4 * nHistory, "history");
    const history = flags & HISTORY_FLAG ? readU32s(r, at, nHistory) : undefined;
    at += 4 * nHistory;
    sampling = {
      temperature,
      topK: sTopK,
      topP,
      minP,
      repeatPenalty,
      presencePenalty,
      frequencyPenalty,
      penaltyLastN,
      seed: Number(seed),
      step,
      ...(history ? { history } : {}),
    };
  }
  const total = at + 4 * nDraft + rowBytes(nRows * nEmbd, dtype);
  r.exact(total, `${nDraft} drafts and ${nRows} ${dtype} rows of width ${nEmbd}`);
  const drafts = readU32s(r, at, nDraft);
  at += 4 * nDraft;
  const rows = readRows(r, at, nRows * nEmbd, dtype);
  return { slot, basePos, nEmbd, rows, dtype, want, topK, drafts, ...(sampling ? { sampling } : {}) };
}

function decodeResult(r: Reader, lim: FrameLimits): RunResult {
  const op = r.op;
  r.need(RESULT_FIXED, "fixed fields");
  const dv = r.dv;
  const kind = RESULT_KINDS[r.bytes[0]!];
  if (kind === undefined) throw badValue(op, "kind", r.bytes[0], "0 none, 1 hidden or 2 ids");
  const dtype = DTYPES[r.bytes[1]!];
  if (dtype === undefined || (kind !== "hidden" && dtype !== "f32")) {
    throw badValue(op, "dtype", r.bytes[1], kind === "hidden" ? "0 f32 or 1 f16" : "0");
  }
  const nTimes = r.bytes[2]!;
  range(op, "nTimes", nTimes, 0, MAX_TIMES, "a chain of at most 16 stages");
  r.zero(3, 1);
  const n = dv.getUint32(4, true);
  const nEmbd = dv.getUint32(8, true);
  const topK = dv.getUint16(12, true);
  r.zero(14, 2);
  r.need(RESULT_FIXED + 4 * nTimes, "stage times");
  const timesUs = Array.from(readU32s(r, RESULT_FIXED, nTimes));
  const at = RESULT_FIXED + 4 * nTimes;
  switch (kind) {
    case "none":
      if (n !== 0 || nEmbd !== 0 || topK !== 0) {
        throw badValue(op, "n/nEmbd/topK", `${n}/${nEmbd}/${topK}`, "0 for kind none");
      }
      r.exact(at, "no rows");
      return { kind, timesUs };
    case "hidden": {
      range(op, "nRows", n, 1, lim.maxRows, "the peer returned more rows than asked");
      if (nEmbd !== lim.nEmbd) throw badValue(op, "nEmbd", nEmbd, `this side's width ${lim.nEmbd}`);
      if (topK !== 0) throw badValue(op, "topK", topK, "0 for hidden rows");
      r.exact(at + rowBytes(n * nEmbd, dtype), `${n} ${dtype} rows of width ${nEmbd}`);
      return { kind, rows: readRows(r, at, n * nEmbd, dtype), nEmbd, dtype, timesUs };
    }
    case "ids": {
      range(op, "nIds", n, 1, lim.maxRows, "the peer returned more ids than rows asked");
      if (nEmbd !== 0) throw badValue(op, "nEmbd", nEmbd, "0 for ids");
      range(op, "topK", topK, 0, lim.maxTopK, "the peer returned more pairs than asked");
      r.exact(at + 4 * n + 8 * n * topK, `${n} ids with ${topK} pairs each`);
      const ids = readU32s(r, at, n);
      const topIds = new Uint32Array(n * topK);
      const topLogits = new Float32Array(n * topK);
      let p = at + 4 * n;
      for (let i = 0; i < n * topK; i++, p += 8) {
        topIds[i] = dv.getUint32(p, true);
        topLogits[i] = dv.getFloat32(p + 4, true);
      }
      return { kind, ids, topK, topIds, topLogits, timesUs };
    }
    default: {
      const never: never = kind;
      throw new Error(`Internal error: unhandled kind ${never}`);
    }
  }
}

/** Decodes the payload of a frame whose header was `h`. */
function decodePayload(h: FrameHeader, payload: Uint8Array, lim: FrameLimits): Frame {
  const r = new Reader(payload, h.op);
  const id = h.id;
  switch (h.op) {
    case "hello":
    case "hello_ack":
      return { op: h.op, id, hello: decodeHello(r) };
    case "hello_refuse":
    case "close":
    case "error":
      return { op: h.op, id, reason: decodeReason(r) };
    case "auth":
    case "ready":
      if (r.length !== 0 && r.length !== PROOF_BYTES) {
        r.need(PROOF_BYTES, "proof");
        r.exact(PROOF_BYTES, "a proof");
      }
      return { op: h.op, id, proof: payload.slice() };
    case "run":
      return { op: h.op, id, run: decodeRun(r, lim) };
    case "run_result":
      return { op: h.op, id, result: decodeResult(r, lim) };
    case "snapshot_save":
    case "reset": {
      r.need(4, "slot");
      r.exact(4, "slot and reserved");
      r.zero(2, 2);
      const slot = r.dv.getUint16(0, true);
      range(h.op, "slot", slot, 0, lim.nSlots - 1, "the receiver has fewer slots");
      return { op: h.op, id, slot };
    }
    case "snapshot_restore": {
      r.need(8, "snapshot id and slot");
      r.exact(8, "snapshot id, slot and reserved");
      r.zero(6, 2);
      const slot = r.dv.getUint16(4, true);
      range(h.op, "slot", slot, 0, lim.nSlots - 1, "the receiver has fewer slots");
      return { op: h.op, id, snapshotId: r.dv.getUint32(0, true), slot };
    }
    case "snapshot_drop":
      r.need(4, "snapshot id");
      r.exact(4, "snapshot id");
      return { op: h.op, id, snapshotId: r.dv.getUint32(0, true) };
    case "done":
      r.need(4, "value");
      r.exact(4, "value");
      return { op: h.op, id, value: r.dv.getUint32(0, true) };
    case "ping":
    case "pong":
      r.need(8, "timestamp");
      r.exact(8, "timestamp");
      return { op: h.op, id, sentMs: r.dv.getFloat64(0, true) };
    default: {
      const never: never = h.op;
      throw new Error(`Internal error: unhandled op ${never}`);
    }
  }
}

/**
 * Decodes exactly one whole frame.
 * @throws {WireError} for any malformed input (see {@linkcode WIRE_ERROR_CODES}); `truncated` when `bytes`
 *   is shorter than its header says, `bad_length` when longer
 */
export function decodeFrame(bytes: Uint8Array, limits: FrameLimits): Frame {
  if (bytes.length < HEADER_BYTES) {
    throw new WireError(
      "truncated",
      `Frame of ${bytes.length} bytes ends inside its ${HEADER_BYTES}-byte header`,
    );
  }
  const h = decodeHeader(bytes, limits);
  if (bytes.length !== HEADER_BYTES + h.length) {
    throw new WireError(
      bytes.length < HEADER_BYTES + h.length ? "truncated" : "bad_length",
      `Frame ${h.op} has ${bytes.length - HEADER_BYTES} payload bytes but its header says ${h.length}`,
    );
  }
  return decodePayload(h, bytes.subarray(HEADER_BYTES), limits);
}

/**
 * Cuts a byte stream into frames. Each header is checked as soon as its 16 bytes are in (so an oversize
 * length is refused before its payload is buffered); each payload is copied once into a buffer of its own
 * (decoded f32 rows are views of it). After a `WireError` the stream has lost sync: the decoder refuses all
 * further input, and the connection must be closed.
 */
export class FrameDecoder {
  readonly #limits: FrameLimits;
  #chunks: Uint8Array[] = [];
  #buffered = 0;
  #header: FrameHeader | undefined;
  #failed: WireError | undefined;

  /**
   * Creates a decoder for one connection.
   * @param limits what this side accepts (its own hello's limits: {@linkcode limitsOf})
   */
  constructor(limits: FrameLimits) {
    this.#limits = limits;
  }

  /** Bytes received but not yet returned as frames. */
  get buffered(): number {
    return this.#buffered;
  }

  /** True when no partial frame is buffered (a clean place for the stream to end). */
  get idle(): boolean {
    return this.#buffered === 0;
  }

  #take(n: number): Uint8Array {
    const out = new Uint8Array(n);
    let filled = 0;
    while (filled < n) {
      const c = this.#chunks[0]!;
      const k = Math.min(c.length, n - filled);
      out.set(c.subarray(0, k), filled);
      filled += k;
      if (k === c.length) this.#chunks.shift();
      else this.#chunks[0] = c.subarray(k);
    }
    this.#buffered -= n;
    return out;
  }

  /**
   * Adds `chunk` (the decoder keeps a reference until it is consumed: do not reuse the buffer) and
   * returns every frame completed by it, in order.
   * @throws {WireError} for the first malformed frame; frames completed earlier in the same chunk are lost
   *   with it, which is fine because the connection closes
   */
  push(chunk: Uint8Array): Frame[] {
    if (this.#failed) throw this.#failed;
    try {
      if (chunk.length > 0) {
        this.#chunks.push(chunk);
        this.#buffered += chunk.length;
      }
      const out: Frame[] = [];
      for (;;) {
        if (this.#header === undefined) {
          if (this.#buffered < HEADER_BYTES) break;
          this.#header = decodeHeader(this.#take(HEADER_BYTES), this.#limits);
        }
        if (this.#buffered < this.#header.length) break;
        const h = this.#header;
        this.#header = undefined;
        out.push(decodePayload(h, this.#take(h.length), this.#limits));
      }
      return out;
    } catch (e) {
      // Only a bug reaches the second branch (every check above throws WireError); the connection closes
      // with a WireError all the same, and the fuzz tests fail on this message.
      this.#failed = e instanceof WireError
        ? e
        : new WireError("bad_value", `Internal error: frame could not be decoded: ${e}`, { cause: e });
      throw this.#failed;
    }
  }

  /**
   * Declares the end of the stream.
   * @throws {WireError} `truncated` when it ends inside a frame
   */
  end(): void {
    if (this.#failed) throw this.#failed;
    if (this.#header !== undefined || this.#buffered > 0) {
      const what = this.#header
        ? `frame ${this.#header.op} with ${this.#buffered} of its ${this.#header.length} payload bytes`
        : `a header with ${this.#buffered} of its ${HEADER_BYTES} bytes`;
      throw new WireError(
        "truncated",
        `The stream ended inside ${what}: the peer closed or crashed mid-frame`,
      );
    }
  }
}
