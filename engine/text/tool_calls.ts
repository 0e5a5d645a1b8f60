/**
 * Model output → structured parts: reasoning (`<think>…</think>`), answer text and tool calls, both from a
 * complete text and from a stream of text deltas (spec/chat.md §5.4, §6 "Output parsing").
 *
 * Tool calls sit in `<tool_call>…</tool_call>` spans; the body is either Hermes-style JSON
 * `{"name": …, "arguments": {…}}` (Qwen3-Next) or the XML style of Qwen3.5
 * `<function=NAME><parameter=KEY>\nVALUE\n</parameter></function>`, whose raw values are converted to the JSON
 * types the tool's schema declares. The format is recognized per call, so one parser serves both families.
 * A span that does not parse is passed through as plain text, never thrown.
 *
 * @example
 * ```ts
 * import { ChatStreamParser } from "./tool_calls.ts";
 * const p = new ChatStreamParser({ startInThinking: true });
 * p.push("Plan.</think>\n\nOk<tool_");
 * // [{ type: "thinking", text: "Plan." }, { type: "text", text: "Ok" }]
 * p.push('call>\n{"name": "f", "arguments": {"x": 1}}\n</tool_call>');
 * // [{ type: "tool_call", call: { name: "f", arguments: { x: 1 }, format: "json" } }]
 * p.end(); // []
 * ```
 * @module
 */
import type { ToolSpec } from "./template.ts";

/** A tool call recovered from model output. */
export interface ParsedToolCall {
  /** Called function's name (not checked against the offered tools). */
  name: string;
  /** Arguments as a JSON object. */
  arguments: Record<string, unknown>;
  /** Which body format it came in: Hermes JSON or Qwen3.5 XML. */
  format: "json" | "xml";
}

/** One piece of parsed output; consecutive pieces of one type from a single call are merged. */
export type ChatEvent =
  | { type: "text"; text: string }
  | { type: "thinking"; text: string }
  | { type: "tool_call"; call: ParsedToolCall };

/** Options of {@linkcode ChatStreamParser} and {@linkcode parseChatOutput}. */
export interface ChatParseOptions {
  /** Tools offered in the request: their parameter schemas type the XML-style argument values. */
  tools?: readonly ToolSpec[];
  /**
   * The prompt ended inside an open think block (see `opensThinking` in template.ts), so output starts as
   * reasoning until `</think>`. Default false.
   */
  startInThinking?: boolean;
  /**
   * Recognize `<think>` at the start of output and `</think>` after reasoning (default true). When false,
   * everything outside tool calls is text.
   */
  parseThinking?: boolean;
}

/** The parts of one complete model output. */
export interface ChatOutput {
  /** Answer text outside tool calls and reasoning. */
  content: string;
  /** Reasoning text (without the think tags), `""` when none. */
  reasoning: string;
  /** Tool calls in output order. */
  toolCalls: ParsedToolCall[];
}

const THINK_OPEN = "<think>";
const THINK_CLOSE = "</think>";
const CALL_OPEN = "<tool_call>";
const CALL_CLOSE = "</tool_call>";

type Mode = "start" | "thinking" | "text" | "call";

/**
 * Streaming output parser: `push(delta)` returns the events that are certain so far, `end()` the rest.
 * Text that could still begin a tag (`<tool_c`, `</thi`) is held back until disambiguated, so no tag
 * fragment ever reaches a text or thinking event; a tool call is reported once its span is closed.
 * Whitespace right before a tool call (and after the last one) is dropped; newlines right after
 * `</think>` and around the reasoning are stripped, as the templates do when re-rendering.
 */
export class ChatStreamParser {
  #tools: readonly ToolSpec[];
  #startInThinking: boolean;
  #mode: Mode;
  #buf = "";
  /** Trailing whitespace of the text so far, not yet emitted. */
  #ws = "";
  /** Whitespace dropped when the current call span opened, restored if the span is malformed. */
  #wsBeforeCall = "";
  /** Trailing newlines of the reasoning so far, not yet emitted. */
  #thinkNl = "";
  #thinkFresh = true;
  #stripNewlines = false;
  /** Length of the call-mode buffer already searched for tags without a match. */
  #callScanned = 0;
  #lastWasCall = false;
  #ended = false;
  #out: ChatEvent[] = [];

