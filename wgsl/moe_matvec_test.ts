import { bindGroup, PipelineCache } from "./kernel.ts";
import { type GgmlTypeName, typeInfo } from "../engine/quant/types.ts";
import {
  checkMoeMatvec,
  MOE_MATVEC,
  MOE_MATVEC_BINDINGS,
  type MoeMatvecBindings,
  type MoeMatvecConstants,
  moeMatvecConstants,
  moeMatvecGrid,
  moeMatvecParams,
  moeMatvecSameBits,
  type MoeMatvecShape,
  type MoeMatvecTuning,
} from "./moe_matvec.ts";
import { randomWeights } from "./_quant_testing.ts";
import { moeReference } from "./_moe_testing.ts";
import { QUANT_TYPES } from "./_quant.ts";
import { checkF32 } from "./_test_util.ts";
import { poisoned, readAll, testGpu, upload } from "../tests/util/gpu.ts";
import { Rng } from "../tests/util/rng.ts";
import { moeRoute } from "../tests/ref/ops.ts";
import { assertPoisoned } from "../tests/util/close.ts";
import { GUARD_WORDS, POISON_F32 } from "../tests/util/gpu.ts";
import assert from "node:assert/strict";

interface Case {
  shape: MoeMatvecShape;
  ids: Uint32Array;
  w: Uint8Array;
  x: Float32Array;
}

function makeCase(
  rng: Rng,
  type: GgmlTypeName,
  gateUp: boolean,
  withShared: boolean,
  dims?: { k: number; n: number },
): Case {
  const be = Math.max(32, typeInfo(type).blockElems);
  const k = dims?.k ?? be * rng.int(1, 3);
  const n = dims?.n ?? rng.int(1, 40);
  const nExpert = rng.int(2, 9);
  const used = rng.int(1, 4);
  const tokens = rng.int(1, 4);
  const nCols = used * tokens;
  const sharedCols = withShared ? tokens : 0;
  // The shared expert, when present, is matrix index nExpert right after the routed ones.
  const nMats = nExpert + (withShared ? 1 : 0);
  const expertBytes = (k / typeInfo(type).blockElems) * typeInfo(type).blockBytes * n * nMats;
  const offGate = 4 * rng.int(0, 8);
  const offUp = gateUp ? Math.ceil((offGate + expertBytes) / 4) * 4 + 4 * rng.int(0, 8) : undefined;
  const total = (offUp ?? offGate) + expertBytes;
  const w = new Uint8Array(total);
  w.set(randomWeights(rng, type, k, n * nMats, 0.1), offGate);
  if (offUp !== undefined) w.set(randomWeights(rng, type, k, n * nMats, 0.1), offUp);
  const ids = Uint32Array.from({ length: nCols }, () => rng.int(0, nExpert));
  const xDiv = gateUp ? used : 1;
  const x = rng.normals(k * (gateUp ? nCols / xDiv : nCols + sharedCols));
  return {
    shape: { type, k, n, nExpert, nCols, xDiv, offGateBytes: offGate, offUpBytes: offUp, gateUp, sharedCols },
    ids,
    w,
    x,
  };
}

/** Checks one dispatch's shape and bindings, then records it into `pass`. */
async function encode(
  pass: GPUComputePassEncoder,
  device: GPUDevice,
  cache: PipelineCache,
  shape: MoeMatvecShape,
  consts: MoeMatvecConstants,
  b: MoeMatvecBindings,
): Promise<void> {
  checkMoeMatvec(shape, consts, b);
  const p = await cache.get(MOE_MATVEC, consts);
  pass.setPipeline(p);
  pass.setBindGroup(0, bindGroup(device, p, MOE_MATVEC_BINDINGS.map((n) => b[n])));
  pass.dispatchWorkgroups(...moeMatvecGrid(shape, consts));
}

