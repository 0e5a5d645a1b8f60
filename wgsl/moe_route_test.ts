import assert from "node:assert/strict";
import { PipelineCache } from "./kernel.ts";
import { moeRoute } from "../tests/ref/ops.ts";
import { INT8_D_RTOL, INT8_X_DRIFT } from "../tests/ref/forward.ts";
import { assertPoisoned } from "../tests/util/close.ts";
import { GUARD_WORDS, POISON_F32, poisoned, readAll, testGpu, upload } from "../tests/util/gpu.ts";
import { Rng } from "../tests/util/rng.ts";
import {
  encodeMoeRoute,
  MOE_ROUTE,
  moeRouteBindGroup,
  type MoeRouteConstants,
  moeWeightsScale,
} from "./moe_route.ts";
import { checkF32 } from "./_test_util.ts";
import { quantizeOnGpu } from "./_q8_testing.ts";
import { decodeQ8x, q8Layout } from "./matvec_q8.ts";
import type { GgmlTypeName } from "../engine/quant/types.ts";

/** f32 exp and a sum over <= 512 experts, then a ratio of two f32 sums: a few ulp relative. */
const TOL = { atol: 1e-7, rtol: 2e-6 };
const POISON_U32 = 0xffffffff;

interface Case {
  nExpert: number;
  nUsed: number;
  nTokens: number;
  wg: number;
  ties: boolean; // logits from a handful of values: many exact ties, also across the k-th place
  scale?: number;
}

