import assert from "node:assert/strict";
import { uploadTensors } from "./weights.ts";
import { openGguf } from "../gguf.ts";
import { writeGguf } from "../gguf_write.ts";
import { readAll, testGpu } from "../../tests/util/gpu.ts";
import { Rng } from "../../tests/util/rng.ts";

Deno.test("uploadTensors: bytes land intact, large tensors split by rows, odd sizes padded", async () => {
  const rng = new Rng();
  const { device } = await testGpu();
  const dir = await Deno.makeTempDir();
  const path = `${dir}/w.gguf`;
  // Q8_0 rows of 64 elements are 68 bytes: 37 rows = 2516 bytes, split into parts of at most 5 rows.
  const q8 = rng.bytes(37 * 68);
  // F16 with an odd element count: 2 * 9 = 18 bytes, padded to 20 on the GPU.
  const f16 = rng.bytes(18);
  await writeGguf(path, {
    kv: [],
    tensors: [
      { name: "q8", type: "Q8_0", ne: [64, 37], data: q8 },
      { name: "h", type: "F16", ne: [9], data: f16 },
    ],
  });
  const file = await openGguf(path);
  const seen: number[] = [];
  const ts = await uploadTensors(device, file, {
    names: ["q8", "h"],
    maxPartBytes: 5 * 68 + 3,
    chunkBytes: 100,
    onProgress: (p) => seen.push(p.doneBytes),
  });
  const q = ts.get("q8")!;
  assert.equal(q.parts.length, 8, "37 rows in parts of 5");
  assert.deepEqual(q.parts.map((p) => p.nRows), [5, 5, 5, 5, 5, 5, 5, 2]);
  const got = await readAll(device, [...q.parts.map((p) => p.buffer), ts.get("h")!.parts[0]!.buffer]);
  q.parts.forEach((p, i) => {
    const want = q8.subarray(p.firstRow * 68, (p.firstRow + p.nRows) * 68);
    assert.deepEqual(new Uint8Array(got[i]!, 0, want.length), want, `part ${i}, seed ${rng.seed}`);
  });
  assert.deepEqual(new Uint8Array(got[8]!, 0, 18), f16);
  assert.equal(seen.at(-1), 37 * 68 + 18);
  assert.ok(seen.every((v, i) => i === 0 || v >= seen[i - 1]!), "progress is monotone");
  await assert.rejects(
    uploadTensors(device, file, { names: ["q8"], maxPartBytes: 60 }),
    /one row of 68 bytes exceeds the GPU binding limit of 60 bytes/,
  );
  file.close();
  for (const t of ts.values()) for (const p of t.parts) p.buffer.destroy();
  await Deno.remove(dir, { recursive: true });
});