Deno.test("moe_matvec: routed experts by GPU ids, gate·up with silu and plain down, every type", async () => {
  const rng = new Rng();
  const { device } = await testGpu();
  const cache = new PipelineCache(device);
  const cases: Case[] = [];
  for (const type of QUANT_TYPES) {
    const shared = rng.u32() % 2 === 0;
    cases.push(makeCase(rng, type, true, shared), makeCase(rng, type, false, !shared));
  }
  const enc = device.createCommandEncoder();
  const pass = enc.beginComputePass();
  const outs: GPUBuffer[] = [];
  for (const [i, c] of cases.entries()) {
    // ROWS 1..4 in turn (each type's gate·up and down share one), so every vec4 width of the row sums runs;
    // every other type with the prefill TEAM (half the decode one).
    const consts = {
      ...moeMatvecConstants(c.shape, undefined, undefined, (i >> 1) % 2 === 1),
      ROWS: [1, 3, 2, 4][(i >> 1) % 4]!,
    };
    const cols = c.shape.nCols + (c.shape.sharedCols ?? 0);
    const y = poisoned(device, c.shape.n * cols);
    outs.push(y);
    const b = {
      params: upload(device, moeMatvecParams(c.shape)),
      ids: upload(device, c.ids),
      weights: upload(device, c.w),
      x: upload(device, c.x),
      y: { buffer: y, size: 4 * c.shape.n * cols },
      // Without ROUTE: stand-ins (read: any buffer; read_write: one bound nowhere else).
      logits: upload(device, c.x),
      routeWeights: poisoned(device, 1),
    };
    await encode(pass, device, cache, c.shape, consts, b);
  }
  pass.end();
  device.queue.submit([enc.finish()]);
  const got = await readAll(device, outs);
  cases.forEach((c, i) => {
    const { ref, tol } = moeReference(c);
    const what =
      `moe_matvec ${c.shape.type} ${c.shape.gateUp ? "gate·up" : "down"} k=${c.shape.k} n=${c.shape.n} ` +
      `ids=${[...c.ids]} shared=${c.shape.sharedCols}`;
    // Per-element tolerance: compare |got-ref| against tol by scaling into assertClose's form.
    const g = new Float32Array(got[i]!, 0, ref.length);
    const scaled = Float64Array.from(g, (v, j) => (v - ref[j]!) / tol[j]!);
    checkF32(
      Float32Array.from(scaled).buffer,
      new Float64Array(ref.length),
      { atol: 1, rtol: 0 },
      { what, seed: rng.seed, guard: false },
    );
    checkF32(got[i]!, ref, { atol: Infinity, rtol: 0 }, { what: `${what} guard`, seed: rng.seed });
  });
});

