import assert from "node:assert/strict";
import { GgufError } from "../errors.ts";
import { GGUF_VALUE_TYPE, type GgufKv, GgufMetadata, openGguf } from "../gguf.ts";
import { KEYS } from "../names.ts";
import { Rng } from "../../tests/util/rng.ts";
import { command as tokenizeCommand } from "../../cli/tokenize.ts";
import { byteChar } from "./_byte_level.ts";
import { TOKEN_TYPE, Tokenizer, type TokenizerVocab } from "./tokenizer.ts";

import { FIXTURES } from "../../tests/util/fixtures.ts";
const VOCAB_PATH = new URL("vocab-qwen3.gguf", FIXTURES).pathname;
const CASES_PATH = new URL("vocab-qwen3.cases.json", FIXTURES).pathname;

// The 151,936-token vocabulary is loaded once for the whole file.
const gguf = await openGguf(VOCAB_PATH);
const tok = Tokenizer.fromGguf(gguf.metadata);

interface Case {
  text: string;
  ids: number[];
}

Deno.test("vocab-qwen3 fixture: every case gives llama.cpp's ids and decodes back", () => {
  const fixture = JSON.parse(Deno.readTextFileSync(CASES_PATH)) as { parse_special: boolean; cases: Case[] };
  assert.equal(fixture.parse_special, true);
  assert.ok(fixture.cases.length >= 20, `only ${fixture.cases.length} cases in ${CASES_PATH}`);
  for (const c of fixture.cases) {
    assert.deepEqual(tok.encode(c.text, { parseSpecial: true }), c.ids, `text ${JSON.stringify(c.text)}`);
    assert.equal(tok.decode(c.ids), c.text, `decode of ${JSON.stringify(c.text)}`);
  }
});

Deno.test("vocabulary metadata: size, pre-tokenizer, special ids by text lookup, EOG set", () => {
  assert.equal(tok.nVocab, 151936);
  assert.equal(tok.pre, "qwen2");
  assert.equal(tok.eosId, 151645);
  assert.equal(tok.padId, 151643);
  assert.equal(tok.bosId, undefined, "vocab-qwen3.gguf has no bos_token_id");
  assert.equal(tok.addBos, false);
  const expected: [string, number, number][] = [
    ["<|endoftext|>", 151643, TOKEN_TYPE.control],
    ["<|im_start|>", 151644, TOKEN_TYPE.control],
    ["<|im_end|>", 151645, TOKEN_TYPE.control],
    ["<|fim_pad|>", 151662, TOKEN_TYPE.control],
    ["<tool_call>", 151657, TOKEN_TYPE.userDefined],
    ["</tool_call>", 151658, TOKEN_TYPE.userDefined],
    ["<think>", 151667, TOKEN_TYPE.userDefined],
    ["</think>", 151668, TOKEN_TYPE.userDefined],
    ["[PAD151669]", 151669, TOKEN_TYPE.unused],
  ];
  for (const [text, id, type] of expected) {
    assert.equal(tok.tokenId(text), id, text);
    assert.equal(tok.tokenText(id), text);
    assert.equal(tok.tokenType(id), type, text);
  }
  assert.deepEqual([...tok.eogIds].sort(), [151643, 151645, 151662, 151663, 151664]);
  assert.throws(() => tok.tokenText(151936), RangeError);
  assert.throws(() => tok.tokenBytes(-1), RangeError);
  assert.throws(() => tok.decode([1.5]), RangeError);
});

Deno.test("spec sanity example: Hello world", () => {
  assert.deepEqual(tok.preTokenize("Hello world"), ["Hello", " world"]);
  assert.deepEqual(tok.encode("Hello world"), [9707, 1879]);
  assert.equal(tok.tokenText(1879), "Ġworld");
});

