import assert from "node:assert/strict";
import { bindGroup, PipelineCache } from "./kernel.ts";
import { type GgmlTypeName, typeInfo } from "../engine/quant/types.ts";
import { Rng } from "../tests/util/rng.ts";
import { assertPoisoned } from "../tests/util/close.ts";
import { GUARD_WORDS, POISON_F32, poisoned, readAll, testGpu, upload } from "../tests/util/gpu.ts";
import { randomWeights } from "./_quant_testing.ts";
import { moeReference } from "./_moe_testing.ts";
import { assertCloseEach, checkEach } from "./_test_util.ts";
import { QUANT_TYPES } from "./_quant.ts";
import {
  checkGroupedMatmul,
  encodeGroupedMatmul,
  GROUPED_MATMUL_PARAMS_BYTES,
  GROUPED_MATMUL_TILE_TOKENS,
  type GroupedMatmulConstants,
  groupedMatmulConstants,
  groupedMatmulParams,
  type GroupedMatmulShape,
  groupedMatmulWorkgroupBytes,
  prepareGroupedMatmul,
} from "./moe_matmul.ts";
import { type GroupedMatvecConstants, groupedMatvecConstants, prepareGroupedMatvec } from "./moe_gmv.ts";
import {
  checkMoeGroup,
  MOE_GROUP,
  moeGroupCount,
  moeGroupGrid,
  moeGroupParams,
  type MoeGroupShape,
  moeGroupWords,
} from "./moe_group.ts";

interface Case {
  group: MoeGroupShape;
  shape: GroupedMatmulShape;
  used: number;
  ids: Uint32Array;
  w: Uint8Array;
  x: Float32Array;
}

/**
 * A pass over `tokens` tokens with `used` distinct experts each; expert 0 is most tokens' first pick, so
 * with more than 16 tokens its group spans several token tiles, and some experts may get no token.
 */
function makeCase(
  rng: Rng,
  type: GgmlTypeName,
  gateUp: boolean,
  shared: boolean,
  tokens: number,
  nExpert = rng.int(2, 7),
): Case {
  const be = Math.max(32, typeInfo(type).blockElems);
  // Hundreds of experts get small matrices (the float64 reference and the random weights stay quick).
  const many = nExpert > 64;
  const k = be * (many ? 1 : rng.int(1, 3));
  const n = many ? rng.int(1, 24) : rng.int(1, 300);
  const used = rng.int(1, Math.min(3, nExpert) + 1);
  const ids = new Uint32Array(tokens * used);
  for (let t = 0; t < tokens; t++) {
    const order = Array.from({ length: nExpert }, (_, e) => e);
    for (let i = nExpert - 1; i > 0; i--) {
      const j = rng.int(0, i + 1);
      [order[i], order[j]] = [order[j]!, order[i]!];
    }
    if (rng.float() < 0.8) order.unshift(...order.splice(order.indexOf(0), 1));
    for (let j = 0; j < used; j++) ids[t * used + j] = order[j]!;
  }
  const nRouted = tokens * used;
  const nMats = nExpert + (shared ? 1 : 0);
  const rowBytes = (k / typeInfo(type).blockElems) * typeInfo(type).blockBytes;
  const matsBytes = rowBytes * n * nMats;
  const offGate = 4 * rng.int(0, 8);
  const offUp = gateUp ? Math.ceil((offGate + matsBytes) / 4) * 4 + 4 * rng.int(0, 8) : undefined;
  const w = new Uint8Array((offUp ?? offGate) + matsBytes);
  w.set(randomWeights(rng, type, k, n * nMats, 0.1), offGate);
  if (offUp !== undefined) w.set(randomWeights(rng, type, k, n * nMats, 0.1), offUp);
  const xRows = gateUp ? tokens : nRouted + (shared ? tokens : 0);
  return {
    group: { nRouted, nTokens: tokens, nExpert, shared },
    shape: {
      type,
      k,
      n,
      nGroups: nMats,
      shared,
      cap: tokens,
      nRouted,
      xDiv: gateUp ? used : 1,
      sharedX0: gateUp ? 0 : nRouted,
      wOffsetBytes: offGate,
      upOffsetBytes: offUp,
      expertBytes: rowBytes * n,
      xStride: k,
      yStride: n,
    },
    used,
    ids,
    w,
    x: rng.normals(k * xRows),
  };
}

