/**
 * Link authentication: both sides prove a shared key (`--link-key` or `LLM_LINK_KEY`) by HMAC-SHA256 over a
 * transcript of both hellos, each of which carries a fresh 32-byte nonce (docs/WIRE.md "Authentication").
 *
 * The connecting side proves first (AUTH), the accepting side answers with its own proof (READY) only after
 * it checked the first one, so an unauthenticated peer never gets a proof or any service. Each proof is
 * bound to both nonces and both hellos, so it cannot be replayed on another connection, and a changed
 * hello (a stage claiming another range) breaks it. WebCrypto (`crypto.subtle`) computes the MACs; the
 * comparison is constant-time.
 *
 * @example
 * ```ts
 * import { importLinkKey, makeProof, newNonce, transcriptHash, verifyProof } from "./auth.ts";
 * const key = await importLinkKey("a shared secret of 16+ chars");
 * const t = await transcriptHash(new Uint8Array([1]), new Uint8Array([2]));
 * const proof = await makeProof(key, "connector", t);
 * console.log(await verifyProof(key, "connector", t, proof)); // true
 * ```
 * @module
 */
import { WireError } from "./errors.ts";

/** Shortest link key accepted, in characters. */
export const MIN_LINK_KEY_CHARS = 16;
/** Environment variable read when `--link-key` is not given. */
export const LINK_KEY_ENV = "LLM_LINK_KEY";

/** Which side a proof is made by: the side that connected, or the side that accepted. */
export type ProofRole = "connector" | "acceptor";

const UTF8 = new TextEncoder();
const TRANSCRIPT_LABEL = UTF8.encode("WLLM link v1 transcript\0");
const PROOF_LABEL: Readonly<Record<ProofRole, Uint8Array>> = {
  connector: UTF8.encode("WLLM link v1 connector proof\0"),
  acceptor: UTF8.encode("WLLM link v1 acceptor proof\0"),
};

/**
 * The link key from `--link-key` (when given) or else `LLM_LINK_KEY`; undefined when neither is set.
 * @throws {RangeError} when the key is shorter than {@linkcode MIN_LINK_KEY_CHARS} characters
 */
export function linkKeyFrom(
  flag: string | undefined,
  env: { get(name: string): string | undefined } = Deno.env,
): string | undefined {
  const key = flag ?? env.get(LINK_KEY_ENV);
  if (key === undefined || key === "") return undefined;
  if (key.length < MIN_LINK_KEY_CHARS) {
    const from = flag !== undefined ? "--link-key" : LINK_KEY_ENV;
    throw new RangeError(
      `Link key from ${from} has ${key.length} characters but needs at least ${MIN_LINK_KEY_CHARS}: ` +
        `use a random one, e.g. openssl rand -hex 32, and give the same key to every stage`,
    );
  }
  return key;
}

/**
 * Imports a link key (its UTF-8 bytes) as an HMAC-SHA256 key.
 * @throws {RangeError} when it is shorter than {@linkcode MIN_LINK_KEY_CHARS} characters
 */
export async function importLinkKey(secret: string): Promise<CryptoKey> {
  if (secret.length < MIN_LINK_KEY_CHARS) {
    throw new RangeError(
      `Link key has ${secret.length} characters but needs at least ${MIN_LINK_KEY_CHARS}: ` +
        `use a random one, e.g. openssl rand -hex 32`,
    );
  }
  return await crypto.subtle.importKey("raw", UTF8.encode(secret), { name: "HMAC", hash: "SHA-256" }, false, [
    "sign",
  ]);
}

/** 32 fresh random bytes for a hello. */
export function newNonce(): Uint8Array {
  return crypto.getRandomValues(new Uint8Array(32));
}

function concat(parts: readonly Uint8Array[]): Uint8Array<ArrayBuffer> {
  const out = new Uint8Array(parts.reduce((s, p) => s + p.length, 0));
  let at = 0;
  for (const p of parts) {
    out.set(p, at);
    at += p.length;
  }
  return out;
}

function u32le(n: number): Uint8Array {
  const b = new Uint8Array(4);
  new DataView(b.buffer).setUint32(0, n, true);
  return b;
}

/**
 * SHA-256 of the handshake transcript: label, then each payload with its u32 little-endian length, the
 * connector's HELLO payload first, then the acceptor's HELLO_ACK payload (as sent and received, byte for
 * byte; both hold their side's nonce).
 */
export async function transcriptHash(helloPayload: Uint8Array, ackPayload: Uint8Array): Promise<Uint8Array> {
  const data = concat([
    TRANSCRIPT_LABEL,
    u32le(helloPayload.length),
    helloPayload,
    u32le(ackPayload.length),
    ackPayload,
  ]);
  return new Uint8Array(await crypto.subtle.digest("SHA-256", data));
}

/** HMAC-SHA256(key, role label ‖ transcript hash): what `role` sends to prove the key. */
export async function makeProof(
  key: CryptoKey,
  role: ProofRole,
  transcript: Uint8Array,
): Promise<Uint8Array> {
  return new Uint8Array(await crypto.subtle.sign("HMAC", key, concat([PROOF_LABEL[role], transcript])));
}

/** True when `a` and `b` have the same length and bytes; time depends only on the length. */
export function constantTimeEqual(a: Uint8Array, b: Uint8Array): boolean {
  if (a.length !== b.length) return false;
  let diff = 0;
  for (let i = 0; i < a.length; i++) diff |= a[i]! ^ b[i]!;
  return diff === 0;
}

/** True when `proof` is `role`'s proof of `key` over `transcript` (constant-time compare). */
export async function verifyProof(
  key: CryptoKey,
  role: ProofRole,
  transcript: Uint8Array,
  proof: Uint8Array,
): Promise<boolean> {
  return constantTimeEqual(await makeProof(key, role, transcript), proof);
}

/**
 * The refusal when the two sides disagree on having a key at all.
 * @param self whether this side has a key
 * @param peer whether the peer said (in its hello) that it has one
 * @param peerName how to name the peer
 * @returns undefined when both or neither have a key
 */
export function authModeMismatch(self: boolean, peer: boolean, peerName: string): WireError | undefined {
  if (self === peer) return undefined;
  return self
    ? new WireError(
      "auth",
      `Unauthenticated peer refused: this side has a link key but ${peerName} has none: give it the same ` +
        `--link-key (or ${LINK_KEY_ENV})`,
    )
    : new WireError(
      "auth",
      `Link key required: ${peerName} has a link key but this side has none: pass the same --link-key ` +
        `(or set ${LINK_KEY_ENV})`,
    );
}
