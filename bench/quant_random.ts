/**
 * Throughput of `fillRandomBlocks` per type, as a streaming writer uses it: fills a `--mb` MiB buffer in
 * `--chunk-mb` MiB chunks (whole blocks), `--reps` times after one warm-up pass, and prints one JSON line
 * per type with MB/s of the best pass and the median pass (1 MB = 1e6 bytes), plus the 1-minute load
 * average: on a shared machine the best pass is the capability, the median what contention left.
 *
 * Run: `deno run -A bench/quant_random.ts [--mb 64] [--chunk-mb 4] [--reps 9] [--types IQ4_XS,Q8_0,Q6_K]`
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
      "chunk-mb": { type: "string", default: "4" },
      reps: { type: "string", default: "9" },
      types: { type: "string", default: ALL.join(",") },
    },
  });
  const mib = Number(values.mb);
  const reps = Number(values.reps);
  const chunkMib = Number(values["chunk-mb"]);
  const types = values.types.split(",");
  const rev = commit();
  for (const name of types) {
    if (!isTypeName(name)) throw new TypeError(`Unknown type ${name}: expected one of ${ALL.join(", ")}`);
    const bs = typeInfo(name).blockBytes;
    const buf = new Uint8Array(Math.floor((mib * 2 ** 20) / bs) * bs);
    const chunk = Math.max(1, Math.floor((chunkMib * 2 ** 20) / bs)) * bs;
    const state = new RandomState(1);
    const scale = name === "IQ4_XS" ? 2e-5 : 1e-3;
    const pass = () => {
      for (let o = 0; o < buf.length; o += chunk) {
        fillRandomBlocks(name, buf.subarray(o, Math.min(buf.length, o + chunk)), { scale, state });
      }
    };
    pass();
    const secs: number[] = [];
    for (let r = 0; r < reps; r++) {
      const t0 = performance.now();
      pass();
      secs.push((performance.now() - t0) / 1000);
    }
    secs.sort((a, b) => a - b);
    const mbPerS = (sec: number) => Math.round(buf.length / sec / 1e6);
    console.log(JSON.stringify({
      bench: "quant_random",
      commit: rev,
      command: `deno run -A bench/quant_random.ts --mb ${mib} --chunk-mb ${chunkMib} --reps ${reps}`,
      type: name,
      sizeBytes: buf.length,
      chunkBytes: chunk,
      reps,
      scale,
      passSecondsBest: Number(secs[0]!.toFixed(4)),
      mbPerS: mbPerS(secs[0]!),
      mbPerSMedian: mbPerS(secs[secs.length >> 1]!),
      loadAvg1m: Deno.loadavg()[0],
    }));
  }
}

main();
