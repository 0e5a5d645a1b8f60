import assert from "node:assert/strict";
import {
  checkSampling,
  isGreedy,
  randomSeed,
  resolveTemperature,
  SAMPLE_HIST,
  sampleConstantsFor,
  sampleParamWords,
  SAMPLING_DEFAULTS,
  samplingParams,
  unusedTokenMask,
} from "./sampling.ts";
import { TOKEN_TYPE } from "./text/tokenizer.ts";
import {
  SAMPLE_FLAG_MASK,
  SAMPLE_PARAMS,
  SAMPLE_PARAMS_WORDS,
  sampleWorkgroupBytes,
} from "../wgsl/sample.ts";

Deno.test("samplingParams: defaults fill absent or undefined fields; a seed is drawn when none is given", () => {
  const p = samplingParams({ temperature: 0.7, topP: undefined }, { randomSeed: () => 99 });
  assert.deepEqual(p, { ...SAMPLING_DEFAULTS, temperature: 0.7, seed: 99 });
  assert.equal(samplingParams({ seed: 5 }).seed, 5);
  const seeds = new Set(Array.from({ length: 50 }, () => samplingParams().seed));
  assert.ok(seeds.size > 45, "fresh seeds differ");
  for (let i = 0; i < 200; i++) {
    const s = randomSeed();
    assert.ok(Number.isSafeInteger(s) && s >= 0, `random seed ${s} is a safe non-negative integer`);
  }
  // A partial shape (no penaltyLastN) is completed with the defaults.
  const server = {
    temperature: 0,
    topK: 0,
    topP: 1,
    minP: 0,
    repeatPenalty: 1,
    presencePenalty: 0,
    frequencyPenalty: 0,
    seed: 3,
  };
  assert.equal(samplingParams(server).penaltyLastN, SAMPLING_DEFAULTS.penaltyLastN);
});

Deno.test("checkSampling: an out-of-range field throws a RangeError naming it, its value and the range", () => {
  const ok = samplingParams({ seed: 1 });
  const bad: [Partial<typeof ok>, RegExp][] = [
    [{ topP: 1.5 }, /^RangeError: top_p 1\.5 is outside \[0, 1\]$/],
    [{ topP: NaN }, /top_p NaN is outside \[0, 1\]/],
    [{ minP: -0.1 }, /min_p -0\.1 is outside \[0, 1\]/],
    [{ temperature: -1 }, /temperature -1 is outside \[0, 100\]/],
    [{ temperature: Infinity }, /temperature Infinity is outside/],
    [{ topK: 2.5 }, /top_k 2\.5 must be an integer in \[0, 2147483647\]/],
    [{ topK: -1 }, /top_k -1 must be an integer/],
    [{ repeatPenalty: 0 }, /repeat_penalty 0 is outside \(0, 10\]/],
    [{ presencePenalty: 2.5 }, /presence_penalty 2\.5 is outside \[-2, 2\]/],
    [{ frequencyPenalty: -3 }, /frequency_penalty -3 is outside \[-2, 2\]/],
    [{ penaltyLastN: 300 }, /penalty_last_n 300 must be an integer in \[-1, 256\]/],
    [{ penaltyLastN: -2 }, /penalty_last_n -2 must be an integer/],
    [{ seed: -1 }, /seed -1 must be an integer in \[0, 9007199254740991\]/],
    [{ seed: 0.5 }, /seed 0\.5 must be an integer/],
  ];
  for (const [patch, re] of bad) {
    assert.throws(() => checkSampling({ ...ok, ...patch }), (e: unknown) => {
      assert.ok(e instanceof RangeError, `${JSON.stringify(patch)} throws a RangeError`);
      assert.match(String(e), re);
      return true;
    });
    assert.throws(() => samplingParams({ ...patch, seed: patch.seed ?? 1 }), re);
  }
  for (const edge of [{ topP: 0 }, { topP: 1 }, { minP: 1 }, { temperature: 0 }, { penaltyLastN: -1 }]) {
    checkSampling({ ...ok, ...edge });
  }
});

