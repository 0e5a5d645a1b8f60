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
import { planModel, synthesize } from "../synth.ts";
import { SlotRunner } from "./_runner.ts";
import { decodeError, encodeError, type FromWorker, type NextCall, type ToWorker } from "./_protocol.ts";
import type { SlotDecoder } from "../exec/decode.ts";
import { type NextResult, type NextStage, SplitDecoder, StaleChainError } from "../exec/split.ts";

interface WorkerScope {
  postMessage(message: FromWorker): void;
  onmessage: ((e: MessageEvent<ToWorker>) => void) | null;
}

const scope = globalThis as unknown as WorkerScope;
const post = (m: FromWorker) => scope.postMessage(m);

type Job = Extract<ToWorker, { type: "generate" }>;

let runner: SlotRunner | undefined;
let stage: Stage | undefined;
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
    stage = await Stage.load(gpu, file, {
      nCtx: m.nCtx,
      nSlots: m.nSlots,
      maxChunk: m.maxChunk,
      int8Activations: m.int8Activations,
      kvF16: m.kvF16,
      layers: m.split?.layers,
      onLog: (line) => post({ type: "log", line }),
      onProgress: (p) => post({ type: "progress", loadedBytes: p.doneBytes, totalBytes: p.totalBytes }),
    });
    let decoder: SlotDecoder = stage.decoder;
    if (m.split) {
      if (!stage.first || stage.last) {
        throw new RangeError(
          `--layers ${
            m.split.layers.join(":")
          } of ${path}: a split head runs layers 0:a with a < ${stage.hp.nLayer}`,
        );
      }
      decoder = new SplitDecoder(stage, nextStage);
      post({
        type: "stage",
        info: {
          arch,
          layers: { first: stage.layers[0], end: stage.layers[1], total: stage.hp.nLayer },
          nEmbd: stage.hp.nEmbd,
          nSlots: m.nSlots,
          nCtx: m.nCtx,
          int8Activations: stage.int8Activations,
          kvF16: stage.kvF16,
          fingerprint: stage.fingerprint,
        },
      });
    } else if (!stage.first || !stage.last) {
      throw new RangeError(`${path}: the service needs the whole model`);
    }
    runner = new SlotRunner(decoder, {
      batch: m.batch,
      turnTokens: m.turnTokens,
      snapshotBack: m.snapshotBack,
      prefillTurn: m.prefillTurn,
      batchMin: m.batchMin,
    });
    post({
      type: "log",
      line: `Loaded ${model} (${arch}, ${(stage.weightBytes / 2 ** 20).toFixed(1)} MiB of weights, ` +
        `${m.nSlots} slots of ${m.nCtx} positions, ${
          (stage.states.totalBytes / 2 ** 20).toFixed(1)
        } MiB of state; x ${stage.int8Activations ? "int8" : "f32"} in the decode mat-vecs)`,
    });
    post({ type: "ready", nVocab: stage.hp.nVocab });
    pump();
  } catch (e) {
    post({ type: "failed", error: encodeError(e) });
  }
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
      (result) => post({ type: "done", id, result }),
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
