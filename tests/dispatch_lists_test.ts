/**
 * The dispatch lists the engine builds, pinned: for both architectures and all three DeltaNet layouts, chunk
 * widths 1/5/8/12/64, batched steps of 2/4/8 slots, with and without int8 activations and grouped experts,
 * every graph's ops (label, kernel variant key, grid, and each binding's buffer, offset and size) and every
 * compute pass a decode call encodes (selectors included) are compared with `tests/fixtures/dispatch_lists.json`,
 * which holds each list's op count and SHA-256 (the full lists are 3 MB: `DISPATCH_LISTS_DUMP=file.json`
 * writes them, for a line diff against the same dump of another tree).
 *
 * A change of the engine's layout (files, classes) must leave this unchanged; a change of what the GPU runs
 * (a fusion, a tile shape, a new binding) changes it on purpose: rerun with `UPDATE_DISPATCH_LISTS=1` and say
 * why in the commit. Buffers are named by their order of first use within one list, with their size, so a
 * list also pins which ops share a buffer.
 * @module
 */
import assert from "node:assert/strict";
import { openGguf } from "../engine/gguf.ts";
import { planModel, type QuantPreset, synthesize } from "../engine/synth.ts";
import type { ArchName } from "../engine/models/mod.ts";
import type { Gpu } from "../engine/gpu/device.ts";
import { samplingParams } from "../engine/sampling.ts";
import { Stage, type StageOptions } from "../engine/mod.ts";
import { testGpu } from "./util/gpu.ts";

const FIXTURE = new URL("./fixtures/dispatch_lists.json", import.meta.url);
const UPDATE = Deno.env.get("UPDATE_DISPATCH_LISTS") === "1";
/** Where to write the full lists (to diff two trees' lists line by line); the fixture keeps their hashes. */
const DUMP = Deno.env.get("DISPATCH_LISTS_DUMP");

/** One bind group entry as recorded at creation. */
interface Entry {
  readonly binding: number;
  readonly buffer: GPUBuffer;
  readonly offset: number;
  readonly size: number;
}

/**
 * A device whose bind groups remember their entries and whose compute passes are recorded, so that a list of
 * ops or a submitted pass can be written out in full. Every call goes to the real device.
 */
function recordingGpu(gpu: Gpu): {
  gpu: Gpu;
  entries: WeakMap<GPUBindGroup, Entry[]>;
  passes: { pipeline: GPUComputePipeline; bindGroup: GPUBindGroup; grid: number[] }[][];
} {
  const entries = new WeakMap<GPUBindGroup, Entry[]>();
  const passes: { pipeline: GPUComputePipeline; bindGroup: GPUBindGroup; grid: number[] }[][] = [];
  const wrapPass = (pass: GPUComputePassEncoder): GPUComputePassEncoder => {
    const ops: { pipeline: GPUComputePipeline; bindGroup: GPUBindGroup; grid: number[] }[] = [];
    passes.push(ops);
    let pipeline: GPUComputePipeline | undefined;
    let bindGroup: GPUBindGroup | undefined;
    return new Proxy(pass, {
      get(target, prop) {
        const v = Reflect.get(target, prop);
        if (typeof v !== "function") return v;
        return (...args: unknown[]) => {
          if (prop === "setPipeline") pipeline = args[0] as GPUComputePipeline;
          if (prop === "setBindGroup") bindGroup = args[1] as GPUBindGroup;
          if (prop === "dispatchWorkgroups") {
            ops.push({
              pipeline: pipeline!,
              bindGroup: bindGroup!,
              grid: [0, 1, 2].map((i) => (args[i] as number) ?? 1),
            });
          }
          return v.apply(target, args);
        };
      },
    });
  };
  const wrapEncoder = (enc: GPUCommandEncoder): GPUCommandEncoder =>
    new Proxy(enc, {
      get(target, prop) {
        const v = Reflect.get(target, prop);
        if (typeof v !== "function") return v;
        if (prop === "beginComputePass") return (...args: unknown[]) => wrapPass(v.apply(target, args));
        return (...args: unknown[]) => v.apply(target, args);
      },
    });
  const device = new Proxy(gpu.device, {
    get(target, prop) {
      const v = Reflect.get(target, prop);
      if (typeof v !== "function") return v;
      if (prop === "createBindGroup") {
        return (desc: GPUBindGroupDescriptor) => {
          const bg = target.createBindGroup(desc);
          const list: Entry[] = [];
          for (const e of desc.entries) {
            const r = e.resource as GPUBufferBinding | GPUBuffer;
            const buffer = "buffer" in r ? r.buffer : r;
            const offset = "buffer" in r ? r.offset ?? 0 : 0;
            const size = "buffer" in r ? r.size ?? buffer.size - offset : buffer.size;
            list.push({ binding: e.binding, buffer, offset, size });
          }
          entries.set(bg, list.sort((a, b) => a.binding - b.binding));
          return bg;
        };
      }
      if (prop === "createCommandEncoder") {
        return (...args: unknown[]) => wrapEncoder(v.apply(target, args));
      }
      return (...args: unknown[]) => v.apply(target, args);
    },
  });
  return { gpu: { ...gpu, device }, entries, passes };
}

