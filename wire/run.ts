/**
 * The RUN and RUN_RESULT payloads of the stage link (docs/WIRE.md): what a stage is asked to compute (rows,
 * position, what to return, the last stage's sampling settings, drafts) and what it answers (hidden rows or
 * ids with top-k pairs, per-stage times), with their codecs.
 * @module
 */
import type { HiddenDtype } from "./hello.ts";
import {
  badValue,
  checkEncode,
  DTYPES,
  type FrameLimits,
  range,
  Reader,
  readRows,
  readU32s,
  rowBytes,
  u32ok,
  writeRows,
  writeU32s,
} from "./_bytes.ts";

/** Largest penalty history in a RUN (the sampler's window). */
export const MAX_HISTORY = 256;

/** Most per-stage times in a RUN_RESULT. */
export const MAX_TIMES = 16;

/** What a RUN asks back: nothing, the last hidden row, every hidden row, or sampled ids (+ top-k). */
export type RunWant = "none" | "last" | "all" | "ids";
/** RunWant by its wire code. */
const WANTS: readonly RunWant[] = ["none", "last", "all", "ids"];

/**
 * Sampling settings a RUN carries to the last stage, so that it samples exactly as the unsplit engine
 * would. Floats travel as f64: the JS values arrive unchanged.
 */
export interface WireSampling {
  /** Softmax temperature; 0 = greedy. */
  readonly temperature: number;
  /** Keep the k most likely ids; 0 = all. */
  readonly topK: number;
  /** Nucleus threshold; 1 = off. */
  readonly topP: number;
  /** Min-p threshold; 0 = off. */
  readonly minP: number;
  /** Repeat penalty; 1 = off. */
  readonly repeatPenalty: number;
  /** Presence penalty; 0 = off. */
  readonly presencePenalty: number;
  /** Frequency penalty; 0 = off. */
  readonly frequencyPenalty: number;
  /** Penalty window: 0 none, -1 all kept. */
  readonly penaltyLastN: number;
  /** Seed of the request's random stream, an integer in [0, 2^53). */
  readonly seed: number;
  /** RNG step of the first id this frame produces (the request's count of ids drawn so far). */
  readonly step: number;
  /**
   * When present, replaces the slot's penalty history (oldest first) before this frame; absent, the stage
   * keeps the history it has (it appends every id it produces).
   */
  readonly history?: Uint32Array;
}

/**
 * One RUN: `nRows` hidden rows of the previous stage's output for `slot` at positions
 * `basePos .. basePos + nRows - 1`.
 */
export interface RunRequest {
  /** Sequence slot, < the receiver's nSlots. */
  readonly slot: number;
  /** Position of the first row. */
  readonly basePos: number;
  /** Row width (must equal the receiver's nEmbd). */
  readonly nEmbd: number;
  /** The rows, `nRows × nEmbd` f32 (row-major); `nRows = rows.length / nEmbd`. */
  readonly rows: Float32Array;
  /** How the rows travel: `f32` exact, `f16` rounded to nearest (docs/WIRE.md "Hidden rows"). */
  readonly dtype: HiddenDtype;
  /** What the chain returns. */
  readonly want: RunWant;
  /** (id, logit) pairs wanted per id, with `want: "ids"` (0 otherwise). */
  readonly topK: number;
  /**
   * Draft ids: the last `drafts.length + 1` rows each produce an id; `drafts[j]` is the token fed at row
   * `nRows - drafts.length + j`, the head's guess for the id produced at the row before it.
   */
  readonly drafts: Uint32Array;
  /** Sampling settings for a last stage (absent: greedy argmax, ties to the lowest id). */
  readonly sampling?: WireSampling;
}

/** What a RUN returns. `timesUs` lists each stage's own compute time in µs, nearest stage first. */
export type RunResult =
  | { readonly kind: "none"; readonly timesUs: readonly number[] }
  | {
    readonly kind: "hidden";
    /** Rows `nRows × nEmbd` f32. */
    readonly rows: Float32Array;
    /** Row width. */
    readonly nEmbd: number;
    /** How the rows travel. */
    readonly dtype: HiddenDtype;
    readonly timesUs: readonly number[];
  }
  | {
    readonly kind: "ids";
    /** One id per producing row (1 + drafts). */
    readonly ids: Uint32Array;
    /** Pairs per id. */
    readonly topK: number;
    /** `ids.length × topK` candidate ids, best first per id. */
    readonly topIds: Uint32Array;
    /** Their logits (f32, as the LM head wrote them). */
    readonly topLogits: Float32Array;
    readonly timesUs: readonly number[];
  };

