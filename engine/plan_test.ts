/**
 * The split planner: its memory per stage is what Stage.load allocates (every buffer created during the load,
 * on the software adapter, for several ranges of both tiny fixtures), and on the full-size 35B-A3B shape
 * (a header-only model: the synthesizer's tensor table, no data) it fits boxes, balances time by speed,
 * and refuses with the shortfall when nothing fits or a box is too small for even one layer.
 * @module
 */
import assert from "node:assert/strict";
import { openGguf } from "./gguf.ts";
import { GgufFile, GgufMetadata, type GgufTensorInfo } from "./gguf.ts";
import { Stage } from "./exec/stage.ts";
import { testGpu } from "../tests/util/gpu.ts";
import { FIXTURES } from "../tests/util/fixtures.ts";
import { planModel, type SynthOptions } from "./synth.ts";
import { typeInfo } from "./quant/types.ts";
import { formatBytes } from "./inspect.ts";
import {
  DEFAULT_HEADROOM_BYTES,
  formatPlan,
  modelCosts,
  type PlanBox,
  PlanError,
  planSplit,
  type SplitPlan,
  stageMemory,
} from "./plan.ts";

const GIB = 2 ** 30;
const fixture = (arch: string) => new URL(`tiny-${arch}.q8_0.gguf`, FIXTURES).pathname;

/** A model's header without its data: what the planner reads (tensor table and metadata), for full-size shapes. */
function headerOnly(opts: SynthOptions): GgufFile {
  const plan = planModel(opts);
  const path = `<header of ${opts.arch} ${opts.preset} ${opts.quant}>`;
  const tensors = new Map<string, GgufTensorInfo>();
  let offset = 0;
  for (const t of plan.tensors) {
    const nElems = t.spec.ne.reduce((a, b) => a * b, 1);
    tensors.set(t.spec.name, {
      name: t.spec.name,
      type: typeInfo(t.type),
      ne: t.spec.ne,
      nElems,
      nbytes: t.nbytes,
      part: 0,
      offsetBytes: offset,
      absOffsetBytes: offset,
    });
    offset += Math.ceil(t.nbytes / 32) * 32;
  }
  const part = {
    path,
    sizeBytes: offset,
    version: 3,
    alignment: 32,
    dataStartBytes: 0,
    tensorCount: tensors.size,
  };
  return new GgufFile([part], new GgufMetadata(new Map(plan.kv), path), tensors, []);
}

/** The PlanError `f` throws (fails when it returns or throws anything else). */
function refusal(f: () => unknown): PlanError {
  try {
    f();
  } catch (e) {
    if (e instanceof PlanError) return e;
    throw e;
  }
  throw new Error("Expected a PlanError, but the plan succeeded");
}

const box = (name: string, memGiB: number, speed = 1): PlanBox => ({ name, memBytes: memGiB * GIB, speed });

function checkTiles(p: SplitPlan, boxes: readonly PlanBox[]): void {
  const n = p.model.hp.nLayer;
  assert.equal(p.stages.length, boxes.length);
  let at = 0;
  for (const [i, s] of p.stages.entries()) {
    assert.equal(s.box, boxes[i]);
    assert.equal(s.layers[0], at, "ranges tile 0:n in box order");
    assert.ok(s.layers[1] > s.layers[0], "every box runs at least one layer");
    assert.ok(s.memory.totalBytes <= s.box.memBytes, `${s.box.name} over its memory`);
    assert.deepEqual(s.memory, stageMemory(p.model, s.layers, p.options));
    at = s.layers[1];
  }
  assert.equal(at, n);
}

