/**
 * The split planner: which layer range each box of a split chain runs, so that every stage fits its box's
 * memory and the stages take about equal time per token on boxes of different speeds.
 *
 * Memory per stage comes from the functions a stage allocates with, not from a second copy of them: the
 * weights are the tensors `loadPlan` names for the range (with the token embedding on the first stage and the
 * output norm and LM head on the last), sized as the upload lays them out (packs at 256-byte offsets); the
 * per-slot state is `stateSpecs` (KV for attention layers only, conv ring and recurrent state for DeltaNet
 * layers); the activations are `activationWords` at the chunk size plus the stage's few per-slot buffers;
 * and a fixed headroom covers what no stage buffer accounts for (the driver's context, pipelines, per-graph
 * params and scratch buffers, the readback ring). `inspect` prints the same per-layer numbers.
 *
 * Time per stage is its active bytes per token (what one decode step reads: every weight of its layers
 * with the routed experts at nExpertUsed of nExpert, one embedding row, the whole LM head, the DeltaNet
 * state read and written) divided by its box's speed ({@linkcode SPEED_UNIT_BYTES_PER_S} per unit;
 * {@linkcode measureStage} measures it on this GPU). The plan minimizes the slowest stage's time (the
 * pipeline's throughput once slots run in flight together), and among plans within
 * {@linkcode BALANCE_TOLERANCE} of that, the total time (one token's latency through the chain).
 *
 * @example
 * ```ts
 * import { openGguf } from "./gguf.ts";
 * import { formatPlan, modelCosts, planSplit } from "./plan.ts";
 * using file = await openGguf("model.gguf");
 * const plan = planSplit(modelCosts(file), [
 *   { name: "radeon", memBytes: 24 * 2 ** 30, speed: 2 },
 *   { name: "mac", memBytes: 16 * 2 ** 30, speed: 1 },
 * ], { nCtx: 32768, nSlots: 4, maxChunk: 256 });
 * console.log(formatPlan(plan));
 * ```
 * @module
 */
import type { GgufFile } from "./gguf.ts";
import type { Gpu } from "./gpu/device.ts";
import { archOf, type Hparams } from "./models/mod.ts";
import { GRAPHS } from "./models/graphs.ts";
import { parseTensorName, tensorLayer } from "./names.ts";
import {
  activationWords,
  checkStageFits,
  deltaNetStateBytes,
  MAX_BATCH_SLOTS,
  stateSpecs,
} from "./exec/activations.ts";
import { type LoadPlan, loadPlan } from "./exec/load_plan.ts";
import { Stage } from "./exec/stage.ts";
import { encodeOps, POS_PARAMS_BYTES } from "./graph/builder.ts";
import { PACK_ALIGN_BYTES } from "./gpu/weights.ts";
import { formatBytes } from "./inspect.ts";

/** Bytes per second of active weights that speed 1 stands for (100 GB/s); speeds are relative otherwise. */
export const SPEED_UNIT_BYTES_PER_S = 1e11;

/**
 * Memory each box keeps free beyond the stage's own buffers (512 MiB): the GPU driver's context, compiled
 * pipelines, the small params and scratch buffers each cached dispatch list owns, the readback ring, the
 * staging pool (at most 64 MiB, engine/gpu/readback.ts) and the snapshots of prefix reuse (one per slot, about
 * one slot's state) are not in the planned buffers; nor, on a box that serves the whole model, the decode
 * loop's rewind mirrors (engine/exec/_rewind.ts: twice every slot's recurrent state and conv ring, made on the
 * first request, SlotStates' rewind snapshots instead where the device has no memory for them).
 */
export const DEFAULT_HEADROOM_BYTES = 512 * 2 ** 20;

/** Plans whose slowest stage is within this fraction of the best one count as balanced; the fastest total wins. */
export const BALANCE_TOLERANCE = 0.02;

/** One machine of the chain, in chain order (the first runs the head). */
export interface PlanBox {
  /** Its name, used as its host name in the printed commands. */
  readonly name: string;
  /** Memory the GPU may use on it, in bytes (VRAM, or the share of unified memory). */
  readonly memBytes: number;
  /** Relative speed (1 = {@linkcode SPEED_UNIT_BYTES_PER_S} of active bytes per second). */
  readonly speed: number;
}

