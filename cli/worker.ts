/**
 * `mod.ts worker`: one stage of a split model. Loads layers `a:b` of the GGUF (fingerprint at load, cached
 * beside the file), listens for the previous stage on `--listen`, and either finishes the model (last
 * stage: output norm, LM head, argmax) or forwards to `--next` (middle stage). Stops on SIGINT/SIGTERM.
 * @module
 */
import type { Command } from "./command.ts";
import { parseArgs } from "node:util";
import {
  acquireGpu,
  buildWidthClasses,
  DEFAULT_MAX_CHUNK,
  KEYS,
  openGguf,
  printProfileOnSignal,
  Stage,
} from "../engine/mod.ts";
import { listenWorker, parseAddress, readTlsFlags, serveWorker, WireError } from "../wire/mod.ts";
import { DEFAULT_TIMEOUT_MS } from "../wire/link.ts";
import { ChainLink } from "../wire/chain.ts";
import { stageBackend } from "../wire/stage_backend.ts";
import { buildInfo } from "../version.ts";
import { expertsConflict, int8ActivationsFlag, int8ExpertsFlag } from "./experts.ts";

const USAGE = `Usage: deno run -A mod.ts worker --model F.gguf --layers a:b --listen HOST:PORT [options]
  --model F         GGUF (first part of a split set): the same file as the head's (fingerprints must match)
  --layers a:b      this stage's layers [a, b), a > 0 (the head runs 0:a)
  --listen H:P      where the previous stage connects
  --slots N         slots (default 4; at least the head's)
  --ctx N           positions per slot (default 8192; at least the head's)
  --next H:P        the next stage, when b is not the last layer (a middle worker)
  --link-key K      shared key of the chain (or LLM_LINK_KEY); both sides of each hop need the same
  --tls-cert F --tls-key F   listen with TLS (PEM files)
  --tls-ca F        trust this CA when connecting to --next over TLS
  --link-timeout S  seconds the next stage may take to answer a frame before the link is dropped as stalled
                    (default ${DEFAULT_TIMEOUT_MS / 1000}; raise it on a slow or heavily loaded box)
  --chunk N         rows per prefill chunk (default ${DEFAULT_MAX_CHUNK}, as the head)
  --kv-f16          KV cache in f16 (every stage must agree)
  --int8-experts    x rounded to int8 for the expert mat-vecs alone, f32 x for the projections (default: x
                    rounded to int8 before every quantized mat-vec, as the head's default; every stage must
                    agree)
  --f32-experts     f32 x everywhere: the exact path (every stage must agree)
  --int8            the default (int8 x for every mat-vec): a no-op, taken for old command lines`;

/** Parses `--link-timeout S` (seconds, 0.1..3600) into ms; undefined when absent. @throws {RangeError} */
export function parseLinkTimeout(s: string | undefined): number | undefined {
  if (s === undefined) return undefined;
  const n = Number(s);
  if (!Number.isFinite(n) || n < 0.1 || n > 3600) {
    throw new RangeError(`--link-timeout ${s} must be seconds in 0.1..3600 (a stalled stage's reply wait)`);
  }
  return Math.round(n * 1000);
}

/** Parses `a:b`. @throws {RangeError} naming the flag */
export function parseLayers(s: string): [number, number] {
  const m = /^(\d+):(\d+)$/.exec(s);
  if (!m) throw new RangeError(`--layers ${s} is not a:b (e.g. --layers 20:40)`);
  return [Number(m[1]), Number(m[2])];
}

function int(flag: string, value: string, min: number): number {
  const n = Number(value);
  if (!Number.isInteger(n) || n < min) {
    throw new RangeError(`--${flag} ${value} must be an integer >= ${min}`);
  }
  return n;
}

