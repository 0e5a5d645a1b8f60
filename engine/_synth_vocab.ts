/**
 * Byte-level BPE vocabularies and chat templates for synthesized models (spec `chat.md` §2-§3): 256 byte
 * tokens in GPT-2 byte-to-unicode form (byte b at id b, as in the llama.cpp fixtures), merges learned on a
 * small built-in corpus and then generated to fill, and the Qwen special tokens at their real ids.
 * @module
 */
import { QWEN35_TEMPLATE } from "./text/_builtin_templates.ts";
import { RandomState } from "./quant/random.ts";

/** ggml token types (`tokenizer.ggml.token_type`, spec `chat.md` §2). */
const NORMAL = 1, CONTROL = 3, USER_DEFINED = 4, UNUSED = 5;

/** A generated vocabulary: parallel token and type arrays, merges by rank, and the special ids. */
export interface SynthVocab {
  /** Token texts, id order. */
  readonly tokens: string[];
  /** Token types, id order. */
  readonly types: Int32Array;
  /** Merges `"left right"`, rank order. */
  readonly merges: string[];
  /** `<|endoftext|>`: bos and padding id. */
  readonly bos: number;
  /** `<|im_end|>`: end of turn. */
  readonly eos: number;
  /** Padding id. */
  readonly pad: number;
}

/** How the special tokens are laid out. */
export type SpecialSet =
  /** The fixture layout: `<|endoftext|>`, `<|im_start|>`, `<|im_end|>` as the last three ids. */
  | { readonly kind: "tiny" }
  /** The real Qwen layout: 26 specials from `base` (spec `chat.md` §3), `[PADn]` UNUSED tokens after them. */
  | { readonly kind: "qwen"; readonly base: number; readonly pad: number };

/** Specials of the Qwen3 / Qwen3.5 vocabularies in id order from their base (spec `chat.md` §3). */
const QWEN_SPECIALS = [
  "<|endoftext|>",
  "<|im_start|>",
  "<|im_end|>",
  "<|object_ref_start|>",
  "<|object_ref_end|>",
  "<|box_start|>",
  "<|box_end|>",
  "<|quad_start|>",
  "<|quad_end|>",
  "<|vision_start|>",
  "<|vision_end|>",
  "<|vision_pad|>",
  "<|image_pad|>",
  "<|video_pad|>",
  "<tool_call>",
  "</tool_call>",
  "<|fim_prefix|>",
  "<|fim_middle|>",
  "<|fim_suffix|>",
  "<|fim_pad|>",
  "<|repo_name|>",
  "<|file_sep|>",
  "<tool_response>",
  "</tool_response>",
  "<think>",
  "</think>",
] as const;

/** The GPT-2 byte-to-unicode character of byte `b` (spec `chat.md` §4.1 step 4). */
export function byteChar(b: number): string {
  return String.fromCharCode(BYTE_CODE_POINTS[b]!);
}

const BYTE_CODE_POINTS: Uint16Array = (() => {
  const out = new Uint16Array(256);
  let next = 256; // the 68 non-printable bytes, in increasing order, take 256..323
  for (let b = 0; b < 256; b++) {
    const printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
    out[b] = printable ? b : next++;
  }
  return out;
})();

/** Text the merges are learned on: plain English prose, digits and a little code, so BPE finds real words. */
const CORPUS =
  `The quick brown fox jumps over the lazy dog. The dog was not amused, and the fox ran away into the
woods. In the morning the sun rose over the hills and the birds began to sing. A small model learns to
predict the next token from the tokens before it. The tokenizer splits the text into pieces, and the model
reads them one at a time. Hello world! How are you today? I am fine, thank you. What is the weather like?
It is sunny and warm, with a light wind from the west. There are 365 days in a year and 24 hours in a day.
The answer is 42. Please write a function that returns the sum of two numbers.
function add(a, b) { return a + b; }
const x = add(1, 2); console.log(x);
The system prompt tells the assistant what to do. The user asks a question and the assistant answers it.
When the assistant needs a tool, it writes a tool call, and the result comes back as a tool response.
Then it continues the answer. The conversation goes on until the user is satisfied or the context is full.
This is a test of the emergency broadcast system. This is only a test. Thank you for your attention.
Once upon a time there was a little girl who lived in a village near the forest. Whenever she went out,
the little girl wore a red riding cloak, so everyone in the village called her Little Red Riding Hood.
One morning she asked her mother if she could go to visit her grandmother, as it had been a while since
they had seen each other. That is a good idea, her mother said. So they packed a nice basket for her.
`;

