import assert from "node:assert/strict";
import { GgufError, type GgufErrorCode } from "./errors.ts";
import { GGUF_VALUE_TYPE as T, type GgufKv, MAX_HEADER_BYTES, openGguf, splitPartPath } from "./gguf.ts";
import { type GgufWriteTensor, kv, writeGguf, writeGgufSplit } from "./gguf_write.ts";
import { KEYS } from "./names.ts";
import { Rng } from "../tests/util/rng.ts";

const enc = new TextEncoder();

const BASE_KV: ReadonlyArray<readonly [string, GgufKv]> = [
  ["test.u32", kv.u32(7)],
  ["test.bool", kv.bool(true)],
  ["test.str", kv.str("hello")],
  ["test.arr", kv.arr(T.UINT32, [1, 2, 3])],
  ["test.strs", kv.arr(T.STRING, ["a", "bc"])],
  ["test.bools", kv.arr(T.BOOL, [true, false])],
  ["test.nested", kv.arr(T.ARRAY, [kv.arr(T.UINT8, [1])])],
];

/** tensor.a: F32 ne=[8, 2] (64 bytes, offset 0); tensor.b: Q8_0 ne=[64, 2] (136 bytes, offset 64). */
function baseTensors(rng: Rng): GgufWriteTensor[] {
  return [
    { name: "tensor.a", type: "F32", ne: [8, 2], data: rng.bytes(64) },
    { name: "tensor.b", type: "Q8_0", ne: [64, 2], data: rng.bytes(136) },
  ];
}

function indexOf(hay: Uint8Array, needle: Uint8Array, from = 0): number {
  outer: for (let i = from; i + needle.length <= hay.length; i++) {
    for (let j = 0; j < needle.length; j++) if (hay[i + j] !== needle[j]) continue outer;
    return i;
  }
  return -1;
}

/** The encoded string (u64 length + bytes) of `s`, for finding a key or tensor name exactly. */
function encodedString(s: string): Uint8Array {
  const b = enc.encode(s);
  const out = new Uint8Array(8 + b.length);
  new DataView(out.buffer).setBigUint64(0, BigInt(b.length), true);
  out.set(b, 8);
  return out;
}

/** Byte offsets of fields in a written file, found from the encoded key/name (spec §2.2, §2.3). */
class Layout {
  readonly bytes: Uint8Array;
  constructor(bytes: Uint8Array) {
    this.bytes = bytes;
  }

  #find(s: string): number {
    const at = indexOf(this.bytes, encodedString(s));
    assert.ok(at >= 0, `test setup: ${s} not found`);
    assert.equal(indexOf(this.bytes, encodedString(s), at + 1), -1, `test setup: ${s} found twice`);
    return at;
  }

  /** Offsets of a metadata pair: its key length, key bytes, value type and value. */
  key(k: string): { lenAt: number; keyAt: number; typeAt: number; valueAt: number } {
    const lenAt = this.#find(k);
    const typeAt = lenAt + 8 + enc.encode(k).length;
    return { lenAt, keyAt: lenAt + 8, typeAt, valueAt: typeAt + 4 };
  }

  /** Offsets of a tensor info's fields. */
  tensor(
    name: string,
  ): { at: number; nDimsAt: number; neAt: (d: number) => number; typeAt: number; offAt: number } {
    const at = this.#find(name);
    const nDimsAt = at + 8 + enc.encode(name).length;
    const nDims = new DataView(this.bytes.buffer).getUint32(nDimsAt, true);
    const typeAt = nDimsAt + 4 + 8 * nDims;
    return { at, nDimsAt, neAt: (d) => nDimsAt + 4 + 8 * d, typeAt, offAt: typeAt + 4 };
  }
}

