/**
 * What each side of a link says about itself before any work (the HELLO and HELLO_ACK content), its strict
 * JSON validation, and the chain check that refuses a pair of stages that cannot serve one model together.
 *
 * The hello is JSON inside a binary frame (docs/WIRE.md "HELLO"): it is sent once per connection, so
 * readability and room to grow beat compactness; every field is still checked for type and range, and a
 * malformed hello is a {@linkcode WireError} `bad_hello`.
 *
 * @example
 * ```ts
 * import { checkChain, type HelloInfo } from "./hello.ts";
 * declare const head: HelloInfo, worker: HelloInfo;
 * const refusal = checkChain(head, worker, { prevName: "this head", nextName: "worker 10.0.0.2:9000" });
 * if (refusal) throw new Error(refusal.message);
 * ```
 * @module
 */
import { WireError } from "./errors.ts";

/** The protocol version this code speaks; a peer with another is refused at hello. */
export const PROTOCOL_VERSION = 2;

/** Dtype of hidden rows on the wire: `f32` exact (the default), `f16` half the bytes, rounded. */
export type HiddenDtype = "f32" | "f16";

/** Limits a side accepts in frames sent to it; the sender must stay within them. */
export interface HelloLimits {
  /** Largest frame (header + payload) in bytes. */
  readonly maxFrameBytes: number;
  /** Most rows in one RUN (prompt chunk or 1 + drafts) and in one RUN_RESULT. */
  readonly maxRows: number;
  /** Most draft rows in one RUN. */
  readonly maxDraft: number;
  /** Most (id, logit) pairs per id in a RUN_RESULT. */
  readonly maxTopK: number;
}

/** Everything one side tells the other at connect (docs/WIRE.md "Hello fields"). */
export interface HelloInfo {
  /** Wire protocol version ({@linkcode PROTOCOL_VERSION}). */
  readonly protocol: number;
  /** The software: its version string and git commit (or `"unknown"`). */
  readonly build: { readonly version: string; readonly commit: string };
  /** GGUF `general.architecture`, e.g. `qwen35moe`. */
  readonly arch: string;
  /** This side's layer range `[first, end)` and the model's total layer count. */
  readonly layers: { readonly first: number; readonly end: number; readonly total: number };
  /** True when this stage runs the output norm, LM head and sampler (its range must end at `total`). */
  readonly last: boolean;
  /** Embedding width: the hidden row length in elements. */
  readonly nEmbd: number;
  /** Sequence slots this side holds. */
  readonly nSlots: number;
  /** Context length per slot, in tokens. */
  readonly nCtx: number;
  /** KV cache and recurrent-state layout, an opaque descriptor compared for equality (e.g. `kv=f32;ssm=f32`). */
  readonly stateLayout: string;
  /** Options that change numerics: both sides of a chain must agree on them. */
  readonly numerics: {
    readonly int8Activations: boolean;
    /** int8 x for the expert passes (StageOptions.int8Experts; true with int8Activations). Absent: false. */
    readonly int8Experts: boolean;
    readonly hiddenDtype: HiddenDtype;
  };
  /** Model fingerprint: 64 lowercase hex digits (engine/fingerprint.ts defines it). */
  readonly fingerprint: string;
  /** What this side accepts in frames sent to it. */
  readonly limits: HelloLimits;
  /**
   * The stages after this one, in order, as they said hello to it (a middle worker forwards to them);
   * empty for the last stage and for the head's own hello. Entries carry no `downstream` of their own.
   */
  readonly downstream: readonly HelloInfo[];
}

/** Which hello field a chain refusal is about. */
export type HelloField =
  | "protocol"
  | "build"
  | "arch"
  | "totalLayers"
  | "nEmbd"
  | "stateLayout"
  | "int8Activations"
  | "int8Experts"
  | "hiddenDtype"
  | "fingerprint"
  | "range"
  | "last"
  | "nSlots"
  | "nCtx";

/** Why two stages cannot chain: the field and a message that names both values and what to do. */
export interface ChainRefusal {
  /** The field that differs. */
  readonly field: HelloField;
  /** Human message naming both sides' values. */
  readonly message: string;
}

