import assert from "node:assert/strict";
import { checkEach } from "./_test_util.ts";
import { bindGroup, PipelineCache } from "./kernel.ts";
import { type GgmlTypeName, typeInfo } from "../engine/quant/types.ts";
import { Rng } from "../tests/util/rng.ts";
import { assertPoisoned } from "../tests/util/close.ts";
import { GUARD_WORDS, POISON_F32, poisoned, readAll, testGpu, upload } from "../tests/util/gpu.ts";
import { assertDotClose, randomWeights, refProduct } from "./_quant_testing.ts";
import { QUANT_TYPES } from "./_quant.ts";
import {
  checkMatmul,
  encodeMatmul,
  MATMUL_PARAMS_BYTES,
  MATMUL_SPLITS,
  MATMUL_THREAD_TILES,
  type MatmulConstants,
  matmulConstants,
  matmulDefaultSplits,
  matmulParams,
  matmulPlan,
  type MatmulShape,
  matmulSplits,
  matmulSplitsGrid,
  matmulSplitsParams,
  matmulWorkgroupBytes,
  prepareMatmul,
} from "./matmul.ts";

/**
 * The cases of one type and tile (16·TR rows × 16·TT tokens): debug, odd N and M around the tile, a slice
 * with offsets, a random shape.
 */
function cases(rng: Rng, type: GgmlTypeName, [tr, tt]: readonly [number, number]): MatmulShape[] {
  const be = Math.max(32, typeInfo(type).blockElems);
  return [
    { type, k: be, n: 1, m: 1 }, // debug: one block, one row, one token
    { type, k: 2 * be, n: 13, m: 7 },
    { type, k: be, n: 16 * tr + 1, m: 33 }, // one row past a tile
    { type, k: be, n: 3, m: 16 * tt + 6 }, // tokens past a tile
    // A slice: rows at a byte offset, tokens with offsets and padded strides.
    {
      type,
      k: be,
      n: 5,
      m: 3,
      wOffsetBytes: 4 * rng.int(1, 40),
      xOffset: 4,
      xStride: be + 8,
      yOffset: 5,
      yStride: 9,
    },
    { type, k: be * rng.int(1, 4), n: rng.int(1, 40 * tr), m: rng.int(1, 20 * tt) }, // random
  ];
}

/** Every TR × TT variant; those whose workgroup memory the device lacks are checked to throw instead. */
const TILES = MATMUL_THREAD_TILES.flatMap((tr) => MATMUL_THREAD_TILES.map((tt) => [tr, tt] as const));