/** The groups moe_group must write: counts, then each group's ascending columns. */
function refGroups(c: Case): { counts: number[]; lists: number[][] } {
  const lists: number[][] = Array.from({ length: moeGroupCount(c.group) }, () => []);
  c.ids.forEach((e, col) => lists[e]!.push(col));
  if (c.group.shared) {
    for (let t = 0; t < c.group.nTokens; t++) lists[c.group.nExpert]!.push(c.group.nRouted + t);
  }
  return { counts: lists.map((l) => l.length), lists };
}

Deno.test("moe_group + grouped matmul and grouped mat-vec: experts' tokens grouped in column order, gate·up and down ≡ float64, every type", async () => {
  const rng = new Rng();
  const { device } = await testGpu();
  const cache = new PipelineCache(device);
  const max = device.limits.maxComputeWorkgroupStorageSize;
  const cases: Case[] = [];
  for (const [i, type] of QUANT_TYPES.entries()) {
    const shared = i % 2 === 0;
    const tokens = i % 3 === 0 ? rng.int(33, 150) : rng.int(1, 40);
    cases.push(makeCase(rng, type, true, shared, tokens), makeCase(rng, type, false, !shared, tokens));
  }
  // More groups than invocations (each sums four groups' tiles): tiles found past group 256, and empty groups.
  cases.push(
    makeCase(rng, "Q8_0", true, true, rng.int(20, 60), rng.int(600, 1023)),
    makeCase(rng, "IQ4_XS", false, false, rng.int(20, 60), rng.int(257, 700)),
  );
  // Both step widths where the device holds them (lavapipe: UNITS 2 only; else the check must refuse), and
  // the token-tile widths (UNITS 2) in turn over the cases, so each type's two cases meet two widths and each
  // width about seven cases (every width on every case cost this test a minute of lavapipe's shader compiles).
  const tiles = GROUPED_MATMUL_TILE_TOKENS;
  const variants = (s: GroupedMatmulShape, i: number): GroupedMatmulConstants[] =>
    [
      { ...groupedMatmulConstants(s), UNITS: 4, TT: 16 },
      { ...groupedMatmulConstants(s), UNITS: 2, TT: tiles[i % tiles.length]! },
    ].filter((c) => groupedMatmulWorkgroupBytes(c) <= max);
  const wide = cases.find((c) =>
    groupedMatmulWorkgroupBytes({ ...groupedMatmulConstants(c.shape), UNITS: 4, TT: 16 }) > max
  );
  if (wide) {
    await assert.rejects(
      prepareGroupedMatmul(cache, {
        device,
        shape: wide.shape,
        bindings: {
          params: device.createBuffer({ size: 256, usage: GPUBufferUsage.UNIFORM }),
          weights: upload(device, wide.w),
          x: upload(device, wide.x),
          y: upload(device, new Float32Array(wide.shape.n * (wide.shape.nRouted + wide.shape.cap))),
          groups: upload(device, new Uint32Array(moeGroupWords(wide.group))),
        },
        constants: { ...groupedMatmulConstants(wide.shape), UNITS: 4, TT: 16 },
      }),
      /workgroup memory/,
    );
  }
  // The grouped mat-vec (moe_gmv) over the same lists: the column counts per tile in turn at the default team
  // (CT 8, the default, at cases 7 and 15), and other teams and row counts (TEAM 4 ROWS 4: 256 rows per
  // workgroup; TEAM 64 ROWS 1).
  const gmvVariants = (s: GroupedMatmulShape, i: number): GroupedMatvecConstants[] => {
    const d = groupedMatvecConstants(s);
    const other = [{ ...d, TEAM: 4, ROWS: 4 }, { ...d, TEAM: 64, ROWS: 1 }, {
      ...d,
      TEAM: 8,
      ROWS: 3,
    }][i % 3]!;
    return [{ ...d, CT: 1 + (i % 8) }, { ...other, CT: 1 + ((i + 3) % 8) }];
  };
  const runs = [
    ...cases.flatMap((c, i) => variants(c.shape, i).map((v) => ({ ...c, v, gmv: undefined }))),
    ...cases.flatMap((c, i) => gmvVariants(c.shape, i).map((gmv) => ({ ...c, v: undefined, gmv }))),
  ];
  const groupPipeline = await cache.get(MOE_GROUP, {});
  const params = device.createBuffer({
    size: 256 * runs.length,
    usage: GPUBufferUsage.UNIFORM | GPUBufferUsage.COPY_DST,
  });
  const enc = device.createCommandEncoder();
  const pass = enc.beginComputePass();
  const outs: GPUBuffer[] = [];
  for (const [i, c] of runs.entries()) {
    const groupWords = moeGroupWords(c.group);
    const groups = poisoned(device, groupWords, 0xdeadbeef);
    const gb = {
      params: upload(device, moeGroupParams(c.group)),
      ids: upload(device, c.ids),
      groups: { buffer: groups, offset: 0, size: 4 * groupWords },
    };
    checkMoeGroup(c.group, gb);
    pass.setPipeline(groupPipeline);
    pass.setBindGroup(0, bindGroup(device, groupPipeline, [gb.params, gb.ids, gb.groups]));
    pass.dispatchWorkgroups(...moeGroupGrid(c.group));
    const cols = c.shape.nRouted + (c.shape.shared ? c.shape.cap : 0);
    const y = poisoned(device, c.shape.n * cols);
    device.queue.writeBuffer(params, 256 * i, groupedMatmulParams(c.shape));
    const bindings = {
      params: { buffer: params, offset: 256 * i, size: GROUPED_MATMUL_PARAMS_BYTES },
      weights: upload(device, c.w),
      x: upload(device, c.x),
      y: { buffer: y, offset: 0, size: 4 * c.shape.n * cols },
      groups: gb.groups,
    };
    const op = c.gmv
      ? await prepareGroupedMatvec(cache, { device, shape: c.shape, constants: c.gmv, bindings })
      : await prepareGroupedMatmul(cache, { device, shape: c.shape, constants: c.v, bindings });
    encodeGroupedMatmul(pass, op);
    outs.push(groups, y);
  }
  pass.end();
  device.queue.submit([enc.finish()]);
  const got = await readAll(device, outs);
  checkEach(runs, (c, i) => {
    const gateUp = c.shape.upOffsetBytes !== undefined;
    const what = `grouped ${c.shape.type} ${gateUp ? "gate·up" : "down"} k=${c.shape.k} n=${c.shape.n} ` +
      `experts=${c.group.nExpert} used=${c.used} tokens=${c.group.nTokens} shared=${c.group.shared} ` +
      (c.gmv
        ? `moe_gmv TEAM=${c.gmv.TEAM} ROWS=${c.gmv.ROWS} CT=${c.gmv.CT}`
        : `UNITS=${c.v!.UNITS} TT=${c.v!.TT}`);
    const words = new Uint32Array(got[2 * i]!);
    const { counts, lists } = refGroups(c);
    const nGroups = counts.length;
    assert.deepEqual([...words.subarray(0, nGroups)], counts, `${what}: counts`);
    lists.forEach((l, e) => {
      const at = nGroups + e * c.group.nTokens;
      assert.deepEqual([...words.subarray(at, at + l.length)], l, `${what}: group ${e}`);
    });
    const { ref, tol } = moeReference({
      shape: {
        type: c.shape.type,
        k: c.shape.k,
        n: c.shape.n,
        nExpert: c.group.nExpert,
        nCols: c.shape.nRouted,
        xDiv: c.shape.xDiv,
        offGateBytes: c.shape.wOffsetBytes,
        offUpBytes: c.shape.upOffsetBytes,
        gateUp,
        sharedCols: c.shape.shared ? c.shape.cap : 0,
      },
      ids: c.ids,
      w: c.w,
      x: c.x,
    });
    const y = new Float32Array(got[2 * i + 1]!, 0, ref.length);
    assertCloseEach(y, ref, tol, { atol: 0, rtol: 0 }, { what, seed: rng.seed });
    assertPoisoned(
      new Uint32Array(got[2 * i + 1]!, 4 * ref.length, GUARD_WORDS),
      POISON_F32,
      `${what} guard`,
    );
  });
});

