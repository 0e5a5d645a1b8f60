/**
 * Regenerates the chat-template golden files from the cases in `chat_template_cases.ts`:
 * `chat_template_qwen3.json` with the real Qwen3 template of `tests/fixtures/vocab-qwen3.gguf`, and
 * `chat_template_qwen35.json` with the built-in Qwen3.5 template (no Qwen3.5 template fixture exists; those
 * renders were hand-checked against spec/chat.md §6, and compared outside the repo with the published
 * Qwen3.5-35B-A3B `chat_template.jinja`, sha256 a4aee8af…c715, run by the same interpreter: identical on
 * every case). A case the template refuses records its error.
 * Run after a deliberate change, then review the diff:
 *
 *   deno run -A tests/golden/gen_chat_template.ts
 * @module
 */
import { fixturePath } from "../util/fixtures.ts";
import { openGguf } from "../../engine/gguf.ts";
import { ChatTemplate, ChatTemplateError, QWEN35_TEMPLATE } from "../../engine/text/template.ts";
import { CASES } from "./chat_template_cases.ts";

const VOCAB = fixturePath("vocab-qwen3.gguf");

/** One golden entry: the rendered prompt, or the code and message of the template's refusal. */
export type GoldenRender = string | { error: string; message: string };

function write(file: string, source: string, tpl: ChatTemplate): void {
  const renders: Record<string, GoldenRender> = {};
  for (const [name, req] of Object.entries(CASES)) {
    try {
      renders[name] = tpl.render(req);
    } catch (e) {
      if (!(e instanceof ChatTemplateError)) throw e;
      renders[name] = { error: e.code, message: e.message };
    }
  }
  const path = new URL(file, import.meta.url).pathname;
  Deno.writeTextFileSync(path, JSON.stringify({ source, renders }, null, 2) + "\n");
  console.log(`wrote ${Object.keys(renders).length} renders to ${path}`);
}

if (import.meta.main) {
  write(
    "./chat_template_qwen3.json",
    "vocab-qwen3.gguf tokenizer.chat_template",
    ChatTemplate.fromGguf((await openGguf(VOCAB)).metadata),
  );
  write(
    "./chat_template_qwen35.json",
    "built-in qwen35 (engine/text/_builtin_templates.ts)",
    new ChatTemplate(QWEN35_TEMPLATE, { origin: "built-in qwen35", builtin: true }),
  );
}