/** What the stages are sized for: the flags every box of the chain is started with. */
export interface PlanOptions {
  /** Positions per slot (`--ctx`). */
  readonly nCtx: number;
  /** Slots (`--slots`). */
  readonly nSlots: number;
  /** KV cache in f16 (`--kv-f16`). */
  readonly kvF16?: boolean;
  /** Tokens per prefill chunk (`--chunk`): the activations grow with it. */
  readonly maxChunk: number;
  /** Memory kept free per box (default {@linkcode DEFAULT_HEADROOM_BYTES}). */
  readonly headroomBytes?: number;
}

/** A model's per-layer costs, read once from its tensor table (no tensor data is read). */
export interface ModelCosts {
  /** First part's path. */
  readonly path: string;
  /** `general.architecture`. */
  readonly arch: string;
  /** Hyper-parameters. */
  readonly hp: Hparams;
  /** Per decoder layer: bytes its tensors take on the GPU (packs as uploaded). */
  readonly layerWeightBytes: readonly number[];
  /** Per decoder layer: bytes one decode step reads (routed experts at nExpertUsed/nExpert, DeltaNet state twice). */
  readonly layerActiveBytes: readonly number[];
  /** GPU bytes of the global tensors a first (not last) stage loads: the token embedding. */
  readonly firstWeightBytes: number;
  /** GPU bytes of the global tensors a last (not first) stage loads: output norm and LM head (or the tied embedding). */
  readonly lastWeightBytes: number;
  /** GPU bytes of the global tensors of a stage that is both first and last (the tied embedding loaded once). */
  readonly wholeGlobalBytes: number;
  /** Bytes a first stage reads per token beyond its layers: one embedding row. */
  readonly firstActiveBytes: number;
  /** Bytes a last stage reads per token beyond its layers: the output norm and the whole LM head. */
  readonly lastActiveBytes: number;
}

/** Memory of one stage, as it will be allocated (plus the headroom). */
export interface StageMemory {
  /** Weight buffers. */
  readonly weightBytes: number;
  /** Per-slot state of every slot: KV caches, conv rings, recurrent states. */
  readonly stateBytes: number;
  /** Activation buffers at the chunk size, and the per-slot position and token buffers. */
  readonly activationBytes: number;
  /** Kept free for what no stage buffer accounts for. */
  readonly headroomBytes: number;
  /** The sum. */
  readonly totalBytes: number;
}

/** One box's part of a plan. */
export interface PlannedStage {
  /** The box. */
  readonly box: PlanBox;
  /** Its layers `[a, b)`. */
  readonly layers: readonly [number, number];
  /** Its memory. */
  readonly memory: StageMemory;
  /** Bytes it reads per token. */
  readonly activeBytes: number;
  /** Estimated ms per token: activeBytes / (speed × SPEED_UNIT_BYTES_PER_S). */
  readonly timeMs: number;
  /** Its share of the chain's time per token. */
  readonly timeShare: number;
  /** Its share of the chain's active bytes (the work). */
  readonly workShare: number;
}

/** A plan: one stage per box, in chain order. */
export interface SplitPlan {
  /** The model's costs. */
  readonly model: ModelCosts;
  /** What it was sized for. */
  readonly options: Required<PlanOptions>;
  /** The stages. */
  readonly stages: readonly PlannedStage[];
  /** The slowest stage's estimated ms per token. */
  readonly bottleneckMs: number;
  /** Estimated ms per token through the whole chain (hops excluded). */
  readonly totalMs: number;
}

/** Why no plan exists: `no_fit` (the boxes cannot hold the model), `box_too_small`, `too_many_boxes`. */
export type PlanErrorCode = "no_fit" | "box_too_small" | "too_many_boxes";

/** The planner's refusal: the message says what does not fit and by how much. */
export class PlanError extends Error {
  /** Which refusal. */
  readonly code: PlanErrorCode;
  /** Bytes missing (the largest shortfall named), when the refusal is about memory. */
  readonly shortBytes: number;

  /** Creates the error. */
  constructor(code: PlanErrorCode, message: string, shortBytes = 0) {
    super(message);
    this.name = "PlanError";
    this.code = code;
    this.shortBytes = shortBytes;
  }
}

const EXPERT_IDS: ReadonlySet<string> = new Set(["ffn_gate_exps", "ffn_up_exps", "ffn_down_exps"]);

