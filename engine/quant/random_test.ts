import assert from "node:assert/strict";
import { Rng } from "../../tests/util/rng.ts";
import { dequantize } from "./dequant.ts";
import { f16ToF32 } from "./f16.ts";
import { fillRandomBlocks, randomBlocks, RandomState } from "./random.ts";
import { type GgmlTypeName, TYPE_ID, typeInfo } from "./types.ts";

const ALL = Object.keys(TYPE_ID) as GgmlTypeName[];

/**
 * Largest possible |w| / scale per type (module doc table of random.ts): max |code| times the largest
 * effective scale; K-quants: c·65 (d·sc·(q − c) plus the δ of the mins, dmin = c·d); floats: 510/147.8.
 */
const MAX_MUL: Record<GgmlTypeName, number> = {
  F32: 510 / Math.sqrt((4 * 65535) / 12),
  F16: 510 / Math.sqrt((4 * 65535) / 12),
  BF16: 510 / Math.sqrt((4 * 65535) / 12),
  Q8_0: 128,
  Q4_0: 8,
  IQ4_NL: 127,
  IQ4_XS: 32 * 127,
  Q6_K: 128 * 32,
  Q4_K: 7.5 * 65,
  Q5_K: 15.5 * 65,
};

function u16(b: Uint8Array, o: number): number {
  return b[o]! | (b[o + 1]! << 8);
}

function i8(v: number): number {
  return (v << 24) >> 24;
}

/** Elements of `n` blocks of `type`. */
function elems(type: GgmlTypeName, nBlocks: number): number {
  return nBlocks * typeInfo(type).blockElems;
}

Deno.test("randomBlocks gives finite values of the requested magnitude for every type", () => {
  const rng = new Rng();
  for (const type of ALL) {
    const scale = 10 ** (rng.float() * 4 - 5);
    const nBlocks = typeInfo(type).blockElems === 1 ? 20_000 : 2_000;
    const y = dequantize(type, randomBlocks(type, nBlocks, { scale, seed: rng.u32() }), elems(type, nBlocks));
    let amax = 0;
    for (let i = 0; i < y.length; i++) {
      assert.ok(Number.isFinite(y[i]!), `seed ${rng.seed}: ${type} scale ${scale}: y[${i}] = ${y[i]}`);
      amax = Math.max(amax, Math.abs(y[i]!));
    }
    // f16 rounding may lift a scale field by 2^-11 relative; subnormal f16 fields by half a step, 2^-25.
    const hi = MAX_MUL[type] * (scale * (1 + 2 ** -10) + 2 ** -25);
    assert.ok(amax <= hi, `seed ${rng.seed}: ${type} scale ${scale}: max |w| ${amax} > ${hi}`);
    assert.ok(
      amax >= 0.5 * MAX_MUL[type] * scale,
      `seed ${rng.seed}: ${type} scale ${scale}: max |w| ${amax} too small`,
    );
  }
});

Deno.test("random float types are centred with std ≈ scale", () => {
  const rng = new Rng();
  for (const type of ["F32", "F16", "BF16"] as const) {
    const scale = 10 ** (rng.float() * 4 - 3);
    const n = 40_000;
    const y = dequantize(type, randomBlocks(type, n, { scale, seed: rng.u32() }), n);
    let sum = 0;
    let sum2 = 0;
    for (const v of y) {
      sum += v;
      sum2 += v * v;
    }
    const mean = sum / n;
    const std = Math.sqrt(sum2 / n - mean * mean);
    assert.ok(Math.abs(mean) < 0.03 * scale, `seed ${rng.seed}: ${type} mean ${mean} for scale ${scale}`);
    assert.ok(Math.abs(std / scale - 1) < 0.03, `seed ${rng.seed}: ${type} std ${std} for scale ${scale}`);
  }
});

Deno.test("random K-quant blocks are nearly centred (mins track scales)", () => {
  const rng = new Rng();
  for (const type of ["Q4_K", "Q5_K"] as const) {
    const y = dequantize(type, randomBlocks(type, 500, { scale: 1, seed: rng.u32() }), elems(type, 500));
    let sum = 0;
    let sum2 = 0;
    for (const v of y) {
      sum += v;
      sum2 += v * v;
    }
    const mean = sum / y.length;
    const rms = Math.sqrt(sum2 / y.length);
    assert.ok(Math.abs(mean) < 0.1 * rms, `seed ${rng.seed}: ${type} mean ${mean} vs RMS ${rms}`);
  }
});

