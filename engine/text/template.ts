/**
 * Chat templates: renders a GGUF's `tokenizer.chat_template` (Jinja, through `@huggingface/jinja`) for a
 * typed conversation, and detects the generation cue and whether the model thinks (spec/chat.md §5, §6).
 *
 * @example
 * ```ts
 * import { openGguf } from "../gguf.ts";
 * import { ChatTemplate, renderChat } from "./template.ts";
 * const tpl = ChatTemplate.fromGguf((await openGguf("vocab-qwen3.gguf")).metadata);
 * const prompt = renderChat(tpl, {
 *   messages: [{ role: "user", content: "Hi" }],
 *   addGenerationPrompt: true,
 * }); // "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
 * tpl.kind; // "hybrid"
 * ```
 * @module
 */
import { Environment, Template } from "@huggingface/jinja";
import type { GgufMetadata } from "../gguf.ts";
import { KEYS } from "../names.ts";
import { QWEN35_TEMPLATE, QWEN3_TEMPLATE } from "./_builtin_templates.ts";
import { PyInterpreter } from "./_jinja.ts";
import type { PreTokenizerName } from "./tokenizer.ts";

export { QWEN35_TEMPLATE, QWEN3_TEMPLATE } from "./_builtin_templates.ts";

/**
 * Built-in template per pre-tokenizer (the vocabulary tells the model family apart), used when a GGUF
 * carries no `tokenizer.chat_template`: `qwen2` → Qwen3 (Qwen3-Next, spec/chat.md §5), `qwen35` → Qwen3.5 (§6).
 */
export const BUILTIN_TEMPLATES: Readonly<Record<PreTokenizerName, { name: string; source: string }>> = {
  qwen2: { name: "qwen3", source: QWEN3_TEMPLATE },
  qwen35: { name: "qwen35", source: QWEN35_TEMPLATE },
};

/** Roles a chat message may have. */
export type ChatRole = "system" | "user" | "assistant" | "tool";

/** A JSON Schema object as tools declare their parameters (only `type`/`properties` are read here). */
export type JsonSchema = { [key: string]: unknown };

/** One tool the model may call (OpenAI-style function tool; serialized whole into the prompt). */
export interface ToolSpec {
  /** Always `"function"`. */
  type: "function";
  /** The function's name, description and JSON Schema of its arguments. */
  function: { name: string; description?: string; parameters?: JsonSchema; [key: string]: unknown };
}

/** A tool call made by an assistant turn. */
export interface ChatToolCall {
  /** Client-visible call id (not rendered by the Qwen templates). */
  id?: string;
  /** Called function's name. */
  name: string;
  /** Arguments as an object, or as a JSON object text (parsed before rendering). */
  arguments: Record<string, unknown> | string;
}

/** One message of a conversation. */
export interface ChatMessage {
  /** Who speaks. */
  role: ChatRole;
  /** Text of the message; `null` (an assistant turn with only tool calls) renders as `""`. */
  content: string | null;
  /** Assistant reasoning of this turn (rendered inside `<think>` where the template keeps it). */
  reasoningContent?: string;
  /** Tool calls of an assistant turn. */
  toolCalls?: ChatToolCall[];
  /** For `tool` messages: the id of the call answered (not rendered by the Qwen templates). */
  toolCallId?: string;
}

/** What {@linkcode renderChat} renders. */
export interface ChatRenderRequest {
  /** The conversation, oldest first. */
  messages: readonly ChatMessage[];
  /** Tools offered to the model; absent or empty means no tool header. */
  tools?: readonly ToolSpec[];
  /** Append the assistant generation cue (default false). */
  addGenerationPrompt?: boolean;
  /** Passed to the template as `enable_thinking` when set; left undefined otherwise. */
  enableThinking?: boolean;
}

/**
 * How the model thinks, detected from its generation cue:
 * `instruct` never opens a think block; `thinking` opens one whatever `enable_thinking` says
 * (Qwen3-Next-Thinking); `hybrid` changes its cue with `enable_thinking` (Qwen3, Qwen3.5).
 */
export type ModelKind = "instruct" | "thinking" | "hybrid";

/** Stable codes of {@linkcode ChatTemplateError}. */
export type ChatTemplateErrorCode = "syntax" | "render" | "rejected" | "bad_request";

/**
 * A chat template failed: `syntax` (does not parse), `render` (the interpreter failed on it), `rejected`
 * (the template raised an exception on purpose, e.g. "System message must be at the beginning": a client
 * error), `bad_request` (the typed request itself is unusable, e.g. tool arguments that are not JSON).
 */
export class ChatTemplateError extends Error {
  /** Stable machine-readable reason. */
  readonly code: ChatTemplateErrorCode;