const RUN_FIXED = 24;

const SAMPLING_BYTES = 72;

const SAMPLING_FLAG = 1;

const HISTORY_FLAG = 2;

const RESULT_FIXED = 16;

const RESULT_KINDS = ["none", "hidden", "ids"] as const;

export function encodeRun(r: RunRequest): Uint8Array {
  checkEncode(Number.isInteger(r.nEmbd) && r.nEmbd > 0, `nEmbd ${r.nEmbd}`);
  checkEncode(
    r.rows.length % r.nEmbd === 0 && r.rows.length > 0,
    `${r.rows.length} values for nEmbd ${r.nEmbd}`,
  );
  const nRows = r.rows.length / r.nEmbd;
  checkEncode(
    r.drafts.length <= 0xffff && r.drafts.length < nRows,
    `${r.drafts.length} drafts for ${nRows} rows`,
  );
  checkEncode(Number.isInteger(r.topK) && r.topK >= 0 && r.topK <= 0xffff, `topK ${r.topK}`);
  checkEncode(Number.isInteger(r.slot) && r.slot >= 0 && r.slot <= 0xffff, `slot ${r.slot}`);
  checkEncode(u32ok(r.basePos), `basePos ${r.basePos}`);
  const s = r.sampling;
  const hist = s?.history;
  checkEncode(!hist || hist.length <= MAX_HISTORY, `history of ${hist?.length} ids`);
  const size = RUN_FIXED + (s ? SAMPLING_BYTES + 4 * (hist?.length ?? 0) : 0) + 4 * r.drafts.length +
    rowBytes(r.rows.length, r.dtype);
  const out = new Uint8Array(size);
  const dv = new DataView(out.buffer);
  dv.setUint16(0, r.slot, true);
  out[2] = WANTS.indexOf(r.want);
  out[3] = DTYPES.indexOf(r.dtype);
  dv.setUint32(4, nRows, true);
  dv.setUint32(8, r.basePos, true);
  dv.setUint32(12, r.nEmbd, true);
  dv.setUint16(16, r.drafts.length, true);
  dv.setUint16(18, r.topK, true);
  out[20] = (s ? SAMPLING_FLAG : 0) | (hist ? HISTORY_FLAG : 0);
  let at = RUN_FIXED;
  if (s) at = writeSampling(dv, at, s);
  at = writeU32s(dv, at, r.drafts);
  writeRows(dv, at, r.rows, r.dtype);
  return out;
}

export function encodeResult(r: RunResult): Uint8Array {
  checkEncode(r.timesUs.length <= MAX_TIMES && r.timesUs.every(u32ok), `timesUs ${r.timesUs}`);
  let n = 0, nEmbd = 0, topK = 0, body = 0, dtype: HiddenDtype = "f32";
  switch (r.kind) {
    case "none":
      break;
    case "hidden":
      checkEncode(
        r.nEmbd > 0 && r.rows.length % r.nEmbd === 0,
        `${r.rows.length} values for nEmbd ${r.nEmbd}`,
      );
      n = r.rows.length / r.nEmbd;
      nEmbd = r.nEmbd;
      dtype = r.dtype;
      body = rowBytes(r.rows.length, r.dtype);
      break;
    case "ids":
      n = r.ids.length;
      topK = r.topK;
      checkEncode(topK >= 0 && topK <= 0xffff, `topK ${topK}`);
      checkEncode(r.topIds.length === n * topK && r.topLogits.length === n * topK, "top-k arrays");
      body = 4 * n + 8 * n * topK;
      break;
    default: {
      const never: never = r;
      throw new Error(`Internal error: unhandled result ${(never as RunResult).kind}`);
    }
  }
  const out = new Uint8Array(RESULT_FIXED + 4 * r.timesUs.length + body);
  const dv = new DataView(out.buffer);
  out[0] = RESULT_KINDS.indexOf(r.kind);
  out[1] = DTYPES.indexOf(dtype);
  out[2] = r.timesUs.length;
  dv.setUint32(4, n, true);
  dv.setUint32(8, nEmbd, true);
  dv.setUint16(12, topK, true);
  let at = RESULT_FIXED;
  for (const t of r.timesUs) {
    dv.setUint32(at, t, true);
    at += 4;
  }
  if (r.kind === "hidden") writeRows(dv, at, r.rows, r.dtype);
  if (r.kind === "ids") {
    at = writeU32s(dv, at, r.ids);
    for (let i = 0; i < n * topK; i++) {
      dv.setUint32(at, r.topIds[i]!, true);
      dv.setFloat32(at + 4, r.topLogits[i]!, true);
      at += 8;
    }
  }
  return out;
}