Deno.test("matmul matches the float64 reference for every type and odd N, M", async () => {
  const rng = new Rng();
  const { device } = await testGpu();
  const cache = new PipelineCache(device);
  const max = device.limits.maxComputeWorkgroupStorageSize;
  const all: { s: MatmulShape; c: MatmulConstants }[] = [];
  for (const type of QUANT_TYPES) {
    for (const tile of TILES) {
      const c = matmulConstants({ type, k: 32, n: 1, m: 1 }, { tile });
      if (matmulWorkgroupBytes(c) <= max) {
        all.push(...cases(rng, type, tile).map((s) => ({ s, c })));
        continue;
      }
      // Too big for this device: prepareMatmul must say so rather than fail at pipeline creation.
      const s: MatmulShape = { type, k: 256, n: 1, m: 1 };
      const buf = device.createBuffer({ size: 4096, usage: GPUBufferUsage.STORAGE | GPUBufferUsage.UNIFORM });
      await assert.rejects(
        prepareMatmul(cache, {
          device,
          shape: s,
          constants: c,
          bindings: { params: buf, weights: buf, x: buf, y: buf },
        }),
        /workgroup memory/,
      );
      buf.destroy();
    }
  }
  const params = device.createBuffer({
    size: 256 * all.length,
    usage: GPUBufferUsage.UNIFORM | GPUBufferUsage.COPY_DST,
  });
  const created: GPUBuffer[] = [params];
  const checks: {
    s: MatmulShape;
    c: MatmulConstants;
    y: GPUBuffer;
    ref: Float64Array;
    mag: Float64Array;
    yWords: number;
  }[] = [];
  const enc = device.createCommandEncoder();
  const pass = enc.beginComputePass();
  for (const [i, { s, c }] of all.entries()) {
    const bytes = randomWeights(rng, s.type, s.k, s.n);
    const wOff = s.wOffsetBytes ?? 0;
    const wAll = new Uint8Array(wOff + bytes.length + 4);
    wAll.set(bytes, wOff);
    const xStride = s.xStride ?? s.k;
    const xOff = s.xOffset ?? 0;
    const xDense = rng.normals(s.k * s.m);
    const xAll = new Float32Array(xOff + xStride * s.m).fill(Number.NaN); // gaps must not be read
    for (let m = 0; m < s.m; m++) xAll.set(xDense.subarray(m * s.k, (m + 1) * s.k), xOff + m * xStride);
    const yStride = s.yStride ?? s.n;
    const yOff = s.yOffset ?? 0;
    const yWords = yOff + yStride * (s.m - 1) + s.n;
    const wBuf = upload(device, wAll, "weights");
    const xBuf = upload(device, xAll, "x");
    const yBuf = poisoned(device, yWords);
    created.push(wBuf, xBuf, yBuf);
    device.queue.writeBuffer(params, 256 * i, matmulParams(s));
    const op = await prepareMatmul(cache, {
      device,
      shape: s,
      constants: c,
      bindings: {
        params: { buffer: params, offset: 256 * i, size: MATMUL_PARAMS_BYTES },
        weights: wBuf,
        x: xBuf,
        y: { buffer: yBuf, offset: 0, size: 4 * yWords },
      },
    });
    encodeMatmul(pass, op);
    checks.push({
      s,
      c,
      y: yBuf,
      yWords,
      ...refProduct(s.type, bytes, { k: s.k, n: s.n, cols: s.m, x: xDense }),
    });
  }
  pass.end();
  device.queue.submit([enc.finish()]);
  const outs = await readAll(device, checks.map((k) => k.y));
  created.forEach((b) => b.destroy());
  checkEach(checks, ({ s, c, ref, mag, yWords }, i) => {
    const what = `matmul ${s.type} ne=[${s.k}, ${s.n}] M=${s.m} ${JSON.stringify(c)}`;
    const buf = outs[i]!;
    const f = new Float32Array(buf);
    const got = new Float32Array(s.n * s.m);
    const yStride = s.yStride ?? s.n;
    const yOff = s.yOffset ?? 0;
    for (let m = 0; m < s.m; m++) {
      got.set(f.subarray(yOff + m * yStride, yOff + m * yStride + s.n), m * s.n);
      const gap = m + 1 < s.m ? yStride - s.n : 0;
      assertPoisoned(
        new Uint32Array(buf, 4 * (yOff + m * yStride + s.n), gap),
        POISON_F32,
        `${what} gap ${m}`,
      );
    }
    assertDotClose(got, ref, mag, { what, seed: rng.seed });
    assertPoisoned(new Uint32Array(buf, 4 * yWords, GUARD_WORDS), POISON_F32, `${what} (seed ${rng.seed})`);
    assertPoisoned(new Uint32Array(buf, 0, yOff), POISON_F32, `${what} head (seed ${rng.seed})`);
  });
});

