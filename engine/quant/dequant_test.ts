import assert from "node:assert/strict";
import { Rng } from "../../tests/util/rng.ts";
import { dequantize, dequantizeRow, KVALUES_IQ4NL } from "./dequant.ts";
import { type GgmlTypeName, TYPE_ID, typeInfo } from "./types.ts";

/** Parses space-separated hex bytes as written in quants.md. */
function hexBytes(s: string): Uint8Array {
  return new Uint8Array(s.trim().split(/\s+/).map((b) => parseInt(b, 16)));
}

/** A block of `n` bytes filled with `fill`, then `at` overrides (byte offset -> value). */
function block(n: number, fill: number, at: Record<number, number>): Uint8Array {
  const b = new Uint8Array(n).fill(fill);
  for (const [o, v] of Object.entries(at)) b[Number(o)] = v;
  return b;
}

/** An expected array of `n` values from [from, to, value] ranges (half-open), zero elsewhere. */
function ranges(n: number, rs: [number, number, number][]): number[] {
  const out = new Array<number>(n).fill(0);
  for (const [from, to, v] of rs) out.fill(v, from, to);
  return out;
}

function assertValues(type: GgmlTypeName, got: Float64Array, want: number[]): void {
  assert.equal(got.length, want.length, `${type}: length`);
  for (let i = 0; i < want.length; i++) {
    assert.ok(got[i] === want[i], `${type}: y[${i}] = ${got[i]}, quants.md says ${want[i]}`); // -0 == 0 on purpose
  }
}

Deno.test("F32, F16, BF16 decode the quants.md examples", () => {
  assertValues("F32", dequantize("F32", hexBytes("00 00 80 3F 00 00 C0 BF"), 2), [1, -1.5]);
  assertValues(
    "F16",
    dequantize("F16", hexBytes("00 3C 00 C0 55 35 01 00 00 7C"), 5),
    [1, -2, 0.333251953125, 2 ** -24, Infinity],
  );
  assertValues("BF16", dequantize("BF16", hexBytes("80 3F A0 C0"), 2), [1, -5]);
});

Deno.test("F32 decodes from a byte view at an unaligned offset", () => {
  const buf = new Uint8Array(9);
  buf.set(hexBytes("00 00 80 3F 00 00 C0 BF"), 1);
  assertValues("F32", dequantize("F32", buf.subarray(1), 2), [1, -1.5]);
});

Deno.test("Q8_0 decodes the quants.md example", () => {
  const b = block(34, 0, { 0: 0x00, 1: 0x38, 2: 0x01, 3: 0xfe, 4: 0x7f, 5: 0x80 });
  assertValues(
    "Q8_0",
    dequantize("Q8_0", b, 32),
    ranges(32, [[0, 1, 0.5], [1, 2, -1], [2, 3, 63.5], [3, 4, -64]]),
  );
});

Deno.test("Q4_0 decodes the quants.md example (element j+16 in the high nibble)", () => {
  const b = block(18, 0x88, { 0: 0x00, 1: 0x3c, 2: 0x1f, 3: 0x80 });
  assertValues(
    "Q4_0",
    dequantize("Q4_0", b, 32),
    ranges(32, [[0, 1, 7], [16, 17, -7], [1, 2, -8], [17, 18, 0]]),
  );
});

Deno.test("IQ4_NL decodes the quants.md example", () => {
  const b = block(18, 0x88, { 0: 0x00, 1: 0x38, 2: 0x1f, 3: 0x80 });
  assertValues(
    "IQ4_NL",
    dequantize("IQ4_NL", b, 32),
    ranges(32, [[0, 32, 0.5], [0, 1, 56.5], [16, 17, -52], [1, 2, -63.5]]),
  );
});

Deno.test("IQ4_NL codebook matches its packed u32 form in quants.md", () => {
  const words = [0xbfad9881, 0xf6eaddcf, 0x26190d01, 0x71594535];
  for (let k = 0; k < 16; k++) {
    const byte = (words[k >> 2]! >>> (8 * (k & 3))) & 0xff;
    assert.equal(KVALUES_IQ4NL[k], (byte << 24) >> 24, `kvalues_iq4nl[${k}]`);
  }
});

