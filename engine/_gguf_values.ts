/**
 * GGUF metadata value types, the header's limits and constants, and split-file names (spec `gguf.md`):
 * shared by the header parser and the file reader.
 * @module
 */
import type { GgmlTypeInfo } from "./quant/types.ts";
import { GgufError } from "./errors.ts";

/** GGUF metadata value type ids (spec §2.2). */
export const GGUF_VALUE_TYPE = {
  UINT8: 0,
  INT8: 1,
  UINT16: 2,
  INT16: 3,
  UINT32: 4,
  INT32: 5,
  FLOAT32: 6,
  BOOL: 7,
  STRING: 8,
  ARRAY: 9,
  UINT64: 10,
  INT64: 11,
  FLOAT64: 12,
} as const;

/** A GGUF metadata value type id. */
export type GgufValueType = (typeof GGUF_VALUE_TYPE)[keyof typeof GGUF_VALUE_TYPE];

/**
 * Decoded elements of a GGUF array: numeric arrays as the typed array of their element type, bool arrays as
 * `boolean[]`, string arrays as `string[]`, nested arrays as `GgufArray[]`.
 */
export type GgufArrayValues =
  | Uint8Array
  | Int8Array
  | Uint16Array
  | Int16Array
  | Uint32Array
  | Int32Array
  | Float32Array
  | Float64Array
  | BigUint64Array
  | BigInt64Array
  | boolean[]
  | string[]
  | GgufArray[];

/**
 * A decoded metadata value. Scalars: integers and floats as `number`, except 64-bit integers that are not
 * safe integers, which are `bigint`.
 */
export type GgufValue = number | bigint | boolean | string | GgufArray;

/** A decoded GGUF array value. */
export interface GgufArray {
  /** Type of every element. */
  readonly elemType: GgufValueType;
  /** The elements (see {@linkcode GgufArrayValues} for the representation per type). */
  readonly values: GgufArrayValues;
}

/** One metadata key's value with its stored type. */
export interface GgufKv {
  /** Stored value type. */
  readonly type: GgufValueType;
  /** Decoded value. */
  readonly value: GgufValue;
}

/** Where one tensor lives and what it is. */
export interface GgufTensorInfo {
  /** GGUF tensor name. */
  readonly name: string;
  /** ggml type (may be one the engine does not support; the loader checks that). */
  readonly type: GgmlTypeInfo;
  /** Dimensions as stored, 1..4 entries, innermost first. */
  readonly ne: readonly number[];
  /** Product of `ne`. */
  readonly nElems: number;
  /** Bytes of the tensor's data. */
  readonly nbytes: number;
  /** 0-based index into {@linkcode GgufFile.parts}. */
  readonly part: number;
  /** Offset relative to the part's data start, as stored. */
  readonly offsetBytes: number;
  /** Absolute offset in its part file. */
  readonly absOffsetBytes: number;
}

/** One file of a (possibly split) GGUF model. */
export interface GgufPart {
  /** Path as opened. */
  readonly path: string;
  /** File size when opened. */
  readonly sizeBytes: number;
  /** GGUF version (2 or 3). */
  readonly version: number;
  /** Data alignment (`general.alignment`, default 32). */
  readonly alignment: number;
  /** Absolute offset of the data section. */
  readonly dataStartBytes: number;
  /** Tensors listed in this part. */
  readonly tensorCount: number;
}

/** Largest header (metadata + tensor infos) the reader accepts; real models have ~10 MB. */
export const MAX_HEADER_BYTES = 256 * 1024 * 1024;
/** Bytes read first when parsing a header; the buffer grows 4x until the header fits. */
export const INITIAL_READ_BYTES = 1 << 20;
/** Deepest array nesting accepted (arrays of arrays of ...); bounds recursion on corrupt input. */
export const MAX_ARRAY_DEPTH = 8;
export const DEFAULT_ALIGNMENT = 32;
export const GGUF_MAGIC = 0x46554747;
export const REDOWNLOAD = "re-download or re-export the file";

export const TYPE_NAMES: Readonly<Record<GgufValueType, string>> = {
  0: "u8",
  1: "i8",
  2: "u16",
  3: "i16",
  4: "u32",
  5: "i32",
  6: "f32",
  7: "bool",
  8: "string",
  9: "array",
  10: "u64",
  11: "i64",
  12: "f64",
};

