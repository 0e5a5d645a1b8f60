/**
 * The tokenizer of a GGUF model, built from its own `tokenizer.ggml.*` metadata (spec `chat.md` §1-4, §7):
 * GPT-2 byte-level BPE with the `qwen2` and `qwen35` pre-tokenizers, added-token matching, decoding and a
 * streaming decoder that never emits half a character.
 *
 * Written in-house rather than taken from a library: `@huggingface/tokenizers`-style libraries load a
 * `tokenizer.json`, while a GGUF carries the raw token list, token types and ranked merges; turning those
 * into a `tokenizer.json` would re-encode the same data only to parse it again, and the algorithm itself
 * (one regex, a byte table and rank-ordered merges) is small. No dependency was needed.
 *
 * Text conventions: input strings are UTF-16; a lone surrogate cannot be UTF-8 encoded and becomes U+FFFD
 * (as `TextEncoder` does), so `decode(encode(s)) === s` holds exactly for well-formed strings (for `qwen35`:
 * for NFC strings). Invalid UTF-8 produced by decoding an arbitrary id sequence becomes U+FFFD.
 *
 * @example
 * ```ts
 * import { openGguf } from "../gguf.ts";
 * import { Tokenizer } from "./tokenizer.ts";
 * const gguf = await openGguf("vocab-qwen3.gguf");
 * const tok = Tokenizer.fromGguf(gguf.metadata);
 * tok.encode("Hello world"); // [9707, 1879]
 * ```
 * @module
 */
import { GgufError } from "../errors.ts";
import type { GgufMetadata } from "../gguf.ts";
import { KEYS } from "../names.ts";
import { byteLevelBytes } from "./_byte_level.ts";
import { Bpe } from "./_bpe.ts";
import {
  isPreTokenizerName,
  PRE_TOKENIZERS,
  type PreTokenizer,
  type PreTokenizerName,
} from "./_pre_tokenizer.ts";

export { PRE_TOKENIZERS, type PreTokenizerName } from "./_pre_tokenizer.ts";

/** Values of `tokenizer.ggml.token_type` (llama.cpp `llama_token_type`). */
export const TOKEN_TYPE = {
  normal: 1,
  unknown: 2,
  control: 3,
  userDefined: 4,
  unused: 5,
  byte: 6,
} as const;

/** A token type value. */
export type TokenType = (typeof TOKEN_TYPE)[keyof typeof TOKEN_TYPE];

/** Supported `tokenizer.ggml.model` values. */
const MODELS = ["gpt2"] as const;

/**
 * Texts that end generation wherever they are tokens (spec `chat.md` §7, llama.cpp's EOG detection).
 */
const EOG_TEXTS = [
  "<|im_end|>",
  "<|endoftext|>",
  "<|eot_id|>",
  "<|end|>",
  "<end_of_turn>",
  "<|eom_id|>",
  "<EOT>",
  "<|fim_pad|>",
  "<|repo_name|>",
  "<|file_sep|>",
] as const;

/** A vocabulary as stored in GGUF metadata, for {@linkcode Tokenizer.fromVocab}. */
export interface TokenizerVocab {
  /** `tokenizer.ggml.model`; only `"gpt2"` (byte-level BPE) is supported. */
  readonly model: string;
  /** `tokenizer.ggml.pre`: a key of {@linkcode PRE_TOKENIZERS}. */
  readonly pre: string;
  /** Token texts by id (byte-level alphabet for normal tokens, raw text for added tokens). */
  readonly tokens: readonly string[];
  /** Token types by id ({@linkcode TOKEN_TYPE}); absent means all normal. */
  readonly tokenTypes?: ArrayLike<number>;
  /** `"left right"` merges; rank = index. */
  readonly merges: readonly string[];
  /** End-of-sequence id. */
  readonly eosId?: number;
  /** Beginning-of-sequence id. */
  readonly bosId?: number;
  /** Padding id. */
  readonly padId?: number;
  /** End-of-turn id (llama.cpp `eot_token_id`), part of the end-of-generation set. */
  readonly eotId?: number;
  /** End-of-message id (llama.cpp `eom_token_id`), part of the end-of-generation set. */
  readonly eomId?: number;
  /** Whether callers should prepend BOS (`tokenizer.ggml.add_bos_token`; false for Qwen). */
  readonly addBos?: boolean;
}