Deno.test("IQ4_XS decodes the quants.md example (signed 6-bit sub-scales)", () => {
  const b = block(136, 0x88, {
    0: 0x00,
    1: 0x3c,
    2: 0xa6,
    3: 0xaa,
    4: 0xf1,
    5: 0,
    6: 0,
    7: 0,
    8: 0x1f,
    24: 0x80,
  });
  assertValues(
    "IQ4_XS",
    dequantize("IQ4_XS", b, 256),
    ranges(256, [[0, 32, 1], [0, 1, 113], [16, 17, -104], [32, 64, -1], [32, 33, 127], [64, 256, 0]]),
  );
});

const K_SCALES = "81 03 00 00 42 04 00 00 11 00 00 00";

Deno.test("Q4_K decodes the quants.md example (get_scale_min_k4, min subtracted)", () => {
  const b = new Uint8Array(144);
  b.set(hexBytes(`00 3C 00 38 ${K_SCALES}`), 0);
  b[16] = 0x52;
  b[16 + 64] = 0x03;
  assertValues(
    "Q4_K",
    dequantize("Q4_K", b, 256),
    ranges(256, [[0, 1, 1], [1, 32, -1], [32, 33, 13], [33, 64, -2], [128, 129, 90.5], [129, 160, -8.5]]),
  );
});

Deno.test("Q5_K decodes the quants.md example (fifth bits from qh)", () => {
  const b = new Uint8Array(176);
  b.set(hexBytes(`00 3C 00 38 ${K_SCALES}`), 0);
  b[16] = 0x13;
  b[48] = 0x52;
  b[48 + 64] = 0x03;
  assertValues(
    "Q5_K",
    dequantize("Q5_K", b, 256),
    ranges(256, [[0, 1, 17], [1, 32, -1], [32, 33, 61], [33, 64, -2], [128, 129, 618.5], [129, 160, -8.5]]),
  );
});

Deno.test("Q6_K decodes the quants.md example (int8 scales, d last)", () => {
  const b = block(210, 0, {
    0: 0x21,
    32: 0x43,
    128: 0xe4,
    192: 2,
    194: 0xff,
    196: 4,
    198: 1,
    208: 0x00,
    209: 0x34,
  });
  assertValues(
    "Q6_K",
    dequantize("Q6_K", b, 256),
    ranges(256, [
      [0, 1, -15.5],
      [1, 16, -16],
      [32, 33, 3.25],
      [33, 48, 8],
      [64, 65, 2],
      [65, 80, -32],
      [96, 97, 5],
      [97, 112, -8],
    ]),
  );
});

Deno.test("Q4_K rounds d1·q − m1 to f32 as ggml does", () => {
  // d = 1, dmin = 2^-24 (f16 subnormal), sc0 = m0 = 1, q = 15: 15 − 2^-24 is 15 in f32 (ulp 2^-20).
  const b = new Uint8Array(144);
  b.set(hexBytes("00 3C 01 00 01 00 00 00 01 00 00 00 00 00 00 00"), 0);
  b[16] = 0x0f;
  const y = dequantize("Q4_K", b, 256);
  assert.equal(y[0], 15);
  assert.equal(y[1], -(2 ** -24));
});

Deno.test("dequantize returns f32-representable values for random blocks of every type", () => {
  const rng = new Rng();
  for (const type of Object.keys(TYPE_ID) as GgmlTypeName[]) {
    const info = typeInfo(type);
    const n = 8 * info.blockElems;
    const bytes = rng.bytes(8 * info.blockBytes);
    const y = dequantize(type, bytes, n);
    for (let i = 0; i < n; i++) {
      const v = y[i]!;
      assert.ok(
        Number.isNaN(v) || Math.fround(v) === v,
        `seed ${rng.seed}: ${type} y[${i}] = ${v} is not an f32`,
      );
    }
  }
});

Deno.test("dequantize throws RangeError naming type, expected and actual sizes", () => {
  assert.throws(() => dequantize("Q8_0", new Uint8Array(33), 32), (e: unknown) => {
    assert.ok(e instanceof RangeError);
    assert.match(e.message, /Q8_0/);
    assert.match(e.message, /34 bytes/);
    assert.match(e.message, /got 33 bytes/);
    return true;
  });
  assert.throws(() => dequantize("IQ4_XS", new Uint8Array(136), 255), /IQ4_XS: 255 elements is not a whole/);
  assert.throws(() => dequantize("F16", new Uint8Array(3), 2), RangeError);
});