/** GPU bytes of a load plan's tensors, laid out as uploadTensors lays them: packs at 256-byte offsets. */
function uploadBytes(
  file: GgufFile,
  plan: Pick<LoadPlan, "names" | "packs">,
  keep: (name: string) => boolean,
) {
  const packed = new Set<string>();
  let bytes = 0;
  for (const pack of plan.packs) {
    if (!pack.some(keep)) continue;
    let size = 0;
    for (const name of pack) {
      size = Math.ceil((size + file.tensor(name).nbytes) / PACK_ALIGN_BYTES) * PACK_ALIGN_BYTES;
      packed.add(name);
    }
    bytes += Math.max(4, size);
  }
  for (const name of plan.names) {
    if (packed.has(name) || !keep(name)) continue;
    bytes += Math.max(4, Math.ceil(file.tensor(name).nbytes / 4) * 4);
  }
  return bytes;
}

/**
 * Reads a model's per-layer costs from its tensor table and the architecture's tensor check.
 * @throws {GgufError} when the architecture is unsupported or the file fails its tensor check
 */
export function modelCosts(file: GgufFile): ModelCosts {
  const arch = archOf(file.metadata);
  const hp = arch.readHparams(file.metadata);
  const check = arch.checkTensors(file, hp);
  const graph = GRAPHS[arch.name];
  const n = hp.nLayer;
  const isGlobal = (name: string) => tensorLayer(name) === undefined;
  const layerWeightBytes: number[] = [];
  for (let l = 0; l < n; l++) {
    const p = loadPlan(file, hp, check, [l, l + 1], graph);
    layerWeightBytes.push(uploadBytes(file, p, (name) => !isGlobal(name)));
  }
  const globalsOf = (range: [number, number]) =>
    uploadBytes(file, loadPlan(file, hp, check, range, graph), isGlobal);
  const wholeGlobalBytes = globalsOf([0, n]);
  const firstWeightBytes = n > 1 ? globalsOf([0, 1]) : wholeGlobalBytes;
  const lastWeightBytes = n > 1 ? globalsOf([n - 1, n]) : wholeGlobalBytes;

  const { convBytes, stateBytes } = deltaNetStateBytes(hp);
  const layerActiveBytes = Array.from(
    { length: n },
    (_, l) => hp.isAttention[l] ? 0 : 2 * (convBytes + stateBytes),
  );
  let firstActiveBytes = 0, lastActiveBytes = 0;
  for (const t of file.tensors.values()) {
    const id = parseTensorName(t.name);
    if (id === undefined) continue;
    if (id.layer !== undefined) {
      if (id.layer < n) {
        layerActiveBytes[id.layer]! += EXPERT_IDS.has(id.id)
          ? (t.nbytes * hp.nExpertUsed) / hp.nExpert
          : t.nbytes;
      }
    } else if (id.id === "token_embd") {
      firstActiveBytes += t.nbytes / hp.nVocab;
      if (check.tiedOutput) lastActiveBytes += t.nbytes;
    } else if (id.id === "output" || id.id === "output_norm") {
      lastActiveBytes += t.nbytes;
    }
  }
  return {
    path: file.path,
    arch: arch.name,
    hp,
    layerWeightBytes,
    layerActiveBytes,
    firstWeightBytes,
    lastWeightBytes,
    wholeGlobalBytes,
    firstActiveBytes,
    lastActiveBytes,
  };
}

/** Prefix sums and the per-range terms the search needs in O(1) per range. */
class RangeCosts {
  readonly #m: ModelCosts;
  readonly #o: Required<PlanOptions>;
  readonly #weights: number[];
  readonly #state: number[];
  readonly #active: number[];
  readonly #deltaNet: number[];
  /** Activation bytes by [deltaNet][last]. */
  readonly #act: number[][];