Deno.test("moe_matvec ROUTE: the gate·up pass routes in its prologue (ids, weights out) and uses its picks", async () => {
  const rng = new Rng();
  const { device } = await testGpu();
  const cache = new PipelineCache(device);
  const cases: { c: Case; logits: Float32Array; wScale: number; ids: Uint32Array; weights: Float64Array }[] =
    [];
  for (const type of ["IQ4_XS", "Q8_0", "F32"] as GgmlTypeName[]) {
    for (const shared of [false, true]) {
      let c = makeCase(rng, type, true, shared);
      while (c.shape.xDiv > c.shape.nExpert) c = makeCase(rng, type, true, shared); // routing needs used ≤ experts
      const used = c.shape.xDiv;
      const tokens = c.shape.nCols / used;
      const logits = rng.normals(c.shape.nExpert * tokens, 2);
      logits[1] = logits[0]!; // a tie: the lower index wins
      const wScale = shared ? 2.5 : 1;
      const ids: number[] = [];
      const weights: number[] = [];
      for (let t = 0; t < tokens; t++) {
        const r = moeRoute(logits.subarray(t * c.shape.nExpert, (t + 1) * c.shape.nExpert), {
          nUsed: used,
          weightsScale: wScale,
        });
        ids.push(...r.ids);
        weights.push(...r.weights);
      }
      // The kernel must route itself: the ids buffer starts poisoned, the reference uses the true picks.
      cases.push({
        c: { ...c, ids: Uint32Array.from(ids) },
        logits,
        wScale,
        ids: Uint32Array.from(ids),
        weights: Float64Array.from(weights),
      });
    }
  }
  const enc = device.createCommandEncoder();
  const pass = enc.beginComputePass();
  const outs: GPUBuffer[] = [];
  for (const { c, logits, wScale } of cases) {
    const consts = moeMatvecConstants(c.shape, {
      nExpert: c.shape.nExpert,
      nExpertUsed: c.shape.xDiv,
      wScale,
    });
    const cols = c.shape.nCols + (c.shape.sharedCols ?? 0);
    const y = poisoned(device, c.shape.n * cols);
    const ids = poisoned(device, c.shape.nCols, 0xFFFFFFFF);
    const rw = poisoned(device, c.shape.nCols);
    outs.push(y, ids, rw);
    const b = {
      params: upload(device, moeMatvecParams(c.shape)),
      ids: { buffer: ids, size: 4 * c.shape.nCols },
      weights: upload(device, c.w),
      x: upload(device, c.x),
      y: { buffer: y, size: 4 * c.shape.n * cols },
      logits: upload(device, logits),
      routeWeights: { buffer: rw, size: 4 * c.shape.nCols },
    };
    await encode(pass, device, cache, c.shape, consts, b);
  }
  pass.end();
  device.queue.submit([enc.finish()]);
  const got = await readAll(device, outs);
  cases.forEach(({ c, ids, weights }, i) => {
    const what = `moe_matvec ROUTE ${c.shape.type} experts=${c.shape.nExpert} used=${c.shape.xDiv} ` +
      `cols=${c.shape.nCols} shared=${c.shape.sharedCols} (seed ${rng.seed})`;
    assert.deepEqual([...new Uint32Array(got[3 * i + 1]!, 0, ids.length)], [...ids], `${what}: ids`);
    assertPoisoned(
      new Uint32Array(got[3 * i + 1]!, 4 * ids.length, GUARD_WORDS),
      0xFFFFFFFF,
      `${what}: ids guard`,
    );
    checkF32(got[3 * i + 2]!, weights, { atol: 1e-7, rtol: 1e-5 }, {
      what: `${what}: weights`,
      seed: rng.seed,
    });
    const { ref, tol } = moeReference(c);
    const g = new Float32Array(got[3 * i]!, 0, ref.length);
    const bad = [...g].findIndex((v, j) => !(Math.abs(v - ref[j]!) <= tol[j]!));
    assert.equal(bad, -1, `${what}: y[${bad}] = ${g[bad]}, want ${ref[bad]} ± ${tol[bad]}`);
    assertPoisoned(new Uint32Array(got[3 * i]!, 4 * ref.length, GUARD_WORDS), POISON_F32, `${what}: y guard`);
  });
});

Deno.test("moe_matvec constants: prefill halves TEAM and takes ROWS 4; decode and ROUTE keep theirs", () => {
  const shape: MoeMatvecShape = {
    type: "IQ4_XS",
    k: 2048,
    n: 512,
    nExpert: 256,
    nCols: 2048,
    xDiv: 8,
    offGateBytes: 0,
    gateUp: true,
  };
  const dec = moeMatvecConstants(shape);
  const pre = moeMatvecConstants(shape, undefined, undefined, true);
  assert.deepEqual([dec.TEAM, dec.ROWS, pre.TEAM, pre.ROWS], [64, 2, 32, 4]);
  const route = { nExpert: 256, nExpertUsed: 8, wScale: 1 };
  assert.equal(moeMatvecConstants(shape, route, undefined, true).TEAM, 64);
  assert.equal(moeMatvecConstants({ ...shape, k: 32 }, undefined, undefined, true).TEAM, 1);
});

