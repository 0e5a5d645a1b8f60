/**
 * The decode driver: generation on one or several slots of a whole-model stage without an awaited readback
 * between decode steps. ONE loop serves 1..MAX_BATCH_SLOTS slots: each prompt is prefilled on its slot and
 * its first id selected; then every decode step runs all the slots still generating in one compute pass (one
 * slot: its own decode graph; several: the batched graph, whose projections, experts and LM head read their
 * weights once for all columns while attention and DeltaNet run per slot on its own state and position), and
 * each slot's argmax or sampler writes its next id straight into the next step's token buffer and a GPU id
 * ring. Ids come back every `batch` steps through the readback ring while the next batch, encoded beforehand,
 * runs. A stop id found late is exact: the slot is rewound to a snapshot taken at the start of that batch and
 * re-fed only the accepted tokens. Each slot's result equals its own solo run: the mat-vecs sum every column
 * in the same order.
 *
 * A scheduler changes the running set between calls (continuous batching, `engine/serve/_runner.ts`): a call
 * with `pause` returns at a batch boundary, and a sequence that did not end there continues in the next call
 * with `resume`, its last id fed by the first decode step (no prefill) and its sampler at the same RNG step and
 * penalty window, beside sequences that join with a fresh prompt.
 * @module
 */
import { assert, NumericsError } from "../errors.ts";
import { ReadbackRing } from "../gpu/readback.ts";
import { trace } from "./_trace.ts";
import { RewindPoints } from "./_rewind.ts";
import { BATCH_TABLE_WORDS, encodeOps, type Op, OpStream, writeChunkPos } from "../graph/builder.ts";
import { buildSelector, samplerStart, type Selector } from "./_selector.ts";
import { type ChunkStep, chunkSteps, PieceParts, snapCheck } from "./_piece_parts.ts";
import { MAX_BATCH_SLOTS } from "./activations.ts";
import { argmaxCpu, isGreedy, pairsToTop, topCpu } from "../sampling.ts";
import type { BatchItem, GenerateOptions, GenerateResult, SlotDecoder } from "./slot_decoder.ts";
import type { DecodeBuffers, DecodeStage } from "./_decode_api.ts";

/** What a fresh sequence's one readback brings back: its last logits row and its sampler's first id. */
interface FirstRead {
  readonly logits: Float32Array<ArrayBuffer>;
  /** The sampler's draw (meaningless without a sampler). */
  readonly id: number;
}

/** The decode step of one slot: its graph followed by its selector's step dispatches. */
interface SoloStep extends Selector {
  readonly ops: readonly Op[];
}

/** A solo step's settings: steps per readback, top-k pairs, whether it samples. */
type SoloKind = { readonly S: number; readonly top: number; readonly sampling: boolean };
const soloKey = (slot: number, k: SoloKind) => `${slot}/${k.S}/${k.top}/${k.sampling}`;

/** A sequence in flight. */
interface Seq {
  readonly slot: number;
  readonly o: GenerateOptions;
  readonly top: number;
  readonly sampling: boolean;
  readonly stops: ReadonlySet<number>;
  /** Position of the first decode step (base + prompt; a resumed sequence: base). */
  readonly start: number;
  /** Leading ids of `tokens` returned by an earlier call (1 when resumed: the id its first step feeds). */
  readonly skip: number;
  /** Decode steps wanted (ids after the first). */
  readonly steps: number;
  readonly tokens: number[];
  readonly tops: [number, number][][];
  reason: GenerateResult["reason"];
  ended: boolean;
  /** Steps encoded so far. */
  sched: number;
  /** Steps whose ids landed. */
  ran: number;
  /** Snapshots at batch starts: step index and snapshot id. */
  readonly snaps: { at: number; id: number }[];
  /** Snapshots no rewind needs any more, recycled by the next batches' (SlotStates.retake). */
  readonly spare: number[];
  /** The selector of its latest batch and the id buffer it writes. */
  sel: Selector;
  tok: GPUBuffer;
}

/** Generation over one whole-model stage's slots; see the module doc. */
export class DecodeDriver implements SlotDecoder {
  readonly #stage: DecodeStage;
  readonly #b: DecodeBuffers;
  readonly #solo = new Map<string, SoloStep>();
  /** The settings of the latest solo step (what `warmIdle` prepares for the other slots). */
  #lastSolo: SoloKind | undefined;
  readonly #selectors = new Map<string, Selector>();
  /** The readback ring and params buffers kept across calls (see #readback). */
  #rb: { ring: ReadbackRing; batchParams: GPUBuffer[] } | undefined;
  #rewind: RewindPoints | undefined;
  /** Prefill chunks, whole (`prefill`) or in parts (`prefillPart`); made on first use. */
  #parts: PieceParts | undefined;