/** One line per op: label (when known), variant key, grid, bindings as buffer#order(size)@offset+size. */
function dump(
  ops: readonly {
    label?: string;
    pipeline: GPUComputePipeline;
    bindGroup: GPUBindGroup;
    grid: readonly number[];
  }[],
  entries: WeakMap<GPUBindGroup, Entry[]>,
): string[] {
  const order = new Map<GPUBuffer, number>();
  return ops.map((op) => {
    const es = entries.get(op.bindGroup);
    assert.ok(es, `${op.label ?? op.pipeline.label}: bind group made through the recording device`);
    const bs = es.map((e) => {
      let id = order.get(e.buffer);
      const first = id === undefined;
      if (id === undefined) order.set(e.buffer, id = order.size);
      return `${e.binding}:#${id}${first ? `(${e.buffer.size})` : ""}@${e.offset}+${e.size}`;
    });
    const head = op.label === undefined ? "" : `${op.label} `;
    return `${head}${op.pipeline.label} [${op.grid.join(",")}] ${bs.join(" ")}`;
  });
}

interface Model {
  readonly arch: ArchName;
  readonly quant: QuantPreset;
  readonly layout: "current" | "legacy";
}

/** The three DeltaNet layouts, in quant types that reach every mat-vec path. */
const MODELS: readonly Model[] = [
  { arch: "qwen35moe", quant: "iq4_xs", layout: "current" },
  { arch: "qwen3next", quant: "q8_0", layout: "current" },
  { arch: "qwen3next", quant: "iq4_xs", layout: "legacy" },
];
/**
 * Option sets. Grouped experts are the default for chunks over 8 tokens: as grouped mat-vecs (moe_gmv) from 4
 * up to 16 tokens per expert on average (the tiny models' 8 experts, 2 used: 16 to 64 tokens), as grouped
 * matmuls from 8 tokens per expert when the mat-vecs are off; so per-column changes the 64-token chunk, and
 * grouped matmuls (groupedMatvecMaxTokensPerExpert 0, groupedMinTokensPerExpert 0) the 12- and 64-token ones.
 */
const OPTIONS: readonly { name: string; opts: Partial<StageOptions>; widths?: readonly number[] }[] = [
  { name: "default", opts: {} },
  { name: "int8", opts: { int8Activations: true } },
  { name: "per-column", opts: { groupedExperts: false }, widths: [64] },
  { name: "int8+per-column", opts: { int8Activations: true, groupedExperts: false }, widths: [64] },
  {
    name: "grouped-matmul",
    opts: { groupedMinTokensPerExpert: 0, groupedMatvecMaxTokensPerExpert: 0 },
    widths: [12, 64],
  },
  { name: "route+unfused-norms", opts: { fuseDecodeRoute: true, normPrologueMaxRows: 0 }, widths: [1, 8] },
];
const WIDTHS = [1, 5, 8, 12, 64];
const BATCHES = [2, 4, 8];

const dir = await Deno.makeTempDir({ prefix: "dispatch_lists_" });
/**
 * One recording device for every list: the stages share its pipeline cache (PipelineCache.shared keys on the
 * device object), so each kernel variant compiles once per run instead of once per model and option set.
 */
const rec = recordingGpu(await testGpu());