Deno.test("dequantizeRow picks one row of a 3-D tensor and checks its arguments", () => {
  const rng = new Rng();
  const ne0 = 512;
  const nRows = 6;
  const rb = (ne0 / 256) * 176;
  const bytes = rng.bytes(nRows * rb);
  for (let r = 0; r < nRows; r++) {
    const got = dequantizeRow("Q5_K", bytes, ne0, r);
    const want = dequantize("Q5_K", bytes.slice(r * rb, (r + 1) * rb), ne0);
    assert.deepEqual(got, want, `seed ${rng.seed}: row ${r}`);
  }
  assert.throws(() => dequantizeRow("Q5_K", bytes, ne0, nRows), /Row 6 is out of range/);
  assert.throws(() => dequantizeRow("Q5_K", bytes, 384, 0), /ne0=384/);
  assert.throws(() => dequantizeRow("Q5_K", bytes.subarray(1), ne0, 0), /not a whole number of rows/);
});

Deno.test("every sub-block scale field maps to its documented elements (distinct values, signs)", () => {
  // IQ4_XS: all codes 0 (kvalue −127), d = 1: sub-block ib decodes to (ls(ib) − 32)·(−127).
  const ls = [0, 63, 17, 46, 31, 32, 5, 50];
  const xs = new Uint8Array(136);
  xs[1] = 0x3c;
  let scalesH = 0;
  ls.forEach((v, ib) => {
    scalesH |= (v >> 4) << (2 * ib);
    xs[4 + (ib >> 1)]! |= (v & 0xf) << (4 * (ib & 1));
  });
  xs[2] = scalesH & 0xff;
  xs[3] = scalesH >> 8;
  assertValues(
    "IQ4_XS",
    dequantize("IQ4_XS", xs, 256),
    ranges(256, ls.map((v, ib) => [32 * ib, 32 * ib + 32, (v - 32) * -127])),
  );

  // Q4_K / Q5_K: d = dmin = 1, every code 1 (Q5_K: plus the fifth bit, 17): sub-block j is code·sc[j] − m[j].
  const sc = [10, 17, 24, 31, 38, 45, 52, 59];
  const m = [60, 55, 50, 45, 40, 35, 30, 25];
  const packed = new Uint8Array(12);
  for (let j = 0; j < 4; j++) {
    packed[j] = sc[j]! | ((sc[j + 4]! >> 4) << 6);
    packed[j + 4] = m[j]! | ((m[j + 4]! >> 4) << 6);
    packed[j + 8] = (sc[j + 4]! & 0xf) | ((m[j + 4]! & 0xf) << 4);
  }
  for (const type of ["Q4_K", "Q5_K"] as const) {
    const b = new Uint8Array(type === "Q4_K" ? 144 : 176);
    b.set([0x00, 0x3c, 0x00, 0x3c], 0);
    b.set(packed, 4);
    const code = type === "Q4_K" ? 1 : 17;
    if (type === "Q5_K") b.fill(0xff, 16, 48);
    b.fill(0x11, type === "Q4_K" ? 16 : 48);
    assertValues(
      type,
      dequantize(type, b, 256),
      ranges(256, sc.map((s, j) => [32 * j, 32 * j + 32, code * s - m[j]!])),
    );
  }

  // Q6_K: d = 1, every code 0 (q = −32): scale k (int8, odd ones negative) covers y[16k .. 16k+15].
  const s6 = Array.from({ length: 16 }, (_, k) => (k & 1 ? -(k + 1) * 8 : k * 8 + 1));
  const b6 = new Uint8Array(210);
  s6.forEach((v, k) => (b6[192 + k] = v & 0xff));
  b6[209] = 0x3c;
  assertValues(
    "Q6_K",
    dequantize("Q6_K", b6, 256),
    ranges(256, s6.map((v, k) => [16 * k, 16 * k + 16, -32 * v])),
  );
});
