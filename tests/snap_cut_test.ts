/**
 * A snapshot taken inside a prefill (`snapAt`): the chunk holding the point runs whole, its DeltaNet layers
 * write their state at the cut to the states' taps (wgsl/gdn_chunk.wgsl, gdn_conv_ring.wgsl) and the same
 * pass copies the taps and the KV rows below the cut into the snapshot. Restored, it must hold the prompt's
 * first `snapAt` tokens exactly as a prefill that stopped there would.
 * @module
 */
import assert from "node:assert/strict";
import { openGguf } from "../engine/gguf.ts";
import { Stage } from "../engine/mod.ts";
import { chunkSteps } from "../engine/exec/_piece_parts.ts";
import { RefModel } from "./ref/forward.ts";
import { testGpu } from "./util/gpu.ts";
import { fixturePath } from "./util/fixtures.ts";
import { Rng } from "./util/rng.ts";

/** Logit tolerance against the float64 reference, relative to the row's largest |logit| (as forward_test). */
const REF_RTOL = 1e-3;

/** Every state region of `slot`, read back (the KV rows below `nPos` only, the whole-live states whole). */
async function slotState(stage: Stage, slot: number): Promise<Uint8Array[]> {
  const gpu = (await testGpu()).device;
  const out: Uint8Array[] = [];
  for (const r of stage.states.regions(slot)) {
    const read = gpu.createBuffer({ size: r.size, usage: GPUBufferUsage.MAP_READ | GPUBufferUsage.COPY_DST });
    const enc = gpu.createCommandEncoder();
    enc.copyBufferToBuffer(r.buffer, r.offset, read, 0, r.size);
    gpu.queue.submit([enc.finish()]);
    await read.mapAsync(GPUMapMode.READ);
    out.push(new Uint8Array(read.getMappedRange()).slice());
    read.unmap();
    read.destroy();
  }
  return out;
}

Deno.test("chunkSteps: a snapshot point cuts the chunked form's chunk holding it, else follows a chunk", () => {
  assert.deepEqual(chunkSteps(40, 16), [
    { at: 0, n: 16, cut: 0, after: false },
    { at: 16, n: 16, cut: 0, after: false },
    { at: 32, n: 8, cut: 0, after: false },
  ]);
  // Inside a chunk of 16 (the chunked form): cut there.
  assert.deepEqual(chunkSteps(40, 16, 20).map((c) => [c.at, c.n, c.cut, c.after]), [
    [0, 16, 0, false],
    [16, 16, 4, false],
    [32, 8, 0, false],
  ]);
  // At a chunk's end: after it.
  assert.deepEqual(chunkSteps(40, 16, 32).map((c) => [c.at, c.n, c.cut, c.after]), [
    [0, 16, 0, false],
    [16, 16, 0, true],
    [32, 8, 0, false],
  ]);
  // Inside a chunk of 8 or fewer (one token per column, no chunked form): the chunk splits at the point.
  assert.deepEqual(chunkSteps(40, 16, 35).map((c) => [c.at, c.n, c.cut, c.after]), [
    [0, 16, 0, false],
    [16, 16, 0, false],
    [32, 3, 0, true],
    [35, 5, 0, false],
  ]);
  assert.deepEqual(chunkSteps(12, 64, 12).map((c) => [c.at, c.n, c.cut, c.after]), [[0, 12, 0, true]]);
});

for (const arch of ["qwen35moe", "qwen3next"] as const) {
  Deno.test(`${arch}: a snapshot cut inside a prefill holds the prompt's first tokens (float64 reference, and the bits of a prefill stopped there)`, async () => {
    const rng = new Rng();
    const gpu = await testGpu();
    using file = await openGguf(fixturePath(`tiny-${arch}.q8_0.gguf`));
    // Experts per column (no grouping by expert, whose variant follows the chunk's width): every kernel then
    // gives a token the same bits in a chunk of any width over 8, so the cut's state equals, bit for bit, a
    // prefill stopped at the point (and a DeltaNet block partition that moved would show).
    const stage = await Stage.load(gpu, file, { nCtx: 96, nSlots: 4, maxChunk: 32, groupedExperts: false });
    const ref = await RefModel.load(file);
    const d = stage.decoder;
    try {
      assert.equal(d.snapInPrefill, true);
      // Chunks of 32: points inside the first chunk, inside the second (the last: generate's own chunk), and
      // in a prompt of one chunk. Each cut chunk and each prefill stopped at the point run the chunked form
      // (wider than 8), so the DeltaNet blocks before the cut are the same in both.
      for (const [len, at] of [[50, 20], [50, 42], [30, 12]] as const) {
        const prompt = Array.from({ length: len }, () => rng.int(0, stage.hp.nVocab));
        const what = `${len} tokens, snapshot at ${at} (seed ${rng.seed})`;
        // A prefill stopped at the point, then the snapshot: the bits the cut must give.
        await d.prefill(0, prompt.slice(0, at), 0);
        const plain = d.snapshot(0);
        // The cut in a prefill (up to the prompt's last token) and in generate (its first id).
        const cutPrefill = await d.prefill(1, prompt.slice(0, len - 1), 0, at);
        const [g] = await d.generate([{ slot: 2, prompt, opts: { nNew: 2, snapAt: at } }]);
        assert.equal(typeof cutPrefill, "number", what);
        assert.equal(typeof g!.snapshot, "number", what);
        const states: Uint8Array[][] = [];
        for (const id of [plain, cutPrefill as number, g!.snapshot!]) {
          d.restore(id, 3);
          assert.equal(d.length(3), at, what);
          states.push(await slotState(stage, 3));
        }
        for (const [i, name] of ["prefill's cut", "generate's cut"].entries()) {
          for (const [r, bytes] of states[i + 1]!.entries()) {
            assert.ok(
              bytes.every((b, k) => b === states[0]![r]![k]),
              `${what}: ${name}, state region ${r} differs from a prefill stopped at the point`,
            );
          }
        }
        // Restored (generate's cut is in slot 3 now), the rest of the prompt gives the reference's logits.
        const rest = await stage.run(3, { tokens: prompt.slice(at) }, at, { rows: "all" });
        ref.reset();
        const want = ref.forward(prompt).slice(at);
        const V = stage.hp.nVocab;
        for (const [t, row] of want.entries()) {
          const got = rest.data.subarray(t * V, (t + 1) * V);
          let err = 0, mag = 0;
          for (let i = 0; i < V; i++) {
            err = Math.max(err, Math.abs(got[i]! - row[i]!));
            mag = Math.max(mag, Math.abs(row[i]!));
          }
          assert.ok(
            err <= REF_RTOL * mag,
            `${what}: position ${at + t}: |logit error| ${err} > ${REF_RTOL * mag}`,
          );
        }
        for (const id of [plain, cutPrefill as number, g!.snapshot!]) d.drop(id);
      }
      assert.equal(stage.states.snapshotBytes, 0, "every snapshot dropped");
      // A point outside the prefill is refused before anything runs, naming the range it must fall in.
      const p = [1, 2, 3, 4, 5];
      await assert.rejects(
        d.prefill(0, p, 0, 0),
        /outside the prefill of positions 0\.\.4: ask for one in 1\.\.5/,
      );
      await assert.rejects(
        d.generate([{ slot: 0, prompt: p, opts: { nNew: 1, snapAt: 6 } }]),
        /A snapshot at position 6 is outside/,
      );
      assert.equal(stage.states.snapshotBytes, 0, "no snapshot left by a refused call");
    } finally {
      stage.destroy();
    }
  });
}
