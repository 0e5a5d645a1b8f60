/**
 * The split's pipelined multi-slot driver (#19): `SplitDecoder.generate` of several items. The sequences are
 * dealt into `groups` slot groups (default 2) that step independently: a group's step runs its slots' fed
 * ids through the head's layers as one batched step (`Stage.runBatch`, one readback), sends the hidden rows
 * as one RUN_BATCH frame (each stage runs them as one batched step, the last draws one id per slot with its
 * request's settings) and waits for the ids, while the other group's step uses the head's GPU. So each stage
 * works on one group while the stage before it works on the next, and each hop's readback floor (~10 ms,
 * docs/PLATFORM.md) is paid once per group step, not once per slot.
 *
 * Exact: each slot's row is the bits of its one-token run on every stage (tests/split_batch_test.ts), and the
 * last stage draws it at the request's RNG step with its penalty history, as the one-slot driver does. A
 * sequence's first frame (its prompt rest, or a slot whose remote state must be replayed after a chain
 * restart) runs alone through the decoder's own frame path, the alone frames of a step side by side (the
 * head's GPU lock covers each one's head part); no drafts here (a batched row is one token).
 * Stops, cancels and the scheduler's `pause` are checked after each step of a group; with `pause` given, the
 * call ends once a sequence ended or `pause()` is true, each group after the frame it has in flight, and
 * the others come back `paused` (holding every returned id but the last, which a `resume` call feeds).
 *
 * Phases (the head stage's profile, `LLM_STAGE_PROFILE=1`): per batched group step `pipe.lock` (waiting for
 * the head's GPU), `pipe.head` (the head's batched step to its rows), `pipe.chain` (the RUN_BATCH round trip),
 * `pipe.take` (stops, budgets and each lane's onTokens), per step with lanes running alone (their first
 * frame: a prompt rest) `pipe.alone` (those frames, overlapped), and per step of a group `pipe.step` (all of
 * it) and `pipe.between` (from a step's end to the group's next step: the pause check and the lanes' filter).
 * @module
 */
import { isGreedy, SAMPLE_HIST, type SamplingParams } from "../sampling.ts";
import type { BatchItem, GenerateResult } from "./slot_decoder.ts";
import {
  type FeedExtra,
  type NextResult,
  type NextSampling,
  type NextStage,
  type SplitStage,
  StaleChainError,
} from "./_split_api.ts";

/** Most pipeline groups (a group of one slot each at 8 slots). */
export const MAX_GROUPS = 8;

/** What the driver uses of its `SplitDecoder`. */
export interface PipeParts {
  readonly stage: SplitStage;
  readonly next: NextStage;
  readonly groups: number;
  /** Per slot: the tokens it holds as far as the head knows (updated here). */
  readonly held: number[][];
  /** Per slot: the chain connection its remote state lives on (undefined: replay before use). */
  readonly epoch: (number | undefined)[];
  /** Runs head GPU work after the head's earlier GPU calls. */
  gpu<T>(f: () => Promise<T>): Promise<T>;
  /** The decoder's own frame of `tokens` at `base` (replays a stale slot first), as one head GPU call. */
  feed(slot: number, tokens: readonly number[], base: number, x: FeedExtra): Promise<NextResult>;
  /** Forgets a slot's drafted-run rollback point. */
  dropAnchor(slot: number): void;
}

/** One sequence of the call. */
interface Lane {
  readonly it: BatchItem;
  readonly sampler: SamplingParams | undefined;
  readonly top: number;
  readonly nNew: number;
  readonly stops: ReadonlySet<number>;
  readonly step0: number;
  readonly history: number[];
  readonly tokens: number[];
  readonly tops: [number, number][][];
  reason: GenerateResult["reason"];
  /** Ids to feed next at `pos` (the prompt rest first, then the last id). */
  feed: readonly number[];
  pos: number;
  ended: boolean;
  paused: boolean;
}

/**
 * Generation on several items in pipeline groups; see the module doc.
 * @throws {RangeError} on a bad nNew, as Stage.run
 * @throws the chain's error when a stage fails or the link drops (after every group's frame in flight landed)
 */
