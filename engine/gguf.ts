/**
 * Validating, lazy GGUF v2/v3 reader with split-file support (spec `gguf.md`).
 *
 * The header (metadata and tensor infos) is parsed from a buffer that starts at 1 MiB and grows as needed;
 * tensor data stays on disk and is read on demand by positioned reads from kept-open handles, serialized per
 * handle. Every count, length and offset is bounded by the bytes left in the file before anything is
 * allocated or read, so a corrupt file fails with a {@linkcode GgufError} naming the file, the byte offset,
 * what was expected and what was found.
 *
 * @example
 * ```ts
 * import { openGguf } from "./gguf.ts";
 * const gguf = await openGguf("model-00001-of-00003.gguf");
 * const emb = gguf.tensor("token_embd.weight");
 * const firstRow = await gguf.readTensor(emb.name, { sizeBytes: 64 });
 * gguf.close();
 * ```
 * @module
 */

import { GgufError } from "./errors.ts";
import { openHandle, type ParsedPart, parsePart, PartHandle } from "./_gguf_parse.ts";
import {
  GGUF_VALUE_TYPE,
  type GgufArray,
  type GgufArrayValues,
  type GgufKv,
  GgufMetadata,
  type GgufPart,
  type GgufTensorInfo,
  type GgufValue,
  type GgufValueType,
  INITIAL_READ_BYTES,
  MAX_HEADER_BYTES,
  parseSplitPath,
  splitPartPath,
  valueTypeName,
} from "./_gguf_values.ts";
import { KEYS } from "./names.ts";

export {
  GGUF_VALUE_TYPE,
  type GgufArray,
  type GgufArrayValues,
  type GgufKv,
  GgufMetadata,
  type GgufPart,
  type GgufTensorInfo,
  type GgufValue,
  type GgufValueType,
  MAX_HEADER_BYTES,
  parseSplitPath,
  splitPartPath,
  valueTypeName,
};

/** Options of {@linkcode openGguf}. */
export interface OpenGgufOptions {
  /** First header read size in bytes (default 1 MiB; tests use tiny values to exercise buffer growth). */
  readonly initialReadBytes?: number;
}

/** One logical GGUF model: all its split parts, their merged tensor table and part 1's metadata. */
export class GgufFile {
  /** Path of the first part. */
  readonly path: string;
  /** Every part in order (one for an unsplit file). */
  readonly parts: readonly GgufPart[];
  /** Metadata of part 1 (split parts 2.. carry only split keys, which are ignored here). */
  readonly metadata: GgufMetadata;
  /** Every tensor of every part by name, in file order. */
  readonly tensors: ReadonlyMap<string, GgufTensorInfo>;
  readonly #handles: readonly PartHandle[];

  /** Use {@linkcode openGguf}. */
  constructor(
    parts: readonly GgufPart[],
    metadata: GgufMetadata,
    tensors: ReadonlyMap<string, GgufTensorInfo>,
    handles: readonly PartHandle[],
  ) {
    this.path = parts[0]?.path ?? "";
    this.parts = parts;
    this.metadata = metadata;
    this.tensors = tensors;
    this.#handles = handles;
  }

  /**
   * The info of tensor `name`.
   * @throws {GgufError} `bad_tensor` when the file has no such tensor
   */
  tensor(name: string): GgufTensorInfo {
    const t = this.tensors.get(name);
    if (t === undefined) {
      const where = this.parts.length > 1
        ? `${this.path} (and its ${this.parts.length - 1} other parts)`
        : this.path;
      throw new GgufError(
        "bad_tensor",
        `GGUF file ${where} has no tensor ${name} (it has ${this.tensors.size} tensors): ` +
          `the file does not match the expected model: use a GGUF of the right architecture`,
        { path: this.path },
      );
    }
    return t;
  }

