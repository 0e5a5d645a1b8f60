/**
 * The GGUF header parser (spec `gguf.md`) and the value types it reads: per part, a bounded parse of the
 * magic, version, metadata and tensor infos from a buffer that grows until the header fits, and the handle
 * that reads tensor data by positioned reads. Private to `gguf.ts`, which assembles the parts into a file.
 * @module
 */
import { decodeStringRun, UTF8 } from "./_gguf_strings.ts";
import { GgufError, type GgufErrorCode } from "./errors.ts";
import {
  DEFAULT_ALIGNMENT,
  describe,
  FIXED_SIZE,
  GGUF_MAGIC,
  GGUF_VALUE_TYPE,
  type GgufArray,
  type GgufArrayValues,
  type GgufKv,
  GgufMetadata,
  type GgufValue,
  type GgufValueType,
  HOST_LITTLE_ENDIAN,
  INTEGER_TYPES,
  MAX_ARRAY_DEPTH,
  MAX_HEADER_BYTES,
  preview,
  REDOWNLOAD,
  valueTypeName,
} from "./_gguf_values.ts";
import { KEYS } from "./names.ts";
import { GGML_TYPES, type GgmlTypeInfo } from "./quant/types.ts";

/** One open part file; reads are serialized because seek + read is not atomic. */
export class PartHandle {
  readonly path: string;
  readonly sizeBytes: number;
  #file: Deno.FsFile | undefined;
  #tail: Promise<void> = Promise.resolve();

  constructor(path: string, file: Deno.FsFile, sizeBytes: number) {
    this.path = path;
    this.#file = file;
    this.sizeBytes = sizeBytes;
  }

  /** Fills `dst` from absolute offset `posBytes`; queued behind earlier reads of this handle. */
  read(posBytes: number, dst: Uint8Array): Promise<void> {
    const run = this.#tail.then(() => this.#readNow(posBytes, dst));
    // The chain only orders reads; each caller gets its own failure through `run`.
    this.#tail = run.then(() => undefined, () => undefined);
    return run;
  }

  async #readNow(posBytes: number, dst: Uint8Array): Promise<void> {
    const file = this.#file;
    if (file === undefined) {
      throw new GgufError("io", `Cannot read ${this.path}: the GGUF file was closed: open it again`, {
        path: this.path,
        offsetBytes: posBytes,
      });
    }
    let done = 0;
    try {
      await file.seek(posBytes, Deno.SeekMode.Start);
      while (done < dst.length) {
        const n = await file.read(dst.subarray(done));
        if (n === null) break;
        done += n;
      }
    } catch (e) {
      throw new GgufError(
        "io",
        `Reading ${dst.length} bytes at byte ${posBytes} of ${this.path} failed: ${(e as Error).message}: ` +
          `check the disk and the file`,
        { path: this.path, offsetBytes: posBytes + done, cause: e },
      );
    }
    if (done < dst.length) {
      throw new GgufError(
        "truncated",
        `GGUF file ${this.path} ended at byte ${
          posBytes + done
        } while reading ${dst.length} bytes from byte ` +
          `${posBytes}: the file shrank after it was opened or is truncated: ${REDOWNLOAD}`,
        { path: this.path, offsetBytes: posBytes + done },
      );
    }
  }

  close(): void {
    this.#file?.close();
    this.#file = undefined;
  }
}

/** Raised inside the synchronous parser when the buffer is too short; the driver reads more and resumes. */
class NeedMore extends Error {
  readonly endBytes: number;
  constructor(endBytes: number) {
    super("need more header bytes");
    this.endBytes = endBytes;
  }
}

export interface RawTensor {
  name: string;
  infoOffsetBytes: number;
  ne: number[];
  type: GgmlTypeInfo;
  nElems: number;
  nbytes: number;
  offsetBytes: number;
}

export interface ParsedPart {
  handle: PartHandle;
  version: number;
  alignment: number;
  dataStartBytes: number;
  kvs: Map<string, GgufKv>;
  tensors: RawTensor[];
}

/**
 * Synchronous header parser over a prefix of the file. Progress is committed after each whole KV pair and
 * tensor info, so when it runs out of buffer ({@linkcode NeedMore}) the driver grows the buffer and resumes
 * from the last committed item.
 */