export function decodeRun(r: Reader, lim: FrameLimits): RunRequest {
  const op = r.op;
  r.need(RUN_FIXED, "fixed fields");
  const dv = r.dv;
  const slot = dv.getUint16(0, true);
  const want = WANTS[r.bytes[2]!];
  if (want === undefined) throw badValue(op, "want", r.bytes[2], "0 none, 1 last, 2 all or 3 ids");
  const dtype = DTYPES[r.bytes[3]!];
  if (dtype === undefined) throw badValue(op, "dtype", r.bytes[3], "0 f32 or 1 f16");
  const nRows = dv.getUint32(4, true);
  const basePos = dv.getUint32(8, true);
  const nEmbd = dv.getUint32(12, true);
  const nDraft = dv.getUint16(16, true);
  const topK = dv.getUint16(18, true);
  const flags = r.bytes[20]!;
  if ((flags & ~(SAMPLING_FLAG | HISTORY_FLAG)) !== 0 || flags === HISTORY_FLAG) {
    throw badValue(op, "sampling flags", flags, "0, 1 (sampling) or 3 (sampling with history)");
  }
  r.zero(21, 3);
  range(op, "slot", slot, 0, lim.nSlots - 1, "the receiver has fewer slots");
  range(op, "nRows", nRows, 1, lim.maxRows, "send fewer rows per frame");
  if (nEmbd !== lim.nEmbd) throw badValue(op, "nEmbd", nEmbd, `the receiver's width ${lim.nEmbd}`);
  range(op, "basePos + nRows", basePos + nRows, 1, lim.nCtx, "the context of the receiver is smaller");
  range(op, "nDraft", nDraft, 0, Math.min(lim.maxDraft, nRows - 1), "fewer drafts, and fewer than the rows");
  range(op, "topK", topK, 0, want === "ids" ? lim.maxTopK : 0, "top-k pairs come only with ids");
  let at = RUN_FIXED;
  let sampling: WireSampling | undefined;
  if (flags & SAMPLING_FLAG) {
    if (want !== "ids") throw badValue(op, "sampling flags", flags, `0 when want is ${want}`);
    [sampling, at] = readSampling(r, at, flags);
  }
  const total = at + 4 * nDraft + rowBytes(nRows * nEmbd, dtype);
  r.exact(total, `${nDraft} drafts and ${nRows} ${dtype} rows of width ${nEmbd}`);
  const drafts = readU32s(r, at, nDraft);
  at += 4 * nDraft;
  const rows = readRows(r, at, nRows * nEmbd, dtype);
  return { slot, basePos, nEmbd, rows, dtype, want, topK, drafts, ...(sampling ? { sampling } : {}) };
}