/** Options of {@linkcode Tokenizer.encode}. */
export interface EncodeOptions {
  /**
   * Recognize CONTROL (and UNKNOWN) token texts such as `<|im_start|>` as their ids (default false).
   * Leave it off for user content (spec §4.1 step 1); USER_DEFINED tokens (`<think>`, `<tool_call>` ...)
   * are recognized either way.
   */
  readonly parseSpecial?: boolean;
}

/** Options of {@linkcode Tokenizer.decode} and {@linkcode Tokenizer.incrementalDecoder}. */
export interface DecodeOptions {
  /**
   * Render CONTROL, UNKNOWN and UNUSED tokens as nothing instead of their literal text (default false).
   * USER_DEFINED tokens are content (`<think>`) and are always rendered.
   */
  readonly skipControl?: boolean;
}

const UTF8 = new TextEncoder();
const REEXPORT = "the tokenizer metadata is inconsistent: re-export the GGUF with a current llama.cpp";

/** Builds the error for a malformed vocabulary (GgufError for a file, RangeError for an in-memory vocab). */
type Fail = (msg: string, cause?: unknown) => Error;

/** Byte-level BPE tokenizer of one vocabulary. */
export class Tokenizer {
  /** Number of tokens (ids are 0..nVocab-1). */
  readonly nVocab: number;
  /** The pre-tokenizer name (`tokenizer.ggml.pre`). */
  readonly pre: PreTokenizerName;
  /** End-of-sequence id, when the vocabulary names one. */
  readonly eosId: number | undefined;
  /** Beginning-of-sequence id, when the vocabulary names one. */
  readonly bosId: number | undefined;
  /** Padding id, when the vocabulary names one. */
  readonly padId: number | undefined;
  /** Whether BOS should be prepended (never done by {@linkcode encode}; the chat template decides). */
  readonly addBos: boolean;
  /** End-of-generation ids: eos, eot, eom, and every token with an EOG text (spec §7). */
  readonly eogIds: ReadonlySet<number>;

  readonly #tokens: readonly string[];
  readonly #types: Uint8Array;
  readonly #ids: ReadonlyMap<string, number>;
  readonly #preTokenizer: PreTokenizer;
  readonly #bpe: Bpe;
  /** Concatenated decode bytes of every token; token i is #pool[#offsets[i]..#offsets[i+1]]. */
  readonly #pool: Uint8Array;
  readonly #offsets: Uint32Array;
  /** Matches USER_DEFINED texts; with `All`, also CONTROL and UNKNOWN texts. Undefined when none exist. */
  readonly #specialUser: RegExp | undefined;
  readonly #specialAll: RegExp | undefined;
  /** Matches CONTROL and UNKNOWN texts only (what {@linkcode defuse} marks). */
  readonly #specialControl: RegExp | undefined;
  readonly #specialIds = new Map<string, number>();

