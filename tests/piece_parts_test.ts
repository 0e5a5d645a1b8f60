/**
 * A prompt piece run a few layers at a time (`DecodeDriver.prefillPart`, the service's pieces split by depth)
 * leaves its slot as the whole piece does, even with another slot's decode steps between its parts (they
 * reuse the activations the piece's hidden rows live in): the next token's logits equal the whole piece's bit
 * for bit, and the other slot's ids equal its own run without the piece. Parts out of order, outside the
 * stage or wider than a chunk are refused before anything runs.
 * @module
 */
import assert from "node:assert/strict";
import { openGguf, Stage } from "../engine/mod.ts";
import { testGpu } from "./util/gpu.ts";
import { fixturePath } from "./util/fixtures.ts";

const PREFIX = [5, 17, 301, 88, 640, 12, 999, 45, 230, 7, 64];
const PIECE = Array.from({ length: 40 }, (_, i) => (i * 37 + 11) % 1000);
const NEXT = 77;
const OTHER = [3, 14, 15, 92, 65];

for (const name of ["tiny-qwen35moe.q8_0.gguf", "tiny-qwen3next.q8_0.gguf"]) {
  Deno.test(`${name}: a piece in parts with another slot's steps between them equals the whole piece`, async () => {
    const gpu = await testGpu();
    using file = await openGguf(fixturePath(name));
    const stage = await Stage.load(gpu, file, { nCtx: 128, nSlots: 2, maxChunk: 64 });
    const d = stage.decoder;
    const [a, b] = stage.layers;
    try {
      await stage.run(0, { tokens: PREFIX }, 0, { rows: "none" });
      const snap = stage.snapshot(0);
      const base = PREFIX.length;
      const next = async () =>
        new Uint32Array(
          (await stage.run(0, { tokens: [NEXT] }, base + PIECE.length, { rows: "last" })).data.buffer,
        );
      const other = async () =>
        (await d.generate([{ slot: 1, prompt: OTHER, opts: { nNew: 4 } }]))[0]!.tokens;
      // The whole piece, and the other slot's run alone.
      stage.restore(snap, 0);
      await d.prefill(0, PIECE, base);
      const whole = await next();
      const alone = await other();
      // The parts: every layer split (uneven), the other slot decoding between them.
      const cuts = [a, a + 1, b - 1, b].filter((l, i, xs) => i === 0 || l > xs[i - 1]!);
      for (const split of [cuts, [a, b]]) {
        stage.restore(snap, 0);
        const between: number[][] = [];
        for (let i = 0; i + 1 < split.length; i++) {
          await d.prefillPart(0, PIECE, base, [split[i]!, split[i + 1]!]);
          if (i + 2 < split.length) between.push(await other());
          if (i + 2 < split.length) {
            assert.equal(stage.length(0), base, "the slot holds the piece after its last part");
          }
        }
        assert.equal(stage.length(0), base + PIECE.length);
        const got = await next();
        let first = -1;
        for (let i = 0; i < got.length && first < 0; i++) if (got[i] !== whole[i]) first = i;
        assert.equal(
          first,
          -1,
          `${name} parts ${split}: the next logits differ from the whole piece's at word ${first}`,
        );
        for (const ids of between) {
          assert.deepEqual(ids, alone, `${name} parts ${split}: the other slot's ids`);
        }
      }
      // Refused before anything runs.
      stage.restore(snap, 0);
      await assert.rejects(
        () => d.prefillPart(0, PIECE, base, [a + 1, b]),
        /does not follow a part ending at layer/,
      );
      await assert.rejects(() => d.prefillPart(0, PIECE, base, [a, b + 1]), /runs layers inside/);
      await assert.rejects(() => d.prefillPart(0, PIECE, base, [a, a]), /runs layers inside/);
      await d.prefillPart(0, PIECE, base, [a, a + 1]);
      await assert.rejects(
        () => d.prefillPart(0, PIECE, base + 1, [a + 1, b]),
        /holds 11 tokens but the run continues at position 12/,
      );
      await assert.rejects(() => d.prefillPart(1, PIECE, stage.length(1), [a + 1, b]), /does not follow/);
      const wide = Array.from({ length: 65 }, () => 1);
      await assert.rejects(() => d.prefillPart(1, wide, 0, [a, b]), /one chunk \(64\), got 65 tokens/);
      assert.equal(stage.length(0), base, "a refused part leaves the slot's length");
    } finally {
      stage.destroy();
    }
  });
}