  constructor(m: ModelCosts, o: Required<PlanOptions>) {
    this.#m = m;
    this.#o = o;
    const { hp } = m;
    const sums = (f: (l: number) => number) => {
      const out = [0];
      for (let l = 0; l < hp.nLayer; l++) out.push(out[l]! + f(l));
      return out;
    };
    this.#weights = sums((l) => m.layerWeightBytes[l]!);
    this.#active = sums((l) => m.layerActiveBytes[l]!);
    // Each slot's state, and each state live whole once more: its tap (SlotStates.tap).
    this.#state = sums((l) =>
      stateSpecs(hp, [l, l + 1], o.nCtx, o.kvF16).reduce(
        (s, x) => s + x.sizeBytes * (x.liveRanges ? o.nSlots : o.nSlots + 1),
        0,
      )
    );
    this.#deltaNet = sums((l) => hp.isAttention[l] ? 0 : 1);
    this.#act = [false, true].map((deltaNet) =>
      [false, true].map((last) => {
        const words = activationWords(hp, { maxChunk: o.maxChunk, deltaNet, last });
        // As the stage allocates them: each activation buffer at least 16 bytes; per slot a position params
        // buffer (POS_PARAMS_BYTES: the chunk's [pos, n] and its chunk table) and a token buffer of 16 bytes;
        // the zero-id buffer of the widest chunk or batched step.
        return Object.values(words).reduce((s, w) => s + Math.max(16, 4 * w), 0) +
          (POS_PARAMS_BYTES + 16) * o.nSlots +
          4 * Math.max(o.maxChunk, MAX_BATCH_SLOTS);
      })
    );
  }

  memory(a: number, b: number): StageMemory {
    const m = this.#m;
    const n = m.hp.nLayer;
    const first = a === 0, last = b === n;
    const globals = first && last
      ? m.wholeGlobalBytes
      : first
      ? m.firstWeightBytes
      : last
      ? m.lastWeightBytes
      : 0;
    const weightBytes = this.#weights[b]! - this.#weights[a]! + globals;
    const stateBytes = this.#state[b]! - this.#state[a]!;
    const activationBytes = this.#act[this.#deltaNet[b]! > this.#deltaNet[a]! ? 1 : 0]![last ? 1 : 0]!;
    const headroomBytes = this.#o.headroomBytes;
    return {
      weightBytes,
      stateBytes,
      activationBytes,
      headroomBytes,
      totalBytes: weightBytes + stateBytes + activationBytes + headroomBytes,
    };
  }

  active(a: number, b: number): number {
    const m = this.#m;
    return this.#active[b]! - this.#active[a]! + (a === 0 ? m.firstActiveBytes : 0) +
      (b === m.hp.nLayer ? m.lastActiveBytes : 0);
  }
}

function resolved(o: PlanOptions): Required<PlanOptions> {
  const headroomBytes = o.headroomBytes ?? DEFAULT_HEADROOM_BYTES;
  if (!(Number.isFinite(headroomBytes) && headroomBytes >= 0)) {
    throw new RangeError(`Headroom ${headroomBytes} bytes must be a number >= 0`);
  }
  return { nCtx: o.nCtx, nSlots: o.nSlots, kvF16: o.kvF16 ?? false, maxChunk: o.maxChunk, headroomBytes };
}

/**
 * The memory a stage of layers `[a, b)` allocates at these options, plus the headroom: the same numbers the
 * plan uses for every range.
 */
export function stageMemory(
  m: ModelCosts,
  layers: readonly [number, number],
  opts: PlanOptions,
): StageMemory {
  return new RangeCosts(m, resolved(opts)).memory(layers[0], layers[1]);
}

const gib = formatBytes;

function breakdown(s: StageMemory): string {
  return `weights ${gib(s.weightBytes)}, KV and state ${gib(s.stateBytes)}, activations ${
    gib(s.activationBytes)
  }, headroom ${gib(s.headroomBytes)}`;
}

function rangeName(m: ModelCosts, a: number, b: number): string {
  const extra = [a === 0 ? "the token embedding" : "", b === m.hp.nLayer ? "the output norm and LM head" : ""]
    .filter((s) => s).join(" and ");
  return `layers ${a}:${b}${extra ? ` with ${extra}` : ""}`;
}

/**
 * Plans layer ranges for `boxes` (in chain order; the first runs the head): every box gets at least one layer
 * and a stage that fits its memory, and the ranges are balanced by speed (see the module doc).
 * @throws {PlanError} `too_many_boxes`; `box_too_small` naming each box that cannot hold even its smallest
 *   possible stage and by how much; `no_fit` when the boxes together cannot hold the model, naming the layers
 *   left over and the memory missing
 * @throws {RangeError} on a box with a bad memory or speed, or options out of range (checkStageFits' messages)
 */