Deno.test("grouped matmul and moe_group checks throw before encoding", () => {
  const big = Object.setPrototypeOf({ size: 1 << 20 }, GPUBuffer.prototype) as GPUBuffer;
  const small = Object.setPrototypeOf({ size: 16 }, GPUBuffer.prototype) as GPUBuffer;
  const shape: GroupedMatmulShape = {
    type: "Q8_0",
    k: 64,
    n: 40,
    nGroups: 5,
    shared: true,
    cap: 16,
    nRouted: 32,
    xDiv: 2,
    sharedX0: 0,
    wOffsetBytes: 0,
    upOffsetBytes: 40 * 68 * 5,
    expertBytes: 40 * 68,
    xStride: 64,
    yStride: 40,
  };
  const c = groupedMatmulConstants(shape);
  assert.deepEqual(c, { TYPE: 8, GATE_UP: true, UNITS: 2, TT: 16 });
  // Token tiles follow the routed experts' mean column count (tokens × 8 of 256 experts / 256).
  const tt = (nRouted: number) => groupedMatmulConstants({ ...shape, nGroups: 257, nRouted }).TT;
  assert.deepEqual([tt(64 * 8), tt(256 * 8), tt(512 * 8), tt(1024 * 8), tt(2048 * 8)], [16, 16, 32, 64, 64]);
  const b = { params: big, weights: big, x: big, y: big, groups: big };
  checkGroupedMatmul(shape, c, b);
  assert.throws(() => checkGroupedMatmul(shape, c, { ...b, groups: small }), /groups holds 16 bytes/);
  assert.throws(() => checkGroupedMatmul(shape, c, { ...b, y: small }), /binding y/);
  assert.throws(() => checkGroupedMatmul(shape, { ...c, GATE_UP: false }, b), /GATE_UP goes with/);
  assert.throws(() => checkGroupedMatmul(shape, { ...c, UNITS: 3 }, b), /UNITS=3/);
  assert.throws(() => checkGroupedMatmul(shape, { ...c, TT: 24 }, b), /TT=24 must be one of 16, 32, 64/);
  assert.throws(() => checkGroupedMatmul({ ...shape, nGroups: 1025 }, c, b), /nGroups/);
  assert.throws(() => checkGroupedMatmul({ ...shape, expertBytes: 68 }, c, b), /expertBytes/);
  assert.throws(() => checkGroupedMatmul({ ...shape, k: 48 }, c, b), /48/);
  const g: MoeGroupShape = { nRouted: 32, nTokens: 16, nExpert: 4, shared: true };
  assert.equal(moeGroupWords(g), 5 * 17);
  checkMoeGroup(g, { params: big, ids: big, groups: big });
  assert.throws(() => checkMoeGroup(g, { params: big, ids: small, groups: big }), /ids/);
  assert.throws(() => checkMoeGroup(g, { params: big, ids: big, groups: small }), /groups/);
});
