/**
 * Small helpers both sides of the stage link share (link.ts connects, serve.ts accepts).
 * @module
 */
import type { WireError } from "./errors.ts";
import { encodeFrame, type Frame, HEADER_BYTES } from "./frame.ts";

/** Turns Nagle off on a TCP connection (replies are small and latency-bound); a no-op where unsupported. */
export function setNoDelay(conn: Deno.Conn): void {
  const c = conn as Deno.Conn & { setNoDelay?: (on: boolean) => void };
  if (typeof c.setNoDelay === "function") c.setNoDelay(true);
}

/** `p`, or `err()` once `ms` pass first (an infinite `ms`: `p` as it is). */
export function withTimeout<T>(p: Promise<T>, ms: number, err: () => WireError): Promise<T> {
  if (!Number.isFinite(ms)) return p;
  let timer: ReturnType<typeof setTimeout> | undefined;
  const t = new Promise<never>((_, reject) => {
    timer = setTimeout(() => reject(err()), ms);
  });
  return Promise.race([p, t]).finally(() => clearTimeout(timer));
}

/** The bytes of `f` after its header, as {@linkcode encodeFrame} writes them. */
export function payloadOf(f: Frame): Uint8Array {
  return encodeFrame(f).subarray(HEADER_BYTES);
}

/** A thrown value as one log line. */
export function describe(e: unknown): string {
  return e instanceof Error ? e.message : String(e);
}