/** Largest string accepted in a hello field (versions, commits, arch names, layout descriptors). */
export const MAX_HELLO_STRING = 256;
/** Most downstream stages one hello may list. */
export const MAX_DOWNSTREAM = 32;
const U32_MAX = 0xffff_ffff;
const FINGERPRINT_RE = /^[0-9a-f]{64}$/;

function bad(where: string, field: string, expected: string, got: unknown): WireError {
  let shown: string;
  try {
    shown = got === undefined ? "it is missing" : `got ${JSON.stringify(got)?.slice(0, 80)}`;
  } catch {
    shown = "got an unprintable value";
  }
  return new WireError(
    "bad_hello",
    `Hello from ${where}: field ${field} must be ${expected} but ${shown}: the peer runs another ` +
      `implementation or version: run the same build on every box`,
  );
}

function obj(v: unknown, where: string, field: string): Record<string, unknown> {
  if (typeof v !== "object" || v === null || Array.isArray(v)) throw bad(where, field, "an object", v);
  return v as Record<string, unknown>;
}

function str(o: Record<string, unknown>, key: string, where: string, path: string): string {
  const v = o[key];
  if (typeof v !== "string" || v.length > MAX_HELLO_STRING) {
    throw bad(where, path, `a string of at most ${MAX_HELLO_STRING} characters`, v);
  }
  return v;
}

function int(o: Record<string, unknown>, key: string, where: string, path: string, lo: number, hi: number) {
  const v = o[key];
  if (typeof v !== "number" || !Number.isInteger(v) || v < lo || v > hi) {
    throw bad(where, path, `an integer in [${lo}, ${hi}]`, v);
  }
  return v;
}

function bool(o: Record<string, unknown>, key: string, where: string, path: string): boolean {
  const v = o[key];
  if (typeof v !== "boolean") throw bad(where, path, "true or false", v);
  return v;
}

/**
 * Validates a parsed hello JSON value field by field and returns it typed (unknown extra keys are ignored,
 * so a later minor version may add fields).
 * @param where names the peer in messages (`worker 10.0.0.2:9000`)
 * @throws {WireError} `bad_hello` naming the first bad field, the value found and the range expected
 */
export function parseHelloInfo(json: unknown, where: string, opts: { nested?: boolean } = {}): HelloInfo {
  const o = obj(json, where, "(hello)");
  const build = obj(o.build, where, "build");
  const layers = obj(o.layers, where, "layers");
  const numerics = obj(o.numerics, where, "numerics");
  const limits = obj(o.limits, where, "limits");
  const first = int(layers, "first", where, "layers.first", 0, U32_MAX);
  const end = int(layers, "end", where, "layers.end", 0, U32_MAX);
  const total = int(layers, "total", where, "layers.total", 1, U32_MAX);
  if (!(first < end && end <= total)) {
    throw bad(where, "layers", `a range first < end <= total`, { first, end, total });
  }
  const hiddenDtype = numerics.hiddenDtype;
  if (hiddenDtype !== "f32" && hiddenDtype !== "f16") {
    throw bad(where, "numerics.hiddenDtype", `"f32" or "f16"`, hiddenDtype);
  }
  const fingerprint = o.fingerprint;
  if (typeof fingerprint !== "string" || !FINGERPRINT_RE.test(fingerprint)) {
    throw bad(where, "fingerprint", "64 lowercase hex digits", fingerprint);
  }
  let downstream: HelloInfo[] = [];
  if (o.downstream !== undefined) {
    if (!Array.isArray(o.downstream) || o.downstream.length > MAX_DOWNSTREAM) {
      throw bad(where, "downstream", `an array of at most ${MAX_DOWNSTREAM} hellos`, o.downstream);
    }
    if (opts.nested && o.downstream.length > 0) {
      throw bad(where, "downstream[].downstream", "empty (the list is flat)", o.downstream);
    }
    downstream = o.downstream.map((d, i) =>
      parseHelloInfo(d, `${where} (downstream stage ${i + 1})`, { nested: true })
    );
  }
  return {
    protocol: int(o, "protocol", where, "protocol", 0, 0xffff),
    build: {
      version: str(build, "version", where, "build.version"),
      commit: str(build, "commit", where, "build.commit"),
    },
    arch: str(o, "arch", where, "arch"),
    layers: { first, end, total },
    last: bool(o, "last", where, "last"),
    nEmbd: int(o, "nEmbd", where, "nEmbd", 1, 1 << 20),
    nSlots: int(o, "nSlots", where, "nSlots", 1, 0xffff),
    nCtx: int(o, "nCtx", where, "nCtx", 1, U32_MAX),
    stateLayout: str(o, "stateLayout", where, "stateLayout"),
    numerics: {
      int8Activations: bool(numerics, "int8Activations", where, "numerics.int8Activations"),
      int8Experts: numerics.int8Experts === undefined
        ? false
        : bool(numerics, "int8Experts", where, "numerics.int8Experts"),
      hiddenDtype,
    },
    fingerprint,
    limits: {
      maxFrameBytes: int(limits, "maxFrameBytes", where, "limits.maxFrameBytes", 1024, U32_MAX),
      maxRows: int(limits, "maxRows", where, "limits.maxRows", 1, U32_MAX),
      maxDraft: int(limits, "maxDraft", where, "limits.maxDraft", 0, 0xffff),
      maxTopK: int(limits, "maxTopK", where, "limits.maxTopK", 0, 0xffff),
    },
    downstream,
  };
}