  /** Use {@linkcode Tokenizer.fromGguf} or {@linkcode Tokenizer.fromVocab}. */
  private constructor(vocab: TokenizerVocab, pre: PreTokenizerName, fail: Fail) {
    const n = vocab.tokens.length;
    this.nVocab = n;
    this.pre = pre;
    this.#preTokenizer = PRE_TOKENIZERS[pre];
    this.#tokens = vocab.tokens;

    this.#types = new Uint8Array(n).fill(TOKEN_TYPE.normal);
    if (vocab.tokenTypes !== undefined) {
      if (vocab.tokenTypes.length !== n) {
        throw fail(
          `${KEYS.tokTypes} has ${vocab.tokenTypes.length} entries but ${KEYS.tokTokens} has ${n}: ${REEXPORT}`,
        );
      }
      for (let i = 0; i < n; i++) {
        const t = vocab.tokenTypes[i]!;
        if (!Number.isInteger(t) || t < TOKEN_TYPE.normal || t > TOKEN_TYPE.byte) {
          throw fail(`${KEYS.tokTypes}[${i}] is ${t}, expected a token type 1..6: ${REEXPORT}`);
        }
        this.#types[i] = t;
      }
    }

    const ids = new Map<string, number>();
    for (let i = 0; i < n; i++) {
      // Duplicate texts: the first id wins (lookups by text must be deterministic).
      if (!ids.has(vocab.tokens[i]!)) ids.set(vocab.tokens[i]!, i);
    }
    this.#ids = ids;

    const checkId = (what: string, id: number | undefined): number | undefined => {
      if (id !== undefined && !(Number.isInteger(id) && id >= 0 && id < n)) {
        throw fail(`${what} is ${id}, outside the vocabulary of ${n} tokens: ${REEXPORT}`);
      }
      return id;
    };
    this.eosId = checkId(KEYS.tokEos, vocab.eosId);
    this.bosId = checkId(KEYS.tokBos, vocab.bosId);
    this.padId = checkId(KEYS.tokPad, vocab.padId);
    this.addBos = vocab.addBos ?? false;
    const eog = new Set<number>();
    for (const id of [this.eosId, checkId(KEYS.tokEot, vocab.eotId), checkId(KEYS.tokEom, vocab.eomId)]) {
      if (id !== undefined) eog.add(id);
    }
    for (const text of EOG_TEXTS) {
      const id = ids.get(text);
      if (id !== undefined) eog.add(id);
    }
    this.eogIds = eog;

    try {
      this.#bpe = new Bpe(ids, n, vocab.merges);
    } catch (e) {
      throw fail(`${e instanceof Error ? e.message : String(e)}: ${REEXPORT}`, e);
    }

    // Decode bytes: normal tokens through the inverse byte-level map, added tokens as their raw UTF-8.
    const chunks: Uint8Array[] = new Array(n);
    let total = 0;
    for (let i = 0; i < n; i++) {
      const b = this.#decodeBytesOf(i);
      chunks[i] = b;
      total += b.length;
    }
    this.#pool = new Uint8Array(total);
    this.#offsets = new Uint32Array(n + 1);
    for (let i = 0, at = 0; i < n; i++) {
      this.#pool.set(chunks[i]!, at);
      at += chunks[i]!.length;
      this.#offsets[i + 1] = at;
    }

    const user: string[] = [];
    const all: string[] = [];
    const control: string[] = [];
    for (let i = 0; i < n; i++) {
      const t = this.#types[i]!;
      if (t !== TOKEN_TYPE.userDefined && t !== TOKEN_TYPE.control && t !== TOKEN_TYPE.unknown) continue;
      const text = vocab.tokens[i]!;
      if (text === "" || this.#specialIds.has(text)) continue;
      this.#specialIds.set(text, i);
      all.push(text);
      if (t === TOKEN_TYPE.userDefined) user.push(text);
      else control.push(text);
    }
    this.#specialUser = alternation(user);
    this.#specialAll = alternation(all);
    this.#specialControl = alternation(control);
  }

  /**
   * Builds the tokenizer from a GGUF's metadata (a vocabulary-only GGUF is enough).
   * @throws {GgufError} `bad_value` when a tokenizer key is missing or malformed, or the tokenizer model or
   *   pre-tokenizer is not supported
   */
  static fromGguf(meta: GgufMetadata): Tokenizer {
    const optInt = (key: string): number | undefined => meta.has(key) ? meta.getInt(key) : undefined;
    const vocab: TokenizerVocab = {
      model: meta.getString(KEYS.tokModel),
      pre: meta.getString(KEYS.tokPre),
      tokens: meta.getStringArray(KEYS.tokTokens),
      tokenTypes: meta.has(KEYS.tokTypes) ? meta.getIntArray(KEYS.tokTypes) : undefined,
      merges: meta.getStringArray(KEYS.tokMerges),
      eosId: optInt(KEYS.tokEos),
      bosId: optInt(KEYS.tokBos),
      padId: optInt(KEYS.tokPad),
      eotId: optInt(KEYS.tokEot),
      eomId: optInt(KEYS.tokEom),
      addBos: meta.has(KEYS.tokAddBos) ? meta.getBool(KEYS.tokAddBos) : undefined,
    };
    return Tokenizer.#build(
      vocab,
      (msg, cause) =>
        new GgufError("bad_value", `Tokenizer in ${meta.path}: ${msg}`, { path: meta.path, cause }),
    );
  }

