/**
 * A pipeline stage: the forward pass of layers `[a, b)` of a `qwen35moe` / `qwen3next` model on the GPU,
 * with per-slot state (KV caches, conv rings, recurrent states) and snapshots.
 *
 * The first stage embeds token ids, the last produces logits; a middle or last stage takes hidden rows.
 * A chunk of n tokens is one compute pass whose dispatches are built once per (slot, n, output) and cached:
 * the per-step values (position, token count) live in GPU buffers, so the same dispatches serve every step.
 * Generation (a whole-model stage) is the decode driver's (`decode.ts`), reached through {@linkcode Stage.decoder}.
 *
 * @example
 * ```ts
 * const gpu = await acquireGpu();
 * const file = await openGguf("model.gguf");
 * const stage = await Stage.load(gpu, file, { nCtx: 4096, nSlots: 1 });
 * const logits = await stage.run(0, { tokens: [1, 2, 3] }, 0); // ne=[nVocab, 1]: the last position
 * ```
 * @module
 */
import type { Gpu } from "../gpu/device.ts";
import { PipelineCache } from "../../wgsl/kernel.ts";
import { type GpuTensor, uploadTensors } from "../gpu/weights.ts";
import { SlotStates } from "../state.ts";
import type { GgufFile } from "../gguf.ts";
import { KEYS, tensorName } from "../names.ts";
import { archOf, type DeltaNetLayout, type Hparams, type TensorCheck } from "../models/mod.ts";
import { GRAPHS } from "../models/graphs.ts";
import { buildHybrid, type HybridModel } from "../models/_hybrid.ts";
import { assert } from "../errors.ts";
import { unusedTokenMask } from "../sampling.ts";
import {
  BATCH_TABLE_WORDS,
  type BuildContext,
  GraphBuilder,
  type GraphOptions,
  type Int8LogEntry,
  type LayerWeights,
  type OnLayer,
  type Op,
  POS_PARAMS_BYTES,
} from "../graph/builder.ts";
import {
  activationWords,
  batchable,
  gdnConstants,
  MAX_BATCH_SLOTS,
  stateSpecs,
  STORAGE,
} from "./activations.ts";
import { loadPlan } from "./load_plan.ts";
import { batchSlotsCheck, submitBatch } from "./_batch_run.ts";
import * as load from "./_load.ts";
import {
  FingerprintHasher,
  fingerprintStats,
  modelFingerprint,
  readCachedFingerprint,
} from "../fingerprint.ts";
import { DecodeDriver } from "./decode.ts";
import type { BatchItem, GenerateOptions, GenerateResult } from "./slot_decoder.ts";
import { type RowSampleOptions, RowSampler } from "./_row_sampler.ts";
import type { Int8Logged, RunOptions, StageInput, StageOptions, StageOutput } from "./options.ts";
import { type PendingRun, type RowArgmax, rowArgmax, submitRun } from "./_stage_run.ts";
import { graphCache, SlotGraphs, spareCache, type Spares } from "./_slot_graphs.ts";
import { StagingPool } from "../gpu/readback.ts";
import { RunProfile } from "./_profile.ts";

export type { Int8Logged, PendingRun, RowSampleOptions, RunOptions, StageInput, StageOptions, StageOutput };

type Rows = "all" | "last" | "none";
type Layers = readonly [number, number];
/** Size of the int8Log buffer (the tiny test models log a few hundred KiB per chunk). */
const INT8_LOG_BYTES = 16 << 20;

