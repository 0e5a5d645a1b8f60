import assert from "node:assert/strict";
import { createHash } from "node:crypto";
import {
  fingerprintCachePath,
  fingerprintFile,
  fingerprintGguf,
  FingerprintHasher,
  fingerprintStats,
  modelFingerprint,
  readCachedFingerprint,
} from "./fingerprint.ts";
import { GGUF_VALUE_TYPE as T, openGguf } from "./gguf.ts";
import { type GgufWriteSpec, kv, writeGguf, writeGgufSplit } from "./gguf_write.ts";

/** A small model-like file: every value type in the metadata, tensors of several sizes (one empty row set). */
function spec(over: { title?: string; flip?: number } = {}): GgufWriteSpec {
  const data = (n: number, seed: number) => new Uint8Array(n).map((_, i) => (i * 31 + seed * 7) & 0xff);
  const big = data(3 * 4 * 1000, 3);
  if (over.flip !== undefined) big[over.flip]! ^= 1;
  return {
    kv: [
      ["test.title", kv.str(over.title ?? "fingerprint fixture")],
      ["test.u8", kv.u8(7)],
      ["test.i64", kv.i64(-(2n ** 40n))],
      ["test.f32", kv.f32(0.1)],
      ["test.f64", kv.f64(1 / 3)],
      ["test.flag", kv.bool(true)],
      ["test.ints", kv.arr(T.INT32, [1, -2, 3])],
      ["test.words", kv.arr(T.STRING, ["a", "bé", ""])],
    ],
    tensors: [
      { name: "a.weight", type: "F32", ne: [8, 2], data: data(64, 1) },
      { name: "b.weight", type: "Q8_0", ne: [32, 3], data: data(3 * 34, 2) },
      { name: "c.weight", type: "F32", ne: [1000, 3], data: big },
      { name: "d.bias", type: "F32", ne: [4], data: data(16, 4) },
    ],
  };
}

