/**
 * `mod.ts inspect`: architecture, hyper-parameters, layer pattern, tensor table and memory per layer of a
 * GGUF (split sets and the fixtures included).
 * @module
 */
import type { Command } from "./command.ts";
import { parseArgs } from "node:util";
import { checkNumerics, formatReport, inspectModel, MAX_SLOTS, openGguf } from "../engine/mod.ts";

const USAGE = `Usage: deno run -A mod.ts inspect FILE.gguf [--ctx N] [--slots S] [--json]
  --ctx N     positions of KV cache per slot for the memory table (default 4096)
  --slots S   concurrent sequences for the memory table (default 1)
  --kv-f16    KV cache numbers for an f16 cache (head/generate --kv-f16), half the f32 ones
  --json      print the report as JSON
  --check     also read every tensor and report non-finite values (NaN/Inf in float tensors or block
              scales); exits 1 when any is found`;

function int(flag: string, value: string, max: number): number {
  const n = Number(value);
  if (!Number.isInteger(n) || n < 1 || n > max) {
    throw new RangeError(`--${flag} ${value} must be an integer in 1..${max}`);
  }
  return n;
}

/** The `inspect` command; exits 1 when the file fails its architecture's tensor check. */
export const command: Command = {
  usage: USAGE,
  summary: "print a GGUF's hyper-parameters, tensors and memory per layer (KV and recurrent state)",
  async run(argv: string[]): Promise<number> {
    const { values, positionals } = parseArgs({
      args: argv,
      options: {
        ctx: { type: "string", default: "4096" },
        slots: { type: "string", default: "1" },
        json: { type: "boolean", default: false },
        check: { type: "boolean", default: false },
        "kv-f16": { type: "boolean", default: false },
        debug: { type: "boolean", default: false },
        help: { type: "boolean", default: false },
      },
      allowPositionals: true,
      strict: true,
    });
    if (values.help) {
      console.log(USAGE);
      return 0;
    }
    const [path, ...extra] = positionals;
    if (path === undefined || extra.length > 0) {
      console.error(`${USAGE}\nerror: give exactly one GGUF path`);
      return 2;
    }
    using file = await openGguf(path);
    const report = inspectModel(file, {
      nCtx: int("ctx", values.ctx, 2 ** 24),
      nSlots: int("slots", values.slots, MAX_SLOTS),
      kvF16: values["kv-f16"],
    });
    const nonFinite = values.check ? await checkNumerics(file) : undefined;
    if (values.json) console.log(JSON.stringify(nonFinite ? { ...report, nonFinite } : report, null, 2));
    else {
      console.log(formatReport(report));
      if (nonFinite) {
        console.log(
          nonFinite.length === 0
            ? "numerics   ok: every tensor value and block scale is finite"
            : `numerics   FAILED: ${nonFinite.length} tensor(s) hold NaN or Inf (re-download or re-export the file):\n` +
              nonFinite.map((t) => `  ${t.name} (${t.type}): ${t.count} values, first at element ${t.first}`)
                .join("\n"),
        );
      }
    }
    return report.check.ok && (nonFinite ?? []).length === 0 ? 0 : 1;
  },
};
