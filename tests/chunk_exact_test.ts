/**
 * A chunk of 2..8 tokens runs its attention as the columns of a batched step on one slot (engine/blocks/
 * attention.ts, CHUNK_TABLE_OFFSET), so it gives the bits of that many one-token steps: logits of a last stage
 * and hidden rows of a first stage, both tiny architectures, after a prefix (so attention spans older
 * positions too). The drafted frames of split serving rely on it (drafts on or off, the same output), and a
 * last stage checks a drafted frame's rows in one chunk.
 * @module
 */
import assert from "node:assert/strict";
import { argmaxCpu, openGguf, Stage } from "../engine/mod.ts";
import { testGpu } from "./util/gpu.ts";
import { fixturePath } from "./util/fixtures.ts";

const PREFIX = [5, 17, 301, 88, 640, 12, 999, 45, 230, 7, 64];
const CHUNK = [17, 301, 5, 88, 2, 640, 12, 9];

/** Rows of `run`'s output for `tokens` after the prefix: as one chunk, or as one-token steps. */
async function rows(stage: Stage, snap: number, tokens: number[], oneByOne: boolean): Promise<Uint32Array> {
  stage.restore(snap, 0);
  if (!oneByOne) {
    const out = await stage.run(0, { tokens }, PREFIX.length, { rows: "all" });
    return new Uint32Array(out.data.buffer.slice(0));
  }
  const parts: Float32Array[] = [];
  for (const [i, t] of tokens.entries()) {
    parts.push((await stage.run(0, { tokens: [t] }, PREFIX.length + i, { rows: "last" })).data.slice());
  }
  const all = new Float32Array(parts.reduce((a, p) => a + p.length, 0));
  let at = 0;
  for (const p of parts) {
    all.set(p, at);
    at += p.length;
  }
  return new Uint32Array(all.buffer);
}

for (const name of ["tiny-qwen35moe.q8_0.gguf", "tiny-qwen3next.q8_0.gguf"]) {
  Deno.test(`${name}: a chunk of 2..8 tokens gives the bits of one-token steps`, async () => {
    const gpu = await testGpu();
    using file = await openGguf(fixturePath(name));
    for (const layers of [undefined, [0, 2] as [number, number]]) {
      const stage = await Stage.load(gpu, file, {
        nCtx: 64,
        nSlots: 2,
        maxChunk: 64,
        ...(layers ? { layers } : {}),
      });
      try {
        await stage.run(0, { tokens: PREFIX }, 0, { rows: "none" });
        const snap = stage.snapshot(0);
        for (const n of [2, 5, 8]) {
          const tokens = CHUNK.slice(0, n);
          const chunk = await rows(stage, snap, tokens, false);
          const steps = await rows(stage, snap, tokens, true);
          assert.equal(chunk.length, steps.length);
          const what = `${name} ${layers ? "layers 0:2 hidden" : "logits"}, ${n} tokens`;
          let first = -1;
          for (let i = 0; i < chunk.length && first < 0; i++) if (chunk[i] !== steps[i]) first = i;
          assert.equal(first, -1, `${what}: first differing word ${first}`);
          if (!layers) {
            // The ids of the chunk's rows, drawn on the GPU in its pass (an argmax per row), are the logits'.
            stage.restore(snap, 0);
            const pending = await stage.submit(0, { tokens }, PREFIX.length, { rows: "all", ids: true });
            const got = (await pending.output).ids!;
            const V = stage.hp.nVocab;
            const logits = new Float32Array(chunk.buffer);
            const want = tokens.map((_, r) => argmaxCpu(logits.subarray(r * V, (r + 1) * V)));
            assert.deepEqual([...got], want, `${what}: ids`);
          }
        }
        // The chunk must differ from a run that ignores the prefix (the comparison can fail).
        stage.reset(0);
        const cold = await stage.run(0, { tokens: CHUNK }, 0, { rows: "all" });
        const warm = await rows(stage, snap, CHUNK, false);
        assert.notDeepEqual(new Uint32Array(cold.data.buffer.slice(0)), warm);
      } finally {
        stage.destroy();
      }
    }
  });
}
