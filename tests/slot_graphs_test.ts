/**
 * A slot's first graph of a width another slot has built is a clone of that graph with the other slot's
 * buffers swapped (engine/exec/_slot_graphs.ts). Here the clone must compute exactly what a fresh build for
 * that slot computes, and leave the donor slot's state alone: logits of a prompt on slot 2 through a clone
 * equal slot 2's through a fresh build (another stage), bit for bit, and slot 0 (the donor, holding another
 * prompt) continues as it would alone. Widths that take the tiled matmul (12) and the column path (5), with
 * states pooled (both architectures) and per slot (qwen35moe).
 * @module
 */
import assert from "node:assert/strict";
import { openGguf } from "../engine/gguf.ts";
import { Stage } from "../engine/exec/stage.ts";
import { GraphBuilder } from "../engine/graph/builder.ts";
import { SlotGraphs } from "../engine/exec/_slot_graphs.ts";
import { testGpu } from "./util/gpu.ts";
import { fixturePath } from "./util/fixtures.ts";
import { Rng } from "./util/rng.ts";

for (const name of ["tiny-qwen35moe", "tiny-qwen3next"]) {
  Deno.test(`${name}: a slot's graph cloned from another slot's equals a fresh build, bit for bit`, async () => {
    const rng = new Rng();
    const gpu = await testGpu();
    using file = await openGguf(fixturePath(`${name}.q8_0.gguf`));
    let built = 0;
    const checked = GraphBuilder.prototype.checked;
    GraphBuilder.prototype.checked = function (...a: Parameters<typeof checked>) {
      built++;
      return checked.apply(this, a);
    };
    try {
      // States per slot swap whole buffers, pools regions: both on one architecture (SlotStates is the same
      // for both), pools on the other (CI time).
      for (const perSlot of name === "tiny-qwen35moe" ? [false, true] : [false]) {
        const opts = { nCtx: 64, nSlots: 4, maxChunk: 16, ...(perSlot ? { maxStatePoolBytes: 4 } : {}) };
        const a = await Stage.load(gpu, file, opts);
        const b = await Stage.load(gpu, file, opts);
        try {
          // Width 12 (tiled matmul, chunked DeltaNet): donor slot 0, clone on slot 2; width 5 (columns):
          // donor slot 1, clone on slot 3. In `b` slots 2 and 3 build their own graphs first.
          for (const [n, donor, slot] of [[12, 0, 2], [5, 1, 3]] as const) {
            const what = `${perSlot ? "states per slot" : "pooled states"}, width ${n}, seed ${rng.seed}`;
            const q = Array.from({ length: n }, () => rng.int(0, 1000));
            const p = Array.from({ length: n }, () => rng.int(0, 1000));
            const next = rng.int(0, 1000);
            await a.run(donor, { tokens: q }, 0, { rows: "last" });
            built = 0;
            const cloned = (await a.run(slot, { tokens: p }, 0, { rows: "last" })).data.slice();
            assert.equal(built, 0, `${what}: slot ${slot}'s graph is a clone (no block rebuilt)`);
            const donorNext = (await a.run(donor, { tokens: [next] }, n, { rows: "last" })).data.slice();
            const fresh = (await b.run(slot, { tokens: p }, 0, { rows: "last" })).data.slice();
            assert.ok(built > 0, `${what}: b built slot ${slot}'s graph itself`);
            await b.run(donor, { tokens: q }, 0, { rows: "last" });
            const alone = (await b.run(donor, { tokens: [next] }, n, { rows: "last" })).data.slice();
            assert.deepEqual(cloned, fresh, `${what}: slot ${slot}'s logits through the clone`);
            assert.deepEqual(donorNext, alone, `${what}: slot ${donor} (the donor) after slot ${slot} ran`);
          }
        } finally {
          a.destroy();
          b.destroy();
        }
      }
    } finally {
      GraphBuilder.prototype.checked = checked;
    }
  });
}

Deno.test("warmIdle prepares every slot as the last request's was: a request on another slot then builds no graph, with the same ids", async () => {
  const rng = new Rng();
  const gpu = await testGpu();
  using file = await openGguf(fixturePath("tiny-qwen35moe.q8_0.gguf"));
  const stage = await Stage.load(gpu, file, { nCtx: 64, nSlots: 3, maxChunk: 16 });
  // The stage's graph cache (its count of graphs built and cloned), seen through its first lookup.
  let graphs: SlotGraphs | undefined;
  const get = SlotGraphs.prototype.get;
  SlotGraphs.prototype.get = function (...a: Parameters<typeof get>) {
    graphs ??= this;
    return get.apply(this, a);
  };
  const built = () => graphs!.built;
  try {
    const d = stage.decoder;
    const prompt = Array.from({ length: 12 }, () => rng.int(0, 1021));
    const gen = async (slot: number) =>
      (await d.generate([{ slot, prompt, opts: { nNew: 6 } }], { batch: 4 }))[0]!.tokens;
    const want = await gen(0);
    // Slots 1 and 2 lack slot 0's solo step and its graphs of width 12 (prompt) and 1 (decode step). In the
    // order given (the slot the next request takes first), each slot whole before the next: its solo step
    // (which clones its decode graph), then its width-12 graph. Two steps prepare slot 2.
    assert.equal(await d.warmIdle([2, 1, 0]), true);
    assert.equal(await d.warmIdle([2, 1, 0]), true);
    const before = built();
    assert.deepEqual(await gen(2), want, `slot 2's ids (seed ${rng.seed})`);
    assert.equal(built(), before, `slot 2 built no graph in its request (seed ${rng.seed})`);
    // Then slot 1's two (the default order: every slot), and nothing is left.
    let steps = 0;
    while (await d.warmIdle()) assert.ok(++steps <= 8, `warmIdle ends (seed ${rng.seed})`);
    assert.equal(steps, 2, `seed ${rng.seed}`);
    // A cold slot's first request builds (so the count above could fail): a width no slot has used.
    await d.generate([{ slot: 1, prompt: prompt.slice(0, 7), opts: { nNew: 2 } }], { batch: 4 });
    assert.ok(built() > before, "a new width is built");
  } finally {
    SlotGraphs.prototype.get = get;
    stage.destroy();
  }
});
