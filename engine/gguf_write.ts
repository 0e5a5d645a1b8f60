/**
 * Streaming GGUF v3 writer, single-file and split (spec `gguf.md` §2, §5).
 *
 * The header (metadata and tensor infos) is built in memory; tensor data streams through one reusable
 * 16 MiB chunk buffer (large chunks bypass it), so a file of any size is written without holding it in
 * memory. Each tensor is padded to the alignment, and each producer must deliver exactly its tensor's bytes.
 *
 * @example
 * ```ts
 * import { GGUF_VALUE_TYPE } from "./gguf.ts";
 * import { kv, writeGguf } from "./gguf_write.ts";
 * await writeGguf("/tmp/tiny.gguf", {
 *   kv: [["test.n", kv.u32(7)], ["test.names", kv.arr(GGUF_VALUE_TYPE.STRING, ["a", "b"])]],
 *   tensors: [{ name: "w", type: "F32", ne: [4, 2], data: new Uint8Array(32) }],
 * });
 * ```
 * @module
 */
import {
  GGUF_VALUE_TYPE,
  type GgufArray,
  type GgufArrayValues,
  type GgufKv,
  type GgufValue,
  type GgufValueType,
  splitPartPath,
  valueTypeName,
} from "./gguf.ts";
import { KEYS } from "./names.ts";
import { GGML_TYPES, type GgmlTypeInfo, type GgmlTypeName, TYPE_ID } from "./quant/types.ts";

/** Receives consecutive chunks of one tensor's data; await each call before the next. */
export type GgufChunkSink = (chunk: Uint8Array) => Promise<void>;

/** One tensor to write. */
export interface GgufWriteTensor {
  /** GGUF tensor name (unique in the file). */
  readonly name: string;
  /** ggml type by supported name or by id (any non-retired id). */
  readonly type: GgmlTypeName | number;
  /** Dimensions, 1..4 entries, innermost first; `ne[0]` a multiple of the type's block size. */
  readonly ne: readonly number[];
  /** The bytes, or a producer that calls `sink` with consecutive chunks totalling exactly the tensor's bytes. */
  readonly data: Uint8Array | ((sink: GgufChunkSink) => Promise<void>);
}

/** What to write: metadata in order, tensors in order, and the data alignment. */
export interface GgufWriteSpec {
  /** Metadata pairs in file order (build values with {@linkcode kv}). */
  readonly kv: ReadonlyArray<readonly [string, GgufKv]>;
  /** Tensors in file order. */
  readonly tensors: readonly GgufWriteTensor[];
  /** Data alignment, a positive multiple of 8 (default 32); `general.alignment` is written only when != 32. */
  readonly alignment?: number;
}

const FIXED_INT_TYPES: readonly number[] = [0, 1, 2, 3, 4, 5, 10, 11];

/** Size of the reusable write buffer; chunks at least this large are written directly. */
const CHUNK_BYTES = 16 * 1024 * 1024;
const DEFAULT_ALIGNMENT = 32;
const HOST_LITTLE_ENDIAN = new Uint8Array(new Uint16Array([1]).buffer)[0] === 1;
const utf8 = new TextEncoder();

const INT_RANGE: Readonly<Partial<Record<GgufValueType, readonly [number, number]>>> = {
  0: [0, 0xff],
  1: [-0x80, 0x7f],
  2: [0, 0xffff],
  3: [-0x8000, 0x7fff],
  4: [0, 0xffff_ffff],
  5: [-0x8000_0000, 0x7fff_ffff],
};

function checkInt(type: GgufValueType, v: unknown, where: string): number {
  const [lo, hi] = INT_RANGE[type]!;
  if (typeof v !== "number" || !Number.isInteger(v) || v < lo || v > hi) {
    throw new RangeError(
      `${where}: expected a ${valueTypeName(type)} integer in ${lo}..${hi}, got ${String(v)}`,
    );
  }
  return v;
}