export function decodeResult(r: Reader, lim: FrameLimits): RunResult {
  const op = r.op;
  r.need(RESULT_FIXED, "fixed fields");
  const dv = r.dv;
  const kind = RESULT_KINDS[r.bytes[0]!];
  if (kind === undefined) throw badValue(op, "kind", r.bytes[0], "0 none, 1 hidden or 2 ids");
  const dtype = DTYPES[r.bytes[1]!];
  if (dtype === undefined || (kind !== "hidden" && dtype !== "f32")) {
    throw badValue(op, "dtype", r.bytes[1], kind === "hidden" ? "0 f32 or 1 f16" : "0");
  }
  const nTimes = r.bytes[2]!;
  range(op, "nTimes", nTimes, 0, MAX_TIMES, "a chain of at most 16 stages");
  r.zero(3, 1);
  const n = dv.getUint32(4, true);
  const nEmbd = dv.getUint32(8, true);
  const topK = dv.getUint16(12, true);
  r.zero(14, 2);
  r.need(RESULT_FIXED + 4 * nTimes, "stage times");
  const timesUs = Array.from(readU32s(r, RESULT_FIXED, nTimes));
  const at = RESULT_FIXED + 4 * nTimes;
  switch (kind) {
    case "none":
      if (n !== 0 || nEmbd !== 0 || topK !== 0) {
        throw badValue(op, "n/nEmbd/topK", `${n}/${nEmbd}/${topK}`, "0 for kind none");
      }
      r.exact(at, "no rows");
      return { kind, timesUs };
    case "hidden": {
      range(op, "nRows", n, 1, lim.maxRows, "the peer returned more rows than asked");
      if (nEmbd !== lim.nEmbd) throw badValue(op, "nEmbd", nEmbd, `this side's width ${lim.nEmbd}`);
      if (topK !== 0) throw badValue(op, "topK", topK, "0 for hidden rows");
      r.exact(at + rowBytes(n * nEmbd, dtype), `${n} ${dtype} rows of width ${nEmbd}`);
      return { kind, rows: readRows(r, at, n * nEmbd, dtype), nEmbd, dtype, timesUs };
    }
    case "ids": {
      range(op, "nIds", n, 1, lim.maxRows, "the peer returned more ids than rows asked");
      if (nEmbd !== 0) throw badValue(op, "nEmbd", nEmbd, "0 for ids");
      range(op, "topK", topK, 0, lim.maxTopK, "the peer returned more pairs than asked");
      r.exact(at + 4 * n + 8 * n * topK, `${n} ids with ${topK} pairs each`);
      const ids = readU32s(r, at, n);
      const topIds = new Uint32Array(n * topK);
      const topLogits = new Float32Array(n * topK);
      let p = at + 4 * n;
      for (let i = 0; i < n * topK; i++, p += 8) {
        topIds[i] = dv.getUint32(p, true);
        topLogits[i] = dv.getFloat32(p + 4, true);
      }
      return { kind, ids, topK, topIds, topLogits, timesUs };
    }
    default: {
      const never: never = kind;
      throw new Error(`Internal error: unhandled kind ${never}`);
    }
  }
}

/** Writes `s` as a sampling block (and its history) at `at`; returns the offset after them. */
function writeSampling(dv: DataView, at: number, s: WireSampling): number {
  const hist = s.history;
  checkEncode(Number.isSafeInteger(s.seed) && s.seed >= 0, `seed ${s.seed}`);
  checkEncode(u32ok(s.topK) && u32ok(s.step), `sampler topK ${s.topK} / step ${s.step}`);
  checkEncode(Number.isInteger(s.penaltyLastN) && s.penaltyLastN >= -1, `penaltyLastN ${s.penaltyLastN}`);
  dv.setFloat64(at, s.temperature, true);
  dv.setFloat64(at + 8, s.topP, true);
  dv.setFloat64(at + 16, s.minP, true);
  dv.setFloat64(at + 24, s.repeatPenalty, true);
  dv.setFloat64(at + 32, s.presencePenalty, true);
  dv.setFloat64(at + 40, s.frequencyPenalty, true);
  dv.setBigUint64(at + 48, BigInt(s.seed), true);
  dv.setUint32(at + 56, s.topK, true);
  dv.setInt32(at + 60, s.penaltyLastN, true);
  dv.setUint32(at + 64, s.step, true);
  dv.setUint32(at + 68, hist?.length ?? 0, true);
  return writeU32s(dv, at + SAMPLING_BYTES, hist ?? new Uint32Array(0));
}

/** Bytes of `s`'s sampling block and history (0 without sampling). */
function samplingBytes(s: WireSampling | undefined): number {
  return s ? SAMPLING_BYTES + 4 * (s.history?.length ?? 0) : 0;
}

/**
 * Reads the sampling block (and history, with HISTORY in `flags`) at `at`; returns it and the offset after.
 * @throws {WireError} on a value out of its domain, a missing history flag, or a payload ending inside it
 */
