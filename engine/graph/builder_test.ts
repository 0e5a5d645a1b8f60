import assert from "node:assert/strict";
import { BATCH_MAX_COLS, GraphBuilder, type GraphOptions, MATVEC_MAX_COLS } from "./builder.ts";
import { MAX_BATCH_SLOTS } from "../exec/activations.ts";
import type { PipelineCache } from "../../wgsl/kernel.ts";
import type { Hparams } from "../models/_arch.ts";
import { testGpu } from "../../tests/util/gpu.ts";

Deno.test("GraphBuilder.storage: one params buffer per content and owner, shared by the owner's graphs", async () => {
  const { device } = await testGpu();
  const opts = { normPrologueMaxRows: 1 } as GraphOptions;
  const builder = (n: number, owned: GPUBuffer[]) =>
    new GraphBuilder(device, {} as PipelineCache, {} as Hparams, n, owned, opts);
  const owned: GPUBuffer[] = [];
  const [a, b] = [builder(3, owned), builder(5, owned)];
  const p = a.storage(Uint32Array.of(7, 1, 2));
  assert.equal(b.storage(Uint32Array.of(7, 1, 2)), p, "another graph of the same owner reuses it");
  const q = b.storage(Uint32Array.of(7, 1, 3));
  assert.notEqual(q, p);
  assert.equal(a.storage(Uint32Array.of(7, 1)), a.storage(Uint32Array.of(7, 1)));
  assert.notEqual(a.storage(Uint32Array.of(7, 1)), p, "a prefix is other content");
  assert.equal(owned.length, 3);
  const other: GPUBuffer[] = [];
  assert.notEqual(builder(3, other).storage(Uint32Array.of(7, 1, 2)), p, "another owner gets its own");
  assert.equal(other.length, 1);
  for (const x of [...owned, ...other]) x.destroy();
});

Deno.test("GraphBuilder.maxCols: a chunk's mat-vecs take up to 8 columns, a batched step's up to 16", async () => {
  const { device } = await testGpu();
  const opts = { normPrologueMaxRows: 1 } as GraphOptions;
  const builder = (n: number, batched?: boolean) =>
    new GraphBuilder(device, {} as PipelineCache, {} as Hparams, n, [], opts, batched);
  assert.equal(MATVEC_MAX_COLS, 8);
  assert.equal(BATCH_MAX_COLS, 16);
  assert.equal(builder(12).maxCols, MATVEC_MAX_COLS);
  assert.equal(builder(12, true).maxCols, BATCH_MAX_COLS);
  assert.equal(MAX_BATCH_SLOTS, BATCH_MAX_COLS);
  assert.throws(() => builder(17, true), /a batched step has 2\.\.16 columns, not 17/);
  assert.throws(() => builder(1, true), /not 1/);
});

Deno.test("GraphBuilder: scratch is shared by an owner's graphs, grows 1.5x at a time, never past the binding limit", () => {
  const made: number[] = [];
  const limits = { maxStorageBufferBindingSize: 100_000, maxBufferSize: 1 << 30 };
  const device = {
    limits,
    createBuffer: (d: GPUBufferDescriptor) => (made.push(d.size), { size: d.size }) as unknown as GPUBuffer,
  } as unknown as GPUDevice;
  const opts = { normPrologueMaxRows: 1 } as GraphOptions;
  const owned: GPUBuffer[] = [];
  const g = (n: number) => new GraphBuilder(device, {} as PipelineCache, {} as Hparams, n, owned, opts);
  const a = g(3).grown("partials", 1000);
  assert.equal(g(5).grown("partials", 900), a, "another graph of the owner reuses it");
  assert.equal(g(7).grown("other", 16).size, 256, "by name");
  const b = g(9).grown("partials", 1100);
  assert.equal(b.size, 1536, "1.5x the old size, in 256-byte steps");
  const c = g(11).grown("partials", 90_000);
  assert.equal(c.size, 90_112);
  // 1.5x would pass the 100,000-byte binding limit: the largest 256-byte multiple within it, or the need.
  assert.equal(g(13).grown("partials", 91_000).size, 99_840);
  assert.equal(g(15).grown("partials", 99_999).size, 99_999);
  assert.equal(
    new GraphBuilder(device, {} as PipelineCache, {} as Hparams, 1, [], opts).grown("partials", 10).size,
    256,
  );
  assert.deepEqual(made, [1024, 256, 1536, 90_112, 99_840, 99_999, 256]);
});
