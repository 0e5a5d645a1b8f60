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
import { WIRE_ERROR_CODES, WireError, type WireErrorCode, wireErrorCodeOf } from "./errors.ts";
import { type HelloInfo, parseHelloInfo, PROTOCOL_VERSION } from "./hello.ts";
import {
  badValue,
  checkEncode,
  type FrameLimits,
  OP,
  type OpName,
  range,
  Reader,
  u32ok,
  UTF8_DEC,
  UTF8_ENC,
} from "./_bytes.ts";
import {
  decodeResult,
  decodeRun,
  decodeRunBatch,
  encodeResult,
  encodeRun,
  encodeRunBatch,
  MAX_HISTORY,
  MAX_TIMES,
  type RunBatchEntry,
  type RunBatchRequest,
  type RunRequest,
  type RunResult,
  type RunWant,
  type WireSampling,
} from "./run.ts";

export { type FrameLimits, OP, type OpName };
export {
  MAX_HISTORY,
  MAX_TIMES,
  type RunBatchEntry,
  type RunBatchRequest,
  type RunRequest,
  type RunResult,
  type RunWant,
  type WireSampling,
};

/** The frame magic as a little-endian u32: the bytes `W L L M`. */
export const FRAME_MAGIC = 0x4d4c4c57;
/** Bytes of the frame header. */
export const HEADER_BYTES = 16;
/** Default largest frame: 64 MiB holds 2048 rows of width 8192 in f32. */
export const DEFAULT_MAX_FRAME_BYTES = 64 * 2 ** 20;
/** Largest UTF-8 message in a HELLO_REFUSE, CLOSE or ERROR frame. */
export const MAX_MESSAGE_BYTES = 4096;
/** Bytes of a hello nonce. */
export const NONCE_BYTES = 32;
/** Bytes of an authentication proof (HMAC-SHA256). */
export const PROOF_BYTES = 32;

const OP_BY_CODE: ReadonlyMap<number, OpName> = new Map(
  Object.entries(OP).map(([k, v]) => [v, k as OpName]),
);

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
  | { readonly op: "run_batch"; readonly id: number; readonly run: RunBatchRequest }
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

// ---------------------------------------------------------------------------------------------------------
// Encoding

function encodeMessage(message: string): Uint8Array {
  const bytes = UTF8_ENC.encode(message);
  if (bytes.length <= MAX_MESSAGE_BYTES) return bytes;
  // Cut on a character boundary: drop continuation bytes (10xxxxxx) at the cut.
  let end = MAX_MESSAGE_BYTES;
  while (end > 0 && (bytes[end]! & 0xc0) === 0x80) end--;
  return bytes.subarray(0, end);
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
    case "run_batch":
      return encodeRunBatch(f.run);
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
    case "run_batch":
      return { op: h.op, id, run: decodeRunBatch(r, lim) };
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
