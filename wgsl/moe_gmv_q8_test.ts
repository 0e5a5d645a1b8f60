import { bindGroup, PipelineCache } from "./kernel.ts";
import type { GgmlTypeName } from "../engine/quant/types.ts";
import { moeMatvecParams, type MoeMatvecShape } from "./moe_matvec.ts";
import {
  MOE_MATVEC_Q8,
  MOE_MATVEC_Q8_BINDINGS,
  moeMatvecQ8Constants,
  moeMatvecQ8Grid,
  q8ColumnWords,
} from "./moe_matvec_q8.ts";
import {
  checkMoeGmvQ8,
  MOE_GMV_Q8,
  MOE_GMV_Q8_BINDINGS,
  type MoeGmvQ8Bindings,
  type MoeGmvQ8Constants,
  moeGmvQ8Constants,
  moeGmvQ8Grid,
} from "./moe_gmv_q8.ts";
import { checkMoeTiles, MOE_TILES, moeTilesWords } from "./moe_tiles.ts";
import { checkMoeY, makeMoeCase, type MoeCase } from "./_moe_testing.ts";
import { poisoned, readAll, testGpu, upload } from "../tests/util/gpu.ts";
import { Rng } from "../tests/util/rng.ts";
import assert from "node:assert/strict";

const TYPES: GgmlTypeName[] = ["Q8_0", "Q4_K", "Q5_K", "Q6_K", "IQ4_XS"];

/** Ids of `tokens` tokens with `used` distinct experts each, from few experts: groups of several columns. */
function groupedIds(rng: Rng, tokens: number, used: number, nExpert: number): Uint32Array {
  const ids: number[] = [];
  for (let t = 0; t < tokens; t++) {
    const pool = Array.from({ length: nExpert }, (_, i) => i);
    for (let i = 0; i < used; i++) ids.push(pool.splice(rng.int(0, pool.length), 1)[0]!);
  }
  return Uint32Array.from(ids);
}

/** moe_tiles' table in float-free TypeScript: groups by first column, CT columns a tile, shared tiles last. */
function tilesReference(ids: ArrayLike<number>, nShared: number, sharedE: number, ct: number): number[] {
  const tiles: number[][] = [];
  const seen = new Set<number>();
  const put = (e: number, cols: number[]) => {
    for (let m = 0; m < cols.length; m += ct) {
      const part = cols.slice(m, m + ct);
      tiles.push([e, part.length, ...part, ...Array(ct - part.length).fill(part.at(-1))]);
    }
  };
  for (let i = 0; i < ids.length; i++) {
    if (seen.has(ids[i]!)) continue;
    seen.add(ids[i]!);
    put(ids[i]!, Array.from(ids, (e, j) => e === ids[i] ? j : -1).filter((j) => j >= 0));
  }
  put(sharedE, Array.from({ length: nShared }, (_, t) => ids.length + t));
  return [tiles.length, ...tiles.flat()];
}