function readSampling(r: Reader, at: number, flags: number): [WireSampling, number] {
  const { op, dv } = r;
  r.need(at + SAMPLING_BYTES, "sampling block");
  const f = (o: number, name: string, lo: number, hi: number) => {
    const v = dv.getFloat64(at + o, true);
    if (!(v >= lo && v <= hi)) throw badValue(op, name, v, `a number in [${lo}, ${hi}]`);
    return v;
  };
  const temperature = f(0, "temperature", 0, 1e6);
  const topP = f(8, "topP", 0, 1);
  const minP = f(16, "minP", 0, 1);
  const repeatPenalty = f(24, "repeatPenalty", 0, 1e6);
  const presencePenalty = f(32, "presencePenalty", -1e6, 1e6);
  const frequencyPenalty = f(40, "frequencyPenalty", -1e6, 1e6);
  const seed = dv.getBigUint64(at + 48, true);
  if (seed > BigInt(Number.MAX_SAFE_INTEGER)) throw badValue(op, "seed", seed, "below 2^53");
  const sTopK = dv.getUint32(at + 56, true);
  const penaltyLastN = dv.getInt32(at + 60, true);
  if (penaltyLastN < -1) throw badValue(op, "penaltyLastN", penaltyLastN, "-1 or more");
  const step = dv.getUint32(at + 64, true);
  const nHistory = dv.getUint32(at + 68, true);
  if (!(flags & HISTORY_FLAG) && nHistory !== 0) {
    throw badValue(op, "nHistory", nHistory, "0 without the history flag");
  }
  range(op, "nHistory", nHistory, 0, MAX_HISTORY, "send at most the penalty window");
  at += SAMPLING_BYTES;
  r.need(at + 4 * nHistory, "history");
  const history = flags & HISTORY_FLAG ? readU32s(r, at, nHistory) : undefined;
  at += 4 * nHistory;
  const sampling: WireSampling = {
    temperature,
    topK: sTopK,
    topP,
    minP,
    repeatPenalty,
    presencePenalty,
    frequencyPenalty,
    penaltyLastN,
    seed: Number(seed),
    step,
    ...(history ? { history } : {}),
  };
  return [sampling, at];
}

/** One slot's row of a {@linkcode RunBatchRequest}. */
export interface RunBatchEntry {
  /** Sequence slot, < the receiver's nSlots; distinct within a frame. */
  readonly slot: number;
  /** Position of its row: the slot's length on the receiving stage (a batched row continues the sequence). */
  readonly basePos: number;
  /** Its sampling settings for a last stage (absent: greedy argmax, ties to the lowest id). */
  readonly sampling?: WireSampling;
}

/**
 * One RUN_BATCH: one hidden row per entry, row `b` for `entries[b]`'s slot at its `basePos`, run as one
 * batched decode step; with `want: "ids"` the last stage answers one id per entry, in entry order.
 */
export interface RunBatchRequest {
  /** The slots and positions of the rows, in row order. */
  readonly entries: readonly RunBatchEntry[];
  /** Row width (must equal the receiver's nEmbd). */
  readonly nEmbd: number;
  /** The rows, `entries.length × nEmbd` f32 (row-major). */
  readonly rows: Float32Array;
  /** How the rows travel. */
  readonly dtype: HiddenDtype;
  /** `ids` (one per entry, with top-k pairs) or `none` (only advance the states). */
  readonly want: "none" | "ids";
  /** (id, logit) pairs wanted per id, with `want: "ids"` (0 otherwise). */
  readonly topK: number;
}

const BATCH_FIXED = 16;

const ENTRY_FIXED = 8;

