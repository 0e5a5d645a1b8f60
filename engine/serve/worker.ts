/**
 * The engine service's Worker: owns the GPU device, the GGUF file and the {@linkcode Stage}, and runs the
 * requests the main thread (`engine/serve/service.ts`) admits through a {@linkcode SlotRunner} (continuous
 * batching, one GPU call at a time). A blocking `mapAsync` here never stalls the main thread's event loop.
 * Messages: `_protocol.ts`; each readback's ids are posted as they land.
 * @module
 */
import { acquireGpu } from "../gpu/device.ts";
import { type GgufFile, openGguf } from "../gguf.ts";
import { KEYS } from "../names.ts";
import { Stage } from "../exec/stage.ts";
import { printProfileOnSignal } from "../exec/_profile.ts";
import { planModel, synthesize } from "../synth.ts";
import { samplingParams } from "../sampling.ts";
import { SlotRunner } from "./_runner.ts";
import { decodeError, encodeError, type FromWorker, type NextCall, type ToWorker } from "./_protocol.ts";
import type { SlotDecoder } from "../exec/slot_decoder.ts";
import { type NextResult, type NextStage, SplitDecoder, stageInfo, StaleChainError } from "../exec/split.ts";
import { DraftCache } from "../exec/draft_cache.ts";
import { DraftingDecoder } from "../exec/drafting.ts";
import { buildWidthClasses } from "../exec/_widths.ts";
import { MATVEC_MAX_COLS } from "../graph/builder.ts";
import { MAX_BATCH_SLOTS } from "../exec/activations.ts";
import { PipelineCache } from "../../wgsl/kernel.ts";
import { readStats } from "../gpu/readback.ts";
import { trace } from "../exec/_trace.ts";

interface WorkerScope {
  postMessage(message: FromWorker): void;
  onmessage: ((e: MessageEvent<ToWorker>) => void) | null;
}

const scope = globalThis as unknown as WorkerScope;
const post = (m: FromWorker) => scope.postMessage(m);

type Job = Extract<ToWorker, { type: "generate" }>;

let runner: SlotRunner | undefined;
let stage: Stage | undefined;
/** GPU pipelines the stage's device has compiled (its PipelineCache). */
let pipelines = () => 0;
let file: GgufFile | undefined;
let tempDir: string | undefined;
const jobs: Job[] = [];
/** Calls of the split decoder waiting for the main thread's chain, by call number. */
const nextCalls = new Map<number, { resolve: (v: unknown) => void; reject: (e: unknown) => void }>();
let nextCall = 1;

/** The chain behind a split head, reached through the main thread (which holds the link: EngineOptions.next). */
function callNext<T>(request: NextCall): Promise<T> {
  const call = nextCall++;
  return new Promise<T>((resolve, reject) => {
    nextCalls.set(call, { resolve: resolve as (v: unknown) => void, reject });
    post({ type: "next", call, request });
  });
}

const nextStage: NextStage = {
  run: (req) => callNext<NextResult>({ op: "run", req }),
  runBatch: (req) => callNext<NextResult>({ op: "runBatch", req }),
  snapshot: (slot, epoch) => callNext<number>({ op: "snapshot", slot, epoch }),
  restore: (id, slot, epoch) => callNext<void>({ op: "restore", id, slot, epoch }),
  drop: (id, epoch) => callNext<void>({ op: "drop", id, epoch }),
};
/** The abort controller of every job not yet ended (queued here or in the runner), by id. */
const aborts = new Map<number, AbortController>();

/** The default model: the tiny synthetic qwen35moe (q8_0), written into a temporary folder. */
async function synthDefault(): Promise<string> {
  tempDir = await Deno.makeTempDir({ prefix: "llm_engine_" });
  const out = `${tempDir}/tiny-qwen35moe.q8_0.gguf`;
  await synthesize(planModel({ arch: "qwen35moe", preset: "tiny", quant: "q8_0", seed: 1 }), { out });
  post({
    type: "log",
    line: `No model given: serving the embedded default, a tiny synthetic qwen35moe (q8_0) at ${out}`,
  });
  return out;
}