Deno.test("special tokens: CONTROL only with parseSpecial, USER_DEFINED always, longest match first", () => {
  const text = "<|im_start|>assistant\n<think>\nhm</think>\n\nok<|im_end|>";
  const special = tok.encode(text, { parseSpecial: true });
  assert.deepEqual(special.filter((id) => id >= 151643), [151644, 151667, 151668, 151645]);
  const plain = tok.encode(text);
  assert.ok(!plain.includes(151644) && !plain.includes(151645), `control ids in ${plain}`);
  assert.deepEqual(plain.filter((id) => id >= 151643), [151667, 151668]);
  // Control text encoded as ordinary text still decodes to the same characters.
  assert.equal(tok.decode(plain), text);
  assert.equal(tok.decode(special), text);
  // Adjacent and repeated specials, and a special immediately followed by its own prefix.
  assert.deepEqual(
    tok.encode("<|im_end|><|im_end|><think></think><|im_end", { parseSpecial: true }).slice(0, 4),
    [151645, 151645, 151667, 151668],
  );
  assert.deepEqual(tok.encode("<tool_call>", { parseSpecial: false }), [151657]);
  // skipControl drops CONTROL and UNUSED tokens but keeps USER_DEFINED ones (they are content).
  assert.equal(tok.decode(special, { skipControl: true }), "assistant\n<think>\nhm</think>\n\nok");
  assert.equal(tok.decode([151669]), "[PAD151669]");
  assert.equal(tok.decode([151669], { skipControl: true }), "");
});

// Pools of characters for random strings: every script and hazard the tokenizer must round-trip.
const POOLS: string[][] = [
  [..."abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"],
  [..." \t\n\r\v\f.,;:!?'\"`~@#$%^&*()[]{}<>/\\|-_=+"],
  ["'s", "'T", "'re", "'LL", "'d", "'ve", "'M", "\r\n", "    ", "\n\n\n"],
  ["\u00a0", "\u3000", "\u2028", "\u2029", "\u0085", "\ufeff", "\u200b", "\u202f", "\u1680"],
  [..."日本語のテキストです。中文汉字测试，한국어텍스트"],
  [..."Привет мир שלום עולם مرحبا ελληνικά"],
  ["\u0301", "\u0308", "\u0327", "\u20dd", "\u0e31", "\u093f", "e\u0301", "a\u030a", "\u1100\u1161\u11a8"],
  ["🦙", "🚀", "👩‍👩‍👧‍👦", "🇫🇷", "👍🏽", "❤️", "🏳️‍🌈", "\u{1d400}", "\u{10ffff}", "\u{20000}"],
  ["<|im_start|>", "<|im_end|>", "<think>", "</think>", "<tool_call>", "<|endoftext|>", "<|im_"],
];

function randomString(rng: Rng, maxLen: number): string {
  let s = "";
  for (let n = rng.int(0, maxLen); n > 0; n--) {
    const r = rng.float();
    if (r < 0.1) {
      // Any valid code point outside the surrogate range.
      let cp = rng.int(0, 0x110000);
      if (cp >= 0xd800 && cp <= 0xdfff) cp += 0x800;
      s += String.fromCodePoint(cp);
    } else {
      const pool = POOLS[rng.int(0, POOLS.length)]!;
      s += pool[rng.int(0, pool.length)]!;
    }
  }
  return s;
}

Deno.test("round trip: decode(encode(s)) === s on random well-formed Unicode strings", () => {
  const rng = new Rng();
  for (let i = 0; i < 400; i++) {
    const s = randomString(rng, 40);
    for (const parseSpecial of [false, true]) {
      const ids = tok.encode(s, { parseSpecial });
      assert.equal(
        tok.decode(ids),
        s,
        `seed ${rng.seed}, parseSpecial ${parseSpecial}, ${JSON.stringify(s)}`,
      );
      for (const id of ids) assert.ok(Number.isInteger(id) && id >= 0 && id < tok.nVocab);
    }
  }
});

Deno.test("lone surrogates become U+FFFD (they have no UTF-8 encoding)", () => {
  const cases: [string, string][] = [
    ["a\ud800b", "a\ufffdb"],
    ["\udc00", "\ufffd"],
    ["x\udc00\ud800y", "x\ufffd\ufffdy"],
    ["end\ud83e", "end\ufffd"],
    ["\ud83e\udd99\ud83e", "\u{1f999}\ufffd"],
  ];
  for (const [input, expected] of cases) {
    const ids = tok.encode(input);
    assert.deepEqual(ids, tok.encode(expected), JSON.stringify(input));
    assert.equal(tok.decode(ids), expected, JSON.stringify(input));
  }
});

