/**
 * `mod.ts generate`: greedy generation (and teacher-forced scoring with `--echo`) on the GPU, from a GGUF or,
 * with no `--model`, from the embedded default: a tiny synthetic `qwen35moe` written to a temporary file.
 * @module
 */
import type { Command } from "./command.ts";
import { parseArgs } from "node:util";
import {
  acquireGpu,
  ChatTemplate,
  checkSampling,
  DEFAULT_MAX_CHUNK,
  DraftingDecoder,
  KEYS,
  openGguf,
  planModel,
  renderPrompt,
  samplingParams,
  Stage,
  StopMatcher,
  synthesize,
  Tokenizer,
  topCpu,
} from "../engine/mod.ts";
import { expertsConflict, int8ActivationsFlag, int8ExpertsFlag } from "./experts.ts";

const USAGE =
  `Usage: deno run -A mod.ts generate [--model FILE.gguf] (--prompt TEXT | --tokens 1,2,3) [options]
  --model F     GGUF (first part of a split set, or any part); default: a tiny synthetic qwen35moe
  --prompt T    text, tokenized with the model's own vocabulary (special tokens parsed)
  --tokens L    comma-separated token ids instead of text
  --n N         tokens to generate (default 32; 0 with --echo only scores the prompt)
  --top K       with --json: the K highest logits of every step (default 5, at most 64)
  --echo        with --json: also "prompt_top", the top logits after every input position
  --layers a:b  layer range; generation needs the whole model (0:nLayer)
  --ctx N       context positions (default: prompt + n, at least 256)
  --chunk N     prompt tokens per prefill chunk (default ${DEFAULT_MAX_CHUNK}, as the head): compare one prompt
                across chunk sizes
  --chat        treat --prompt as a user message: render the model's chat template (generation cue added)
  --no-think    with --chat: thinking off (templates that support it)
  --stop S      stop string (repeatable); the matched text is not printed
  --ignore-eos  do not stop at the end-of-generation ids of the vocabulary
  --temp T      sampling temperature (default 0: greedy); with --top-k, --top-p, --min-p, --repeat-penalty
  --seed S      seed of the sampler's random stream (same seed, same tokens)
  --json        print {"tokens":[...], "top":[...], "reason":...} (and "prompt_top" with --echo)
  --kv-f16      KV cache in f16: half the memory per position; K and V round to f16 (StageOptions.kvF16)
  --int8-experts  x rounded to int8 for the expert mat-vecs alone (StageOptions.int8Experts); the projections
                keep f32 x. By default, as the head serves, x is rounded to int8 before every quantized
                mat-vec (integer dot products in decode steps, the rounded x in prefill): llama.cpp's quantized
                arithmetic (StageOptions.int8Activations)
  --f32-experts f32 x everywhere: the exact path (the library's default)
  --int8        the default (int8 x for every mat-vec): a no-op, taken for old command lines
  --draft K     guess up to K ids (1..7) by prompt lookup (a 3-id match) and check them in frames of 1 + K
                rows where the guesses are long (engine/exec/drafting.ts); the same ids. Not with --json
                (its top-k pairs run undrafted)
  --draft-min M with --draft: fewest guesses that make a frame (1..K, default 4 or K)
A prompt that prefills for more than a second prints its progress on stderr, at most one line a second
(LLM_PROGRESS_MS sets both, in ms; default 1000).`;

/** Milliseconds of prefill before the first progress line, and between lines (LLM_PROGRESS_MS overrides). */
const PROGRESS_MS = 1000;

function int(flag: string, value: string, min: number): number {
  const n = Number(value);
  if (!Number.isInteger(n) || n < min) {
    throw new RangeError(`--${flag} ${value} must be an integer >= ${min}`);
  }
  return n;
}

/** The embedded default model: written once per run into a temporary folder. */
async function defaultModel(): Promise<string> {
  const dir = await Deno.makeTempDir({ prefix: "llm_default_" });
  const out = `${dir}/tiny-qwen35moe.gguf`;
  await synthesize(planModel({ arch: "qwen35moe", preset: "tiny", quant: "q8_0", seed: 1 }), { out });
  globalThis.addEventListener("unload", () => Deno.removeSync(dir, { recursive: true }));
  console.error(`No --model given: serving the embedded default, a tiny synthetic qwen35moe (${out})`);
  return out;
}

