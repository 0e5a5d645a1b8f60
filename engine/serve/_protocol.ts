/**
 * Messages between the engine service (`engine/service.ts`, main thread) and its Worker (`engine/worker.ts`,
 * which owns the GPU device and the Stage), and the error codec both sides share.
 * @module
 */
import type { SamplingParams } from "../sampling.ts";
import type { ResolvedOptions } from "./_options.ts";
import type { Generated } from "../exec/slot_decoder.ts";
import type { NextBatchRun, NextResult, NextRun, StageInfo } from "../exec/split.ts";

/** A call of the worker's split decoder on the chain, which lives on the main thread (EngineOptions.next). */
export type NextCall =
  | { readonly op: "run"; readonly req: NextRun }
  | { readonly op: "runBatch"; readonly req: NextBatchRun }
  | { readonly op: "snapshot"; readonly slot: number; readonly epoch: number }
  | { readonly op: "restore"; readonly id: number; readonly slot: number; readonly epoch: number }
  | { readonly op: "drop"; readonly id: number; readonly epoch: number };

/** Main thread → worker. */
export type ToWorker =
  | ResolvedOptions & {
    readonly type: "init";
    /** GGUF path; absent: synthesize the tiny default model. */
    readonly model?: string;
    readonly nCtx: number;
    readonly nSlots: number;
    /** StageOptions.int8Activations. */
    readonly int8Activations: boolean;
    /** StageOptions.int8Experts. */
    readonly int8Experts: boolean;
    /** StageOptions.kvF16. */
    readonly kvF16: boolean;
    /** Drafted frames of the unsplit engine (EngineOptions.draft); absent: none. */
    readonly draft?: { readonly k: number; readonly cache?: number; readonly min?: number };
    /** Split head: the first layer range runs here, the rest through `next` calls (absent: whole model). */
    readonly split?: {
      readonly layers: readonly [number, number];
      readonly groups?: number;
      /** n-grams of the cross-request draft cache; absent: none. */
      readonly draftCache?: number;
    };
  }
  | {
    readonly type: "next-reply";
    readonly call: number;
    readonly value?: NextResult | number;
    readonly error?: WireErrorValue;
  }
  | {
    readonly type: "generate";
    readonly id: number;
    readonly prompt: readonly number[];
    readonly maxTokens: number;
    readonly stopIds: readonly number[];
    readonly sampling: SamplingParams;
  }
  | { readonly type: "cancel"; readonly id: number }
  | { readonly type: "close" };

/** Worker → main thread. */
export type FromWorker =
  | { readonly type: "log"; readonly line: string }
  | { readonly type: "meta"; readonly path: string; readonly model: string; readonly arch: string }
  | { readonly type: "progress"; readonly loadedBytes: number; readonly totalBytes: number }
  /** `pipelines`: GPU pipelines compiled once the warm-up ran (and in `done`: when the request finished). */
  | { readonly type: "ready"; readonly nVocab: number; readonly pipelines: number }
  | { readonly type: "stage"; readonly info: StageInfo }
  | { readonly type: "next"; readonly call: number; readonly request: NextCall }
  /**
   * Draft counts since start (SplitDecoder.draftStats, or the unsplit engine's DraftingDecoder.draftStats), after
   * each frame that carried drafts.
   */
  | { readonly type: "drafts"; readonly frames: number; readonly proposed: number; readonly accepted: number }
  | { readonly type: "failed"; readonly error: WireErrorValue }
  | { readonly type: "tokens"; readonly id: number; readonly ids: readonly number[] }
  /** A request got slot `slot`, or prefilled a prompt piece: the slot holds `heldTokens` of its prompt. */
  | { readonly type: "slot"; readonly id: number; readonly slot: number; readonly heldTokens: number }
  | {
    readonly type: "done";
    readonly id: number;
    readonly result: JobResult;
    readonly pipelines: number;
    /** The engine Worker's readbacks so far by path (engine/gpu/readback.ts `readStats`). */
    readonly readbacks: { readonly early: number; readonly awaited: number; readonly fellBack: number };
  }
  | { readonly type: "error"; readonly id: number; readonly error: WireErrorValue }
  | { readonly type: "closed" };

/** What the worker reports for one finished request. */
export interface JobResult extends Generated {
  /** Slot it ran on. */
  readonly slot: number;
  /** Prompt tokens served from the slot's cached history. */
  readonly cachedTokens: number;
  /** Prompt tokens prefilled (prompt minus cached; 0 when cancelled before it started). */
  readonly prefilledTokens: number;
  /** Bytes held by Stage snapshots after the request (0 when nothing leaked). */
  readonly snapshotBytes: number;
  /** Ids it made in turns shared with other requests (batched GPU steps). */
  readonly batchedTokens: number;
  /**
   * Batch size seen: the requests in each generate call it took part in, weighted by the ids it made there
   * (1 when it always ran alone; 0 when it made none).
   */
  readonly meanBatch: number;
}

/** An error as it crosses `postMessage`: its class name (when a built-in the receiver rebuilds) and message. */
export interface WireErrorValue {
  /** `Error.name` (`RangeError`, `GgufError`, ...). */
  readonly name: string;
  /** `Error.message`. */
  readonly message: string;
}

/** Flattens `e` for `postMessage`. */
export function encodeError(e: unknown): WireErrorValue {
  if (e instanceof Error) return { name: e.name, message: e.message };
  return { name: "Error", message: String(e) };
}

/** Rebuilds an error from {@linkcode encodeError}'s value: `RangeError` and `TypeError` keep their class. */
export function decodeError(v: WireErrorValue, context?: string): Error {
  const message = context ? `${context}: ${v.message}` : v.message;
  switch (v.name) {
    case "RangeError":
      return new RangeError(message);
    case "TypeError":
      return new TypeError(message);
    default: {
      const e = new Error(message);
      if (v.name !== "Error") e.name = v.name;
      return e;
    }
  }
}