/** The GPU forward pass of one layer range; see the module doc. */
export class Stage {
  /** Hyper-parameters of the whole model. */
  readonly hp: Hparams;
  /** Decoder layers `[a, b)` this stage runs. */
  readonly layers: readonly [number, number];
  /** Whether this stage embeds tokens (a == 0). */
  readonly first: boolean;
  /** Whether this stage produces logits (b == nLayer). */
  readonly last: boolean;
  /** Positions per slot. */
  readonly nCtx: number;
  /** Tokens per chunk. */
  readonly maxChunk: number;
  /** See {@linkcode StageOptions.normPrologueMaxRows}. */
  readonly normPrologueMaxRows: number;
  /** See {@linkcode StageOptions.int8Activations}. */
  readonly int8Activations: boolean;
  /** See {@linkcode StageOptions.int8Experts}: true under int8Activations too. */
  readonly int8Experts: boolean;
  /** See {@linkcode StageOptions.kvF16}. */
  readonly kvF16: boolean;
  /** Slot state buffers (KV caches, conv rings, recurrent states) and snapshots. */
  readonly states: SlotStates;
  /** Bytes of weights on the GPU. */
  readonly weightBytes: number;
  /** Whether several slots can run in one step: every per-slot activation row starts 256-byte aligned. */
  readonly canBatch: boolean;
  /** Generation on this stage's slots (a whole-model stage): the decode driver. */
  readonly decoder: DecodeDriver;
  /** The model fingerprint (engine/fingerprint.ts, cached beside the GGUF): a split chain compares it at hello. */
  readonly fingerprint: string;
  /** Where this stage's runs spend their time (engine/exec/_profile.ts). */
  readonly profile: RunProfile = new RunProfile();

