import assert from "node:assert/strict";
import { PipelineCache } from "./kernel.ts";
import { assertPoisoned } from "../tests/util/close.ts";
import { GUARD_WORDS, poisoned, readAll, testGpu, upload } from "../tests/util/gpu.ts";
import { Rng } from "../tests/util/rng.ts";
import {
  ARGMAX,
  ARGMAX_NONFINITE,
  argmaxBindGroups,
  type ArgmaxConstants,
  argmaxVariants,
  encodeArgmax,
} from "./argmax.ts";

const POISON_U32 = 0xffffffff;
const RING_LEN = 8;

/** Plain-loop reference: index of the largest logit, the lowest index among equals; NONFINITE for a row with NaN or +Inf. */
function refArgmax(x: Float32Array): number {
  if (x.some((v) => Number.isNaN(v) || v === Infinity)) return ARGMAX_NONFINITE;
  let best = 0;
  for (let i = 1; i < x.length; i++) if (x[i]! > x[best]!) best = i;
  return best;
}

interface Case {
  c: ArgmaxConstants;
  ties: boolean; // logits from a handful of values: the maximum repeats
  nan: boolean; // one NaN planted (or ±Inf: `inf`)
  inf?: number;
  maxLast?: boolean; // the unique maximum is the last logit (the tail of the last block)
  ringSlot: number;
}