/** `name (layers a:b of N)`: how messages name one side. */
function side(name: string, h: HelloInfo): string {
  return `${name} (layers ${h.layers.first}:${h.layers.end} of ${h.layers.total})`;
}

/**
 * Checks that `next` can follow `prev` in one chain serving one model: same protocol, build, architecture,
 * layer count, width, state layout, numerics and fingerprint; `next` starts where `prev` ends; a stage
 * claiming to be last reaches the last layer; `next` has at least `prev`'s slots and context.
 * @param prev the stage before (the head, or a middle worker checking its `--next`)
 * @param next the stage after it
 * @param opts.prevName / opts.nextName how messages name the sides (default "the previous stage" / "the next stage")
 * @returns undefined when they chain, else the first refusal with a message naming both values
 */
export function checkChain(
  prev: HelloInfo,
  next: HelloInfo,
  opts: { prevName?: string; nextName?: string } = {},
): ChainRefusal | undefined {
  const p = opts.prevName ?? "the previous stage";
  const n = opts.nextName ?? "the next stage";
  const same = "load the same model file on every box";
  const refuse = (field: HelloField, message: string): ChainRefusal => ({ field, message });
  if (prev.protocol !== next.protocol) {
    return refuse(
      "protocol",
      `Wire protocol differs: ${p} speaks version ${prev.protocol} but ${n} speaks version ${next.protocol}: ` +
        `run the same build on every box`,
    );
  }
  if (prev.build.version !== next.build.version || prev.build.commit !== next.build.commit) {
    return refuse(
      "build",
      `Build differs: ${p} runs ${prev.build.version} (commit ${prev.build.commit}) but ${n} runs ` +
        `${next.build.version} (commit ${next.build.commit}): run the same build on every box`,
    );
  }
  if (prev.arch !== next.arch) {
    return refuse("arch", `Architecture differs: ${p} has ${prev.arch} but ${n} has ${next.arch}: ${same}`);
  }
  if (prev.layers.total !== next.layers.total) {
    return refuse(
      "totalLayers",
      `Total layers differ: ${p} has a model of ${prev.layers.total} layers but ${n} has one of ` +
        `${next.layers.total}: ${same}`,
    );
  }
  if (prev.nEmbd !== next.nEmbd) {
    return refuse(
      "nEmbd",
      `Embedding width differs: ${p} has nEmbd ${prev.nEmbd} but ${n} has ${next.nEmbd}: ${same}`,
    );
  }
  if (prev.stateLayout !== next.stateLayout) {
    return refuse(
      "stateLayout",
      `State layout differs: ${p} has "${prev.stateLayout}" but ${n} has "${next.stateLayout}": ` +
        `start every stage with the same KV and state options`,
    );
  }
  // What each side runs, by the flag of the commands that gives it (cli/experts.ts).
  const mode = (h: HelloInfo) =>
    h.numerics.int8Activations
      ? "int8 x for every mat-vec (the default)"
      : h.numerics.int8Experts
      ? "int8 x for the experts alone (--int8-experts)"
      : "f32 x everywhere (--f32-experts)";
  const oneFlag = "start every stage with the same one of: no numerics flag (int8 x for every mat-vec, the " +
    "commands' default), --int8-experts, --f32-experts";
  if (prev.numerics.int8Activations !== next.numerics.int8Activations) {
    return refuse(
      "int8Activations",
      `int8 activations differ: ${p} runs ${mode(prev)} but ${n} runs ${mode(next)}: ${oneFlag}`,
    );
  }
  if (prev.numerics.int8Experts !== next.numerics.int8Experts) {
    return refuse(
      "int8Experts",
      `int8 x for the experts differs: ${p} runs ${mode(prev)} but ${n} runs ${mode(next)}: ${oneFlag}`,
    );
  }
  if (prev.numerics.hiddenDtype !== next.numerics.hiddenDtype) {
    return refuse(
      "hiddenDtype",
      `Hidden row dtype differs: ${p} sends ${prev.numerics.hiddenDtype} but ${n} expects ` +
        `${next.numerics.hiddenDtype}: give every stage the same hidden dtype option`,
    );
  }
  if (prev.fingerprint !== next.fingerprint) {
    return refuse(
      "fingerprint",
      `Model fingerprint differs: ${p} has ${prev.fingerprint} but ${n} has ${next.fingerprint}: the files ` +
        `differ (another export, or a damaged copy): ${same} (compare with sha256sum)`,
    );
  }
  if (next.layers.first !== prev.layers.end) {
    return refuse(
      "range",
      `Layer ranges do not chain: ${side(p, prev)} ends at layer ${prev.layers.end} but ${side(n, next)} ` +
        `starts at layer ${next.layers.first}: start it with --layers ${prev.layers.end}:${next.layers.end}`,
    );
  }
  if (next.last && next.layers.end !== next.layers.total) {
    return refuse(
      "last",
      `${side(n, next)} claims to be the last stage but ends before the last layer ${
        next.layers.total - 1
      }: ` +
        `start it with --layers ${next.layers.first}:${next.layers.total} or chain another stage after it`,
    );
  }
  if (next.nSlots < prev.nSlots) {
    return refuse(
      "nSlots",
      `Too few slots: ${n} has ${next.nSlots} slots but ${p} has ${prev.nSlots}: start it with ` +
        `--slots ${prev.nSlots} or more`,
    );
  }
  if (next.nCtx < prev.nCtx) {
    return refuse(
      "nCtx",
      `Context too small: ${n} has --ctx ${next.nCtx} but ${p} has --ctx ${prev.nCtx}: start it with ` +
        `--ctx ${prev.nCtx} or more`,
    );
  }
  return undefined;
}