  /** Drives `stage`, encoding with its buffers `b`. */
  constructor(stage: DecodeStage, b: DecodeBuffers) {
    this.#stage = stage;
    this.#b = b;
  }

  /** Positions per slot. */
  get nCtx(): number {
    return this.#stage.nCtx;
  }

  /** Slots. */
  get nSlots(): number {
    return this.#stage.states.nSlots;
  }

  /** Whether several slots can decode in one step (see Stage.canBatch). */
  get canBatch(): boolean {
    return this.#stage.canBatch;
  }

  /** Bytes held by snapshots. */
  get snapshotBytes(): number {
    return this.#stage.states.snapshotBytes;
  }

  /** Tokens held by `slot`. */
  length(slot: number): number {
    return this.#stage.length(slot);
  }

  /**
   * Feeds `tokens` to `slot` at `base` (0 resets it). Queued without a readback (no logits, no mapping): the
   * next call's readback lands after it, and a GPU error surfaces there. Paced (see #queueChunks): it returns
   * once the work submitted before its last chunk has finished, so a scheduler's progress per piece (and a
   * message arriving meanwhile) follows the GPU instead of a queue of a whole long prompt. With `snapAt`
   * (base < snapAt <= base + tokens) it also snapshots the slot at that position, inside the chunk holding it
   * where it can (PieceParts.queue), and returns the snapshot's id.
   */
  async prefill(
    slot: number,
    tokens: readonly number[],
    base: number,
    snapAt?: number,
  ): Promise<number | undefined> {
    this.#b.slotCheck(slot);
    this.#b.inputCheck(slot, tokens, base);
    snapCheck(snapAt, base, tokens.length);
    return await this.#queueChunks(slot, tokens, base, undefined, snapAt);
  }

  /** Whether `prefill` and `generate` take a snapshot inside a chunk (`snapAt`): yes, from the states' taps. */
  get snapInPrefill(): boolean {
    return true;
  }

  /** Pieces run a few layers at a time (`prefillPart`): every layer of the stage, chunks of `maxChunk`. */
  get parts(): { layers: readonly [number, number]; maxTokens: number } {
    return { layers: this.#stage.layers, maxTokens: this.#stage.maxChunk };
  }
  /** `prefill` of one chunk through `layers` only (SlotDecoder.prefillPart; engine/exec/_piece_parts.ts). */
  async prefillPart(slot: number, tokens: readonly number[], base: number, layers: readonly number[]) {
    this.#b.slotCheck(slot);
    this.#b.inputCheck(slot, tokens, base);
    this.#parts ??= new PieceParts(this.#stage, this.#b);
    await this.#parts.run(slot, tokens, base, layers, blockUntilIdle);
  }

  /**
   * Queues `tokens` on `slot` at `base` in chunks of `maxChunk`, each encoded first, then submitted once the
   * work before it has finished: `queue.onSubmittedWorkDone()`, whose call blocks until the queue is idle in
   * Deno as `mapAsync`'s does (measured on lavapipe: the call returned after the 220-280 ms of a 64-token
   * chunk), maps nothing, and its promise is not awaited (its 10 ms timer stays off the path). The GPU idles
   * for a submit only, and `onDone(n)` reports the first `n` tokens finished, before each chunk but the first.
   * With `snapAt`, a snapshot at that position (its id).
   */
  #queueChunks(
    slot: number,
    tokens: readonly number[],
    base: number,
    onDone?: (n: number) => void,
    snapAt?: number,
  ): Promise<number | undefined> {
    this.#parts ??= new PieceParts(this.#stage, this.#b);
    return this.#parts.queue(slot, tokens, base, { snapAt, idle: blockUntilIdle, onDone });
  }

