/**
 * The one error class of the wire layer, {@linkcode WireError}, and its stable codes.
 *
 * Every malformed input the decoder, the hello check, the auth exchange or the link can meet ends in a
 * `WireError` whose `code` says which class of fault it was (docs/WIRE.md "Error codes"); the message names
 * the field, the value found and the limit or value expected.
 * @module
 */

/**
 * Stable codes of {@linkcode WireError}; the numeric values are what an ERROR, CLOSE or HELLO_REFUSE frame
 * carries (docs/WIRE.md "Error codes").
 */
export const WIRE_ERROR_CODES = {
  /** The first 4 bytes of a frame are not the magic `WLLM`: not this protocol, or the stream lost sync. */
  bad_magic: 1,
  /** The header's length exceeds the receiver's maximum frame size. */
  oversize: 2,
  /** The op byte names no op of this protocol version. */
  unknown_op: 3,
  /** Flag bits or reserved bytes that must be zero are not. */
  bad_flags: 4,
  /** The payload ends before the fields its op needs. */
  short_payload: 5,
  /** The payload length differs from the length its fields imply. */
  bad_length: 6,
  /** A count, slot or size is outside the receiver's limits. */
  out_of_range: 7,
  /** A field holds a value outside its enumeration or domain (a NaN temperature, return mode 9). */
  bad_value: 8,
  /** The hello's JSON is malformed or a field is missing or of the wrong type. */
  bad_hello: 9,
  /** The two sides' hellos do not make a valid chain (range, width, slots, model, version, build). */
  refused: 10,
  /** Authentication failed: no key on one side, or the proofs do not match. */
  auth: 11,
  /** The peer did not answer within the timeout. */
  timeout: 12,
  /** The connection closed (or was closed) while a frame or a reply was pending. */
  closed: 13,
  /** The byte stream ended in the middle of a frame. */
  truncated: 14,
  /** A frame arrived that is valid but not allowed at this point (a RUN before the hello, a stray reply). */
  unexpected: 15,
  /** The peer's stage failed to carry out a request (the message is the peer's). */
  backend: 16,
} as const;

/** A stable machine-readable reason of a {@linkcode WireError}. */
export type WireErrorCode = keyof typeof WIRE_ERROR_CODES;

const BY_NUMBER: ReadonlyMap<number, WireErrorCode> = new Map(
  Object.entries(WIRE_ERROR_CODES).map(([k, v]) => [v, k as WireErrorCode]),
);

/** The code whose number is `n`, or undefined for a number this version does not define. */
export function wireErrorCodeOf(n: number): WireErrorCode | undefined {
  return BY_NUMBER.get(n);
}

/** A frame, hello, authentication or link fault; `code` is stable, the message says what and what to do. */
export class WireError extends Error {
  /** Stable machine-readable reason. */
  readonly code: WireErrorCode;

  /**
   * Creates the error.
   * @param code stable reason
   * @param message full human message: what failed, expected vs got, what to do
   * @param opts cause
   */
  constructor(code: WireErrorCode, message: string, opts?: { cause?: unknown }) {
    super(message, opts?.cause === undefined ? undefined : { cause: opts.cause });
    this.name = "WireError";
    this.code = code;
  }
}
