/**
 * A chunk graph built fresh goes to the GPU in parts while it is built (OpStream, engine/graph/builder.ts): the
 * first chunk of `Stage.run` and a single-chunk prompt's chunk in `generate`. The parts hold the graph's own
 * dispatches in order, so a run through a streamed build must equal, bit for bit, the same run through the
 * cached graph (one pass); and it must really have been streamed (more submissions than the cached run). The
 * stream's own bookkeeping is checked on a stub device.
 * @module
 */
import assert from "node:assert/strict";
import { openGguf } from "../engine/gguf.ts";
import { Stage } from "../engine/exec/stage.ts";
import { type Op, OpStream } from "../engine/graph/builder.ts";
import { testGpu } from "./util/gpu.ts";
import { fixturePath } from "./util/fixtures.ts";
import { Rng } from "./util/rng.ts";

Deno.test("OpStream sends a part at a layer's end once enough ops are new, and leaves the rest", () => {
  const log: string[] = [];
  let encoders = 0;
  const encoder = (id: number) => ({
    beginComputePass: () => ({
      setPipeline: () => {},
      setBindGroup: () => {},
      dispatchWorkgroups: (x: number) => log.push(`e${id}:op${x}`),
      end: () => log.push(`e${id}:end`),
    }),
    finish: () => `cb${id}`,
  });
  const device = {
    createCommandEncoder: () => encoder(++encoders),
    queue: { submit: (cbs: string[]) => log.push(`submit ${cbs.join()}`) },
  } as unknown as GPUDevice;
  const first = encoder(0) as unknown as GPUCommandEncoder;
  const ops = Array.from({ length: 10 }, (_, i) => ({ label: `op${i}`, grid: [i, 1, 1] }) as unknown as Op);
  const s = new OpStream(device, first, 4);
  s.onLayer(ops.slice(0, 3)); // 3 new: kept
  assert.deepEqual(log, []);
  s.onLayer(ops.slice(0, 5)); // 5 new: sent in the first encoder
  s.onLayer(ops.slice(0, 7)); // 2 new: kept
  s.onLayer(ops.slice(0, 9)); // 4 new: sent in the next one
  assert.deepEqual(log, [
    ...[0, 1, 2, 3, 4].map((i) => `e0:op${i}`),
    "e0:end",
    "submit cb0",
    ...[5, 6, 7, 8].map((i) => `e1:op${i}`),
    "e1:end",
    "submit cb1",
  ]);
  assert.equal(s.parts, 2);
  assert.ok(s.firstAt !== undefined && s.firstAt <= performance.now(), "the first part's time");
  const rest = s.rest(ops);
  assert.deepEqual(rest.ops, ops.slice(9));
  assert.equal(
    (rest.enc as unknown as { finish(): string }).finish(),
    "cb2",
    "the rest goes in a fresh encoder",
  );
  const idle = new OpStream(device, first, 4);
  assert.equal(idle.firstAt, undefined, "no part, no time");
  assert.deepEqual(
    idle.rest(ops.slice(0, 3)),
    { enc: first, ops: ops.slice(0, 3) },
    "nothing sent: all left",
  );
});

for (const name of ["tiny-qwen35moe", "tiny-qwen3next"]) {
  Deno.test(`${name}: a run and a generation through a graph streamed while built equal the cached graph's`, async () => {
    const rng = new Rng();
    const gpu = await testGpu();
    using file = await openGguf(fixturePath(`${name}.q8_0.gguf`));
    const stage = await Stage.load(gpu, file, { nCtx: 96, nSlots: 2, maxChunk: 32 });
    const queue = gpu.device.queue;
    const submit = queue.submit;
    let submits = 0;
    queue.submit = function (cbs: GPUCommandBuffer[]) {
      submits++;
      return submit.call(this, cbs);
    };
    const counted = async <T>(f: () => Promise<T>): Promise<[T, number]> => {
      submits = 0;
      const out = await f();
      return [out, submits];
    };
    try {
      // Widths no graph of this stage has: 13 and 27 (the tiled matmul and chunked DeltaNet), 20 in generate.
      for (const n of [13, 27]) {
        const what = `width ${n}, seed ${rng.seed}`;
        const p = Array.from({ length: n }, () => rng.int(0, 1000));
        const run = () => stage.run(0, { tokens: p }, 0, { rows: "last" }).then((o) => o.data.slice());
        const [streamed, sFresh] = await counted(run);
        const [cached, sCached] = await counted(run);
        assert.ok(
          sFresh > sCached,
          `${what}: the fresh build was sent in parts (${sFresh} > ${sCached} submits)`,
        );
        assert.deepEqual(streamed, cached, `${what}: logits through the streamed build`);
      }
      const prompt = Array.from({ length: 20 }, () => rng.int(0, 1000));
      const gen = () => stage.generate(1, prompt, { nNew: 4, top: 3 });
      const [streamed, sFresh] = await counted(gen);
      const [cached, sCached] = await counted(gen);
      assert.ok(
        sFresh > sCached,
        `generate: the fresh build was sent in parts (${sFresh} > ${sCached} submits)`,
      );
      assert.deepEqual(streamed.tokens, cached.tokens, `generate, seed ${rng.seed}: the same ids`);
      assert.deepEqual(streamed.top, cached.top, `generate, seed ${rng.seed}: the same top-3 ids and logits`);
    } finally {
      queue.submit = submit;
      stage.destroy();
    }
  });
}