export function encodeRunBatch(r: RunBatchRequest): Uint8Array {
  const n = r.entries.length;
  checkEncode(n >= 1 && n <= 0xffff, `${n} entries`);
  checkEncode(Number.isInteger(r.nEmbd) && r.nEmbd > 0, `nEmbd ${r.nEmbd}`);
  checkEncode(r.rows.length === n * r.nEmbd, `${r.rows.length} values for ${n} rows of ${r.nEmbd}`);
  checkEncode(Number.isInteger(r.topK) && r.topK >= 0 && r.topK <= 0xffff, `topK ${r.topK}`);
  let size = BATCH_FIXED + rowBytes(r.rows.length, r.dtype);
  for (const e of r.entries) {
    checkEncode(Number.isInteger(e.slot) && e.slot >= 0 && e.slot <= 0xffff, `slot ${e.slot}`);
    checkEncode(u32ok(e.basePos), `basePos ${e.basePos}`);
    const hist = e.sampling?.history;
    checkEncode(!hist || hist.length <= MAX_HISTORY, `history of ${hist?.length} ids`);
    size += ENTRY_FIXED + samplingBytes(e.sampling);
  }
  const out = new Uint8Array(size);
  const dv = new DataView(out.buffer);
  dv.setUint16(0, n, true);
  out[2] = WANTS.indexOf(r.want);
  out[3] = DTYPES.indexOf(r.dtype);
  dv.setUint32(4, r.nEmbd, true);
  dv.setUint16(8, r.topK, true);
  let at = BATCH_FIXED;
  for (const e of r.entries) {
    const s = e.sampling;
    dv.setUint16(at, e.slot, true);
    out[at + 2] = (s ? SAMPLING_FLAG : 0) | (s?.history ? HISTORY_FLAG : 0);
    dv.setUint32(at + 4, e.basePos, true);
    at += ENTRY_FIXED;
    if (s) at = writeSampling(dv, at, s);
  }
  writeRows(dv, at, r.rows, r.dtype);
  return out;
}

export function decodeRunBatch(r: Reader, lim: FrameLimits): RunBatchRequest {
  const op = r.op;
  r.need(BATCH_FIXED, "fixed fields");
  const dv = r.dv;
  const n = dv.getUint16(0, true);
  const want = WANTS[r.bytes[2]!];
  if (want !== "none" && want !== "ids") throw badValue(op, "want", r.bytes[2], "0 none or 3 ids");
  const dtype = DTYPES[r.bytes[3]!];
  if (dtype === undefined) throw badValue(op, "dtype", r.bytes[3], "0 f32 or 1 f16");
  const nEmbd = dv.getUint32(4, true);
  const topK = dv.getUint16(8, true);
  r.zero(10, 6);
  range(op, "nEntries", n, 1, Math.min(lim.nSlots, lim.maxRows), "one row per distinct slot");
  if (nEmbd !== lim.nEmbd) throw badValue(op, "nEmbd", nEmbd, `the receiver's width ${lim.nEmbd}`);
  range(op, "topK", topK, 0, want === "ids" ? lim.maxTopK : 0, "top-k pairs come only with ids");
  const entries: RunBatchEntry[] = [];
  const seen = new Set<number>();
  let at = BATCH_FIXED;
  for (let b = 0; b < n; b++) {
    r.need(at + ENTRY_FIXED, `entry ${b}`);
    const slot = dv.getUint16(at, true);
    const flags = r.bytes[at + 2]!;
    if ((flags & ~(SAMPLING_FLAG | HISTORY_FLAG)) !== 0 || flags === HISTORY_FLAG) {
      throw badValue(op, "sampling flags", flags, "0, 1 (sampling) or 3 (sampling with history)");
    }
    if (flags !== 0 && want !== "ids") throw badValue(op, "sampling flags", flags, "0 when want is none");
    r.zero(at + 3, 1);
    const basePos = dv.getUint32(at + 4, true);
    range(op, "slot", slot, 0, lim.nSlots - 1, "the receiver has fewer slots");
    if (seen.has(slot)) throw badValue(op, "slot", slot, "a slot not already in the frame");
    seen.add(slot);
    range(op, "basePos + 1", basePos + 1, 1, lim.nCtx, "the context of the receiver is smaller");
    at += ENTRY_FIXED;
    let sampling: WireSampling | undefined;
    if (flags & SAMPLING_FLAG) [sampling, at] = readSampling(r, at, flags);
    entries.push({ slot, basePos, ...(sampling ? { sampling } : {}) });
  }
  r.exact(at + rowBytes(n * nEmbd, dtype), `${n} entries and ${n} ${dtype} rows of width ${nEmbd}`);
  const rows = readRows(r, at, n * nEmbd, dtype);
  return { entries, nEmbd, rows, dtype, want, topK };
}