class HeaderParser {
  readonly path: string;
  readonly fileSize: number;
  #buf: Uint8Array = new Uint8Array(0);
  #dv: DataView = new DataView(new ArrayBuffer(0));
  #pos = 0;

  version = 0;
  tensorCount = -1;
  kvCount = -1;
  readonly kvs = new Map<string, GgufKv>();
  readonly tensors: RawTensor[] = [];
  /** Offset just past the last committed item. */
  committed = 0;

  constructor(path: string, fileSize: number) {
    this.path = path;
    this.fileSize = fileSize;
  }

  setBuffer(buf: Uint8Array): void {
    this.#buf = buf;
    this.#dv = new DataView(buf.buffer, buf.byteOffset, buf.byteLength);
  }

  #err(code: GgufErrorCode, at: number, msg: string): GgufError {
    return new GgufError(code, `GGUF file ${this.path} at byte ${at}: ${msg}`, {
      path: this.path,
      offsetBytes: at,
    });
  }

  /** Ensures `n` more bytes are available at the cursor, failing on the file end or the header cap. */
  #need(n: number, what: string): void {
    const end = this.#pos + n;
    if (end <= this.#buf.length) return;
    if (end > this.fileSize) {
      throw this.#err(
        "truncated",
        this.#pos,
        `expected ${n} bytes for ${what} but the file ends at byte ${this.fileSize}: ${REDOWNLOAD}`,
      );
    }
    if (end > MAX_HEADER_BYTES) {
      throw this.#err(
        "bad_value",
        this.#pos,
        `${what} would make the header (metadata and tensor infos) larger than ${MAX_HEADER_BYTES} bytes ` +
          `(needs bytes up to ${end}): the file is corrupt: ${REDOWNLOAD}`,
      );
    }
    throw new NeedMore(end);
  }

  /**
   * Rejects a count or length whose smallest possible encoding cannot fit in the rest of the file, before
   * anything is allocated for it.
   */
  #bound(count: number, minElemBytes: number, what: string, at: number, onlyAbsurd = false): void {
    const needed = count * minElemBytes;
    const left = this.fileSize - this.#pos;
    if (needed <= left || (onlyAbsurd && needed <= this.fileSize)) return;
    const code = needed > this.fileSize ? "bad_value" : "truncated";
    throw this.#err(
      code,
      at,
      `${what} is ${count}, which needs at least ${needed} bytes but only ${left} bytes are left in the file: ` +
        `the count is corrupt or the file is truncated: ${REDOWNLOAD}`,
    );
  }

  #u8(what: string): number {
    this.#need(1, what);
    return this.#buf[this.#pos++]!;
  }

  #u32(what: string): number {
    this.#need(4, what);
    const v = this.#dv.getUint32(this.#pos, true);
    this.#pos += 4;
    return v;
  }

  /** A u64 as a number: exact up to 2^53, approximate above (callers reject those by bound checks). */
  #u64n(what: string): number {
    this.#need(8, what);
    const lo = this.#dv.getUint32(this.#pos, true);
    const hi = this.#dv.getUint32(this.#pos + 4, true);
    this.#pos += 8;
    return hi * 0x1_0000_0000 + lo;
  }

  /** A u64 count or length that must be a safe integer. */
  #count(what: string): number {
    const at = this.#pos;
    const v = this.#u64n(what);
    if (!Number.isSafeInteger(v)) {
      throw this.#err(
        "bad_value",
        at,
        `${what} is ${
          this.#dv.getBigUint64(at, true)
        }, larger than any file: the file is corrupt: ${REDOWNLOAD}`,
      );
    }
    return v;
  }

  #string(what: string): string {
    const at = this.#pos;
    const len = this.#count(`length of ${what}`);
    this.#bound(len, 1, `length of ${what}`, at);
    this.#need(len, what);
    const s = UTF8.decode(this.#buf.subarray(this.#pos, this.#pos + len));
    this.#pos += len;
    return s;
  }

  #value(type: number, what: string, depth: number): GgufValue {
    const at = this.#pos;
    const dv = this.#dv;
    switch (type) {
      case GGUF_VALUE_TYPE.UINT8:
        return this.#u8(what);
      case GGUF_VALUE_TYPE.INT8:
        this.#need(1, what);
        return dv.getInt8(this.#pos++);
      case GGUF_VALUE_TYPE.UINT16:
        this.#need(2, what);
        this.#pos += 2;
        return dv.getUint16(at, true);
      case GGUF_VALUE_TYPE.INT16:
        this.#need(2, what);
        this.#pos += 2;
        return dv.getInt16(at, true);
      case GGUF_VALUE_TYPE.UINT32:
        return this.#u32(what);
      case GGUF_VALUE_TYPE.INT32:
        this.#need(4, what);
        this.#pos += 4;
        return dv.getInt32(at, true);
      case GGUF_VALUE_TYPE.FLOAT32:
        this.#need(4, what);
        this.#pos += 4;
        return dv.getFloat32(at, true);
      case GGUF_VALUE_TYPE.BOOL: {
        const b = this.#u8(what);
        if (b > 1) {
          throw this.#err("bad_value", at, `${what} is a bool byte ${b}, expected 0 or 1: ${REDOWNLOAD}`);
        }
        return b === 1;
      }
      case GGUF_VALUE_TYPE.STRING:
        return this.#string(what);
      case GGUF_VALUE_TYPE.ARRAY:
        return this.#array(what, depth + 1);
      case GGUF_VALUE_TYPE.UINT64: {
        this.#need(8, what);
        this.#pos += 8;
        const v = dv.getBigUint64(at, true);
        return v <= BigInt(Number.MAX_SAFE_INTEGER) ? Number(v) : v;
      }
      case GGUF_VALUE_TYPE.INT64: {
        this.#need(8, what);
        this.#pos += 8;
        const v = dv.getBigInt64(at, true);
        return v <= BigInt(Number.MAX_SAFE_INTEGER) && v >= BigInt(Number.MIN_SAFE_INTEGER) ? Number(v) : v;
      }
      case GGUF_VALUE_TYPE.FLOAT64:
        this.#need(8, what);
        this.#pos += 8;
        return dv.getFloat64(at, true);
      default:
        throw this.#err(
          "bad_value",
          at,
          `${what} has value type ${type}, expected one of 0..12 (u8..f64): the file is corrupt: ${REDOWNLOAD}`,
        );
    }
  }

  #array(what: string, depth: number): GgufArray {
    const typeAt = this.#pos;
    const elemType = this.#u32(`element type of ${what}`);
    if (elemType > 12) {
      throw this.#err(
        "bad_value",
        typeAt,
        `${what} is an array of value type ${elemType}, expected one of 0..12 (u8..f64): ` +
          `the file is corrupt: ${REDOWNLOAD}`,
      );
    }
    if (elemType === GGUF_VALUE_TYPE.ARRAY && depth >= MAX_ARRAY_DEPTH) {
      throw this.#err(
        "bad_value",
        typeAt,
        `${what} nests arrays deeper than ${MAX_ARRAY_DEPTH} levels: the file is corrupt: ${REDOWNLOAD}`,
      );
    }
    const countAt = this.#pos;
    const count = this.#count(`element count of ${what}`);
    const t = elemType as GgufValueType;
    const fixed = FIXED_SIZE[t];
    // Smallest encodings: a string is at least its u64 length, an array its u32 type + u64 count.
    const minBytes = fixed ?? (t === GGUF_VALUE_TYPE.STRING ? 8 : 12);
    this.#bound(count, minBytes, `element count of ${what} (${valueTypeName(t)})`, countAt);
    if (t === GGUF_VALUE_TYPE.STRING) return { elemType: t, values: this.#stringArray(count, what) };
    if (t === GGUF_VALUE_TYPE.ARRAY) {
      const values: GgufArray[] = [];
      for (let i = 0; i < count; i++) values.push(this.#array(`${what}[${i}]`, depth + 1));
      return { elemType: t, values };
    }
    if (fixed === undefined) throw new Error(`Internal error: no size for value type ${t}`);
    const n = count * fixed;
    this.#need(n, `${count} elements of ${what}`);
    const start = this.#pos;
    this.#pos += n;
    if (t === GGUF_VALUE_TYPE.BOOL) {
      const values: boolean[] = new Array(count);
      for (let i = 0; i < count; i++) {
        const b = this.#buf[start + i]!;
        if (b > 1) {
          throw this.#err(
            "bad_value",
            start + i,
            `${what}[${i}] is a bool byte ${b}, expected 0 or 1: ${REDOWNLOAD}`,
          );
        }
        values[i] = b === 1;
      }
      return { elemType: t, values };
    }
    return { elemType: t, values: numericArray(t, this.#buf, start, count) };
  }

  /**
   * Decodes `count` strings with one decode call when they are all in the buffer; otherwise scans their
   * lengths with every check, which reports the bad one or asks for more bytes.
   */
  #stringArray(count: number, what: string): string[] {
    const run = decodeStringRun(this.#buf, this.#pos, count);
    if (run !== undefined) {
      this.#pos = run.endBytes;
      return run.values;
    }
    // Not all in the buffer, or a bad length: find which without decoding; this throws NeedMore or the error.
    const end = this.#buf.length;
    for (let i = 0; i < count; i++) {
      const at = this.#pos;
      if (at + 8 <= end && this.#dv.getUint32(at + 4, true) === 0) {
        const lo = this.#dv.getUint32(at, true);
        if (lo <= end - at - 8) {
          this.#pos = at + 8 + lo;
          continue;
        }
      }
      const len = this.#count(`length of ${what}[${i}]`);
      this.#bound(len, 1, `length of ${what}[${i}]`, at);
      this.#need(len, `${what}[${i}]`);
      this.#pos += len;
    }
    throw new Error(`Internal error: ${what} fits the buffer but the string decoder refused it`);
  }

  /** Parses from the last committed item to the end of the tensor infos; throws NeedMore to get more bytes. */
  parse(): void {
    this.#pos = this.committed;
    if (this.tensorCount < 0) this.#fixedHeader();
    while (this.kvs.size < this.kvCount) {
      const i = this.kvs.size;
      const keyAt = this.#pos;
      const key = this.#string(`key of metadata pair #${i}`);
      const typeAt = this.#pos;
      const type = this.#u32(`value type of key ${key}`);
      if (type > 12) {
        throw this.#err(
          "bad_value",
          typeAt,
          `key ${key} has value type ${type}, expected one of 0..12 (u8..f64): the file is corrupt: ${REDOWNLOAD}`,
        );
      }
      const value = this.#value(type, `value of key ${key}`, 0);
      if (this.kvs.has(key)) {
        throw this.#err(
          "bad_value",
          keyAt,
          `metadata key ${key} appears twice, expected unique keys: ${REDOWNLOAD}`,
        );
      }
      this.kvs.set(key, { type: type as GgufValueType, value });
      this.committed = this.#pos;
    }
    while (this.tensors.length < this.tensorCount) {
      this.tensors.push(this.#tensorInfo(this.tensors.length));
      this.committed = this.#pos;
    }
  }

  #fixedHeader(): void {
    this.#need(24, "the 24-byte GGUF header");
    const magic = this.#dv.getUint32(0, true);
    if (magic !== GGUF_MAGIC) {
      const found = Array.from(this.#buf.subarray(0, 4), (b) => b.toString(16).padStart(2, "0")).join(" ");
      throw this.#err(
        "bad_magic",
        0,
        `expected magic bytes 47 47 55 46 ("GGUF") but found ${found}: this is not a GGUF file`,
      );
    }
    const version = this.#dv.getUint32(4, true);
    const swapped = this.#dv.getUint32(4, false);
    if (version !== 2 && version !== 3) {
      const hint = swapped >= 1 && swapped <= 3
        ? `this is a big-endian GGUF (version ${swapped} byte-swapped), which is not supported: ` +
          `use a little-endian export`
        : version === 1
        ? `GGUF v1 used 32-bit counts and is not supported: re-export the model with a current llama.cpp`
        : `re-export the model with a llama.cpp that writes GGUF v3`;
      throw this.#err("bad_version", 4, `unsupported GGUF version ${version}, expected 2 or 3: ${hint}`);
    }
    this.version = version;
    this.#pos = 8;
    const tensorCount = this.#count("tensor count");
    const kvCount = this.#count("metadata pair count");
    // A KV needs at least 8 (key length) + 4 (type) + 1 bytes, a tensor info 8 + 4 + 8 + 4 + 8. Counts that
    // cannot fit in the whole file fail here; merely truncated files fail at the first item past the end,
    // which names it. Nothing is allocated per count, so the loops end at the file end either way.
    this.#bound(kvCount, 13, "metadata pair count", 16, true);
    this.#bound(tensorCount, 32, "tensor count", 8, true);
    this.tensorCount = tensorCount;
    this.kvCount = kvCount;
    this.committed = this.#pos;
  }

  #tensorInfo(i: number): RawTensor {
    const at = this.#pos;
    const name = this.#string(`name of tensor info #${i}`);
    const what = `tensor ${name} (info #${i})`;
    const bad = (off: number, msg: string) => this.#err("bad_tensor", off, `${what}: ${msg}: ${REDOWNLOAD}`);
    const nDimsAt = this.#pos;
    const nDims = this.#u32(`n_dims of ${what}`);
    if (nDims < 1 || nDims > 4) throw bad(nDimsAt, `n_dims is ${nDims}, expected 1..4`);
    const ne: number[] = [];
    let nElems = 1;
    for (let d = 0; d < nDims; d++) {
      const dimAt = this.#pos;
      const v = this.#u64n(`ne[${d}] of ${what}`);
      if (v === 0) throw bad(dimAt, `ne[${d}] is 0, expected a dimension >= 1`);
      nElems *= v;
      if (!Number.isSafeInteger(nElems) || nElems > this.fileSize * 8) {
        throw bad(
          dimAt,
          `ne[${d}] is ${this.#dv.getBigUint64(dimAt, true)}, which makes more elements than the ` +
            `${this.fileSize}-byte file can hold`,
        );
      }
      ne.push(v);
    }
    const typeAt = this.#pos;
    const typeId = this.#u32(`type of ${what}`);
    const type = GGML_TYPES.get(typeId);
    if (type === undefined) {
      throw bad(typeAt, `ggml type id ${typeId} is unknown or retired (ids 4, 5, 31-33, 36-38 are retired)`);
    }
    const ne0 = ne[0]!;
    if (ne0 % type.blockElems !== 0) {
      throw bad(
        nDimsAt + 4,
        `ne[0] = ${ne0} is not a multiple of the ${type.name} block size ${type.blockElems}`,
      );
    }
    const nbytes = (nElems / type.blockElems) * type.blockBytes;
    const offsetBytes = this.#u64n(`data offset of ${what}`);
    return { name, infoOffsetBytes: at, ne, type, nElems, nbytes, offsetBytes };
  }

  get pos(): number {
    return this.#pos;
  }
}

