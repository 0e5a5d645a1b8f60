/**
 * Test doubles for the server tests: a byte-level tokenizer with the Qwen special tokens (no merges, so
 * every byte is one token), the built-in Qwen3 chat template, and {@linkcode FakeEngine}, a deterministic
 * {@linkcode Engine} that "generates" a scripted text's ids with the contract's slot, queue, abort, length
 * and stop-id behaviour. Not imported by production code.
 * @module
 */
import { ChatTemplate, QWEN3_TEMPLATE, TOKEN_TYPE, Tokenizer } from "../engine/mod.ts";
import {
  type Engine,
  type EngineGenerateRequest as GenerateRequest,
  type EngineGenerateResult as GenerateResult,
  type EngineStatus,
  QueueFullError,
} from "../engine/mod.ts";
import { createApp } from "./app.ts";

const SPECIALS = [
  "<|endoftext|>",
  "<|im_start|>",
  "<|im_end|>",
  "<tool_call>",
  "</tool_call>",
  "<tool_response>",
  "</tool_response>",
  "<think>",
  "</think>",
];

/** GPT-2 byte-to-unicode character of byte `b` (spec chat.md §4.1 step 4). */
function byteChar(b: number): string {
  if ((b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255)) {
    return String.fromCharCode(b);
  }
  let n = 0;
  for (let x = 0; x < b; x++) {
    if (!((x >= 33 && x <= 126) || (x >= 161 && x <= 172) || (x >= 174 && x <= 255))) n++;
  }
  return String.fromCharCode(256 + n);
}

/** A byte-level tokenizer (ids 0..255 are bytes) plus the Qwen specials from id 256. */
export function testTokenizer(): Tokenizer {
  const tokens: string[] = [];
  for (let b = 0; b < 256; b++) tokens.push(byteChar(b));
  const types: number[] = tokens.map(() => TOKEN_TYPE.normal);
  for (const s of SPECIALS) {
    tokens.push(s);
    types.push(s.startsWith("<|") ? TOKEN_TYPE.control : TOKEN_TYPE.userDefined);
  }
  return Tokenizer.fromVocab({
    model: "gpt2",
    pre: "qwen2",
    tokens,
    tokenTypes: types,
    merges: [],
    eosId: tokens.indexOf("<|im_end|>"),
  });
}

/** The built-in Qwen3 template (Hermes JSON tool calls; hybrid thinking). */
export function testTemplate(): ChatTemplate {
  return new ChatTemplate(QWEN3_TEMPLATE, { origin: "built-in qwen3", builtin: true });
}

/** What the fake generates for a request: text (its ids, then `<|im_end|>`), or exact ids. */
export type Script = (req: GenerateRequest) => string | number[];

/** Options of {@linkcode FakeEngine}. */
export interface FakeEngineOptions {
  /** Tokenizer to encode scripted text with. */
  tokenizer: Tokenizer;
  /** Output per request. */
  script: Script;
  /** Positions per slot (default 2048). */
  nCtx?: number;
  /** Slots (default 1). */
  nSlots?: number;
  /** Queue capacity (default 1). */
  queueSize?: number;
  /** Ids per onTokens batch (default 3). */
  batch?: number;
  /** Milliseconds between batches (default 0: one macrotask). */
  delayMs?: number;
  /** Engine state (default ready). */
  state?: EngineStatus["state"];
}

