import assert from "node:assert/strict";
import {
  GGUF_VALUE_TYPE as T,
  type GgufFile,
  type GgufKv,
  GgufMetadata,
  openGguf,
  parseSplitPath,
} from "./gguf.ts";
import { GgufError } from "./errors.ts";
import { type GgufWriteSpec, type GgufWriteTensor, kv, writeGguf, writeGgufSplit } from "./gguf_write.ts";
import { KEYS } from "./names.ts";
import { GGML_TYPES, TYPE_ID } from "./quant/types.ts";
import { Rng } from "../tests/util/rng.ts";

/** A random string of 0..12 code points mixing ASCII, 2-, 3- and 4-byte UTF-8. */
function randomString(rng: Rng): string {
  const pools = [[0x20, 0x7f], [0x80, 0x800], [0x800, 0xd800], [0x10000, 0x10ffff]] as const;
  let s = "";
  const n = rng.int(0, 13);
  for (let i = 0; i < n; i++) {
    const [lo, hi] = pools[rng.int(0, 4)]!;
    s += String.fromCodePoint(rng.int(lo, hi));
  }
  return s;
}

function allValueKvs(rng: Rng): Array<readonly [string, GgufKv]> {
  const tokens = Array.from({ length: 200_000 }, () => randomString(rng));
  tokens[7] = "\uFEFF";
  const inner = (n: number) => kv.arr(T.INT16, Array.from({ length: n }, () => rng.int(-0x8000, 0x8000)));
  return [
    ["test.u8", kv.u8(255)],
    ["test.i8", kv.i8(-128)],
    ["test.u16", kv.u16(65535)],
    ["test.i16", kv.i16(-32768)],
    ["test.u32", kv.u32(0xffff_ffff)],
    ["test.i32", kv.i32(-0x8000_0000)],
    ["test.f32", kv.f32(1e-6)],
    ["test.bool_t", kv.bool(true)],
    ["test.bool_f", kv.bool(false)],
    ["test.str", kv.str("héllo wörld ✓ 𝄞")],
    ["test.str_empty", kv.str("")],
    ["test.str_bom", kv.str("\uFEFFstarts with U+FEFF")],
    ["test.u64_small", kv.u64(12345)],
    ["test.u64_big", kv.u64((1n << 64n) - 1n)],
    ["test.i64_small", kv.i64(-12345)],
    ["test.i64_big", kv.i64(-(1n << 63n))],
    ["test.f64", kv.f64(Math.PI)],
    ["test.arr_u8", kv.arr(T.UINT8, [0, 1, 255])],
    ["test.arr_i8", kv.arr(T.INT8, [-128, 0, 127])],
    ["test.arr_u16", kv.arr(T.UINT16, [0, 65535])],
    ["test.arr_i16", kv.arr(T.INT16, [-32768, 32767])],
    ["test.arr_u32", kv.arr(T.UINT32, new Uint32Array([1, 2, 0xffff_ffff]))],
    ["test.arr_i32", kv.arr(T.INT32, Array.from({ length: 1000 }, () => rng.int(-1e9, 1e9)))],
    ["test.arr_f32", kv.arr(T.FLOAT32, rng.normals(777))],
    ["test.arr_f64", kv.arr(T.FLOAT64, [Math.E, -0, 1e300])],
    ["test.arr_u64", kv.arr(T.UINT64, [0n, (1n << 64n) - 1n, 5n])],
    ["test.arr_i64", kv.arr(T.INT64, [-(1n << 63n), 7n])],
    ["test.arr_bool", kv.arr(T.BOOL, [true, false, true])],
    ["test.arr_empty", kv.arr(T.UINT32, [])],
    ["test.arr_str", kv.arr(T.STRING, tokens)],
    ["test.arr_nested", kv.arr(T.ARRAY, [inner(3), inner(0), kv.arr(T.STRING, ["x", "yz"])])],
    ["test.arr_nested2", kv.arr(T.ARRAY, [kv.arr(T.ARRAY, [inner(2)])])],
  ];
}

interface TensorCase extends GgufWriteTensor {
  readonly bytes: Uint8Array;
}