function numericArray(t: GgufValueType, buf: Uint8Array, start: number, count: number): GgufArrayValues {
  const size = FIXED_SIZE[t]!;
  // slice() copies into a fresh, aligned ArrayBuffer; on a little-endian host it is already the decoded array.
  const bytes = buf.slice(start, start + count * size).buffer;
  const out = makeTyped(t, bytes);
  if (!HOST_LITTLE_ENDIAN) {
    const dv = new DataView(buf.buffer, buf.byteOffset + start, count * size);
    const set = out as unknown as { [i: number]: number | bigint };
    for (let i = 0; i < count; i++) set[i] = readLe(dv, t, i * size);
  }
  return out;
}

function makeTyped(t: GgufValueType, b: ArrayBuffer): GgufArrayValues {
  switch (t) {
    case GGUF_VALUE_TYPE.UINT8:
      return new Uint8Array(b);
    case GGUF_VALUE_TYPE.INT8:
      return new Int8Array(b);
    case GGUF_VALUE_TYPE.UINT16:
      return new Uint16Array(b);
    case GGUF_VALUE_TYPE.INT16:
      return new Int16Array(b);
    case GGUF_VALUE_TYPE.UINT32:
      return new Uint32Array(b);
    case GGUF_VALUE_TYPE.INT32:
      return new Int32Array(b);
    case GGUF_VALUE_TYPE.FLOAT32:
      return new Float32Array(b);
    case GGUF_VALUE_TYPE.FLOAT64:
      return new Float64Array(b);
    case GGUF_VALUE_TYPE.UINT64:
      return new BigUint64Array(b);
    case GGUF_VALUE_TYPE.INT64:
      return new BigInt64Array(b);
    case GGUF_VALUE_TYPE.BOOL:
    case GGUF_VALUE_TYPE.STRING:
    case GGUF_VALUE_TYPE.ARRAY:
      throw new Error(`Internal error: value type ${t} is not numeric`);
    default: {
      const never: never = t;
      throw new Error(`Internal error: unknown value type ${never}`);
    }
  }
}