async function init(m: Extract<ToWorker, { type: "init" }>): Promise<void> {
  try {
    const path = m.model ?? await synthDefault();
    file = await openGguf(path);
    const meta = file.metadata;
    const arch = meta.getString(KEYS.architecture);
    const model = meta.getString(KEYS.name, path.split("/").at(-1)!.replace(/\.gguf$/, ""));
    post({ type: "meta", path, model, arch });
    const gpu = await acquireGpu();
    post({ type: "log", line: `GPU: ${gpu.summary}` });
    const cache = PipelineCache.shared(gpu.device, { f16: gpu.f16 });
    pipelines = () => cache.size;
    stage = await Stage.load(gpu, file, {
      nCtx: m.nCtx,
      nSlots: m.nSlots,
      maxChunk: m.maxChunk,
      int8Activations: m.int8Activations,
      int8Experts: m.int8Experts,
      kvF16: m.kvF16,
      layers: m.split?.layers,
      onLog: (line) => post({ type: "log", line }),
      onProgress: (p) => post({ type: "progress", loadedBytes: p.doneBytes, totalBytes: p.totalBytes }),
    });
    printProfileOnSignal(`head ${stage.layers[0]}:${stage.layers[1]}`, stage.profile);
    let decoder: SlotDecoder = stage.decoder;
    if (m.split) {
      if (!stage.first || stage.last) {
        throw new RangeError(
          `--layers ${
            m.split.layers.join(":")
          } of ${path}: a split head runs layers 0:a with a < ${stage.hp.nLayer}`,
        );
      }
      decoder = new SplitDecoder(stage, nextStage, {
        ...(m.split.groups !== undefined ? { groups: m.split.groups } : {}),
        ...(m.split.draftCache ? { draftCache: new DraftCache(m.split.draftCache) } : {}),
        onDrafts: (d) =>
          post({ type: "drafts", frames: d.frames, proposed: d.proposed, accepted: d.accepted }),
      });
      post({ type: "stage", info: stageInfo(stage, arch) });
    } else if (!stage.first || !stage.last) {
      throw new RangeError(`${path}: the service needs the whole model`);
    } else if (m.draft) {
      decoder = new DraftingDecoder(decoder, stage, {
        draft: m.draft.k,
        ...(m.draft.min !== undefined ? { minDraft: m.draft.min } : {}),
        ...(m.draft.cache ? { draftCache: new DraftCache(m.draft.cache) } : {}),
        onDrafts: (d) =>
          post({ type: "drafts", frames: d.frames, proposed: d.proposed, accepted: d.accepted }),
      });
    }
    if (m.warmUp) await warmUp(stage, decoder, m);
    else {post({
        type: "log",
        line: "Warm-up skipped: the first requests of each shape compile their GPU pipelines",
      });}
    runner = new SlotRunner(decoder, {
      batch: m.batch,
      pieceSteps: m.pieceSteps,
      turnTokens: m.turnTokens,
      snapshotBack: m.snapshotBack,
      prefillTurn: m.prefillTurn,
      pieceGap: m.pieceGap,
      pieceParts: m.pieceParts,
      prefillAlone: m.prefillAlone,
      batchMin: m.batchMin,
    });
    post({
      type: "log",
      line: `Loaded ${model} (${arch}, ${(stage.weightBytes / 2 ** 20).toFixed(1)} MiB of weights, ` +
        `${m.nSlots} slots of ${m.nCtx} positions, ${
          (stage.states.totalBytes / 2 ** 20).toFixed(1)
        } MiB of state; x ${
          stage.int8Activations
            ? "int8 in the"
            : stage.int8Experts
            ? "int8 in the expert and f32 in the other"
            : "f32 in the"
        } decode mat-vecs)`,
    });
    post({ type: "ready", nVocab: stage.hp.nVocab, pipelines: pipelines() });
    pump();
  } catch (e) {
    post({ type: "failed", error: encodeError(e) });
  }
}

