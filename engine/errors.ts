/**
 * Project error classes and the invariant helper.
 *
 * Errors name what failed, on which object (path, tensor, offset), expected vs got, and what to do
 * (STYLE.md "Errors"). Each project class carries a stable `code` for boundaries to map.
 * @module
 */

/** Stable codes of {@linkcode GgufError}. */
export type GgufErrorCode =
  | "bad_magic"
  | "bad_version"
  | "truncated"
  | "bad_value"
  | "bad_tensor"
  | "bad_split"
  | "io";

/** A GGUF file (or a set of split parts) is malformed, truncated or inconsistent. */
export class GgufError extends Error {
  /** Stable machine-readable reason. */
  readonly code: GgufErrorCode;
  /** File the problem was found in. */
  readonly path: string;
  /** Byte offset in `path` where the problem was found, when it has one. */
  readonly offsetBytes: number | undefined;

  /**
   * Creates the error; the message must already name the file and offset.
   * @param code stable reason
   * @param message full human message (already names file and offset)
   * @param opts file, offset and cause
   */
  constructor(
    code: GgufErrorCode,
    message: string,
    opts: { path: string; offsetBytes?: number; cause?: unknown },
  ) {
    super(message, opts.cause === undefined ? undefined : { cause: opts.cause });
    this.name = "GgufError";
    this.code = code;
    this.path = opts.path;
    this.offsetBytes = opts.offsetBytes;
  }
}

/** No usable WebGPU adapter or device could be acquired. */
export class GpuError extends Error {
  /**
   * Creates the error.
   * @param message what failed and what to install or change
   * @param opts cause
   */
  constructor(message: string, opts?: { cause?: unknown }) {
    super(message, opts);
    this.name = "GpuError";
  }
}

/**
 * The model's forward pass produced non-finite logits (NaN or ±Inf): its weights or the engine's numerics are
 * broken, not the request. Raised instead of emitting a token; boundaries report it as a server error.
 */
export class NumericsError extends Error {
  /**
   * Creates the error.
   * @param message where it happened and what to check (e.g. `inspect --check` on the file)
   */
  constructor(message: string) {
    super(message);
    this.name = "NumericsError";
  }
}

/**
 * Throws `Error("Internal error: ...")` when `cond` is false: for invariants whose failure is a bug,
 * never for bad input.
 */
export function assert(cond: unknown, msg: string): asserts cond {
  if (!cond) throw new Error(`Internal error: ${msg}`);
}