Deno.test("moe_matvec ROWS, BLOCKS, UNROLL, WG keep the bits; SHARED_T (decode once) is right", async () => {
  const rng = new Rng();
  const { device } = await testGpu();
  const cache = new PipelineCache(device);
  // Long rows (units past 4·TEAM and a tail, so UNROLL 4's loop and both remainders run) and N not a
  // multiple of the workgroup's rows, so the last group of blocks clamps; IQ4_XS (its table) and Q8_0 (short
  // blocks: K = 32·9 gives invocations 5 units and 4, a step of 4 and a single).
  const cases: Case[] = [];
  for (const type of ["IQ4_XS", "Q8_0"] as GgmlTypeName[]) {
    for (const gateUp of [true, false]) {
      const k = type === "Q8_0" ? 32 * 9 : 256 * (gateUp ? 3 : 1);
      cases.push(makeCase(rng, type, gateUp, true, { k, n: rng.int(40, 70) }));
    }
  }
  // Tunings at the default TEAM (rows 0: the default's), each checked against the float64 reference (`of`
  // -1) or word for word against an earlier one's output (`of` its index). SHARED_T rounds differently on
  // lavapipe (which products a driver fuses into FMAs follows the code's shape), so only the reference
  // checks it.
  const variants: { t: Omit<MoeMatvecTuning, "team">; of: number }[] = [
    { t: { rows: 0 }, of: -1 },
    { t: { rows: 1, blocks: 3, wg: 64 }, of: 0 },
    { t: { rows: 3, blocks: 8, unroll: 4, wg: 128 }, of: 0 },
    { t: { rows: 1, blocks: 2, unroll: 4, sharedOnce: true }, of: -1 },
  ];
  const enc = device.createCommandEncoder();
  const pass = enc.beginComputePass();
  const outs: GPUBuffer[] = [];
  for (const c of cases) {
    const cols = c.shape.nCols + (c.shape.sharedCols ?? 0);
    const ins = {
      params: upload(device, moeMatvecParams(c.shape)),
      ids: upload(device, c.ids),
      weights: upload(device, c.w),
      x: upload(device, c.x),
      logits: upload(device, c.x),
    };
    const def = moeMatvecConstants(c.shape);
    const all = variants.map(({ t }) =>
      moeMatvecConstants(c.shape, undefined, { ...t, team: def.TEAM, rows: t.rows || def.ROWS })
    );
    for (const [v, consts] of all.entries()) {
      const of = variants[v]!.of;
      if (of >= 0) assert.ok(moeMatvecSameBits(consts, all[of]!), `variant ${v} has the bits of ${of}`);
      assert.equal(consts.SHARED_T, variants[v]!.t.sharedOnce ? c.shape.sharedCols : 0);
      const y = poisoned(device, c.shape.n * cols);
      outs.push(y);
      await encode(pass, device, cache, c.shape, consts, {
        ...ins,
        y: { buffer: y, size: 4 * c.shape.n * cols },
        routeWeights: poisoned(device, 1),
      });
    }
  }
  pass.end();
  device.queue.submit([enc.finish()]);
  const got = await readAll(device, outs);
  const per = variants.length;
  cases.forEach((c, i) => {
    const what = `moe_matvec ${c.shape.type} ${c.shape.gateUp ? "gate·up" : "down"} k=${c.shape.k} ` +
      `n=${c.shape.n} ids=${[...c.ids]} shared=${c.shape.sharedCols} (seed ${rng.seed})`;
    const { ref, tol } = moeReference(c);
    for (const [v, { t, of }] of variants.entries()) {
      const out = got[i * per + v]!;
      if (of < 0) {
        const g = new Float32Array(out, 0, ref.length);
        const bad = [...g].findIndex((x, j) => !(Math.abs(x - ref[j]!) <= tol[j]!));
        assert.equal(
          bad,
          -1,
          `${what} ${JSON.stringify(t)}: y[${bad}] = ${g[bad]}, want ${ref[bad]} ± ${tol[bad]}`,
        );
        assertPoisoned(new Uint32Array(out, 4 * ref.length, GUARD_WORDS), POISON_F32, `${what}: y guard`);
        continue;
      }
      // Word for word, guard band included.
      const bits = new Uint32Array(got[i * per + of]!);
      const other = new Uint32Array(out);
      const diff = bits.findIndex((b, j) => b !== other[j]);
      assert.equal(
        diff,
        -1,
        `${what} ${JSON.stringify(t)}: word ${diff} is ${other[diff]?.toString(16)}, ` +
          `${JSON.stringify(variants[of]!.t)} gave ${bits[diff]?.toString(16)}`,
      );
    }
  });
});