  #range(name: string, offsetBytes: number, sizeBytes: number): { t: GgufTensorInfo; abs: number } {
    const t = this.tensor(name);
    if (
      !Number.isSafeInteger(offsetBytes) || !Number.isSafeInteger(sizeBytes) || offsetBytes < 0 ||
      sizeBytes < 0 ||
      offsetBytes + sizeBytes > t.nbytes
    ) {
      throw new RangeError(
        `Read of ${sizeBytes} bytes at offset ${offsetBytes} of tensor ${name} is outside its ${t.nbytes} bytes`,
      );
    }
    return { t, abs: t.absOffsetBytes + offsetBytes };
  }

  /**
   * Reads the bytes of tensor `name` (or the sub-range `offsetBytes`..`offsetBytes + sizeBytes`) from disk.
   * @throws {RangeError} when the range is outside the tensor
   * @throws {GgufError} `io`/`truncated` when the read fails
   */
  async readTensor(
    name: string,
    opts: { offsetBytes?: number; sizeBytes?: number } = {},
  ): Promise<Uint8Array> {
    const t = this.tensor(name);
    const offsetBytes = opts.offsetBytes ?? 0;
    const sizeBytes = opts.sizeBytes ?? t.nbytes - offsetBytes;
    const { abs } = this.#range(name, offsetBytes, sizeBytes);
    const dst = new Uint8Array(sizeBytes);
    await this.#handles[t.part]!.read(abs, dst);
    return dst;
  }

  /**
   * Fills `dst` with `dst.length` bytes of tensor `name` starting at `offsetBytes` within the tensor (for
   * streaming uploads through a reusable staging buffer).
   * @throws {RangeError} when the range is outside the tensor
   * @throws {GgufError} `io`/`truncated` when the read fails
   */
  async readTensorInto(name: string, dst: Uint8Array, offsetBytes: number): Promise<void> {
    const { t, abs } = this.#range(name, offsetBytes, dst.length);
    await this.#handles[t.part]!.read(abs, dst);
  }

  /** Closes every part's file handle; later reads fail with `GgufError` `io`. */
  close(): void {
    for (const h of this.#handles) h.close();
  }

  /** Same as {@linkcode close}, for `using`. */
  [Symbol.dispose](): void {
    this.close();
  }
}

function splitErr(path: string, msg: string): GgufError {
  return new GgufError("bad_split", msg, { path });
}

/** Reads a split key with the any-integer rule, or undefined when absent. */
function splitKey(p: ParsedPart, key: string): number | undefined {
  const md = new GgufMetadata(p.kvs, p.handle.path);
  return md.has(key) ? md.getInt(key) : undefined;
}

/**
 * Opens a GGUF model and validates its header; tensor data stays on disk. A split part path
 * (`<prefix>-0000N-of-0000M.gguf`) opens the whole set from part 1, checking every part (spec §5).
 * @throws {GgufError} on a missing, malformed, truncated or inconsistent file or part (see its `code`)
 */
export async function openGguf(path: string, opts: OpenGgufOptions = {}): Promise<GgufFile> {
  const initial = opts.initialReadBytes ?? INITIAL_READ_BYTES;
  const split = parseSplitPath(path);
  const parsed: ParsedPart[] = [];
  try {
    if (split !== undefined) {
      const { prefix, no, count } = split;
      if (count < 1 || no < 1 || no > count) {
        throw splitErr(
          path,
          `GGUF split name ${path} says part ${no} of ${count}, expected 1 <= part <= count: rename the file`,
        );
      }
      for (let i = 1; i <= count; i++) {
        const p = splitPartPath(prefix, i, count);
        const handle = await openHandle(
          p,
          () =>
            splitErr(
              p,
              `GGUF split part ${i} of ${count} is missing: expected file ${p} (opened via ${path}): ` +
                `download all ${count} parts into the same folder`,
            ),
        );
        try {
          parsed.push(await parsePart(handle, initial));
        } catch (e) {
          handle.close();
          throw e;
        }
        checkPart(parsed[i - 1]!, i, count, true);
      }
    } else {
      const handle = await openHandle(
        path,
        () => new GgufError("io", `GGUF file ${path} does not exist: check the path`, { path }),
      );
      try {
        parsed.push(await parsePart(handle, initial));
      } catch (e) {
        handle.close();
        throw e;
      }
      const count = splitKey(parsed[0]!, KEYS.splitCount);
      if (count !== undefined && count > 1) {
        throw splitErr(
          path,
          `GGUF file ${path} is part of a ${count}-part split (${KEYS.splitCount} = ${count}) but its name ` +
            `does not end in -0000N-of-${String(count).padStart(5, "0")}.gguf: restore the names ` +
            `gguf-split gave the parts`,
        );
      }
      checkPart(parsed[0]!, 1, 1, false);
    }
    return assemble(parsed);
  } catch (e) {
    for (const p of parsed) p.handle.close();
    throw e;
  }
}