  /** Creates a parser for one generated message. */
  constructor(opts: ChatParseOptions = {}) {
    this.#tools = opts.tools ?? [];
    this.#startInThinking = opts.startInThinking ?? false;
    this.#mode = opts.parseThinking === false ? "text" : "start";
  }

  /**
   * Feeds the next piece of generated text.
   * @throws {Error} when called after {@linkcode ChatStreamParser.end}
   */
  push(delta: string): ChatEvent[] {
    if (this.#ended) throw new Error("ChatStreamParser.push after end(): create a new parser per message");
    this.#buf += delta;
    this.#drain(false);
    return this.#take();
  }

  /** Ends the output: held text is released, an unclosed tool call becomes text. */
  end(): ChatEvent[] {
    if (this.#ended) return [];
    this.#drain(true);
    this.#ended = true;
    if (this.#ws !== "" && !this.#lastWasCall) this.#emit("text", this.#ws);
    this.#ws = "";
    return this.#take();
  }

  #take(): ChatEvent[] {
    const out = this.#out;
    this.#out = [];
    return out;
  }

  #emit(type: "text" | "thinking", text: string): void {
    if (text === "") return;
    const last = this.#out.at(-1);
    if (last !== undefined && last.type === type) last.text += text;
    else this.#out.push({ type, text });
  }

  /** Text mode output: trailing whitespace waits until it is known not to precede a tool call. */
  #text(s: string): void {
    if (s === "") return;
    const body = s.trimEnd();
    if (body === "") {
      this.#ws += s;
      return;
    }
    this.#emit("text", this.#ws + body);
    this.#ws = s.slice(body.length);
    this.#lastWasCall = false;
  }

