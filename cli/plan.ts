/**
 * `mod.ts plan`: which layers each box of a split chain should run (engine/plan.ts), the table that explains
 * it, and the commands that start the head and every worker; `--measure` also times each planned stage on
 * this GPU and prints the speed to pass back.
 * @module
 */
import type { Command } from "./command.ts";
import { parseArgs } from "node:util";
import {
  acquireGpu,
  DEFAULT_HEADROOM_BYTES,
  DEFAULT_MAX_CHUNK,
  formatPlan,
  measureStage,
  modelCosts,
  openGguf,
  type PlanBox,
  planSplit,
  SPEED_UNIT_BYTES_PER_S,
  type SplitPlan,
  type StageMeasurement,
} from "../engine/mod.ts";

const USAGE = `Usage: deno run -A mod.ts plan --model F.gguf --box NAME=MEM_GIB[,SPEED] ... [options]
  --model F          GGUF (first part of a split set); only its header is read
  --box N=MEM[,S]    one per box, in chain order (the first runs the head): N its host name in the commands,
                     MEM the GiB its GPU may use, S its relative speed (default 1; --measure prints this GPU's)
  --ctx N            positions per slot every box is started with (default 8192, the head's)
  --slots N          slots every box is started with (default 4)
  --kv-f16           KV cache in f16 (half the KV memory; every box gets the flag)
  --chunk N          prompt tokens per prefill chunk (default ${DEFAULT_MAX_CHUNK}; activations grow with it)
  --headroom GIB     memory kept free per box for the driver, pipelines and snapshots (default ${
  DEFAULT_HEADROOM_BYTES / 2 ** 30
})
  --port N           the port workers listen on in the printed commands (default 9100)
  --measure          run each planned stage on this GPU for a few decode steps and print its speed
  --steps N          decode steps per measurement (default 16)
  --json             print the plan (and measurements) as JSON`;

function int(flag: string, value: string, min: number, max: number): number {
  const n = Number(value);
  if (!Number.isInteger(n) || n < min || n > max) {
    throw new RangeError(`--${flag} ${value} must be an integer in ${min}..${max}`);
  }
  return n;
}

/**
 * Parses `NAME=MEM_GIB[,SPEED]`.
 * @throws {RangeError} naming the bad part and an example
 */
export function parseBox(s: string): PlanBox {
  const m = /^([A-Za-z0-9][A-Za-z0-9._-]*)=([^,]+)(?:,(.+))?$/.exec(s);
  const hint = "e.g. --box gpu1=24 or --box mac=16,0.5";
  if (!m) throw new RangeError(`--box ${s} is not NAME=MEM_GIB[,SPEED] with NAME a host name (${hint})`);
  const mem = Number(m[2]);
  if (!(Number.isFinite(mem) && mem > 0)) {
    throw new RangeError(`--box ${s}: memory ${m[2]} must be a positive number of GiB (${hint})`);
  }
  const speed = m[3] === undefined ? 1 : Number(m[3]);
  if (!(Number.isFinite(speed) && speed > 0)) {
    throw new RangeError(`--box ${s}: speed ${m[3]} must be a positive number (${hint})`);
  }
  return { name: m[1]!, memBytes: mem * 2 ** 30, speed };
}