/** Every list of one model and option set, by case name. */
async function record(m: Model, o: (typeof OPTIONS)[number]): Promise<Record<string, string[]>> {
  const path = `${dir}/${m.arch}-${m.quant}-${m.layout}.gguf`;
  try {
    await Deno.stat(path);
  } catch {
    await synthesize(planModel({ arch: m.arch, preset: "tiny", quant: m.quant, seed: 7, layout: m.layout }), {
      out: path,
    });
  }
  using file = await openGguf(path);
  const stage = await Stage.load(rec.gpu, file, { nCtx: 160, nSlots: 8, maxChunk: 64, ...o.opts });
  const out: Record<string, string[]> = {};
  try {
    for (const n of o.widths ?? WIDTHS) {
      for (const rows of n === 12 ? ["last", "all", "none"] as const : ["last"] as const) {
        out[`graph n=${n} rows=${rows}`] = dump(await stage.graph(0, n, rows), rec.entries);
      }
    }
    for (const b of o.widths ? [] : BATCHES) {
      const slots = Array.from({ length: b }, (_, i) => (i * 3) % 8);
      out[`batch ${slots.join(",")}`] = dump(await stage.batchGraph(slots), rec.entries);
    }
    if (o.name === "default" || o.name === "int8") {
      // The passes a decode encodes (graph and selector: argmax, sampler, top-k): each distinct one once.
      rec.passes.length = 0;
      const prompt = [3, 1, 4, 1, 5, 9, 2, 6, 5, 3];
      await stage.generate(0, prompt, { nNew: 3, top: 2, batch: 2 });
      const hot = samplingParams({ temperature: 0.9, topK: 5, topP: 0.95, minP: 0, seed: 5 });
      await stage.generate(1, prompt, { nNew: 3, sampling: hot, batch: 2 });
      await stage.generateBatch([
        { slot: 2, prompt, opts: { nNew: 3 } },
        { slot: 3, prompt: prompt.slice(0, 4), opts: { nNew: 4, sampling: hot, top: 1 } },
      ], { batch: 2 });
      const seen = new Set<string>();
      let i = 0;
      for (const pass of rec.passes) {
        const lines = dump(pass, rec.entries);
        const key = lines.join("\n");
        if (lines.length === 0 || seen.has(key)) continue;
        seen.add(key);
        out[`decode pass ${i++}`] = lines;
      }
    }
  } finally {
    stage.destroy();
  }
  return out;
}

/** A list's fixture entry: its op count and the SHA-256 of its lines. */
async function digest(lines: readonly string[]): Promise<string> {
  const bytes = new TextEncoder().encode(lines.join("\n"));
  const h = new Uint8Array(await crypto.subtle.digest("SHA-256", bytes));
  return `${lines.length} ${Array.from(h, (b) => b.toString(16).padStart(2, "0")).join("")}`;
}

/** Merges `got` into the JSON object in `file` (keys sorted). */
async function mergeInto(file: URL | string, got: Record<string, unknown>) {
  let all: Record<string, unknown> = {};
  try {
    all = JSON.parse(await Deno.readTextFile(file));
  } catch { /* a new file */ }
  Object.assign(all, got);
  const sorted = Object.fromEntries(Object.entries(all).sort(([a], [b]) => a.localeCompare(b)));
  await Deno.writeTextFile(file, JSON.stringify(sorted, null, 2) + "\n");
}

for (const m of MODELS) {
  Deno.test(`dispatch lists: ${m.arch} ${m.quant} ${m.layout} equal the recorded ones`, async () => {
    const fixture: Record<string, Record<string, string>> = UPDATE
      ? {}
      : JSON.parse(await Deno.readTextFile(FIXTURE));
    const got: Record<string, Record<string, string[]>> = {};
    const hashes: Record<string, Record<string, string>> = {};
    for (const o of OPTIONS) {
      const name = `${m.arch} ${m.quant} ${m.layout} ${o.name}`;
      got[name] = await record(m, o);
      hashes[name] = {};
      for (const [k, lines] of Object.entries(got[name]!)) hashes[name]![k] = await digest(lines);
    }
    if (DUMP) await mergeInto(DUMP, got);
    if (UPDATE) return await mergeInto(FIXTURE, hashes);
    for (const [name, lists] of Object.entries(hashes)) {
      const want = fixture[name];
      assert.ok(want, `${name}: no recorded lists (run with UPDATE_DISPATCH_LISTS=1 once)`);
      assert.deepEqual(Object.keys(lists), Object.keys(want), `${name}: the same lists`);
      const differ = Object.keys(lists).filter((k) => lists[k] !== want[k]);
      assert.deepEqual(
        differ,
        [],
        `${name}: these lists differ from the recorded ones (DISPATCH_LISTS_DUMP=f.json on both trees, then diff): ` +
          differ.map((k) => `${k} (${lists[k]} against ${want[k]})`).join("; "),
      );
    }
  });
}
