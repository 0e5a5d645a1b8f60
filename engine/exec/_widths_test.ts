import assert from "node:assert/strict";
import { buildWidthClasses, prefillWidthClasses } from "./_widths.ts";
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

Deno.test("buildWidthClasses builds no graph wider than the context holds", async () => {
  const built: number[] = [];
  const stage = {
    maxChunk: 2048,
    nCtx: 96,
    graph: (_slot: number, n: number) => Promise.resolve(built.push(n)),
  };
  assert.deepEqual(await buildWidthClasses(stage, 0), [9, 16, 17, 32, 33, 64, 65, 96]);
  assert.deepEqual(built, [9, 16, 17, 32, 33, 64, 65, 96]);
  const wide = { ...stage, nCtx: 4096 };
  assert.equal((await buildWidthClasses(wide, 0)).at(-1), 2048);
});