Deno.test("moe_route: ids and weights match the reference, ties to the lower index", async () => {
  const rng = new Rng();
  const { device } = await testGpu();
  const cache = new PipelineCache(device);
  const cases: Case[] = [
    { nExpert: 8, nUsed: 2, nTokens: 1, wg: 64, ties: false }, // debug
    { nExpert: 256, nUsed: 8, nTokens: 3, wg: 256, ties: false }, // qwen35moe
    { nExpert: 256, nUsed: 8, nTokens: 16, wg: 256, ties: false }, // a batched step's widest (MAX_BATCH_SLOTS)
    { nExpert: 512, nUsed: 10, nTokens: 2, wg: 256, ties: false }, // qwen3next
    { nExpert: 256, nUsed: 8, nTokens: 4, wg: 128, ties: true },
    { nExpert: 100, nUsed: 7, nTokens: 2, wg: 64, ties: true, scale: 2.5 }, // not a multiple of WG
    { nExpert: 33, nUsed: 1, nTokens: 1, wg: 32, ties: true },
    { nExpert: 5, nUsed: 5, nTokens: 1, wg: 64, ties: true }, // all experts used
    { nExpert: rng.int(2, 600), nUsed: 0, nTokens: rng.int(1, 4), wg: 256, ties: rng.float() < 0.5 },
  ];
  const enc = device.createCommandEncoder();
  const pass = enc.beginComputePass();
  const runs: {
    k: Case;
    c: MoeRouteConstants;
    b: { logits: GPUBuffer; ids: GPUBuffer; weights: GPUBuffer; x: GPUBuffer; xq: GPUBuffer; nw: GPUBuffer };
    refIds: number[];
    refW: number[];
    x: Float32Array;
    xType: GgmlTypeName | undefined;
    kc: number;
  }[] = [];
  for (const k of cases) {
    const nUsed = k.nUsed || rng.int(1, Math.min(k.nExpert, 16) + 1);
    // Every other case also rounds each token's x to int8 (XQ), in a random weight type's byte order.
    const xType: GgmlTypeName | undefined = runs.length % 2 === 0
      ? (["Q8_0", "IQ4_XS"] as const)[rng.int(0, 2)]
      : undefined;
    const kc = rng.int(1, 80);
    // Every third case reads logits with a wider stride per token (a batched router's output, which keeps
    // the shared expert's gate logit after each token's expert logits).
    const col = runs.length % 3 === 1 ? k.nExpert + rng.int(1, 70) : k.nExpert;
    const c: MoeRouteConstants = {
      N_EXPERT: k.nExpert,
      N_EXPERT_USED: nUsed,
      WG: k.wg,
      W_SCALE: moeWeightsScale(k.scale),
      XQ: xType !== undefined,
      KC: xType ? kc : 1,
      LAYOUT: xType ? q8Layout(xType) : 0,
      NORM: false,
      EPS: 0,
      LOGITS_COL: col,
    };
    const x = rng.normals(32 * kc * k.nTokens, 10 ** rng.int(-2, 3));
    x.fill(0, 0, 32); // an all-zero chunk
    const logits = k.ties
      ? Float32Array.from({ length: col * k.nTokens }, () => rng.int(-3, 4) * 0.75)
      : rng.normals(col * k.nTokens, 3);
    const b = {
      logits: upload(device, logits),
      ids: poisoned(device, nUsed * k.nTokens, POISON_U32),
      weights: poisoned(device, nUsed * k.nTokens),
      x: upload(device, x),
      xq: poisoned(device, xType ? 9 * kc * k.nTokens : 1),
      nw: poisoned(device, 4),
    };
    const pipeline = await cache.get(MOE_ROUTE, c);
    const bg = moeRouteBindGroup(device, { pipeline, constants: c, nTokens: k.nTokens, buffers: b });
    encodeMoeRoute(pass, { pipeline, bindGroup: bg, constants: c, nTokens: k.nTokens });
    const refIds: number[] = [];
    const refW: number[] = [];
    for (let t = 0; t < k.nTokens; t++) {
      const r = moeRoute(logits.subarray(t * col, t * col + k.nExpert), {
        nUsed,
        weightsScale: k.scale,
      });
      refIds.push(...r.ids);
      refW.push(...r.weights);
    }
    runs.push({ k, c, b, refIds, refW, x, xType, kc });
  }
  pass.end();
  device.queue.submit([enc.finish()]);
  const outs = await readAll(device, runs.flatMap((r) => [r.b.ids, r.b.weights, r.b.xq]));
  for (const [i, r] of runs.entries()) {
    const what = `moe_route N_EXPERT=${r.c.N_EXPERT} N_EXPERT_USED=${r.c.N_EXPERT_USED} WG=${r.c.WG} ` +
      `LOGITS_COL=${r.c.LOGITS_COL} ` +
      `nTokens=${r.k.nTokens} ties=${r.k.ties}`;
    const n = r.refIds.length;
    const ids = new Uint32Array(outs[3 * i]!);
    assert.deepEqual(Array.from(ids.subarray(0, n)), r.refIds, `${what} (seed ${rng.seed}): ids`);
    assertPoisoned(ids.subarray(n, n + GUARD_WORDS), POISON_U32, `${what} (seed ${rng.seed}) ids`);
    checkF32(outs[3 * i + 1]!, r.refW, TOL, { what: `${what} weights`, seed: rng.seed });
    if (r.xType) {
      // XQ: each token's int8 x has the bits quantize_q8 gives it.
      const words = 9 * r.kc;
      const got = new Uint32Array(outs[3 * i + 2]!);
      for (let t = 0; t < r.k.nTokens; t++) {
        const { words: want } = await quantizeOnGpu(
          device,
          cache,
          r.xType,
          r.x.subarray(32 * r.kc * t, 32 * r.kc * (t + 1)),
        );
        assert.deepEqual(
          [...got.subarray(words * t, words * (t + 1))],
          [...want],
          `${what} XQ ${r.xType} K=${32 * r.kc} (seed ${rng.seed}): token ${t}'s int8 x`,
        );
      }
      assertPoisoned(
        got.subarray(words * r.k.nTokens, words * r.k.nTokens + GUARD_WORDS),
        POISON_F32,
        `${what} xq`,
      );
    }
    Object.values(r.b).forEach((buf) => buf.destroy());
  }
});

