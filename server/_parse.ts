/**
 * Request parsing shared by the endpoints: the size-limited JSON body and typed field readers. Unknown
 * fields are ignored; a known field of the wrong type is a 400 naming its path (`messages[2].content`);
 * `null` counts as absent for optional fields (clients send it for "not set").
 * @module
 */
import { ApiError } from "./errors.ts";

/** A JSON object as parsed. */
export type Json = Record<string, unknown>;

/**
 * Reads the whole body as a JSON object, counting bytes as they arrive.
 * @throws {ApiError} 413 over `limitBytes`; 400 for malformed JSON or a body that is not an object
 */
export async function readJson(req: Request, limitBytes: number): Promise<Json> {
  const tooLarge = (n: number | string) =>
    new ApiError(
      "request_too_large",
      `Request body of ${n} bytes is over the limit of ${limitBytes} bytes: send a smaller request ` +
        `(the server's body limit is fixed at start)`,
    );
  const declared = Number(req.headers.get("content-length") ?? NaN);
  if (Number.isFinite(declared) && declared > limitBytes) throw tooLarge(declared);
  const chunks: Uint8Array[] = [];
  let size = 0;
  if (req.body !== null) {
    const reader = req.body.getReader();
    for (;;) {
      const { done, value } = await reader.read();
      if (done) break;
      size += value.byteLength;
      if (size > limitBytes) {
        await reader.cancel();
        throw tooLarge(`more than ${limitBytes}`);
      }
      chunks.push(value);
    }
  }
  const bytes = new Uint8Array(size);
  let off = 0;
  for (const c of chunks) {
    bytes.set(c, off);
    off += c.byteLength;
  }
  let value: unknown;
  try {
    value = JSON.parse(new TextDecoder("utf-8", { fatal: true }).decode(bytes));
  } catch (e) {
    const why = e instanceof Error ? e.message : String(e);
    throw new ApiError(
      "invalid_request",
      `Malformed JSON in request body (${size} bytes): ${why}: send one JSON object`,
      { cause: e },
    );
  }
  if (!isObject(value)) {
    throw new ApiError("invalid_request", `Request body is ${typeName(value)}, expected a JSON object`);
  }
  return value;
}

/** True for a plain JSON object (not null, not an array). */
export function isObject(v: unknown): v is Json {
  return typeof v === "object" && v !== null && !Array.isArray(v);
}

/** JSON type name of a value for messages: `null`, `array`, `object`, `string`, `number`, `boolean`. */
export function typeName(v: unknown): string {
  if (v === null) return "null";
  if (Array.isArray(v)) return "array";
  return typeof v;
}

/** The 400 for field `path` holding `got` where `expected` was wanted. */
export function wrongType(path: string, got: unknown, expected: string): ApiError {
  const shown = typeof got === "string" ? ` ${JSON.stringify(got.slice(0, 40))}` : "";
  return new ApiError(
    "invalid_request",
    `Field ${path} is ${typeName(got)}${shown}, expected ${expected}`,
    { param: path },
  );
}

/** The 400 for a missing required field. */
export function missing(path: string, expected: string): ApiError {
  return new ApiError("invalid_request", `Field ${path} is required: send ${expected}`, { param: path });
}

/** Path of `key` inside `parent` (`""` for the body). */
export function at(parent: string, key: string | number): string {
  if (typeof key === "number") return `${parent}[${key}]`;
  return parent === "" ? key : `${parent}.${key}`;
}

/** Optional string field. */
export function optString(o: Json, key: string, parent = ""): string | undefined {
  const v = o[key];
  if (v === undefined || v === null) return undefined;
  if (typeof v !== "string") throw wrongType(at(parent, key), v, "a string");
  return v;
}

/** Required string field. */
export function reqString(o: Json, key: string, parent = ""): string {
  const v = optString(o, key, parent);
  if (v === undefined) throw missing(at(parent, key), "a string");
  return v;
}

/** Optional boolean field. */
export function optBool(o: Json, key: string, parent = ""): boolean | undefined {
  const v = o[key];
  if (v === undefined || v === null) return undefined;
  if (typeof v !== "boolean") throw wrongType(at(parent, key), v, "a boolean");
  return v;
}

/** Bounds of a number field. */
export interface NumberRange {
  /** Smallest allowed value. */
  min?: number;
  /** Largest allowed value. */
  max?: number;
  /** Whole numbers only. */
  integer?: boolean;
}

