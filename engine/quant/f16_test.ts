import assert from "node:assert/strict";
import { Rng } from "../../tests/util/rng.ts";
import { bf16ToF32, f16ToF32, f32ToBf16, f32ToF16 } from "./f16.ts";

const F32 = new Float32Array(1);
const U32 = new Uint32Array(F32.buffer);

function f32FromBits(bits: number): number {
  U32[0] = bits;
  return F32[0]!;
}

function hex(v: number): string {
  return `0x${(v >>> 0).toString(16)}`;
}

Deno.test("f16ToF32 decodes the quants.md examples", () => {
  assert.equal(f16ToF32(0x3c00), 1);
  assert.equal(f16ToF32(0xc000), -2);
  assert.equal(f16ToF32(0x3555), 0.333251953125);
  assert.equal(f16ToF32(0x0001), 2 ** -24);
  assert.equal(f16ToF32(0x7c00), Infinity);
  assert.equal(f16ToF32(0xfc00), -Infinity);
  assert.ok(Number.isNaN(f16ToF32(0x7e00)));
  assert.ok(Object.is(f16ToF32(0x8000), -0));
  assert.equal(f16ToF32(0x7bff), 65504);
  assert.equal(f16ToF32(0x0400), 2 ** -14);
  assert.equal(f16ToF32(0x03ff), 1023 * 2 ** -24);
});

Deno.test("f32ToF16 rounds to nearest even at overflow, subnormal and normal boundaries", () => {
  const cases: [number, number][] = [
    [1, 0x3c00],
    [-2, 0xc000],
    [65504, 0x7bff],
    [65519.99, 0x7bff],
    [65520, 0x7c00], // halfway to 2^16: ties to even = inf
    [1e9, 0x7c00],
    [-Infinity, 0xfc00],
    [2 ** -24, 0x0001],
    [2 ** -25, 0x0000], // tie between 0 and the smallest subnormal: even = 0
    [1.5 * 2 ** -25, 0x0001],
    [3 * 2 ** -25, 0x0002], // tie between 1 and 2 subnormal steps: even = 2
    [-(2 ** -26), 0x8000],
    [2 ** -14 - 2 ** -25, 0x0400], // largest subnormal + half step: tie rounds up to the smallest normal
    [1 + 2 ** -11, 0x3c00], // tie: even mantissa stays
    [1 + 3 * 2 ** -11, 0x3c02], // tie: odd mantissa rounds up
    [1 + 2 ** -11 + 2 ** -20, 0x3c01],
    [0.333251953125, 0x3555],
    [-0, 0x8000],
  ];
  for (const [x, want] of cases) assert.equal(f32ToF16(x), want, `f32ToF16(${x})`);
  assert.equal(f32ToF16(NaN), 0x7e00);
});

Deno.test("f16 round trip is the identity on all 65536 patterns (NaN stays NaN)", () => {
  for (let b = 0; b < 0x10000; b++) {
    const v = f16ToF32(b);
    if (Number.isNaN(v)) {
      assert.ok(Number.isNaN(f16ToF32(f32ToF16(v))), `NaN pattern ${hex(b)}`);
      continue;
    }
    assert.equal(f32ToF16(v), b, `pattern ${hex(b)} value ${v}`);
  }
});

Deno.test("f32ToF16 agrees with Math.f16round on random f32 bit patterns", () => {
  const rng = new Rng();
  for (let i = 0; i < 200_000; i++) {
    // Half the draws near the f16 range (|exponent| small) so subnormals and ties are frequent.
    const bits = i & 1 ? rng.u32() : (rng.u32() & 0x807fffff) | ((rng.int(100, 145) & 0xff) << 23);
    const x = f32FromBits(bits);
    const want = Math.f16round(x);
    const got = f16ToF32(f32ToF16(x));
    assert.ok(
      Object.is(got, want) || (Number.isNaN(got) && Number.isNaN(want)),
      `seed ${rng.seed}: f32 ${hex(bits)} (${x}) -> ${got}, Math.f16round gives ${want}`,
    );
  }
});

Deno.test("bf16 decodes the quants.md examples and encodes with round-to-nearest-even", () => {
  assert.equal(bf16ToF32(0x3f80), 1);
  assert.equal(bf16ToF32(0xc0a0), -5);
  assert.equal(f32ToBf16(1), 0x3f80);
  assert.equal(f32ToBf16(-5), 0xc0a0);
  assert.equal(f32ToBf16(f32FromBits(0x3f808000)), 0x3f80); // tie, even stays
  assert.equal(f32ToBf16(f32FromBits(0x3f818000)), 0x3f82); // tie, odd rounds up
  assert.equal(f32ToBf16(f32FromBits(0x3f808001)), 0x3f81);
  assert.equal(f32ToBf16(f32FromBits(0x3f807fff)), 0x3f80);
  assert.equal(f32ToBf16(f32FromBits(0x7f7fffff)), 0x7f80); // overflow to inf
  assert.equal(f32ToBf16(-Infinity), 0xff80);
  assert.ok(Number.isNaN(bf16ToF32(f32ToBf16(NaN))));
  assert.ok(Number.isNaN(bf16ToF32(f32ToBf16(f32FromBits(0x7f800001)))), "signalling NaN must stay NaN");
  assert.equal(f32ToBf16(f32FromBits(0x00010000)), 0x0001); // subnormals are kept, not flushed
});

Deno.test("bf16 round trip is the identity on all non-NaN patterns", () => {
  for (let b = 0; b < 0x10000; b++) {
    const v = bf16ToF32(b);
    if (Number.isNaN(v)) continue;
    assert.equal(f32ToBf16(v), b, `pattern ${hex(b)}`);
  }
});

Deno.test("f32ToBf16 picks the nearer neighbour (ties to even) on random f32 bit patterns", () => {
  const rng = new Rng();
  for (let i = 0; i < 200_000; i++) {
    const bits = rng.u32();
    const x = f32FromBits(bits);
    if (!Number.isFinite(x)) continue;
    // Independent reference: compare distances to the truncated pattern and the next one up in magnitude.
    const lo = bits >>> 16;
    const hi = lo + 1;
    const dLo = Math.abs(x - bf16ToF32(lo));
    // Past the largest finite bf16 the next pattern is inf: RNE treats it as 2^128 for the distance.
    const vHi = (hi & 0x7fff) === 0x7f80 ? Math.sign(x) * 2 ** 128 : bf16ToF32(hi);
    const dHi = Math.abs(x - vHi);
    const want = dLo < dHi ? lo : dHi < dLo ? hi : (lo & 1) === 0 ? lo : hi;
    assert.equal(f32ToBf16(x), want & 0xffff, `seed ${rng.seed}: f32 ${hex(bits)} (${x})`);
  }
});