Deno.test("moe_route shape check throws before encoding", async () => {
  const { device } = await testGpu();
  const c: MoeRouteConstants = {
    N_EXPERT: 256,
    N_EXPERT_USED: 8,
    WG: 256,
    W_SCALE: 1,
    XQ: false,
    KC: 1,
    LAYOUT: 0,
    NORM: false,
    EPS: 0,
    LOGITS_COL: 256,
  };
  const pipeline = await new PipelineCache(device).get(MOE_ROUTE, c);
  const small = device.createBuffer({ size: 1024, usage: GPUBufferUsage.STORAGE });
  assert.throws(
    () =>
      moeRouteBindGroup(device, {
        pipeline,
        constants: c,
        nTokens: 2,
        buffers: { logits: small, ids: small, weights: small, x: small, xq: small, nw: small },
      }),
    /binding logits holds 1024 bytes but ne=\[256, 2\]/,
  );
  const big = device.createBuffer({ size: 4096, usage: GPUBufferUsage.STORAGE });
  assert.throws(
    () =>
      moeRouteBindGroup(device, {
        pipeline,
        constants: { ...c, XQ: true, KC: 64, LAYOUT: 1 },
        nTokens: 1,
        buffers: { logits: big, ids: small, weights: small, x: small, xq: big, nw: small },
      }),
    /binding x holds 1024 bytes but ne=\[2048, 1\]/,
  );
  big.destroy();
  assert.throws(
    () =>
      moeRouteBindGroup(device, {
        pipeline,
        constants: { ...c, N_EXPERT_USED: 300 },
        nTokens: 1,
        buffers: { logits: small, ids: small, weights: small, x: small, xq: small, nw: small },
      }),
    /N_EXPERT_USED must be an integer in \[1, 256\]/,
  );
  assert.throws(
    () =>
      moeRouteBindGroup(device, {
        pipeline,
        constants: { ...c, LOGITS_COL: 255 },
        nTokens: 1,
        buffers: { logits: small, ids: small, weights: small, x: small, xq: small, nw: small },
      }),
    /LOGITS_COL must be an integer in \[256, /,
  );
  assert.throws(
    () =>
      moeRouteBindGroup(device, {
        pipeline,
        constants: { ...c, NORM: true, EPS: 1e-6 },
        nTokens: 1,
        buffers: { logits: small, ids: small, weights: small, x: small, xq: small, nw: small },
      }),
    /NORM needs XQ/,
  );
  assert.equal(moeWeightsScale(undefined), 1);
  assert.equal(moeWeightsScale(0), 1);
  assert.equal(moeWeightsScale(2.5), 2.5);
  small.destroy();
});

Deno.test("moe_route NORM: x is the norm's input; logits scaled by each token's norm, its normed row rounded", async () => {
  const rng = new Rng();
  const { device } = await testGpu();
  const cache = new PipelineCache(device);
  const eps = 1e-6;
  // The 35B-A3B's shape over a batched step's 16 tokens, and qwen3next's 512 experts over 3; the router's
  // output keeps the shared expert's gate logit after each token's expert logits (LOGITS_COL N_EXPERT + 1).
  const cases = [
    { nExpert: 256, nUsed: 8, nTokens: 16, kc: 64, type: "IQ4_XS" },
    { nExpert: 512, nUsed: 10, nTokens: 3, kc: 16, type: "Q8_0" },
  ] as const;
  for (const k of cases) {
    const what = `moe_route NORM ${JSON.stringify(k)} (seed ${rng.seed})`;
    const col = k.nExpert + 1;
    const kdim = 32 * k.kc;
    const c: MoeRouteConstants = {
      N_EXPERT: k.nExpert,
      N_EXPERT_USED: k.nUsed,
      WG: 256,
      W_SCALE: 1,
      XQ: true,
      KC: k.kc,
      LAYOUT: q8Layout(k.type),
      NORM: true,
      EPS: eps,
      LOGITS_COL: col,
    };
    // Rows of very different scales (the norm must follow each token's own); logits a permutation of steps
    // 0.01 apart (no f32 rounding of the scaled logits can reorder or tie them), times a token's factor.
    const h = new Float32Array(kdim * k.nTokens);
    for (let t = 0; t < k.nTokens; t++) h.set(rng.normals(kdim, 10 ** rng.int(-1, 2)), t * kdim);
    const nw = rng.normals(kdim);
    const logits = new Float32Array(col * k.nTokens);
    for (let t = 0; t < k.nTokens; t++) {
      const perm = Array.from({ length: col }, (_, i) => i).sort(() => rng.float() - 0.5);
      const f = 0.5 + rng.float();
      for (let e = 0; e < col; e++) logits[t * col + e] = f * (perm[e]! - col / 2) * 0.01;
    }
    const b = {
      logits: upload(device, logits),
      ids: poisoned(device, k.nUsed * k.nTokens, POISON_U32),
      weights: poisoned(device, k.nUsed * k.nTokens),
      x: upload(device, h),
      xq: poisoned(device, 9 * k.kc * k.nTokens),
      nw: upload(device, nw),
    };
    const pipeline = await cache.get(MOE_ROUTE, c);
    const enc = device.createCommandEncoder();
    const pass = enc.beginComputePass();
    const bindGroup = moeRouteBindGroup(device, { pipeline, constants: c, nTokens: k.nTokens, buffers: b });
    encodeMoeRoute(pass, { pipeline, bindGroup, constants: c, nTokens: k.nTokens });
    pass.end();
    device.queue.submit([enc.finish()]);
    const [idsB, wB, lB, xqB] = await readAll(device, [b.ids, b.weights, b.logits, b.xq]);
    const ids = new Uint32Array(idsB!);
    const refW: number[] = [];
    const lGot = new Float32Array(lB!);
    for (let t = 0; t < k.nTokens; t++) {
      const row = h.subarray(t * kdim, (t + 1) * kdim);
      let ss = 0;
      for (const v of row) ss += v * v;
      const s = 1 / Math.sqrt(ss / kdim + eps);
      const scaled = Array.from(logits.subarray(t * col, t * col + k.nExpert), (v) => v * s);
      const r = moeRoute(scaled, { nUsed: k.nUsed });
      assert.deepEqual(
        Array.from(ids.subarray(t * k.nUsed, (t + 1) * k.nUsed)),
        r.ids,
        `${what}: token ${t}'s experts`,
      );
      refW.push(...r.weights);
      // The expert logits stay as the router wrote them; the shared expert's gate logit is scaled in place.
      for (let e = 0; e < k.nExpert; e++) {
        assert.equal(lGot[t * col + e], logits[t * col + e], `${what}: token ${t}'s logit ${e} untouched`);
      }
      const gam = logits[t * col + k.nExpert]! * s;
      assert.ok(
        Math.abs(lGot[t * col + k.nExpert]! - gam) <= 1e-5 * Math.abs(gam) + 1e-30,
        `${what}: token ${t}'s shared gate logit ${lGot[t * col + k.nExpert]}, want ${gam}`,
      );
      // The int8 row: every chunk's scale and values as the reference's normed row rounds, within the drift the
      // forward test allows an engine's x (tests/ref/forward.ts).
      const xn = Float64Array.from(row, (v, i) => v * s * nw[i]!);
      const words = new Uint8Array(xqB!, 4 * 9 * k.kc * t, 4 * 9 * k.kc);
      const { q, d } = decodeQ8x(k.type, kdim, words);
      let rowMax = 0;
      for (const v of xn) rowMax = Math.max(rowMax, Math.abs(v));
      const drift = INT8_X_DRIFT * rowMax;
      for (let ch = 0; ch < k.kc; ch++) {
        let amax = 0;
        for (let i = 32 * ch; i < 32 * ch + 32; i++) amax = Math.max(amax, Math.abs(xn[i]!));
        assert.ok(
          Math.abs(d[ch]! - amax / 127) <= (INT8_D_RTOL * amax + drift) / 127,
          `${what}: token ${t} chunk ${ch} scale ${d[ch]}, want ${amax / 127}`,
        );
        for (let i = 32 * ch; i < 32 * ch + 32; i++) {
          assert.ok(
            Math.abs(xn[i]! / d[ch]! - q[i]!) <= 0.5 + drift / d[ch]!,
            `${what}: token ${t} element ${i} is ${q[i]}, x/d = ${xn[i]! / d[ch]!}`,
          );
        }
      }
    }
    checkF32(wB!, refW, TOL, { what: `${what} weights`, seed: rng.seed });
    assertPoisoned(
      new Uint32Array(xqB!, 4 * 9 * k.kc * k.nTokens, GUARD_WORDS),
      POISON_F32,
      `${what}: xq guard`,
    );
    Object.values(b).forEach((buf) => buf.destroy());
  }
});