/**
 * Prompt tokens of the warm-up: a piece of more than 8 (prefill's chunked DeltaNet path, as a chat prompt's
 * first piece up to the prompt-boundary snapshot) and a rest of at most 8 (the per-token path, as the
 * snapshot's last tokens); a decoder that snapshots inside a prefill runs both as one chunk cut between them.
 */
const WARM_UP_PIECE = 16;
const WARM_UP_REST = 4;

/**
 * Builds the GPU pipelines a first request would otherwise wait for (compiling them is most of a cold first
 * request: 5 s against 0.8 s after on lavapipe with the tiny model, 20 s under load). It runs what a chat
 * request runs: a prompt piece, a snapshot, the prompt's rest and two greedy ids on slot 0 (argmax; where the
 * decoder snapshots inside a prefill, also the whole prompt in one call and a piece to its last token), then,
 * when the stage batches, a batched step of slots 0 and 1 with one of them sampled (the sampler) and one of
 * each slot count from 9 to nSlots (steps wider than a chunk's 8 columns have mat-vec variants of their own;
 * narrower ones share the chunk widths' that buildWidthClasses builds). A split
 * head runs its own layers only (the chain may not be up yet). The slots are emptied after: the runner
 * starts from nothing. Then every slot's graphs of a prompt's rest after the snapshot point and of a decode
 * step are built (no GPU work). Skipped for contexts too small to hold it.
 */
async function warmUp(
  stage: Stage,
  decoder: SlotDecoder,
  m: Extract<ToWorker, { type: "init" }>,
): Promise<void> {
  const n = WARM_UP_PIECE + WARM_UP_REST;
  if (m.nCtx < n + 2) return;
  const t0 = performance.now();
  post({
    type: "log",
    line: "Building the GPU pipelines (a short warm-up run, so the first request does not wait)",
  });
  const ids = Array.from({ length: n }, (_, i) => i % stage.hp.nVocab);
  const [piece, rest] = [ids.slice(0, WARM_UP_PIECE), ids.slice(WARM_UP_PIECE)];
  let used = 1; // slots 0..used-1 ran
  if (m.split) {
    await stage.run(0, { tokens: piece }, 0, { rows: "all" });
    await stage.run(0, { tokens: rest }, WARM_UP_PIECE, { rows: "all" });
    await stage.run(0, { tokens: [0] }, n, { rows: "all" });
  } else {
    // A decoder that snapshots inside a prefill: the whole prompt in one call cut at the point (the DeltaNet
    // taps), as the runner runs a lone request; a piece up to the last token cut there and that token, as it
    // runs a burst's; then the same rest as the others (per-token path).
    if (decoder.snapInPrefill) {
      const [whole] = await decoder.generate([
        { slot: 0, prompt: ids, opts: { nNew: 2, snapAt: WARM_UP_PIECE } },
      ], { batch: m.batch });
      if (whole?.snapshot !== undefined) decoder.drop(whole.snapshot);
      const id = await decoder.prefill(0, ids.slice(0, n - 1), 0, WARM_UP_PIECE);
      if (typeof id === "number") decoder.drop(id);
      await decoder.generate([{ slot: 0, prompt: ids.slice(n - 1), opts: { nNew: 2, base: n - 1 } }], {
        batch: m.batch,
      });
    }
    await decoder.prefill(0, piece, 0);
    decoder.drop(decoder.snapshot(0));
    await decoder.generate([{ slot: 0, prompt: rest, opts: { nNew: 2, base: WARM_UP_PIECE } }], {
      batch: m.batch,
    });
    if (m.nSlots >= 2 && decoder.canBatch && m.batchMin > 0) {
      const sampled = samplingParams({ temperature: 0.7, seed: 1 });
      await decoder.generate([
        { slot: 0, prompt: rest, opts: { nNew: 2 } },
        { slot: 1, prompt: rest, opts: { nNew: 2, sampling: sampled } },
      ], { batch: m.batch });
      used = 2;
      // Steps of more slots than a chunk has columns compile their own mat-vec variants, one set per slot
      // count (4 pipelines each on the tiny model): the 9th..16th user would otherwise wait for them.
      for (let k = MATVEC_MAX_COLS + 1; k <= Math.min(m.nSlots, MAX_BATCH_SLOTS); k++) {
        const slots = Array.from({ length: k }, (_, i) => i);
        await decoder.generate(slots.map((slot) => ({ slot, prompt: [ids[0]!], opts: { nNew: 2 } })), {
          batch: m.batch,
        });
        used = k;
      }
    }
  }
  for (let slot = 0; slot < used; slot++) stage.reset(slot);
  // The kernel variants of every prefill width class (a prompt piece or tail of an unusual width would
  // otherwise compile its pipelines inside a request's time to first token, or the other streams' gap).
  await buildWidthClasses(stage, 0);
  // Each slot's own graphs (dispatch lists are per slot and chunk width; a 40-layer model's takes tens of ms
  // to build) of a fresh request's last prompt chunk after the prompt-boundary snapshot and of its decode
  // step, so that no slot's first request builds them between its prefill and its first id.
  const restWidth = Math.min(m.snapshotBack, m.maxChunk);
  if (!m.split) {
    for (let slot = 0; slot < m.nSlots; slot++) {
      if (restWidth >= 1 && restWidth <= m.nCtx) await stage.graph(slot, restWidth, "last");
      await stage.graph(slot, 1, "last");
    }
  }
  post({ type: "log", line: `GPU pipelines built in ${((performance.now() - t0) / 1000).toFixed(1)} s` });
}