/** Normalizes a 64-bit integer to the reader's representation: number when safe, else bigint. */
function checkInt64(type: GgufValueType, v: unknown, where: string): number | bigint {
  const unsigned = type === GGUF_VALUE_TYPE.UINT64;
  const lo = unsigned ? 0n : -(1n << 63n);
  const hi = unsigned ? (1n << 64n) - 1n : (1n << 63n) - 1n;
  const b = typeof v === "bigint"
    ? v
    : typeof v === "number" && Number.isSafeInteger(v)
    ? BigInt(v)
    : undefined;
  if (b === undefined || b < lo || b > hi) {
    throw new RangeError(
      `${where}: expected a ${valueTypeName(type)} integer (safe number or bigint) in ${lo}..${hi}, got ${
        String(v)
      }`,
    );
  }
  return b >= BigInt(Number.MIN_SAFE_INTEGER) && b <= BigInt(Number.MAX_SAFE_INTEGER) ? Number(b) : b;
}

function checkScalar(type: GgufValueType, v: unknown, where: string): GgufValue {
  switch (type) {
    case GGUF_VALUE_TYPE.UINT8:
    case GGUF_VALUE_TYPE.INT8:
    case GGUF_VALUE_TYPE.UINT16:
    case GGUF_VALUE_TYPE.INT16:
    case GGUF_VALUE_TYPE.UINT32:
    case GGUF_VALUE_TYPE.INT32:
      return checkInt(type, v, where);
    case GGUF_VALUE_TYPE.UINT64:
    case GGUF_VALUE_TYPE.INT64:
      return checkInt64(type, v, where);
    case GGUF_VALUE_TYPE.FLOAT32:
    case GGUF_VALUE_TYPE.FLOAT64:
      if (typeof v !== "number") throw new RangeError(`${where}: expected a number, got ${String(v)}`);
      return type === GGUF_VALUE_TYPE.FLOAT32 ? Math.fround(v) : v;
    case GGUF_VALUE_TYPE.BOOL:
      if (typeof v !== "boolean") throw new RangeError(`${where}: expected a boolean, got ${String(v)}`);
      return v;
    case GGUF_VALUE_TYPE.STRING:
      if (typeof v !== "string") throw new RangeError(`${where}: expected a string, got ${String(v)}`);
      return v;
    case GGUF_VALUE_TYPE.ARRAY: {
      const a = v as Partial<GgufArray> | undefined;
      if (typeof a !== "object" || a === null || typeof a.elemType !== "number" || a.values === undefined) {
        throw new RangeError(`${where}: expected an array value { elemType, values }, got ${String(v)}`);
      }
      return canonArray(a.elemType, a.values, where);
    }
    default: {
      const never: never = type;
      throw new RangeError(`${where}: value type ${String(never)} is not a GGUF value type (0..12)`);
    }
  }
}

type TypedCtor =
  | Uint8ArrayConstructor
  | Int8ArrayConstructor
  | Uint16ArrayConstructor
  | Int16ArrayConstructor
  | Uint32ArrayConstructor
  | Int32ArrayConstructor
  | Float32ArrayConstructor
  | Float64ArrayConstructor
  | BigUint64ArrayConstructor
  | BigInt64ArrayConstructor;

const TYPED: Readonly<Partial<Record<GgufValueType, TypedCtor>>> = {
  0: Uint8Array,
  1: Int8Array,
  2: Uint16Array,
  3: Int16Array,
  4: Uint32Array,
  5: Int32Array,
  6: Float32Array,
  12: Float64Array,
  10: BigUint64Array,
  11: BigInt64Array,
};

/** Element inputs {@linkcode kv.arr} accepts (converted to the reader's representation). */
export type GgufArrayInput =
  | GgufArrayValues
  | ArrayLike<number>
  | ArrayLike<bigint>
  | readonly boolean[]
  | readonly string[]
  | ReadonlyArray<GgufArray | GgufKv>;

