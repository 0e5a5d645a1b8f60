import assert from "node:assert/strict";
import { PipelineCache } from "./kernel.ts";
import { assertPoisoned } from "../tests/util/close.ts";
import { GUARD_WORDS, poisoned, readAll, testGpu, upload } from "../tests/util/gpu.ts";
import { Rng } from "../tests/util/rng.ts";
import {
  ARGMAX_TOPK,
  argmaxTopkBindGroups,
  type ArgmaxTopkConstants,
  argmaxTopkVariants,
  encodeArgmaxTopk,
} from "./argmax_topk.ts";

const POISON_U32 = 0xffffffff;

/** Plain-loop reference: ids of the k largest non-NaN logits, larger first, the lower id among equals. */
function refTopk(x: Float32Array, k: number): number[] {
  const ids = Array.from(x.keys()).filter((i) => !Number.isNaN(x[i]!));
  ids.sort((a, b) => x[b]! - x[a]! || a - b);
  return ids.slice(0, k);
}

interface Case {
  c: ArgmaxTopkConstants;
  ties: boolean;
  nan: boolean;
  maxLast?: boolean; // the unique maximum is the last logit (the tail of the last block)
}

Deno.test("argmax_topk: sorted top-k ids and logits, exact ties to the lower index", async () => {
  const rng = new Rng();
  const { device } = await testGpu();
  const cache = new PipelineCache(device);
  const cases: Case[] = [
    { c: { N_VOCAB: 8, K: 3, N_BLOCK: 2, WG: 64, BUF: 8 }, ties: false, nan: false }, // debug
    { c: { N_VOCAB: 1021, K: 10, N_BLOCK: 8, WG: 64, BUF: 64 }, ties: true, nan: true }, // several rounds
    { c: { N_VOCAB: 1021, K: 1, N_BLOCK: 3, WG: 32, BUF: 256 }, ties: true, nan: false },
    { c: { N_VOCAB: 5, K: 5, N_BLOCK: 4, WG: 64, BUF: 16 }, ties: false, nan: false }, // K = N, empty blocks
    { c: { N_VOCAB: 1021, K: 4, N_BLOCK: 5, WG: 64, BUF: 32 }, ties: false, nan: false, maxLast: true },
    { c: { N_VOCAB: 248320, K: 64, N_BLOCK: 64, WG: 256, BUF: 2048 }, ties: true, nan: false },
    { c: { N_VOCAB: 248320, K: 40, N_BLOCK: 64, WG: 256, BUF: 2048 }, ties: false, nan: true },
    {
      c: { N_VOCAB: rng.int(64, 40000), K: rng.int(1, 65), N_BLOCK: rng.int(1, 40), WG: 128, BUF: 1024 },
      ties: rng.float() < 0.5,
      nan: false,
    },
  ];
  const enc = device.createCommandEncoder();
  const pass = enc.beginComputePass();
  const runs = [];
  for (const k of cases) {
    const n = k.c.N_VOCAB;
    // Ties: few distinct values, so the k-th place falls inside a run of equal logits.
    const logits = k.ties
      ? Float32Array.from({ length: n }, () => rng.int(-20, 21) * 0.25)
      : rng.normals(n, 4);
    if (k.nan) logits[rng.int(0, n)] = NaN;
    if (k.maxLast) logits[n - 1] = 100;
    const b = {
      logits: upload(device, logits),
      pairs: poisoned(device, 2 * k.c.K * k.c.N_BLOCK, POISON_U32),
      result: poisoned(device, 2 * k.c.K, POISON_U32),
    };
    const v = argmaxTopkVariants(k.c);
    const pipelines = {
      partial: await cache.get(ARGMAX_TOPK, v.partial),
      final: await cache.get(ARGMAX_TOPK, v.final),
    };
    const bindGroups = argmaxTopkBindGroups(device, { pipelines, constants: k.c, buffers: b });
    encodeArgmaxTopk(pass, { pipelines, bindGroups, constants: k.c });
    runs.push({ k, b, logits, ref: refTopk(logits, k.c.K) });
  }
  pass.end();
  device.queue.submit([enc.finish()]);
  const outs = await readAll(device, runs.map((r) => r.b.result));
  runs.forEach((r, i) => {
    const { c } = r.k;
    const what = `argmax_topk N_VOCAB=${c.N_VOCAB} K=${c.K} N_BLOCK=${c.N_BLOCK} WG=${c.WG} BUF=${c.BUF} ` +
      `ties=${r.k.ties} nan=${r.k.nan} (seed ${rng.seed})`;
    const res = new Uint32Array(outs[i]!);
    const bits = new Uint32Array(r.logits.buffer);
    const ids = Array.from({ length: c.K }, (_, j) => res[2 * j + 1]!);
    assert.deepEqual(ids, r.ref, `${what}: ids`);
    const vals = Array.from({ length: c.K }, (_, j) => res[2 * j]!);
    assert.deepEqual(vals, r.ref.map((id) => bits[id]!), `${what}: logit bits`);
    assertPoisoned(res.subarray(2 * c.K, 2 * c.K + GUARD_WORDS), POISON_U32, `${what} result`);
    Object.values(r.b).forEach((buf) => buf.destroy());
  });
});

Deno.test("argmax_topk shape check throws before encoding", () => {
  const c: ArgmaxTopkConstants = { N_VOCAB: 1021, K: 10, N_BLOCK: 8, WG: 64, BUF: 64 };
  assert.throws(() => argmaxTopkVariants({ ...c, K: 65 }), /K must be an integer in \[1, 64\]/);
  assert.throws(() => argmaxTopkVariants({ ...c, BUF: 16 }), /BUF must be a power of two >= 2K/);
  assert.throws(() => argmaxTopkVariants({ ...c, N_VOCAB: 5 }), /K must be an integer in \[1, 5\]/);
});