/**
 * Checks a part's split keys against its position `no` (1-based) of `count`, which come from its name, or
 * are 1 of 1 for a file opened under a plain name (split keys optional there, as in unsplit files).
 */
function checkPart(p: ParsedPart, no: number, count: number, named: boolean): void {
  const path = p.handle.path;
  const splitNo = splitKey(p, KEYS.splitNo);
  const splitCount = splitKey(p, KEYS.splitCount);
  if (count === 1 && splitCount === undefined && (splitNo === undefined || !named)) return;
  const how = named ? `its name says part ${no} of ${count}` : "it was opened as an unsplit file";
  const fix = named
    ? "the parts come from different splits or were renamed: re-download the whole set"
    : "open it by its split name or re-export the model";
  if (splitCount !== count) {
    throw splitErr(
      path,
      `GGUF split part ${path} has ${KEYS.splitCount} = ${splitCount ?? "(missing)"} but ${how} ` +
        `(expected ${KEYS.splitCount} = ${count}): ${fix}`,
    );
  }
  if (splitNo !== undefined || named) {
    if (splitNo !== no - 1) {
      throw splitErr(
        path,
        `GGUF split part ${path} has ${KEYS.splitNo} = ${splitNo ?? "(missing)"} but ${how} ` +
          `(expected ${KEYS.splitNo} = ${no - 1}): ${fix}`,
      );
    }
  }
}

function assemble(parsed: readonly ParsedPart[]): GgufFile {
  const first = parsed[0]!;
  const firstPath = first.handle.path;
  const tensors = new Map<string, GgufTensorInfo>();
  const parts: GgufPart[] = [];
  parsed.forEach((p, part) => {
    parts.push({
      path: p.handle.path,
      sizeBytes: p.handle.sizeBytes,
      version: p.version,
      alignment: p.alignment,
      dataStartBytes: p.dataStartBytes,
      tensorCount: p.tensors.length,
    });
    for (const t of p.tensors) {
      const prev = tensors.get(t.name);
      if (prev !== undefined) {
        throw new GgufError(
          "bad_tensor",
          `GGUF split part ${p.handle.path} at byte ${t.infoOffsetBytes}: tensor ${t.name} is also in part ` +
            `${prev.part + 1} (${
              parsed[prev.part]!.handle.path
            }), expected each tensor in exactly one part: ` +
            `re-split the model`,
          { path: p.handle.path, offsetBytes: t.infoOffsetBytes },
        );
      }
      tensors.set(t.name, {
        name: t.name,
        type: t.type,
        ne: t.ne,
        nElems: t.nElems,
        nbytes: t.nbytes,
        part,
        offsetBytes: t.offsetBytes,
        absOffsetBytes: p.dataStartBytes + t.offsetBytes,
      });
    }
  });
  const total = splitKey(first, KEYS.splitTensorsCount);
  if (parsed.length > 1 && total === undefined) {
    throw splitErr(
      firstPath,
      `GGUF split part ${firstPath} has no ${KEYS.splitTensorsCount}, expected the total tensor count of ` +
        `the ${parsed.length} parts: re-split the model with gguf-split`,
    );
  }
  if (total !== undefined && total !== tensors.size) {
    throw splitErr(
      firstPath,
      `GGUF file ${firstPath} has ${KEYS.splitTensorsCount} = ${total} but its ${parsed.length} part(s) list ` +
        `${tensors.size} tensors: a part is from another split or damaged: re-download the whole set`,
    );
  }
  for (const p of parsed.slice(1)) {
    const t = splitKey(p, KEYS.splitTensorsCount);
    if (t !== undefined && t !== total) {
      throw splitErr(
        p.handle.path,
        `GGUF split part ${p.handle.path} has ${KEYS.splitTensorsCount} = ${t} but part 1 has ${total}: ` +
          `the parts come from different splits: re-download the whole set`,
      );
    }
  }
  return new GgufFile(parts, new GgufMetadata(first.kvs, firstPath), tensors, parsed.map((p) => p.handle));
}