/** Byte size of each fixed-size value type (string and array are variable). */
export const FIXED_SIZE: Readonly<Partial<Record<GgufValueType, number>>> = {
  0: 1,
  1: 1,
  2: 2,
  3: 2,
  4: 4,
  5: 4,
  6: 4,
  7: 1,
  10: 8,
  11: 8,
  12: 8,
};

export const INTEGER_TYPES: ReadonlySet<number> = new Set([0, 1, 2, 3, 4, 5, 10, 11]);

export const HOST_LITTLE_ENDIAN = new Uint8Array(new Uint16Array([1]).buffer)[0] === 1;

export const SPLIT_RE = /^(.*)-(\d{5})-of-(\d{5})\.gguf$/;

/** Human name of a value type id, e.g. `u32` (or `type 99` for an invalid id). */
export function valueTypeName(type: number): string {
  return TYPE_NAMES[type as GgufValueType] ?? `type ${type}`;
}

/** The path of split part `no` (1-based) of `count`: `<prefix>-0000N-of-0000M.gguf` (spec §5). */
export function splitPartPath(prefix: string, no: number, count: number): string {
  if (
    !Number.isInteger(count) || count < 1 || count > 99999 || !Number.isInteger(no) || no < 1 || no > count
  ) {
    throw new RangeError(
      `Split part ${no} of ${count} is out of range: expected 1 <= part <= count <= 99999`,
    );
  }
  return `${prefix}-${String(no).padStart(5, "0")}-of-${String(count).padStart(5, "0")}.gguf`;
}

/** Parses a split part path into prefix, 1-based part number and count, or undefined for other names. */
export function parseSplitPath(path: string): { prefix: string; no: number; count: number } | undefined {
  const m = SPLIT_RE.exec(path);
  if (!m) return undefined;
  return { prefix: m[1]!, no: Number(m[2]), count: Number(m[3]) };
}

export function describe(kv: GgufKv): string {
  return kv.type === GGUF_VALUE_TYPE.ARRAY
    ? `array of ${valueTypeName((kv.value as GgufArray).elemType)}`
    : valueTypeName(kv.type);
}

/** Metadata of a GGUF file: typed getters over the decoded key/value map. */
export class GgufMetadata {
  /** Every key in file order. */
  readonly entries: ReadonlyMap<string, GgufKv>;
  /** File the metadata came from (for error messages). */
  readonly path: string;

  /**
   * Wraps decoded key/value pairs.
   * @param entries decoded key/value pairs
   * @param path file they came from
   */
  constructor(entries: ReadonlyMap<string, GgufKv>, path: string) {
    this.entries = entries;
    this.path = path;
  }

  /** True when `key` is present. */
  has(key: string): boolean {
    return this.entries.has(key);
  }