  /** Thinking mode output: leading newlines are stripped, trailing ones wait for `</think>` or more text. */
  #thinking(s: string): void {
    if (this.#thinkFresh) {
      s = s.replace(/^\n+/, "");
      if (s === "") return;
      this.#thinkFresh = false;
    }
    const body = s.replace(/\n+$/, "");
    if (body === "") {
      this.#thinkNl += s;
      return;
    }
    this.#emit("thinking", this.#thinkNl + body);
    this.#thinkNl = s.slice(body.length);
  }

  #drain(final: boolean): void {
    for (;;) {
      switch (this.#mode) {
        case "start": {
          const t = this.#buf.trimStart();
          if (t.startsWith(THINK_OPEN)) {
            // A `<think>` the model wrote itself (hybrid Qwen3, or repeated after the prompt's): dropped.
            this.#buf = t.slice(THINK_OPEN.length);
            this.#mode = "thinking";
            continue;
          }
          if (!final && THINK_OPEN.startsWith(t)) return;
          this.#mode = this.#startInThinking ? "thinking" : "text";
          continue;
        }
        case "thinking": {
          const close = this.#buf.indexOf(THINK_CLOSE);
          if (close >= 0) {
            this.#thinking(this.#buf.slice(0, close));
            this.#thinkNl = "";
            this.#buf = this.#buf.slice(close + THINK_CLOSE.length);
            this.#mode = "text";
            this.#stripNewlines = true;
            continue;
          }
          const keep = final ? 0 : partialTagLength(this.#buf, THINK_CLOSE);
          this.#thinking(this.#buf.slice(0, this.#buf.length - keep));
          this.#buf = this.#buf.slice(this.#buf.length - keep);
          return;
        }
        case "text": {
          if (this.#stripNewlines) {
            this.#buf = this.#buf.replace(/^\n+/, "");
            if (this.#buf === "") return;
            this.#stripNewlines = false;
          }
          const open = this.#buf.indexOf(CALL_OPEN);
          if (open >= 0) {
            this.#text(this.#buf.slice(0, open));
            this.#wsBeforeCall = this.#ws;
            this.#ws = "";
            this.#buf = this.#buf.slice(open + CALL_OPEN.length);
            this.#mode = "call";
            continue;
          }
          const keep = final ? 0 : partialTagLength(this.#buf, CALL_OPEN);
          this.#text(this.#buf.slice(0, this.#buf.length - keep));
          this.#buf = this.#buf.slice(this.#buf.length - keep);
          return;
        }
        case "call": {
          // A long call arrives over many pushes: rescan only what could complete a tag.
          const from = Math.max(0, this.#callScanned - CALL_CLOSE.length + 1);
          const close = this.#buf.indexOf(CALL_CLOSE, from);
          const reopen = this.#buf.indexOf(CALL_OPEN, from);
          this.#callScanned = 0;
          if (reopen >= 0 && (close < 0 || reopen < close)) {
            // A new span opened before this one closed: this one is abandoned text.
            this.#malformed(CALL_OPEN + this.#buf.slice(0, reopen));
            this.#wsBeforeCall = this.#ws;
            this.#ws = "";
            this.#buf = this.#buf.slice(reopen + CALL_OPEN.length);
            continue;
          }
          if (close >= 0) {
            const body = this.#buf.slice(0, close);
            const call = parseToolCallBody(body, this.#tools);
            if (call === undefined) this.#malformed(CALL_OPEN + body + CALL_CLOSE);
            else {
              this.#out.push({ type: "tool_call", call });
              this.#lastWasCall = true;
            }
            this.#buf = this.#buf.slice(close + CALL_CLOSE.length);
            this.#mode = "text";
            continue;
          }
          if (final) {
            this.#malformed(CALL_OPEN + this.#buf);
            this.#buf = "";
            this.#mode = "text";
          } else this.#callScanned = this.#buf.length;
          return;
        }
        default: {
          const never: never = this.#mode;
          throw new Error(`Internal error: parser mode ${never}`);
        }
      }
    }
  }

  /** A span that is not a valid call goes out as text, with the whitespace that preceded it. */
  #malformed(raw: string): void {
    this.#ws = this.#wsBeforeCall;
    this.#wsBeforeCall = "";
    this.#text(raw);
  }
}

/**
 * Parses one complete model output (same rules and result as streaming it through
 * {@linkcode ChatStreamParser}).
 */
export function parseChatOutput(text: string, opts: ChatParseOptions = {}): ChatOutput {
  const p = new ChatStreamParser(opts);
  const out: ChatOutput = { content: "", reasoning: "", toolCalls: [] };
  for (const e of [...p.push(text), ...p.end()]) {
    if (e.type === "text") out.content += e.text;
    else if (e.type === "thinking") out.reasoning += e.text;
    else out.toolCalls.push(e.call);
  }
  return out;
}

/** Length of the longest proper prefix of `tag` that `buf` ends with (text that may still become `tag`). */
function partialTagLength(buf: string, tag: string): number {
  for (let k = Math.min(tag.length - 1, buf.length); k > 0; k--) {
    if (buf.endsWith(tag.slice(0, k))) return k;
  }
  return 0;
}

/**
 * Parses the text between `<tool_call>` and `</tool_call>`: Hermes JSON or Qwen3.5 XML (chosen by its first
 * non-blank character); `undefined` when it is neither.
 */
export function parseToolCallBody(body: string, tools: readonly ToolSpec[] = []): ParsedToolCall | undefined {
  const t = body.trim();
  if (t.startsWith("{")) return parseJsonCall(t);
  if (t.startsWith("<function=")) return parseXmlCall(t, tools);
  return undefined;
}

function isPlainObject(v: unknown): v is Record<string, unknown> {
  return typeof v === "object" && v !== null && !Array.isArray(v);
}

function tryJson(s: string): { ok: true; value: unknown } | { ok: false } {
  try {
    return { ok: true, value: JSON.parse(s) };
  } catch {
    // Not JSON: the caller falls back to another reading of the text.
    return { ok: false };
  }
}

function parseJsonCall(t: string): ParsedToolCall | undefined {
  const r = tryJson(t);
  if (!r.ok || !isPlainObject(r.value)) return undefined;
  const { name } = r.value;
  let args: unknown = r.value.arguments ?? r.value.parameters ?? {};
  if (typeof name !== "string" || name === "") return undefined;
  if (typeof args === "string") {
    const inner = tryJson(args);
    if (!inner.ok) return undefined;
    args = inner.value;
  }
  if (!isPlainObject(args)) return undefined;
  return { name, arguments: args, format: "json" };
}

const FUNCTION_HEAD = /^<function=([^>\n]+)>/;
const PARAM_HEAD = /^<parameter=([^>\n]+)>/;
const FUNCTION_END = "</function>";
const PARAM_END = "</parameter>";

function parseXmlCall(t: string, tools: readonly ToolSpec[]): ParsedToolCall | undefined {
  const head = FUNCTION_HEAD.exec(t);
  if (head === null || !t.endsWith(FUNCTION_END)) return undefined;
  const name = head[1]!.trim();
  if (name === "") return undefined;
  const props = toolProperties(tools, name);
  const args: Record<string, unknown> = {};
  let rest = t.slice(head[0].length, t.length - FUNCTION_END.length);
  for (;;) {
    rest = rest.trimStart();
    if (rest === "") break;
    const p = PARAM_HEAD.exec(rest);
    if (p === null) return undefined;
    const key = p[1]!.trim();
    rest = rest.slice(p[0].length);
    const end = rest.indexOf(PARAM_END);
    if (end < 0 || key === "" || Object.hasOwn(args, key)) return undefined;
    // The template writes `>\n` VALUE `\n</parameter>`: exactly one newline on each side is framing.
    let raw = rest.slice(0, end);
    if (raw.startsWith("\n")) raw = raw.slice(1);
    if (raw.endsWith("\n")) raw = raw.slice(0, -1);
    args[key] = convertParameter(raw, props?.[key]);
    rest = rest.slice(end + PARAM_END.length);
  }
  return { name, arguments: args, format: "xml" };
}

function toolProperties(tools: readonly ToolSpec[], name: string): Record<string, unknown> | undefined {
  const tool = tools.find((x) => x.function.name === name);
  const props = tool?.function.parameters?.properties;
  return isPlainObject(props) ? props : undefined;
}

const KNOWN_TYPES = ["string", "null", "boolean", "integer", "number", "object", "array"] as const;
type KnownType = (typeof KNOWN_TYPES)[number];

function schemaTypes(schema: unknown): KnownType[] {
  if (!isPlainObject(schema)) return [];
  const out: KnownType[] = [];
  const add = (t: unknown) => {
    if ((KNOWN_TYPES as readonly unknown[]).includes(t) && !out.includes(t as KnownType)) {
      out.push(t as KnownType);
    }
  };
  const { type } = schema;
  if (Array.isArray(type)) type.forEach(add);
  else add(type);
  for (const k of ["anyOf", "oneOf"]) {
    const alts = schema[k];
    if (Array.isArray(alts)) { for (const a of alts) schemaTypes(a).forEach(add); }
  }
  return out;
}

/**
 * Converts a raw XML-style parameter value to the JSON type its schema declares: `string` keeps the text;
 * `integer`, `number`, `boolean`, `null`, `object`, `array` parse it and keep the text when it does not fit;
 * with no schema, or only types not listed here, the text is parsed as JSON when it is JSON and kept otherwise
 * (spec/chat.md §6). Python spellings the Qwen3.5 template writes (`True`, `None`) are accepted where the
 * schema asks for a boolean or null. For a union, `string` wins except for a literal `null`/`None` when `null`
 * is allowed.
 * @param raw the value text without its framing newlines
 * @param schema the parameter's JSON schema (`properties[key]`), if known
 */
export function convertParameter(raw: string, schema: unknown): unknown {
  const types = schemaTypes(schema);
  const t = raw.trim();
  if (types.length === 0) {
    const r = tryJson(t);
    return r.ok ? r.value : raw;
  }
  if (types.includes("null") && (t === "null" || t === "None")) return null;
  if (types.includes("string")) return raw;
  for (const type of types) {
    const v = convertAs(type, t);
    if (v.ok) return v.value;
  }
  return raw;
}

function convertAs(type: KnownType, t: string): { ok: true; value: unknown } | { ok: false } {
  switch (type) {
    case "string":
      return { ok: true, value: t };
    case "null":
      return t === "null" || t === "None" ? { ok: true, value: null } : { ok: false };
    case "boolean": {
      const l = t.toLowerCase();
      return l === "true" || l === "false" ? { ok: true, value: l === "true" } : { ok: false };
    }
    case "integer": {
      const r = tryJson(t);
      return r.ok && typeof r.value === "number" && Number.isSafeInteger(r.value) ? r : { ok: false };
    }
    case "number": {
      const r = tryJson(t);
      return r.ok && typeof r.value === "number" ? r : { ok: false };
    }
    case "object": {
      const r = tryJson(t);
      return r.ok && isPlainObject(r.value) ? r : { ok: false };
    }
    case "array": {
      const r = tryJson(t);
      return r.ok && Array.isArray(r.value) ? r : { ok: false };
    }
    default: {
      const never: never = type;
      throw new Error(`Internal error: schema type ${never}`);
    }
  }
}
