/**
 * The graph builder: the dispatch list of one chunk of `n` tokens (or one batched decode step), as the blocks
 * (`engine/blocks/`) push their ops onto it. It owns what the blocks share: the op list, the pipeline cache,
 * small params and scratch buffers, and the state of the fusions that span blocks (a decode norm deferred into
 * the next mat-vec's prologue, the int8 x a mat-vec left for the next one to reuse).
 *
 * Built once per (slot, n, output rows) and cached by the stage: the per-step values (position, token count)
 * live in GPU buffers, so the same ops serve every step.
 * @module
 */
import {
  bindGroup,
  type BindGroupCache,
  type Binding,
  type ConstValues,
  type KernelSpec,
  type PipelineCache,
  withBindGroups,
} from "../../wgsl/kernel.ts";
import { LruMap } from "./_lru.ts";
import type { GpuTensor } from "../gpu/weights.ts";
import type { DeltaNetLayout, Hparams } from "../models/_arch.ts";
import type { GgmlTypeName } from "../quant/types.ts";
import type { SlotStates } from "../state.ts";
import type { TensorId } from "../names.ts";
import { assert } from "../errors.ts";
import { MATVEC, MATVEC_MAX_BATCH } from "../../wgsl/matvec.ts";
import { q8xBytes } from "../../wgsl/matvec_q8.ts";
import { RMS_NORM, rmsNormBindGroup, type RmsNormConstants, rmsNormGrid } from "../../wgsl/rms_norm.ts";
import type { GdnStepConstants } from "../../wgsl/gdn_step.ts";
import type { MoeMatvecTuning } from "../../wgsl/moe_matvec.ts";

/** One recorded dispatch: everything `pass.dispatchWorkgroups` needs. */
export interface Op {
  /** Kernel and layer, for debugging and per-op timing. */
  readonly label: string;
  /** Pipeline of the kernel variant. */
  readonly pipeline: GPUComputePipeline;
  /** Bind group 0. */
  readonly bindGroup: GPUBindGroup;
  /** Workgroups in x, y, z. */
  readonly grid: readonly [number, number, number];
  /** The bind group's bindings in binding order (graphs built by a GraphBuilder: a slot's clone maps them). */
  readonly bindings?: readonly Binding[];
}

/** Records `ops` in order into `pass` (dispatches in one pass see each other's writes in order). */
export function encodeOps(pass: GPUComputePassEncoder, ops: readonly Op[]): void {
  for (const op of ops) {
    pass.setPipeline(op.pipeline);
    pass.setBindGroup(0, op.bindGroup);
    pass.dispatchWorkgroups(op.grid[0], op.grid[1], op.grid[2]);
  }
}

/** A graph builder's hook at each layer's end, given the ops so far (see {@linkcode OpStream}). */
export type OnLayer = (ops: readonly Op[]) => void;

/**
 * Fewest new dispatches an {@linkcode OpStream} sends at a layer's end: about three layers of a chunk, or
 * `LLM_OP_STREAM_MIN` (a benchmark knob: bench/serve.ts's `ttftNewWidthMsMedian` by part size).
 */
export const OP_STREAM_MIN: number = (() => {
  try {
    const v = Number(Deno.env.get("LLM_OP_STREAM_MIN") ?? "64");
    return Number.isInteger(v) && v >= 1 ? v : 64;
  } catch {
    return 64;
  }
})();

/**
 * A chunk graph's dispatches sent to the GPU while the graph is still being built (its builder's `onLayer`):
 * a width no slot has built costs a 40-layer stage 15 to 45 ms of CPU (an H200's host, an H100's), which an
 * idle GPU would otherwise wait for inside the request's time to first token. Sent in parts of at least `minOps` dispatches at layers' ends
 * (a command buffer and pass each), the first layers run while the next ones are built. The queue keeps the
 * parts in order and every dispatch is the one the whole graph holds, so the results keep their bits.
 */
export class OpStream {
  readonly #device: GPUDevice;
  readonly #minOps: number;
  #enc: GPUCommandEncoder;
  #sent = 0;
  #parts = 0;
  #firstAt: number | undefined;