Deno.test("randomBlocks hits every code path: signs of d, sub-scale ranges, subnormal d", () => {
  const rng = new Rng();
  const n = 4000;
  const seen = (what: string, ok: boolean) =>
    assert.ok(ok, `seed ${rng.seed}: never saw ${what} in ${n} blocks`);

  for (const type of ["Q8_0", "Q4_0", "IQ4_NL", "IQ4_XS", "Q6_K"] as const) {
    const { blockBytes: bb } = typeInfo(type);
    const at = type === "Q6_K" ? 208 : 0;
    const b = randomBlocks(type, n, { scale: 1e-3, seed: rng.u32() });
    const ds = new Set<number>();
    for (let k = 0; k < n; k++) ds.add(u16(b, k * bb + at));
    seen(`${type} d < 0`, [...ds].some((d) => f16ToF32(d) < 0));
    seen(`${type} d > 0`, [...ds].some((d) => f16ToF32(d) > 0));
    seen(`${type} 100 distinct d`, ds.size >= 100);
  }

  // IQ4_XS at the full-model scale 2e-5: d is an f16 subnormal; all 64 sub-scale codes, negative included.
  const xs = randomBlocks("IQ4_XS", n, { scale: 2e-5, seed: rng.u32() });
  const ls = new Set<number>();
  let subnormal = 0;
  for (let k = 0; k < n; k++) {
    const o = 136 * k;
    if ((u16(xs, o) & 0x7c00) === 0) subnormal++;
    for (let ib = 0; ib < 8; ib++) {
      ls.add(((xs[o + 4 + (ib >> 1)]! >> (4 * (ib & 1))) & 0xf) | (((u16(xs, o + 2) >> (2 * ib)) & 3) << 4));
    }
  }
  seen("IQ4_XS all 64 sub-scale codes (ls − 32 from −32 to 31)", ls.size === 64);
  seen("IQ4_XS subnormal d at scale 2e-5", subnormal === n);

  // Q6_K: int8 scales of both signs, including −128 and 127.
  const q6 = randomBlocks("Q6_K", n, { scale: 1e-3, seed: rng.u32() });
  const s6 = new Set<number>();
  for (let k = 0; k < n; k++) for (let j = 0; j < 16; j++) s6.add(i8(q6[210 * k + 192 + j]!));
  seen("Q6_K all 256 int8 scales", s6.size === 256 && s6.has(-128) && s6.has(127));

  // Q4_K / Q5_K: positive d and dmin, 6-bit scales and mins over their whole range in both packings
  // (j < 4 and j >= 4), mins that differ from their scales, and (Q5_K) fifth bits set and clear.
  for (const type of ["Q4_K", "Q5_K"] as const) {
    const bb = typeInfo(type).blockBytes;
    const b = randomBlocks(type, n, { scale: 1e-3, seed: rng.u32() });
    const sc = [new Set<number>(), new Set<number>()];
    const mn = [new Set<number>(), new Set<number>()];
    let mDiffers = 0;
    let qhOnes = 0;
    for (let k = 0; k < n; k++) {
      const o = bb * k;
      assert.ok(
        f16ToF32(u16(b, o)) > 0 && f16ToF32(u16(b, o + 2)) > 0,
        `seed ${rng.seed}: ${type} d, dmin > 0`,
      );
      for (let j = 0; j < 8; j++) {
        const s = o + 4;
        const scj = j < 4 ? b[s + j]! & 63 : (b[s + j + 4]! & 0xf) | ((b[s + j - 4]! >> 6) << 4);
        const mj = j < 4 ? b[s + j + 4]! & 63 : (b[s + j + 4]! >> 4) | ((b[s + j]! >> 6) << 4);
        sc[j >> 2]!.add(scj);
        mn[j >> 2]!.add(mj);
        if (mj !== scj) mDiffers++;
        assert.ok(
          Math.abs(mj - scj) <= 2,
          `seed ${rng.seed}: ${type} block ${k} sub-block ${j}: m ${mj} sc ${scj}`,
        );
      }
      if (type === "Q5_K") { for (let l = 0; l < 32; l++) qhOnes += popcount(b[o + 16 + l]!); }
    }
    for (const h of [0, 1]) {
      seen(`${type} all 64 scales for j ${h ? ">=" : "<"} 4`, sc[h]!.size === 64);
      seen(`${type} all 64 mins for j ${h ? ">=" : "<"} 4`, mn[h]!.size === 64);
    }
    seen(`${type} mins different from scales`, mDiffers > n);
    if (type === "Q5_K") {
      const frac = qhOnes / (n * 256);
      assert.ok(frac > 0.45 && frac < 0.55, `seed ${rng.seed}: Q5_K fifth bits set in ${frac} of elements`);
    }
  }
});