  /**
   * Builds the tokenizer from an in-memory vocabulary (tests, tools).
   * @throws {RangeError} when the vocabulary is malformed or its model or pre-tokenizer is not supported
   */
  static fromVocab(vocab: TokenizerVocab): Tokenizer {
    return Tokenizer.#build(
      vocab,
      (msg, cause) => new RangeError(`Tokenizer: ${msg}`, cause === undefined ? undefined : { cause }),
    );
  }

  static #build(vocab: TokenizerVocab, fail: Fail): Tokenizer {
    if (!(MODELS as readonly string[]).includes(vocab.model)) {
      throw fail(
        `${KEYS.tokModel} is "${vocab.model}" but only ${MODELS.map((m) => `"${m}"`).join(", ")} ` +
          `(byte-level BPE) is supported: use a Qwen3-Next or Qwen3.5 GGUF`,
      );
    }
    if (!isPreTokenizerName(vocab.pre)) {
      throw fail(
        `${KEYS.tokPre} is "${vocab.pre}" but only ${
          Object.keys(PRE_TOKENIZERS).map((p) => `"${p}"`).join(", ")
        } ` +
          `are supported: use a Qwen3-Next or Qwen3.5 GGUF, or add the pre-tokenizer's regex`,
      );
    }
    if (vocab.tokens.length === 0) throw fail(`${KEYS.tokTokens} is empty: ${REEXPORT}`);
    return new Tokenizer(vocab, vocab.pre, fail);
  }

  /**
   * Token ids of `text`; no BOS or EOS is added (spec §4.1 step 6).
   * @example
   * ```ts
   * tok.encode("<|im_start|>user\nhi<|im_end|>", { parseSpecial: true }); // [151644, 872, 198, 6023, 151645]
   * ```
   */
  encode(text: string, opts: EncodeOptions = {}): number[] {
    const out: number[] = [];
    const re = opts.parseSpecial ? this.#specialAll : this.#specialUser;
    if (re === undefined) {
      this.#encodeFragment(text, out);
      return out;
    }
    re.lastIndex = 0;
    let last = 0;
    for (let m = re.exec(text); m !== null; m = re.exec(text)) {
      if (m.index > last) this.#encodeFragment(text.slice(last, m.index), out);
      out.push(this.#specialIds.get(m[0])!);
      last = m.index + m[0].length;
    }
    if (last < text.length) this.#encodeFragment(last === 0 ? text : text.slice(last), out);
    return out;
  }

  /**
   * `text` with every CONTROL or UNKNOWN token spelling in it broken by {@linkcode DEFUSE_MARK} (and any mark
   * already in it doubled), so that after it passes through a chat template {@linkcode encodeDefused} encodes
   * it as plain text while the template's own markup still becomes control tokens. Use it on every string a
   * client controls (message contents, tool results, tool arguments, tool descriptions) before rendering.
   * @example
   * ```ts
   * tok.encodeDefused(`<|im_start|>user\n${tok.defuse("hi<|im_end|>")}<|im_end|>`);
   * // [<|im_start|>, ...plain ids of "user\nhi<|im_end|>", <|im_end|>]
   * ```
   */
  defuse(text: string): string {
    const re = this.#specialControl;
    if (re === undefined && !text.includes(DEFUSE_MARK)) return text;
    const escaped = text.replaceAll(DEFUSE_MARK, DEFUSE_MARK + DEFUSE_MARK);
    if (re === undefined) return escaped;
    // After the first code point, so a spelling that starts with a surrogate pair stays well formed. Repeated
    // until nothing matches: a spelling that is a suffix of another one survives the first pass.
    const mark = (m: string) => {
      const first = String.fromCodePoint(m.codePointAt(0)!).length;
      return m.slice(0, first) + DEFUSE_MARK + m.slice(first);
    };
    let out = escaped;
    for (let again = true; again;) {
      const next = out.replace(re, mark);
      again = next !== out;
      out = next;
    }
    return out;
  }

  /**
   * The inverse of {@linkcode defuse} on any text built from defused strings and unmarked template text:
   * a doubled mark becomes one mark, a single mark disappears.
   */
  undefuse(text: string): string {
    if (!text.includes(DEFUSE_MARK)) return text;
    return text.replace(DEFUSE_MARKS, (m) => m.length === 2 ? DEFUSE_MARK : "");
  }

  /**
   * Token ids of a prompt rendered from {@linkcode defuse}d client strings: CONTROL tokens only where their
   * spelling is unmarked (the template's own markup), everything else as {@linkcode encode} without special
   * parsing would give for the {@linkcode undefuse}d text, fragment by fragment between the control tokens.
   */
  encodeDefused(text: string): number[] {
    const re = this.#specialAll;
    if (re === undefined) return this.encode(this.undefuse(text));
    const out: number[] = [];
    let last = 0;
    const plain = (end: number) => {
      if (end > last) out.push(...this.encode(this.undefuse(text.slice(last, end))));
    };
    re.lastIndex = 0;
    for (let m = re.exec(text); m !== null; m = re.exec(text)) {
      plain(m.index);
      out.push(this.#specialIds.get(m[0])!);
      last = m.index + m[0].length;
    }
    plain(text.length);
    return out;
  }

  /** The pre-tokens of a fragment without added tokens (after normalization); for tests and tools. */
  preTokenize(text: string): string[] {
    const frag = this.#preTokenizer.nfc ? text.normalize("NFC") : text;
    return frag.match(this.#preTokenizer.pattern) ?? [];
  }

  #encodeFragment(text: string, out: number[]): void {
    const frag = this.#preTokenizer.nfc ? text.normalize("NFC") : text;
    const pieces = frag.match(this.#preTokenizer.pattern);
    if (pieces === null) return;
    let covered = 0;
    for (let i = 0; i < pieces.length; i++) {
      const p = pieces[i]!;
      covered += p.length;
      this.#bpe.encodeWord(p, out);
    }
    if (covered !== frag.length) {
      throw new Error(
        `Internal error: pre-tokenizer ${this.pre} covered ${covered} of ${frag.length} UTF-16 units of ` +
          `${JSON.stringify(frag.slice(0, 40))}: its regex does not tile the text`,
      );
    }
  }

  /** Text of `tokens` (see {@linkcode DecodeOptions}); invalid UTF-8 becomes U+FFFD. */
  decode(ids: ArrayLike<number>, opts: DecodeOptions = {}): string {
    return new TextDecoder("utf-8", { ignoreBOM: true }).decode(this.decodeBytes(ids, opts));
  }

  /** The bytes `ids` stand for, concatenated (see {@linkcode DecodeOptions}). */
  decodeBytes(ids: ArrayLike<number>, opts: DecodeOptions = {}): Uint8Array {
    const skip = opts.skipControl ?? false;
    let total = 0;
    for (let i = 0; i < ids.length; i++) total += this.tokenBytes(ids[i]!, { skipControl: skip }).length;
    const out = new Uint8Array(total);
    for (let i = 0, at = 0; i < ids.length; i++) {
      const b = this.tokenBytes(ids[i]!, { skipControl: skip });
      out.set(b, at);
      at += b.length;
    }
    return out;
  }

  /**
   * The bytes token `id` decodes to (a view; do not modify).
   * @throws {RangeError} when `id` is not a token id
   */
  tokenBytes(id: number, opts: DecodeOptions = {}): Uint8Array {
    this.#checkId(id);
    if (opts.skipControl && this.#isControlLike(this.#types[id]!)) return EMPTY;
    return this.#pool.subarray(this.#offsets[id]!, this.#offsets[id + 1]!);
  }

  /**
   * Text of token `id` as stored in the vocabulary (byte-level alphabet for normal tokens).
   * @throws {RangeError} when `id` is not a token id
   */
  tokenText(id: number): string {
    this.#checkId(id);
    return this.#tokens[id]!;
  }

  /**
   * Type of token `id` ({@linkcode TOKEN_TYPE}).
   * @throws {RangeError} when `id` is not a token id
   */
  tokenType(id: number): TokenType {
    this.#checkId(id);
    return this.#types[id]! as TokenType;
  }

  /** Id of the token whose vocabulary text is exactly `text` (the way to find special tokens, spec §1). */
  tokenId(text: string): number | undefined {
    return this.#ids.get(text);
  }

  /** A streaming decoder over this vocabulary. */
  incrementalDecoder(opts: DecodeOptions = {}): IncrementalDecoder {
    return new IncrementalDecoder(this, opts);
  }

  #isControlLike(t: number): boolean {
    return t === TOKEN_TYPE.control || t === TOKEN_TYPE.unknown || t === TOKEN_TYPE.unused;
  }

  #checkId(id: number): void {
    if (!(Number.isInteger(id) && id >= 0 && id < this.nVocab)) {
      throw new RangeError(
        `Token id ${id} is outside the vocabulary of ${this.nVocab} tokens (0..${this.nVocab - 1})`,
      );
    }
  }

  #decodeBytesOf(id: number): Uint8Array {
    const text = this.#tokens[id]!;
    switch (this.#types[id]! as TokenType) {
      case TOKEN_TYPE.normal: {
        // A normal token with a character outside the byte-level alphabet is not byte-level text: its raw
        // UTF-8 is the best rendering (llama.cpp would fail on it).
        return byteLevelBytes(text) ?? UTF8.encode(text);
      }
      case TOKEN_TYPE.byte: {
        // SentencePiece-style byte tokens `<0xAB>`.
        const m = /^<0x([0-9A-Fa-f]{2})>$/.exec(text);
        return m ? Uint8Array.of(parseInt(m[1]!, 16)) : UTF8.encode(text);
      }
      case TOKEN_TYPE.unknown:
      case TOKEN_TYPE.control:
      case TOKEN_TYPE.userDefined:
      case TOKEN_TYPE.unused:
        return UTF8.encode(text);
      default: {
        const never: never = this.#types[id]! as never;
        throw new Error(`Internal error: token type ${never}`);
      }
    }
  }
}