async function withTempDir(fn: (dir: string) => Promise<void>): Promise<void> {
  const dir = await Deno.makeTempDir({ prefix: "gguf_test_" });
  try {
    await fn(dir);
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
}

interface Expect {
  readonly code: GgufErrorCode;
  /** Every string must appear in the message (the file path is always checked). */
  readonly has: readonly string[];
  /** Exact `offsetBytes` of the error, when the case pins it. */
  readonly offsetBytes?: number;
  /** Path the error must name (default: the opened path). */
  readonly path?: string;
}

async function expectError(path: string, want: Expect, what: string): Promise<void> {
  let err: unknown;
  try {
    const g = await openGguf(path);
    g.close();
  } catch (e) {
    err = e;
  }
  assert.ok(err instanceof GgufError, `${what}: expected a GgufError, got ${err}`);
  const msg = `${what}: got ${err.code} at ${err.offsetBytes}: ${err.message}`;
  assert.equal(err.code, want.code, msg);
  const p = want.path ?? path;
  assert.equal(err.path, p, msg);
  assert.ok(err.message.includes(p), msg);
  for (const s of want.has) assert.ok(err.message.includes(s), `${msg}\n  missing: ${s}`);
  if (want.offsetBytes !== undefined) assert.equal(err.offsetBytes, want.offsetBytes, msg);
  assert.match(err.message, /^[A-Z]/, msg);
  assert.doesNotMatch(err.message, /\.$/, msg);
}

interface Case {
  readonly name: string;
  /** Edits a copy of the base file (or returns a shorter copy to truncate it). */
  readonly patch: (b: Uint8Array, dv: DataView, l: Layout) => Uint8Array | void;
  readonly want: (l: Layout, size: number) => Expect;
}

const u64 = (dv: DataView, at: number, v: bigint) => dv.setBigUint64(at, v, true);

const CASES: readonly Case[] = [
  {
    name: "wrong magic",
    patch: (b) => void (b[0] = 0x47 + 1),
    want: () => ({
      code: "bad_magic",
      has: ["magic", "47 47 55 46", "found 48 47 55 46", "not a GGUF"],
      offsetBytes: 0,
    }),
  },
  {
    name: "version 1",
    patch: (_b, dv) => dv.setUint32(4, 1, true),
    want: () => ({ code: "bad_version", has: ["version 1, expected 2 or 3", "v1"], offsetBytes: 4 }),
  },
  {
    name: "version 4",
    patch: (_b, dv) => dv.setUint32(4, 4, true),
    want: () => ({ code: "bad_version", has: ["version 4, expected 2 or 3", "re-export"], offsetBytes: 4 }),
  },
  {
    name: "big-endian file",
    patch: (_b, dv) => dv.setUint32(4, 3, false),
    want: () => ({ code: "bad_version", has: ["big-endian", "version 3 byte-swapped", "little-endian"] }),
  },
  {
    name: "truncated fixed header",
    patch: (b) => b.slice(0, 20),
    want: () => ({ code: "truncated", has: ["24-byte GGUF header", "file ends at byte 20"], offsetBytes: 0 }),
  },
  {
    name: "truncated inside a key length",
    patch: (b, _dv, l) => b.slice(0, l.key("test.arr").lenAt + 3),
    want: (l) => ({
      code: "truncated",
      has: [
        "expected 8 bytes for length of key of metadata pair #3",
        `file ends at byte ${l.key("test.arr").lenAt + 3}`,
      ],
      offsetBytes: l.key("test.arr").lenAt,
    }),
  },
  {
    name: "truncated inside a string value",
    patch: (b, _dv, l) => b.slice(0, l.key("test.str").valueAt + 8 + 2),
    want: (l) => ({
      code: "truncated",
      has: ["length of value of key test.str is 5", "only 2 bytes are left", "truncated"],
      offsetBytes: l.key("test.str").valueAt,
    }),
  },
  {
    name: "truncated inside tensor infos",
    patch: (b, _dv, l) => b.slice(0, l.tensor("tensor.b").neAt(1) + 4),
    want: (l) => ({
      code: "truncated",
      has: ["expected 8 bytes for ne[1] of tensor tensor.b"],
      offsetBytes: l.tensor("tensor.b").neAt(1),
    }),
  },
  {
    name: "truncated tensor data",
    patch: (b) => b.slice(0, b.length - 50),
    want: (l, size) => ({
      code: "truncated",
      has: ["tensor tensor.b", "Q8_0", "needs 136 bytes", `file ends at byte ${size - 50}`, "truncated"],
      offsetBytes: l.tensor("tensor.b").at,
    }),
  },
  {
    name: "absurd tensor count",
    patch: (_b, dv) => u64(dv, 8, 1n << 40n),
    want: () => ({
      code: "bad_value",
      has: ["tensor count is 1099511627776", "bytes are left"],
      offsetBytes: 8,
    }),
  },
  {
    name: "absurd metadata pair count",
    patch: (_b, dv) => u64(dv, 16, 1n << 50n),
    want: () => ({ code: "bad_value", has: ["metadata pair count is 1125899906842624"], offsetBytes: 16 }),
  },
  {
    name: "count beyond 2^53",
    patch: (_b, dv) => u64(dv, 16, (1n << 64n) - 1n),
    want: () => ({
      code: "bad_value",
      has: ["18446744073709551615", "larger than any file"],
      offsetBytes: 16,
    }),
  },
  {
    name: "absurd key length",
    patch: (_b, dv, l) => u64(dv, l.key("test.bool").lenAt, 1n << 40n),
    want: (l) => ({
      code: "bad_value",
      has: ["length of key of metadata pair #1 is 1099511627776"],
      offsetBytes: l.key("test.bool").lenAt,
    }),
  },
  {
    name: "string length past the end of the file",
    patch: (b, dv, l) => u64(dv, l.key("test.str").valueAt, BigInt(b.length - l.key("test.str").valueAt)),
    want: (l) => ({
      code: "truncated",
      has: ["length of value of key test.str"],
      offsetBytes: l.key("test.str").valueAt,
    }),
  },
  {
    name: "absurd numeric array count",
    patch: (_b, dv, l) => u64(dv, l.key("test.arr").valueAt + 4, 1n << 40n),
    want: (l) => ({
      code: "bad_value",
      has: ["element count of value of key test.arr (u32) is 1099511627776", "4398046511104 bytes"],
      offsetBytes: l.key("test.arr").valueAt + 4,
    }),
  },
  {
    name: "absurd string array count",
    patch: (_b, dv, l) => u64(dv, l.key("test.strs").valueAt + 4, 1n << 33n),
    want: (l) => ({
      code: "bad_value",
      has: ["element count of value of key test.strs (string) is 8589934592"],
      offsetBytes: l.key("test.strs").valueAt + 4,
    }),
  },
  {
    name: "invalid value type",
    patch: (_b, dv, l) => dv.setUint32(l.key("test.u32").typeAt, 13, true),
    want: (l) => ({
      code: "bad_value",
      has: ["key test.u32 has value type 13", "expected one of 0..12"],
      offsetBytes: l.key("test.u32").typeAt,
    }),
  },
  {
    name: "invalid array element type",
    patch: (_b, dv, l) => dv.setUint32(l.key("test.arr").valueAt, 77, true),
    want: (l) => ({
      code: "bad_value",
      has: ["test.arr is an array of value type 77"],
      offsetBytes: l.key("test.arr").valueAt,
    }),
  },
  {
    name: "bool byte not 0/1",
    patch: (b, _dv, l) => void (b[l.key("test.bool").valueAt] = 2),
    want: (l) => ({
      code: "bad_value",
      has: ["value of key test.bool is a bool byte 2, expected 0 or 1"],
      offsetBytes: l.key("test.bool").valueAt,
    }),
  },
  {
    name: "bool array element not 0/1",
    patch: (b, _dv, l) => void (b[l.key("test.bools").valueAt + 12 + 1] = 3),
    want: (l) => ({
      code: "bad_value",
      has: ["test.bools[1] is a bool byte 3"],
      offsetBytes: l.key("test.bools").valueAt + 13,
    }),
  },
  {
    name: "duplicate metadata key",
    patch: (b, _dv, l) => b.set(enc.encode("test.str"), l.key("test.arr").keyAt),
    want: (l) => ({
      code: "bad_value",
      has: ["key test.str appears twice"],
      offsetBytes: l.key("test.arr").lenAt,
    }),
  },
  {
    name: "n_dims 0",
    patch: (_b, dv, l) => dv.setUint32(l.tensor("tensor.a").nDimsAt, 0, true),
    want: (l) => ({
      code: "bad_tensor",
      has: ["tensor tensor.a (info #0): n_dims is 0, expected 1..4"],
      offsetBytes: l.tensor("tensor.a").nDimsAt,
    }),
  },
  {
    name: "n_dims 5",
    patch: (_b, dv, l) => dv.setUint32(l.tensor("tensor.b").nDimsAt, 5, true),
    want: () => ({ code: "bad_tensor", has: ["tensor tensor.b (info #1): n_dims is 5, expected 1..4"] }),
  },
  {
    name: "dimension 0",
    patch: (_b, dv, l) => u64(dv, l.tensor("tensor.a").neAt(1), 0n),
    want: (l) => ({
      code: "bad_tensor",
      has: ["tensor tensor.a", "ne[1] is 0"],
      offsetBytes: l.tensor("tensor.a").neAt(1),
    }),
  },
  {
    name: "absurd dimension",
    patch: (_b, dv, l) => u64(dv, l.tensor("tensor.a").neAt(1), 1n << 40n),
    want: () => ({ code: "bad_tensor", has: ["ne[1] is 1099511627776", "more elements than"] }),
  },
  {
    name: "ne0 not a multiple of the block size",
    patch: (_b, dv, l) => u64(dv, l.tensor("tensor.b").neAt(0), 48n),
    want: () => ({ code: "bad_tensor", has: ["ne[0] = 48 is not a multiple of the Q8_0 block size 32"] }),
  },
  {
    name: "retired tensor type id",
    patch: (_b, dv, l) => dv.setUint32(l.tensor("tensor.a").typeAt, 4, true),
    want: (l) => ({
      code: "bad_tensor",
      has: ["tensor tensor.a", "ggml type id 4 is unknown or retired"],
      offsetBytes: l.tensor("tensor.a").typeAt,
    }),
  },
  {
    name: "unknown tensor type id",
    patch: (_b, dv, l) => dv.setUint32(l.tensor("tensor.b").typeAt, 99, true),
    want: () => ({ code: "bad_tensor", has: ["ggml type id 99 is unknown or retired"] }),
  },
  {
    name: "tensor offset beyond the file",
    patch: (_b, dv, l) => u64(dv, l.tensor("tensor.b").offAt, 1n << 20n),
    want: (l) => ({
      code: "bad_tensor",
      has: ["tensor tensor.b has data offset 1048576", "beyond the end"],
      offsetBytes: l.tensor("tensor.b").at,
    }),
  },
  {
    name: "tensor size beyond the file",
    patch: (_b, dv, l) => u64(dv, l.tensor("tensor.b").neAt(1), 4n),
    want: () => ({ code: "truncated", has: ["tensor tensor.b", "ne=[64, 4]", "needs 272 bytes"] }),
  },
  {
    name: "misaligned tensor offset",
    patch: (_b, dv, l) => u64(dv, l.tensor("tensor.b").offAt, 72n),
    want: () => ({
      code: "bad_tensor",
      has: ["tensor tensor.b has data offset 72", "expected a multiple of the alignment 32"],
    }),
  },
  {
    name: "overlapping tensors",
    patch: (_b, dv, l) => u64(dv, l.tensor("tensor.b").offAt, 32n),
    want: (l) => ({
      code: "bad_tensor",
      has: ["tensor tensor.b has data offset 32, inside the data of tensor tensor.a (offset 0, 64 bytes)"],
      offsetBytes: l.tensor("tensor.b").at,
    }),
  },
  {
    name: "duplicate tensor names",
    patch: (b, _dv, l) => b.set(enc.encode("tensor.a"), l.tensor("tensor.b").at + 8),
    want: (l) => ({
      code: "bad_tensor",
      has: ["tensor tensor.a is listed twice", `first at byte ${l.tensor("tensor.a").at}`],
      offsetBytes: l.tensor("tensor.b").at,
    }),
  },
];

Deno.test("openGguf rejects each kind of corrupt or truncated file with a specific GgufError", async () => {
  const rng = new Rng();
  await withTempDir(async (dir) => {
    const base = `${dir}/base.gguf`;
    await writeGguf(base, { kv: BASE_KV, tensors: baseTensors(rng) });
    const g = await openGguf(base);
    assert.equal(g.tensor("tensor.b").offsetBytes, 64, "test setup: tensor.b offset");
    g.close();
    const bytes = await Deno.readFile(base);
    const layout = new Layout(bytes);
    const failed: string[] = [];
    for (const c of CASES) {
      const copy = bytes.slice();
      const out = c.patch(copy, new DataView(copy.buffer), layout) ?? copy;
      const path = `${dir}/${c.name.replaceAll(/[^a-z0-9]+/gi, "_")}.gguf`;
      await Deno.writeFile(path, out);
      await expectError(path, c.want(layout, bytes.length), `${c.name} (seed ${rng.seed})`).catch((e) =>
        failed.push((e as Error).message)
      );
    }
    assert.deepEqual(failed, [], `${failed.length} of ${CASES.length} cases failed:\n${failed.join("\n")}`);
  });
});

Deno.test("openGguf rejects a bad general.alignment", async () => {
  const rng = new Rng();
  await withTempDir(async (dir) => {
    const base = `${dir}/a64.gguf`;
    await writeGguf(base, { kv: BASE_KV, tensors: baseTensors(rng), alignment: 64 });
    const g = await openGguf(base);
    assert.equal(g.parts[0]!.alignment, 64);
    assert.equal(g.parts[0]!.dataStartBytes % 64, 0);
    g.close();
    const bytes = await Deno.readFile(base);
    const at = new Layout(bytes).key(KEYS.alignment);
    for (const [v, shown] of [[12, "u32 12"], [0, "u32 0"], [4, "u32 4"]] as const) {
      const copy = bytes.slice();
      new DataView(copy.buffer).setUint32(at.valueAt, v, true);
      const path = `${dir}/align${v}.gguf`;
      await Deno.writeFile(path, copy);
      await expectError(path, {
        code: "bad_value",
        has: [`${KEYS.alignment} is ${shown}, expected a positive multiple of 8`],
      }, `alignment ${v}`);
    }
    // A non-integer alignment type is rejected the same way.
    const copy = bytes.slice();
    new DataView(copy.buffer).setUint32(at.typeAt, T.FLOAT32, true);
    await Deno.writeFile(`${dir}/alignf.gguf`, copy);
    await expectError(
      `${dir}/alignf.gguf`,
      { code: "bad_value", has: [`${KEYS.alignment} is f32`] },
      "f32 alignment",
    );
  });
});

Deno.test("openGguf accepts version 2 and an unsplit file named as one part of one", async () => {
  const rng = new Rng();
  await withTempDir(async (dir) => {
    const tensors = baseTensors(rng);
    const path = `${dir}/v2.gguf`;
    await writeGguf(path, { kv: BASE_KV, tensors });
    const bytes = await Deno.readFile(path);
    new DataView(bytes.buffer).setUint32(4, 2, true);
    await Deno.writeFile(path, bytes);
    const g = await openGguf(path);
    assert.equal(g.parts[0]!.version, 2);
    assert.deepEqual(await g.readTensor("tensor.b"), tensors[1]!.data);
    g.close();
    const one = splitPartPath(`${dir}/single`, 1, 1);
    await Deno.writeFile(one, bytes);
    const h = await openGguf(one);
    assert.equal(h.parts.length, 1);
    h.close();
  });
});

Deno.test("openGguf bounds arrays by the header cap without allocating them", async () => {
  await withTempDir(async (dir) => {
    // A sparse file larger than the cap whose one u8 array claims nearly all of it.
    const path = `${dir}/huge.gguf`;
    const count = MAX_HEADER_BYTES + 1024;
    await writeGguf(path, { kv: [["test.big", kv.arr(T.UINT8, [1])]], tensors: [] });
    const bytes = await Deno.readFile(path);
    const at = new Layout(bytes).key("test.big").valueAt + 4;
    new DataView(bytes.buffer).setBigUint64(at, BigInt(count), true);
    await Deno.writeFile(path, bytes);
    await Deno.truncate(path, MAX_HEADER_BYTES + 4096);
    await expectError(path, {
      code: "bad_value",
      has: [`larger than ${MAX_HEADER_BYTES} bytes`, "test.big"],
    }, "array past the header cap");
  });
});

Deno.test("openGguf rejects arrays nested deeper than 8 levels", async () => {
  await withTempDir(async (dir) => {
    let v = kv.arr(T.UINT8, [1]);
    for (let i = 0; i < 9; i++) v = kv.arr(T.ARRAY, [v]);
    const path = `${dir}/deep.gguf`;
    await writeGguf(path, { kv: [["test.deep", v]], tensors: [] });
    await expectError(
      path,
      { code: "bad_value", has: ["nests arrays deeper than 8 levels"] },
      "deep nesting",
    );
  });
});

Deno.test("openGguf turns every truncation and random header corruption into a GgufError", async () => {
  const rng = new Rng();
  await withTempDir(async (dir) => {
    const base = `${dir}/base.gguf`;
    await writeGguf(base, { kv: BASE_KV, tensors: baseTensors(rng) });
    const bytes = await Deno.readFile(base);
    const g = await openGguf(base);
    const dataStart = g.parts[0]!.dataStartBytes;
    const b = g.tensor("tensor.b");
    const dataEnd = b.absOffsetBytes + b.nbytes;
    g.close();
    const path = `${dir}/cut.gguf`;
    // Cutting only the trailing padding leaves a valid file; any earlier cut must fail.
    for (let cut = 0; cut < dataEnd; cut += cut < dataStart ? 1 : 7) {
      await Deno.writeFile(path, bytes.subarray(0, cut));
      const e = await openGguf(path).then((f) => (f.close(), undefined), (e) => e);
      assert.ok(e instanceof GgufError, `cut at ${cut}: expected a GgufError, got ${e}`);
      const codes: GgufErrorCode[] = cut < 8 ? ["truncated"] : ["truncated", "bad_value"];
      assert.ok(codes.includes(e.code), `cut at ${cut}: ${e.code}: ${e.message}`);
      assert.ok(e.message.includes(path), e.message);
    }
    // Random byte flips in the header must either parse or fail with a GgufError, never crash or hang.
    let failures = 0;
    for (let i = 0; i < 300; i++) {
      const copy = bytes.slice();
      for (let k = rng.int(1, 4); k > 0; k--) copy[rng.int(0, dataStart)] = rng.int(0, 256);
      await Deno.writeFile(path, copy);
      const e = await openGguf(path).then((f) => (f.close(), undefined), (e) => e);
      if (e !== undefined) {
        assert.ok(
          e instanceof GgufError,
          `flip ${i}, seed ${rng.seed}: expected a GgufError, got ${e?.stack}`,
        );
        failures++;
      }
    }
    assert.ok(failures > 0, `seed ${rng.seed}: some flips must be caught`);
  });
});

Deno.test("openGguf reports a missing file as io", async () => {
  await withTempDir(async (dir) => {
    await expectError(`${dir}/nope.gguf`, { code: "io", has: ["does not exist"] }, "missing file");
  });
});

// --- split sets -----------------------------------------------------------------------------------------

function splitTensors(rng: Rng, n: number, prefix = "t"): GgufWriteTensor[] {
  return Array.from(
    { length: n },
    (_, i) => ({ name: `${prefix}${i}`, type: "F32", ne: [8], data: rng.bytes(32) }),
  );
}

async function patchU16(path: string, key: string, v: number): Promise<void> {
  const bytes = await Deno.readFile(path);
  new DataView(bytes.buffer).setUint16(new Layout(bytes).key(key).valueAt, v, true);
  await Deno.writeFile(path, bytes);
}

Deno.test("openGguf rejects missing, mismatched and misnamed split parts", async () => {
  const rng = new Rng();
  await withTempDir(async (dir) => {
    const kvs: Array<readonly [string, GgufKv]> = [["test.name", kv.str("m")]];
    const fresh = async (name: string, n = 6) =>
      await writeGgufSplit(`${dir}/${name}`, { kv: kvs, tensors: splitTensors(rng, n) }, 3);

    const ok = await fresh("ok");
    for (const p of ok) (await openGguf(p)).close();

    const missing = await fresh("missing");
    await Deno.remove(missing[1]!);
    for (const p of [missing[0]!, missing[2]!]) {
      await expectError(p, {
        code: "bad_split",
        path: missing[1]!,
        has: ["split part 2 of 3 is missing", `opened via ${p}`, "download all 3 parts"],
      }, `missing part via ${p}`);
    }

    const badNo = await fresh("badno");
    await patchU16(badNo[1]!, KEYS.splitNo, 0);
    await expectError(badNo[2]!, {
      code: "bad_split",
      path: badNo[1]!,
      has: [`${KEYS.splitNo} = 0`, "part 2 of 3", `expected ${KEYS.splitNo} = 1`],
    }, "wrong split.no");

    const badCount = await fresh("badcount");
    await patchU16(badCount[2]!, KEYS.splitCount, 4);
    await expectError(badCount[0]!, {
      code: "bad_split",
      path: badCount[2]!,
      has: [`${KEYS.splitCount} = 4`, "its name says part 3 of 3", `expected ${KEYS.splitCount} = 3`],
    }, "wrong split.count");

    const badTotal = await fresh("badtotal");
    const b0 = await Deno.readFile(badTotal[0]!);
    new DataView(b0.buffer).setInt32(new Layout(b0).key(KEYS.splitTensorsCount).valueAt, 5, true);
    await Deno.writeFile(badTotal[0]!, b0);
    await expectError(badTotal[1]!, {
      code: "bad_split",
      path: badTotal[0]!,
      has: [`${KEYS.splitTensorsCount} = 5`, "list 6 tensors"],
    }, "wrong split.tensors.count");

    // A part copied in from another split of the same model name but different content.
    const mixed = await fresh("mixed");
    const other = await writeGgufSplit(`${dir}/other`, { kv: kvs, tensors: splitTensors(rng, 7, "u") }, 3);
    await Deno.copyFile(other[1]!, mixed[1]!);
    await expectError(mixed[0]!, {
      code: "bad_split",
      has: [`${KEYS.splitTensorsCount} = 6`, "7 tensors"],
    }, "part from another split");

    const dup = await fresh("dup");
    const d1 = await Deno.readFile(dup[1]!);
    const l1 = new Layout(d1);
    const dupName = [...Array(6).keys()].map((i) => `t${i}`).find((n) => indexOf(d1, encodedString(n)) >= 0)!;
    d1.set(enc.encode("t0"), l1.tensor(dupName).at + 8);
    await Deno.writeFile(dup[1]!, d1);
    await expectError(dup[0]!, {
      code: "bad_tensor",
      path: dup[1]!,
      has: ["tensor t0 is also in part 1", dup[0]!, "exactly one part"],
    }, "tensor in two parts");

    const renamed = `${dir}/renamed.gguf`;
    await Deno.copyFile(ok[0]!, renamed);
    await expectError(renamed, {
      code: "bad_split",
      has: [`${KEYS.splitCount} = 3`, "-0000N-of-00003.gguf"],
    }, "non-conforming name");

    const beyond = splitPartPath(`${dir}/ok`, 3, 3).replace("00003-of", "00004-of");
    await Deno.copyFile(ok[2]!, beyond);
    await expectError(beyond, { code: "bad_split", has: ["part 4 of 3"] }, "part number beyond count");

    // An unsplit file whose split.no says it is not the first part.
    const lone = `${dir}/lone.gguf`;
    await writeGguf(lone, { kv: [[KEYS.splitNo, kv.u16(1)], [KEYS.splitCount, kv.u16(1)]], tensors: [] });
    await expectError(lone, {
      code: "bad_split",
      has: [`${KEYS.splitNo} = 1`, "opened as an unsplit file", `expected ${KEYS.splitNo} = 0`],
    }, "unsplit file with split.no = 1");
    const lone0 = `${dir}/lone0.gguf`;
    await writeGguf(lone0, { kv: [[KEYS.splitNo, kv.u16(0)], [KEYS.splitCount, kv.u16(1)]], tensors: [] });
    (await openGguf(lone0)).close();

    // Plain files named as split parts but without split keys.
    const plain = [1, 2].map((i) => splitPartPath(`${dir}/plain`, i, 2));
    for (const p of plain) await writeGguf(p, { kv: kvs, tensors: [] });
    await expectError(plain[1]!, {
      code: "bad_split",
      path: plain[0]!,
      has: [`${KEYS.splitCount} = (missing)`, `expected ${KEYS.splitCount} = 2`],
    }, "split name without split keys");
  });
});