function popcount(v: number): number {
  let c = 0;
  for (; v; v &= v - 1) c++;
  return c;
}

Deno.test("randomBlocks is deterministic per seed and chunked fills continue the same stream", () => {
  const rng = new Rng();
  for (const type of ALL) {
    const bb = typeInfo(type).blockBytes;
    const nBlocks = 96;
    const seed = rng.u32();
    const whole = randomBlocks(type, nBlocks, { scale: 0.01, seed });
    assert.deepEqual(randomBlocks(type, nBlocks, { scale: 0.01, seed }), whole, `${type}: same seed`);
    assert.notDeepEqual(randomBlocks(type, nBlocks, { scale: 0.01, seed: seed ^ 1 }), whole, `${type}: seed`);
    // Chunks of 4 blocks (a multiple of 8 bytes for every type), written into a buffer at an odd offset.
    const buf = new Uint8Array(whole.length + 3);
    const dst = buf.subarray(1, 1 + whole.length);
    const state = new RandomState(seed);
    for (let o = 0; o < whole.length; o += 4 * bb) {
      fillRandomBlocks(type, dst.subarray(o, o + 4 * bb), { scale: 0.01, state });
    }
    assert.deepEqual(dst, whole, `seed ${rng.seed}: ${type}: chunked unaligned fill differs from one call`);
    assert.equal(buf[0], 0, `${type}: wrote before dst`);
    assert.equal(buf[buf.length - 1], 0, `${type}: wrote past dst`);
  }
});

Deno.test("RandomState words are uniform-looking: each bit set about half the time", () => {
  const rng = new Rng();
  const words = new Uint32Array(1 << 16);
  new RandomState(rng.u32()).fillWords(words);
  for (let bit = 0; bit < 32; bit++) {
    let ones = 0;
    for (const w of words) ones += (w >>> bit) & 1;
    const frac = ones / words.length;
    // 65536 draws: std of the fraction is 0.002, so 0.015 is over 7 sigma.
    assert.ok(Math.abs(frac - 0.5) < 0.015, `seed ${rng.seed}: bit ${bit} set in ${frac} of words`);
  }
  // Consecutive words (the two halves of one xorshift step included) differ in about 16 of 32 bits.
  let diffBits = 0;
  for (let i = 0; i + 1 < words.length; i++) diffBits += popcount((words[i]! ^ words[i + 1]!) >>> 0);
  const mean = diffBits / (words.length - 1);
  assert.ok(
    Math.abs(mean - 16) < 0.1,
    `seed ${rng.seed}: consecutive words differ in ${mean} bits on average`,
  );
});

Deno.test("fillRandomBlocks output does not depend on the alignment of dst (odd lengths included)", () => {
  const rng = new Rng();
  for (const type of ["Q8_0", "Q4_0", "Q6_K", "F16"] as const) {
    for (const nBlocks of [1, 3, 5, 1000, 40_001]) {
      const seed = rng.u32();
      const aligned = randomBlocks(type, nBlocks, { scale: 0.5, seed });
      const buf = new Uint8Array(aligned.length + 2);
      fillRandomBlocks(type, buf.subarray(2), { scale: 0.5, state: new RandomState(seed) });
      assert.deepEqual(buf.subarray(2), aligned, `seed ${rng.seed}: ${type} x${nBlocks} at offset 2`);
    }
  }
});

Deno.test("fillRandomBlocks rejects partial blocks and unusable scales", () => {
  const state = new RandomState(1);
  assert.throws(
    () => fillRandomBlocks("IQ4_XS", new Uint8Array(137), { scale: 1, state }),
    /IQ4_XS: random fill of 137 bytes is not a whole number of 136-byte blocks/,
  );
  assert.throws(() => fillRandomBlocks("Q8_0", new Uint8Array(34), { scale: 0, state }), /positive finite/);
  assert.throws(() => fillRandomBlocks("Q8_0", new Uint8Array(34), { scale: NaN, state }), /positive finite/);
  assert.throws(
    () => fillRandomBlocks("Q8_0", new Uint8Array(34), { scale: 1e-9, state }),
    /f16 scale fields/,
  );
  assert.throws(
    () => fillRandomBlocks("Q4_K", new Uint8Array(144), { scale: 1e4, state }),
    /f16 scale fields/,
  );
  assert.throws(() => randomBlocks("Q6_K", 1.5, { scale: 1, seed: 1 }), /block count/);
});