  /** @param enc where the run's first commands are (a slot's reset): the first part goes after them */
  constructor(device: GPUDevice, enc: GPUCommandEncoder, minOps = OP_STREAM_MIN) {
    [this.#device, this.#enc, this.#minOps] = [device, enc, minOps];
  }

  /** The hook for GraphBuilder.onLayer: sends the dispatches built since the last part, when enough. */
  readonly onLayer = (ops: readonly Op[]): void => {
    if (ops.length - this.#sent < this.#minOps) return;
    const pass = this.#enc.beginComputePass();
    encodeOps(pass, ops.slice(this.#sent));
    pass.end();
    this.#device.queue.submit([this.#enc.finish()]);
    [this.#sent, this.#enc] = [ops.length, this.#device.createCommandEncoder()];
    this.#parts++;
    this.#firstAt ??= performance.now();
  };

  /** Parts sent so far. */
  get parts(): number {
    return this.#parts;
  }

  /** When the first part was sent (`performance.now()`), if one was. */
  get firstAt(): number | undefined {
    return this.#firstAt;
  }

  /** The encoder the run goes on in (the one given when nothing was sent) and the graph's dispatches left. */
  rest(ops: readonly Op[]): { enc: GPUCommandEncoder; ops: readonly Op[] } {
    return { enc: this.#enc, ops: ops.slice(this.#sent) };
  }
}

/**
 * Widest prefill chunk whose tokens run as mat-vec columns (the decode kernels, one token each: the bits of
 * one-token steps); wider chunks use the tiled matmul, the grouped experts and the chunked DeltaNet.
 */
export const MATVEC_MAX_COLS = 8;

/**
 * Most slots (columns) of a batched decode step: the named mat-vec path's batch limit (`MATVEC_MAX_BATCH`,
 * matvec XR = 2). Wider than {@linkcode MATVEC_MAX_COLS} on purpose: a batched step always runs its columns
 * through the decode kernels (so each slot keeps the bits of its solo step), whereas chunks of 9..16 tokens
 * keep the prefill kernels (tests/forward_test.ts covers those at --chunk 16; docs/ARCHITECTURE.md, #20).
 */
export const BATCH_MAX_COLS = MATVEC_MAX_BATCH;

/**
 * Default tallest mat-vec that takes a deferred norm in its prologue: taller ones (an LM head's 248k rows)
 * would re-sum the norm in every one of their workgroups, which costs more than the norm's own dispatch
 * (the measurements behind 16384 are in docs/PERF.md).
 */
export const NORM_PROLOGUE_MAX_ROWS = 16384;

/** Build options the stage passes to every graph (see `StageOptions` for what each does). */
export interface GraphOptions {
  readonly normPrologueMaxRows: number;
  /** StageOptions.combineNormMinRows (≥ 2). */
  readonly combineNormMinRows: number;
  /** StageOptions.gdnBatchedSplit (undefined: the solo step's SPLIT). */
  readonly gdnBatchedSplit?: number;
  /** StageOptions.routerTakesNorm: the MoE router and routing may take the post-attention norm. */
  readonly routerTakesNorm: boolean;
  /** The chunked prefill's prep solves by loops (StageOptions.gdnCompactSolve). */
  readonly gdnCompactSolve: boolean;
  readonly moeTuning?: {
    readonly gateUp?: MoeMatvecTuning;
    readonly down?: MoeMatvecTuning;
    readonly batchedQ8Rows?: { readonly gateUp?: number; readonly down?: number };
  };
  readonly matvecTuning?: {
    readonly team?: number;
    readonly rows?: number;
    readonly q8bRows?: number;
    readonly q8bXsum?: boolean;
  };
  readonly fuseDecodeRoute: boolean;
  readonly groupedExperts: boolean;
  /** StageOptions.groupedMinTokensPerExpert. */
  readonly groupedMinTokensPerExpert: number;
  /** StageOptions.groupedMatvecMaxTokensPerExpert. */
  readonly groupedMatvecMaxTokensPerExpert: number;
  readonly int8Activations: boolean;
  /** StageOptions.int8Experts (true under int8Activations too): the expert passes take int8 x. */
  readonly int8Experts: boolean;
  /** StageOptions.kvF16: the KV caches hold f16 pairs (attention kernels' KV_F16). */
  readonly kvF16: boolean;
  /** StageOptions.int8Log: the log buffer and this graph's entries. */
  readonly int8Log?: { readonly buffer: GPUBuffer; readonly entries: Int8LogEntry[] };
}

/** Where one quantize_q8 of a graph logged its output (StageOptions.int8Log). */
export interface Int8LogEntry {
  readonly label: string;
  readonly col: number;
  readonly k: number;
  readonly type: GgmlTypeName;
  readonly offset: number;
}

/** The weights of one layer as the blocks read them. */
export interface LayerWeights {
  readonly attention: boolean;
  readonly layout: DeltaNetLayout | undefined;
  readonly t: (id: TensorId) => GpuTensor;
}

/** What one graph is built over: the stage's buffers and state, and which slot(s) it runs. */
export interface BuildContext {
  /** Slot state buffers (KV caches, conv rings, recurrent states). */
  readonly states: SlotStates;
  /** Positions per slot (the KV caches' P_MAX). */
  readonly nCtx: number;
  readonly slot: number;
  readonly rows: "all" | "last" | "none";
  readonly act: Record<string, GPUBuffer>;
  readonly pos: GPUBuffer;
  readonly zeroIds: GPUBuffer;
  readonly layers: readonly LayerWeights[];
  readonly firstLayer: number;
  readonly gdn: (layout: DeltaNetLayout | undefined) => GdnStepConstants;
  readonly embd: GpuTensor | undefined;
  readonly outNorm: GpuTensor | undefined;
  readonly lmHead: GpuTensor | undefined;
  /**
   * A batched decode step: one token of each of these slots (n = slots.length ≥ 2, column b = slots[b]), each
   * with its own position params [pos, 1] and id buffer (the previous step's id, read by its embedding).
   * Shared projections and experts take all columns; attention and DeltaNet run per slot on their state.
   */
  readonly batch?: BatchSlots;
}

/** Words per column of a batched step's column table (256 bytes: a column's entry is a bindable sub-range). */
export const BATCH_TABLE_WORDS = 64;

/**
 * Byte offset of a slot's chunk table in its position params buffer: words 0-1 hold the chunk's [pos, n]; a
 * chunk of 2..{@linkcode MATVEC_MAX_COLS} tokens also gets a column table here (column c: [pos + c, 1, slot]
 * at word c·{@linkcode BATCH_TABLE_WORDS}), so that its attention runs as the columns of a batched step
 * (one token each, attn_decode), the same bits as that many one-token steps.
 */
export const CHUNK_TABLE_OFFSET = 256;

/** Bytes of a slot's position params buffer (see {@linkcode CHUNK_TABLE_OFFSET}). */
export const POS_PARAMS_BYTES = CHUNK_TABLE_OFFSET + 4 * BATCH_TABLE_WORDS * MATVEC_MAX_COLS;

/**
 * Writes a chunk's position params to `buf` (a slot's, {@linkcode POS_PARAMS_BYTES}): [pos, n, cut], and its
 * column table. `cut` (0: none; else 0 < cut < n, a chunked prefill of n > MATVEC_MAX_COLS tokens): the
 * DeltaNet layers write their state after the chunk's first `cut` tokens to the states' taps
 * (SlotStates.tap), for a snapshot at pos + cut taken in the same pass.
 */
export function writeChunkPos(
  queue: GPUQueue,
  buf: GPUBuffer,
  slot: number,
  pos: number,
  n: number,
  cut = 0,
): void {
  queue.writeBuffer(buf, 0, Uint32Array.of(pos, n, cut));
  if (n < 2 || n > MATVEC_MAX_COLS) return;
  const table = new Uint32Array(BATCH_TABLE_WORDS * n);
  for (let c = 0; c < n; c++) table.set([pos + c, 1, slot], BATCH_TABLE_WORDS * c);
  queue.writeBuffer(buf, CHUNK_TABLE_OFFSET, table);
}

/** The per-slot buffers of a batched decode graph (see {@linkcode BuildContext.batch}). */
export interface BatchSlots {
  readonly slots: readonly number[];
  /**
   * The column table: column b's [pos, 1, slot] at word b·{@linkcode BATCH_TABLE_WORDS} (pos written before
   * each step, slot at creation). Kernels with a column dimension read it whole.
   */
  readonly table: GPUBuffer;
  /** Column b's params [pos, 1]: its entry of the table, for kernels dispatched per slot. */
  readonly pos: readonly Binding[];
  readonly tok: readonly GPUBuffer[];
}

/** A norm fused into the residual add (or expert combine) before it: weight and output rows. */
export interface FusedNorm {
  readonly w: GpuTensor;
  readonly y: GPUBuffer;
}

/** A decode norm not pushed yet: the next mat-vec reading `y` computes it in its prologue. */
export interface PendingNorm {
  readonly label: string;
  readonly x: GPUBuffer;
  readonly w: GpuTensor;
  readonly y: GPUBuffer;
}

/**
 * What the graphs of one owner (the `owned` list of a stage: these live and die with it) share: params buffers
 * by content, scratch buffers by purpose, int8 x buffers by K and the unused-binding buffer. The graphs of a
 * stage run one after another on one queue (WebGPU orders their dispatches), so scratch is never live in two
 * graphs at once; a stage then holds one set of scratch whatever the number of chunk widths and slots it has
 * built graphs for (one per graph grew GPU memory with every new prompt width: 4.5 MiB of split-K partials per
 * 256..504-token graph on the tiny model).
 */
interface OwnerShared {
  readonly params: Map<string, GPUBuffer>;
  readonly grown: Map<string, GPUBuffer>;
  readonly xq: Map<number, GPUBuffer>;
  readonly groups: LruMap<string, GPUBindGroup> & BindGroupCache;
  unused?: GPUBuffer;
}
const SHARED_BY_OWNER = new WeakMap<GPUBuffer[], OwnerShared>();
/** Bind groups an owner keeps for its graphs to share (a 40-layer graph has about a thousand). */
const BIND_GROUPS_KEPT = 16384;

/** The bind groups `owned`'s graphs share (a graph cloned for another slot takes its groups there too). */
export function ownerBindGroups(owned: GPUBuffer[]): BindGroupCache {
  return sharedOf(owned).groups;
}

function sharedOf(owned: GPUBuffer[]): OwnerShared {
  let s = SHARED_BY_OWNER.get(owned);
  if (!s) {
    const groups: OwnerShared["groups"] = new LruMap<string, GPUBindGroup>(BIND_GROUPS_KEPT);
    SHARED_BY_OWNER.set(owned, s = { params: new Map(), grown: new Map(), xq: new Map(), groups });
  }
  return s;
}

/** Builds the dispatch list of one chunk of `n` tokens; blocks push onto it. */
export class GraphBuilder {
  readonly device: GPUDevice;
  readonly cache: PipelineCache;
  readonly hp: Hparams;
  /** Tokens (columns) of the chunk. */
  readonly n: number;
  /**
   * Most columns one mat-vec of this graph takes ({@linkcode MATVEC_MAX_COLS}, or {@linkcode BATCH_MAX_COLS}
   * in a batched step): wider inputs are a prefill chunk's, for the tiled matmul and the grouped experts.
   */
  readonly maxCols: number;
  readonly opts: GraphOptions;
  readonly ops: Op[] = [];
  /** Receives every buffer the graph creates (its owner destroys them). */
  readonly #owned: GPUBuffer[];
  /** What this graph shares with the owner's other graphs. */
  readonly #shared: OwnerShared;
  /** The next free byte of the int8 log. */
  #logAt = 0;
  /** A decode norm not pushed yet (see blocks/norm.ts `norm`). */
  pending: PendingNorm | undefined;
  /** The x the last prefill matmul under int8Activations rounded, and the op count after it (blocks/linear). */
  lastRound: { from: GPUBuffer; k: number; cols: number; out: GPUBuffer; at: number } | undefined;
  /**
   * The x the last int8 mat-vec quantized, and the op count after it (blocks/linear); `alt`: the same columns
   * in the other byte order, where its quantize wrote both.
   */
  lastQ8:
    | {
      x: GPUBuffer;
      k: number;
      layout: number;
      cols: number;
      regions: Binding[];
      at: number;
      alt?: { layout: number; region: Binding };
    }
    | undefined;
  /** int8 x buffers (quantize_q8's output) by K, created on first use (shared by the owner's graphs). */
  readonly xq: Map<number, GPUBuffer>;
  /** Called with the ops so far at each layer's end (an {@linkcode OpStream} sends them while building). */
  onLayer?: OnLayer;

  /**
   * @param owned receives every buffer the graph creates (its owner destroys them)
   * @param batched a batched decode step of `n` slots (up to {@linkcode BATCH_MAX_COLS}), not a chunk
   */
  constructor(
    device: GPUDevice,
    cache: PipelineCache,
    hp: Hparams,
    n: number,
    owned: GPUBuffer[],
    opts: GraphOptions,
    batched = false,
  ) {
    assert(
      !batched || (n >= 2 && n <= BATCH_MAX_COLS),
      `a batched step has 2..${BATCH_MAX_COLS} columns, not ${n}`,
    );
    this.device = device;
    this.cache = cache;
    this.hp = hp;
    this.n = n;
    this.maxCols = batched ? BATCH_MAX_COLS : MATVEC_MAX_COLS;
    this.#owned = owned;
    this.#shared = sharedOf(owned);
    this.xq = this.#shared.xq;
    this.opts = opts;
  }

  /** Pushes one dispatch whose twin checks the buffers while building the bind group (`bindGroupOf`). */
  async checked(
    label: string,
    spec: KernelSpec,
    c: ConstValues,
    bindGroupOf: (pipeline: GPUComputePipeline) => GPUBindGroup,
    grid: readonly number[],
  ): Promise<void> {
    if (this.pending && spec !== MATVEC) await this.flushNorm();
    const pipeline = await this.cache.get(spec, c);
    const groups = this.#shared.groups;
    groups.last = undefined;
    this.ops.push({
      label,
      pipeline,
      bindGroup: withBindGroups(groups, () => bindGroupOf(pipeline)),
      grid: [grid[0] ?? 1, grid[1] ?? 1, grid[2] ?? 1],
      bindings: groups.last,
    });
  }

  /** Pushes one dispatch with bindings in binding order (checked by the caller). */
  push(
    label: string,
    spec: KernelSpec,
    c: ConstValues,
    bindings: readonly Binding[],
    grid: readonly number[],
  ): Promise<void> {
    return this.checked(label, spec, c, (p) => bindGroup(this.device, p, bindings), grid);
  }

  /**
   * A small constant params buffer (storage and uniform: mat-vec params bind as uniform, others as storage).
   * No kernel writes its params, so one buffer per content serves every graph of the owner (the layers of a
   * model repeat shapes, and a slot's graphs repeat another slot's): a graph builds a fraction of them.
   */
  storage(words: Uint32Array): GPUBuffer {
    const byContent = this.#shared.params;
    const key = words.join(",");
    const hit = byContent.get(key);
    if (hit) return hit;
    const buf = this.device.createBuffer({
      size: Math.max(16, words.byteLength),
      usage: GPUBufferUsage.STORAGE | GPUBufferUsage.UNIFORM | GPUBufferUsage.COPY_DST,
      mappedAtCreation: true,
    });
    new Uint32Array(buf.getMappedRange()).set(words);
    buf.unmap();
    this.#owned.push(buf);
    byContent.set(key, buf);
    return buf;
  }

  /**
   * Scratch for `name`, at least `bytes` long, shared by the owner's graphs: created, or replaced by one at
   * least 1.5 times larger, up to the binding limit (graphs built before keep the smaller one they bound, so a stage holds a few per
   * name, not one per graph).
   */
  grown(name: string, bytes: number): GPUBuffer {
    let buf = this.#shared.grown.get(name);
    if (!buf || buf.size < bytes) {
      // The growth never takes a size that fits the binding limit past it.
      const { maxStorageBufferBindingSize: bind, maxBufferSize } = this.device.limits;
      const cap = Math.max(bytes, Math.floor(Math.min(bind, maxBufferSize) / 256) * 256);
      buf = this.device.createBuffer({
        label: name,
        size: Math.min(cap, Math.ceil(Math.max(bytes, buf ? 1.5 * buf.size : 0) / 256) * 256),
        usage: GPUBufferUsage.STORAGE,
      });
      this.#owned.push(buf);
      this.#shared.grown.set(name, buf);
    }
    return buf;
  }

  /** A buffer the graph owns (destroyed with the stage). */
  own(buf: GPUBuffer): GPUBuffer {
    this.#owned.push(buf);
    return buf;
  }

  /** The split-K matmuls' partial products: one buffer per graph, grown as needed (`bytes` of it). */
  splitPart(bytes: number): Binding {
    return { buffer: this.grown("matmul split partials", bytes), offset: 0, size: bytes };
  }

  /** A 16-byte buffer for writable bindings a variant does not use (one per owner). */
  scratch(): GPUBuffer {
    if (!this.#shared.unused) {
      this.#shared.unused = this.device.createBuffer({ size: 16, usage: GPUBufferUsage.STORAGE });
      this.#owned.push(this.#shared.unused);
    }
    return this.#shared.unused;
  }

  /**
   * A region of the int8 log for `cols` columns of K int8 x read by `label`, each logged as column
   * `firstCol + i` (StageOptions.int8Log); undefined when the graph does not log.
   */
  logRegion(
    label: string,
    k: number,
    type: GgmlTypeName,
    cols: number,
    firstCol = 0,
  ): { buffer: GPUBuffer; offset: number; size: number } | undefined {
    const log = this.opts.int8Log;
    if (!log) return undefined;
    const bytes = cols * q8xBytes(k);
    const offset = this.#logAt;
    this.#logAt = Math.ceil((offset + bytes) / 256) * 256;
    assert(this.#logAt <= log.buffer.size, `int8 log of ${log.buffer.size} bytes is full at ${label}`);
    for (let col = 0; col < cols; col++) {
      log.entries.push({ label, col: firstCol + col, k, type, offset: offset + col * q8xBytes(k) });
    }
    return { buffer: log.buffer, offset, size: Math.ceil(bytes / 4) * 4 };
  }

  /**
   * Where an expert-side rounding leaves `cols` columns of int8 x (K elements each, quantize_q8's format): a
   * region of the int8 log (each column logged under `label`, the pass that reads it) or, when nothing logs,
   * the graph's scratch buffer `scratch` (grown as needed; "in": moe_route's output, read by gate·up;
   * "act": the down pass's own log, read by nobody; "prefill": roundX's, read by nobody).
   */
  q8Region(
    label: string,
    k: number,
    type: GgmlTypeName,
    cols: number,
    scratch: "in" | "act" | "prefill",
  ): Binding {
    const bytes = cols * q8xBytes(k);
    return this.logRegion(label, k, type, cols) ??
      { buffer: this.grown(`int8 x (${scratch})`, bytes), offset: 0, size: Math.ceil(bytes / 4) * 4 };
  }

  /** y = RMSNorm(x)·w over `rows` rows of nEmbd, as a dispatch of its own. */
  async rmsNorm(label: string, x: Binding, w: GpuTensor, y: GPUBuffer, rows: number): Promise<void> {
    const c: RmsNormConstants = { N: this.hp.nEmbd, EPS: this.hp.rmsEps, WG: 256 };
    await this.checked(
      label,
      RMS_NORM,
      c,
      (pipeline) =>
        rmsNormBindGroup(this.device, {
          pipeline,
          constants: c,
          nRows: rows,
          buffers: { x, w: part0(w), y },
        }),
      rmsNormGrid(rows),
    );
  }

  /** Pushes a deferred norm as its own dispatch (a row per column). */
  async flushNorm(): Promise<void> {
    const p = this.pending;
    if (!p) return;
    this.pending = undefined;
    await this.rmsNorm(p.label, p.x, p.w, p.y, this.n);
  }
}

/** The ggml type name of a tensor's blocks. */
export function typeName(t: GpuTensor): GgmlTypeName {
  return t.type.name as GgmlTypeName;
}

/** The single binding of a small tensor (norm weights, conv taps): its one part. */
export function part0(t: GpuTensor): Binding {
  assert(t.parts.length === 1, `tensor ${t.name} is in one part`);
  const p = t.parts[0]!;
  return { buffer: p.buffer, offset: p.offsetBytes, size: Math.ceil(p.sizeBytes / 4) * 4 };
}

/** Words of a batched activation column of `words` values: the next multiple of 64 (256-byte offsets). */
export function padWords(words: number): number {
  return Math.ceil(words / 64) * 64;
}

/** A sub-range of `words` f32 words of a buffer from word `at` (a multiple of 64: 256-byte offsets). */
export function sub(buf: GPUBuffer, at: number, words: number): Binding {
  return { buffer: buf, offset: at * 4, size: words * 4 };
}

/** Column `col` (`words` long) of a range whose columns lie `stride` words apart from its offset. */
export function column(b: Binding, col: number, stride: number, words: number): Binding {
  assert(!(b instanceof GPUBuffer), "columns are taken from a range binding");
  return { buffer: b.buffer, offset: (b.offset ?? 0) + 4 * col * stride, size: 4 * words };
}