/**
 * The summary line on stderr: prompt tokens and prefill tok/s (up to the first id on the CPU), generated
 * ids and decode tok/s (after the first batch of ids; `-` with a single batch).
 */
export function speedLine(
  promptTokens: number,
  generated: number,
  t: { t0: number; first: { atMs: number; n: number } | undefined; lastMs: number },
): string {
  const rate = (n: number, ms: number) => (ms > 0 && n > 0 ? ((n * 1000) / ms).toFixed(1) : "-");
  const prefill = t.first === undefined ? "-" : rate(promptTokens, t.first.atMs - t.t0);
  const decode = t.first === undefined ? "-" : rate(generated - t.first.n, t.lastMs - t.first.atMs);
  return `prompt ${promptTokens} tokens, prefill ${prefill} tok/s; generated ${generated} tokens, decode ${decode} tok/s`;
}

/** `LLM_PROGRESS_MS`, checked: the prefill progress threshold and interval in ms. */
export function progressMs(env: string | undefined): number {
  if (env === undefined) return PROGRESS_MS;
  const n = Number(env);
  if (env.trim() === "" || !Number.isFinite(n) || n < 0) {
    throw new RangeError(`LLM_PROGRESS_MS=${env} must be a number of milliseconds >= 0`);
  }
  return n;
}

/**
 * The prefill progress printer: `report(done, total)` after each chunk returns a line (`prefill 8192/32768
 * tokens, 1,234 tok/s`) once the prefill has run `everyMs` and `everyMs` after the last line, else undefined.
 */
export function prefillProgress(
  everyMs: number,
  now: () => number = () => performance.now(),
): (doneTokens: number, promptTokens: number) => string | undefined {
  const t0 = now();
  let last = t0;
  return (done, total) => {
    const t = now();
    if (t - t0 < everyMs || (last > t0 && t - last < everyMs)) return undefined;
    last = t;
    const rate = t > t0 ? Math.round((done * 1000) / (t - t0)).toLocaleString("en-US") : "-";
    return `prefill ${done}/${total} tokens, ${rate} tok/s`;
  };
}