  /**
   * Creates the error.
   * @param code stable reason
   * @param message full human message
   * @param opts cause
   */
  constructor(code: ChatTemplateErrorCode, message: string, opts?: { cause?: unknown }) {
    super(message, opts);
    this.name = "ChatTemplateError";
    this.code = code;
  }
}

/** Marks an exception raised by the template's own `raise_exception(...)`. */
class Raised extends Error {}

/**
 * Globals of `@huggingface/jinja`'s own `setupGlobals` (0.5.11), except that `raise_exception` throws
 * {@linkcode Raised} and `strftime_now` is left out (no Qwen template reads the clock; a template that does
 * fails with a render error naming it).
 */
const GLOBALS: Readonly<Record<string, unknown>> = {
  false: false,
  true: true,
  none: null,
  False: false,
  True: true,
  None: null,
  raise_exception: (msg: unknown) => {
    throw new Raised(String(msg));
  },
  range: (start: number, stop?: number, step = 1): number[] => {
    const [lo, hi] = stop === undefined ? [0, start] : [start, stop];
    if (step === 0) throw new RangeError("range() step must not be zero");
    const out: number[] = [];
    for (let i = lo; step > 0 ? i < hi : i > hi; i += step) out.push(i);
    return out;
  },
};

const THINK_OPEN = "<think>";
const THINK_CLOSE = "</think>";

/**
 * True when `prompt` ends inside an open think block (its last `<think>` is not closed), so generated text
 * starts as reasoning.
 */
export function opensThinking(prompt: string): boolean {
  return prompt.lastIndexOf(THINK_OPEN) > prompt.lastIndexOf(THINK_CLOSE);
}

/** A parsed chat template with its detected generation cue and model kind. */
export class ChatTemplate {
  /** The Jinja source. */
  readonly source: string;
  /** Where the source came from, for messages: `"<path> tokenizer.chat_template"` or `"built-in qwen35"`. */
  readonly origin: string;
  /** True when the built-in template is used because the file carries none. */
  readonly builtin: boolean;
  /** Detected model kind. */
  readonly kind: ModelKind;
  #template: Template;
  #cues = new Map<boolean | undefined, string>();

  /**
   * Parses a template and detects its cue.
   * @throws {ChatTemplateError} `syntax` when it does not parse; `render` when it cannot render one user message
   */
  constructor(source: string, opts: { origin?: string; builtin?: boolean } = {}) {
    this.source = source;
    this.origin = opts.origin ?? "chat template";
    this.builtin = opts.builtin ?? false;
    try {
      this.#template = new Template(source);
    } catch (e) {
      const why = errText(e);
      throw new ChatTemplateError(
        "syntax",
        `Chat template (${this.origin}) does not parse: ${why}: fix the template or re-export the GGUF with a ` +
          `valid ${KEYS.chatTemplate}`,
        { cause: e },
      );
    }
    const on = this.generationCue({ enableThinking: true });
    const off = this.generationCue({ enableThinking: false });
    const dflt = this.generationCue();
    if (on === off && dflt === on) this.kind = opensThinking(dflt) ? "thinking" : "instruct";
    else this.kind = "hybrid";
  }

  /**
   * The template from the GGUF's `tokenizer.chat_template`, or when the key is absent the built-in one for its
   * pre-tokenizer ({@linkcode BUILTIN_TEMPLATES}; Qwen3 when that is absent or unknown too).
   * @throws {GgufError} when the key holds something other than a string
   * @throws {ChatTemplateError} when the template does not parse or cannot render a single user message
   */
  static fromGguf(meta: GgufMetadata): ChatTemplate {
    if (!meta.has(KEYS.chatTemplate)) {
      const pre = meta.getString(KEYS.tokPre, "qwen2");
      const b = Object.hasOwn(BUILTIN_TEMPLATES, pre)
        ? BUILTIN_TEMPLATES[pre as PreTokenizerName]
        : BUILTIN_TEMPLATES.qwen2;
      return new ChatTemplate(b.source, { origin: `built-in ${b.name}`, builtin: true });
    }
    return new ChatTemplate(meta.getString(KEYS.chatTemplate), {
      origin: `${meta.path} ${KEYS.chatTemplate}`,
    });
  }