export async function generateMany(
  p: PipeParts,
  items: readonly BatchItem[],
  pause: (() => boolean) | undefined,
): Promise<GenerateResult[]> {
  const lanes = items.map((it) => lane(p, it));
  const G = Math.min(p.groups, lanes.length);
  const groups = Array.from({ length: G }, (_, g) => lanes.filter((_, i) => i % G === g));
  let stopping = false;
  let failed = false;
  const run = async (group: Lane[]) => {
    try {
      // Every group makes one step before the call can end (as the decode driver's first batch).
      let ended = 0;
      for (let first = true;; first = false) {
        if (!first) p.stage.profile?.add("pipe.between", performance.now() - ended);
        const live = group.filter((l) => !l.ended);
        if (live.length === 0) return;
        if (!first && !stopping && pause?.()) stopping = true;
        if ((stopping && !first) || failed) {
          for (const l of live) l.paused = l.ended = true;
          return;
        }
        const t = performance.now();
        await step(p, live);
        ended = performance.now();
        p.stage.profile?.add("pipe.step", ended - t);
        if (pause && group.some((l) => l.ended && !l.paused)) stopping = true;
      }
    } catch (e) {
      failed = true;
      throw e;
    }
  };
  const settled = await Promise.allSettled(groups.map(run));
  const bad = settled.find((s): s is PromiseRejectedResult => s.status === "rejected");
  if (bad) throw bad.reason;
  return lanes.map((l) => ({
    tokens: l.tokens,
    top: l.tops,
    reason: l.reason,
    steps: Math.max(0, l.tokens.length - 1),
    ...(l.paused ? { paused: true } : {}),
  }));
}

function lane(p: PipeParts, it: BatchItem): Lane {
  const o = it.opts;
  const s = o.sampling;
  // Plain greedy (no penalties) is the argmax; anything else the sampler, as the decode driver decides.
  const sampler = s && !(isGreedy(s) && s.repeatPenalty === 1 && s.presencePenalty === 0 &&
      s.frequencyPenalty === 0)
    ? s
    : undefined;
  if (!Number.isInteger(o.nNew) || o.nNew < 1) throw new RangeError(`nNew must be >= 1, got ${o.nNew}`);
  if (it.prompt.length < 1) throw new RangeError(`Slot ${it.slot}: a generation feeds at least one id`);
  const base = o.base ?? 0;
  const nNew = Math.min(o.nNew, p.stage.nCtx - base - it.prompt.length + 1);
  return {
    it,
    sampler,
    top: o.top ?? 0,
    nNew,
    stops: new Set(o.stopIds ?? []),
    step0: o.samplerStep ?? 0,
    history: [...(o.samplerHistory ?? it.prompt)].slice(-SAMPLE_HIST),
    tokens: [],
    tops: [],
    reason: nNew < o.nNew ? "context" : "length",
    feed: it.prompt,
    pos: base,
    ended: false,
    paused: false,
  };
}

/** The sampling a lane's next frame carries (its RNG step: the ids it drew so far). */
function samplingOf(l: Lane): NextSampling | undefined {
  return l.sampler && { params: l.sampler, step: l.step0 + l.tokens.length, history: [...l.history] };
}

/**
 * One step of a group's live lanes: a lane with a prompt rest (or stale remote state) runs its frame alone;
 * the others, on one chain connection, run one batched head step and one batched frame.
 */