const EMPTY = new Uint8Array(0);

/**
 * The character {@linkcode Tokenizer.defuse} puts inside control-token spellings of client text: U+FDD0, a
 * Unicode noncharacter (reserved for internal use, never in a chat template's own text).
 */
export const DEFUSE_MARK = "\uFDD0";
/** One mark or a doubled one, read left to right. */
const DEFUSE_MARKS = /\uFDD0\uFDD0?/g;

/** A regex matching any of `texts`, longest first at each position (undefined when `texts` is empty). */
function alternation(texts: string[]): RegExp | undefined {
  if (texts.length === 0) return undefined;
  const sorted = [...texts].sort((a, b) => b.length - a.length || (a < b ? -1 : a > b ? 1 : 0));
  return new RegExp(sorted.map((t) => t.replace(/[\\^$.*+?()[\]{}|/]/g, "\\$&")).join("|"), "g");
}

/**
 * Streaming decoder: `push(id)` returns the text that became complete, holding back an incomplete UTF-8
 * sequence until the token that completes it; the concatenation of every `push` and the final `flush` is
 * exactly {@linkcode Tokenizer.decode} of the same ids.
 */
export class IncrementalDecoder {
  readonly #tok: Tokenizer;
  readonly #opts: DecodeOptions;
  #decoder = new TextDecoder("utf-8", { ignoreBOM: true });

  /**
   * Starts an empty stream; {@linkcode Tokenizer.incrementalDecoder} is the usual way to get one.
   * @param tok vocabulary to decode with
   * @param opts decode options
   */
  constructor(tok: Tokenizer, opts: DecodeOptions = {}) {
    this.#tok = tok;
    this.#opts = opts;
  }

  /**
   * Adds token `id`; returns the newly completed text (possibly empty).
   * @throws {RangeError} when `id` is not a token id
   */
  push(id: number): string {
    return this.#decoder.decode(this.#tok.tokenBytes(id, this.#opts), { stream: true });
  }

  /** Ends the stream: returns held-back bytes as U+FFFD (an incomplete sequence) and resets the decoder. */
  flush(): string {
    const rest = this.#decoder.decode();
    this.#decoder = new TextDecoder("utf-8", { ignoreBOM: true });
    return rest;
  }
}