Deno.test("argmax: greedy id with ties to the lowest index, written to next token and ring slot", async () => {
  const rng = new Rng();
  const { device } = await testGpu();
  const cache = new PipelineCache(device);
  const cases: Case[] = [
    { c: { N_VOCAB: 8, N_BLOCK: 2, WG: 64, WRITE_IDS: true }, ties: false, nan: false, ringSlot: 0 }, // debug
    { c: { N_VOCAB: 1021, N_BLOCK: 16, WG: 64, WRITE_IDS: true }, ties: true, nan: true, ringSlot: 3 },
    { c: { N_VOCAB: 1021, N_BLOCK: 300, WG: 32, WRITE_IDS: false }, ties: false, nan: false, ringSlot: 1 },
    {
      c: { N_VOCAB: 1021, N_BLOCK: 7, WG: 64, WRITE_IDS: true },
      ties: false,
      nan: false,
      ringSlot: 4,
      maxLast: true,
    },
    { c: { N_VOCAB: 248320, N_BLOCK: 256, WG: 256, WRITE_IDS: true }, ties: false, nan: true, ringSlot: 7 },
    { c: { N_VOCAB: 248320, N_BLOCK: 256, WG: 256, WRITE_IDS: true }, ties: true, nan: false, ringSlot: 5 },
    { c: { N_VOCAB: 151936, N_BLOCK: 97, WG: 128, WRITE_IDS: true }, ties: true, nan: false, ringSlot: 2 },
    {
      c: { N_VOCAB: 1021, N_BLOCK: 16, WG: 64, WRITE_IDS: true },
      ties: false,
      nan: false,
      inf: Infinity,
      ringSlot: 6,
    },
    {
      c: { N_VOCAB: 4099, N_BLOCK: 9, WG: 64, WRITE_IDS: true },
      ties: false,
      nan: false,
      inf: -Infinity,
      ringSlot: 1,
    },
    {
      c: { N_VOCAB: rng.int(1, 70000), N_BLOCK: rng.int(1, 400), WG: 256, WRITE_IDS: true },
      ties: rng.float() < 0.5,
      nan: false,
      ringSlot: rng.int(0, RING_LEN),
    },
  ];
  const enc = device.createCommandEncoder();
  const pass = enc.beginComputePass();
  const runs = [];
  for (const k of cases) {
    const n = k.c.N_VOCAB;
    const logits = k.ties ? Float32Array.from({ length: n }, () => rng.int(-6, 7) * 0.5) : rng.normals(n, 4);
    if (k.ties) {
      // The maximum also sits in the last element and in a later block than its first occurrence.
      logits[n - 1] = 3;
    }
    if (k.nan) logits[rng.int(0, n)] = NaN;
    if (k.inf !== undefined) logits[rng.int(0, n)] = k.inf;
    if (k.maxLast) logits[n - 1] = 100;
    const b = {
      logits: upload(device, logits),
      pairs: poisoned(device, 2 * k.c.N_BLOCK, POISON_U32),
      result: poisoned(device, 2, POISON_U32),
      params: upload(device, Uint32Array.of(k.ringSlot)),
      nextToken: poisoned(device, 1, POISON_U32),
      ring: poisoned(device, RING_LEN, POISON_U32),
    };
    const v = argmaxVariants(k.c);
    const pipelines = {
      partial: await cache.get(ARGMAX, v.partial),
      final: await cache.get(ARGMAX, v.final),
    };
    const bindGroups = argmaxBindGroups(device, { pipelines, constants: k.c, buffers: b });
    encodeArgmax(pass, { pipelines, bindGroups, constants: k.c });
    runs.push({ k, b, logits, ref: refArgmax(logits) });
  }
  pass.end();
  device.queue.submit([enc.finish()]);
  const outs = await readAll(device, runs.flatMap((r) => [r.b.result, r.b.nextToken, r.b.ring]));
  runs.forEach((r, i) => {
    const { c, ringSlot } = r.k;
    const what = `argmax N_VOCAB=${c.N_VOCAB} N_BLOCK=${c.N_BLOCK} WG=${c.WG} WRITE_IDS=${c.WRITE_IDS} ` +
      `ties=${r.k.ties} nan=${r.k.nan} inf=${r.k.inf} (seed ${rng.seed})`;
    const result = new Uint32Array(outs[3 * i]!);
    assert.equal(result[1], r.ref, `${what}: id`);
    if (r.ref !== ARGMAX_NONFINITE) {
      assert.equal(result[0], new Uint32Array(r.logits.buffer)[r.ref], `${what}: value bits`);
    }
    assertPoisoned(result.subarray(2, 2 + GUARD_WORDS), POISON_U32, `${what} result`);
    const next = new Uint32Array(outs[3 * i + 1]!);
    const ring = new Uint32Array(outs[3 * i + 2]!);
    const expectRing = new Uint32Array(RING_LEN + GUARD_WORDS).fill(POISON_U32);
    if (c.WRITE_IDS) expectRing[ringSlot] = r.ref;
    assert.equal(next[0], c.WRITE_IDS ? r.ref : POISON_U32, `${what}: next token`);
    assertPoisoned(next.subarray(1, 1 + GUARD_WORDS), POISON_U32, `${what} next token`);
    assert.deepEqual(Array.from(ring), Array.from(expectRing), `${what}: ring`);
    Object.values(r.b).forEach((buf) => buf.destroy());
  });
});

Deno.test("argmax shape check throws before encoding", async () => {
  const { device } = await testGpu();
  const c: ArgmaxConstants = { N_VOCAB: 1021, N_BLOCK: 16, WG: 64, WRITE_IDS: true };
  const v = argmaxVariants(c);
  const cache = new PipelineCache(device);
  const pipelines = { partial: await cache.get(ARGMAX, v.partial), final: await cache.get(ARGMAX, v.final) };
  const small = device.createBuffer({ size: 64, usage: GPUBufferUsage.STORAGE });
  const big = device.createBuffer({ size: 4096, usage: GPUBufferUsage.STORAGE });
  const buffers = { logits: big, pairs: small, result: small, params: small, nextToken: small, ring: small };
  assert.throws(
    () => argmaxBindGroups(device, { pipelines, constants: c, buffers }),
    /binding pairs holds 64 bytes but ne=\[2, 16\]/,
  );
  assert.throws(() => argmaxVariants({ ...c, WG: 100 }), /power of two/);
  small.destroy();
  big.destroy();
});