  readonly #gpu: Gpu;
  readonly #cache: PipelineCache;
  readonly #model: HybridModel;
  readonly #graphOptions: GraphOptions;
  readonly #weights: ReadonlyMap<string, GpuTensor>;
  readonly #layers: readonly LayerWeights[];
  readonly #tiedOutput: boolean;
  readonly #act: Record<string, GPUBuffer>;
  readonly #posParams: readonly GPUBuffer[];
  readonly #zeroIds: GPUBuffer;
  readonly #graphs: SlotGraphs;
  /** int8Log: the log buffer, each graph's entries, and the graph of the last run() chunk. */
  readonly #int8Log: { buffer: GPUBuffer; entries: Map<string, Int8LogEntry[]>; last?: string } | undefined;
  readonly #batchGraphs = graphCache<{ ops: Op[]; table: GPUBuffer }>();
  /** Per slot: the id its batched steps embed (written by its selector). */
  readonly #slotTok: readonly GPUBuffer[];
  /** Small buffers the cached graphs and decoders own (params, rings, scratch): destroyed with the stage. */
  readonly #owned: GPUBuffer[] = [];
  readonly #length: number[];
  #destroyed = false;
  /** The UNUSED-token mask the samplers apply (absent when the file has no token types). */
  readonly #unusedMask: Uint32Array<ArrayBuffer> | undefined;
  #rowSampler: RowSampler | undefined;
  readonly #argmaxes = new Map<number, Promise<RowArgmax>>();
  readonly #spares: Spares;
  /** The first GPU error no scope captured while this stage lived (validation, out of memory, internal). */
  #gpuError: string | undefined;
  readonly #onGpuError = (ev: Event) => {
    this.#gpuError ??= (ev as GPUUncapturedErrorEvent).error.message;
  };

  private constructor(init: {
    gpu: Gpu;
    hp: Hparams;
    model: HybridModel;
    layers: readonly [number, number];
    nCtx: number;
    maxChunk: number;
    graph: GraphOptions;
    int8Log: boolean;
    weights: Map<string, GpuTensor>;
    tiedOutput: boolean;
    layouts: readonly (DeltaNetLayout | undefined)[];
    nSlots: number;
    maxStatePoolBytes?: number;
    tokenTypes?: ArrayLike<number>;
    fingerprint: string;
  }) {
    const { gpu, hp } = init;
    this.#gpu = gpu;
    this.#cache = PipelineCache.shared(gpu.device, { f16: gpu.f16 });
    this.#model = init.model;
    this.hp = hp;
    this.fingerprint = init.fingerprint;
    this.layers = init.layers;
    this.first = init.layers[0] === 0;
    this.last = init.layers[1] === hp.nLayer;
    this.nCtx = init.nCtx;
    this.maxChunk = init.maxChunk;
    this.#graphOptions = init.graph;
    this.normPrologueMaxRows = init.graph.normPrologueMaxRows;
    this.int8Activations = init.graph.int8Activations;
    this.int8Experts = init.graph.int8Experts;
    this.kvF16 = init.graph.kvF16;
    const logUsage = GPUBufferUsage.STORAGE | GPUBufferUsage.COPY_SRC;
    this.#int8Log = init.int8Log
      ? {
        buffer: gpu.device.createBuffer({ label: "int8 log", size: INT8_LOG_BYTES, usage: logUsage }),
        entries: new Map(),
      }
      : undefined;
    if (this.#int8Log) this.#owned.push(this.#int8Log.buffer);
    this.#weights = init.weights;
    this.#tiedOutput = init.tiedOutput;
    this.weightBytes = load.weightBytes(init.weights);
    const ls: LayerWeights[] = [];
    for (let l = init.layers[0]; l < init.layers[1]; l++) {
      ls.push({
        attention: hp.isAttention[l]!,
        layout: init.layouts[l],
        t: (id) => this.#tensor(tensorName(id, l)),
      });
    }
    this.#layers = ls;
    this.states = new SlotStates(gpu.device, {
      specs: stateSpecs(hp, init.layers, init.nCtx, init.graph.kvF16),
      nSlots: init.nSlots,
      maxPoolBytes: init.maxStatePoolBytes,
    });
    const words = activationWords(hp, {
      maxChunk: this.maxChunk,
      deltaNet: ls.some((lw) => !lw.attention),
      last: this.last,
    });
    this.#act = Object.fromEntries(
      Object.entries(words).map(([name, w]) => [
        name,
        gpu.device.createBuffer({ label: name, size: Math.max(16, w * 4), usage: STORAGE }),
      ]),
    );
    const slots = Array.from({ length: init.nSlots }, (_, s) => s);
    const perSlot = (name: string, size: number) =>
      slots.map((s) => gpu.device.createBuffer({ label: `slot${s}.${name}`, size, usage: STORAGE }));
    this.#posParams = perSlot("pos", POS_PARAMS_BYTES);
    this.#graphs = new SlotGraphs(gpu.device, this.#posParams, this.states, this.#owned);
    const zeroIdsBytes = 4 * Math.max(this.maxChunk, MAX_BATCH_SLOTS);
    this.#zeroIds = gpu.device.createBuffer({ label: "zero_ids", size: zeroIdsBytes, usage: STORAGE });
    this.#spares = spareCache(new StagingPool(gpu.device));
    this.#slotTok = perSlot("tok", 16);
    this.canBatch = batchable(hp, init.layers);
    this.#length = new Array(init.nSlots).fill(0);
    gpu.device.addEventListener("uncapturederror", this.#onGpuError);
    this.#unusedMask = init.tokenTypes && unusedTokenMask(init.tokenTypes, hp.nVocab);
    this.decoder = new DecodeDriver(this, {
      gpuCheck: () => this.#gpuCheck(),
      device: gpu.device,
      cache: this.#cache,
      owned: this.#owned,
      tokens: this.#act.tokens!,
      hidden: this.#act.h!,
      logits: this.#act.logits,
      posParams: this.#posParams,
      slotTok: this.#slotTok,
      unusedMask: this.#unusedMask,
      stagings: this.#spares.stagings,
      graph: (slot, n, rows, layers, onLayer) => this.#graph(slot, n, rows, layers, onLayer),
      spreadGraph: (order) => !this.#int8Log && this.#graphs.spread(order ?? this.#length.keys()),
      batchGraph: (slots) => this.#batchGraph(slots),
      setLength: (slot, n) => this.#length[slot] = n,
      slotCheck: (slot) => this.#slotCheck(slot),
      inputCheck: (slot, tokens, base) => this.#inputCheck(slot, { tokens }, base, tokens.length),
    });
  }

  /**
   * Validates the file against its architecture, uploads the weights of `opts.layers` and allocates the
   * state of `opts.nSlots` slots of `opts.nCtx` positions.
   * @throws {GgufError} when the file does not match its architecture
   * @throws {RangeError} on a layer range, context or chunk size out of range, or a tensor the GPU cannot bind
   */
  static async load(gpu: Gpu, file: GgufFile, opts: StageOptions): Promise<Stage> {
    const arch = archOf(file.metadata);
    const hp = arch.readHparams(file.metadata);
    const check = arch.checkTensors(file, hp);
    const model = GRAPHS[arch.name];
    const { layers, maxChunk, graphSettings } = load.checkLoadOptions(hp, file.path, opts, gpu.device);
    return await load.underLoadScopes(
      gpu.device,
      { hp, layers, nCtx: opts.nCtx, nSlots: opts.nSlots, kvF16: opts.kvF16 ?? false },
      () => Stage.#create(gpu, file, opts, { hp, check, model, layers, maxChunk, graphSettings }),
    );
  }

  static async #create(
    gpu: Gpu,
    file: GgufFile,
    opts: StageOptions,
    p: {
      hp: Hparams;
      check: TensorCheck;
      model: HybridModel;
      layers: readonly [number, number];
      maxChunk: number;
      graphSettings: load.GraphSettings;
    },
  ): Promise<Stage> {
    const { hp, check, model, maxChunk, graphSettings } = p;
    const [a, b] = p.layers;
    const plan = loadPlan(file, hp, check, [a, b], model);
    // The fingerprint hashes the bytes as they upload (no second read of this range); a valid cache skips it.
    const stats = await fingerprintStats(file);
    const hasher = (await readCachedFingerprint(file)) ? undefined : new FingerprintHasher(file);
    const weights = await uploadTensors(gpu.device, file, {
      ...plan,
      onProgress: opts.onProgress,
      onBytes: hasher && ((n, c, o) => hasher.update(n, c, o)),
    });
    const { fingerprint, cacheError } = await modelFingerprint(file, { hasher, stats });
    if (cacheError) (opts.onLog ?? ((line: string) => console.error(line)))(cacheError);
    const tokenTypes = file.metadata.has(KEYS.tokTypes)
      ? file.metadata.getIntArray(KEYS.tokTypes)
      : undefined;
    return new Stage({
      tokenTypes,
      gpu,
      hp,
      model,
      layers: [a, b],
      nCtx: opts.nCtx,
      maxChunk,
      graph: {
        ...graphSettings,
        moeTuning: opts.moeTuning,
        matvecTuning: opts.matvecTuning,
        fuseDecodeRoute: opts.fuseDecodeRoute ?? false,
        groupedExperts: opts.groupedExperts ?? true,
        kvF16: opts.kvF16 ?? false,
      },
      int8Log: graphSettings.int8Experts && (opts.int8Log ?? false),
      weights,
      tiedOutput: check.tiedOutput,
      layouts: check.layouts,
      nSlots: opts.nSlots,
      maxStatePoolBytes: opts.maxStatePoolBytes,
      fingerprint,
    });
  }

  /** Tokens held by `slot`. */
  length(slot: number): number {
    this.#slotCheck(slot);
    return this.#length[slot]!;
  }

  /**
   * Runs `input` through the stage for `slot`, continuing its sequence at position `base` (`base == 0`
   * resets the slot). Prefill runs in chunks of `maxChunk` (every-row logits: fewer). Returns logits or
   * hidden rows of every position (`all`) or only the last (`last`, the default); `none` queues the work
   * (no rows, no readback: a later run's readback waits for it). `chunk` (1..maxChunk) sets the tokens per
   * chunk for this call: with 1 every row runs the one-token decode graph, so a last stage's logits equal
   * those of separate one-token runs bit for bit (a wider chunk's output norm and LM head sum in another order;
   * its state and hidden rows are the same bits up to 8 tokens), all for one readback (split draft checks).
   * @throws {RangeError} on a base other than the slot's length (restore a snapshot first), a sequence
   *   longer than the context, token ids out of the vocabulary, an input of the wrong kind, or a bad chunk
   */
  async run(slot: number, input: StageInput, base: number, opts: RunOptions = {}): Promise<StageOutput> {
    return await (await this.submit(slot, input, base, opts)).output;
  }

  /**
   * `run()` split in two: resolves once the work is submitted (and its readback started), with the output
   * pending (engine/exec/_stage_run.ts); a later submit may go in before that output lands.
   * @throws {RangeError} as `run()`
   */
  submit(slot: number, input: StageInput, base: number, opts: RunOptions = {}): Promise<PendingRun> {
    this.#slotCheck(slot);
    const nTokens = "tokens" in input ? input.tokens.length : input.nTokens;
    this.#inputCheck(slot, input, base, nTokens);
    const chunk = opts.chunk ?? this.maxChunk;
    if (!Number.isInteger(chunk) || chunk < 1 || chunk > this.maxChunk) {
      throw new RangeError(`Chunk must be in 1..${this.maxChunk}, got ${chunk}`);
    }
    const p = {
      hp: this.hp,
      last: this.last,
      device: this.#gpu.device,
      act: this.#act,
      pos: this.#posParams[slot]!,
      states: this.states,
      length: this.#length,
      logitsRows: this.last ? load.logitsRows(this.#act.logits!, this.hp) : 1,
      graph: (n: number, rows: Rows, onLayer?: OnLayer) => this.#graph(slot, n, rows, undefined, onLayer),
      gpuCheck: () => this.#gpuCheck(),
      profile: this.profile,
      argmax: (r: number, sampled?: boolean) => this.#argmax(r, sampled),
      spares: this.#int8Log ? undefined : this.#spares, // int8Log reads the graph of the run's own call
      stagings: this.#spares.stagings,
    };
    return submitRun(p, slot, input, base, nTokens, { ...opts, rows: opts.rows ?? "last", chunk });
  }

  /**
   * The rounding decisions of the last `run()` chunk (StageOptions.int8Log): per quantize_q8 in graph order,
   * its mat-vec's label, the column, and x's int8 values (element order) and per-32 scales.
   * @throws {Error} when the stage was loaded without int8Log or has not run
   */
  async int8Log(): Promise<Int8Logged[]> {
    const log = this.#int8Log;
    const entries = log?.last === undefined ? undefined : log.entries.get(log.last);
    if (!log || !entries) {
      throw new Error("int8Log: load the stage with int8Activations and int8Log, then run()");
    }
    return await load.readInt8Log(this.#gpu.device, log.buffer, entries);
  }

  /** Generation on one slot: {@linkcode DecodeDriver.generate} with one item. */
  async generate(slot: number, prompt: readonly number[], opts: GenerateOptions): Promise<GenerateResult> {
    return (await this.decoder.generate([{ slot, prompt, opts }]))[0]!;
  }

  /** Generation on several slots at once: {@linkcode DecodeDriver.generate}. */
  generateBatch(items: readonly BatchItem[], opts: { batch?: number } = {}): Promise<GenerateResult[]> {
    return this.decoder.generate(items, opts);
  }

  /**
   * Draws one id per row of `logits` (ne=[nVocab, n], f32: a `run()` output of a last stage, e.g. with
   * `chunk: 1`) with the GPU sampler, as decode steps `opts.step, +1, ...` of one sequence whose penalty
   * history is `opts.history` (each drawn id appended before the next row): the ids `generate()` draws from the
   * same logits (engine/exec/_row_sampler.ts; `RunOptions.sample` draws in the run's own pass instead). An id
   * ≥ nVocab: no usable logit.
   * @throws {RangeError} when the stage is not a last stage, or as checkSampling
   */
  sampleRows(logits: Float32Array<ArrayBuffer>, opts: RowSampleOptions): Promise<Uint32Array> {
    if (!this.last) throw new RangeError(`Layers ${this.layers.join(":")} have no logits to sample from`);
    const [cache, owned, nVocab, mask] = [this.#cache, this.#owned, this.hp.nVocab, this.#unusedMask];
    const stagings = this.#spares.stagings;
    this.#rowSampler ??= new RowSampler(this.#gpu.device, { cache, owned, nVocab, mask, stagings });
    return this.#rowSampler.sample(logits, opts);
  }

  /**
   * Saves `slot`'s full state (as of the work submitted so far) to a new snapshot; returns its number.
   */
  snapshot(slot: number): number {
    this.#slotCheck(slot);
    const enc = this.#gpu.device.createCommandEncoder();
    const id = this.states.snapshot(enc, slot, this.#length[slot]!);
    this.#gpu.device.queue.submit([enc.finish()]);
    return id;
  }

  /** Empties `slot`: position 0, zeroed state (a run at base 0 does the same). */
  reset(slot: number): void {
    this.#slotCheck(slot);
    const enc = this.#gpu.device.createCommandEncoder();
    this.states.reset(enc, slot);
    this.#gpu.device.queue.submit([enc.finish()]);
    this.#length[slot] = 0;
  }

  /** Restores snapshot `id` into `slot`; the slot then holds the snapshot's tokens. */
  restore(id: number, slot: number): void {
    this.#slotCheck(slot);
    const enc = this.#gpu.device.createCommandEncoder();
    this.states.restore(enc, id, slot);
    this.#gpu.device.queue.submit([enc.finish()]);
    this.#length[slot] = this.states.snapshotLength(id);
  }

  /** Dispatches of one chunk of `n` tokens (for counting and benchmarks). */
  graph(slot: number, n: number, rows: "all" | "last" | "none"): Promise<readonly Op[]> {
    this.#slotCheck(slot);
    return this.#graph(slot, n, rows);
  }

  /** Dispatches of one batched decode step of `slots` (for counting and benchmarks). */
  async batchGraph(slots: readonly number[]): Promise<readonly Op[]> {
    batchSlotsCheck(slots, this.#length.length);
    return (await this.#batchGraph(slots)).ops;
  }

  /** One row per slot of `slots` at its length, in one batched step, read back (engine/exec/_batch_run.ts). */
  async runBatch(slots: readonly number[], input: StageInput): Promise<StageOutput> {
    return await (await this.submitBatch(slots, input)).output;
  }

  /**
   * `runBatch` split in two as `submit()` splits `run()`; `ids`: each column's argmax id (a last stage), or
   * its sampler's draw where `sample` gives the column's settings, RNG step and history.
   */
  submitBatch(
    slots: readonly number[],
    input: StageInput,
    opts: { ids?: boolean; sample?: readonly (RowSampleOptions | undefined)[] } = {},
  ): Promise<PendingRun> {
    const [act, tok, length, gpuCheck] = [this.#act, this.#slotTok, this.#length, () => this.#gpuCheck()];
    const p = { stage: this, device: this.#gpu.device, act, tok, length, gpuCheck, profile: this.profile };
    const spares = this.#int8Log ? undefined : this.#spares;
    const more = { graph: (s: readonly number[]) => this.#batchGraph(s), argmax: this.#argmax.bind(this) };
    const q = { ...p, ...more, spares, stagings: this.#spares.stagings };
    return submitBatch(q, slots, input, opts.ids, opts.sample);
  }

  /** The argmax (or sampler) on logits row `row` for `ids` runs (engine/exec/_stage_run.ts, cached per row). */
  #argmax(row: number, sampled = false): Promise<RowArgmax> {
    const [logits, unusedMask] = [this.#act.logits, this.#unusedMask];
    const sb = { device: this.#gpu.device, cache: this.#cache, owned: this.#owned, logits, unusedMask };
    const key = sampled ? -1 - row : row;
    const hit = this.#argmaxes.get(key) ?? rowArgmax(sb, this.hp.nVocab, row, sampled);
    this.#argmaxes.set(key, hit);
    return hit;
  }

  /** Releases every GPU buffer of the stage. */
  destroy(): void {
    if (this.#destroyed) return;
    this.#destroyed = true;
    this.#gpu.device.removeEventListener("uncapturederror", this.#onGpuError);
    this.decoder.destroy();
    this.states.destroy();
    for (const b of Object.values(this.#act)) b.destroy();
    for (const b of this.#posParams) b.destroy();
    for (const b of this.#slotTok) b.destroy();
    this.#zeroIds.destroy();
    for (const b of [...this.#owned, ...[...this.#spares.values()].map((s) => s.staging)]) b.destroy();
    this.#spares.stagings.destroy();
    const seen = new Set<GPUBuffer>();
    for (const t of this.#weights.values()) for (const p of t.parts) seen.add(p.buffer);
    for (const b of seen) b.destroy();
  }

  /** What every graph of this stage is built over, for `slot`'s solo graphs or a batched step (of layers s..e). */
  #context(slot: number, rows: Rows, pos: GPUBuffer, batch?: BuildContext["batch"], [s, e] = this.layers) {
    const [a, b] = [this.first && s === this.layers[0], this.last && e === this.layers[1]];
    const cx: BuildContext = {
      states: this.states,
      nCtx: this.nCtx,
      slot,
      rows,
      act: this.#act,
      pos,
      zeroIds: this.#zeroIds,
      layers: this.#layers.slice(s - this.layers[0], e - this.layers[0]),
      firstLayer: s,
      gdn: (layout) => gdnConstants(this.hp, layout),
      embd: a ? this.#tensor(tensorName("token_embd")) : undefined,
      outNorm: b ? this.#tensor(tensorName("output_norm")) : undefined,
      lmHead: b ? this.#tensor(tensorName(this.#tiedOutput ? "token_embd" : "output")) : undefined,
      batch,
    };
    return cx;
  }

  /** The dispatches of one batched decode step of `slots` and its column table (cached). */
  async #batchGraph(slots: readonly number[]): Promise<{ ops: Op[]; table: GPUBuffer }> {
    const key = slots.join(",");
    const hit = this.#batchGraphs.get(key);
    if (hit) return hit;
    const table = this.#gpu.device.createBuffer({
      label: `batch${key}.table`,
      size: slots.length * BATCH_TABLE_WORDS * 4,
      usage: STORAGE,
    });
    this.#owned.push(table);
    const words = new Uint32Array(slots.length * BATCH_TABLE_WORDS);
    for (const [b, s] of slots.entries()) words.set([0, 1, s], b * BATCH_TABLE_WORDS);
    this.#gpu.device.queue.writeBuffer(table, 0, words);
    const pos = slots.map((_, b) => ({ buffer: table, offset: b * BATCH_TABLE_WORDS * 4, size: 16 }));
    const g = new GraphBuilder(
      this.#gpu.device,
      this.#cache,
      this.hp,
      slots.length,
      this.#owned,
      this.#graphOptions,
      true,
    );
    const batch = { slots, table, pos, tok: slots.map((s) => this.#slotTok[s]!) };
    const ops = await buildHybrid(g, this.#context(slots[0]!, "all", table, batch), this.#model);
    const out = { ops, table };
    this.#batchGraphs.set(key, out);
    return out;
  }

  /** `onLayer`: the builder's hook, when the graph is built fresh (OpStream). */
  async #graph(slot: number, n: number, rows: Rows, layers?: Layers, onLayer?: OnLayer): Promise<Op[]> {
    const part = layers && layers.join() !== this.layers.join() ? layers : undefined;
    const rk = part ? `${rows}@${part[0]}:${part[1]}` : rows;
    const key = `${slot}/${n}/${rk}`;
    if (this.#int8Log) this.#int8Log.last = key;
    const hit = this.#graphs.get(slot, n, rk, !this.#int8Log);
    if (hit) return hit;
    const entries: Int8LogEntry[] = [];
    this.#int8Log?.entries.set(key, entries);
    const g = new GraphBuilder(this.#gpu.device, this.#cache, this.hp, n, this.#owned, {
      ...this.#graphOptions,
      int8Log: this.#int8Log ? { buffer: this.#int8Log.buffer, entries } : undefined,
    });
    const cx = this.#context(slot, rows, this.#posParams[slot]!, undefined, part);
    g.onLayer = onLayer;
    const ops = await buildHybrid(g, cx, this.#model);
    this.#graphs.set(slot, n, rk, ops);
    return ops;
  }

  /**
   * Throws when the GPU reported an error since this stage was loaded: its results can no longer be trusted
   * (a failed request, never output computed from invalid buffers).
   */
  #gpuCheck(): void {
    if (this.#gpuError !== undefined) throw load.stageVoidError(this.#gpuError);
  }

  #slotCheck(slot: number): void {
    if (!Number.isInteger(slot) || slot < 0 || slot >= this.#length.length) {
      throw new RangeError(`Slot ${slot} does not exist: this stage has ${this.#length.length} slots`);
    }
  }

  #inputCheck(slot: number, input: StageInput, base: number, nTokens: number): void {
    load.checkStageInput(this, { slot, held: this.#length[slot]!, input, base, nTokens });
  }

  #tensor(name: string): GpuTensor {
    const t = this.#weights.get(name);
    assert(t, `tensor ${name} was not uploaded`);
    return t;
  }
}