/** Checks every element and converts to the reader's representation (typed arrays for numeric types). */
function canonArray(elemType: number, values: unknown, where: string): GgufArray {
  if (!Number.isInteger(elemType) || elemType < 0 || elemType > 12) {
    throw new RangeError(`${where}: array element type ${elemType} is not a GGUF value type (0..12)`);
  }
  const t = elemType as GgufValueType;
  if (
    typeof values !== "object" || values === null || typeof (values as ArrayLike<unknown>).length !== "number"
  ) {
    throw new RangeError(`${where}: expected array values, got ${String(values)}`);
  }
  const src = values as ArrayLike<unknown>;
  const ctor = TYPED[t];
  if (ctor !== undefined) {
    if (src instanceof ctor) return { elemType: t, values: src as GgufArrayValues };
    const out = new ctor(src.length);
    const set = out as unknown as { [i: number]: number | bigint };
    const is64 = t === GGUF_VALUE_TYPE.UINT64 || t === GGUF_VALUE_TYPE.INT64;
    for (let i = 0; i < src.length; i++) {
      const v = checkScalar(t, src[i], `${where}[${i}]`) as number | bigint;
      set[i] = is64 ? BigInt(v) : v;
    }
    return { elemType: t, values: out as GgufArrayValues };
  }
  switch (t) {
    case GGUF_VALUE_TYPE.BOOL:
    case GGUF_VALUE_TYPE.STRING: {
      const out: unknown[] = new Array(src.length);
      for (let i = 0; i < src.length; i++) out[i] = checkScalar(t, src[i], `${where}[${i}]`);
      return { elemType: t, values: out as boolean[] | string[] };
    }
    case GGUF_VALUE_TYPE.ARRAY: {
      const out: GgufArray[] = [];
      for (let i = 0; i < src.length; i++) {
        const e = src[i] as Partial<GgufKv> & Partial<GgufArray>;
        const inner = e !== null && typeof e === "object" && "type" in e && e.type === GGUF_VALUE_TYPE.ARRAY
          ? e.value
          : e;
        out.push(checkScalar(GGUF_VALUE_TYPE.ARRAY, inner, `${where}[${i}]`) as GgufArray);
      }
      return { elemType: t, values: out };
    }
    default:
      throw new Error(`Internal error: element type ${t} has no typed array and no case`);
  }
}

/**
 * Constructors of metadata values with range checks; values come out exactly as the reader returns them
 * (f32 rounded, safe 64-bit integers as numbers, numeric arrays as typed arrays).
 */
export const kv = {
  /** A u8 value. */
  u8: (v: number): GgufKv => ({
    type: GGUF_VALUE_TYPE.UINT8,
    value: checkInt(GGUF_VALUE_TYPE.UINT8, v, "kv.u8"),
  }),
  /** An i8 value. */
  i8: (v: number): GgufKv => ({
    type: GGUF_VALUE_TYPE.INT8,
    value: checkInt(GGUF_VALUE_TYPE.INT8, v, "kv.i8"),
  }),
  /** A u16 value. */
  u16: (v: number): GgufKv => ({
    type: GGUF_VALUE_TYPE.UINT16,
    value: checkInt(GGUF_VALUE_TYPE.UINT16, v, "kv.u16"),
  }),
  /** An i16 value. */
  i16: (v: number): GgufKv => ({
    type: GGUF_VALUE_TYPE.INT16,
    value: checkInt(GGUF_VALUE_TYPE.INT16, v, "kv.i16"),
  }),
  /** A u32 value. */
  u32: (v: number): GgufKv => ({
    type: GGUF_VALUE_TYPE.UINT32,
    value: checkInt(GGUF_VALUE_TYPE.UINT32, v, "kv.u32"),
  }),
  /** An i32 value. */
  i32: (v: number): GgufKv => ({
    type: GGUF_VALUE_TYPE.INT32,
    value: checkInt(GGUF_VALUE_TYPE.INT32, v, "kv.i32"),
  }),
  /** A u64 value (number when safe, else bigint). */
  u64: (v: number | bigint): GgufKv => ({
    type: GGUF_VALUE_TYPE.UINT64,
    value: checkInt64(GGUF_VALUE_TYPE.UINT64, v, "kv.u64"),
  }),
  /** An i64 value (number when safe, else bigint). */
  i64: (v: number | bigint): GgufKv => ({
    type: GGUF_VALUE_TYPE.INT64,
    value: checkInt64(GGUF_VALUE_TYPE.INT64, v, "kv.i64"),
  }),
  /** An f32 value (rounded to f32 here, as the reader will return it). */
  f32: (v: number): GgufKv => ({
    type: GGUF_VALUE_TYPE.FLOAT32,
    value: checkScalar(GGUF_VALUE_TYPE.FLOAT32, v, "kv.f32"),
  }),
  /** An f64 value. */
  f64: (v: number): GgufKv => ({
    type: GGUF_VALUE_TYPE.FLOAT64,
    value: checkScalar(GGUF_VALUE_TYPE.FLOAT64, v, "kv.f64"),
  }),
  /** A bool value. */
  bool: (v: boolean): GgufKv => ({
    type: GGUF_VALUE_TYPE.BOOL,
    value: checkScalar(GGUF_VALUE_TYPE.BOOL, v, "kv.bool"),
  }),
  /** A UTF-8 string value. */
  str: (v: string): GgufKv => ({
    type: GGUF_VALUE_TYPE.STRING,
    value: checkScalar(GGUF_VALUE_TYPE.STRING, v, "kv.str"),
  }),
  /** An array of `elemType` elements; nested arrays take `GgufArray` or array-typed `GgufKv` elements. */
  arr: (elemType: GgufValueType, values: GgufArrayInput): GgufKv => ({
    type: GGUF_VALUE_TYPE.ARRAY,
    value: canonArray(elemType, values, "kv.arr"),
  }),
} as const;