export function planSplit(m: ModelCosts, boxes: readonly PlanBox[], opts: PlanOptions): SplitPlan {
  const o = resolved(opts);
  const n = m.hp.nLayer;
  const B = boxes.length;
  if (B === 0) throw new RangeError("No boxes to plan for: give at least one --box NAME=MEM_GIB[,speed]");
  for (const box of boxes) {
    if (!(Number.isFinite(box.memBytes) && box.memBytes > 0)) {
      throw new RangeError(`Box ${box.name}: memory ${box.memBytes} bytes must be a positive number`);
    }
    if (!(Number.isFinite(box.speed) && box.speed > 0)) {
      throw new RangeError(`Box ${box.name}: speed ${box.speed} must be a positive number`);
    }
  }
  // The slot count and context checks a stage load makes (binding limits are per box: Stage.load checks them).
  checkStageFits(m.hp, {
    layers: [0, n],
    nCtx: o.nCtx,
    nSlots: o.nSlots,
    maxChunk: o.maxChunk,
    kvF16: o.kvF16,
  }, {
    maxStorageBufferBindingSize: Number.MAX_SAFE_INTEGER,
    maxBufferSize: Number.MAX_SAFE_INTEGER,
  });
  if (B > n) {
    throw new PlanError(
      "too_many_boxes",
      `${B} boxes but ${m.path} has only ${n} layers, and every box runs at least one: give at most ${n} boxes`,
    );
  }
  const rc = new RangeCosts(m, o);
  const fits = (i: number, a: number, b: number) => rc.memory(a, b).totalBytes <= boxes[i]!.memBytes;

  // A box that cannot hold even the smallest stage its position allows (first: layer 0 with the embedding;
  // last: the last layer with the LM head; middle: any one layer it could get).
  if (B > 1) {
    const small: string[] = [];
    let worst = 0;
    for (let i = 0; i < B; i++) {
      const candidates = i === 0
        ? [0]
        : i === B - 1
        ? [n - 1]
        : Array.from({ length: n - B + 1 }, (_, k) => k + i);
      let best = candidates[0]!;
      for (const l of candidates) {
        if (rc.memory(l, l + 1).totalBytes < rc.memory(best, best + 1).totalBytes) best = l;
      }
      const need = rc.memory(best, best + 1);
      const box = boxes[i]!;
      if (need.totalBytes > box.memBytes) {
        worst = Math.max(worst, need.totalBytes - box.memBytes);
        small.push(
          `Box ${box.name} (${
            gib(box.memBytes)
          }) is too small for even one layer: the smallest stage it could run ` +
            `there, ${rangeName(m, best, best + 1)}, needs ${gib(need.totalBytes)} (${breakdown(need)}): ` +
            `${
              gib(need.totalBytes - box.memBytes)
            } short: give it more memory, lower --ctx or --slots, or leave it out`,
        );
      }
    }
    if (small.length > 0) throw new PlanError("box_too_small", small.join("\n"), worst);
  }

  // Feasibility: filling the boxes in order, each with as many layers as fit (leaving one per box after it),
  // finds a plan whenever one exists, since a range's memory only grows with the range.
  {
    let a = 0;
    const taken: string[] = [];
    for (let i = 0; i < B - 1; i++) {
      let b = a;
      while (b + 1 <= n - (B - 1 - i) && fits(i, a, b + 1)) b++;
      if (b === a) break;
      taken.push(`${boxes[i]!.name} takes ${a}:${b}`);
      a = b;
    }
    const i = taken.length;
    if (i < B - 1 || !fits(B - 1, a, n)) {
      const box = boxes[i]!;
      const end = i === B - 1 ? n : a + 1;
      const need = rc.memory(a, end);
      const short = need.totalBytes - box.memBytes;
      const whole = rc.memory(0, n);
      throw new PlanError(
        "no_fit",
        `The model does not fit these boxes at --ctx ${o.nCtx} --slots ${o.nSlots}${
          o.kvF16 ? " --kv-f16" : ""
        }: ` +
          (taken.length ? `filled in order, ${taken.join(", ")}; then ` : "") +
          `${rangeName(m, a, end)} would go to box ${box.name} (${gib(box.memBytes)}), which needs ` +
          `${gib(need.totalBytes)} for it (${breakdown(need)}): ${
            gib(short)
          } short. The whole model's weights ` +
          `are ${gib(whole.weightBytes)} and its KV and state at these settings ${
            gib(whole.stateBytes)
          }: add a ` +
          `box or memory, lower --ctx or --slots, or use --kv-f16`,
        short,
      );
    }
  }

  // Balance: the least bottleneck time, then the least total time within BALANCE_TOLERANCE of it.
  const time = (i: number, a: number, b: number) =>
    rc.active(a, b) / (boxes[i]!.speed * SPEED_UNIT_BYTES_PER_S) * 1000;
  const search = (cost: (prev: number, t: number) => number, cap: number) => {
    // best[i][b]: the least cost of boxes 0..i covering layers 0:b; from[i][b]: where box i starts.
    const best = Array.from({ length: B }, () => new Array<number>(n + 1).fill(Infinity));
    const from = Array.from({ length: B }, () => new Array<number>(n + 1).fill(-1));
    for (let b = 1; b <= n - B + 1; b++) {
      const t = time(0, 0, b);
      if (t <= cap && fits(0, 0, b)) [best[0]![b], from[0]![b]] = [cost(0, t), 0];
    }
    for (let i = 1; i < B; i++) {
      for (let b = i + 1; b <= n - (B - 1 - i); b++) {
        for (let a = i; a < b; a++) {
          const prev = best[i - 1]![a]!;
          if (prev === Infinity) continue;
          const t = time(i, a, b);
          if (t > cap || !fits(i, a, b)) continue;
          const c = cost(prev, t);
          if (c < best[i]![b]!) [best[i]![b], from[i]![b]] = [c, a];
        }
      }
    }
    const ranges: [number, number][] = [];
    let b = n;
    for (let i = B - 1; i >= 0; i--) {
      const a = from[i]![b]!;
      if (a < 0) return undefined;
      ranges.unshift([a, b]);
      b = a;
    }
    return { cost: best[B - 1]![n]!, ranges };
  };
  const minimax = search((prev, t) => Math.max(prev, t), Infinity);
  if (!minimax) throw new Error("Internal error: a feasible split exists but the search found none");
  const balanced = search((prev, t) => prev + t, minimax.cost * (1 + BALANCE_TOLERANCE)) ?? minimax;

  const totalActive = rc.active(0, n);
  const times = balanced.ranges.map(([a, b], i) => time(i, a, b));
  const totalMs = times.reduce((s, t) => s + t, 0);
  return {
    model: m,
    options: o,
    stages: balanced.ranges.map(([a, b], i) => ({
      box: boxes[i]!,
      layers: [a, b] as const,
      memory: rc.memory(a, b),
      activeBytes: rc.active(a, b),
      timeMs: times[i]!,
      timeShare: times[i]! / totalMs,
      workShare: rc.active(a, b) / totalActive,
    })),
    bottleneckMs: Math.max(...times),
    totalMs,
  };
}