  /**
   * The text the template appends for `add_generation_prompt` (e.g. `<|im_start|>assistant\n<think>\n`),
   * found as the difference between rendering one user message with and without it.
   * @throws {ChatTemplateError} when the template cannot render one user message or the cue is not an append
   */
  generationCue(opts: { enableThinking?: boolean } = {}): string {
    const cached = this.#cues.get(opts.enableThinking);
    if (cached !== undefined) return cached;
    const messages: ChatMessage[] = [{ role: "user", content: "Hi" }];
    const base = this.render({ messages, enableThinking: opts.enableThinking });
    const full = this.render({ messages, addGenerationPrompt: true, enableThinking: opts.enableThinking });
    if (!full.startsWith(base)) {
      const [got, without] = [JSON.stringify(full), JSON.stringify(base)];
      throw new ChatTemplateError(
        "render",
        `Chat template (${this.origin}) does not append its generation prompt: with add_generation_prompt it ` +
          `renders ${got}, which does not start with ${without} (the render without it): use a template whose ` +
          `generation prompt is a suffix`,
      );
    }
    const cue = full.slice(base.length);
    this.#cues.set(opts.enableThinking, cue);
    return cue;
  }

  /**
   * Renders a conversation to prompt text (control tokens as text; tokenize with special parsing on).
   * @throws {ChatTemplateError} `rejected` when the template raises on the request (a client error),
   *   `bad_request` for unusable tool-call arguments, `render` when the interpreter fails
   */
  render(req: ChatRenderRequest): string {
    const context: Record<string, unknown> = {
      messages: req.messages.map(toTemplateMessage),
      add_generation_prompt: req.addGenerationPrompt ?? false,
    };
    if (req.tools !== undefined && req.tools.length > 0) context.tools = req.tools;
    if (req.enableThinking !== undefined) context.enable_thinking = req.enableThinking;
    try {
      // Template.render() installs a raise_exception that throws a plain Error, indistinguishable from an
      // interpreter failure; this environment carries the same globals with one that is recognizable.
      const env = new Environment();
      for (const [k, v] of Object.entries(GLOBALS)) env.set(k, v);
      for (const [k, v] of Object.entries(context)) env.set(k, v);
      const out = new PyInterpreter(env).run(this.#template.parsed);
      if (typeof out.value !== "string") {
        throw new TypeError(`the template evaluated to a ${out.type}, expected a string`);
      }
      return out.value;
    } catch (e) {
      if (e instanceof Raised) {
        throw new ChatTemplateError(
          "rejected",
          `Chat template (${this.origin}) rejected the conversation: ${e.message.replace(/\.$/, "")}: ` +
            `fix the request`,
        );
      }
      throw new ChatTemplateError(
        "render",
        `Chat template (${this.origin}) failed to render a conversation of ${req.messages.length} ` +
          `message(s): ${errText(e)}: ` +
          `the template uses something the interpreter does not support or expects other message fields`,
        { cause: e },
      );
    }
  }
}

/**
 * Renders `req` with `template` (see {@linkcode ChatTemplate.render}).
 * @throws {ChatTemplateError} when the template rejects the request or fails
 */
export function renderChat(template: ChatTemplate, req: ChatRenderRequest): string {
  return template.render(req);
}

function errText(e: unknown): string {
  return e instanceof Error ? e.message : String(e);
}

/** Converts a typed message to the dict shape HF chat templates read (snake_case, OpenAI tool calls). */
function toTemplateMessage(m: ChatMessage, index: number): Record<string, unknown> {
  const out: Record<string, unknown> = { role: m.role, content: m.content ?? "" };
  if (m.reasoningContent !== undefined) out.reasoning_content = m.reasoningContent;
  if (m.toolCallId !== undefined) out.tool_call_id = m.toolCallId;
  if (m.toolCalls !== undefined && m.toolCalls.length > 0) {
    out.tool_calls = m.toolCalls.map((c, k) => ({
      type: "function",
      ...(c.id === undefined ? {} : { id: c.id }),
      function: { name: c.name, arguments: argumentsObject(c, index, k) },
    }));
  }
  return out;
}

/**
 * Tool-call arguments as an object: the Qwen3.5 template iterates them, and the Qwen3 one re-serializes
 * them in the spacing the model was trained on.
 */
function argumentsObject(c: ChatToolCall, index: number, k: number): Record<string, unknown> {
  if (typeof c.arguments !== "string") return c.arguments;
  let parsed: unknown;
  try {
    parsed = JSON.parse(c.arguments);
  } catch (e) {
    throw new ChatTemplateError(
      "bad_request",
      `messages[${index}].tool_calls[${k}] (${c.name}) has arguments that are not JSON: ${errText(e)}: ` +
        `send the arguments as a JSON object text`,
      { cause: e },
    );
  }
  if (typeof parsed !== "object" || parsed === null || Array.isArray(parsed)) {
    throw new ChatTemplateError(
      "bad_request",
      `messages[${index}].tool_calls[${k}] (${c.name}) has arguments ${
        c.arguments.slice(0, 40)
      }, expected a ` +
        `JSON object: send the arguments as an object`,
    );
  }
  return parsed as Record<string, unknown>;
}