Deno.test("moe_gmv_q8: columns grouped by expert give moe_matvec_q8's bits at its TEAM, and the float64 products", async () => {
  const rng = new Rng();
  const { device } = await testGpu();
  const cache = new PipelineCache(device);
  const runs: {
    c: MoeCase;
    team: number;
    ct: number;
    grouped: GPUBuffer;
    alone: GPUBuffer;
    tiles: GPUBuffer;
  }[] = [];
  const enc = device.createCommandEncoder();
  const pass = enc.beginComputePass();
  let i = 0;
  for (const type of TYPES) {
    for (const [gateUp, shared] of [[true, true], [false, true], [true, false], [false, false]] as const) {
      // Up to 16 tokens of up to 4 experts from 3..6: the shared group has up to 16 columns (two tiles of 8),
      // routed groups up to 16; one case runs one token (no group longer than one column).
      const tokens = i % 5 === 0 ? 1 : rng.int(2, 17);
      const nExpert = rng.int(3, 7);
      const used = rng.int(1, Math.min(4, nExpert) + 1);
      const ids = groupedIds(rng, tokens, used, nExpert);
      const k = 256 * rng.int(1, 4);
      const c = makeMoeCase(rng, type, gateUp, { k, n: rng.int(1, 80), nExpert, ids, tokens, shared });
      const team = [1, 2, 4, 8, 16][i % 5]!;
      const ct = [8, 1, 3, 4, 5, 8, 2][i % 7]!;
      i++;
      const cols = c.shape.nCols + (c.shape.sharedCols ?? 0);
      const w = upload(device, c.w);
      const common = {
        params: upload(device, moeMatvecParams(c.shape)),
        ids: upload(device, ids),
        weights: w,
        weights2: w,
        xq: upload(device, c.xq!),
      };
      // moe_tiles' table first (poisoned: tiles past the count stay so), then the grouped pass.
      const tw = moeTilesWords(c.shape, ct);
      const tiles = poisoned(device, tw);
      const tb = { params: common.params, ids: common.ids, tiles: { buffer: tiles, size: 4 * tw } };
      checkMoeTiles(c.shape, ct, tb);
      const pt = await cache.get(MOE_TILES, { CT: ct });
      pass.setPipeline(pt);
      pass.setBindGroup(0, bindGroup(device, pt, [tb.params, tb.ids, tb.tiles]));
      pass.dispatchWorkgroups(1);
      const grouped = poisoned(device, c.shape.n * cols);
      const gc: MoeGmvQ8Constants = { ...moeGmvQ8Constants(c.shape, ct), TEAM: team };
      const { ids: _, ...rest } = common;
      const b: MoeGmvQ8Bindings = {
        ...rest,
        y: { buffer: grouped, size: 4 * c.shape.n * cols },
        tiles: tb.tiles,
      };
      checkMoeGmvQ8(c.shape, gc, b);
      const p = await cache.get(MOE_GMV_Q8, gc);
      pass.setPipeline(p);
      pass.setBindGroup(0, bindGroup(device, p, MOE_GMV_Q8_BINDINGS.map((n) => b[n])));
      pass.dispatchWorkgroups(...moeGmvQ8Grid(c.shape, gc));
      // moe_matvec_q8 at the same TEAM (ROWS 1..4: the rows per workgroup do not change a row's order).
      const alone = poisoned(device, c.shape.n * cols);
      const qc = { ...moeMatvecQ8Constants(c.shape), TEAM: team, ROWS: rng.int(1, 5) };
      const ab = { ...common, y: { buffer: alone, size: 4 * c.shape.n * cols }, yq: poisoned(device, 1) };
      const pa = await cache.get(MOE_MATVEC_Q8, qc);
      pass.setPipeline(pa);
      pass.setBindGroup(0, bindGroup(device, pa, MOE_MATVEC_Q8_BINDINGS.map((n) => ab[n])));
      pass.dispatchWorkgroups(...moeMatvecQ8Grid(c.shape, qc));
      runs.push({ c, team, ct, grouped, alone, tiles });
    }
  }
  pass.end();
  device.queue.submit([enc.finish()]);
  const got = await readAll(device, runs.flatMap((r) => [r.grouped, r.alone, r.tiles]));
  runs.forEach(({ c, team, ct }, j) => {
    const what = `moe_gmv_q8 ${c.shape.type} ${c.shape.gateUp ? "gate·up" : "down"} k=${c.shape.k} ` +
      `n=${c.shape.n} ids=${[
        ...c.ids,
      ]} shared=${c.shape.sharedCols} TEAM ${team} CT ${ct} (seed ${rng.seed})`;
    const want = tilesReference(c.ids, c.shape.sharedCols ?? 0, c.shape.nExpert, ct);
    assert.deepEqual(
      [...new Uint32Array(got[3 * j + 2]!, 0, want.length)],
      want,
      `${what}: moe_tiles' table`,
    );
    checkMoeY(got[3 * j]!, c, what);
    const cols = c.shape.nCols + (c.shape.sharedCols ?? 0);
    const g = new Uint32Array(got[3 * j]!, 0, c.shape.n * cols);
    const a = new Uint32Array(got[3 * j + 1]!, 0, c.shape.n * cols);
    const bad = g.findIndex((v, e) => v !== a[e]);
    assert.equal(
      bad,
      -1,
      `${what}: y[${bad}] bits ${g[bad]?.toString(16)} against moe_matvec_q8's ${a[bad]?.toString(16)}`,
    );
  });
});

Deno.test("moe_gmv_q8 checks throw before encoding: TEAM, CT, routed columns, the table, moe_matvec_q8's shape checks", () => {
  const shape: MoeMatvecShape = {
    type: "IQ4_XS",
    k: 512,
    n: 64,
    nExpert: 4,
    nCols: 16,
    xDiv: 2,
    offGateBytes: 0,
    offUpBytes: 4 * 64 * 272,
    gateUp: true,
    sharedCols: 8,
  };
  const b = (words: number): GPUBuffer => ({ size: 4 * words }) as unknown as GPUBuffer;
  const ok: MoeGmvQ8Bindings = {
    params: b(11),
    weights: b(2 * 5 * 64 * 68 + 8),
    weights2: b(2 * 5 * 64 * 68 + 8),
    xq: b(q8ColumnWords(512) * 8),
    y: b(64 * 24),
    tiles: b(1 + 17 * 10),
  };
  const c = moeGmvQ8Constants(shape);
  assert.deepEqual(c, { TYPE: 23, TEAM: 4, CT: 8, GATE_UP: true });
  assert.deepEqual(moeGmvQ8Grid(shape, c), [1, 17, 1]);
  checkMoeGmvQ8(shape, c, ok);
  const throws = (s: MoeMatvecShape, cc: MoeGmvQ8Constants, bb: MoeGmvQ8Bindings, re: RegExp) =>
    assert.throws(() => checkMoeGmvQ8(s, cc, bb), re);
  throws(shape, { ...c, TEAM: 32 }, ok, /moe_gmv_q8: TEAM=32 must be a power of two up to 16/);
  throws(shape, { ...c, TEAM: 12 }, ok, /TEAM=12 must be a power of two/);
  throws(shape, { ...c, CT: 9 }, ok, /moe_gmv_q8: CT/);
  throws({ ...shape, nCols: 258, xDiv: 2 }, c, ok, /258 routed columns exceed the 256/);
  throws(shape, c, { ...ok, tiles: b(1 + 17 * 10 - 1) }, /binding tiles/);
  throws({ ...shape, k: 96 }, c, ok, /K=96 must be a positive multiple of 32/);
  throws(shape, c, { ...ok, y: b(64 * 24 - 1) }, /binding y/);
  throws(shape, c, { ...ok, xq: b(q8ColumnWords(512) * 8 - 1) }, /binding xq/);
});
