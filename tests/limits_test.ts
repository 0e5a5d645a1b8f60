/**
 * No silent garbage from the GPU's limits (issue 18 item 1): a stage whose buffers would not fit the device's
 * binding limit is refused at load with the numbers and the largest `--ctx`/`--chunk` that fits; absurd slot
 * counts are refused; and a GPU error no scope captured voids the stage's results (a failed run, never
 * output computed from invalid buffers).
 * @module
 */
import assert from "node:assert/strict";
import { GpuError, openGguf, Stage } from "../engine/mod.ts";
import {
  activationWords,
  checkStageFits,
  kvBytesPerPosition,
  MAX_SLOTS,
} from "../engine/exec/activations.ts";
import { stageInfo } from "../engine/mod.ts";
import { helloOf } from "../wire/chain.ts";
import { checkChain } from "../wire/hello.ts";
import { buildInfo } from "../version.ts";
import { testGpu } from "./util/gpu.ts";
import { fixturePath } from "./util/fixtures.ts";

const MODEL = fixturePath("tiny-qwen35moe.q8_0.gguf");

Deno.test("checkStageFits names the buffer, the limit and the largest --ctx / --chunk that fits", async () => {
  using f = await openGguf(MODEL);
  const stage = await Stage.load(await testGpu(), f, { nCtx: 16, nSlots: 1, maxChunk: 8 });
  const hp = stage.hp;
  stage.destroy();
  const MiB = 2 ** 20;
  // 16 MiB: above the batched step's decode partials (partO: 16 columns of 128 splits), below the cache.
  const limits = { maxStorageBufferBindingSize: 16 * MiB, maxBufferSize: 1024 * MiB };
  const perPos = kvBytesPerPosition(hp) / 2;
  const fits = Math.floor(limits.maxStorageBufferBindingSize / perPos);
  const layers = [0, hp.nLayer] as const;
  // The largest context that fits passes, one more position is refused with that number.
  checkStageFits(hp, { layers, nCtx: fits, nSlots: 1, maxChunk: 8 }, limits);
  assert.throws(
    () => checkStageFits(hp, { layers, nCtx: fits + 1, nSlots: 1, maxChunk: 8 }, limits),
    new RegExp(
      `--ctx ${
        fits + 1
      } needs a K \\(and a V\\) cache of .* binds at most 16\\.0 MiB .*use --ctx ${fits} or less`,
    ),
  );
  // A DeltaNet-only range has no KV cache: any context fits.
  const dn = hp.isAttention.indexOf(false);
  checkStageFits(hp, { layers: [dn, dn + 1], nCtx: 10 * fits, nSlots: 1, maxChunk: 8 }, limits);
  // Activations grow with the chunk: a wide one is refused with a chunk that fits, which then passes. The
  // limit: the largest buffer at chunk 8 (some, like the decode partials, do not grow with the chunk).
  const at8 = activationWords(hp, { maxChunk: 8, deltaNet: true, last: true });
  const chunkLimits = {
    maxStorageBufferBindingSize: 4 * Math.max(...Object.values(at8)),
    maxBufferSize: 1024 * MiB,
  };
  let suggested = 0;
  assert.throws(
    () => checkStageFits(hp, { layers, nCtx: 64, nSlots: 1, maxChunk: 4096 }, chunkLimits),
    (e: unknown) => {
      const m = e instanceof RangeError &&
        /^--chunk 4096 needs an activation buffer "\w+" of .* use --chunk (\d+) or less$/
          .exec(e.message);
      suggested = m ? Number(m[1]) : 0;
      return suggested > 0;
    },
  );
  checkStageFits(hp, { layers, nCtx: 64, nSlots: 1, maxChunk: suggested }, chunkLimits);
  // Below a buffer that does not grow with the chunk (the same words at chunk 16 and 32: up to 16 rows, a
  // batched step's, every buffer holds as many), the message blames the model, not the chunk.
  const at16 = activationWords(hp, { maxChunk: 16, deltaNet: true, last: true });
  const at32 = activationWords(hp, { maxChunk: 32, deltaNet: true, last: true });
  const fixed = Math.max(...Object.entries(at16).filter(([k, w]) => at32[k] === w).map(([, w]) => w));
  assert.throws(
    () =>
      checkStageFits(hp, { layers, nCtx: 64, nSlots: 1, maxChunk: 8 }, {
        ...chunkLimits,
        maxStorageBufferBindingSize: 4 * fixed - 4,
      }),
    /needs .* whatever --chunk is, .* the model is too large for this GPU's limits/,
  );
  assert.throws(
    () => checkStageFits(hp, { layers, nCtx: 64, nSlots: MAX_SLOTS + 1, maxChunk: 8 }, limits),
    new RegExp(`--slots ${MAX_SLOTS + 1} is out of range 1\\.\\.${MAX_SLOTS}`),
  );
});

Deno.test("a context whose KV cache exceeds this GPU's binding limit is refused at load, not run as zeros", async () => {
  const gpu = await testGpu();
  using f = await openGguf(MODEL);
  const probe = await Stage.load(gpu, f, { nCtx: 16, nSlots: 1, maxChunk: 8 });
  const perPos = kvBytesPerPosition(probe.hp) / 2;
  probe.destroy();
  const limit = Math.min(gpu.device.limits.maxStorageBufferBindingSize, gpu.device.limits.maxBufferSize);
  const tooMany = Math.floor(limit / perPos) + 1;
  await assert.rejects(
    Stage.load(gpu, f, { nCtx: tooMany, nSlots: 1, maxChunk: 8, onLog: () => {} }),
    (e: unknown) =>
      e instanceof RangeError &&
      e.message.includes(`--ctx ${tooMany} needs`) && e.message.includes(`use --ctx ${tooMany - 1} or less`),
  );
});