Deno.test("matmul shape check throws before encoding", () => {
  const big = Object.setPrototypeOf({ size: 1 << 20 }, GPUBuffer.prototype) as GPUBuffer;
  const small = Object.setPrototypeOf({ size: 16 }, GPUBuffer.prototype) as GPUBuffer;
  const shape: MatmulShape = { type: "Q6_K", k: 512, n: 4, m: 3 };
  const b = { params: big, weights: big, x: big, y: big };
  const c = matmulConstants(shape);
  assert.throws(() => checkMatmul({ ...shape, k: 300 }, c, b), /K=300/);
  assert.throws(() => checkMatmul({ ...shape, m: 0 }, c, b), /m must be/);
  assert.throws(() => checkMatmul({ ...shape, xStride: 510 }, c, b), /stride/);
  assert.throws(() => checkMatmul(shape, c, { ...b, y: small }), /binding y/);
  assert.throws(() => checkMatmul(shape, { ...c, TYPE: 23 }, b), /TYPE=23/);
  assert.throws(() => checkMatmul(shape, { ...c, TR: 6 }, b), /TR=6/);
  // Defaults: 8 × 8 only with enough workgroups and workgroup memory.
  const qkv: MatmulShape = { type: "IQ4_XS", k: 2048, n: 8192, m: 256 };
  assert.deepEqual(matmulConstants(qkv, { maxWorkgroupBytes: 49152 }), {
    TYPE: 23,
    TR: 8,
    TT: 8,
  });
  assert.deepEqual(matmulConstants(qkv, { maxWorkgroupBytes: 32768 }), {
    TYPE: 23,
    TR: 4,
    TT: 4,
  });
  assert.deepEqual(matmulConstants({ ...qkv, n: 4096 }, { maxWorkgroupBytes: 49152 }), {
    TYPE: 23,
    TR: 4,
    TT: 4,
  });
  assert.throws(() => checkMatmul({ ...shape, n: 16 * 8 * 65536 }, { ...c, TR: 8 }, b), /workgroups/);
});

/** A uniform buffer holding `words`. */
function uniform(device: GPUDevice, words: Uint32Array): GPUBuffer {
  const buf = device.createBuffer({
    size: words.byteLength,
    usage: GPUBufferUsage.UNIFORM,
    mappedAtCreation: true,
  });
  new Uint32Array(buf.getMappedRange()).set(words);
  buf.unmap();
  return buf;
}

Deno.test("split-K matmul and matmul_splits match the float64 reference for every type", async () => {
  const rng = new Rng();
  const { device } = await testGpu();
  const cache = new PipelineCache(device);
  const max = device.limits.maxComputeWorkgroupStorageSize;
  const sumPipe = await cache.get(MATMUL_SPLITS, {});
  const created: GPUBuffer[] = [];
  const checks: { what: string; y: GPUBuffer; s: MatmulShape; ref: Float64Array; mag: Float64Array }[] = [];
  const enc = device.createCommandEncoder();
  const pass = enc.beginComputePass();
  for (const type of QUANT_TYPES) {
    for (const tile of [[4, 4], [8, 8]] as const) {
      const c = matmulConstants({ type, k: 32, n: 1, m: 1 }, { tile });
      if (matmulWorkgroupBytes(c) > max) continue;
      const be = Math.max(32, typeInfo(type).blockElems);
      const k = be * Math.ceil(224 / be); // 7 chunks or more: runs of unequal length
      const splits = rng.int(2, 5);
      const s: MatmulShape = { type, k, n: rng.int(1, 40 * tile[0]), m: rng.int(1, 20 * tile[1]), splits };
      const yStride = s.n + rng.int(0, 3);
      const yOffset = rng.int(0, 5);
      const bytes = randomWeights(rng, type, k, s.n);
      const xDense = rng.normals(k * s.m);
      const runs = matmulSplits(s).splits;
      const wBuf = upload(device, bytes, "weights");
      const xBuf = upload(device, xDense, "x");
      const part = poisoned(device, runs * s.n * s.m);
      const yWords = yOffset + yStride * (s.m - 1) + s.n;
      const yBuf = poisoned(device, yWords);
      const pm = uniform(device, matmulParams(s));
      const final: MatmulShape = { ...s, splits, yOffset, yStride };
      const ps = uniform(device, matmulSplitsParams(final));
      created.push(wBuf, xBuf, part, yBuf, pm, ps);
      const op = await prepareMatmul(cache, {
        device,
        shape: s,
        constants: c,
        bindings: { params: pm, weights: wBuf, x: xBuf, y: part },
      });
      assert.equal(op.grid[2], runs);
      encodeMatmul(pass, op);
      pass.setPipeline(sumPipe);
      pass.setBindGroup(0, bindGroup(device, sumPipe, [ps, part, yBuf]));
      pass.dispatchWorkgroups(...matmulSplitsGrid(final));
      checks.push({
        what: `split matmul ${type} ${
          JSON.stringify(c)
        } ne=[${k}, ${s.n}] M=${s.m} splits=${splits} (${runs} runs)`,
        y: yBuf,
        s: final,
        ...refProduct(type, bytes, { k, n: s.n, cols: s.m, x: xDense }),
      });
    }
  }
  pass.end();
  device.queue.submit([enc.finish()]);
  const outs = await readAll(device, checks.map((k) => k.y));
  created.forEach((b) => b.destroy());
  for (const [i, { what, s, ref, mag }] of checks.entries()) {
    const f = new Float32Array(outs[i]!);
    const got = new Float32Array(s.n * s.m);
    for (let m = 0; m < s.m; m++) {
      const at = s.yOffset! + m * s.yStride!;
      got.set(f.subarray(at, at + s.n), m * s.n);
      assertPoisoned(
        new Uint32Array(outs[i]!, 4 * (at + s.n), m + 1 < s.m ? s.yStride! - s.n : 0),
        POISON_F32,
        what,
      );
    }
    assertPoisoned(new Uint32Array(outs[i]!, 0, s.yOffset!), POISON_F32, `${what} head`);
    assertDotClose(got, ref, mag, { what, seed: rng.seed });
  }
  assert.ok(checks.length >= QUANT_TYPES.length, "every type ran split");
});

