import assert from "node:assert/strict";
import { decodeStringRun, UTF8 } from "./_gguf_strings.ts";
import { Rng } from "../tests/util/rng.ts";

/** Encodes byte strings as a GGUF string run (u64 length + bytes each) after `lead` filler bytes. */
function run(strings: readonly Uint8Array[], lead = 3, tail = 0): Uint8Array {
  const size = lead + strings.reduce((a, s) => a + 8 + s.length, 0) + tail;
  const out = new Uint8Array(size);
  const dv = new DataView(out.buffer);
  let p = lead;
  for (const s of strings) {
    dv.setBigUint64(p, BigInt(s.length), true);
    out.set(s, p + 8);
    p += 8 + s.length;
  }
  return out;
}

/** Byte pieces that stress a UTF-8 decoder: valid sequences of each length, and every kind of malformed one. */
const PIECES: readonly number[][] = [
  [0x41],
  [0x00],
  [0x7f],
  [0xc3, 0xa9], // é
  [0xe2, 0x9c, 0x93], // ✓
  [0xef, 0xbb, 0xbf], // U+FEFF (a BOM must survive decoding)
  [0xf0, 0x9d, 0x84, 0x9e], // 𝄞 (a surrogate pair in UTF-16)
  [0xf4, 0x8f, 0xbf, 0xbf], // U+10FFFF
  [0xc0, 0x80], // overlong NUL
  [0xc1, 0xbf], // overlong
  [0xe0, 0x80, 0x80], // overlong
  [0xed, 0xa0, 0x80], // UTF-8 encoded surrogate
  [0xf0, 0x80, 0x80, 0x80], // overlong
  [0xf4, 0x90, 0x80, 0x80], // above U+10FFFF
  [0xf5],
  [0xff],
  [0x80], // lone continuation
  [0xbf],
  [0xe2, 0x9c], // truncated 3-byte
  [0xf0, 0x9d, 0x84], // truncated 4-byte
  [0xc3], // truncated 2-byte
  [0xe2, 0x41, 0x93], // bad continuation
];

Deno.test("decodeStringRun equals per-string TextDecoder on valid and malformed UTF-8", () => {
  const rng = new Rng();
  for (let iter = 0; iter < 200; iter++) {
    const n = rng.int(0, 60);
    const strings = Array.from({ length: n }, () => {
      const bytes: number[] = [];
      for (let k = rng.int(0, 6); k > 0; k--) bytes.push(...PIECES[rng.int(0, PIECES.length)]!);
      return new Uint8Array(bytes);
    });
    const buf = run(strings, 3, rng.int(0, 3));
    const got = decodeStringRun(buf, 3, n);
    assert.ok(got !== undefined, `seed ${rng.seed}`);
    const want = strings.map((s) => UTF8.decode(s));
    assert.deepEqual(got.values, want, `iteration ${iter}, seed ${rng.seed}`);
    assert.equal(got.endBytes, 3 + strings.reduce((a, s) => a + 8 + s.length, 0));
  }
  // A leading U+FEFF is kept, as a character of the token.
  const bom = decodeStringRun(run([new Uint8Array([0xef, 0xbb, 0xbf, 0x41])], 0), 0, 1);
  assert.deepEqual(bom?.values, ["\uFEFFA"]);
});

Deno.test("decodeStringRun returns undefined when the run does not fit the buffer", () => {
  const strings = ["ab", "cde", ""].map((s) => new TextEncoder().encode(s));
  const buf = run(strings, 0);
  assert.deepEqual(decodeStringRun(buf, 0, 3)?.values, ["ab", "cde", ""]);
  assert.deepEqual(decodeStringRun(buf, 0, 2)?.endBytes, 8 + 2 + 8 + 3);
  for (let cut = 0; cut < buf.length; cut++) {
    assert.equal(decodeStringRun(buf.subarray(0, cut), 0, 3), undefined);
  }
  assert.equal(decodeStringRun(buf, 0, 4), undefined, "count beyond the buffer");
  const big = buf.slice();
  new DataView(big.buffer).setUint32(4, 1, true); // length >= 2^32
  assert.equal(decodeStringRun(big, 0, 3), undefined);
});
