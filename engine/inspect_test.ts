import assert from "node:assert/strict";
import { command } from "../cli/inspect.ts";
import { openGguf } from "./gguf.ts";
import { Stage } from "./exec/stage.ts";
import { testGpu } from "../tests/util/gpu.ts";
import {
  formatBytes,
  formatReport,
  inspectModel,
  kvBytesPerPosition,
  recurrentBytesPerSlot,
} from "./inspect.ts";
import { planModel, synthesize } from "./synth.ts";

import { FIXTURES } from "../tests/util/fixtures.ts";
const fixture = (arch: string) => new URL(`tiny-${arch}.q8_0.gguf`, FIXTURES).pathname;

/** Runs a CLI command and returns its exit code and what it printed. */
async function runCli(argv: string[]): Promise<{ code: number; out: string }> {
  const lines: string[] = [];
  const log = console.log;
  console.log = (...a: unknown[]) => lines.push(a.join(" "));
  try {
    return { code: await command.run(argv), out: lines.join("\n") };
  } finally {
    console.log = log;
  }
}

Deno.test("inspect on the fixtures: pattern, tensor table, bytes per type and per-layer memory", async () => {
  for (const [arch, nTensors] of [["qwen35moe", 76], ["qwen3next", 73]] as const) {
    using f = await openGguf(fixture(arch));
    const r = inspectModel(f, { nCtx: 1000, nSlots: 3 });
    assert.equal(r.arch, arch);
    assert.equal(r.pattern, "DDDA");
    assert.deepEqual(r.check, { ok: true, tiedOutput: false });
    assert.equal(r.tensors.length, nTensors);
    // Q8_0 matrices, F32 everything 1-D plus router and conv (fixture README); bytes sum to the data.
    assert.deepEqual(Object.keys(r.byType).sort(), ["F32", "Q8_0"]);
    const all = [...f.tensors.values()].reduce((a, t) => a + t.nbytes, 0);
    assert.equal(r.byType.F32!.bytes + r.byType.Q8_0!.bytes, all);
    assert.equal(r.globalBytes + r.layers.reduce((a, l) => a + l.weightBytes, 0), all);
    assert.equal(r.totals.weightBytes, all);
    // Attention: K and V f32, 1 KV head × 256 dims → 2048 bytes a position. DeltaNet: conv ring 4 × 1024 f32 plus
    // state 4 heads × 128 × 128 f32 = 278 528 bytes a slot, and once more for the taps.
    assert.equal(kvBytesPerPosition(r.hparams), 2048);
    assert.deepEqual(r.layers.map((l) => [l.kind, l.kvBytes, l.recurrentBytes]), [
      ["deltanet", 0, 278528 * 4],
      ["deltanet", 0, 278528 * 4],
      ["deltanet", 0, 278528 * 4],
      ["attention", 2048 * 1000 * 3, 0],
    ]);
    assert.equal(r.layers[0]!.layout, arch === "qwen3next" ? "qkv_ba" : "qkv_beta_alpha");
    assert.equal(r.totals.totalBytes, all + 2048 * 3000 + 3 * 278528 * 4);
    const text = formatReport(r);
    assert.match(text, new RegExp(`architecture ${arch}: 4 layers, ${nTensors} tensors`));
    assert.match(text, /pattern +DDDA/);
    assert.match(text, /check +ok/);
    assert.match(text, /blk\.3\.attn_q\.weight +Q8_0 +\[256, 2048\] +557056/);
    assert.match(text, /^3 +attention +2\.74 MiB +5\.86 MiB +0 B/m);
  }
});

Deno.test("inspect on split, MTP and broken files; the CLI prints text or JSON and fails on a bad file", async () => {
  const dir = await Deno.makeTempDir({ prefix: "inspect_test_" });
  try {
    const plan = planModel({ arch: "qwen35moe", preset: "tiny", quant: "q8_0", seed: 3, mtp: true });
    const [first] = (await synthesize(plan, { out: `${dir}/m.gguf`, splitParts: 2 })).paths;
    using f = await openGguf(first!);
    const r = inspectModel(f, { nCtx: 16, nSlots: 1 });
    assert.equal(r.parts, 2);
    assert.equal(r.pattern, "DDDAM");
    assert.equal(r.layers[4]!.kind, "mtp");
    assert.ok(r.layers[4]!.weightBytes > 0);
    assert.equal(r.totals.weightBytes, plan.totalBytes - r.layers[4]!.weightBytes);
    assert.match(formatReport(r), /\(\+1 split parts\)/);

    const text = await runCli([first!, "--ctx", "16"]);
    assert.equal(text.code, 0);
    assert.match(text.out, /pattern +DDDAM/);
    const json = await runCli([first!, "--json", "--slots", "2"]);
    assert.equal(json.code, 0);
    const parsed = JSON.parse(json.out);
    assert.equal(parsed.nSlots, 2);
    assert.equal(parsed.layers.length, 5);
    assert.equal(parsed.hparams.nExpert, 8);

    // A file without its output norm still inspects, reports the failed check and exits 1.
    const broken = planModel({ arch: "qwen3next", preset: "tiny", quant: "f32", seed: 3 });
    const cut = { ...broken, tensors: broken.tensors.filter((t) => t.spec.id !== "output_norm") };
    await synthesize(cut, { out: `${dir}/broken.gguf` });
    const bad = await runCli([`${dir}/broken.gguf`]);
    assert.equal(bad.code, 1);
    assert.match(bad.out, /check +FAILED: Tensor output_norm\.weight is missing/);
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
  assert.equal(formatBytes(1536), "1.50 KiB");
  assert.equal(formatBytes(1023), "1023 B");
  assert.equal(
    recurrentBytesPerSlot(
      { ssmConv: 4, ssmGroups: 16, ssmState: 128, ssmInner: 4096, ssmDtRank: 32 } as Parameters<
        typeof recurrentBytesPerSlot
      >[0],
    ),
    4 * 8192 * 4 + 2 * 1024 * 1024,
  );
});

Deno.test("inspect's state bytes are what a stage allocates (KV f32 or f16, conv ring and recurrent state)", async () => {
  const gpu = await testGpu();
  for (const arch of ["qwen35moe", "qwen3next"] as const) {
    using f = await openGguf(fixture(arch));
    for (const kvF16 of [false, true]) {
      const r = inspectModel(f, { nCtx: 200, nSlots: 2, kvF16 });
      const stage = await Stage.load(gpu, f, { nCtx: 200, nSlots: 2, maxChunk: 8, kvF16 });
      try {
        assert.equal(
          stage.states.totalBytes,
          r.totals.kvBytes + r.totals.recurrentBytes,
          `${arch} kvF16 ${kvF16}`,
        );
      } finally {
        stage.destroy();
      }
    }
  }
});
