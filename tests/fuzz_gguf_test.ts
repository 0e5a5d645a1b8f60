/**
 * Property-based fuzzing of the GGUF reader (fast-check): random bytes, truncations at every length of a
 * valid tiny file, and random byte mutations of it. Whatever the bytes, `openGguf` either opens the file
 * (and then its metadata, tensor table and tokenizer read without surprises) or throws a GgufError; never a
 * TypeError, RangeError, "Internal error" or a hang, and each case finishes within a bound.
 *
 * Reproduce a failure with the seed and path fast-check prints: `fc.assert(..., { seed, path })`.
 */
import assert from "node:assert/strict";
import fc from "fast-check";
import { GgufError } from "../engine/errors.ts";
import { GGUF_VALUE_TYPE as T, openGguf } from "../engine/gguf.ts";
import { kv, writeGguf } from "../engine/gguf_write.ts";
import { Tokenizer } from "../engine/text/tokenizer.ts";
import { KEYS } from "../engine/names.ts";

/** Most milliseconds one case may take (reads a few hundred bytes from a temp file). */
const CASE_MS = 2000;

const dir = await Deno.makeTempDir({ prefix: "fuzz_gguf_" });
const validPath = `${dir}/valid.gguf`;
await writeGguf(validPath, {
  kv: [
    ["general.architecture", kv.str("qwen35moe")],
    ["test.u32", kv.u32(7)],
    ["test.arr", kv.arr(T.UINT32, [1, 2, 3])],
    ["test.nested", kv.arr(T.ARRAY, [kv.arr(T.UINT8, [1])])],
    [KEYS.tokModel, kv.str("gpt2")],
    [KEYS.tokPre, kv.str("qwen2")],
    [KEYS.tokTokens, kv.arr(T.STRING, ["a", "b", "ab", "<|im_end|>"])],
    [KEYS.tokTypes, kv.arr(T.INT32, [1, 1, 1, 3])],
    [KEYS.tokMerges, kv.arr(T.STRING, ["a b"])],
  ],
  tensors: [
    { name: "tensor.a", type: "F32", ne: [8, 2], data: new Uint8Array(64).fill(1) },
    { name: "tensor.b", type: "Q8_0", ne: [32, 1], data: new Uint8Array(34).fill(2) },
  ],
});
const valid = await Deno.readFile(validPath);
let n = 0;

/** Opens `bytes` as a GGUF file and reads everything the engine reads before any tensor data. */
async function openBytes(bytes: Uint8Array): Promise<void> {
  const path = `${dir}/case${n++ % 4}.gguf`;
  await Deno.writeFile(path, bytes);
  const t0 = performance.now();
  try {
    using f = await openGguf(path);
    for (const t of f.tensors.values()) {
      assert.ok(t.absOffsetBytes + t.nbytes <= (f.parts[t.part]?.sizeBytes ?? 0));
    }
    if (f.metadata.has(KEYS.tokTokens)) {
      try {
        Tokenizer.fromGguf(f.metadata);
      } catch (e) {
        if (!(e instanceof GgufError)) throw e;
      }
    }
  } catch (e) {
    if (!(e instanceof GgufError)) {
      throw new Error(`openGguf threw ${(e as Error)?.name ?? typeof e}, not a GgufError: ${e}`, {
        cause: e,
      });
    }
    assert.ok(e.message.length > 0 && !e.message.startsWith("Internal error"), e.message);
  }
  const ms = performance.now() - t0;
  assert.ok(ms < CASE_MS, `took ${ms.toFixed(0)} ms`);
}

Deno.test("fuzz gguf: random bytes, with and without the GGUF magic", async () => {
  await fc.assert(
    fc.asyncProperty(fc.uint8Array({ maxLength: 512 }), fc.boolean(), async (bytes, magic) => {
      const b = bytes.slice();
      if (magic && b.length >= 8) b.set([0x47, 0x47, 0x55, 0x46, 3, 0, 0, 0]);
      await openBytes(b);
    }),
    { numRuns: 400 },
  );
});

Deno.test("fuzz gguf: every truncation of a valid file before its last data byte is a GgufError", async () => {
  // Past the last tensor's data there is only alignment padding: those truncations are valid files.
  const f = await openGguf(validPath);
  const end = Math.max(...[...f.tensors.values()].map((t) => t.absOffsetBytes + t.nbytes));
  f.close();
  assert.ok(end > valid.length - 32 && end <= valid.length);
  for (let len = 0; len < end; len++) {
    const path = `${dir}/trunc.gguf`;
    await Deno.writeFile(path, valid.subarray(0, len));
    await assert.rejects(() => openGguf(path), GgufError, `truncated at ${len} of ${end}`);
  }
});

Deno.test("fuzz gguf: random mutations of a valid file (bytes, u64 counts set huge)", async () => {
  await fc.assert(
    fc.asyncProperty(
      fc.array(fc.tuple(fc.nat({ max: valid.length - 1 }), fc.integer({ min: 0, max: 255 })), {
        minLength: 1,
        maxLength: 8,
      }),
      fc.option(fc.nat({ max: valid.length - 8 })),
      async (edits, hugeAt) => {
        const b = valid.slice();
        for (const [at, v] of edits) b[at] = v;
        if (hugeAt !== null) new DataView(b.buffer).setBigUint64(hugeAt, 0xFFFF_FFFF_FFFFn << 16n, true);
        await openBytes(b);
      },
    ),
    { numRuns: 400 },
  );
});

Deno.test("fuzz gguf: clean up", async () => {
  await Deno.remove(dir, { recursive: true });
});