/** The plan as text: settings, one row per box, and why it looks the way it does. */
export function formatPlan(p: SplitPlan): string {
  const { model: m, options: o } = p;
  const pct = (x: number) => `${(100 * x).toFixed(1)}%`;
  const rows = [
    [
      "box",
      "speed",
      "layers",
      "weights",
      "KV+state",
      "activations",
      "headroom",
      "total",
      "memory",
      "work",
      "est. ms/token",
      "time share",
    ],
    ...p.stages.map((s) => [
      s.box.name,
      String(s.box.speed),
      `${s.layers[0]}:${s.layers[1]}`,
      gib(s.memory.weightBytes),
      gib(s.memory.stateBytes),
      gib(s.memory.activationBytes),
      gib(s.memory.headroomBytes),
      gib(s.memory.totalBytes),
      gib(s.box.memBytes),
      pct(s.workShare),
      s.timeMs.toPrecision(3),
      pct(s.timeShare),
    ]),
  ];
  const w = rows[0]!.map((_, c) => Math.max(...rows.map((r) => r[c]!.length)));
  const table = rows.map((r) =>
    r.map((cell, c) => (c <= 2 ? cell.padEnd(w[c]!) : cell.padStart(w[c]!))).join("  ")
  );
  const slowest = p.stages.reduce((a, s) => (s.timeMs > a.timeMs ? s : a));
  return [
    `${m.path}: ${m.arch}, ${m.hp.nLayer} layers, at --ctx ${o.nCtx} --slots ${o.nSlots} (KV ${
      o.kvF16 ? "f16" : "f32"
    }), --chunk ${o.maxChunk}, headroom ${formatBytes(o.headroomBytes)} per box`,
    "",
    ...table,
    "",
    `Memory per box: the weights of its layers (the first box also the token embedding, the last the output norm ` +
    `and LM head), KV for its attention layers and DeltaNet state for its DeltaNet layers (per slot), its ` +
    `activations at --chunk ${o.maxChunk}, and the headroom.`,
    `Time per token: the bytes a decode step reads on each box (routed experts at ${m.hp.nExpertUsed} of ` +
    `${m.hp.nExpert}, the whole LM head on the last box) over its speed (1 = ${
      SPEED_UNIT_BYTES_PER_S / 1e9
    } GB/s). ` +
    `The ranges make the slowest stage as fast as they can (here ${slowest.box.name}, ${
      slowest.timeMs.toPrecision(3)
    } ms), then the whole chain (${p.totalMs.toPrecision(3)} ms per token, network hops excluded).`,
  ].join("\n");
}