/** Tensors of several types and 1..4 dims; odd ones are written through a producer with random chunking. */
function tensorCases(rng: Rng): TensorCase[] {
  const shapes: Array<[string, string | number, number[]]> = [
    ["token_embd.weight", "Q8_0", [64, 3]],
    ["f32.vec", "F32", [5]],
    ["f16.mat", "F16", [3, 7]],
    ["q4k.3d", "Q4_K", [256, 2, 2]],
    ["iq4xs.4d", "IQ4_XS", [256, 1, 1, 3]],
    ["bf16.one", "BF16", [1, 1]],
    ["q6k.mat", TYPE_ID.Q6_K, [512, 3]],
    ["i32.unsupported", 26, [9]],
  ];
  return shapes.map(([name, type, ne], i) => {
    const info = GGML_TYPES.get(typeof type === "number" ? type : TYPE_ID[type as keyof typeof TYPE_ID])!;
    const nbytes = ne.reduce((a, b) => a * b, 1) / info.blockElems * info.blockBytes;
    const bytes = rng.bytes(nbytes);
    const data = i % 2 === 0 ? bytes : async (sink: (c: Uint8Array) => Promise<void>) => {
      let off = 0;
      while (off < bytes.length) {
        const n = Math.min(bytes.length - off, rng.int(1, 200));
        // A reused scratch buffer: the writer must copy before the sink resolves.
        const scratch = new Uint8Array(n);
        scratch.set(bytes.subarray(off, off + n));
        await sink(scratch);
        scratch.fill(0xee);
        off += n;
      }
    };
    return { name, type: type as GgufWriteTensor["type"], ne, data, bytes };
  });
}