/** Growable little-endian byte builder for the header. */
class ByteBuilder {
  #buf = new Uint8Array(1 << 16);
  #dv = new DataView(this.#buf.buffer);
  len = 0;

  #ensure(n: number): void {
    if (this.len + n <= this.#buf.length) return;
    let cap = this.#buf.length * 2;
    while (cap < this.len + n) cap *= 2;
    const next = new Uint8Array(cap);
    next.set(this.#buf.subarray(0, this.len));
    this.#buf = next;
    this.#dv = new DataView(next.buffer);
  }

  u8(v: number): void {
    this.#ensure(1);
    this.#buf[this.len++] = v;
  }

  u32(v: number): void {
    this.#ensure(4);
    this.#dv.setUint32(this.len, v, true);
    this.len += 4;
  }

  u64(v: number | bigint): void {
    this.#ensure(8);
    this.#dv.setBigUint64(this.len, BigInt(v), true);
    this.len += 8;
  }

  /** Writes one scalar of a fixed-size type. */
  scalar(t: GgufValueType, v: number | bigint | boolean): void {
    this.#ensure(8);
    const dv = this.#dv;
    const at = this.len;
    switch (t) {
      case GGUF_VALUE_TYPE.UINT8:
        dv.setUint8(at, v as number);
        this.len += 1;
        return;
      case GGUF_VALUE_TYPE.INT8:
        dv.setInt8(at, v as number);
        this.len += 1;
        return;
      case GGUF_VALUE_TYPE.BOOL:
        dv.setUint8(at, v ? 1 : 0);
        this.len += 1;
        return;
      case GGUF_VALUE_TYPE.UINT16:
        dv.setUint16(at, v as number, true);
        this.len += 2;
        return;
      case GGUF_VALUE_TYPE.INT16:
        dv.setInt16(at, v as number, true);
        this.len += 2;
        return;
      case GGUF_VALUE_TYPE.UINT32:
        dv.setUint32(at, v as number, true);
        this.len += 4;
        return;
      case GGUF_VALUE_TYPE.INT32:
        dv.setInt32(at, v as number, true);
        this.len += 4;
        return;
      case GGUF_VALUE_TYPE.FLOAT32:
        dv.setFloat32(at, v as number, true);
        this.len += 4;
        return;
      case GGUF_VALUE_TYPE.FLOAT64:
        dv.setFloat64(at, v as number, true);
        this.len += 8;
        return;
      case GGUF_VALUE_TYPE.UINT64:
        dv.setBigUint64(at, BigInt(v as number | bigint), true);
        this.len += 8;
        return;
      case GGUF_VALUE_TYPE.INT64:
        dv.setBigInt64(at, BigInt(v as number | bigint), true);
        this.len += 8;
        return;
      default:
        throw new Error(`Internal error: value type ${t} is not a fixed-size scalar`);
    }
  }

  bytes(b: Uint8Array): void {
    this.#ensure(b.length);
    this.#buf.set(b, this.len);
    this.len += b.length;
  }

  str(s: string): void {
    // UTF-8 needs at most 3 bytes per UTF-16 code unit.
    this.#ensure(8 + s.length * 3);
    const { written } = utf8.encodeInto(s, this.#buf.subarray(this.len + 8));
    this.#dv.setBigUint64(this.len, BigInt(written), true);
    this.len += 8 + written;
  }

  padTo(alignment: number): void {
    const pad = (alignment - (this.len % alignment)) % alignment;
    this.#ensure(pad);
    this.#buf.fill(0, this.len, this.len + pad);
    this.len += pad;
  }

  result(): Uint8Array {
    return this.#buf.subarray(0, this.len);
  }
}

function encodeValue(b: ByteBuilder, type: GgufValueType, value: GgufValue): void {
  if (type === GGUF_VALUE_TYPE.STRING) return b.str(value as string);
  if (type === GGUF_VALUE_TYPE.ARRAY) return encodeArray(b, value as GgufArray);
  b.scalar(type, value as number | bigint | boolean);
}

function encodeArray(b: ByteBuilder, arr: GgufArray): void {
  b.u32(arr.elemType);
  b.u64(arr.values.length);
  const v = arr.values;
  if (ArrayBuffer.isView(v) && HOST_LITTLE_ENDIAN) {
    b.bytes(new Uint8Array(v.buffer, v.byteOffset, v.byteLength));
    return;
  }
  for (let i = 0; i < v.length; i++) encodeValue(b, arr.elemType, v[i]!);
}

interface PlannedTensor {
  readonly src: GgufWriteTensor;
  readonly type: GgmlTypeInfo;
  readonly nbytes: number;
}

function planTensor(t: GgufWriteTensor): PlannedTensor {
  const where = `Tensor ${t.name}`;
  const id = typeof t.type === "number" ? t.type : TYPE_ID[t.type];
  const type = id === undefined ? undefined : GGML_TYPES.get(id);
  if (type === undefined) throw new RangeError(`${where}: ggml type ${t.type} is unknown or retired`);
  if (t.ne.length < 1 || t.ne.length > 4) {
    throw new RangeError(`${where}: ne=[${t.ne.join(", ")}] has ${t.ne.length} dims, expected 1..4`);
  }
  let nElems = 1;
  for (const d of t.ne) {
    if (!Number.isSafeInteger(d) || d < 1) {
      throw new RangeError(`${where}: ne=[${t.ne.join(", ")}] has dim ${d}, expected positive integers`);
    }
    nElems *= d;
  }
  if (!Number.isSafeInteger(nElems)) {
    throw new RangeError(`${where}: ne=[${t.ne.join(", ")}] has too many elements`);
  }
  if (t.ne[0]! % type.blockElems !== 0) {
    throw new RangeError(
      `${where}: ne[0] = ${t.ne[0]} is not a multiple of the ${type.name} block size ${type.blockElems}`,
    );
  }
  const nbytes = (nElems / type.blockElems) * type.blockBytes;
  if (t.data instanceof Uint8Array && t.data.length !== nbytes) {
    throw new RangeError(
      `${where} (${type.name}, ne=[${t.ne.join(", ")}]): data has ${t.data.length} bytes, expected ${nbytes}`,
    );
  }
  return { src: t, type, nbytes };
}

function alignUp(x: number, a: number): number {
  return x + (a - (x % a)) % a;
}

/** Buffers small writes into large chunks; chunks at least as large as the buffer go straight to the file. */
class ChunkWriter {
  readonly #file: Deno.FsFile;
  readonly #buf = new Uint8Array(CHUNK_BYTES);
  #len = 0;
  /** Bytes accepted so far (buffered or written). */
  total = 0;

  constructor(file: Deno.FsFile) {
    this.#file = file;
  }

  async #writeAll(b: Uint8Array): Promise<void> {
    let off = 0;
    while (off < b.length) off += await this.#file.write(b.subarray(off));
  }

  async flush(): Promise<void> {
    if (this.#len === 0) return;
    await this.#writeAll(this.#buf.subarray(0, this.#len));
    this.#len = 0;
  }

  /** Takes `b` (copied or written before returning, so the caller may reuse it). */
  async write(b: Uint8Array): Promise<void> {
    this.total += b.length;
    if (this.#len + b.length <= this.#buf.length) {
      this.#buf.set(b, this.#len);
      this.#len += b.length;
      return;
    }
    await this.flush();
    if (b.length >= this.#buf.length) {
      await this.#writeAll(b);
    } else {
      this.#buf.set(b, 0);
      this.#len = b.length;
    }
  }

  async zeros(n: number): Promise<void> {
    if (n > 0) await this.write(new Uint8Array(n));
  }
}

function resolveAlignment(spec: GgufWriteSpec): { alignment: number; kvs: Array<readonly [string, GgufKv]> } {
  const kvs = spec.kv.map(([k, v]) => [k, v] as const);
  const given = kvs.find(([k]) => k === KEYS.alignment)?.[1];
  if (given !== undefined && (typeof given.value !== "number" || FIXED_INT_TYPES.indexOf(given.type) < 0)) {
    throw new RangeError(
      `Metadata ${KEYS.alignment} must be an integer (u32), got ${valueTypeName(given.type)}`,
    );
  }
  const fromKv = given === undefined ? undefined : Number(given.value);
  const alignment = spec.alignment ?? fromKv ?? DEFAULT_ALIGNMENT;
  if (!Number.isSafeInteger(alignment) || alignment <= 0 || alignment % 8 !== 0) {
    throw new RangeError(`Alignment ${alignment} is not a positive multiple of 8`);
  }
  if (fromKv !== undefined && fromKv !== alignment) {
    throw new RangeError(`Metadata ${KEYS.alignment} = ${fromKv} disagrees with alignment ${alignment}`);
  }
  if (given === undefined && alignment !== DEFAULT_ALIGNMENT) {
    kvs.unshift([KEYS.alignment, kv.u32(alignment)]);
  }
  return { alignment, kvs };
}

/**
 * Streams a GGUF v3 file to `path`: header, tensor infos, padding, then each tensor's data padded to the
 * alignment. A failed write removes the partial file.
 * @returns the file size in bytes
 * @throws {RangeError} on an invalid spec (bad value, duplicate key or tensor name, shape, data size) or a
 *   producer that delivers a different number of bytes than the tensor has
 */
export async function writeGguf(path: string, spec: GgufWriteSpec): Promise<{ sizeBytes: number }> {
  const { alignment, kvs } = resolveAlignment(spec);
  const header = new ByteBuilder();
  header.u32(0x46554747);
  header.u32(3);
  header.u64(spec.tensors.length);
  header.u64(kvs.length);
  const seenKeys = new Set<string>();
  for (const [key, value] of kvs) {
    if (seenKeys.has(key)) throw new RangeError(`Metadata key ${key} is given twice`);
    seenKeys.add(key);
    const checked = checkScalar(value.type, value.value, `Metadata key ${key}`);
    header.str(key);
    header.u32(value.type);
    encodeValue(header, value.type, checked);
  }
  const planned = spec.tensors.map(planTensor);
  const names = new Set<string>();
  let offset = 0;
  for (const p of planned) {
    if (names.has(p.src.name)) throw new RangeError(`Tensor name ${p.src.name} is given twice`);
    names.add(p.src.name);
    header.str(p.src.name);
    header.u32(p.src.ne.length);
    for (const d of p.src.ne) header.u64(d);
    header.u32(p.type.id);
    header.u64(offset);
    offset = alignUp(offset + p.nbytes, alignment);
  }
  header.padTo(alignment);

  const file = await Deno.open(path, { write: true, create: true, truncate: true });
  let ok = false;
  try {
    const w = new ChunkWriter(file);
    await w.write(header.result());
    for (const p of planned) {
      await writeTensorData(w, p, path);
      await w.zeros(alignUp(p.nbytes, alignment) - p.nbytes);
    }
    await w.flush();
    ok = true;
    return { sizeBytes: w.total };
  } finally {
    file.close();
    if (!ok) await Deno.remove(path).catch((e: unknown) => console.error(`Could not remove ${path}: ${e}`));
  }
}

async function writeTensorData(w: ChunkWriter, p: PlannedTensor, path: string): Promise<void> {
  const data = p.src.data;
  if (data instanceof Uint8Array) return await w.write(data);
  const where = `Producer of tensor ${p.src.name} (${p.type.name}, ne=[${p.src.ne.join(", ")}]) in ${path}`;
  let delivered = 0;
  let busy = false;
  let finished = false;
  await data(async (chunk) => {
    if (finished) throw new RangeError(`${where} called the sink after it resolved`);
    if (busy) throw new RangeError(`${where} called the sink again before the previous call resolved`);
    if (delivered + chunk.length > p.nbytes) {
      throw new RangeError(`${where} delivered more than the tensor's ${p.nbytes} bytes`);
    }
    busy = true;
    try {
      await w.write(chunk);
      delivered += chunk.length;
    } finally {
      busy = false;
    }
  });
  finished = true;
  if (delivered !== p.nbytes) {
    throw new RangeError(`${where} delivered ${delivered} bytes, expected ${p.nbytes}`);
  }
}

/**
 * Assigns each tensor a part by where its bytes fall in the whole, keeping file order and, when there are at
 * least as many tensors as parts, giving every part at least one tensor.
 */
function distribute(nbytes: readonly number[], parts: number): number[] {
  const n = nbytes.length;
  // Fewer tensors than parts: one tensor per leading part, the trailing parts hold none.
  if (n < parts) return nbytes.map((_, i) => i);
  const total = nbytes.reduce((a, b) => a + b, 0);
  const out: number[] = [];
  let k = 0;
  let inK = 0;
  let start = 0;
  for (let i = 0; i < n; i++) {
    const mid = start + nbytes[i]! / 2;
    start += nbytes[i]!;
    const byBytes = total > 0 ? Math.floor((mid * parts) / total) : Math.floor((i * parts) / n);
    let target = Math.max(k, Math.min(parts - 1, byBytes));
    if (inK === 0) target = k;
    else if (n - i <= parts - 1 - k) target = k + 1;
    else target = Math.min(target, k + 1);
    if (target !== k) {
      k = target;
      inK = 0;
    }
    inK++;
    out.push(k);
  }
  return out;
}

/**
 * Writes `parts` split files `<prefix>-0000i-of-0000K.gguf` as gguf-split does: all metadata in part 1;
 * `split.no` (u16), `split.count` (u16) and `split.tensors.count` (i32) in every part; tensors distributed
 * by bytes in order.
 * @returns the part paths in order
 * @throws {RangeError} on an invalid spec, `parts` outside 1..99999, or split keys already in `spec.kv`
 */
export async function writeGgufSplit(prefix: string, spec: GgufWriteSpec, parts: number): Promise<string[]> {
  if (!Number.isInteger(parts) || parts < 1 || parts > 99999) {
    throw new RangeError(`Split part count ${parts} is outside 1..99999`);
  }
  const splitKeys: readonly string[] = [KEYS.splitNo, KEYS.splitCount, KEYS.splitTensorsCount];
  for (const [k] of spec.kv) {
    if (splitKeys.includes(k)) throw new RangeError(`Metadata key ${k} is set by writeGgufSplit; remove it`);
  }
  const { alignment } = resolveAlignment(spec);
  const assignment = distribute(spec.tensors.map((t) => planTensor(t).nbytes), parts);
  const paths: string[] = [];
  for (let i = 0; i < parts; i++) {
    const splitKv: Array<readonly [string, GgufKv]> = [
      [KEYS.splitNo, kv.u16(i)],
      [KEYS.splitCount, kv.u16(parts)],
      [KEYS.splitTensorsCount, kv.i32(spec.tensors.length)],
    ];
    const path = splitPartPath(prefix, i + 1, parts);
    const partKv = i === 0 ? [...spec.kv, ...splitKv] : splitKv;
    await writeGguf(path, {
      kv: partKv,
      tensors: spec.tensors.filter((_, j) => assignment[j] === i),
      alignment,
    });
    paths.push(path);
  }
  return paths;
}
