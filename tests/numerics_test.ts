/**
 * Non-finite numerics are refused, never emitted: a model whose forward pass produces NaN logits fails the
 * generation with a NumericsError (the GPU argmax flags a row with any NaN/Inf; the sampler finds no id),
 * and `inspect --check` names the tensors that hold NaN or Inf values (float elements or block scales).
 * @module
 */
import assert from "node:assert/strict";
import {
  checkNumerics,
  NumericsError,
  openGguf,
  planModel,
  samplingParams,
  Stage,
  synthesize,
} from "../engine/mod.ts";
import { testGpu } from "./util/gpu.ts";
import { Rng } from "./util/rng.ts";

const dir = await Deno.makeTempDir({ prefix: "numerics_test_" });

/** Writes NaN over `count` f32 elements of F32 tensor `name` from element `at`. */
async function poisonF32(path: string, name: string, at: number, count: number) {
  let abs: number;
  {
    using f = await openGguf(path);
    const t = f.tensor(name);
    assert.equal(t.type.name, "F32", `${name} is F32`);
    abs = t.absOffsetBytes + 4 * at;
  }
  using fh = await Deno.open(path, { write: true });
  await fh.seek(abs, Deno.SeekMode.Start);
  await fh.write(new Uint8Array(new Float32Array(count).fill(NaN).buffer));
}

Deno.test("a NaN appearing at a decode step fails the generation (greedy and sampled), never a token", async () => {
  const rng = new Rng();
  const gpu = await testGpu();
  const path = `${dir}/decode.gguf`;
  await synthesize(planModel({ arch: "qwen35moe", preset: "tiny", quant: "f32", seed: rng.u32() }), {
    out: path,
  });
  let prompt = Array.from({ length: 6 }, () => rng.int(0, 1000));
  // The clean model's first id X; then X's embedding row is poisoned: the prefill (which never embeds X)
  // stays finite, and the first decode step, which embeds X, yields NaN logits on the GPU. A prompt that holds
  // X is changed and X drawn again from the changed prompt (X came from the first prompt: a flake).
  let first: number;
  {
    using f = await openGguf(path);
    const stage = await Stage.load(gpu, f, { nCtx: 64, nSlots: 1 });
    for (let tries = 1;; tries++) {
      first = (await stage.generate(0, prompt, { nNew: 1 })).tokens[0]!;
      if (!prompt.includes(first)) break;
      assert.ok(tries < 20, `no prompt without its first id in 20 tries (seed ${rng.seed})`);
      prompt = prompt.map((t) => (t === first ? (t + 1) % 1000 : t));
    }
    stage.destroy();
  }
  using f0 = await openGguf(path);
  const nEmbd = f0.tensor("token_embd.weight").ne[0]!;
  f0.close();
  await poisonF32(path, "token_embd.weight", first * nEmbd, nEmbd);
  using f = await openGguf(path);
  const stage = await Stage.load(gpu, f, { nCtx: 64, nSlots: 1 });
  try {
    const emitted: number[] = [];
    await assert.rejects(
      stage.generate(0, prompt, { nNew: 8, onTokens: (ids) => emitted.push(...ids) }),
      (e: unknown) =>
        e instanceof NumericsError && /non-finite logits .* decode step 1 of slot 0/.test(e.message),
      `the greedy generation after ${first} did not fail (seed ${rng.seed})`,
    );
    assert.deepEqual(emitted, [first], `only the finite step's id was emitted (seed ${rng.seed})`);
    // The sampler path: top-k 1 always draws the argmax, and a presence penalty (which only lowers ids of
    // the prompt, never X) keeps the request off the greedy path, so the draw is X whatever the RNG; then the
    // sampler finds no usable logit in X's NaN row. (Temperature 0.01 alone drew the runner-up of a top-2
    // gap below ~0.05: one CI run in a few hundred.)
    const cold = samplingParams({
      temperature: 1,
      topK: 1,
      topP: 1,
      minP: 0,
      presencePenalty: 0.01,
      seed: 3,
    });
    const sampled: number[] = [];
    await assert.rejects(
      stage.generate(0, prompt, { nNew: 4, sampling: cold, onTokens: (ids) => sampled.push(...ids) }),
      (e: unknown) =>
        e instanceof NumericsError && /decode step 1 of slot 0 \(the sampler found no id\)/.test(e.message),
    );
    assert.deepEqual(sampled, [first]);
  } finally {
    stage.destroy();
  }
});

Deno.test("NaN logits at the prompt's last position fail before any id is chosen", async () => {
  const gpu = await testGpu();
  const path = `${dir}/prefill.gguf`;
  await synthesize(planModel({ arch: "qwen3next", preset: "tiny", quant: "f32", seed: 5 }), { out: path });
  {
    using f = await openGguf(path);
    const nEmbd = f.tensor("output.weight").ne[0]!;
    f.close();
    // One row of the LM head: one NaN logit among finite ones (the old argmax skipped it silently).
    await poisonF32(path, "output.weight", 17 * nEmbd, nEmbd);
  }
  using f = await openGguf(path);
  const stage = await Stage.load(gpu, f, { nCtx: 32, nSlots: 1 });
  try {
    await assert.rejects(
      stage.generate(0, [1, 2, 3], { nNew: 4 }),
      (e: unknown) =>
        e instanceof NumericsError && /prompt's last position \(logit 17 is NaN\)/.test(e.message),
    );
  } finally {
    stage.destroy();
  }
});

Deno.test("inspect --check: every tensor finite, then the poisoned ones named", async () => {
  const path = `${dir}/check.gguf`;
  await synthesize(planModel({ arch: "qwen35moe", preset: "tiny", quant: "q8_0", seed: 9 }), { out: path });
  {
    using f = await openGguf(path);
    assert.deepEqual(await checkNumerics(f), []);
  }
  let scaleAt: number;
  {
    using f = await openGguf(path);
    const q = [...f.tensors.values()].find((t) => t.type.name === "Q8_0")!;
    scaleAt = q.absOffsetBytes + 34 * 3; // block 3's f16 scale
  }
  await poisonF32(path, "output_norm.weight", 2, 1);
  using fh = await Deno.open(path, { write: true });
  await fh.seek(scaleAt, Deno.SeekMode.Start);
  await fh.write(Uint8Array.of(0x00, 0x7e)); // f16 NaN
  fh.close();
  using f = await openGguf(path);
  const bad = await checkNumerics(f);
  const q = [...f.tensors.values()].find((t) => t.type.name === "Q8_0")!;
  assert.deepEqual(
    bad.map((b) => [b.name, b.count, b.first]).sort(),
    [["output_norm.weight", 1, 2], [q.name, 32, 96]].sort(),
  );
});