/** A deterministic engine: scripted output, real admission (slots, bounded queue), aborts and limits. */
export class FakeEngine implements Engine {
  /** Every request accepted, in order. */
  readonly requests: GenerateRequest[] = [];
  /** Results of finished requests, in finishing order. */
  readonly results: GenerateResult[] = [];
  /** While set, admitted requests wait on it before their first token. */
  gate: Promise<void> | undefined;
  state: EngineStatus["state"];
  readonly #o: Required<Omit<FakeEngineOptions, "state">>;
  #busy = 0;
  #waiting: (() => void)[] = [];
  #counters = {
    requests: 0,
    promptTokens: 0,
    generatedTokens: 0,
    prefixHits: 0,
    cachedTokens: 0,
    batchedTokens: 0,
  };
  closed = false;

  /** Creates the engine. */
  constructor(opts: FakeEngineOptions) {
    this.#o = { nCtx: 2048, nSlots: 1, queueSize: 1, batch: 3, delayMs: 0, ...opts };
    this.state = opts.state ?? "ready";
  }

  /** Live status. */
  status(): EngineStatus {
    return {
      state: this.state,
      loadedBytes: this.state === "loading" ? 250 : 1000,
      totalBytes: 1000,
      model: "fake-model",
      arch: "qwen3next",
      nCtx: this.#o.nCtx,
      nSlots: this.#o.nSlots,
      busySlots: this.#busy,
      queued: this.#waiting.length,
      counters: { ...this.#counters },
    };
  }

  /** Generates the scripted ids (see the class doc). */
  async generate(req: GenerateRequest): Promise<GenerateResult> {
    if (req.prompt.length + 1 > this.#o.nCtx) {
      throw new RangeError(
        `Prompt of ${req.prompt.length} tokens does not fit the context of ${this.#o.nCtx}`,
      );
    }
    if (this.closed) throw new Error("FakeEngine is closed");
    const arrived = performance.now();
    if (this.#busy >= this.#o.nSlots) {
      if (this.#waiting.length >= this.#o.queueSize) {
        throw new QueueFullError(`All ${this.#o.nSlots} slots busy and ${this.#o.queueSize} queued`, 2);
      }
      await new Promise<void>((resolve) => this.#waiting.push(resolve));
    }
    this.#busy++;
    this.requests.push(req);
    this.#counters.requests++;
    this.#counters.promptTokens += req.prompt.length;
    try {
      const admitted = performance.now();
      if (this.gate) await this.gate;
      const s = this.#o.script(req);
      const ids = typeof s === "string"
        ? [...this.#o.tokenizer.encode(s, { parseSpecial: true }), this.#o.tokenizer.eosId!]
        : s;
      const out: number[] = [];
      let reason: GenerateResult["reason"] = "length";
      let ttft = 0;
      const room = this.#o.nCtx - req.prompt.length;
      for (let i = 0; i < ids.length;) {
        if (req.signal?.aborted) {
          reason = "cancelled";
          break;
        }
        const batch: number[] = [];
        while (batch.length < this.#o.batch && i < ids.length && out.length + batch.length < req.maxTokens) {
          const id = ids[i++]!;
          batch.push(id);
          if (req.stopIds.includes(id)) break;
        }
        if (batch.length === 0) break;
        if (out.length === 0) ttft = performance.now() - admitted;
        out.push(...batch);
        req.onTokens?.(batch);
        const last = batch.at(-1)!;
        if (req.stopIds.includes(last)) {
          reason = "stop";
          break;
        }
        if (out.length >= req.maxTokens) break;
        if (out.length >= room) {
          reason = "context";
          break;
        }
        await new Promise((r) => setTimeout(r, this.#o.delayMs));
      }
      if (req.signal?.aborted && reason !== "stop" && out.length < ids.length) reason = "cancelled";
      this.#counters.generatedTokens += out.length;
      const result: GenerateResult = {
        tokens: out,
        reason,
        promptTokens: req.prompt.length,
        cachedTokens: 0,
        timeToFirstTokenMs: ttft + (admitted - arrived),
        queueMs: admitted - arrived,
        meanBatch: 1,
      };
      this.results.push(result);
      return result;
    } finally {
      this.#busy--;
      this.#waiting.shift()?.();
    }
  }

  /** Stops admitting. */
  close(): Promise<void> {
    this.closed = true;
    return Promise.resolve();
  }
}

/** A test app over a {@linkcode FakeEngine}. */
export function testApp(
  script: Script,
  opts: Partial<Omit<FakeEngineOptions, "tokenizer" | "script">> & {
    apiKey?: string;
    tempDefault?: number;
    tempCap?: number;
    bodyLimitBytes?: number;
    draining?: () => boolean;
    template?: ChatTemplate;
    corsOrigins?: readonly string[];
    requestLog?: (line: string) => void;
  } = {},
): { app: ReturnType<typeof createApp>; engine: FakeEngine; tokenizer: Tokenizer } {
  const tokenizer = testTokenizer();
  const engine = new FakeEngine({ tokenizer, script, ...opts });
  const app = createApp({
    engine,
    tokenizer,
    template: opts.template ?? testTemplate(),
    apiKey: opts.apiKey,
    tempDefault: opts.tempDefault ?? 0,
    tempCap: opts.tempCap ?? 2,
    bodyLimitBytes: opts.bodyLimitBytes ?? 1 << 20,
    draining: opts.draining,
    corsOrigins: opts.corsOrigins,
    requestLog: opts.requestLog,
  });
  return { app, engine, tokenizer };
}

/** One parsed SSE frame. */
export interface SseFrame {
  /** `event:` value, when present. */
  event: string | undefined;
  /** `data:` value (raw text). */
  data: string;
}

/**
 * Parses an SSE body strictly: every frame is optional `event:` then exactly one `data:` line and a blank
 * line; anything else throws (the writer promises well-formed frames).
 */
export function parseSse(body: string): SseFrame[] {
  if (body === "") return [];
  if (!body.endsWith("\n\n")) {
    throw new Error(`SSE body does not end with a blank line: ${JSON.stringify(body.slice(-40))}`);
  }
  return body.slice(0, -2).split("\n\n").map((frame) => {
    const lines = frame.split("\n");
    let event: string | undefined;
    if (lines[0]?.startsWith("event: ")) event = lines.shift()!.slice(7);
    if (lines.length !== 1 || !lines[0]!.startsWith("data: ")) {
      throw new Error(`Malformed SSE frame: ${JSON.stringify(frame)}`);
    }
    return { event, data: lines[0]!.slice(6) };
  });
}

/** POSTs JSON to the app. */
export function post(
  app: ReturnType<typeof createApp>,
  path: string,
  body: unknown,
  headers: Record<string, string> = {},
): Promise<Response> {
  return Promise.resolve(app.request(path, {
    method: "POST",
    headers: { "content-type": "application/json", ...headers },
    body: typeof body === "string" ? body : JSON.stringify(body),
  }));
}
