/**
 * The model fingerprint the stage link compares at hello (docs/WIRE.md "Model fingerprint"): a SHA-256
 * that changes with any byte of the model's metadata, tensor table or tensor data, and does not change
 * with how the model is split into files.
 *
 * Definition (version 1), all integers little-endian:
 *
 *     fingerprint = SHA-256( "WLLM model fingerprint v1\0"
 *                            ‖ u64 len(M) ‖ M          M: every metadata pair of part 1 in file order,
 *                                                         except split.no / split.count / split.tensors.count,
 *                                                         as GGUF encodes it (u64 key length, key, u32 type, value)
 *                            ‖ u64 len(T) ‖ T          T: per tensor in file order: u64 name length, name,
 *                                                         u32 n_dims, u64 ne[0..n_dims), u32 ggml type id
 *                            ‖ D_0 ‖ D_1 ‖ ...)        D_i = SHA-256(bytes of tensor i), tensors in file order
 *
 * Hashing each tensor on its own lets a stage feed the bytes it uploads in the order it uploads them (its
 * layers' tensors, in its own order) with {@linkcode FingerprintHasher.update}, and read only the tensors
 * it does not upload afterwards ({@linkcode FingerprintHasher.complete}); the data offsets are left out so
 * a split set and the single file of the same model agree.
 *
 * Throughput: node:crypto's SHA-256 (native, SHA-NI) measured 1.77 GB/s on 64-256 MiB chunks of a 256 MiB
 * buffer on this machine's AMD EPYC (2 cores; 1.35 GB/s with 1 MiB chunks; WebCrypto's one-shot digest:
 * 0.26 GB/s), so an 18.6 GB model costs ~10.5 s of hashing once; later loads read the cache file
 * `<model>.fingerprint` beside the GGUF (keyed by each part's size and mtime).
 *
 * @example
 * ```ts
 * import { openGguf } from "./gguf.ts";
 * import { modelFingerprint } from "./fingerprint.ts";
 * const file = await openGguf("model.gguf");
 * const { fingerprint, cached } = await modelFingerprint(file);
 * console.log(fingerprint, cached);
 * ```
 * @module
 */
import { createHash, type Hash } from "node:crypto";
import { assert, GgufError } from "./errors.ts";
import {
  GGUF_VALUE_TYPE,
  type GgufArray,
  type GgufFile,
  type GgufKv,
  type GgufValue,
  type GgufValueType,
  openGguf,
} from "./gguf.ts";
import { KEYS } from "./names.ts";

/** Version of the fingerprint definition (the cache records it). */
export const FINGERPRINT_VERSION = 1;
/** Suffix of the cache file beside part 1 of the GGUF. */
export const FINGERPRINT_CACHE_SUFFIX = ".fingerprint";
const LABEL = new TextEncoder().encode("WLLM model fingerprint v1\0");
const SPLIT_KEYS: ReadonlySet<string> = new Set([KEYS.splitNo, KEYS.splitCount, KEYS.splitTensorsCount]);
const READ_CHUNK_BYTES = 64 * 2 ** 20;
const UTF8 = new TextEncoder();