function readLe(dv: DataView, t: GgufValueType, off: number): number | bigint {
  switch (t) {
    case GGUF_VALUE_TYPE.UINT16:
      return dv.getUint16(off, true);
    case GGUF_VALUE_TYPE.INT16:
      return dv.getInt16(off, true);
    case GGUF_VALUE_TYPE.UINT32:
      return dv.getUint32(off, true);
    case GGUF_VALUE_TYPE.INT32:
      return dv.getInt32(off, true);
    case GGUF_VALUE_TYPE.FLOAT32:
      return dv.getFloat32(off, true);
    case GGUF_VALUE_TYPE.FLOAT64:
      return dv.getFloat64(off, true);
    case GGUF_VALUE_TYPE.UINT64:
      return dv.getBigUint64(off, true);
    case GGUF_VALUE_TYPE.INT64:
      return dv.getBigInt64(off, true);
    default:
      return dv.getUint8(off);
  }
}

export async function openHandle(path: string, missing: () => GgufError): Promise<PartHandle> {
  const notRegular = (what: string) =>
    new GgufError(
      "io",
      `GGUF path ${path} is ${what}, not a regular file: pass the .gguf file itself (a FIFO, device or ` +
        `folder would block or never end)`,
      { path },
    );
  let file: Deno.FsFile;
  try {
    // Checked before opening: opening a FIFO for reading blocks until a writer appears.
    const pre = await Deno.stat(path);
    if (!pre.isFile) throw notRegular(kindOf(pre));
    file = await Deno.open(path, { read: true });
  } catch (e) {
    if (e instanceof GgufError) throw e;
    if (e instanceof Deno.errors.NotFound) throw missing();
    throw new GgufError("io", `Cannot open GGUF file ${path}: ${(e as Error).message}: check the path`, {
      path,
      cause: e,
    });
  }
  try {
    const st = await file.stat();
    if (!st.isFile) throw notRegular(kindOf(st));
    return new PartHandle(path, file, st.size);
  } catch (e) {
    file.close();
    throw e;
  }
}