Deno.test("matmul splits: runs cover K with none empty; the engine splits only small N", () => {
  for (const [k, splits, cps, runs] of [[256, 3, 3, 3], [224, 3, 3, 3], [64, 5, 1, 2], [96, 1, 3, 1]]) {
    assert.deepEqual(matmulSplits({ type: "F32", k: k!, n: 1, m: 1, splits }), {
      chunksPerSplit: cps,
      splits: runs,
    });
  }
  assert.equal(matmulDefaultSplits({ type: "F32", k: 2048, n: 8192, m: 256 }), 1);
  assert.equal(matmulDefaultSplits({ type: "F32", k: 2048, n: 32, m: 256 }), 64);
  assert.equal(matmulDefaultSplits({ type: "F32", k: 2048, n: 257, m: 256 }), 13);
  // 128..255 tiles: two runs (ssm_out at 256 tokens); 256 tiles run unsplit (attn_gate at 256 tokens).
  assert.equal(matmulDefaultSplits({ type: "F32", k: 4096, n: 2048, m: 256 }), 2);
  assert.equal(matmulDefaultSplits({ type: "F32", k: 2048, n: 4096, m: 256 }), 1);
  // The engine's plan: a small N slice writes its partials densely, and matmul_splits puts Y where the
  // unsplit matmul would have (the slice's offset and stride); a big N runs unsplit.
  const slice: MatmulShape = { type: "Q8_0", k: 2048, n: 32, m: 256, yOffset: 7, yStride: 300 };
  const plan = matmulPlan(slice, 49152);
  assert.deepEqual([...plan.params.subarray(6, 11)], [0, 2048, 32, 1, 32 * 256]);
  assert.deepEqual(plan.grid, [1, 4, 64]);
  assert.deepEqual([...plan.sum!.params.subarray(0, 5)], [32, 256, 64, 7, 300]);
  assert.equal(plan.sum!.partBytes, 4 * 64 * 32 * 256);
  const wide = matmulPlan({ ...slice, n: 8192 }, 49152);
  assert.equal(wide.sum, undefined);
  assert.deepEqual([...wide.params.subarray(6, 9)], [7, 2048, 300]);
  const big = Object.setPrototypeOf({ size: 1 << 20 }, GPUBuffer.prototype) as GPUBuffer;
  const shape: MatmulShape = { type: "F32", k: 256, n: 4, m: 3, splits: 2, yStride: 5 };
  assert.throws(
    () => checkMatmul(shape, matmulConstants(shape), { params: big, weights: big, x: big, y: big }),
    /dense partial/,
  );
});
