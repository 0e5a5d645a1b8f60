/**
 * The name registry rule (STYLE.md "The name registry"): outside `engine/names.ts`, no source file spells a
 * `blk.` tensor name or a metadata key as a string literal. Scans engine/, wgsl/, cli/, server/, wire/ and
 * mod.ts (tests excluded) with a small lexer that skips comments and regex literals.
 */
import assert from "node:assert/strict";
import { ARCH_KEYS, KEYS } from "../engine/names.ts";
import { ARCHES } from "../engine/models/mod.ts";

const ROOT = new URL("../", import.meta.url);
const DIRS = ["engine", "wgsl", "cli", "server", "wire"];
const REGISTRY = "engine/names.ts";

/** A string literal (or a template literal's static part) and the line it starts on. */
interface Literal {
  readonly text: string;
  readonly line: number;
  /** True for a template literal's parts after the first `${...}`. */
  readonly tail: boolean;
}

const REGEX_AFTER = new Set([..."(,=:[!&|?{};+-*%<>~^"]);
const REGEX_AFTER_WORD = new Set([
  "return",
  "typeof",
  "case",
  "do",
  "else",
  "in",
  "of",
  "new",
  "delete",
  "void",
  "throw",
  "yield",
  "await",
]);

/** Every string literal in TypeScript source `src`, comments and regex literals skipped. */
function stringLiterals(src: string): Literal[] {
  const out: Literal[] = [];
  let i = 0, line = 1;
  let prev = ""; // last significant character, or the last word
  const braces: number[] = []; // per open `${`: depth of plain braces inside it
  const next = () => {
    const c = src[i++]!;
    if (c === "\n") line++;
    return c;
  };
  const quoted = (q: string) => {
    const start = line;
    let text = "";
    while (i < src.length) {
      const c = next();
      if (c === "\\") text += c + next();
      else if (c === q) break;
      else text += c;
    }
    out.push({ text, line: start, tail: false });
  };
  /** Scans template text up to the closing backquote or a `${`; returns true when a `${` opened. */
  const template = (tail: boolean): boolean => {
    const start = line;
    let text = "";
    while (i < src.length) {
      const c = next();
      if (c === "\\") text += c + next();
      else if (c === "`") {
        out.push({ text, line: start, tail });
        return false;
      } else if (c === "$" && src[i] === "{") {
        i++;
        out.push({ text, line: start, tail });
        braces.push(0);
        return true;
      } else text += c;
    }
    return false;
  };
  while (i < src.length) {
    const c = src[i]!;
    if (c === "/" && src[i + 1] === "/") {
      while (i < src.length && src[i] !== "\n") i++;
    } else if (c === "/" && src[i + 1] === "*") {
      i += 2;
      while (i < src.length && !(src[i] === "*" && src[i + 1] === "/")) next();
      i += 2;
    } else if (c === "/" && (prev === "" || REGEX_AFTER.has(prev) || REGEX_AFTER_WORD.has(prev))) {
      i++;
      let inClass = false;
      while (i < src.length) {
        const r = next();
        if (r === "\\") next();
        else if (r === "[") inClass = true;
        else if (r === "]") inClass = false;
        else if (r === "/" && !inClass) break;
      }
      prev = "regex";
    } else if (c === "'" || c === '"') {
      i++;
      quoted(c);
      prev = "str";
    } else if (c === "`") {
      i++;
      template(false);
      prev = "str";
    } else if (c === "}" && braces.length > 0 && braces[braces.length - 1] === 0) {
      i++;
      braces.pop();
      template(true);
      prev = "str";
    } else if (/\s/.test(c)) {
      next();
    } else if (/[\w$]/.test(c)) {
      let w = "";
      while (i < src.length && /[\w$]/.test(src[i]!)) w += src[i++];
      prev = w;
    } else {
      if (braces.length > 0) {
        if (c === "{") braces[braces.length - 1]!++;
        else if (c === "}") braces[braces.length - 1]!--;
      }
      i++;
      prev = c;
    }
  }
  return out;
}

/** Every metadata key of the registry: global keys, arch key suffixes and full arch keys. */
function registryKeys(): Set<string> {
  const keys = new Set<string>(Object.values(KEYS));
  for (const suffix of Object.values(ARCH_KEYS)) {
    keys.add(suffix);
    for (const arch of Object.keys(ARCHES)) keys.add(`${arch}.${suffix}`);
  }
  return keys;
}

/** Violations in one source text: `line: literal`. */
function violations(src: string, keys: Set<string>): string[] {
  return stringLiterals(src)
    .filter((l) => (!l.tail && l.text.startsWith("blk.")) || keys.has(l.text))
    .map((l) => `${l.line}: ${JSON.stringify(l.text)}`);
}

async function* sources(): AsyncGenerator<string> {
  yield "mod.ts";
  for (const dir of DIRS) {
    const walk = async function* (rel: string): AsyncGenerator<string> {
      let entries: Deno.DirEntry[];
      try {
        entries = [...Deno.readDirSync(new URL(rel, ROOT))];
      } catch (e) {
        if (e instanceof Deno.errors.NotFound) return; // folder not created yet (server/, wire/)
        throw e;
      }
      for (const e of entries.sort((a, b) => a.name.localeCompare(b.name))) {
        const p = `${rel}/${e.name}`;
        if (e.isDirectory) yield* walk(p);
        else if (e.name.endsWith(".ts") && !e.name.endsWith("_test.ts") && p !== REGISTRY) yield p;
      }
    };
    yield* walk(dir);
  }
}

Deno.test("the lexer finds literals and skips comments, regexes and template expressions", () => {
  const src = [
    '// "blk.0.x" in a comment',
    "/* 'general.name' */ const a = x / 2 / y; const r = /'[sS]|\"/gu;",
    "const t = `pre ${f({ a: 'blk.1.y' })} mid ${g} end`;",
    "return /[/']/.test(s) ? \"tokenizer.ggml.tokens\" : 'it\\'s';",
  ].join("\n");
  const lits = stringLiterals(src);
  assert.deepEqual(lits.map((l) => [l.text, l.line]), [
    ["pre ", 3],
    ["blk.1.y", 3],
    [" mid ", 3],
    [" end", 3],
    ["tokenizer.ggml.tokens", 4],
    ["it\\'s", 4],
  ]);
  assert.deepEqual(violations(src, registryKeys()), ['3: "blk.1.y"', '4: "tokenizer.ggml.tokens"']);
  assert.deepEqual(
    violations("const k = `qwen3next.block_count`; const b = `blk.${l}.ssm_a`;", registryKeys()),
    [
      '1: "qwen3next.block_count"',
      '1: "blk."',
    ],
  );
});

Deno.test("no source file outside engine/names.ts spells a tensor name or metadata key", async () => {
  const keys = registryKeys();
  const bad: string[] = [];
  let files = 0;
  for await (const rel of sources()) {
    files++;
    const src = await Deno.readTextFile(new URL(rel, ROOT));
    for (const v of violations(src, keys)) bad.push(`${rel}:${v}`);
  }
  assert.ok(files > 10, `scanned only ${files} files`);
  assert.deepEqual(
    bad,
    [],
    `string literals that belong in ${REGISTRY} (use tensorName/KEYS/archKey):\n${bad.join("\n")}`,
  );
});