  /** Idle-time work (SlotDecoder.warmIdle), slot by slot: its solo step as the latest, then recent graphs. */
  async warmIdle(order?: readonly number[]): Promise<boolean> {
    const t = this.#lastSolo;
    for (const slot of order ?? Array.from({ length: this.nSlots }, (_, s) => s)) {
      if (t && !this.#solo.has(soloKey(slot, t))) {
        await this.#soloStep(slot, t.S, t.top, t.sampling);
        return true;
      }
      if (this.#b.spreadGraph([slot])) return true;
    }
    return false;
  }

  /** Saves `slot`'s state to a new snapshot; returns its id. */
  snapshot(slot: number): number {
    return this.#stage.snapshot(slot);
  }

  /** Restores snapshot `id` into `slot`. */
  restore(id: number, slot: number): void {
    this.#stage.restore(id, slot);
  }

  /** Frees snapshot `id`. */
  drop(id: number): void {
    this.#stage.states.drop(id);
  }

  /**
   * Generation on `items` (1..MAX_BATCH_SLOTS distinct slots; see the module doc). Each slot afterwards holds
   * its `base` tokens, its prompt and every generated token but the last (not yet fed).
   *
   * With `opts.pause` the call is a turn of a scheduler that changes the running set between calls: before
   * encoding each batch after the first it asks `pause()`, and on true encodes no more; it also stops once a
   * batch lands in which a sequence ended. The batches already submitted still land (no step is wasted) and
   * the call returns; a sequence that did not end comes back `paused` and continues in a later call with
   * `resume` (no prefill, its sampler stream unbroken), so its ids equal an uninterrupted run's.
   * @param opts `batch`: decode steps per readback (1..64; default a lone item's own, else 8)
   * @throws {RangeError} as Stage.run, when the stage is not a whole model, on a repeated slot, more than
   *   MAX_BATCH_SLOTS items, or several items on a model whose rows cannot be bound per slot (Stage.canBatch)
   */
  async generate(
    items: readonly BatchItem[],
    opts: { batch?: number; pause?: () => boolean } = {},
  ): Promise<GenerateResult[]> {
    const stage = this.#stage;
    if (!stage.first || !stage.last) {
      throw new RangeError(
        `Layers ${stage.layers.join(":")} are a partial stage: generation needs the whole model`,
      );
    }
    if (items.length < 1 || items.length > MAX_BATCH_SLOTS) {
      throw new RangeError(`A batched step takes 1..${MAX_BATCH_SLOTS} slots, got ${items.length}`);
    }
    if (items.length > 1 && !stage.canBatch) {
      throw new RangeError("This model's activation rows cannot be bound per slot: no batching");
    }
    const solo = items.length === 1;
    const slots = items.map((it) => it.slot);
    for (const s of slots) this.#b.slotCheck(s);
    if (new Set(slots).size !== slots.length) throw new RangeError(`Slots ${slots.join(",")} repeat`);
    const S = opts.batch ?? (solo ? items[0]!.opts.batch : undefined) ?? 8;
    if (!Number.isInteger(S) || S < 1 || S > 64) throw new RangeError(`Batch must be in 1..64, got ${S}`);
    const { device } = this.#b;
    const checked = items.map((it) => {
      const c = genCheck(it.opts);
      this.#b.inputCheck(it.slot, it.prompt, it.opts.base ?? 0);
      if (!it.opts.resume) snapCheck(it.opts.snapAt, it.opts.base ?? 0, it.prompt.length);
      if (it.opts.resume && (it.prompt.length !== 1 || !(it.opts.base! > 0))) {
        throw new RangeError(
          `Slot ${it.slot}: a resumed sequence continues at its base (> 0) with its last id as the whole prompt, ` +
            `got base ${it.opts.base} and ${it.prompt.length} prompt tokens`,
        );
      }
      return c;
    });
    const seqs: Seq[] = [];
    // The fresh items' prompts and first ids are queued first and read back together in one round (each
    // its last logits row and its sampler's id): a request's first id costs one readback, not one for its
    // logits and another for its draw.
    const fresh: { i: number; sel: Selector; tok: GPUBuffer; read: Promise<FirstRead>; snap?: number }[] = [];
    try {
      for (const [i, it] of items.entries()) {
        const { top, sampling } = checked[i]!;
        if (it.opts.resume) continue;
        // The first id goes to the buffer the slot's first step embeds: a lone slot's own decode graph's, or
        // the slot's id buffer, which its batched steps embed.
        const sel = solo
          ? await this.#soloStep(it.slot, S, top, sampling)
          : await this.#slotSelector(it.slot, -1, S, top, sampling);
        const tok = solo ? this.#b.tokens : this.#b.slotTok[it.slot]!;
        fresh.push({ i, sel, tok, ...await this.#prefillFirst(it, sel) });
      }
    } catch (e) {
      // The reads already queued are dropped with this call (their maps may still fail: not unhandled).
      for (const f of fresh) f.read.catch(() => {});
      this.#dropSnaps(fresh);
      throw e;
    }
    // From here the prompts' snapshots are this call's until its results hand them over.
    try {
      const firsts = await Promise.all(fresh.map((f) => f.read));
      this.#b.gpuCheck();
      for (const [i, it] of items.entries()) {
        const o = it.opts;
        const { top, sampling } = checked[i]!;
        const base = o.base ?? 0;
        if (o.resume) {
          seqs.push(await this.#resumed(it, S, top, sampling, solo));
          continue;
        }
        const f = fresh.find((x) => x.i === i)!;
        const { sel, tok } = f;
        const first = firsts[fresh.indexOf(f)]!;
        const start = base + it.prompt.length;
        const id = this.#firstId(first, sel);
        if (!sel.sampler) device.queue.writeBuffer(tok, 0, Uint32Array.of(id));
        o.onTokens?.([id]);
        const stops = new Set(o.stopIds ?? []);
        const nNew = Math.min(o.nNew, stage.nCtx - start + 1);
        const early = stops.has(id) ? "stop" : o.signal?.aborted ? "cancelled" : undefined;
        seqs.push({
          slot: it.slot,
          o,
          top,
          sampling,
          stops,
          start,
          skip: 0,
          steps: early ? 0 : nNew - 1,
          tokens: [id],
          tops: top > 0 ? [topCpu(first.logits, top)] : [],
          reason: early ?? (nNew < o.nNew ? "context" : "length"),
          ended: early !== undefined,
          sched: 0,
          ran: 0,
          snaps: [],
          spare: [],
          sel,
          tok,
        });
      }
      const maxTop = Math.max(...seqs.map((q) => q.top));
      const { ring, batchParams } = this.#readback(
        seqs.length * S * 4 * (1 + 2 * maxTop),
        S * seqs.length * 16,
      );
      this.#rewind ??= await RewindPoints.create(device, stage.states, this.#b.cache);
      let failed = true;
      try {
        const tLoop = performance.now();
        await this.#loop(seqs, S, ring, batchParams, opts.pause);
        trace("call", { items: seqs.length, fresh: fresh.length, loopMs: performance.now() - tLoop });
        const out: GenerateResult[] = [];
        for (const q of seqs) {
          // Kept tokens are fed up to all but the last; steps past that ran ahead: restore the snapshot at the
          // start of the batch holding the first unwanted step and re-feed the kept tokens after it.
          const fed = q.tokens.length - 1;
          if (q.ran > fed) {
            const snap = q.snaps.filter((x) => x.at <= fed).at(-1);
            assert(snap, `slot ${q.slot}: a snapshot before step ${fed}`);
            this.#b.setLength(q.slot, this.#rewind!.restore(snap.id, q.slot, q.start + q.ran));
            const refeed = q.tokens.slice(snap.at, fed);
            if (refeed.length > 0) {
              await stage.run(q.slot, { tokens: refeed }, q.start + snap.at, { rows: "last" });
            }
          }
          this.#b.setLength(q.slot, q.start + Math.min(fed, q.ran));
          const paused = !q.ended && q.ran < q.steps;
          const snapshot = fresh.find((f) => items[f.i]!.slot === q.slot)?.snap;
          out.push({
            tokens: q.tokens.slice(q.skip),
            top: q.tops,
            reason: q.reason,
            steps: q.ran,
            paused,
            snapshot,
          });
        }
        failed = false;
        return out;
      } finally {
        for (const id of seqs.flatMap((q) => [...q.snaps.map((x) => x.id), ...q.spare])) {
          this.#rewind?.drop(id);
        }
        // A call that failed may leave ring slots in flight: the next call gets fresh ones.
        if (failed) this.destroy();
      }
    } catch (e) {
      this.#dropSnaps(fresh);
      throw e;
    }
  }

  /**
   * The readback ring and the two per-batch params buffers of a call, kept across calls (a scheduler makes
   * one call per turn of a few steps) and replaced only when a call needs more bytes than they hold.
   */
  #readback(
    ringBytes: number,
    paramBytes: number,
  ): { ring: ReadbackRing; batchParams: readonly GPUBuffer[] } {
    const r = this.#rb;
    if (r && r.ring.slotBytes >= ringBytes && r.batchParams[0]!.size >= paramBytes) return r;
    this.destroy();
    const { device } = this.#b;
    const fresh = {
      ring: new ReadbackRing(device, { slots: 4, slotBytes: Math.max(ringBytes, r?.ring.slotBytes ?? 0) }),
      batchParams: [0, 1].map(() =>
        device.createBuffer({
          size: Math.max(paramBytes, r?.batchParams[0]?.size ?? 0),
          usage: GPUBufferUsage.COPY_SRC | GPUBufferUsage.COPY_DST,
        })
      ),
    };
    this.#rb = fresh;
    return fresh;
  }

  /** Releases the readback ring and params buffers the driver keeps (the stage's destroy calls it). */
  destroy(): void {
    this.#rb?.ring.destroy();
    for (const pb of this.#rb?.batchParams ?? []) pb.destroy();
    this.#rewind?.destroy();
    [this.#rb, this.#rewind] = [undefined, undefined];
  }

  /**
   * A resumed sequence (GenerateOptions.resume): its last id goes to the buffer the slot's first step embeds
   * and its sampler gets the request's settings, RNG step and penalty history, as a prefill's first id would.
   */
  async #resumed(it: BatchItem, S: number, top: number, sampling: boolean, solo: boolean): Promise<Seq> {
    const o = it.opts;
    const { device } = this.#b;
    const sel = solo
      ? await this.#soloStep(it.slot, S, top, sampling)
      : await this.#slotSelector(it.slot, -1, S, top, sampling);
    const tok = solo ? this.#b.tokens : this.#b.slotTok[it.slot]!;
    const id = it.prompt[0]!;
    device.queue.writeBuffer(tok, 0, Uint32Array.of(id));
    if (sel.sampler) samplerStart(this.#b, sel.sampler, o, it.prompt);
    const start = o.base!;
    const nNew = Math.min(o.nNew, this.#stage.nCtx - start);
    const cancelled = o.signal?.aborted === true;
    return {
      slot: it.slot,
      o,
      top,
      sampling,
      stops: new Set(o.stopIds ?? []),
      start,
      skip: 1,
      steps: cancelled ? 0 : nNew,
      tokens: [id],
      tops: [],
      reason: cancelled ? "cancelled" : nNew < o.nNew ? "context" : "length",
      ended: cancelled,
      sched: 0,
      ran: 0,
      snaps: [],
      spare: [],
      sel,
      tok,
    };
  }

  /**
   * The decode steps of `seqs` until each has ended, `S` steps per readback; with `pause`, until it returns
   * true before a batch is encoded or a sequence ends (see generate).
   */
  async #loop(
    seqs: Seq[],
    S: number,
    ring: ReadbackRing,
    batchParams: readonly GPUBuffer[],
    pause: (() => boolean) | undefined,
  ): Promise<void> {
    const { device } = this.#b;
    const [stage, rewind] = [this.#stage, this.#rewind!];
    let nBatch = 0;
    // A turn (pause given) ends at the first batch boundary where the scheduler has other work or a sequence
    // ended (it frees a slot and the request resolves); one that ended at its first id counts from the start.
    let stopping = pause !== undefined && seqs.some((q) => q.ended || q.steps === 0);
    type Batch = { cbs: GPUCommandBuffer[]; ringSlot: number; n: number; set: Seq[] };
    const encodeBatch = async (): Promise<Batch | undefined> => {
      const set = seqs.filter((q) => !q.ended && q.sched < q.steps);
      if (set.length === 0) return undefined;
      const n = Math.min(S, ...set.map((q) => q.steps - q.sched));
      // The set's graph: the batched one, or the slot's own decode step when one slot is left.
      let ops: readonly Op[];
      let pos: readonly { buffer: GPUBuffer; offset: number }[];
      const sels: Selector[] = [];
      const toks: GPUBuffer[] = [];
      if (set.length === 1) {
        const q = set[0]!;
        const dec = await this.#soloStep(q.slot, S, q.top, q.sampling);
        ops = dec.ops;
        pos = [{ buffer: this.#b.posParams[q.slot]!, offset: 0 }];
        sels.push(dec);
        toks.push(this.#b.tokens);
      } else {
        const g = await this.#b.batchGraph(set.map((q) => q.slot));
        const all: Op[] = [...g.ops];
        for (const [b, q] of set.entries()) {
          const sel = await this.#slotSelector(q.slot, b, S, q.top, q.sampling);
          all.push(...sel.stepOps);
          sels.push(sel);
          toks.push(this.#b.slotTok[q.slot]!);
        }
        ops = all;
        pos = set.map((_, b) => ({ buffer: g.table, offset: 4 * BATCH_TABLE_WORDS * b }));
      }
      await ring.whenFree(); // a mapped slot frees once unmapped, about 10 ms after its ids (mapRead)
      const cbs: GPUCommandBuffer[] = [];
      const enc0 = device.createCommandEncoder();
      for (const [b, q] of set.entries()) {
        // A slot that changed column (or went solo) carries its next id and sampler state over.
        const sel = sels[b]!;
        if (sel !== q.sel) {
          if (toks[b] !== q.tok) enc0.copyBufferToBuffer(q.tok, 0, toks[b]!, 0, 4);
          if (q.sampling) {
            const from = q.sel.sampler!;
            enc0.copyBufferToBuffer(from.state, 0, sel.sampler!.state, 0, from.state.size);
            enc0.copyBufferToBuffer(from.params, 0, sel.sampler!.params, 0, from.params.size);
          }
          q.sel = sel;
          q.tok = toks[b]!;
        }
        if (q.stops.size > 0 || q.o.signal) { // a rewind point (engine/exec/_rewind.ts)
          q.snaps.push({ at: q.sched, id: rewind.take(enc0, q.slot, q.start + q.sched, q.spare.pop()) });
        }
      }
      rewind.encode(enc0);
      cbs.push(enc0.finish());
      const words = new Uint32Array(S * set.length * 4);
      for (let j = 0; j < n; j++) {
        for (const [b, q] of set.entries()) {
          words.set([q.start + q.sched + j, 1, j, 0], (j * set.length + b) * 4);
        }
      }
      const pb = batchParams[nBatch++ % 2]!;
      device.queue.writeBuffer(pb, 0, words);
      let ringSlot = -1;
      for (let j = 0; j < n; j++) {
        const enc = device.createCommandEncoder();
        for (const [b, q] of set.entries()) {
          const at = (j * set.length + b) * 16;
          enc.copyBufferToBuffer(pb, at, pos[b]!.buffer, pos[b]!.offset, 8);
          enc.copyBufferToBuffer(pb, at + 8, q.sel.argmaxParams, 0, 4);
        }
        const pass = enc.beginComputePass();
        encodeOps(pass, ops);
        pass.end();
        for (const q of set) {
          if (q.top > 0) enc.copyBufferToBuffer(q.sel.topResult, 0, q.sel.topBatch, j * 8 * q.top, 8 * q.top);
        }
        if (j === n - 1) {
          const copies = set.map((q) => ({ src: q.sel.idRing, srcOffsetBytes: 0, sizeBytes: 4 * S }));
          for (const q of set) {
            if (q.top > 0) copies.push({ src: q.sel.topBatch, srcOffsetBytes: 0, sizeBytes: 8 * q.top * S });
          }
          ringSlot = ring.record(enc, copies) ?? -1;
          assert(ringSlot >= 0, "a readback slot is free for each batch");
        }
        cbs.push(enc.finish());
      }
      for (const q of set) q.sched += n;
      return { cbs, ringSlot, n, set };
    };
    let cur = await encodeBatch();
    if (cur) device.queue.submit(cur.cbs);
    while (cur) {
      if (pause && !stopping && pause()) stopping = true;
      const t0 = performance.now();
      const next = stopping ? undefined : await encodeBatch();
      // mapAsync blocks until the queue is idle: the next batch is encoded already and goes in right after.
      const t1 = performance.now();
      const landed = ring.map(cur.ringSlot);
      if (next) device.queue.submit(next.cbs);
      const bytes = await landed;
      trace("batch", { slots: cur.set.length, n: cur.n, encMs: t1 - t0, mapMs: performance.now() - t1 });
      this.#b.gpuCheck();
      const u32 = new Uint32Array(bytes.buffer, bytes.byteOffset, bytes.byteLength / 4);
      let pairsAt = cur.set.length * S;
      for (const [b, q] of cur.set.entries()) {
        q.ran += cur.n;
        const pairs = q.top > 0 ? u32.subarray(pairsAt, pairsAt + 2 * q.top * S) : undefined;
        if (q.top > 0) pairsAt += 2 * q.top * S;
        if (q.ended) continue; // ran ahead of a stop found in the previous batch
        const fresh: number[] = [];
        for (let j = 0; j < cur.n && !q.ended; j++) {
          const id = u32[b * S + j]!;
          // argmax writes NONFINITE for a row with NaN/±Inf, the sampler NONE when no logit is usable.
          if (id >= stage.hp.nVocab) {
            throw nonFinite(
              `decode step ${q.tokens.length} of slot ${q.slot}${
                q.sampling ? " (the sampler found no id)" : ""
              }`,
            );
          }
          q.tokens.push(id);
          fresh.push(id);
          if (pairs) q.tops.push(pairsToTop(pairs, j, q.top));
          if (q.stops.has(id)) {
            q.ended = true;
            q.reason = "stop";
          }
        }
        if (fresh.length > 0) q.o.onTokens?.(fresh);
        if (!q.ended && q.o.signal?.aborted && q.tokens.length < q.steps + 1) {
          q.ended = true;
          q.reason = "cancelled";
        }
        // A rewind restores the latest snapshot at or before the last fed step: the older ones take the next
        // batches' copies in their buffers (not one new set of GPU buffers per batch).
        const fed = q.tokens.length - 1;
        const keep = q.snaps.findLastIndex((x) => x.at <= fed);
        for (const x of q.snaps.splice(0, Math.max(0, keep))) q.spare.push(x.id);
        if (pause && (q.ended || q.ran >= q.steps)) stopping = true;
      }
      cur = next;
    }
  }

  /**
   * Queues `it`'s prompt on its slot (all chunks but the last without a readback) and, in the last chunk's
   * submission, the copy of its last logits row and, with a sampler, the draw of `sel` (which first gets the
   * request's settings, a fresh RNG step and penalty history, and writes the id to its next-token buffer
   * itself) with the id's copy. Resolves once queued, to `read`: both once mapped (`#firstId` reads them),
   * and with `snapAt` the snapshot's id (in the last chunk's pass, cut there, or in the chunks before it).
   */
  async #prefillFirst(it: BatchItem, sel: Selector): Promise<{ read: Promise<FirstRead>; snap?: number }> {
    const stage = this.#stage;
    const { slot, prompt } = it;
    const base = it.opts.base ?? 0;
    const snapAt = it.opts.snapAt;
    const last = chunkSteps(prompt.length, stage.maxChunk, snapAt === undefined ? undefined : snapAt - base)
      .at(-1)!;
    const lastAt = last.at;
    const onPrefill = it.opts.onPrefill;
    // A snapshot point before the last chunk: in the chunks before it (cut inside one, or after one).
    const early = snapAt !== undefined && snapAt - base <= lastAt ? snapAt : undefined;
    let snap: number | undefined;
    if (lastAt > 0 && (onPrefill || early !== undefined)) {
      this.#parts ??= new PieceParts(stage, this.#b);
      snap = await this.#parts.queue(slot, prompt.slice(0, lastAt), base, {
        snapAt: early,
        idle: onPrefill ? blockUntilIdle : () => {},
        onDone: onPrefill && ((n) => onPrefill(n, prompt.length)),
      });
    } else if (lastAt > 0) await stage.run(slot, { tokens: prompt.slice(0, lastAt) }, base, { rows: "none" });
    try {
      const first = await this.#firstChunk(it, sel, last, onPrefill);
      return { read: first.read, snap: snap ?? first.snap };
    } catch (e) {
      if (snap !== undefined) stage.states.drop(snap);
      throw e;
    }
  }

  /** #prefillFirst's last chunk `last` (of `it.prompt`) with its readback, and its cut's snapshot. */
  async #firstChunk(
    it: BatchItem,
    sel: Selector,
    last: ChunkStep,
    onPrefill: GenerateOptions["onPrefill"],
  ): Promise<{ read: Promise<FirstRead>; snap?: number }> {
    const stage = this.#stage;
    const { device } = this.#b;
    const { slot, prompt } = it;
    const lastAt = last.at;
    const at = (it.opts.base ?? 0) + lastAt;
    const n = prompt.length - lastAt;
    if (sel.sampler) samplerStart(this.#b, sel.sampler, it.opts, prompt);
    writeChunkPos(device.queue, this.#b.posParams[slot]!, slot, at, n, last.cut);
    device.queue.writeBuffer(this.#b.tokens, 0, Uint32Array.from(prompt.slice(lastAt)));
    const enc0 = device.createCommandEncoder();
    if (at === 0) stage.states.reset(enc0, slot);
    // Nothing of the prompt runs before it: a graph built fresh goes to the GPU layer by layer as it is built.
    const stream = lastAt === 0 ? new OpStream(device, enc0) : undefined;
    const t0 = performance.now();
    const graph = await this.#b.graph(slot, n, "last", undefined, stream?.onLayer);
    const firstPartMs = stream?.firstAt === undefined ? undefined : stream.firstAt - t0;
    trace("first-chunk", {
      slot,
      n,
      graphMs: performance.now() - t0,
      parts: stream?.parts ?? 0,
      firstPartMs,
    });
    const { enc, ops } = stream?.rest(graph) ?? { enc: enc0, ops: graph };
    // The chunk's pass, then the draw's (a pass of its own, as the selector's first dispatches always ran).
    for (const list of sel.sampler ? [ops, sel.firstOps] : [ops]) {
      const pass = enc.beginComputePass();
      encodeOps(pass, list);
      pass.end();
    }
    // The cut's snapshot: the states' taps and the KV rows below it (the chunk's pass wrote both).
    const snap = last.cut > 0 ? stage.states.snapshot(enc, slot, at + last.cut, false, true) : undefined;
    const V = stage.hp.nVocab;
    // The logits row, then the sampler's id at byte 4V.
    const read = this.#b.stagings.take(4 * V + 4);
    enc.copyBufferToBuffer(this.#b.logits!, 0, read, 0, 4 * V);
    if (sel.sampler) enc.copyBufferToBuffer(sel.idRing, 0, read, 4 * V, 4);
    try {
      const cb = enc.finish();
      if (lastAt > 0 && onPrefill) {
        blockUntilIdle(device); // the chunks before the last have finished (see #queueChunks)
        onPrefill(lastAt, prompt.length);
      }
      device.queue.submit([cb]);
    } catch (e) {
      if (snap !== undefined) stage.states.drop(snap);
      throw e;
    }
    this.#b.setLength(slot, at + n);
    const mapped = this.#b.stagings.read(read).then((bytes) => ({
      logits: new Float32Array(bytes, 0, V),
      id: new Uint32Array(bytes, 4 * V, 1)[0]!,
    }));
    return { read: mapped, snap };
  }

  /** Drops the prompts' snapshots of a call that failed (no result hands them over). */
  #dropSnaps(fresh: readonly { snap?: number }[]): void {
    for (const f of fresh) if (f.snap !== undefined) this.#stage.states.drop(f.snap);
  }

  /**
   * The first id after a prefill whose last logits and sampler draw are `first`: the argmax on the CPU, or
   * the draw of `sel`'s sampler (which wrote the id to its next-token buffer itself).
   */
  #firstId(first: FirstRead, sel: Selector): number {
    const bad = first.logits.findIndex((v) => !Number.isFinite(v));
    if (bad >= 0) throw nonFinite(`the prompt's last position (logit ${bad} is ${first.logits[bad]})`);
    if (!sel.sampler) return argmaxCpu(first.logits);
    if (first.id >= this.#stage.hp.nVocab) {
      throw nonFinite("the prompt's last position (the sampler found no id)");
    }
    return first.id;
  }

  /** A lone slot's decode step: its solo graph and a selector writing the graph's token buffer (cached). */
  async #soloStep(slot: number, S: number, top: number, sampling: boolean): Promise<SoloStep> {
    const l = this.#lastSolo; // replaced only when the settings change: no object per batch
    if (l?.S !== S || l.top !== top || l.sampling !== sampling) this.#lastSolo = { S, top, sampling };
    const key = soloKey(slot, this.#lastSolo!);
    const hit = this.#solo.get(key);
    if (hit) return hit;
    const graph = await this.#b.graph(slot, 1, "last");
    const sel = await buildSelector(this.#b, this.#stage.hp.nVocab, {
      row: 0,
      nextToken: this.#b.tokens,
      S,
      top,
      sampling,
    });
    const step: SoloStep = { ...sel, ops: [...graph, ...sel.stepOps] };
    this.#solo.set(key, step);
    return step;
  }

  /**
   * Selector of `slot` in a batched step at column `col` (-1: the prefill's first id only), writing the
   * slot's id buffer. Cached: a slot's selector per column keeps its buffers across calls.
   */
  async #slotSelector(
    slot: number,
    col: number,
    S: number,
    top: number,
    sampling: boolean,
  ): Promise<Selector> {
    const key = `${slot}/${col}/${S}/${top}/${sampling}`;
    const hit = this.#selectors.get(key);
    if (hit) return hit;
    const sel = await buildSelector(this.#b, this.#stage.hp.nVocab, {
      row: Math.max(0, col),
      nextToken: this.#b.slotTok[slot]!,
      S,
      top,
      sampling,
    });
    this.#selectors.set(key, sel);
    return sel;
  }
}

/**
 * Returns once the work submitted to `device`'s queue has finished: Deno's `onSubmittedWorkDone()` call
 * blocks until then (see DecodeDriver #queueChunks); its promise, resolved after a 10 ms timer, is dropped.
 */
function blockUntilIdle(device: GPUDevice): void {
  device.queue.onSubmittedWorkDone().catch(() => {});
}

/** The error for non-finite logits at `where`. */
function nonFinite(where: string): NumericsError {
  return new NumericsError(
    `The model produced non-finite logits (NaN or Inf) at ${where}: its weights or numerics are broken, not ` +
      `the request. Check the file with \`inspect --check\` (it scans float tensors and block scales).`,
  );
}

/** Checks the options every generation shares; returns the top-k count and whether the sampler runs. */
function genCheck(opts: GenerateOptions): { top: number; sampling: boolean } {
  const top = opts.top ?? 0;
  if (!Number.isInteger(opts.nNew) || opts.nNew < 1) {
    throw new RangeError(`--n must be >= 1, got ${opts.nNew}`);
  }
  if (!Number.isInteger(top) || top < 0 || top > 64) {
    throw new RangeError(`--top must be in 0..64, got ${top}`);
  }
  // Plain greedy (no penalties) takes the argmax path; anything else runs the sampler, penalties included.
  const p = opts.sampling;
  const sampling = p !== undefined &&
    !(isGreedy(p) && p.repeatPenalty === 1 && p.presencePenalty === 0 && p.frequencyPenalty === 0);
  return { top, sampling };
}
