/**
 * Tokenizer encode throughput: MB/s of UTF-8 text encoded, on a few MB of mixed English, code and CJK text
 * built deterministically from the repository's own sources and a fixed seed. Prints one JSON line.
 *
 * Cold: the first encode of the corpus on a fresh tokenizer (every distinct pre-token runs BPE once).
 * Warm: encoding it again (every pre-token hits the per-word cache).
 *
 * ```sh
 * deno run -A bench/tokenizer.ts [--model tests/fixtures/vocab-qwen3.gguf] [--mb 4]
 * ```
 * @module
 */
import { parseArgs } from "node:util";
import { openGguf } from "../engine/gguf.ts";
import { Tokenizer } from "../engine/text/tokenizer.ts";
import { Rng } from "../tests/util/rng.ts";

const DEFAULT_MODEL = "tests/fixtures/vocab-qwen3.gguf";
const SEED = 1234;

/** Common CJK characters and kana for synthetic Chinese/Japanese sentences. */
const CJK =
  "的一是不了人我在有他这中大来上国个到说们为子和你地出道也时年得就那要下以生会自着去之过家学对可她里后小么心多天而能好都然没日于起还发成事只作当想看文无开手十用主行方又如前所本见经头面公同三已老从动两长知民样现分将外但身些与高意进把法此实回二理美点月明其种声全工己话儿者向情部正名定女问力机给等几很业最间新什打便位因重被走电四第门相次东政海口使教西再平真听世气信北少关并内加化由却代军产入先山五太水万市眼体别处总才场师书比住员九笑性通目华报立马命张活难神数件安表原车白应路期叫死常提感金何更反合放做系计或司利受光王果亲界及今京务制解各任至清物台象记边共风战干接它许八特觉望直服毛林题建南度统色字请交爱让认算论百吃义科怎元社术结六功指思非流每青管夫连远资队跟带花快条院变联言权往展该领传近留红治决周保达办运武半候七必城父强步完革深区即求品士转量空甚众技轻程告江语英基派满式李息写呢识极令黄德收脸钱党倒未持取设始版双历越史商千片容研像找友孩站广改议形委早房音火际则首单据导影失拿网香似斯专石若兵弟谁校读志飞观争究包组造落视济喜离虽坏兴护装热较演尔视思いうえおかきくけこさしすせそたちつてとなにぬねのはひふへほまみむめもやゆよらりるれろわをんアイウエオカキクケコサシスセソタチツテトナニヌネノハヒフヘホマミムメモヤユヨラリルレロワヲン";
const CJK_PUNCT = ["，", "。", "、", "！", "？", "「", "」", "：", " "];

function git(args: string[]): string {
  try {
    const out = new Deno.Command("git", { args, stdout: "piped", stderr: "null" }).outputSync();
    return new TextDecoder().decode(out.stdout).trim() || "unknown";
  } catch {
    return "unknown";
  }
}

function sourceFiles(root: URL, ext: string): string[] {
  const out: string[] = [];
  const walk = (dir: URL): void => {
    for (const e of Deno.readDirSync(dir)) {
      if (e.name.startsWith(".") || e.name === "node_modules") continue;
      const u = new URL(e.name + (e.isDirectory ? "/" : ""), dir);
      if (e.isDirectory) walk(u);
      else if (e.name.endsWith(ext)) out.push(Deno.readTextFileSync(u));
    }
  };
  walk(root);
  return out.sort();
}

/** About `bytes` of UTF-8 mixing reshuffled English words, code lines and random CJK sentences. */
function corpus(bytes: number, rng: Rng): { text: string; shares: Record<string, number> } {
  const repo = new URL("../", import.meta.url);
  const code = sourceFiles(repo, ".ts").join("\n").split("\n");
  const english = sourceFiles(repo, ".md").join("\n").split(/\s+/).filter((w) => /[A-Za-z]/.test(w));
  const cjk = [...CJK];
  const enc = new TextEncoder();
  const parts: string[] = [];
  const sizes = { english: 0, code: 0, cjk: 0 };
  let size = 0;
  while (size < bytes) {
    const lines: string[] = [];
    for (let i = 0; i < 40; i++) lines.push(code[rng.int(0, code.length)]!);
    const words: string[] = [];
    for (let i = 0; i < 200; i++) words.push(english[rng.int(0, english.length)]!);
    let zh = "";
    for (let s = 0; s < 30; s++) {
      for (let i = rng.int(6, 30); i > 0; i--) zh += cjk[rng.int(0, cjk.length)]!;
      zh += CJK_PUNCT[rng.int(0, CJK_PUNCT.length)]!;
    }
    const chunk = { code: `${lines.join("\n")}\n`, english: `${words.join(" ")}\n`, cjk: `${zh}\n` };
    for (const k of ["code", "english", "cjk"] as const) {
      const n = enc.encode(chunk[k]).length;
      sizes[k] += n;
      size += n;
      parts.push(chunk[k]);
    }
  }
  const shares: Record<string, number> = {};
  for (const [k, v] of Object.entries(sizes)) shares[k] = +(v / size).toFixed(2);
  return { text: parts.join(""), shares };
}

const { values } = parseArgs({
  args: Deno.args,
  options: { model: { type: "string", default: DEFAULT_MODEL }, mb: { type: "string", default: "4" } },
});
const model = values.model;
const { text, shares } = corpus(Number(values.mb) * 1e6, new Rng(SEED));
const nBytes = new TextEncoder().encode(text).length;

let t0 = performance.now();
const gguf = await openGguf(model);
const tok = Tokenizer.fromGguf(gguf.metadata);
const loadMs = performance.now() - t0;

t0 = performance.now();
const ids = tok.encode(text);
const coldMs = performance.now() - t0;
t0 = performance.now();
tok.encode(text);
const warmMs = performance.now() - t0;
t0 = performance.now();
const back = tok.decode(ids);
const decodeMs = performance.now() - t0;
if (back !== text) throw new Error("Round trip failed: decode(encode(corpus)) differs from the corpus");

console.log(JSON.stringify({
  bench: "tokenizer",
  commit: git(["rev-parse", "--short", "HEAD"]),
  command: `deno run -A bench/tokenizer.ts ${Deno.args.join(" ")}`.trim(),
  params: { model, pre: tok.pre, corpusBytes: nBytes, seed: SEED, byteShares: shares },
  result: {
    loadMs: Math.round(loadMs),
    nTokens: ids.length,
    encodeColdMBps: +(nBytes / 1e6 / (coldMs / 1e3)).toFixed(2),
    encodeWarmMBps: +(nBytes / 1e6 / (warmMs / 1e3)).toFixed(2),
    decodeMBps: +(nBytes / 1e6 / (decodeMs / 1e3)).toFixed(2),
  },
}));