/** A shell word: as is when it holds only safe characters, else single-quoted. */
function sh(word: string): string {
  return /^[A-Za-z0-9_./:=@%+,-]+$/.test(word) ? word : `'${word.replaceAll("'", `'\\''`)}'`;
}

/** The command line that starts each box of `p`, in chain order (the head first). */
export function planCommands(
  p: SplitPlan,
  o: { model: string; port: number; chunk: number },
): { box: string; layers: readonly [number, number]; command: string }[] {
  const { nCtx, nSlots, kvF16 } = p.options;
  const sizing = [
    `--slots ${nSlots} --ctx ${nCtx}`,
    ...(kvF16 ? ["--kv-f16"] : []),
    ...(o.chunk !== DEFAULT_MAX_CHUNK ? [`--chunk ${o.chunk}`] : []),
  ].join(" ");
  const model = sh(o.model);
  return p.stages.map((s, i) => {
    const next = p.stages[i + 1];
    const to = next ? ` --next ${next.box.name}:${o.port}` : "";
    const range = `${s.layers[0]}:${s.layers[1]}`;
    const command = i === 0
      ? `llm head --model ${model}${next ? ` --layers ${range}${to}` : ""} ${sizing}`
      : `llm worker --model ${model} --layers ${range} --listen 0.0.0.0:${o.port}${to} ${sizing}`;
    return { box: s.box.name, layers: s.layers, command };
  });
}

/** The `plan` command. */
export const command: Command = {
  usage: USAGE,
  summary: "layer ranges per box for a split (memory and speed), and the commands to start each box",
  async run(argv: string[]): Promise<number> {
    const { values, positionals } = parseArgs({
      args: argv,
      options: {
        model: { type: "string" },
        box: { type: "string", multiple: true },
        ctx: { type: "string", default: "8192" },
        slots: { type: "string", default: "4" },
        "kv-f16": { type: "boolean", default: false },
        chunk: { type: "string", default: String(DEFAULT_MAX_CHUNK) },
        headroom: { type: "string", default: String(DEFAULT_HEADROOM_BYTES / 2 ** 30) },
        port: { type: "string", default: "9100" },
        measure: { type: "boolean", default: false },
        steps: { type: "string", default: "16" },
        json: { type: "boolean", default: false },
        debug: { type: "boolean", default: false },
      },
      allowPositionals: true,
      strict: true,
    });
    if (positionals.length > 0) {
      throw new RangeError(`Unexpected argument ${positionals[0]}: give the model as --model F.gguf`);
    }
    if (!values.model) throw new RangeError("--model is required: the GGUF to plan for");
    const boxes = (values.box ?? []).map(parseBox);
    if (boxes.length === 0) {
      throw new RangeError("--box is required: one --box NAME=MEM_GIB[,SPEED] per box, the head's first");
    }
    const seen = new Set<string>();
    for (const b of boxes) {
      if (seen.has(b.name)) throw new RangeError(`--box ${b.name} is given twice: give each box once`);
      seen.add(b.name);
    }
    const headroom = Number(values.headroom);
    if (!(Number.isFinite(headroom) && headroom >= 0)) {
      throw new RangeError(`--headroom ${values.headroom} must be a number of GiB >= 0`);
    }
    const chunk = int("chunk", values.chunk, 1, 4096);
    const port = int("port", values.port, 1, 65535);
    const steps = int("steps", values.steps, 1, 4096);
    using file = await openGguf(values.model);
    const plan = planSplit(modelCosts(file), boxes, {
      nCtx: int("ctx", values.ctx, 2, 2 ** 24),
      nSlots: int("slots", values.slots, 1, 0xffff),
      kvF16: values["kv-f16"],
      maxChunk: chunk,
      headroomBytes: headroom * 2 ** 30,
    });
    const commands = planCommands(plan, { model: values.model, port, chunk });

    let measured: (StageMeasurement | { layers: readonly [number, number]; error: string })[] | undefined;
    let gpuSummary = "";
    if (values.measure) {
      const gpu = await acquireGpu();
      gpuSummary = gpu.summary;
      measured = [];
      for (const s of plan.stages) {
        try {
          measured.push(await measureStage(gpu, file, { costs: plan.model, layers: s.layers, steps }));
        } catch (e) {
          measured.push({ layers: s.layers, error: e instanceof Error ? e.message : String(e) });
        }
      }
    }
    const ok = (measured ?? []).filter((x): x is StageMeasurement => "speed" in x);
    const speed = ok.length
      ? ok.reduce((a, x) => a + x.activeBytes, 0) / ok.reduce((a, x) => a + x.msPerToken / 1000, 0) /
        SPEED_UNIT_BYTES_PER_S
      : undefined;

    if (values.json) {
      const { hp: _, ...model } = plan.model;
      console.log(JSON.stringify(
        {
          ...plan,
          model: { ...model, nLayer: plan.model.hp.nLayer },
          commands,
          ...(measured ? { measured: { gpu: gpuSummary, stages: measured, speed } } : {}),
        },
        null,
        2,
      ));
      return 0;
    }
    console.log(formatPlan(plan));
    console.log(
      `\nCommands (any start order: the head connects on its first request and retries). Every box needs the ` +
        `same model file and build, and the same link key: export LLM_LINK_KEY=$(openssl rand -hex 32) on one ` +
        `and the same value on the others. Check each worker from the head's box with the head's flags: ` +
        `llm probe HOST:${port} --model ... --layers 0:a --slots ... --ctx ...`,
    );
    for (const c of commands) {
      console.log(`  # ${c.box} (layers ${c.layers[0]}:${c.layers[1]})\n  ${c.command}`);
    }
    if (measured) {
      console.log(`\nMeasured on this GPU (${gpuSummary}), one slot, ${steps} decode steps per stage:`);
      for (const x of measured) {
        const range = `layers ${x.layers[0]}:${x.layers[1]}`;
        if ("error" in x) console.log(`  ${range}: could not run here: ${x.error}`);
        else {
          const perLayer = x.msPerToken / (x.layers[1] - x.layers[0]);
          console.log(
            `  ${range}: ${x.msPerToken.toPrecision(3)} ms per token (${
              perLayer.toPrecision(3)
            } ms per layer), ` +
              `${(x.activeBytes / 1e9 / (x.msPerToken / 1000)).toPrecision(3)} GB/s of active bytes, ` +
              `speed ${x.speed.toPrecision(3)}`,
          );
        }
      }
      if (speed !== undefined) {
        console.log(
          `This GPU's speed: ${speed.toPrecision(3)}: pass --box NAME=MEM_GIB,${
            speed.toPrecision(3)
          } for this box (measure each box on itself and plan again with every box's speed)`,
        );
      }
    }
    return 0;
  },
};