/** The `worker` command. */
export const command: Command = {
  usage: USAGE,
  summary: "One stage of a split model: --model F --layers a:b --listen HOST:PORT [--next HOST:PORT]",
  async run(argv: string[]): Promise<number> {
    const { values } = parseArgs({
      args: argv,
      options: {
        model: { type: "string" },
        layers: { type: "string" },
        listen: { type: "string" },
        slots: { type: "string", default: "4" },
        ctx: { type: "string", default: "8192" },
        next: { type: "string" },
        "link-key": { type: "string" },
        "tls-cert": { type: "string" },
        "tls-key": { type: "string" },
        "tls-ca": { type: "string" },
        "link-timeout": { type: "string" },
        chunk: { type: "string", default: String(DEFAULT_MAX_CHUNK) },
        int8: { type: "boolean", default: false },
        "int8-experts": { type: "boolean", default: false },
        "f32-experts": { type: "boolean", default: false },
        "kv-f16": { type: "boolean", default: false },
        debug: { type: "boolean", default: false },
      },
      strict: true,
    });
    const conflict = expertsConflict(values);
    if (conflict !== undefined) {
      console.error(`error: ${conflict}`);
      return 2;
    }
    if (!values.model) throw new RangeError("--model is required: the GGUF this stage serves");
    if (!values.layers) throw new RangeError("--layers a:b is required: this stage's layer range");
    if (!values.listen) {
      throw new RangeError("--listen HOST:PORT is required: where the previous stage connects");
    }
    const layers = parseLayers(values.layers);
    const listen = parseAddress(values.listen);
    const nextAddr = values.next === undefined ? undefined : parseAddress(values.next);
    const nSlots = int("slots", values.slots, 1);
    const nCtx = int("ctx", values.ctx, 2);
    const maxChunk = int("chunk", values.chunk, 1);
    const timeoutMs = parseLinkTimeout(values["link-timeout"]);
    if (timeoutMs !== undefined && !nextAddr) {
      throw new RangeError(
        "--link-timeout bounds the wait for --next: give it with --next (a middle worker)",
      );
    }
    const linkKey = values["link-key"] ?? Deno.env.get("LLM_LINK_KEY");
    if (linkKey === "") throw new RangeError("--link-key is empty: give a key or leave the flag out");
    const tls = await readTlsFlags({
      tlsCert: values["tls-cert"],
      tlsKey: values["tls-key"],
      tlsCa: values["tls-ca"],
    });
    const build = buildInfo();
    const file = await openGguf(values.model);
    try {
      const arch = file.metadata.getString(KEYS.architecture);
      const gpu = await acquireGpu();
      console.error(`GPU: ${gpu.summary}`);
      const stage = await Stage.load(gpu, file, {
        nCtx,
        nSlots,
        layers,
        maxChunk,
        int8Activations: int8ActivationsFlag(values),
        int8Experts: int8ExpertsFlag(values),
        kvF16: values["kv-f16"],
      });
      console.error(
        `Loaded layers ${layers[0]}:${layers[1]} of ${values.model} (${arch}, ${
          (stage.weightBytes / 2 ** 20).toFixed(1)
        } MiB of weights, fingerprint ${stage.fingerprint.slice(0, 16)}…)`,
      );
      await warmUp(stage);
      printProfileOnSignal(`worker ${layers[0]}:${layers[1]}`, stage.profile);
      const next = nextAddr && new ChainLink(nextAddr, { build, linkKey, tls: tls.connect, timeoutMs });
      const backend = stageBackend(stage, { build, arch, next });
      if (next) {
        // The head checks the whole chain at its connect: reach the next stage first (it may still be loading).
        for (let wait = 250;; wait = Math.min(2000, wait * 2)) {
          try {
            await next.ready();
            break;
          } catch (e) {
            if (e instanceof WireError && (e.code === "refused" || e.code === "auth")) throw e;
            await new Promise((r) => setTimeout(r, wait));
          }
        }
      }
      const listener = listenWorker(listen, { tls: tls.listen });
      const server = serveWorker(listener, backend, { linkKey });
      const addr = listener.addr as Deno.NetAddr;
      console.error(
        `Listening on ${addr.hostname}:${addr.port} (layers ${layers[0]}:${
          layers[1]
        }; build ${build.version} ` +
          `commit ${build.commit})`,
      );
      const stop = () => void server.close();
      const signals: Deno.Signal[] = Deno.build.os === "windows" ? ["SIGINT"] : ["SIGINT", "SIGTERM"];
      for (const s of signals) Deno.addSignalListener(s, stop);
      await server.done;
      for (const s of signals) Deno.removeSignalListener(s, stop);
      await next?.close();
      stage.destroy();
      console.error("Stopped");
      return 0;
    } finally {
      file.close();
    }
  },
};

/** Hidden rows of the warm-up: a piece over 8 (the chunked DeltaNet path), a rest of 4 and one decode row. */
const WARM_UP_ROWS = [16, 4, 1] as const;

/**
 * Builds the GPU pipelines and slot 0's graphs the head's first request would otherwise wait for: zero hidden
 * rows through this stage's layers as a prompt piece, its rest and one decode step (the last stage computes
 * logits for each), then slot 0 is emptied again. Skipped for contexts too small to hold it.
 */
async function warmUp(stage: Stage): Promise<void> {
  const total = WARM_UP_ROWS.reduce((a, b) => a + b, 0);
  if (stage.nCtx < total || stage.first) return;
  const t0 = performance.now();
  console.error("Building the GPU pipelines (a short warm-up run, so the first request does not wait)");
  let at = 0;
  for (const n of WARM_UP_ROWS) {
    if (n > stage.maxChunk) continue;
    await stage.run(0, { hidden: new Float32Array(n * stage.hp.nEmbd), nTokens: n }, at, { rows: "all" });
    at += n;
  }
  stage.reset(0);
  await buildWidthClasses(stage, 0);
  console.error(`GPU pipelines built in ${((performance.now() - t0) / 1000).toFixed(1)} s`);
}