Deno.test("pre-tokenizer whitespace follows the Unicode White_Space property, not JavaScript's \\s", () => {
  // U+00A0 against the reference ids is in the fixture; these follow llama.cpp's White_Space table:
  // whitespace runs split off their last character before a word, like ASCII spaces.
  assert.deepEqual(tok.preTokenize("a\u00a0\u00a0b"), ["a", "\u00a0", "\u00a0b"]);
  assert.deepEqual(tok.preTokenize("a\u3000\u3000b"), ["a", "\u3000", "\u3000b"]);
  assert.deepEqual(tok.preTokenize("x\u2028\u2028y"), ["x", "\u2028", "\u2028y"]);
  // NEL is White_Space (JavaScript's \s lacks it) ...
  assert.deepEqual(tok.preTokenize("a\u0085\u0085b"), ["a", "\u0085", "\u0085b"]);
  // ... and U+FEFF is not (JavaScript's \s has it): it joins a punctuation run.
  assert.deepEqual(tok.preTokenize("a\ufeff\ufeffb"), ["a", "\ufeff\ufeff", "b"]);
  assert.deepEqual(tok.preTokenize("a  \n\n b"), ["a", "  \n\n", " b"]);
  assert.deepEqual(tok.preTokenize("x   "), ["x", "   "]);
  assert.deepEqual(tok.preTokenize("I'M 123"), ["I", "'M", " ", "1", "2", "3"]);
});

/** Byte-level BPE written straight from spec §4.1 steps 4-5: strings, a rank map, leftmost lowest rank. */
function referenceBpe(word: string, ranks: Map<string, number>): number[] {
  let syms = [...new TextEncoder().encode(word)].map(byteChar);
  for (;;) {
    let best = -1;
    let bestRank = Infinity;
    for (let i = 0; i + 1 < syms.length; i++) {
      const r = ranks.get(`${syms[i]} ${syms[i + 1]}`);
      if (r !== undefined && r < bestRank) {
        bestRank = r;
        best = i;
      }
    }
    if (best < 0) break;
    syms = [...syms.slice(0, best), syms[best]! + syms[best + 1]!, ...syms.slice(best + 2)];
  }
  return syms.map((s) => tok.tokenId(s)!);
}

Deno.test("BPE equals a direct string implementation of the spec on random pre-tokens", () => {
  const merges = gguf.metadata.getStringArray(KEYS.tokMerges);
  const ranks = new Map<string, number>();
  merges.forEach((m, i) => ranks.set(m, i));
  const rng = new Rng();
  let words = 0;
  for (let i = 0; i < 300; i++) {
    for (const word of tok.preTokenize(randomString(rng, 30))) {
      assert.deepEqual(
        tok.encode(word),
        referenceBpe(word, ranks),
        `seed ${rng.seed}, ${JSON.stringify(word)}`,
      );
      words++;
    }
  }
  // Long words: whitespace runs, repeated letters, a long CJK run.
  for (
    const word of [" ".repeat(300), "a".repeat(257), "ab".repeat(100), "日本語".repeat(40), "\n".repeat(99)]
  ) {
    assert.deepEqual(tok.encode(word), referenceBpe(word, ranks), JSON.stringify(word.slice(0, 10)));
  }
  assert.ok(words > 300, `only ${words} words compared`);
});

/** Every prefix's streamed text, checked against full decodes; returns the total streamed text. */
function streamAll(ids: number[], skipControl = false): string {
  const dec = tok.incrementalDecoder({ skipControl });
  let acc = "";
  for (let k = 0; k < ids.length; k++) {
    const delta = dec.push(ids[k]!);
    // Never half a character: no lone high surrogate at the end of a delta, and no U+FFFD that the full
    // decode of the prefix plus everything after would not also have.
    assert.ok(!/[\ud800-\udbff]$/.test(delta), `delta ends in a high surrogate at ${k}`);
    acc += delta;
    assert.ok(
      tok.decode(ids, { skipControl }).startsWith(acc),
      `streamed text after ${k + 1} tokens is not a prefix of the full decode: ${JSON.stringify(acc)}`,
    );
  }
  return acc + dec.flush();
}

Deno.test("incremental decode: explicit byte-split emoji, flush of an incomplete sequence", () => {
  const dec = tok.incrementalDecoder();
  assert.equal(dec.push(37523), "emoji");
  assert.equal(dec.push(11162), " ", "space emitted, F0 9F held back");
  assert.equal(dec.push(99), "");
  assert.equal(dec.push(247), "\u{1f999}");
  assert.equal(dec.flush(), "");
  const f0 = tok.tokenId("ð")!;
  assert.equal(dec.push(f0), "");
  assert.equal(dec.flush(), "\ufffd");
  assert.equal(tok.decode([f0]), "\ufffd");
  // After a flush the decoder starts clean.
  assert.equal(dec.push(9707), "Hello");
});