async function withTempDir(fn: (dir: string) => Promise<void>): Promise<void> {
  const dir = await Deno.makeTempDir({ prefix: "gguf_write_test_" });
  try {
    await fn(dir);
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
}

/** Asserts that `g` holds exactly the spec's metadata (plus `extraKeys`) and tensors, byte for byte. */
async function assertMatches(
  g: GgufFile,
  kvs: ReadonlyArray<readonly [string, GgufKv]>,
  tensors: readonly TensorCase[],
  rng: Rng,
  extraKeys: readonly string[],
): Promise<void> {
  const seed = `seed ${rng.seed}`;
  assert.deepEqual(
    [...g.metadata.entries.keys()].filter((k) => !extraKeys.includes(k)),
    kvs.map(([k]) => k),
    seed,
  );
  for (const [k, v] of kvs) assert.deepEqual(g.metadata.entries.get(k), v, `${k}, ${seed}`);
  assert.equal(g.tensors.size, tensors.length);
  for (const t of tensors) {
    const info = g.tensor(t.name);
    const part = g.parts[info.part]!;
    assert.deepEqual(info.ne, t.ne);
    assert.equal(info.nbytes, t.bytes.length);
    assert.equal(info.offsetBytes % part.alignment, 0);
    assert.equal(info.absOffsetBytes, part.dataStartBytes + info.offsetBytes);
    assert.deepEqual(await g.readTensor(t.name), t.bytes, `${t.name}, ${seed}`);
    for (let r = 0; r < 3; r++) {
      const off = rng.int(0, t.bytes.length);
      const size = rng.int(0, t.bytes.length - off + 1);
      const sub = await g.readTensor(t.name, { offsetBytes: off, sizeBytes: size });
      assert.deepEqual(sub, t.bytes.subarray(off, off + size), `${t.name} [${off}, +${size}), ${seed}`);
      const into = new Uint8Array(size);
      await g.readTensorInto(t.name, into, off);
      assert.deepEqual(into, t.bytes.subarray(off, off + size), `${t.name} into [${off}, +${size}), ${seed}`);
    }
  }
}

Deno.test("writeGguf round-trips every value type, a 200k string array and tensors of several types", async () => {
  const rng = new Rng();
  const kvs = allValueKvs(rng);
  const tensors = tensorCases(rng);
  await withTempDir(async (dir) => {
    for (const alignment of [undefined, 64, 8]) {
      const path = `${dir}/m${alignment ?? ""}.gguf`;
      const { sizeBytes } = await writeGguf(path, { kv: kvs, tensors, alignment });
      assert.equal(sizeBytes, (await Deno.stat(path)).size);
      const a = alignment ?? 32;
      assert.equal(sizeBytes % a, 0, "the file ends padded to the alignment");
      const extra = alignment === undefined ? [] : [KEYS.alignment];
      for (const initialReadBytes of [undefined, 24, 1000]) {
        const g = await openGguf(path, { initialReadBytes });
        try {
          assert.equal(g.parts.length, 1);
          assert.equal(g.parts[0]!.version, 3);
          assert.equal(g.parts[0]!.alignment, a);
          assert.equal(g.metadata.has(KEYS.alignment), alignment !== undefined);
          if (alignment !== undefined) assert.equal(g.metadata.getInt(KEYS.alignment), alignment);
          await assertMatches(g, kvs, tensors, rng, extra);
        } finally {
          g.close();
        }
      }
    }
  });
});

Deno.test("writeGgufSplit writes 1..3 parts that reopen from any part", async () => {
  const rng = new Rng();
  const kvs: Array<readonly [string, GgufKv]> = [
    ["test.name", kv.str("split model")],
    ["test.tokens", kv.arr(T.STRING, Array.from({ length: 5000 }, () => randomString(rng)))],
  ];
  const tensors = tensorCases(rng);
  await withTempDir(async (dir) => {
    for (const parts of [1, 2, 3]) {
      for (const alignment of [32, 64]) {
        const prefix = `${dir}/model-a${alignment}`;
        const paths = await writeGgufSplit(prefix, { kv: kvs, tensors, alignment }, parts);
        assert.equal(paths.length, parts);
        paths.forEach((p, i) => assert.deepEqual(parseSplitPath(p), { prefix, no: i + 1, count: parts }));
        for (const p of paths) {
          const g = await openGguf(p);
          try {
            assert.equal(g.path, paths[0]);
            assert.deepEqual(g.parts.map((x) => x.path), paths);
            for (const part of g.parts) {
              assert.ok(part.tensorCount >= 1, `every part holds a tensor, seed ${rng.seed}`);
              assert.equal(part.alignment, alignment);
            }
            assert.equal(g.metadata.getInt(KEYS.splitNo), 0);
            assert.equal(g.metadata.getInt(KEYS.splitCount), parts);
            assert.equal(g.metadata.getInt(KEYS.splitTensorsCount), tensors.length);
            const extra = [KEYS.splitNo, KEYS.splitCount, KEYS.splitTensorsCount, KEYS.alignment];
            await assertMatches(g, kvs, tensors, rng, extra);
            // Tensors keep file order across parts.
            const order = [...g.tensors.values()].map((t) => t.part);
            assert.deepEqual(order, [...order].sort((a, b) => a - b));
          } finally {
            g.close();
          }
        }
        // Parts 2.. carry only split keys (and the alignment when it is not the default).
        for (const p of paths.slice(1)) {
          const keys = await rawKeys(p);
          const want: string[] = [KEYS.splitNo, KEYS.splitCount, KEYS.splitTensorsCount];
          if (alignment !== 32) want.unshift(KEYS.alignment);
          assert.deepEqual(keys, want);
        }
      }
    }
  });
});

/** Reads the metadata keys of a file without split validation by parsing only the KV section. */
async function rawKeys(path: string): Promise<string[]> {
  const bytes = await Deno.readFile(path);
  const dv = new DataView(bytes.buffer);
  const nKv = Number(dv.getBigUint64(16, true));
  const keys: string[] = [];
  let pos = 24;
  const dec = new TextDecoder();
  for (let i = 0; i < nKv; i++) {
    const len = Number(dv.getBigUint64(pos, true));
    keys.push(dec.decode(bytes.subarray(pos + 8, pos + 8 + len)));
    pos += 8 + len;
    const type = dv.getUint32(pos, true);
    pos += 4;
    // Split keys and alignment are u16/i32/u32 scalars.
    pos += type === T.UINT16 ? 2 : 4;
  }
  return keys;
}

Deno.test("writeGguf rejects producers that deliver the wrong byte count and leaves no file", async () => {
  await withTempDir(async (dir) => {
    const path = `${dir}/bad.gguf`;
    const spec = (deliver: number[]): GgufWriteSpec => ({
      kv: [],
      tensors: [{
        name: "t",
        type: "F32",
        ne: [4],
        data: async (sink) => {
          for (const n of deliver) await sink(new Uint8Array(n));
        },
      }],
    });
    await assert.rejects(writeGguf(path, spec([8, 4])), /delivered 12 bytes, expected 16/);
    await assert.rejects(Deno.stat(path), Deno.errors.NotFound);
    await assert.rejects(writeGguf(path, spec([8, 9])), /delivered more than the tensor's 16 bytes/);
    await assert.rejects(Deno.stat(path), Deno.errors.NotFound);
    await writeGguf(path, spec([16]));
    const g = await openGguf(path);
    assert.deepEqual(await g.readTensor("t"), new Uint8Array(16));
    g.close();
  });
});

Deno.test("writeGguf validates the spec before writing", async () => {
  await withTempDir(async (dir) => {
    const path = `${dir}/bad.gguf`;
    const t = (over: Partial<GgufWriteTensor>): GgufWriteTensor => ({
      name: "t",
      type: "Q8_0",
      ne: [32],
      data: new Uint8Array(34),
      ...over,
    });
    const cases: Array<[GgufWriteSpec, RegExp]> = [
      [{ kv: [], tensors: [t({ ne: [48] })] }, /ne\[0\] = 48 is not a multiple of the Q8_0 block size 32/],
      [{ kv: [], tensors: [t({}), t({})] }, /Tensor name t is given twice/],
      [{ kv: [], tensors: [t({ ne: [] })] }, /expected 1\.\.4/],
      [{ kv: [], tensors: [t({ ne: [32, 1, 1, 1, 1] })] }, /expected 1\.\.4/],
      [{ kv: [], tensors: [t({ ne: [32, 0] })] }, /expected positive integers/],
      [{ kv: [], tensors: [t({ type: 4 })] }, /ggml type 4 is unknown or retired/],
      [{ kv: [], tensors: [t({ data: new Uint8Array(33) })] }, /data has 33 bytes, expected 34/],
      [{ kv: [["a", kv.u8(1)], ["a", kv.u8(2)]], tensors: [] }, /Metadata key a is given twice/],
      [{ kv: [["a", { type: T.UINT8, value: 256 }]], tensors: [] }, /expected a u8 integer in 0\.\.255/],
      [{ kv: [], tensors: [], alignment: 12 }, /Alignment 12 is not a positive multiple of 8/],
      [{ kv: [[KEYS.alignment, kv.u32(64)]], tensors: [], alignment: 32 }, /disagrees/],
      [{ kv: [[KEYS.alignment, kv.str("64")]], tensors: [] }, /must be an integer \(u32\), got string/],
    ];
    for (const [spec, re] of cases) {
      await assert.rejects(writeGguf(path, spec), re);
      await assert.rejects(Deno.stat(path), Deno.errors.NotFound);
    }
    assert.throws(() => kv.i8(128), RangeError);
    assert.throws(() => kv.u64(-1), RangeError);
    assert.throws(() => kv.u64(1n << 64n), RangeError);
    assert.throws(() => kv.u32(1.5), RangeError);
    assert.throws(() => kv.arr(T.UINT16, [70000]), /kv\.arr\[0\]: expected a u16 integer/);
    assert.throws(() => kv.arr(T.STRING, [1 as unknown as string]), RangeError);
    await assert.rejects(
      writeGgufSplit(`${dir}/s`, { kv: [[KEYS.splitCount, kv.u16(2)]], tensors: [] }, 2),
      /is set by writeGgufSplit/,
    );
  });
});

Deno.test("GgufMetadata getters accept any integer width, scalars for arrays, and name the key on errors", () => {
  const md = new GgufMetadata(
    new Map<string, GgufKv>([
      ["k.u16", kv.u16(7)],
      ["k.i64", kv.i64(-5)],
      ["k.u64big", kv.u64(1n << 60n)],
      ["k.f32", kv.f32(0.5)],
      ["k.str", kv.str("s")],
      ["k.bool", kv.bool(true)],
      ["k.ints", kv.arr(T.INT32, [1, -2])],
      ["k.u64s", kv.arr(T.UINT64, [3n])],
      ["k.bools", kv.arr(T.BOOL, [true, false])],
      ["k.strs", kv.arr(T.STRING, ["a"])],
      ["k.floats", kv.arr(T.FLOAT32, [0.25])],
    ]),
    "/m.gguf",
  );
  assert.equal(md.getInt("k.u16"), 7);
  assert.equal(md.getInt("k.i64"), -5);
  assert.equal(md.getInt("k.missing", 3), 3);
  assert.equal(md.getFloat("k.f32"), 0.5);
  assert.equal(md.getFloat("k.u16"), 7);
  assert.equal(md.getFloat("k.missing", 1.5), 1.5);
  assert.equal(md.getString("k.str"), "s");
  assert.equal(md.getString("k.missing", "d"), "d");
  assert.equal(md.getBool("k.bool"), true);
  assert.equal(md.getBool("k.missing", false), false);
  assert.deepEqual(md.getIntArray("k.ints"), [1, -2]);
  assert.deepEqual(md.getIntArray("k.u64s"), [3]);
  assert.deepEqual(md.getIntArray("k.u16"), [7]);
  assert.deepEqual(md.getFloatArray("k.floats"), [0.25]);
  assert.deepEqual(md.getFloatArray("k.f32"), [0.5]);
  assert.deepEqual(md.getBoolArray("k.bools"), [true, false]);
  assert.deepEqual(md.getBoolArray("k.bool"), [true]);
  assert.deepEqual(md.getStringArray("k.strs"), ["a"]);
  assert.equal(md.getArray("k.ints").elemType, T.INT32);
  const bad = (fn: () => unknown, re: RegExp) =>
    assert.throws(fn, (e: unknown) => e instanceof GgufError && e.code === "bad_value" && re.test(e.message));
  bad(
    () => md.getInt("k.missing"),
    /Metadata key k\.missing in \/m\.gguf: expected an integer .* it is missing/,
  );
  bad(() => md.getInt("k.str", 1), /k\.str .*expected an integer .* it is string "s"/);
  bad(() => md.getInt("k.u64big"), /k\.u64big .*safe integer .* it is u64 1152921504606846976/);
  bad(() => md.getInt("k.f32"), /k\.f32/);
  bad(() => md.getString("k.u16"), /k\.u16 .*expected a string/);
  bad(() => md.getBool("k.u16"), /expected a bool/);
  bad(() => md.getIntArray("k.strs"), /expected an integer array .* it is array of string/);
  bad(() => md.getStringArray("k.ints"), /expected a string array/);
  bad(() => md.getArray("k.u16"), /expected an array/);
  bad(() => md.getFloat("k.str"), /expected a number/);
});

Deno.test("GgufFile reads concurrently and rejects ranges outside a tensor and reads after close", async () => {
  const rng = new Rng();
  const tensors = tensorCases(rng);
  await withTempDir(async (dir) => {
    const path = `${dir}/c.gguf`;
    await writeGguf(path, { kv: [], tensors });
    const g = await openGguf(path);
    // Many overlapping reads on one handle: seek + read pairs must not interleave.
    const reads = Array.from({ length: 64 }, (_, i) => tensors[i % tensors.length]!);
    const got = await Promise.all(reads.map((t) => g.readTensor(t.name)));
    got.forEach((b, i) => assert.deepEqual(b, reads[i]!.bytes, `read ${i}, seed ${rng.seed}`));
    const t0 = tensors[0]!;
    await assert.rejects(g.readTensor(t0.name, { offsetBytes: t0.bytes.length, sizeBytes: 1 }), RangeError);
    await assert.rejects(g.readTensor(t0.name, { offsetBytes: -1 }), RangeError);
    await assert.rejects(g.readTensorInto(t0.name, new Uint8Array(t0.bytes.length + 1), 0), RangeError);
    assert.throws(
      () => g.tensor("nope.weight"),
      (e: unknown) =>
        e instanceof GgufError && e.code === "bad_tensor" && e.message.includes("nope.weight") &&
        e.message.includes(path),
    );
    g.close();
    await assert.rejects(
      g.readTensor(t0.name),
      (e: unknown) => e instanceof GgufError && e.code === "io" && /closed/.test(e.message),
    );
  });
});

Deno.test("writeGgufSplit distributes tensors by bytes and allows more parts than tensors", async () => {
  const rng = new Rng();
  const f32 = (name: string, n: number): GgufWriteTensor => ({
    name,
    type: "F32",
    ne: [n],
    data: rng.bytes(4 * n),
  });
  await withTempDir(async (dir) => {
    const big = await writeGgufSplit(`${dir}/big`, {
      kv: [],
      tensors: [f32("big", 1000), f32("s1", 10), f32("s2", 10), f32("s3", 10)],
    }, 2);
    const g = await openGguf(big[1]!);
    assert.deepEqual([...g.tensors.values()].map((t) => t.part), [0, 1, 1, 1]);
    g.close();
    const few = await writeGgufSplit(
      `${dir}/few`,
      { kv: [["test.k", kv.u8(1)]], tensors: [f32("only", 8)] },
      3,
    );
    const h = await openGguf(few[2]!);
    assert.deepEqual(h.parts.map((p) => p.tensorCount), [1, 0, 0]);
    assert.equal(h.metadata.getInt("test.k"), 1);
    h.close();
  });
});
