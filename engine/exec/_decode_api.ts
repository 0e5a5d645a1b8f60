/**
 * What the decode driver (decode.ts) needs of its stage and of the stage's buffers and graphs.
 * @module
 */
import type { PipelineCache } from "../../wgsl/kernel.ts";
import type { Hparams } from "../models/_arch.ts";
import type { SlotStates } from "../state.ts";
import type { OnLayer, Op } from "../graph/builder.ts";
import type { StagingPool } from "../gpu/readback.ts";

type Layers = readonly [number, number];

/** What the driver needs of its stage: the stage's public face. */
export interface DecodeStage {
  readonly hp: Hparams;
  readonly layers: readonly [number, number];
  readonly first: boolean;
  readonly last: boolean;
  readonly nCtx: number;
  /** Most tokens per prefill chunk (one compute pass each). */
  readonly maxChunk: number;
  readonly canBatch: boolean;
  readonly states: SlotStates;
  length(slot: number): number;
  run(
    slot: number,
    input: { readonly tokens: readonly number[] },
    base: number,
    opts?: { rows?: "all" | "last" | "none" },
  ): Promise<{ readonly data: Float32Array<ArrayBuffer> }>;
  snapshot(slot: number): number;
  restore(id: number, slot: number): void;
}

/** And the stage's buffers and graphs the driver encodes with (owned by the stage). */
export interface DecodeBuffers {
  readonly device: GPUDevice;
  readonly cache: PipelineCache;
  /** Receives the buffers the driver's cached selectors create (destroyed with the stage). */
  readonly owned: GPUBuffer[];
  /** The token ids a solo decode graph embeds. */
  readonly tokens: GPUBuffer;
  /** The logits rows (batched: each slot's row starts 256-byte aligned); a last stage has them. */
  readonly logits: GPUBuffer | undefined;
  /** Per slot: its position params [pos, n] (solo graphs). */
  readonly posParams: readonly GPUBuffer[];
  /** Per slot: the id its batched steps embed (written by its selector). */
  readonly slotTok: readonly GPUBuffer[];
  /** Sampler mask words (UNUSED token types and padding rows), when the file has token types. */
  readonly unusedMask: Uint32Array<ArrayBuffer> | undefined;
  /** The stage's staging buffers (a prompt's first readback, read early: engine/gpu/readback.ts). */
  readonly stagings: StagingPool;
  /**
   * Idle-time work: clones for the first of `order` (default every slot) that lacks one a graph of a width
   * another slot used last (SlotGraphs.spread); whether it did. Off while logging int8 decisions (each graph
   * logs its own).
   */
  spreadGraph(order?: readonly number[]): boolean;
  /** The solo graph of `n` tokens on `slot` (of `layers` only: a piece's part); `onLayer` while built fresh. */
  graph(
    slot: number,
    n: number,
    rows: "all" | "last" | "none",
    layers?: Layers,
    onLayer?: OnLayer,
  ): Promise<readonly Op[]>;
  /** The hidden rows (the residual stream) a graph's layers read and write. */
  readonly hidden: GPUBuffer;
  /** The batched decode step of `slots` and its column table (column b's [pos, 1] at word 64·b). */
  batchGraph(slots: readonly number[]): Promise<{ ops: readonly Op[]; table: GPUBuffer }>;
  /** Sets the tokens `slot` holds after a generation. */
  setLength(slot: number, n: number): void;
  /** Throws on a slot that does not exist. */
  slotCheck(slot: number): void;
  /** Throws when the GPU reported an error (the step's results are void). */
  gpuCheck(): void;
  /** Throws on an input that does not fit the slot (see Stage.run). */
  inputCheck(slot: number, tokens: readonly number[], base: number): void;
}