Deno.test("incremental decode equals full decode at every split point", () => {
  const rng = new Rng();
  for (let i = 0; i < 60; i++) {
    const s = randomString(rng, 30);
    const ids = tok.encode(s, { parseSpecial: true });
    assert.equal(streamAll(ids), s, `seed ${rng.seed}, ${JSON.stringify(s)}`);
    assert.equal(streamAll(ids, true), tok.decode(ids, { skipControl: true }), `seed ${rng.seed}`);
  }
  // Random id sequences, mostly single-byte tokens: invalid UTF-8 must come out the same both ways.
  for (let i = 0; i < 60; i++) {
    const ids: number[] = [];
    for (let n = rng.int(1, 25); n > 0; n--) {
      ids.push(rng.float() < 0.7 ? rng.int(0, 256) : rng.int(0, tok.nVocab));
    }
    const full = tok.decode(ids);
    const dec = tok.incrementalDecoder();
    let acc = "";
    for (const id of ids) acc += dec.push(id);
    assert.equal(acc + dec.flush(), full, `seed ${rng.seed}, ids ${ids}`);
  }
});

Deno.test("fromGguf rejects an unknown pre-tokenizer or model with a GgufError naming the key", () => {
  const withKey = (key: string, value: string): GgufMetadata => {
    const entries = new Map<string, GgufKv>(gguf.metadata.entries);
    entries.set(key, { type: GGUF_VALUE_TYPE.STRING, value });
    return new GgufMetadata(entries, "patched.gguf");
  };
  assert.throws(
    () => Tokenizer.fromGguf(withKey(KEYS.tokPre, "llama-bpe")),
    (e: unknown) =>
      e instanceof GgufError && e.code === "bad_value" && e.message.includes(KEYS.tokPre) &&
      e.message.includes('"llama-bpe"') && e.message.includes("patched.gguf"),
  );
  assert.throws(
    () => Tokenizer.fromGguf(withKey(KEYS.tokModel, "llama")),
    (e: unknown) =>
      e instanceof GgufError && e.message.includes(KEYS.tokModel) && e.message.includes('"llama"'),
  );
});

/** A tiny byte-level vocabulary: the 256 byte tokens, then merge results, then one added token. */
function tinyVocab(pre: string, merges: string[]): TokenizerVocab {
  const tokens: string[] = [];
  for (let b = 0; b < 256; b++) tokens.push(byteChar(b));
  for (const m of merges) {
    const t = m.replace(" ", "");
    if (!tokens.includes(t)) tokens.push(t);
  }
  tokens.push("<|im_end|>");
  const tokenTypes = tokens.map((_, i) => (i === tokens.length - 1 ? TOKEN_TYPE.control : TOKEN_TYPE.normal));
  return { model: "gpt2", pre, tokens, tokenTypes, merges, eosId: tokens.length - 1 };
}

Deno.test("qwen35: NFC normalization and combining marks inside letter runs", () => {
  const q35 = Tokenizer.fromVocab(tinyVocab("qwen35", ["a b", "ab c", "x \u0301"]));
  const q2 = Tokenizer.fromVocab(tinyVocab("qwen2", ["a b", "ab c", "x \u0301"]));
  // "e" + U+0301 composes to U+00E9 under NFC; "x" + U+0301 has no composed form.
  assert.deepEqual(q35.preTokenize("cafe\u0301 ok"), ["caf\u00e9", " ok"]);
  assert.deepEqual(q2.preTokenize("cafe\u0301 ok"), ["cafe", "\u0301", " ok"]);
  assert.deepEqual(q35.preTokenize("x\u0301y \u0301"), ["x\u0301y", " \u0301"]);
  assert.deepEqual(q2.preTokenize("x\u0301y \u0301"), ["x", "\u0301y", " \u0301"]);
  assert.deepEqual(q35.encode("abc"), [q35.tokenId("abc")]);
  const rng = new Rng();
  for (let i = 0; i < 100; i++) {
    const s = randomString(rng, 30);
    assert.equal(q35.decode(q35.encode(s, { parseSpecial: true })), s.normalize("NFC"), `seed ${rng.seed}`);
    assert.equal(q2.decode(q2.encode(s, { parseSpecial: true })), s, `seed ${rng.seed}`);
  }
});

