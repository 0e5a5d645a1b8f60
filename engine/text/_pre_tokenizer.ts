/**
 * Pre-tokenizers of the supported `tokenizer.ggml.pre` values (spec `chat.md` §4.1 steps 2-3): the regex
 * that splits a text fragment into pre-tokens, and whether the fragment is NFC-normalized first.
 *
 * The spec's JavaScript forms write `\s`; JavaScript's `\s` differs from the Unicode White_Space property
 * that llama.cpp (its `unicode_cpt_flags` whitespace table) and Python's `regex` use: it lacks U+0085 (NEL)
 * and adds U+FEFF (BOM). The patterns below therefore spell `\s` as `\p{White_Space}` and `\S` as
 * `\P{White_Space}`, so NEL is whitespace and a BOM is an ordinary symbol, as in the reference tokenizers.
 * @module
 */

const WS = String.raw`\p{White_Space}`;
const NOT_WS = String.raw`\P{White_Space}`;
const CONTRACTIONS = String.raw`(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])`;

/** One pre-tokenizer: its splitting regex (flags `gu`) and whether fragments are NFC-normalized first. */
export interface PreTokenizer {
  /** Every match is one pre-token; the alternatives tile any string (no character is skipped). */
  readonly pattern: RegExp;
  /** Normalize each non-special fragment to Unicode NFC before splitting. */
  readonly nfc: boolean;
}

/**
 * The supported pre-tokenizers by `tokenizer.ggml.pre` value.
 *
 * - `qwen2` (Qwen3-Next): no normalization, as llama.cpp does, whose ids the fixtures hold (the HF Qwen2
 *   tokenizer applies NFC; the two differ only on non-NFC input).
 * - `qwen35` (Qwen3.5/3.6): NFC (HF `Qwen3_5Tokenizer` declares `normalizers.NFC()`), and combining marks
 *   `\p{M}` join letter runs instead of punctuation runs.
 */
export const PRE_TOKENIZERS = {
  qwen2: {
    pattern: new RegExp(
      `${CONTRACTIONS}|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^${WS}\\p{L}\\p{N}]+[\\r\\n]*` +
        `|${WS}*[\\r\\n]+|${WS}+(?!${NOT_WS})|${WS}+`,
      "gu",
    ),
    nfc: false,
  },
  qwen35: {
    pattern: new RegExp(
      `${CONTRACTIONS}|[^\\r\\n\\p{L}\\p{N}]?[\\p{L}\\p{M}]+|\\p{N}| ?[^${WS}\\p{L}\\p{M}\\p{N}]+[\\r\\n]*` +
        `|${WS}*[\\r\\n]+|${WS}+(?!${NOT_WS})|${WS}+`,
      "gu",
    ),
    nfc: true,
  },
} as const satisfies Record<string, PreTokenizer>;

/** A supported `tokenizer.ggml.pre` value. */
export type PreTokenizerName = keyof typeof PRE_TOKENIZERS;

/** Whether `name` is a supported `tokenizer.ggml.pre` value. */
export function isPreTokenizerName(name: string): name is PreTokenizerName {
  return Object.hasOwn(PRE_TOKENIZERS, name);
}
