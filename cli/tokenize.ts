/**
 * `mod.ts tokenize`: token ids of a text, or the text of token ids, with a GGUF's own tokenizer (a
 * vocabulary-only GGUF is enough).
 *
 * ```sh
 * deno run -A mod.ts tokenize --model vocab-qwen3.gguf --text "Hello world"       # 9707 1879
 * deno run -A mod.ts tokenize --model vocab-qwen3.gguf --file prompt.txt --json   # [9707,1879]
 * deno run -A mod.ts tokenize --model vocab-qwen3.gguf --decode 9707,1879         # Hello world
 * ```
 * @module
 */
import { parseArgs } from "node:util";
import type { Command } from "./command.ts";
import { openGguf, Tokenizer } from "../engine/mod.ts";

const USAGE = "Usage: mod.ts tokenize --model FILE.gguf (--text TEXT | --file FILE | --decode 1,2,3) " +
  "[--json] [--no-parse-special] [--skip-control]";

/** The `tokenize` command. */
export const command: Command = {
  usage: USAGE,
  summary: "print the token ids of --text/--file, or the text of --decode ids, using a GGUF's tokenizer",
  async run(argv: string[]): Promise<number> {
    const { values } = parseArgs({
      args: argv,
      options: {
        model: { type: "string" },
        text: { type: "string" },
        file: { type: "string" },
        decode: { type: "string" },
        json: { type: "boolean", default: false },
        "no-parse-special": { type: "boolean", default: false },
        "skip-control": { type: "boolean", default: false },
        debug: { type: "boolean", default: false },
      },
      strict: true,
    });
    const inputs = [values.text, values.file, values.decode].filter((v) => v !== undefined).length;
    if (values.model === undefined || inputs !== 1) {
      console.error(
        `${
          values.model === undefined ? "Missing --model" : "Give exactly one of --text, --file, --decode"
        }\n${USAGE}`,
      );
      return 2;
    }
    const ids = values.decode === undefined ? undefined : parseIds(values.decode);
    const gguf = await openGguf(values.model);
    const tok = Tokenizer.fromGguf(gguf.metadata);
    if (ids !== undefined) {
      const text = tok.decode(ids, { skipControl: values["skip-control"] });
      console.log(values.json ? JSON.stringify(text) : text);
      return 0;
    }
    const text = values.text ?? await Deno.readTextFile(values.file!);
    const out = tok.encode(text, { parseSpecial: !values["no-parse-special"] });
    console.log(values.json ? JSON.stringify(out) : out.join(" "));
    return 0;
  },
};

/** Ids written as `1,2,3`, `1 2 3` or a JSON array. */
function parseIds(s: string): number[] {
  const parts = s.replace(/^\s*\[|\]\s*$/g, "").split(/[\s,]+/).filter((p) => p !== "");
  return parts.map((p) => {
    if (!/^\d+$/.test(p)) {
      throw new SyntaxError(`--decode: "${p}" is not a token id: give non-negative integers like 1,2,3`);
    }
    return Number(p);
  });
}