/** Pre-tokenizer used for learning merges only (a simplification of the qwen2 regex of `chat.md` §4.1). */
const WORD = / ?\p{L}+| ?\p{N}| ?[^\s\p{L}\p{N}]+|\s+/gu;

/** Learns up to `budget` merges on {@linkcode CORPUS}: most frequent adjacent pair first, ties by text. */
function learnMerges(budget: number): [string, string][] {
  const enc = new TextEncoder();
  const words = new Map<string, { syms: string[]; n: number }>();
  for (const m of CORPUS.matchAll(WORD)) {
    const w = words.get(m[0]);
    if (w) w.n++;
    else words.set(m[0], { syms: [...enc.encode(m[0])].map(byteChar), n: 1 });
  }
  const out: [string, string][] = [];
  while (out.length < budget) {
    const counts = new Map<string, number>();
    for (const { syms, n } of words.values()) {
      for (let i = 0; i + 1 < syms.length; i++) {
        const key = `${syms[i]} ${syms[i + 1]}`;
        counts.set(key, (counts.get(key) ?? 0) + n);
      }
    }
    let best: string | undefined, bestN = 1; // a pair seen once is not worth a merge
    for (const [key, n] of counts) {
      if (n > bestN || (n === bestN && best !== undefined && key < best)) [best, bestN] = [key, n];
    }
    if (best === undefined) break;
    const [a, b] = best.split(" ") as [string, string];
    out.push([a, b]);
    for (const w of words.values()) {
      const s = w.syms;
      for (let i = 0; i + 1 < s.length; i++) {
        if (s[i] === a && s[i + 1] === b) s.splice(i, 2, a + b);
      }
    }
  }
  return out;
}

/**
 * A vocabulary of exactly `nVocab` tokens: bytes, learned then generated merges, and the specials.
 * Generated merges extend existing tokens by one common character, breadth first, so every merge's parts
 * are tokens and every merge result is new; the result is deterministic in `seed`.
 * @throws {RangeError} when `nVocab` cannot hold the bytes and the specials
 */
export function synthVocab(nVocab: number, specials: SpecialSet, seed: number): SynthVocab {
  const nSpecial = specials.kind === "tiny" ? 3 : QWEN_SPECIALS.length;
  const specialBase = specials.kind === "tiny" ? nVocab - 3 : specials.base;
  if (specialBase < 256 || specialBase + nSpecial > nVocab) {
    throw new RangeError(
      `A vocabulary of ${nVocab} tokens cannot hold 256 bytes and ${nSpecial} specials at ${specialBase}`,
    );
  }
  const tokens: string[] = [];
  for (let b = 0; b < 256; b++) tokens.push(byteChar(b));
  const known = new Set(tokens);
  const merges: string[] = [];
  const addMerge = (a: string, b: string): boolean => {
    const t = a + b;
    if (known.has(t)) return false;
    known.add(t);
    tokens.push(t);
    merges.push(`${a} ${b}`);
    return true;
  };
  const nMerges = specialBase - 256;
  for (const [a, b] of learnMerges(Math.min(nMerges, 4000))) addMerge(a, b);

  // Fill: tokens (in id order) extended by one character of a shuffled common alphabet.
  const rs = new RandomState(seed ^ 0x5eed);
  const alphabet = [..."etaoinshrdlucmfwypvbgkqjxzETAOINSHRDLUCMFWYPVBGKQJXZ0123456789.,-_'"].map((c) =>
    byteChar(c.charCodeAt(0))
  );
  alphabet.push(byteChar(0x20));
  for (let i = alphabet.length - 1; i > 0; i--) {
    const j = rs.nextU32() % (i + 1);
    [alphabet[i], alphabet[j]] = [alphabet[j]!, alphabet[i]!];
  }
  const common = new Set(alphabet);
  for (let i = 0; merges.length < nMerges; i++) {
    const base = tokens[i]!;
    // Only extend tokens made of common characters: no merges on control bytes or raw UTF-8 pieces.
    if (![...base].every((c) => common.has(c))) continue;
    for (const c of alphabet) {
      if (merges.length >= nMerges) break;
      addMerge(base, c);
    }
  }

  const types = new Int32Array(nVocab).fill(NORMAL);
  if (specials.kind === "tiny") {
    tokens.push("<|endoftext|>", "<|im_start|>", "<|im_end|>");
    types.fill(CONTROL, specialBase);
    return { tokens, types, merges, bos: specialBase, eos: specialBase + 2, pad: specialBase };
  }
  for (const s of QWEN_SPECIALS) {
    types[tokens.length] = s.startsWith("<|") ? CONTROL : USER_DEFINED;
    tokens.push(s);
  }
  while (tokens.length < nVocab) {
    types[tokens.length] = UNUSED;
    tokens.push(`[PAD${tokens.length}]`);
  }
  return { tokens, types, merges, bos: specialBase, eos: specialBase + 2, pad: specials.pad };
}