/**
 * Checks a whole chain: `head` then `stages` in order (a worker's hello followed by its `downstream`): each
 * pair with {@linkcode checkChain}, only the final stage may claim to be last, and the final one must.
 * @param names how messages name each of `stages` (default `stage 2`, `stage 3`, ...)
 * @returns undefined when the chain can serve the model, else the first refusal
 */
export function checkWholeChain(
  head: HelloInfo,
  stages: readonly HelloInfo[],
  opts: { headName?: string; names?: readonly string[] } = {},
): ChainRefusal | undefined {
  let prev = head;
  let prevName = opts.headName ?? "the head";
  for (let i = 0; i < stages.length; i++) {
    const next = stages[i]!;
    const nextName = opts.names?.[i] ?? `stage ${i + 2}`;
    const r = checkChain(prev, next, { prevName, nextName });
    if (r) return r;
    if (next.last && i !== stages.length - 1) {
      return {
        field: "last",
        message: `${side(nextName, next)} claims to be the last stage but ${stages.length - 1 - i} more ` +
          `stage(s) follow it: remove them or start it without the last-stage role`,
      };
    }
    prev = next;
    prevName = nextName;
  }
  if (!prev.last) {
    return {
      field: "last",
      message: `The chain ends at ${side(prevName, prev)}, which is not a last stage: the model's layers ` +
        `${prev.layers.end}:${prev.layers.total} and its output run nowhere: start that worker with --next, ` +
        `or with --layers ${prev.layers.first}:${prev.layers.total}`,
    };
  }
  return undefined;
}