/** Hands waiting jobs to the runner once the model is loaded (all at once: they start in one decode call). */
function pump(): void {
  if (!runner) return;
  for (let job = jobs.shift(); job; job = jobs.shift()) {
    const id = job.id;
    runner.submit({
      prompt: job.prompt,
      maxTokens: job.maxTokens,
      stopIds: job.stopIds,
      sampling: job.sampling,
      signal: aborts.get(id)!.signal,
      onTokens: (ids) => post({ type: "tokens", id, ids: [...ids] }),
      onSlot: (slot, heldTokens) => post({ type: "slot", id, slot, heldTokens }),
    }).then(
      (result) => post({ type: "done", id, result, pipelines: pipelines(), readbacks: { ...readStats } }),
      (e) => post({ type: "error", id, error: encodeError(e) }),
    ).finally(() => aborts.delete(id));
  }
}

async function close(): Promise<void> {
  stage?.destroy();
  file?.close();
  if (tempDir) await Deno.remove(tempDir, { recursive: true });
  post({ type: "closed" });
}

scope.onmessage = (e: MessageEvent<ToWorker>) => {
  const m = e.data;
  switch (m.type) {
    case "init":
      void init(m);
      break;
    case "generate":
      aborts.set(m.id, new AbortController());
      trace("worker-got", { id: m.id, prompt: m.prompt.length });
      jobs.push(m);
      pump();
      break;
    case "next-reply": {
      const c = nextCalls.get(m.call);
      nextCalls.delete(m.call);
      if (!c) break;
      if (m.error) {
        c.reject(
          m.error.name === "StaleChainError" ? new StaleChainError(m.error.message) : decodeError(m.error),
        );
      } else c.resolve(m.value);
      break;
    }
    case "cancel":
      // A cancel can cross the job's own "done" message: then there is nothing left to abort.
      aborts.get(m.id)?.abort();
      break;
    case "close":
      void close();
      break;
    default: {
      const never: never = m;
      throw new TypeError(`Unknown message ${JSON.stringify(never)} sent to the engine worker`);
    }
  }
};