/**
 * A ChatML template in the style of the Qwen3‑Next Instruct template (spec `chat.md` §5.1-§5.2: system
 * header, Hermes JSON tool calls, tool responses folded into user turns). Synthetic: rendered text follows
 * the spec's rules, the Jinja source is not the published one.
 */
export const TEMPLATE_QWEN3NEXT = `{%- if tools %}
{{- '<|im_start|>system\\n' }}
{%- if messages[0].role == 'system' %}{{- messages[0].content + '\\n\\n' }}{%- endif %}
{{- "# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\nYou are provided with function signatures within <tools></tools> XML tags:\\n<tools>" }}
{%- for tool in tools %}{{- "\\n" }}{{- tool | tojson }}{%- endfor %}
{{- "\\n</tools>\\n\\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\\n<tool_call>\\n{\\"name\\": <function-name>, \\"arguments\\": <args-json-object>}\\n</tool_call><|im_end|>\\n" }}
{%- elif messages[0].role == 'system' %}
{{- '<|im_start|>system\\n' + messages[0].content + '<|im_end|>\\n' }}
{%- endif %}
{%- for message in messages %}
{%- set content = message.content if message.content is string else '' %}
{%- if message.role == 'user' or (message.role == 'system' and not loop.first) %}
{{- '<|im_start|>' + message.role + '\\n' + content + '<|im_end|>\\n' }}
{%- elif message.role == 'assistant' %}
{{- '<|im_start|>assistant\\n' + content }}
{%- if message.tool_calls %}
{%- for tool_call in message.tool_calls %}
{%- if (loop.first and content) or (not loop.first) %}{{- '\\n' }}{%- endif %}
{%- if tool_call.function %}{%- set tool_call = tool_call.function %}{%- endif %}
{{- '<tool_call>\\n{"name": "' + tool_call.name + '", "arguments": ' }}
{%- if tool_call.arguments is string %}{{- tool_call.arguments }}{%- else %}{{- tool_call.arguments | tojson }}{%- endif %}
{{- '}\\n</tool_call>' }}
{%- endfor %}
{%- endif %}
{{- '<|im_end|>\\n' }}
{%- elif message.role == 'tool' %}
{%- if loop.first or (messages[loop.index0 - 1].role != 'tool') %}{{- '<|im_start|>user' }}{%- endif %}
{{- '\\n<tool_response>\\n' + content + '\\n</tool_response>' }}
{%- if loop.last or (messages[loop.index0 + 1].role != 'tool') %}{{- '<|im_end|>\\n' }}{%- endif %}
{%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}
`;

/**
 * The chat template of the synthesized qwen35moe models: the built-in Qwen3.5 template (written from spec
 * `chat.md` §6; it renders as the published template does), so the default model renders `tools`, tool
 * calls and tool results as the real model's file does (an earlier synthetic template dropped `tools`).
 */
export const TEMPLATE_QWEN35: string = QWEN35_TEMPLATE;