async function step(p: PipeParts, live: Lane[]): Promise<void> {
  const { stage, next } = p;
  const epochs = live.map((l) => p.epoch[l.it.slot]).filter((e): e is number => e !== undefined);
  const epoch = epochs.length > 0 ? Math.max(...epochs) : undefined;
  const batched = live.filter((l) =>
    l.feed.length === 1 && l.pos > 0 && p.epoch[l.it.slot] === epoch && epoch !== undefined &&
    stage.length(l.it.slot) === l.pos
  );
  // The lanes running alone go in together: a frame's head part holds the head's GPU, so one lane's head
  // step runs while the frame before it crosses the chain (a burst of new requests: one round trip each,
  // overlapped, not one after the other). Each lane takes its id as its frame lands; the first failure is
  // thrown once every frame has settled.
  const alone = live.filter((l) => !batched.includes(l));
  if (alone.length > 0) {
    const t = performance.now();
    const settled = await Promise.allSettled(alone.map(async (l) => {
      const x = { want: "ids" as const, topK: l.top, ...(l.sampler ? { sampling: samplingOf(l)! } : {}) };
      take(l, await p.feed(l.it.slot, l.feed, l.pos, x));
    }));
    stage.profile?.add("pipe.alone", performance.now() - t);
    const bad = settled.find((r): r is PromiseRejectedResult => r.status === "rejected");
    if (bad) throw bad.reason;
  }
  if (batched.length === 0) return;
  const slots = batched.map((l) => l.it.slot);
  const t0 = performance.now();
  const prof = stage.profile;
  // The head's lock covers the submission only: another group's step submits while this readback waits.
  const pending = await p.gpu(async (): Promise<{ output: Promise<Float32Array> }> => {
    prof?.add("pipe.lock", performance.now() - t0);
    for (const s of slots) p.dropAnchor(s);
    const tokens = { tokens: batched.map((l) => l.feed[0]!) };
    if (slots.length >= 2 && stage.canBatch && stage.submitBatch) {
      const output = (await stage.submitBatch(slots, tokens)).output.then((o) => o.data);
      output.catch(() => {/* awaited below */});
      return { output };
    }
    if (slots.length >= 2 && stage.canBatch && stage.runBatch) {
      return { output: Promise.resolve((await stage.runBatch(slots, tokens)).data) };
    }
    const outs: Float32Array[] = [];
    for (const l of batched) {
      outs.push((await stage.run(l.it.slot, { tokens: [...l.feed] }, l.pos, { rows: "all" })).data);
    }
    const all = new Float32Array(outs.reduce((n, o) => n + o.length, 0));
    outs.forEach((o, b) => all.set(o, b * o.length));
    return { output: Promise.resolve(all) };
  });
  const rows = await pending.output;
  const tRows = performance.now();
  prof?.add("pipe.head", tRows - t0);
  const headUs = Math.round((tRows - t0) * 1000);
  for (const l of batched) p.held[l.it.slot] = [...p.held[l.it.slot]!.slice(0, l.pos), l.feed[0]!];
  const nEmbd = rows.length / batched.length;
  const topK = Math.max(...batched.map((l) => l.top));
  let results: NextResult[];
  try {
    if (batched.length >= 2 && next.runBatch) {
      const r = await next.runBatch({
        entries: batched.map((l) => {
          const sampling = samplingOf(l);
          return { slot: l.it.slot, basePos: l.pos, ...(sampling ? { sampling } : {}) };
        }),
        rows,
        topK,
        epoch: epoch!,
        headUs,
      });
      results = batched.map((_, b) => ({
        epoch: r.epoch,
        ids: r.ids.subarray(b, b + 1),
        topIds: r.topIds.subarray(b * topK, (b + 1) * topK),
        topLogits: r.topLogits.subarray(b * topK, (b + 1) * topK),
        timesUs: r.timesUs,
      }));
    } else {
      results = await Promise.all(batched.map((l, b) => {
        const sampling = samplingOf(l);
        return next.run({
          slot: l.it.slot,
          basePos: l.pos,
          rows: rows.slice(b * nEmbd, (b + 1) * nEmbd),
          want: "ids",
          topK: l.top,
          epoch,
          ...(sampling ? { sampling } : {}),
          ...(b === 0 ? { headUs } : {}),
        });
      }));
    }
  } catch (e) {
    prof?.add("pipe.chain", performance.now() - tRows);
    for (const s of slots) p.epoch[s] = undefined;
    if (!(e instanceof StaleChainError)) throw e;
    // The chain restarted: each slot replays its tokens on the head and the chain, then runs its id alone.
    for (const l of batched) {
      const x = { want: "ids" as const, topK: l.top, ...(l.sampler ? { sampling: samplingOf(l)! } : {}) };
      take(l, await p.feed(l.it.slot, l.feed, l.pos, x));
    }
    return;
  }
  const tChain = performance.now();
  prof?.add("pipe.chain", tChain - tRows);
  for (const [b, l] of batched.entries()) {
    p.epoch[l.it.slot] = results[b]!.epoch;
    take(l, results[b]!);
  }
  prof?.add("pipe.take", performance.now() - tChain);
}

/**
 * A lane's id from its frame's result (top-k pairs: the first `l.top` of the frame's, which may carry more
 * for another lane of the frame): stops, the budget and a cancel end it; else its id is fed next.
 */
function take(l: Lane, r: NextResult): void {
  if (r.ids.length !== 1) {
    throw new Error(
      `Internal error: the chain answered ${r.ids.length} ids for one fed row of slot ${l.it.slot}`,
    );
  }
  const id = r.ids[0]!;
  const o = l.it.opts;
  l.pos += l.feed.length;
  l.feed = [id];
  l.tokens.push(id);
  l.history.push(id);
  if (l.history.length > SAMPLE_HIST) l.history.splice(0, l.history.length - SAMPLE_HIST);
  if (l.top > 0) {
    const k = r.topIds.length;
    l.tops.push(Array.from({ length: l.top }, (_, i) => [r.topIds[i]!, r.topLogits[i]!] as [number, number]));
    if (k < l.top) throw new Error(`Internal error: ${k} top-k pairs for ${l.top} wanted`);
  }
  if (l.stops.has(id)) {
    l.reason = "stop";
    l.ended = true;
  } else if (l.tokens.length >= l.nNew) l.ended = true;
  o.onTokens?.([id]);
  if (!l.ended && o.signal?.aborted) {
    l.reason = "cancelled";
    l.ended = true;
  }
}