Deno.test("planned stage memory is every buffer Stage.load creates (weights, state, activations)", async () => {
  const gpu = await testGpu();
  const { device } = gpu;
  const created: number[] = [];
  const create = device.createBuffer.bind(device);
  device.createBuffer = (d: GPUBufferDescriptor) => {
    created.push(d.size);
    return create(d);
  };
  try {
    for (const arch of ["qwen35moe", "qwen3next"] as const) {
      using f = await openGguf(fixture(arch));
      const costs = modelCosts(f);
      const cases = [
        { layers: [0, 4], kvF16: false, maxChunk: 8, nSlots: 1 },
        { layers: [0, 2], kvF16: true, maxChunk: 64, nSlots: 3 },
        { layers: [2, 4], kvF16: false, maxChunk: 64, nSlots: 2 },
        { layers: [1, 3], kvF16: false, maxChunk: 16, nSlots: 2 },
        { layers: [3, 4], kvF16: true, maxChunk: 8, nSlots: 1 },
      ] as const;
      for (const c of cases) {
        const what = `${arch} layers ${
          c.layers.join(":")
        } chunk ${c.maxChunk} slots ${c.nSlots} kvF16 ${c.kvF16}`;
        const planned = stageMemory(costs, c.layers, {
          nCtx: 96,
          nSlots: c.nSlots,
          maxChunk: c.maxChunk,
          kvF16: c.kvF16,
        });
        created.length = 0;
        const stage = await Stage.load(gpu, f, { ...c, nCtx: 96, onLog: () => {} });
        try {
          const total = created.reduce((a, b) => a + b, 0);
          assert.equal(planned.weightBytes, stage.weightBytes, `${what}: weights`);
          assert.equal(planned.stateBytes, stage.states.totalBytes, `${what}: state`);
          assert.equal(
            planned.activationBytes,
            total - stage.weightBytes - stage.states.totalBytes,
            `${what}: activations (every other buffer of the load)`,
          );
          assert.equal(planned.headroomBytes, DEFAULT_HEADROOM_BYTES);
          assert.equal(planned.totalBytes, total + DEFAULT_HEADROOM_BYTES, what);
        } finally {
          stage.destroy();
        }
      }
    }
  } finally {
    device.createBuffer = create;
  }
});

const M35 = () => modelCosts(headerOnly({ arch: "qwen35moe", preset: "35b-a3b", quant: "iq4_xs", seed: 1 }));
const SIZING = { nCtx: 32768, nSlots: 4, maxChunk: 256 };

Deno.test("plan fits each box's memory and tiles the layers (35B-A3B shape on a 24 and a 16 GiB box)", () => {
  const m = M35();
  const boxes = [box("radeon", 24), box("mac", 16)];
  const p = planSplit(m, boxes, SIZING);
  checkTiles(p, boxes);
  const text = formatPlan(p);
  for (const s of p.stages) {
    assert.match(text, new RegExp(`${s.box.name}\\s+1\\s+${s.layers[0]}:${s.layers[1]}\\s`));
  }
  // One box that holds everything gets everything.
  const one = planSplit(m, [box("big", 80)], SIZING);
  assert.deepEqual(one.stages.map((s) => s.layers), [[0, 40]]);
});

Deno.test("plan balances time by speed, not layer counts: a 2x faster box gets about 2x the work", () => {
  const m = M35();
  const even = planSplit(m, [box("a", 64), box("b", 64)], SIZING);
  const fast = planSplit(m, [box("a", 64, 2), box("b", 64)], SIZING);
  const [ea, eb] = even.stages;
  const [fa, fb] = fast.stages;
  // Equal boxes: equal work, and the last box, which also reads the whole LM head, runs fewer layers.
  assert.ok(Math.abs(ea!.workShare - eb!.workShare) < 0.06, `even work ${ea!.workShare} / ${eb!.workShare}`);
  assert.ok(eb!.layers[1] - eb!.layers[0] < ea!.layers[1] - ea!.layers[0], "the LM head counts as work");
  // Twice as fast: about twice the work, about the same time per token.
  const ratio = fa!.workShare / fb!.workShare;
  assert.ok(ratio > 1.7 && ratio < 2.3, `work ratio ${ratio} (${fa!.layers} / ${fb!.layers})`);
  assert.ok(Math.abs(fa!.timeShare - 0.5) < 0.06, `time shares ${fa!.timeShare} / ${fb!.timeShare}`);
  assert.ok(fast.bottleneckMs < even.bottleneckMs, "the faster box shortens the slowest stage");
  // Three boxes, the middle one 3x as fast: it gets the most work.
  const three = planSplit(m, [box("a", 64), box("b", 64, 3), box("c", 64)], SIZING);
  checkTiles(three, three.stages.map((s) => s.box));
  const w = three.stages.map((s) => s.workShare);
  assert.ok(w[1]! > 2 * w[0]! && w[1]! > 2 * w[2]!, `work shares ${w}`);
});