/** What a non-regular path is, for messages. */
function kindOf(st: Deno.FileInfo): string {
  if (st.isDirectory) return "a folder";
  if (st.isFifo) return "a FIFO (named pipe)";
  if (st.isCharDevice || st.isBlockDevice) return "a device file";
  if (st.isSocket) return "a socket";
  return "a special file";
}

/** Reads and validates the header of one part (no tensor data is read). */
export async function parsePart(handle: PartHandle, initialReadBytes: number): Promise<ParsedPart> {
  const { path, sizeBytes } = handle;
  const parser = new HeaderParser(path, sizeBytes);
  let buf = new Uint8Array(0);
  let want = Math.min(sizeBytes, Math.max(initialReadBytes, 24));
  for (;;) {
    if (want > buf.length) {
      const next = new Uint8Array(want);
      next.set(buf);
      await handle.read(buf.length, next.subarray(buf.length));
      buf = next;
      parser.setBuffer(buf);
    }
    try {
      parser.parse();
      break;
    } catch (e) {
      if (!(e instanceof NeedMore)) throw e;
      // Growing 4x keeps the re-parse of a partly read array (restarted from its key) cheap in total.
      want = Math.min(sizeBytes, MAX_HEADER_BYTES, Math.max(buf.length * 4, e.endBytes));
    }
  }
  const metadata = new GgufMetadata(parser.kvs, path);
  let alignment = DEFAULT_ALIGNMENT;
  if (metadata.has(KEYS.alignment)) {
    const kvAlign = metadata.entries.get(KEYS.alignment)!;
    const a = INTEGER_TYPES.has(kvAlign.type) && typeof kvAlign.value === "number" ? kvAlign.value : NaN;
    if (!(a > 0 && a % 8 === 0)) {
      throw new GgufError(
        "bad_value",
        `GGUF file ${path}: ${KEYS.alignment} is ${describe(kvAlign)} ${
          preview(kvAlign.value)
        }, expected a ` +
          `positive multiple of 8 (default 32): ${REDOWNLOAD}`,
        { path },
      );
    }
    alignment = a;
  }
  const infoEnd = parser.pos;
  const dataStartBytes = infoEnd + (alignment - (infoEnd % alignment)) % alignment;
  if (parser.tensors.length > 0 && dataStartBytes > sizeBytes) {
    throw new GgufError(
      "truncated",
      `GGUF file ${path} at byte ${infoEnd}: the data section of ${parser.tensors.length} tensors starts at ` +
        `byte ${dataStartBytes} but the file ends at byte ${sizeBytes}: the file is truncated: ${REDOWNLOAD}`,
      { path, offsetBytes: infoEnd },
    );
  }
  const seen = new Map<string, RawTensor>();
  for (const t of parser.tensors) {
    const what = `GGUF file ${path} at byte ${t.infoOffsetBytes}: tensor ${t.name}`;
    const at = { path, offsetBytes: t.infoOffsetBytes };
    const prev = seen.get(t.name);
    if (prev !== undefined) {
      throw new GgufError(
        "bad_tensor",
        `${what} is listed twice (first at byte ${prev.infoOffsetBytes}), expected unique names: ${REDOWNLOAD}`,
        at,
      );
    }
    seen.set(t.name, t);
    if (t.offsetBytes % alignment !== 0) {
      throw new GgufError(
        "bad_tensor",
        `${what} has data offset ${t.offsetBytes}, expected a multiple of the alignment ${alignment}: ` +
          REDOWNLOAD,
        at,
      );
    }
    const abs = dataStartBytes + t.offsetBytes;
    if (abs > sizeBytes) {
      throw new GgufError(
        "bad_tensor",
        `${what} has data offset ${t.offsetBytes} (absolute byte ${abs}) beyond the end of the ` +
          `${sizeBytes}-byte file: ${REDOWNLOAD}`,
        at,
      );
    }
    if (abs + t.nbytes > sizeBytes) {
      throw new GgufError(
        "truncated",
        `${what} (${t.type.name}, ne=[${t.ne.join(", ")}]) needs ${t.nbytes} bytes from byte ${abs} to ` +
          `${
            abs + t.nbytes
          } but the file ends at byte ${sizeBytes}: the tensor data is truncated: ${REDOWNLOAD}`,
        at,
      );
    }
  }
  // Tensors may be stored in any order but must not share bytes: a corrupt yet aligned offset would
  // otherwise silently alias another tensor's data.
  const byOffset = [...parser.tensors].sort((a, b) => a.offsetBytes - b.offsetBytes);
  for (let i = 1; i < byOffset.length; i++) {
    const prev = byOffset[i - 1]!;
    const t = byOffset[i]!;
    if (prev.offsetBytes + prev.nbytes > t.offsetBytes) {
      throw new GgufError(
        "bad_tensor",
        `GGUF file ${path} at byte ${t.infoOffsetBytes}: tensor ${t.name} has data offset ${t.offsetBytes}, ` +
          `inside the data of tensor ${prev.name} (offset ${prev.offsetBytes}, ${prev.nbytes} bytes), ` +
          `expected tensors not to overlap: ${REDOWNLOAD}`,
        { path, offsetBytes: t.infoOffsetBytes },
      );
    }
  }
  return {
    handle,
    version: parser.version,
    alignment,
    dataStartBytes,
    kvs: parser.kvs,
    tensors: parser.tensors,
  };
}
