/**
 * GGUF writer throughput: streams a ~512 MiB file (one tensor as a Uint8Array, the rest through producers
 * delivering 8 MiB chunks), then reads it back through `readTensorInto` with a 64 MiB staging buffer.
 * Prints one JSON line per measurement; asserts nothing.
 *
 * Usage: `deno run -A bench/gguf_write.ts [--size-mib 512] [--dir /tmp]`
 * @module
 */
import { parseArgs } from "node:util";
import { openGguf } from "../engine/gguf.ts";
import { type GgufWriteTensor, kv, writeGguf } from "../engine/gguf_write.ts";

const { values } = parseArgs({
  args: Deno.args,
  options: { "size-mib": { type: "string", default: "512" }, dir: { type: "string" } },
});
const sizeMib = Number(values["size-mib"]);
const MIB = 1024 * 1024;
const CHUNK = 8 * MIB;

async function commit(): Promise<string> {
  const out = await new Deno.Command("git", { args: ["rev-parse", "--short", "HEAD"], stdout: "piped" })
    .output()
    .catch(() => undefined);
  return out?.success ? new TextDecoder().decode(out.stdout).trim() : "unknown";
}

// One reusable pattern buffer: the bench measures the writer, not a random generator.
const pattern = new Uint8Array(CHUNK);
for (let i = 0; i < pattern.length; i++) pattern[i] = (i * 2654435761) >>> 24;

// Tensors of 32 MiB (F32, ne=[4096, 2048]); the first is passed as bytes, the rest via producers.
const perTensorBytes = 32 * MIB;
const nTensors = Math.max(1, Math.round(sizeMib / 32));
const tensors: GgufWriteTensor[] = Array.from({ length: nTensors }, (_, i) => ({
  name: `bench.${i}`,
  type: "F32",
  ne: [4096, 2048],
  data: i === 0 ? new Uint8Array(perTensorBytes).fill(7) : async (sink) => {
    for (let off = 0; off < perTensorBytes; off += CHUNK) {
      await sink(pattern.subarray(0, Math.min(CHUNK, perTensorBytes - off)));
    }
  },
}));

const dir = values.dir ?? await Deno.makeTempDir({ prefix: "gguf_bench_" });
const path = `${dir}/bench_write.gguf`;
const rev = await commit();
try {
  const t0 = performance.now();
  const { sizeBytes } = await writeGguf(path, { kv: [["bench.note", kv.str("write throughput")]], tensors });
  const writeS = (performance.now() - t0) / 1000;
  console.log(JSON.stringify({
    bench: "gguf_write",
    commit: rev,
    command: `deno run -A bench/gguf_write.ts --size-mib ${sizeMib}`,
    params: { sizeBytes, nTensors, chunkBytes: CHUNK },
    result: { seconds: +writeS.toFixed(3), mbPerSec: +(sizeBytes / 1e6 / writeS).toFixed(1) },
  }));

  const g = await openGguf(path);
  const staging = new Uint8Array(64 * MIB);
  const t1 = performance.now();
  let read = 0;
  for (const t of g.tensors.values()) {
    for (let off = 0; off < t.nbytes; off += staging.length) {
      const n = Math.min(staging.length, t.nbytes - off);
      await g.readTensorInto(t.name, staging.subarray(0, n), off);
      read += n;
    }
  }
  const readS = (performance.now() - t1) / 1000;
  g.close();
  console.log(JSON.stringify({
    bench: "gguf_read_into",
    commit: rev,
    command: `deno run -A bench/gguf_write.ts --size-mib ${sizeMib}`,
    params: { sizeBytes: read, stagingBytes: staging.length, note: "page cache warm from the write" },
    result: { seconds: +readS.toFixed(3), mbPerSec: +(read / 1e6 / readS).toFixed(1) },
  }));
} finally {
  // A failed write already removed its file.
  if (values.dir === undefined) await Deno.remove(dir, { recursive: true });
  else await Deno.remove(path).catch((e) => console.error(`Could not remove ${path}: ${e}`));
}