Deno.test("BPE merges through symbols that are not tokens, and ties go to the leftmost pair", () => {
  // "a b" -> "ab" is not a token; "ab ab" -> "abab" is. "aaa" with merge "a a": leftmost pair first.
  const vocab = tinyVocab("qwen2", []);
  const tokens = [...vocab.tokens, "abab", "aa"];
  const v: TokenizerVocab = { ...vocab, tokens, tokenTypes: undefined, merges: ["a a", "a b", "ab ab"] };
  const t = Tokenizer.fromVocab(v);
  const id = (s: string): number => t.tokenId(s)!;
  assert.deepEqual(t.encode("abab"), [id("abab")]);
  // "ab" alone is merged but is no token: it falls back to its characters' tokens.
  assert.deepEqual(t.encode("ab"), [id("a"), id("b")]);
  assert.deepEqual(t.encode("aaa"), [id("aa"), id("a")]);
  assert.deepEqual(t.encode("aaaaa"), [id("aa"), id("aa"), id("a")]);
});

Deno.test("fromVocab rejects malformed vocabularies with what is wrong", () => {
  const ok = tinyVocab("qwen2", ["a b"]);
  const rejects = (v: TokenizerVocab, expected: string): void => {
    assert.throws(
      () => Tokenizer.fromVocab(v),
      (e: unknown) => e instanceof RangeError && e.message.includes(expected),
      `expected a RangeError containing ${JSON.stringify(expected)}`,
    );
  };
  rejects({ ...ok, pre: "gpt-4o" }, `${KEYS.tokPre} is "gpt-4o"`);
  rejects({ ...ok, model: "llama" }, `${KEYS.tokModel} is "llama"`);
  rejects({ ...ok, merges: ["ab"] }, `Merge 0 "ab" has no space`);
  rejects({ ...ok, tokenTypes: [1, 2] }, `${KEYS.tokTypes} has 2 entries`);
  rejects({ ...ok, tokenTypes: ok.tokens.map(() => 9) }, `${KEYS.tokTypes}[0] is 9`);
  rejects({ ...ok, eosId: 99999 }, `${KEYS.tokEos} is 99999`);
  rejects({ ...ok, tokens: [] }, `${KEYS.tokTokens} is empty`);
  assert.throws(
    () => Tokenizer.fromVocab({ ...ok, tokens: ok.tokens.slice(1), tokenTypes: undefined, eosId: 0 }),
    /no token for byte 0x00/,
  );
});

/** Runs the tokenize command in process and returns [exit code, stdout, stderr]. */
async function runCli(args: string[]): Promise<[number, string, string]> {
  const out: string[] = [];
  const err: string[] = [];
  const { log, error } = console;
  console.log = (...a: unknown[]) => out.push(a.join(" "));
  console.error = (...a: unknown[]) => err.push(a.join(" "));
  try {
    return [await tokenizeCommand.run(args), out.join("\n"), err.join("\n")];
  } finally {
    console.log = log;
    console.error = error;
  }
}

Deno.test("tokenize CLI on the vocabulary-only GGUF: ids, JSON, file input, decode", async () => {
  const text = "<|im_start|>user\nhi<|im_end|>";
  assert.deepEqual(await runCli(["--model", VOCAB_PATH, "--text", text]), [
    0,
    "151644 872 198 6023 151645",
    "",
  ]);
  const file = await Deno.makeTempFile({ suffix: ".txt" });
  try {
    await Deno.writeTextFile(file, "Hello world");
    assert.deepEqual(await runCli(["--model", VOCAB_PATH, "--file", file, "--json"]), [0, "[9707,1879]", ""]);
  } finally {
    await Deno.remove(file);
  }
  assert.deepEqual(await runCli(["--model", VOCAB_PATH, "--decode", "151644,872,198,6023,151645"]), [
    0,
    text,
    "",
  ]);
  assert.deepEqual(
    await runCli(["--model", VOCAB_PATH, "--decode", "[9707, 1879, 151645]", "--skip-control", "--json"]),
    [0, '"Hello world"', ""],
  );
  const [code, , err] = await runCli(["--model", VOCAB_PATH]);
  assert.equal(code, 2, "no input is a usage error");
  assert.match(err, /exactly one of --text, --file, --decode/);
  await assert.rejects(() => runCli(["--model", VOCAB_PATH, "--decode", "1,x"]), SyntaxError);
});
