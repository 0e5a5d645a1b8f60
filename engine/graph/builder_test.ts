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
