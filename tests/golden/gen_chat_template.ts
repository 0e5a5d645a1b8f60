/**
 * Regenerates `chat_template_qwen3.json`: every case of `chat_template_cases.ts` rendered with the real
 * Qwen3 template of `shared/fixtures/vocab-qwen3.gguf`. Run after a deliberate change, then review the diff:
 *
 *   deno run -A tests/golden/gen_chat_template.ts
 * @module
 */
import { openGguf } from "../../engine/gguf.ts";
import { ChatTemplate } from "../../engine/text/template.ts";
import { CASES } from "./chat_template_cases.ts";

const VOCAB = new URL("../../../shared/fixtures/vocab-qwen3.gguf", import.meta.url).pathname;
const OUT = new URL("./chat_template_qwen3.json", import.meta.url).pathname;

const tpl = ChatTemplate.fromGguf((await openGguf(VOCAB)).metadata);
const renders: Record<string, string> = {};
for (const [name, req] of Object.entries(CASES)) renders[name] = tpl.render(req);
Deno.writeTextFileSync(
  OUT,
  JSON.stringify({ source: "vocab-qwen3.gguf tokenizer.chat_template", renders }, null, 2) + "\n",
);
console.log(`wrote ${Object.keys(renders).length} renders to ${OUT}`);