/** Growable little-endian byte builder for the canonical metadata and table encodings. */
class Bytes {
  #buf = new Uint8Array(4096);
  #dv = new DataView(this.#buf.buffer);
  length = 0;
  #room(n: number): void {
    if (this.length + n <= this.#buf.length) return;
    const next = new Uint8Array(Math.max(this.#buf.length * 2, this.length + n));
    next.set(this.#buf.subarray(0, this.length));
    this.#buf = next;
    this.#dv = new DataView(next.buffer);
  }
  bytes(b: Uint8Array): void {
    this.#room(b.length);
    this.#buf.set(b, this.length);
    this.length += b.length;
  }
  u8(v: number): void {
    this.#room(1);
    this.#dv.setUint8(this.length++, v);
  }
  u32(v: number): void {
    this.#room(4);
    this.#dv.setUint32(this.length, v, true);
    this.length += 4;
  }
  u64(v: number | bigint): void {
    this.#room(8);
    this.#dv.setBigUint64(this.length, BigInt(v), true);
    this.length += 8;
  }
  scalar(type: GgufValueType, v: number | bigint | boolean): void {
    this.#room(8);
    const dv = this.#dv, at = this.length;
    switch (type) {
      case GGUF_VALUE_TYPE.UINT8:
        dv.setUint8(at, Number(v));
        this.length += 1;
        return;
      case GGUF_VALUE_TYPE.INT8:
        dv.setInt8(at, Number(v));
        this.length += 1;
        return;
      case GGUF_VALUE_TYPE.BOOL:
        dv.setUint8(at, v ? 1 : 0);
        this.length += 1;
        return;
      case GGUF_VALUE_TYPE.UINT16:
        dv.setUint16(at, Number(v), true);
        this.length += 2;
        return;
      case GGUF_VALUE_TYPE.INT16:
        dv.setInt16(at, Number(v), true);
        this.length += 2;
        return;
      case GGUF_VALUE_TYPE.UINT32:
        dv.setUint32(at, Number(v), true);
        this.length += 4;
        return;
      case GGUF_VALUE_TYPE.INT32:
        dv.setInt32(at, Number(v), true);
        this.length += 4;
        return;
      case GGUF_VALUE_TYPE.FLOAT32:
        dv.setFloat32(at, Number(v), true);
        this.length += 4;
        return;
      case GGUF_VALUE_TYPE.UINT64:
        dv.setBigUint64(at, BigInt(v), true);
        this.length += 8;
        return;
      case GGUF_VALUE_TYPE.INT64:
        dv.setBigInt64(at, BigInt(v), true);
        this.length += 8;
        return;
      case GGUF_VALUE_TYPE.FLOAT64:
        dv.setFloat64(at, Number(v), true);
        this.length += 8;
        return;
      default:
        throw new Error(`Internal error: scalar type ${type}`);
    }
  }
  string(s: string): void {
    const b = UTF8.encode(s);
    this.u64(b.length);
    this.bytes(b);
  }
  value(type: GgufValueType, v: GgufValue): void {
    if (type === GGUF_VALUE_TYPE.STRING) return this.string(v as string);
    if (type !== GGUF_VALUE_TYPE.ARRAY) return this.scalar(type, v as number | bigint | boolean);
    const arr = v as GgufArray;
    const values = arr.values as ArrayLike<GgufValue>;
    this.u32(arr.elemType);
    this.u64(values.length);
    for (let i = 0; i < values.length; i++) this.value(arr.elemType, values[i]!);
  }
  view(): Uint8Array {
    return this.#buf.subarray(0, this.length);
  }
}

/** M of the definition: part 1's metadata minus the split keys, GGUF-encoded in file order. */
function metadataBytes(entries: ReadonlyMap<string, GgufKv>): Uint8Array {
  const b = new Bytes();
  for (const [key, kv] of entries) {
    if (SPLIT_KEYS.has(key)) continue;
    b.string(key);
    b.u32(kv.type);
    b.value(kv.type, kv.value);
  }
  return b.view();
}

/** T of the definition: name, dims and type of every tensor in file order. */
function tableBytes(file: GgufFile): Uint8Array {
  const b = new Bytes();
  for (const t of file.tensors.values()) {
    b.string(t.name);
    b.u32(t.ne.length);
    for (const n of t.ne) b.u64(n);
    b.u32(t.type.id);
  }
  return b.view();
}

interface TensorState {
  readonly nbytes: number;
  hash: Hash | undefined;
  fed: number;
  digest: Uint8Array | undefined;
}

/**
 * Computes the fingerprint from tensor bytes fed in any tensor order (each tensor's bytes in order), plus
 * whatever it reads itself for the tensors not fed. Give {@linkcode update} to the weight upload so that
 * no byte is read twice.
 */
export class FingerprintHasher {
  readonly #file: GgufFile;
  readonly #tensors = new Map<string, TensorState>();
  #finished: string | undefined;

  /**
   * Starts a fingerprint of `file`.
   * @param file the opened model (its metadata and tensor table are part of the fingerprint)
   */
  constructor(file: GgufFile) {
    this.#file = file;
    for (const t of file.tensors.values()) {
      this.#tensors.set(t.name, { nbytes: t.nbytes, hash: undefined, fed: 0, digest: undefined });
    }
  }

  /**
   * Feeds `chunk`, the bytes of tensor `name` starting at `offsetBytes` within that tensor. Chunks of one
   * tensor must come in order without gaps (repeats of bytes already fed are ignored, so a retried chunk is
   * harmless); tensors may interleave.
   * @throws {Error} "Internal error" on an unknown tensor, a gap, or bytes past the tensor's end: a bug in
   *   the caller
   */
  update(name: string, chunk: Uint8Array, offsetBytes: number): void {
    const t = this.#tensors.get(name);
    assert(t !== undefined, `fingerprint fed bytes of ${name}, which the file does not have`);
    assert(this.#finished === undefined, `fingerprint fed bytes of ${name} after its digest`);
    assert(
      offsetBytes <= t.fed,
      `fingerprint of ${name} fed at offset ${offsetBytes} but only ${t.fed} bytes so far`,
    );
    assert(offsetBytes + chunk.length <= t.nbytes, `fingerprint of ${name} fed past its ${t.nbytes} bytes`);
    const fresh = chunk.subarray(t.fed - offsetBytes);
    if (fresh.length === 0) return;
    t.hash ??= createHash("sha256");
    t.hash.update(fresh);
    t.fed += fresh.length;
    if (t.fed === t.nbytes) {
      t.digest = new Uint8Array(t.hash.digest());
      t.hash = undefined;
    }
  }

  /** Names of the tensors not yet fed completely, in file order. */
  missing(): string[] {
    return [...this.#tensors].filter(([, t]) => t.digest === undefined && t.nbytes > 0).map(([n]) => n);
  }

  /** Bytes still to be read for {@linkcode complete}. */
  missingBytes(): number {
    let n = 0;
    for (const t of this.#tensors.values()) if (t.digest === undefined) n += t.nbytes - t.fed;
    return n;
  }

  /**
   * Reads what was not fed (the rest of partly fed tensors, then whole ones, in file order) and returns
   * the fingerprint.
   * @throws {GgufError} when a read fails
   */
  async complete(opts: { chunkBytes?: number } = {}): Promise<string> {
    if (this.#finished !== undefined) return this.#finished;
    const chunkBytes = opts.chunkBytes ?? READ_CHUNK_BYTES;
    let buf: Uint8Array | undefined;
    for (const [name, t] of this.#tensors) {
      while (t.digest === undefined && t.fed < t.nbytes) {
        const n = Math.min(chunkBytes, t.nbytes - t.fed);
        buf ??= new Uint8Array(Math.min(chunkBytes, this.missingBytes()));
        const view = buf.subarray(0, n);
        await this.#file.readTensorInto(name, view, t.fed);
        this.update(name, view, t.fed);
      }
    }
    return this.digest();
  }

  /**
   * The fingerprint, 64 lowercase hex digits.
   * @throws {Error} "Internal error" when a tensor was not fed completely (use {@linkcode complete})
   */
  digest(): string {
    if (this.#finished !== undefined) return this.#finished;
    const missing = this.missing();
    assert(
      missing.length === 0,
      `fingerprint digest with ${missing.length} tensors unread (first ${missing[0]})`,
    );
    const h = createHash("sha256");
    h.update(LABEL);
    const m = metadataBytes(this.#file.metadata.entries);
    const t = tableBytes(this.#file);
    const len = new DataView(new ArrayBuffer(8));
    len.setBigUint64(0, BigInt(m.length), true);
    h.update(new Uint8Array(len.buffer.slice(0)));
    h.update(m);
    len.setBigUint64(0, BigInt(t.length), true);
    h.update(new Uint8Array(len.buffer.slice(0)));
    h.update(t);
    const empty = createHash("sha256").digest();
    for (const s of this.#tensors.values()) h.update(s.digest ?? empty);
    this.#finished = h.digest("hex");
    return this.#finished;
  }
}

/**
 * The fingerprint of an opened model, computed by reading all of its tensor data (no cache).
 * @throws {GgufError} when a read fails
 */
export async function fingerprintGguf(file: GgufFile): Promise<string> {
  return await new FingerprintHasher(file).complete();
}

/** The cache file's content. */
export interface FingerprintCacheFile {
  /** {@linkcode FINGERPRINT_VERSION} it was computed with. */
  readonly version: number;
  /** The fingerprint. */
  readonly fingerprint: string;
  /** Each part's file name (no folder), size and modification time when it was computed. */
  readonly parts: readonly { readonly name: string; readonly sizeBytes: number; readonly mtimeMs: number }[];
}

/** Path of the cache file of `file`: beside part 1, `<part 1 path>.fingerprint`. */
export function fingerprintCachePath(file: GgufFile): string {
  return file.path + FINGERPRINT_CACHE_SUFFIX;
}

function baseName(path: string): string {
  return path.slice(path.lastIndexOf("/") + 1);
}

/** Each part's name, size and mtime now. */
async function partStats(file: GgufFile): Promise<FingerprintCacheFile["parts"]> {
  return await Promise.all(file.parts.map(async (p) => {
    try {
      const st = await Deno.stat(p.path);
      return { name: baseName(p.path), sizeBytes: st.size, mtimeMs: st.mtime?.getTime() ?? 0 };
    } catch (e) {
      throw new GgufError("io", `Cannot stat ${p.path} for its fingerprint: ${e}`, {
        path: p.path,
        cause: e,
      });
    }
  }));
}

function sameParts(a: FingerprintCacheFile["parts"], b: FingerprintCacheFile["parts"]): boolean {
  return a.length === b.length &&
    a.every((p, i) =>
      p.name === b[i]!.name && p.sizeBytes === b[i]!.sizeBytes && p.mtimeMs === b[i]!.mtimeMs
    );
}

/**
 * The cached fingerprint of `file`, or undefined when there is no cache, it is unreadable or malformed, of
 * another version, or any part's size or mtime changed since (the file must then be hashed again).
 */
export async function readCachedFingerprint(file: GgufFile): Promise<string | undefined> {
  let json: unknown;
  try {
    json = JSON.parse(await Deno.readTextFile(fingerprintCachePath(file)));
  } catch {
    return undefined; // no cache (or a damaged one): hashing again is the remedy, and the caller will
  }
  const c = json as Partial<FingerprintCacheFile>;
  if (
    typeof c !== "object" || c === null || c.version !== FINGERPRINT_VERSION ||
    typeof c.fingerprint !== "string" ||
    !/^[0-9a-f]{64}$/.test(c.fingerprint) || !Array.isArray(c.parts)
  ) return undefined;
  return sameParts(c.parts, await partStats(file)) ? c.fingerprint : undefined;
}

/**
 * Writes the cache file beside `file` (atomically: a temporary file renamed over it).
 * @param stats the parts' stats taken BEFORE hashing started (so a change during hashing invalidates it)
 * @throws {Deno.errors.PermissionDenied} and other write errors (a read-only model folder)
 */
export async function writeCachedFingerprint(
  file: GgufFile,
  fingerprint: string,
  opts: { stats?: FingerprintCacheFile["parts"] } = {},
): Promise<void> {
  const content: FingerprintCacheFile = {
    version: FINGERPRINT_VERSION,
    fingerprint,
    parts: opts.stats ?? await partStats(file),
  };
  const path = fingerprintCachePath(file);
  const tmp = `${path}.${Deno.pid}.tmp`;
  await Deno.writeTextFile(tmp, JSON.stringify(content, null, 2) + "\n");
  await Deno.rename(tmp, path);
}

/**
 * The model's fingerprint: from the cache when it is valid; else completed from `hasher` (fed during the
 * weight upload, reading only what it was not fed) or computed by reading the file, then cached.
 * @param opts.hasher a hasher fed during the upload (see the module comment)
 * @param opts.stats the parts' stats taken before the upload (default: now)
 * @returns the fingerprint, whether it came from the cache, and why the cache could not be written (if so)
 * @throws {GgufError} when a read fails
 */
export async function modelFingerprint(
  file: GgufFile,
  opts: { hasher?: FingerprintHasher; stats?: FingerprintCacheFile["parts"] } = {},
): Promise<{ fingerprint: string; cached: boolean; cacheError?: string }> {
  const stats = opts.stats ?? await partStats(file);
  const hit = await readCachedFingerprint(file);
  if (hit !== undefined) return { fingerprint: hit, cached: true };
  const fingerprint = await (opts.hasher ?? new FingerprintHasher(file)).complete();
  try {
    await writeCachedFingerprint(file, fingerprint, { stats });
    return { fingerprint, cached: false };
  } catch (e) {
    return {
      fingerprint,
      cached: false,
      cacheError: `Cannot write ${fingerprintCachePath(file)}: ${e instanceof Error ? e.message : e}: ` +
        `the model will be hashed again at the next start`,
    };
  }
}

/** The parts' current stats, to pass to {@linkcode modelFingerprint} as `stats` when taken before the upload. */
export async function fingerprintStats(file: GgufFile): Promise<FingerprintCacheFile["parts"]> {
  return await partStats(file);
}

/**
 * The fingerprint of the GGUF at `path` (a split part opens the whole set), by reading all of it; no cache.
 * @throws {GgufError} for a missing, malformed or unreadable file
 */
export async function fingerprintFile(path: string): Promise<string> {
  const file = await openGguf(path);
  try {
    return await fingerprintGguf(file);
  } finally {
    file.close();
  }
}
