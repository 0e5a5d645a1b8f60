/**
 * The Jinja interpreter chat templates run on: `@huggingface/jinja` (pinned in deno.json) with Python's
 * spelling for `true|string`, `false|string` and `none|string` (`True`, `False`, `None`). The Qwen3.5
 * template writes scalar tool-call arguments through `|string`; under transformers, where the models' training
 * prompts were rendered, that gives `True`/`None`, while the package gives `true` and fails on null.
 * @module
 */
import { Interpreter, parse, tokenize } from "@huggingface/jinja";

/** The part of the package's runtime values this file touches. */
interface RuntimeValue {
  type: string;
  value: unknown;
}

/** The package's private filter hook (a plain prototype method in the published JavaScript). */
type ApplyFilter = (
  operand: RuntimeValue,
  filterNode: { type: string; value?: unknown },
  env: unknown,
) => unknown;

// The package does not export its StringValue class; a rendered program is one.
const StringValue = (new Interpreter().run(parse(tokenize("{{ '' }}"))) as object).constructor as new (
  value: string,
) => RuntimeValue;

const base = (Interpreter.prototype as unknown as { applyFilter: ApplyFilter }).applyFilter;
if (typeof base !== "function" || new StringValue("x").type !== "StringValue") {
  throw new Error(
    "Internal error: @huggingface/jinja no longer has Interpreter.prototype.applyFilter or a StringValue " +
      "result: keep the version pinned in deno.json or update engine/text/_jinja.ts",
  );
}

/** Interpreter whose `|string` filter spells booleans and none as Python does. */
export class PyInterpreter extends Interpreter {}

(PyInterpreter.prototype as unknown as { applyFilter: ApplyFilter }).applyFilter = function (
  this: unknown,
  operand,
  filterNode,
  env,
) {
  if (filterNode.type === "Identifier" && filterNode.value === "string") {
    if (operand.type === "BooleanValue") return new StringValue(operand.value ? "True" : "False");
    if (operand.type === "NullValue") return new StringValue("None");
  }
  return base.call(this, operand, filterNode, env);
};