  #bad(key: string, expected: string, kv: GgufKv | undefined): GgufError {
    const found = kv === undefined ? "it is missing" : `it is ${describe(kv)} ${preview(kv.value)}`;
    return new GgufError(
      "bad_value",
      `Metadata key ${key} in ${this.path}: expected ${expected} but ${found}: ` +
        `use a GGUF exported for this engine or fix the key`,
      { path: this.path },
    );
  }

  /**
   * An integer stored with any integer type (u8..i64).
   * @throws {GgufError} `bad_value` when missing (and no fallback), not an integer type, or not a safe integer
   */
  getInt(key: string, fallback?: number): number {
    const kv = this.entries.get(key);
    if (kv === undefined && fallback !== undefined) return fallback;
    if (kv === undefined || !INTEGER_TYPES.has(kv.type) || typeof kv.value !== "number") {
      throw this.#bad(key, "an integer (u8..i64) that is a safe integer", kv);
    }
    return kv.value;
  }

  /**
   * A float stored as f32 or f64 (integers are accepted too).
   * @throws {GgufError} `bad_value` when missing (and no fallback) or not numeric
   */
  getFloat(key: string, fallback?: number): number {
    const kv = this.entries.get(key);
    if (kv === undefined && fallback !== undefined) return fallback;
    if (
      kv === undefined || typeof kv.value !== "number" ||
      !(INTEGER_TYPES.has(kv.type) || kv.type === GGUF_VALUE_TYPE.FLOAT32 ||
        kv.type === GGUF_VALUE_TYPE.FLOAT64)
    ) {
      throw this.#bad(key, "a number (f32, f64 or integer)", kv);
    }
    return kv.value;
  }

  /**
   * A string value.
   * @throws {GgufError} `bad_value` when missing (and no fallback) or not a string
   */
  getString(key: string, fallback?: string): string {
    const kv = this.entries.get(key);
    if (kv === undefined && fallback !== undefined) return fallback;
    if (kv === undefined || typeof kv.value !== "string") throw this.#bad(key, "a string", kv);
    return kv.value;
  }

  /**
   * A bool value.
   * @throws {GgufError} `bad_value` when missing (and no fallback) or not a bool
   */
  getBool(key: string, fallback?: boolean): boolean {
    const kv = this.entries.get(key);
    if (kv === undefined && fallback !== undefined) return fallback;
    if (kv === undefined || typeof kv.value !== "boolean") throw this.#bad(key, "a bool", kv);
    return kv.value;
  }

  /**
   * An array value of any element type.
   * @throws {GgufError} `bad_value` when missing or not an array
   */
  getArray(key: string): GgufArray {
    const kv = this.entries.get(key);
    if (kv === undefined || kv.type !== GGUF_VALUE_TYPE.ARRAY) throw this.#bad(key, "an array", kv);
    return kv.value as GgufArray;
  }

  /**
   * An integer array, or an integer scalar returned as `[v]` (per-layer keys may be either).
   * @throws {GgufError} `bad_value` when missing, of another type, or holding an unsafe 64-bit value
   */
  getIntArray(key: string): number[] {
    const kv = this.entries.get(key);
    if (kv !== undefined && INTEGER_TYPES.has(kv.type)) return [this.getInt(key)];
    const expected = "an integer array or integer scalar";
    if (kv === undefined || kv.type !== GGUF_VALUE_TYPE.ARRAY) throw this.#bad(key, expected, kv);
    const arr = kv.value as GgufArray;
    if (!INTEGER_TYPES.has(arr.elemType)) throw this.#bad(key, expected, kv);
    const out: number[] = [];
    for (const v of Array.from(arr.values as ArrayLike<number | bigint>)) {
      const n = Number(v);
      if (!Number.isSafeInteger(n)) throw this.#bad(key, `${expected} of safe integers (found ${v})`, kv);
      out.push(n);
    }
    return out;
  }

  /**
   * A float array (f32, f64 or integer elements), or a numeric scalar returned as `[v]`.
   * @throws {GgufError} `bad_value` when missing or of another type
   */
  getFloatArray(key: string): number[] {
    const kv = this.entries.get(key);
    if (kv !== undefined && kv.type !== GGUF_VALUE_TYPE.ARRAY) return [this.getFloat(key)];
    const expected = "a numeric array or numeric scalar";
    if (kv === undefined) throw this.#bad(key, expected, kv);
    const arr = kv.value as GgufArray;
    const t = arr.elemType;
    if (!(INTEGER_TYPES.has(t) || t === GGUF_VALUE_TYPE.FLOAT32 || t === GGUF_VALUE_TYPE.FLOAT64)) {
      throw this.#bad(key, expected, kv);
    }
    return Array.from(arr.values as ArrayLike<number | bigint>, Number);
  }

  /**
   * A bool array, or a bool scalar returned as `[v]`.
   * @throws {GgufError} `bad_value` when missing or of another type
   */
  getBoolArray(key: string): boolean[] {
    const kv = this.entries.get(key);
    if (kv !== undefined && kv.type === GGUF_VALUE_TYPE.BOOL) return [kv.value as boolean];
    if (
      kv === undefined || kv.type !== GGUF_VALUE_TYPE.ARRAY ||
      (kv.value as GgufArray).elemType !== GGUF_VALUE_TYPE.BOOL
    ) {
      throw this.#bad(key, "a bool array or bool scalar", kv);
    }
    return (kv.value as GgufArray).values as boolean[];
  }

  /**
   * A string array.
   * @throws {GgufError} `bad_value` when missing or of another type
   */
  getStringArray(key: string): string[] {
    const kv = this.entries.get(key);
    if (
      kv === undefined || kv.type !== GGUF_VALUE_TYPE.ARRAY ||
      (kv.value as GgufArray).elemType !== GGUF_VALUE_TYPE.STRING
    ) {
      throw this.#bad(key, "a string array", kv);
    }
    return (kv.value as GgufArray).values as string[];
  }
}

export function preview(v: GgufValue): string {
  if (typeof v === "string") return JSON.stringify(v.length > 40 ? v.slice(0, 40) + "..." : v);
  if (typeof v === "object") return `[${v.values.length} elements]`;
  return String(v);
}
