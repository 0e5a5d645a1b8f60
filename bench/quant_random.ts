/**
 * Throughput of `fillRandomBlocks` per type: fills a `--mb` MiB buffer `--reps` times (after one warm-up)
 * and prints one JSON line per type with MB/s (1 MB = 1e6 bytes).
 *
 * Run: `deno run -A bench/quant_random.ts [--mb 64] [--reps 5] [--types IQ4_XS,Q8_0,Q6_K]`
 * @module
 */

import { parseArgs } from "node:util";
import { fillRandomBlocks, RandomState } from "../engine/quant/random.ts";
import { type GgmlTypeName, TYPE_ID, typeInfo } from "../engine/quant/types.ts";

const ALL = Object.keys(TYPE_ID) as GgmlTypeName[];

function isTypeName(s: string): s is GgmlTypeName {
  return (ALL as string[]).includes(s);
}

function commit(): string {
  try {
    const out = new Deno.Command("git", { args: ["rev-parse", "--short", "HEAD"], stderr: "null" })
      .outputSync();
    return new TextDecoder().decode(out.stdout).trim() || "unknown";
  } catch (e) {
    return `unknown (${e instanceof Error ? e.message : String(e)})`;
  }
}

function main(): void {
  const { values } = parseArgs({
    args: Deno.args,
    options: {
      mb: { type: "string", default: "64" },
      reps: { type: "string", default: "5" },
      types: { type: "string", default: ALL.join(",") },
    },
  });
  const mib = Number(values.mb);
  const reps = Number(values.reps);
  const types = values.types.split(",");
  const rev = commit();
  for (const name of types) {
    if (!isTypeName(name)) throw new TypeError(`Unknown type ${name}: expected one of ${ALL.join(", ")}`);
    const bs = typeInfo(name).blockBytes;
    const buf = new Uint8Array(Math.floor((mib * 2 ** 20) / bs) * bs);
    const state = new RandomState(1);
    const scale = name === "IQ4_XS" ? 2e-5 : 1e-3;
    fillRandomBlocks(name, buf, { scale, state });
    const t0 = performance.now();
    for (let r = 0; r < reps; r++) fillRandomBlocks(name, buf, { scale, state });
    const s = (performance.now() - t0) / 1000;
    console.log(JSON.stringify({
      bench: "quant_random",
      commit: rev,
      command: `deno run -A bench/quant_random.ts --mb ${mib} --reps ${reps}`,
      type: name,
      sizeBytes: buf.length,
      reps,
      scale,
      seconds: Number(s.toFixed(4)),
      mbPerS: Math.round((buf.length * reps) / s / 1e6),
    }));
  }
}

main();