Deno.test("plan respects memory before speed: a fast box with little memory gets only what fits", () => {
  const m = M35();
  const p = planSplit(m, [box("small-fast", 6, 4), box("big-slow", 64)], SIZING);
  checkTiles(p, p.stages.map((s) => s.box));
  assert.ok(p.stages[0]!.memory.totalBytes <= 6 * GIB);
  // It is full: one more layer would not fit.
  const [a, b] = p.stages[0]!.layers;
  assert.ok(stageMemory(m, [a, b + 1], p.options).totalBytes > 6 * GIB);
});

Deno.test("plan refuses when nothing fits, naming the layers left over and the shortfall", () => {
  const m = M35();
  const boxes = [box("a", 6), box("b", 6)];
  const e = refusal(() => planSplit(m, boxes, SIZING));
  assert.equal(e.code, "no_fit");
  const r = /layers (\d+):(\d+) with the output norm and LM head would go to box b/.exec(e.message);
  assert.ok(r, e.message);
  const need = stageMemory(m, [Number(r[1]), Number(r[2])], SIZING).totalBytes;
  assert.equal(e.shortBytes, need - 6 * GIB);
  assert.ok(e.message.includes(`${formatBytes(e.shortBytes)} short`), e.message);
  assert.match(e.message, /add a box or memory, lower --ctx or --slots, or use --kv-f16/);
  // The greedy fill took all box a could hold.
  const a = Number(r[1]);
  assert.ok(stageMemory(m, [0, a], SIZING).totalBytes <= 6 * GIB);
  assert.ok(stageMemory(m, [0, a + 1], SIZING).totalBytes > 6 * GIB);
  // One box too small for the whole model.
  const one = refusal(() => planSplit(m, [box("a", 10)], SIZING));
  assert.equal(one.shortBytes, stageMemory(m, [0, 40], SIZING).totalBytes - 10 * GIB);
});

Deno.test("plan refuses a box too small for even one layer, and more boxes than layers", () => {
  const m = M35();
  const e = refusal(() => planSplit(m, [box("a", 24), box("pi", 0.5), box("c", 24)], SIZING));
  assert.equal(e.code, "box_too_small");
  assert.match(
    e.message,
    /^Box pi \(512 MiB\) is too small for even one layer: .* short: give it more memory/,
  );
  // The shortfall is against the smallest single layer a middle box could run.
  let least = Infinity;
  for (let l = 1; l < 39; l++) least = Math.min(least, stageMemory(m, [l, l + 1], SIZING).totalBytes);
  assert.equal(e.shortBytes, least - 0.5 * GIB);
  assert.ok(e.message.includes(formatBytes(e.shortBytes)));
  // The last box must hold the LM head with its layer.
  const last = refusal(() => planSplit(m, [box("a", 24), box("c", 1)], SIZING));
  assert.match(last.message, /Box c .* layers 39:40 with the output norm and LM head/);

  const tiny = modelCosts(headerOnly({ arch: "qwen3next", preset: "tiny", quant: "q8_0", seed: 1 }));
  const many = refusal(() =>
    planSplit(tiny, ["a", "b", "c", "d", "e"].map((n) => box(n, 1)), { nCtx: 64, nSlots: 1, maxChunk: 8 })
  );
  assert.equal(many.code, "too_many_boxes");
  assert.throws(
    () => planSplit(tiny, [box("a", 1)], { nCtx: 64, nSlots: 0, maxChunk: 8 }),
    /--slots 0 is out of range/,
  );
  assert.throws(() => planSplit(tiny, [box("a", 1, 0)], { nCtx: 64, nSlots: 1, maxChunk: 8 }), /speed 0/);
});
