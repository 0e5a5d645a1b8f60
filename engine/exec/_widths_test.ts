import assert from "node:assert/strict";
import { buildWidthClasses, prefillWidthClasses } from "./_widths.ts";
import { Stage } from "./stage.ts";
import { openGguf } from "../gguf.ts";
import { PipelineCache } from "../../wgsl/kernel.ts";
import { testGpu } from "../../tests/util/gpu.ts";
import { fixturePath } from "../../tests/util/fixtures.ts";
import { Rng } from "../../tests/util/rng.ts";
import { attnPrefillSplits } from "../../wgsl/attn_prefill.ts";
import { matmulConstants } from "../../wgsl/matmul.ts";
import { groupedMatmulConstants } from "../../wgsl/moe_matmul.ts";

/** The grouped experts' token tile for `nRouted` columns over `experts` (the fields it reads; others dummy). */
function tokenTile(experts: number, nRouted: number): number {
  const shape = {
    type: "IQ4_XS" as const,
    k: 2048,
    n: 512,
    nGroups: experts,
    shared: false,
    cap: nRouted,
    nRouted,
    xDiv: 1,
    sharedX0: 0,
    wOffsetBytes: 0,
    expertBytes: 0,
    xStride: 2048,
    yStride: 512,
  };
  return groupedMatmulConstants(shape).TT;
}

Deno.test("prefillWidthClasses: every matmul tile and attention split class of 9..maxChunk has a width", () => {
  for (const maxChunk of [9, 100, 512, 2048, 3000]) {
    const widths = prefillWidthClasses(maxChunk, 8);
    assert.ok(widths.every((n, i) => n > 8 && n <= maxChunk && (i === 0 || n > widths[i - 1]!)), `${widths}`);
    assert.equal(widths.at(-1), maxChunk);
    // Each variant a width of 9..maxChunk takes is taken by one of the widths: attention splits (H_KV of the
    // tiny, 35B-A3B and 80B-A3B shapes and more), matmul tiles (rows of their matrices) and the grouped
    // experts' token tile (experts and experts used of the same three).
    const shapes: readonly (readonly [number, number, number, number])[] = [
      [2, 2048, 256, 8],
      [2, 512, 512, 10],
      [1, 256, 8, 2],
      [2, 248320, 256, 8],
      [16, 64, 64, 4],
    ];
    for (const [hKv, rows, experts, used] of shapes) {
      // Each kernel's variant on its own: a graph of one width compiles every kernel's.
      const keys: [string, (n: number) => string][] = [
        ["attention splits", (n) => `${attnPrefillSplits(hKv, 8, n)}`],
        ["matmul tile", (n) => JSON.stringify(matmulConstants({ type: "IQ4_XS", k: 2048, n: rows, m: n }))],
        ["expert token tile", (n) => `${tokenTile(experts, n * used)}`],
      ];
      for (const [what, key] of keys) {
        const got = new Set(widths.map(key));
        for (let n = 9; n <= maxChunk; n++) {
          assert.ok(
            got.has(key(n)),
            `maxChunk ${maxChunk}, shape ${[hKv, rows, experts, used]}: ${what} of ${n}`,
          );
        }
      }
    }
  }
});

Deno.test("buildWidthClasses: the column widths with every row, then the classes up to what the context holds", async () => {
  const built: string[] = [];
  const graph = (_slot: number, n: number, rows: string) => Promise.resolve(built.push(`${n}${rows}`));
  const stage = { maxChunk: 2048, nCtx: 96, graph };
  const want = [2, 3, 4, 5, 6, 7, 8, 9, 16, 17, 32, 33, 64, 65, 96];
  assert.deepEqual(await buildWidthClasses(stage, 0), want);
  assert.deepEqual(built, want.map((n) => `${n}${n <= 8 ? "all" : "last"}`));
  assert.equal((await buildWidthClasses({ ...stage, nCtx: 4096 }, 0)).at(-1), 2048);
  assert.deepEqual(await buildWidthClasses({ ...stage, nCtx: 5 }, 0), [2, 3, 4, 5]);
});

Deno.test("after buildWidthClasses no chunk width up to the context compiles a pipeline (a split's last stage)", async () => {
  const rng = new Rng();
  const gpu = await testGpu();
  using file = await openGguf(fixturePath("tiny-qwen35moe.q8_0.gguf"));
  const stage = await Stage.load(gpu, file, { nCtx: 64, nSlots: 2, layers: [2, 4] });
  try {
    await buildWidthClasses(stage, 0);
    const cache = PipelineCache.shared(gpu.device, { f16: gpu.f16 });
    const compiled = cache.size;
    const widths = [2, 3, 5, 6, 7, 8, ...Array.from({ length: 4 }, () => rng.int(9, 65))];
    for (const n of widths) {
      for (const rows of ["last", "all"] as const) {
        if (rows === "all" && n > 8) continue;
        await stage.graph(1, n, rows);
        assert.equal(cache.size, compiled, `width ${n} rows ${rows} compiled a pipeline (seed ${rng.seed})`);
      }
    }
  } finally {
    stage.destroy();
  }
});