async function withModel<T>(s: GgufWriteSpec, fn: (path: string) => Promise<T>): Promise<T> {
  const dir = await Deno.makeTempDir();
  try {
    const path = `${dir}/m.gguf`;
    await writeGguf(path, s);
    return await fn(path);
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
}

Deno.test("fingerprint: fed in any tensor order and chunking, or partly fed and completed, equals a full read", async () => {
  await withModel(spec(), async (path) => {
    const file = await openGguf(path);
    try {
      const full = await fingerprintGguf(file);
      assert.match(full, /^[0-9a-f]{64}$/);
      assert.equal(await fingerprintFile(path), full);
      // Fed in reverse tensor order, in 100-byte chunks with some chunks repeated (a retried read).
      const h = new FingerprintHasher(file);
      for (const t of [...file.tensors.values()].reverse()) {
        const bytes = await file.readTensor(t.name);
        for (let at = 0; at < bytes.length; at += 100) {
          h.update(t.name, bytes.subarray(at, at + 100), at);
          if (at === 100) h.update(t.name, bytes.subarray(0, 150), 0);
        }
      }
      assert.deepEqual(h.missing(), []);
      assert.equal(h.digest(), full);
      // Only c.weight's first half fed (a stage uploading part of the model): complete() reads the rest.
      const part = new FingerprintHasher(file);
      const c = await file.readTensor("c.weight");
      part.update("c.weight", c.subarray(0, 5000), 0);
      assert.deepEqual(part.missing(), ["a.weight", "b.weight", "c.weight", "d.bias"]);
      assert.equal(part.missingBytes(), 64 + 102 + 7000 + 16);
      assert.equal(await part.complete({ chunkBytes: 333 }), full);
      // Misuse is a bug in the caller and says so.
      const bad = new FingerprintHasher(file);
      assert.throws(
        () => bad.update("c.weight", c.subarray(10, 20), 10),
        /Internal error: .* offset 10 but only 0/,
      );
      assert.throws(() => bad.update("z.weight", c.subarray(0, 1), 0), /does not have/);
      assert.throws(() => bad.digest(), /4 tensors unread \(first a\.weight\)/);
    } finally {
      file.close();
    }
  });
});

Deno.test("fingerprint: the definition, recomputed by hand for the fixture", async () => {
  await withModel(spec(), async (path) => {
    const file = await openGguf(path);
    try {
      // An independent reading of docs/WIRE.md "Model fingerprint": raw header bytes are not used, so build M
      // and T from the spec by hand.
      const enc = new TextEncoder();
      const out: number[] = [];
      const u32 = (v: number) => out.push(v & 0xff, (v >>> 8) & 0xff, (v >>> 16) & 0xff, v >>> 24);
      const u64 = (v: bigint) => {
        for (let i = 0n; i < 8n; i++) out.push(Number((BigInt.asUintN(64, v) >> (8n * i)) & 0xffn));
      };
      const str = (s: string) => (u64(BigInt(enc.encode(s).length)), out.push(...enc.encode(s)));
      const f32 = (x: number) => out.push(...new Uint8Array(new Float32Array([x]).buffer));
      const f64 = (x: number) => out.push(...new Uint8Array(new Float64Array([x]).buffer));
      str("test.title"), u32(8), str("fingerprint fixture");
      str("test.u8"), u32(0), out.push(7);
      str("test.i64"), u32(11), u64(-(2n ** 40n));
      str("test.f32"), u32(6), f32(0.1);
      str("test.f64"), u32(12), f64(1 / 3);
      str("test.flag"), u32(7), out.push(1);
      str("test.ints"), u32(9), u32(5), u64(3n), u32(1), u32(-2 >>> 0), u32(3);
      str("test.words"), u32(9), u32(8), u64(3n), str("a"), str("bé"), str("");
      const m = Uint8Array.from(out);
      out.length = 0;
      for (
        const [name, ne, type] of [["a.weight", [8, 2], 0], ["b.weight", [32, 3], 8], [
          "c.weight",
          [1000, 3],
          0,
        ], ["d.bias", [4], 0]] as const
      ) {
        str(name), u32(ne.length), ne.forEach((n) => u64(BigInt(n))), u32(type);
      }
      const t = Uint8Array.from(out);
      const h = createHash("sha256");
      h.update(enc.encode("WLLM model fingerprint v1\0"));
      const len = (n: number) => new Uint8Array(new BigUint64Array([BigInt(n)]).buffer);
      h.update(len(m.length)), h.update(m), h.update(len(t.length)), h.update(t);
      for (const w of spec().tensors) h.update(createHash("sha256").update(w.data as Uint8Array).digest());
      assert.equal(await fingerprintGguf(file), h.digest("hex"));
    } finally {
      file.close();
    }
  });
});

Deno.test("fingerprint: a flipped weight bit or a changed metadata value changes it; a split set does not", async () => {
  const base = await withModel(spec(), fingerprintFile);
  assert.notEqual(await withModel(spec({ flip: 11_999 }), fingerprintFile), base, "last byte of c.weight");
  assert.notEqual(await withModel(spec({ flip: 0 }), fingerprintFile), base, "first byte of c.weight");
  assert.notEqual(await withModel(spec({ title: "fingerprint fixturf" }), fingerprintFile), base, "metadata");
  const dir = await Deno.makeTempDir();
  try {
    const paths = await writeGgufSplit(`${dir}/m`, spec(), 3);
    assert.equal(await fingerprintFile(paths[1]!), base);
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});

Deno.test("fingerprint: the cache beside the file is used while size and mtime match, recomputed otherwise", async () => {
  await withModel(spec(), async (path) => {
    const file = await openGguf(path);
    try {
      const stats = await fingerprintStats(file);
      const h = new FingerprintHasher(file);
      h.update("d.bias", await file.readTensor("d.bias"), 0);
      const first = await modelFingerprint(file, { hasher: h, stats });
      assert.deepEqual(first, { fingerprint: await fingerprintGguf(file), cached: false });
      const cachePath = fingerprintCachePath(file);
      assert.equal(cachePath, `${path}.fingerprint`);
      // A planted value proves the cache is read (not recomputed) while the stats match.
      const cache = JSON.parse(await Deno.readTextFile(cachePath));
      await Deno.writeTextFile(cachePath, JSON.stringify({ ...cache, fingerprint: "0".repeat(64) }));
      assert.deepEqual(await modelFingerprint(file), { fingerprint: "0".repeat(64), cached: true });
      // Touching the file (a rewrite in place) invalidates it.
      await Deno.utime(path, new Date(), new Date(Date.now() + 5000));
      assert.equal(await readCachedFingerprint(file), undefined);
      assert.deepEqual(await modelFingerprint(file), { fingerprint: first.fingerprint, cached: false });
      assert.equal(await readCachedFingerprint(file), first.fingerprint);
      await Deno.writeTextFile(cachePath, "{ not json");
      assert.equal(await readCachedFingerprint(file), undefined);
    } finally {
      file.close();
    }
  });
});