/** The `generate` command. */
export const command: Command = {
  usage: USAGE,
  summary: "greedy generation or prompt scoring on the GPU (--model F, --prompt T | --tokens 1,2,3)",
  async run(argv: string[]): Promise<number> {
    const { values } = parseArgs({
      args: argv,
      options: {
        model: { type: "string" },
        prompt: { type: "string" },
        tokens: { type: "string" },
        n: { type: "string", default: "32" },
        top: { type: "string", default: "5" },
        echo: { type: "boolean", default: false },
        layers: { type: "string" },
        ctx: { type: "string" },
        chunk: { type: "string", default: String(DEFAULT_MAX_CHUNK) },
        json: { type: "boolean", default: false },
        chat: { type: "boolean", default: false },
        "no-think": { type: "boolean", default: false },
        stop: { type: "string", multiple: true },
        "ignore-eos": { type: "boolean", default: false },
        temp: { type: "string", default: "0" },
        "top-k": { type: "string" },
        "top-p": { type: "string" },
        "min-p": { type: "string" },
        "repeat-penalty": { type: "string" },
        seed: { type: "string" },
        int8: { type: "boolean", default: false },
        "int8-experts": { type: "boolean", default: false },
        "f32-experts": { type: "boolean", default: false },
        "kv-f16": { type: "boolean", default: false },
        draft: { type: "string" },
        "draft-min": { type: "string" },
        debug: { type: "boolean", default: false },
        help: { type: "boolean", default: false },
      },
      strict: true,
    });
    if (values.help) {
      console.log(USAGE);
      return 0;
    }
    const conflict = expertsConflict(values);
    if (conflict !== undefined) {
      console.error(`${USAGE}\nerror: ${conflict}`);
      return 2;
    }
    if ((values.prompt === undefined) === (values.tokens === undefined)) {
      console.error(`${USAGE}\nerror: give exactly one of --prompt and --tokens`);
      return 2;
    }
    const nNew = int("n", values.n, 0);
    const top = int("top", values.top, 0);
    const draft = values.draft === undefined ? 0 : int("draft", values.draft, 0);
    const draftMin = values["draft-min"] === undefined ? undefined : int("draft-min", values["draft-min"], 1);
    if (draft > 7) {
      throw new RangeError(`--draft ${draft} must be at most 7 (rows per frame: 1 + drafts <= 8)`);
    }
    if (draftMin !== undefined && (draft === 0 || draftMin > draft)) {
      throw new RangeError(`--draft-min ${draftMin} must be at most --draft (${draft})`);
    }
    if (nNew === 0 && !values.echo) {
      throw new RangeError("--n 0 generates nothing: add --echo to score the prompt");
    }
    const path = values.model ?? await defaultModel();
    using file = await openGguf(path);
    const tok = file.metadata.has(KEYS.tokTokens) ? Tokenizer.fromGguf(file.metadata) : undefined;
    let ids: number[];
    if (values.tokens !== undefined) {
      ids = values.tokens.split(",").map((s) => int("tokens", s.trim(), 0));
    } else {
      if (!tok) throw new RangeError(`${path} has no tokenizer: pass --tokens instead of --prompt`);
      // --chat: the prompt is a user message, so a control-token spelling in it stays text (renderPrompt);
      // without --chat it is raw prompt text, control tokens included.
      ids = values.chat
        ? renderPrompt(ChatTemplate.fromGguf(file.metadata), tok, {
          messages: [{ role: "user", content: values.prompt! }],
          addGenerationPrompt: true,
          enableThinking: !values["no-think"],
        }).ids
        : tok.encode(values.prompt!, { parseSpecial: true });
    }
    if (values.chat && values.tokens !== undefined) {
      throw new RangeError("--chat needs --prompt, not --tokens");
    }
    if ((values.stop?.length ?? 0) > 0 && !tok) {
      throw new RangeError(`--stop needs a vocabulary: ${path} has none`);
    }
    if (ids.length === 0) throw new RangeError("The prompt is empty: give at least one token");
    const nCtx = values.ctx === undefined ? Math.max(256, ids.length + nNew) : int("ctx", values.ctx, 1);
    // Before any GPU work: a prompt longer than the context would fail only after the weights' upload.
    if (ids.length > nCtx) {
      throw new RangeError(
        `The prompt of ${ids.length} tokens does not fit --ctx ${nCtx}: raise --ctx to at least ${
          ids.length + nNew
        } (prompt + --n) or shorten the prompt`,
      );
    }
    const everyMs = progressMs(Deno.env.get("LLM_PROGRESS_MS"));
    const gpu = await acquireGpu();
    let layers: [number, number] | undefined;
    if (values.layers !== undefined) {
      const m = /^(\d+):(\d+)$/.exec(values.layers);
      if (!m) throw new RangeError(`--layers ${values.layers} must look like a:b`);
      layers = [Number(m[1]), Number(m[2])];
    }
    const maxChunk = int("chunk", values.chunk, 1);
    const stage = await Stage.load(gpu, file, {
      nCtx,
      nSlots: 1,
      layers,
      maxChunk,
      int8Activations: int8ActivationsFlag(values),
      int8Experts: int8ExpertsFlag(values),
      kvF16: values["kv-f16"],
    }).catch((e) => {
      // The context was sized from the prompt: say so, as the refusal names --ctx (checked before upload).
      if (values.ctx !== undefined || !(e instanceof RangeError) || !e.message.startsWith("--ctx")) throw e;
      throw new RangeError(
        `The prompt of ${ids.length} tokens and --n ${nNew} need a context of ${nCtx} positions, more than ` +
          `this GPU can bind: ${e.message}; shorten the prompt or lower --n`,
        { cause: e },
      );
    });
    if (!stage.first || !stage.last) {
      throw new RangeError(
        `--layers ${values.layers} is a partial stage of 0:${stage.hp.nLayer}: generate needs the whole model ` +
          `(partial stages serve the split pipeline)`,
      );
    }
    const out: {
      tokens: number[];
      top: [number, number][][];
      reason?: string;
      text?: string;
      prompt_top?: [number, number][][];
    } = { tokens: [], top: [] };
    if (values.echo) {
      const scored = await stage.run(0, { tokens: ids }, 0, { rows: "all" });
      const V = stage.hp.nVocab;
      out.prompt_top = [];
      for (let i = 0; i < ids.length; i++) {
        out.prompt_top.push(topCpu(scored.data.subarray(i * V, (i + 1) * V), top));
      }
    }
    if (nNew > 0) {
      // Text streams as ids land: the incremental decoder never emits half a UTF-8 character, and the stop
      // matcher holds back only what could still start a stop string.
      const decoder = tok?.incrementalDecoder();
      const stops = new StopMatcher(values.stop ?? []);
      const abort = new AbortController();
      const enc = new TextEncoder();
      let text = "";
      const emit = (piece: string) => {
        text += piece;
        if (!values.json) Deno.stdout.writeSync(enc.encode(piece));
      };
      const num = (flag: string, v: string | undefined) => {
        if (v === undefined) return undefined;
        const x = Number(v);
        if (!Number.isFinite(x)) throw new RangeError(`--${flag} ${v} is not a number`);
        return x;
      };
      const sampling = samplingParams({
        temperature: num("temp", values.temp),
        topK: num("top-k", values["top-k"]),
        topP: num("top-p", values["top-p"]),
        minP: num("min-p", values["min-p"]),
        repeatPenalty: num("repeat-penalty", values["repeat-penalty"]),
        seed: num("seed", values.seed),
      });
      checkSampling(sampling);
      // Timing as llama.cpp's tools report it: prefill up to the first id on the CPU, decode after that
      // first batch of ids.
      const t0 = performance.now();
      let first: { atMs: number; n: number } | undefined;
      let lastMs = t0;
      const progress = prefillProgress(everyMs);
      // With --draft: the drafting decoder around the stage's decode driver (the same ids, in frames).
      const dec = draft > 0 && !values.json
        ? new DraftingDecoder(stage.decoder, stage, {
          draft,
          ...(draftMin !== undefined ? { minDraft: draftMin } : {}),
        })
        : undefined;
      const gen = async (opts: Parameters<Stage["generate"]>[2]) =>
        dec ? (await dec.generate([{ slot: 0, prompt: ids, opts }]))[0]! : await stage.generate(0, ids, opts);
      const g = await gen({
        onPrefill: (done, total) => {
          const line = progress(done, total);
          if (line !== undefined) console.error(line);
        },
        sampling,
        nNew,
        top: values.json ? top : 0,
        stopIds: values["ignore-eos"] || !tok ? [] : [...tok.eogIds],
        signal: abort.signal,
        onTokens: (fresh) => {
          lastMs = performance.now();
          first ??= { atMs: lastMs, n: fresh.length };
          if (!decoder || stops.stopped) return;
          const r = stops.push(
            fresh.filter((id) => !tok!.eogIds.has(id)).map((id) => decoder.push(id)).join(""),
          );
          emit(r.text);
          if (r.stop !== undefined) abort.abort();
        },
      });
      if (decoder && !stops.stopped) emit(stops.push(decoder.flush()).text + stops.flush());
      out.tokens = g.tokens;
      out.top = g.top;
      out.reason = stops.stopped ? "stop_string" : g.reason;
      if (tok) out.text = text;
      if (!values.json) console.error(`\n[${out.reason}: ${g.tokens.length} tokens]`);
      console.error(speedLine(ids.length, g.tokens.length, { t0, first, lastMs }));
      if (dec) {
        const d = dec.draftStats;
        console.error(`drafts: ${d.frames} frames, ${d.accepted}/${d.proposed} guesses kept`);
      }
    }
    if (values.json) console.log(JSON.stringify(out));
    else if (!tok) console.log(out.tokens.join(" "));
    stage.destroy();
    gpu.device.destroy();
    return 0;
  },
};