/** Optional number field, range-checked. */
export function optNumber(o: Json, key: string, range: NumberRange = {}, parent = ""): number | undefined {
  const v = o[key];
  if (v === undefined || v === null) return undefined;
  const path = at(parent, key);
  const expected = range.integer ? "an integer" : "a number";
  if (typeof v !== "number" || !Number.isFinite(v)) throw wrongType(path, v, expected);
  if (range.integer && !Number.isInteger(v)) throw wrongType(path, v, expected);
  if ((range.min !== undefined && v < range.min) || (range.max !== undefined && v > range.max)) {
    const lo = range.min ?? "-inf", hi = range.max ?? "inf";
    throw new ApiError("invalid_request", `Field ${path} is ${v}, expected a value in [${lo}, ${hi}]`, {
      param: path,
    });
  }
  return v;
}

/** Optional object field. */
export function optObject(o: Json, key: string, parent = ""): Json | undefined {
  const v = o[key];
  if (v === undefined || v === null) return undefined;
  if (!isObject(v)) throw wrongType(at(parent, key), v, "an object");
  return v;
}

/** Optional array field. */
export function optArray(o: Json, key: string, parent = ""): unknown[] | undefined {
  const v = o[key];
  if (v === undefined || v === null) return undefined;
  if (!Array.isArray(v)) throw wrongType(at(parent, key), v, "an array");
  return v;
}

/** Required array field. */
export function reqArray(o: Json, key: string, parent = ""): unknown[] {
  const v = optArray(o, key, parent);
  if (v === undefined) throw missing(at(parent, key), "an array");
  return v;
}

/** Element `i` of an array that must be an object. */
export function objectAt(arr: unknown[], i: number, parent: string): Json {
  const v = arr[i];
  if (!isObject(v)) throw wrongType(at(parent, i), v, "an object");
  return v;
}

/** Stop strings: a string or an array of strings (absent: none). */
export function optStops(o: Json, key: string, parent = ""): string[] {
  const v = o[key];
  if (v === undefined || v === null) return [];
  const path = at(parent, key);
  const list = typeof v === "string" ? [v] : v;
  if (!Array.isArray(list)) throw wrongType(path, v, "a string or an array of strings");
  return list.map((s, i) => {
    if (typeof s !== "string") throw wrongType(at(path, i), s, "a string");
    if (s === "") {
      throw new ApiError(
        "invalid_request",
        `Field ${at(path, i)} is an empty string: give at least one character`,
        {
          param: path,
        },
      );
    }
    return s;
  });
}

/**
 * Refuses a field this server does not implement yet when it asks for something (`null`, `false`, `0`, an
 * empty object or array and the `allowed` values count as not asking).
 * @throws {ApiError} 400 naming the field
 */
export function refuseUnsupported(o: Json, key: string, why: string, allowed: readonly unknown[] = []): void {
  const v = o[key];
  if (v === undefined || v === null || v === false || v === 0 || allowed.includes(v)) return;
  if (Array.isArray(v) && v.length === 0) return;
  if (isObject(v) && Object.keys(v).length === 0) return;
  throw new ApiError(
    "invalid_request",
    `Field ${key} is not supported yet: ${why}: leave it out`,
    { param: key },
  );
}

/**
 * Checks tool names are unique and returns them.
 * @throws {ApiError} 400 naming the second declaration of a name
 */
export function uniqueToolNames(names: readonly string[], path: (i: number) => string): Set<string> {
  const seen = new Set<string>();
  names.forEach((n, i) => {
    if (seen.has(n)) {
      throw new ApiError(
        "invalid_request",
        `Field ${path(i)} is ${JSON.stringify(n)}, a tool name declared earlier: give each tool its own name`,
        { param: path(i) },
      );
    }
    seen.add(n);
  });
  return seen;
}

/**
 * Checks a tool_choice that forces a tool use (`any`/`required`, or one named tool) against the tools sent.
 * @param forced `true` for any tool, a tool name, or undefined when nothing is forced
 * @param field the request field of the choice (`tool_choice`, `tool_choice.name`)
 * @throws {ApiError} 400 when no tools are sent or the named tool is not among them
 */
export function checkToolChoice(
  forced: string | true | undefined,
  tools: ReadonlySet<string>,
  field: string,
): void {
  if (forced === undefined) return;
  if (tools.size === 0) {
    throw new ApiError(
      "invalid_request",
      `Field ${field} asks for a tool call but the request declares no tools: send tools or drop ${field}`,
      { param: field },
    );
  }
  if (forced !== true && !tools.has(forced)) {
    throw new ApiError(
      "invalid_request",
      `Field ${field} is ${JSON.stringify(forced)}, which is not a declared tool (declared: ${
        [...tools].join(", ")
      }): name one of the tools`,
      { param: field },
    );
  }
}
