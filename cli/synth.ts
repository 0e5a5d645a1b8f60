/**
 * `mod.ts synth`: writes a synthetic GGUF with the real models' metadata, names, shapes and types.
 * @module
 */
import type { Command } from "./command.ts";
import { parseArgs } from "node:util";
import {
  formatBytes,
  isArchName,
  planModel,
  type Preset,
  PRESETS,
  QUANT_PRESETS,
  type QuantPreset,
  synthesize,
} from "../engine/mod.ts";

const USAGE = `Usage: deno run -A mod.ts synth --arch qwen35moe|qwen3next --out FILE.gguf [options]
  --preset ${PRESETS.join("|")}   dimensions (default tiny)
  --quant ${QUANT_PRESETS.join("|")}   per-tensor types (default q8_0)
  --seed N              random seed (default 1)
  --layout current|legacy   DeltaNet input layout (legacy: qwen3next ssm_in + ssm_ba)
  --mtp                 append one MTP block (block_count + 1, nextn_predict_layers = 1)
  --split-parts K       write K split files FILE-0000i-of-0000K.gguf`;

function pick<T extends string>(flag: string, value: string, allowed: readonly T[]): T {
  if (!(allowed as readonly string[]).includes(value)) {
    throw new RangeError(`--${flag} ${value} is not one of ${allowed.join(", ")}`);
  }
  return value as T;
}

function int(flag: string, value: string, min: number): number {
  const n = Number(value);
  if (!Number.isInteger(n) || n < min) {
    throw new RangeError(`--${flag} ${value} must be an integer >= ${min}`);
  }
  return n;
}

/** The `synth` command. */
export const command: Command = {
  usage: USAGE,
  summary: "write a synthetic qwen3next/qwen35moe GGUF (tiny or full-size, any quant recipe)",
  async run(argv: string[]): Promise<number> {
    const { values } = parseArgs({
      args: argv,
      options: {
        arch: { type: "string" },
        preset: { type: "string", default: "tiny" },
        quant: { type: "string", default: "q8_0" },
        seed: { type: "string", default: "1" },
        out: { type: "string" },
        layout: { type: "string", default: "current" },
        mtp: { type: "boolean", default: false },
        "split-parts": { type: "string", default: "1" },
        debug: { type: "boolean", default: false },
        help: { type: "boolean", default: false },
      },
      strict: true,
    });
    if (values.help) {
      console.log(USAGE);
      return 0;
    }
    if (values.arch === undefined || values.out === undefined) {
      console.error(`${USAGE}\nerror: --arch and --out are required`);
      return 2;
    }
    if (!isArchName(values.arch)) throw new RangeError(`--arch ${values.arch} is not qwen35moe or qwen3next`);
    const parts = int("split-parts", values["split-parts"], 1);
    const plan = planModel({
      arch: values.arch,
      preset: pick<Preset>("preset", values.preset, PRESETS),
      quant: pick<QuantPreset>("quant", values.quant, QUANT_PRESETS),
      seed: int("seed", values.seed, 0) >>> 0,
      layout: pick("layout", values.layout, ["current", "legacy"] as const),
      mtp: values.mtp,
    });
    if (parts > plan.tensors.length) {
      throw new RangeError(
        `--split-parts ${parts} is more than the model's ${plan.tensors.length} tensors: every split part ` +
          `holds at least one tensor, so give at most ${plan.tensors.length}`,
      );
    }
    console.log(
      `synth ${values.arch} ${values.preset} ${values.quant}: ${plan.tensors.length} tensors, ` +
        `${formatBytes(plan.totalBytes)} of data, DeltaNet layout ${plan.layout}`,
    );
    let lastPrint = performance.now();
    const t0 = lastPrint;
    const r = await synthesize(plan, {
      out: values.out,
      splitParts: parts,
      onTensor: (done, total, bytes) => {
        const now = performance.now();
        if (now - lastPrint < 2000 || done === total) return;
        lastPrint = now;
        const mbs = bytes / 1e6 / ((now - t0) / 1000);
        console.log(`  ${done}/${total} tensors, ${formatBytes(bytes)}, ${mbs.toFixed(0)} MB/s`);
      },
    });
    for (const p of r.paths) console.log(`wrote ${p}`);
    console.log(
      `${formatBytes(r.dataBytes)} of tensor data in ${r.seconds.toFixed(2)} s: ${
        r.mbPerSecond.toFixed(0)
      } MB/s`,
    );
    return 0;
  },
};