Deno.test("a --ctx past the training context loads with a warning", async () => {
  using f = await openGguf(MODEL);
  const lines: string[] = [];
  const gpu = await testGpu();
  const probe = await Stage.load(gpu, f, { nCtx: 16, nSlots: 1, maxChunk: 8, onLog: (l) => lines.push(l) });
  const train = probe.hp.nCtxTrain;
  probe.destroy();
  assert.deepEqual(lines.filter((l) => l.startsWith("Warning")), []);
  const perPos = kvBytesPerPosition(probe.hp) / 2;
  const limit = Math.min(gpu.device.limits.maxStorageBufferBindingSize, gpu.device.limits.maxBufferSize);
  assert.ok(train + 1 <= Math.floor(limit / perPos), "the fixture's training context fits this GPU");
  const s = await Stage.load(gpu, f, {
    nCtx: train + 1,
    nSlots: 1,
    maxChunk: 8,
    onLog: (l) => lines.push(l),
  });
  s.destroy();
  assert.ok(
    lines.some((l) => l.includes(`exceeds the model's training context of ${train}`)),
    lines.join("\n"),
  );
});

Deno.test("a GPU error nobody captured voids the stage: run and generate fail with GpuError", async () => {
  const gpu = await testGpu();
  using f = await openGguf(MODEL);
  const stage = await Stage.load(gpu, f, { nCtx: 32, nSlots: 1, maxChunk: 8 });
  try {
    await stage.run(0, { tokens: [1, 2, 3] }, 0); // healthy first
    // An invalid command on the same device (a copy within one buffer), outside any error scope.
    const b = gpu.device.createBuffer({ size: 16, usage: GPUBufferUsage.COPY_SRC | GPUBufferUsage.COPY_DST });
    const enc = gpu.device.createCommandEncoder();
    enc.copyBufferToBuffer(b, 0, b, 0, 16);
    gpu.device.queue.submit([enc.finish()]);
    await gpu.device.queue.onSubmittedWorkDone();
    await new Promise((r) => setTimeout(r, 20));
    b.destroy();
    await assert.rejects(
      stage.run(0, { tokens: [4] }, 3),
      (e: unknown) => e instanceof GpuError && /results are void/.test(e.message),
    );
    await assert.rejects(stage.generate(0, [1, 2], { nNew: 4 }), GpuError);
  } finally {
    stage.destroy();
  }
});

Deno.test("Stage.load refuses norm fusion and expert grouping limits out of range before touching the GPU", async () => {
  using f = await openGguf(MODEL);
  const gpu = await testGpu();
  for (
    const [opts, msg] of [
      [{ combineNormMinRows: 1 }, /combineNormMinRows must be an integer ≥ 2, got 1/],
      [{ combineNormMinRows: 2.5 }, /combineNormMinRows must be an integer ≥ 2, got 2\.5/],
      [{ normPrologueMaxRows: -1 }, /normPrologueMaxRows must be an integer ≥ 0 \(0: never fuse\), got -1/],
      [{ groupedMinTokensPerExpert: -1 }, /groupedMinTokensPerExpert must be a number ≥ 0, got -1/],
      [{ groupedMinTokensPerExpert: NaN }, /groupedMinTokensPerExpert must be a number ≥ 0, got NaN/],
      [
        { groupedMatvecMaxTokensPerExpert: -2 },
        /groupedMatvecMaxTokensPerExpert must be a number ≥ 0, got -2/,
      ],
    ] as const
  ) {
    await assert.rejects(Stage.load(gpu, f, { nCtx: 16, nSlots: 1, maxChunk: 8, ...opts }), msg);
  }
});

Deno.test("a stage with int8 x for its experts alone says so in its hello, and a chain refuses to mix it", async () => {
  using f = await openGguf(MODEL);
  const gpu = await testGpu();
  const load = (int8Experts: boolean) =>
    Stage.load(gpu, f, { layers: [2, 4], nCtx: 16, nSlots: 1, maxChunk: 8, int8Experts });
  const [experts, plain] = [await load(true), await load(false)];
  try {
    assert.equal(experts.int8Experts, true);
    assert.equal(experts.int8Activations, false);
    const a = stageInfo(experts, "qwen35moe");
    const b = stageInfo(plain, "qwen35moe");
    assert.deepEqual([a.int8Experts, a.int8Activations, b.int8Experts], [true, false, false]);
    const build = buildInfo();
    const hello = (info: typeof a, first: number) =>
      helloOf({ ...info, layers: { ...info.layers, first, end: first + 2 } }, { build, last: first === 2 });
    const refusal = checkChain(hello(b, 0), hello(a, 2));
    assert.equal(refusal?.field, "int8Experts");
    assert.match(
      refusal!.message,
      /runs f32 x everywhere \(--f32-experts\) but .* runs int8 x for the experts alone \(--int8-experts\): start every stage with the same one of/,
    );
    assert.equal(checkChain(hello(a, 0), hello(a, 2)), undefined);
  } finally {
    experts.destroy();
    plain.destroy();
  }
});