/** What {@linkcode measureStage} found. */
export interface StageMeasurement {
  /** The measured layers. */
  readonly layers: readonly [number, number];
  /** Milliseconds per decode step of the stage (one token, slot 0). */
  readonly msPerToken: number;
  /** Bytes the step reads (as the plan counts them). */
  readonly activeBytes: number;
  /** The speed to pass as `--box NAME=MEM,speed`: activeBytes per second over SPEED_UNIT_BYTES_PER_S. */
  readonly speed: number;
}

/**
 * Loads layers `[a, b)` on this GPU (one slot, a short context) and times `steps` decode steps of one token:
 * the cached dispatch list of a one-token chunk, many passes in one submission, timed as the difference of a
 * short and a long run so the readback's fixed cost cancels; best of three.
 * @throws {RangeError} or {GpuError} as Stage.load (the range does not fit this GPU)
 */
export async function measureStage(
  gpu: Gpu,
  file: GgufFile,
  opts: { costs: ModelCosts; layers: readonly [number, number]; steps?: number },
): Promise<StageMeasurement> {
  const steps = opts.steps ?? 16;
  if (!Number.isInteger(steps) || steps < 1) throw new RangeError(`Steps ${steps} must be an integer >= 1`);
  const stage = await Stage.load(gpu, file, {
    layers: opts.layers,
    nCtx: 64,
    nSlots: 1,
    maxChunk: 8,
    onLog: () => {},
  });
  const { device } = gpu;
  const src = device.createBuffer({ size: 16, usage: GPUBufferUsage.STORAGE | GPUBufferUsage.COPY_SRC });
  const rb = device.createBuffer({ size: 16, usage: GPUBufferUsage.MAP_READ | GPUBufferUsage.COPY_DST });
  try {
    // One real run sets the slot's position and input buffers; the timed passes repeat its dispatches.
    await stage.run(
      0,
      stage.first ? { tokens: [1] } : { hidden: new Float32Array(stage.hp.nEmbd).fill(0.01), nTokens: 1 },
      0,
    );
    const ops = await stage.graph(0, 1, "last");
    const wall = async (k: number) => {
      const enc = device.createCommandEncoder();
      for (let i = 0; i < k; i++) {
        const pass = enc.beginComputePass();
        encodeOps(pass, ops);
        pass.end();
      }
      enc.copyBufferToBuffer(src, 0, rb, 0, 16);
      const t = performance.now();
      device.queue.submit([enc.finish()]);
      await rb.mapAsync(GPUMapMode.READ);
      rb.unmap();
      return performance.now() - t;
    };
    await wall(2);
    let best = Infinity;
    for (let r = 0; r < 3; r++) {
      best = Math.min(best, Math.max(0, (await wall(2 + steps)) - (await wall(2))) / steps);
    }
    const msPerToken = Math.max(best, 1e-6);
    const activeBytes = new RangeCosts(opts.costs, resolved({ nCtx: 64, nSlots: 1, maxChunk: 8 })).active(
      opts.layers[0],
      opts.layers[1],
    );
    return {
      layers: opts.layers,
      msPerToken,
      activeBytes,
      speed: activeBytes / (msPerToken / 1000) / SPEED_UNIT_BYTES_PER_S,
    };
  } finally {
    src.destroy();
    rb.destroy();
    stage.destroy();
  }
}