Deno.test("resolveTemperature: server default when absent, capped, validated", () => {
  const policy = { default: 0.7, cap: 1.5 };
  assert.equal(resolveTemperature(undefined, policy), 0.7);
  assert.equal(resolveTemperature(0, policy), 0);
  assert.equal(resolveTemperature(1.2, policy), 1.2);
  assert.equal(resolveTemperature(2, policy), 1.5);
  assert.throws(
    () => resolveTemperature(-0.5, policy),
    /^RangeError: temperature -0\.5 is outside \[0, 100\]$/,
  );
  assert.throws(() => resolveTemperature(NaN, policy), /temperature NaN is outside/);
  assert.throws(
    () => resolveTemperature(1, { default: 2, cap: 1 }),
    /server default temperature 2 is outside \[0, 1\]/,
  );
});

Deno.test("sampleParamWords: fields at their words; window -1 is the whole ring; seed halves", () => {
  const p = samplingParams({
    temperature: 0.6,
    topK: 20,
    topP: 0.95,
    minP: 0.05,
    repeatPenalty: 1.1,
    presencePenalty: 1.5,
    frequencyPenalty: -0.25,
    penaltyLastN: -1,
    seed: 0x12345 * 2 ** 32 + 0x89abcdef,
  });
  const w = sampleParamWords(p, { ringSlot: 7, maskUnused: true });
  assert.equal(w.length, SAMPLE_PARAMS_WORDS);
  const f = new Float32Array(w.buffer);
  const o = SAMPLE_PARAMS;
  assert.equal(w[o.ringSlot], 7);
  assert.equal(w[o.flags], SAMPLE_FLAG_MASK);
  assert.equal(f[o.temperature], Math.fround(0.6));
  assert.equal(w[o.topK], 20);
  assert.equal(f[o.topP], Math.fround(0.95));
  assert.equal(f[o.minP], Math.fround(0.05));
  assert.equal(f[o.repeatPenalty], Math.fround(1.1));
  assert.equal(f[o.presencePenalty], 1.5);
  assert.equal(f[o.frequencyPenalty], -0.25);
  assert.equal(w[o.penaltyLastN], SAMPLE_HIST);
  assert.equal(w[o.seedLo], 0x89abcdef);
  assert.equal(w[o.seedHi], 0x12345);
  const plain = sampleParamWords({ ...p, penaltyLastN: 64 }, { hist: 16 });
  assert.equal(plain[o.penaltyLastN], 16, "window clamped to a smaller ring");
  assert.equal(plain[o.flags], 0);
  assert.equal(plain[o.ringSlot], 0);
  assert.throws(() => sampleParamWords({ ...p, topP: 2 }), /top_p 2 is outside/);
});

Deno.test("isGreedy and unusedTokenMask", () => {
  const p = samplingParams({ seed: 1 });
  assert.equal(isGreedy(p), false);
  assert.equal(isGreedy({ ...p, temperature: 0 }), true);
  assert.equal(isGreedy({ ...p, topK: 1 }), true);
  const types = new Array<number>(40).fill(TOKEN_TYPE.normal);
  types[3] = TOKEN_TYPE.unused;
  types[33] = TOKEN_TYPE.unused;
  types[5] = TOKEN_TYPE.control;
  const m = unusedTokenMask(types, 70);
  assert.equal(m.length, 3);
  assert.equal(m[0], 1 << 3);
  // Word 1: id 33 (bit 1) and ids 40..63 past the types (bits 8..31).
  assert.equal(m[1], (0xffffff00 | 0b10) >>> 0);
  assert.equal(m[2], 0b111111, "ids 64..69 past the types");
});

Deno.test("sampleConstantsFor: valid settings within 32 KiB of workgroup memory, small to large vocabularies", () => {
  for (const v of [1, 8, 1000, 151936, 248320, 2 ** 20]) {
    const c = sampleConstantsFor(v);
    assert.equal(c.N_VOCAB, v);
    assert.ok(sampleWorkgroupBytes(c) <= 32768, `nVocab ${v}: ${sampleWorkgroupBytes(c)} bytes`);
    assert.ok(Math.ceil(v / c.N_BLOCK) <= 32768, `nVocab ${v}: block of ${Math.ceil(v / c.N_BLOCK)}`);
  }
  assert.equal(sampleConstantsFor(248320).N_BLOCK, 32);
  assert.throws(() => sampleConstantsFor(0), /N_VOCAB must be an integer in \[1, 2147483648\], got 0/);
});
