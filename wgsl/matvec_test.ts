import { PipelineCache } from "./kernel.ts";
import { type GgmlTypeName, typeInfo } from "../engine/quant/types.ts";
import { Rng } from "../tests/util/rng.ts";
import { assertPoisoned } from "../tests/util/close.ts";
import { GUARD_WORDS, POISON_F32, poisoned, readAll, testGpu, upload } from "../tests/util/gpu.ts";
import { assertDotClose, randomWeights, refProduct } from "./_quant_testing.ts";
import { QUANT_TYPES } from "./_quant.ts";
import {
  checkMatvec,
  encodeMatvec,
  MATVEC_MAX_BATCH,
  MATVEC_PARAMS_BYTES,
  type MatvecConstants,
  matvecConstants,
  matvecParams,
  type MatvecShape,
  matvecWorkgroupBytes,
  prepareMatvec,
} from "./matvec.ts";
import assert from "node:assert/strict";
import { checkEach } from "./_test_util.ts";

interface Case {
  shape: MatvecShape;
  what: string;
  constants: MatvecConstants;
}

/** The float64 RMSNorm of x: x / sqrt(mean(x²) + eps) · nw. */
function refNorm(x: ArrayLike<number>, nw: ArrayLike<number>, eps: number): Float64Array {
  let ss = 0;
  for (let i = 0; i < x.length; i++) ss += x[i]! * x[i]!;
  const scale = 1 / Math.sqrt(ss / x.length + eps);
  return Float64Array.from({ length: x.length }, (_, i) => x[i]! * scale * nw[i]!);
}

/** y's padding between its `cols` columns of `n` rows (`yStride` apart) and its guard after them: never written. */
function assertPaddingPoisoned(y: ArrayBuffer, n: number, cols: number, yStride: number, what: string): void {
  for (let j = 0; j < cols - 1; j++) {
    assertPoisoned(
      new Uint32Array(y, 4 * (j * yStride + n), yStride - n),
      POISON_F32,
      `${what}: y padding ${j}`,
    );
  }
  assertPoisoned(
    new Uint32Array(y, 4 * ((cols - 1) * yStride + n), GUARD_WORDS),
    POISON_F32,
    `${what}: y guard`,
  );
}

/** The cases of one type: debug, one block, odd row counts, every batch size, slices with offsets. */
function cases(rng: Rng, type: GgmlTypeName): Case[] {
  const be = Math.max(32, typeInfo(type).blockElems);
  const shapes: MatvecShape[] = [
    { type, k: be, n: 1, batch: 1 }, // debug: one block, one row
    { type, k: be, n: 13, batch: 3 }, // N not a multiple of the rows per workgroup
    { type, k: 4 * be, n: 9, batch: 8 },
    { type, k: be, n: 37, batch: 1 }, // same variant as the debug case (compiles are slow on lavapipe)
    // Random; batch from the sizes above, so that lavapipe compiles few variants (the batch loops are
    // unrolled code, the same for every size).
    { type, k: be * rng.int(1, 5), n: rng.int(1, 80), batch: [1, 3, 8][rng.int(0, 3)]! },
    // A slice: rows at a byte offset, x and y columns with offsets and padded strides.
    {
      type,
      k: be,
      n: 5,
      batch: 3,
      wOffsetBytes: 4 * rng.int(1, 40),
      xOffset: 8,
      xStride: be + 4,
      yOffset: 3,
      yStride: 7,
    },
  ];
  // The other batch sizes, one type each (every size runs every run; each size is its own variant).
  const other = [2, 4, 5, 6, 7][QUANT_TYPES.indexOf(type) % 5]!;
  shapes.push({ type, k: 2 * be, n: 11, batch: other });
  if (type === "IQ4_XS" || type === "Q8_0") shapes.push({ type, k: 2048, n: 24, batch: 1 }); // real K, TEAM 64
  // Batch 1 with ROWS 1, 2 or 3 (the array-free path; 3 leaves a vec4 component unused) or 8 (the general path),
  // by type (set below).
  shapes.push({ type, k: 2 * be, n: 21, batch: 1 });
  const lastRows = [1, 2, 3, 8][QUANT_TYPES.indexOf(type) % 4]!;
  // UNROLL 1 on the batch-3 cases (odd N, slice), the other-batch case and the last, the default 2 elsewhere.
  return shapes.map((shape, i) => {
    const last = i === shapes.length - 1;
    const rows = last ? lastRows : undefined;
    // XR 1 (x reloaded per row) on the batch-8 case of every other type and on the random case of the rest.
    const xr = (i === 2) === (QUANT_TYPES.indexOf(type) % 2 === 0) && (i === 2 || i === 4) ? 1 : 0;
    const constants = matvecConstants(shape, {
      unroll: i === 1 || i === 5 || i === 6 || last ? 1 : 2,
      rows,
      xr,
    });
    const what = `matvec ${type} ne=[${shape.k}, ${shape.n}] batch ${shape.batch} ${
      JSON.stringify(constants)
    }`;
    return { shape, what, constants };
  });
}

Deno.test("matvec matches the float64 reference for every type, batch 1..8 and odd shapes", async () => {
  const rng = new Rng();
  const { device } = await testGpu();
  const cache = new PipelineCache(device);
  const all = QUANT_TYPES.flatMap((t) => cases(rng, t));
  const params = device.createBuffer({
    size: 256 * all.length,
    usage: GPUBufferUsage.UNIFORM | GPUBufferUsage.COPY_DST,
  });
  const created: GPUBuffer[] = [params];
  const checks: { c: Case; y: GPUBuffer; ref: Float64Array; mag: Float64Array; yWords: number }[] = [];
  const enc = device.createCommandEncoder();
  const pass = enc.beginComputePass();
  for (const [i, c] of all.entries()) {
    const s = c.shape;
    const bytes = randomWeights(rng, s.type, s.k, s.n);
    const wOff = s.wOffsetBytes ?? 0;
    const wAll = new Uint8Array(wOff + bytes.length + 4);
    wAll.set(bytes, wOff);
    const xStride = s.xStride ?? s.k;
    const xOff = s.xOffset ?? 0;
    const xDense = rng.normals(s.k * s.batch);
    const xAll = new Float32Array(xOff + xStride * s.batch).fill(Number.NaN); // gaps must not be read
    for (let b = 0; b < s.batch; b++) xAll.set(xDense.subarray(b * s.k, (b + 1) * s.k), xOff + b * xStride);
    const yStride = s.yStride ?? s.n;
    const yOff = s.yOffset ?? 0;
    const yWords = yOff + yStride * (s.batch - 1) + s.n;
    const wBuf = upload(device, wAll, "weights");
    const xBuf = upload(device, xAll, "x");
    const yBuf = poisoned(device, yWords);
    created.push(wBuf, xBuf, yBuf);
    device.queue.writeBuffer(params, 256 * i, matvecParams(s));
    const op = await prepareMatvec(cache, {
      device,
      shape: s,
      constants: c.constants,
      bindings: {
        params: { buffer: params, offset: 256 * i, size: MATVEC_PARAMS_BYTES },
        weights: wBuf,
        x: xBuf,
        y: { buffer: yBuf, offset: 0, size: 4 * yWords },
      },
    });
    encodeMatvec(pass, op);
    checks.push({
      c,
      y: yBuf,
      yWords,
      ...refProduct(s.type, bytes, { k: s.k, n: s.n, cols: s.batch, x: xDense }),
    });
  }
  pass.end();
  device.queue.submit([enc.finish()]);
  const outs = await readAll(device, checks.map((k) => k.y));
  created.forEach((b) => b.destroy());
  checkEach(checks, ({ c, ref, mag, yWords }, i) => checkCase(i, c, ref, mag, yWords));

  function checkCase(i: number, c: Case, ref: Float64Array, mag: Float64Array, yWords: number): void {
    const s = c.shape;
    const all = new Float32Array(outs[i]!);
    const got = new Float32Array(s.n * s.batch);
    const yStride = s.yStride ?? s.n;
    const yOff = s.yOffset ?? 0;
    for (let b = 0; b < s.batch; b++) {
      got.set(all.subarray(yOff + b * yStride, yOff + b * yStride + s.n), b * s.n);
      // Between columns the padding must stay poisoned too.
      const gap = new Uint32Array(
        outs[i]!,
        4 * (yOff + b * yStride + s.n),
        b + 1 < s.batch ? yStride - s.n : 0,
      );
      assertPoisoned(gap, POISON_F32, `${c.what} column gap ${b} (seed ${rng.seed})`);
    }
    assertDotClose(got, ref, mag, { what: c.what, seed: rng.seed });
    assertPoisoned(
      new Uint32Array(outs[i]!, 4 * yWords, GUARD_WORDS),
      POISON_F32,
      `${c.what} (seed ${rng.seed})`,
    );
    assertPoisoned(new Uint32Array(outs[i]!, 0, yOff), POISON_F32, `${c.what} head (seed ${rng.seed})`);
  }
});

Deno.test("matvec shape check throws before encoding", () => {
  const dummy = { size: 1 << 20 } as unknown as GPUBuffer;
  Object.setPrototypeOf(dummy, GPUBuffer.prototype);
  const shape: MatvecShape = { type: "IQ4_XS", k: 512, n: 4, batch: 1 };
  const b = { params: dummy, weights: dummy, x: dummy, y: dummy };
  assert.throws(() => checkMatvec({ ...shape, k: 480 }, matvecConstants(shape), b), /K=480/);
  assert.throws(() => checkMatvec(shape, matvecConstants({ ...shape, batch: 2 }), b), /batch 1 but BATCH=2/);
  assert.throws(() => checkMatvec({ ...shape, xOffset: 2 }, matvecConstants(shape), b), /multiples of 4/);
  const small = { size: 100 } as unknown as GPUBuffer;
  Object.setPrototypeOf(small, GPUBuffer.prototype);
  assert.throws(
    () => checkMatvec(shape, matvecConstants(shape), { ...b, weights: small }),
    /binding weights/,
  );
});

Deno.test("matvec NORM (x RMSNorm-ed in the prologue, xn written) and ACC (y += W·x)", async () => {
  const rng = new Rng();
  const { device } = await testGpu();
  const cache = new PipelineCache(device);
  const eps = 1e-6;
  // K = 2048: the ROWS 1 path; K = 256: ROWS 4. N odd; x at an offset for the second shape.
  const cases = [
    { type: "IQ4_XS", k: 2048, n: 37, xOffset: 0, norm: true, acc: false },
    { type: "Q8_0", k: 256, n: 21, xOffset: 8, norm: true, acc: true },
    { type: "F32", k: 2048, n: 13, xOffset: 4, norm: false, acc: true },
  ] as const;
  const params = device.createBuffer({
    size: 256 * cases.length,
    usage: GPUBufferUsage.UNIFORM | GPUBufferUsage.COPY_DST,
  });
  const enc = device.createCommandEncoder();
  const pass = enc.beginComputePass();
  const pending: {
    what: string;
    y: GPUBuffer;
    xn: GPUBuffer;
    ref: Float64Array;
    mag: Float64Array;
    xnRef?: Float64Array;
    xOff: number;
  }[] = [];
  for (const [i, c] of cases.entries()) {
    const shape: MatvecShape = { type: c.type, k: c.k, n: c.n, batch: 1, xOffset: c.xOffset };
    const bytes = randomWeights(rng, c.type, c.k, c.n);
    const x = rng.normals(c.k, 3);
    const nw = rng.normals(c.k);
    const y0 = rng.normals(c.n);
    const xnRef = refNorm(x, nw, eps);
    const { ref, mag } = refProduct(c.type, bytes, {
      k: c.k,
      n: c.n,
      cols: 1,
      x: c.norm ? Float32Array.from(xnRef) : x,
    });
    if (c.acc) {
      for (let r = 0; r < c.n; r++) {
        ref[r] = ref[r]! + y0[r]!;
        mag[r] = mag[r]! + Math.abs(y0[r]!);
      }
    }
    const xAll = new Float32Array(c.xOffset + c.k).fill(Number.NaN);
    xAll.set(x, c.xOffset);
    const y = poisoned(device, c.n);
    if (c.acc) device.queue.writeBuffer(y, 0, y0);
    const xn = poisoned(device, c.xOffset + c.k);
    device.queue.writeBuffer(params, 256 * i, matvecParams(shape));
    const op = await prepareMatvec(cache, {
      device,
      shape,
      constants: matvecConstants(shape, { norm: c.norm ? { eps } : undefined, acc: c.acc }),
      bindings: {
        params: { buffer: params, offset: 256 * i, size: MATVEC_PARAMS_BYTES },
        weights: upload(device, bytes),
        x: upload(device, xAll),
        y: { buffer: y, size: 4 * c.n },
        nw: upload(device, nw),
        xn: { buffer: xn, size: 4 * (c.xOffset + c.k) },
      },
    });
    encodeMatvec(pass, op);
    pending.push({
      what: `matvec ${JSON.stringify(c)}`,
      y,
      xn,
      ref,
      mag,
      xnRef: c.norm ? xnRef : undefined,
      xOff: c.xOffset,
    });
  }
  pass.end();
  device.queue.submit([enc.finish()]);
  const ys = await readAll(device, pending.map((p) => p.y));
  const xns = await readAll(device, pending.map((p) => p.xn));
  for (const [i, p] of pending.entries()) {
    assertDotClose(new Float32Array(ys[i]!, 0, p.ref.length), p.ref, p.mag, { what: p.what, seed: rng.seed });
    assertPoisoned(new Uint32Array(ys[i]!, 4 * p.ref.length, GUARD_WORDS), POISON_F32, `${p.what} y guard`);
    const xnGot = new Float32Array(xns[i]!);
    assertPoisoned(new Uint32Array(xns[i]!, 0, p.xOff), POISON_F32, `${p.what}: xn before x's offset`);
    if (p.xnRef) {
      for (let j = 0; j < p.xnRef.length; j++) {
        const want = p.xnRef[j]!;
        const got = xnGot[p.xOff + j]!;
        assert.ok(
          Math.abs(got - want) <= 1e-5 * Math.abs(want) + 1e-6,
          `${p.what}: xn[${j}] = ${got}, want ${want} (seed ${rng.seed})`,
        );
      }
    } else {
      // Without NORM the xn binding is a stand-in: nothing is written.
      assertPoisoned(new Uint32Array(xns[i]!), POISON_F32, `${p.what}: xn untouched`);
    }
  }
});

Deno.test("matvec columns in grid z with NORM: each column its own batch-1 dispatch's bits, the reference, its xn", async () => {
  const rng = new Rng();
  const { device } = await testGpu();
  const cache = new PipelineCache(device);
  const eps = 1e-6;
  // A batched step's router: f32 rows (one dispatch, several columns) and a quantized type; y columns at a
  // padded stride (the fused router's nExpert + 1), x columns back to back.
  for (
    const c of [{ type: "F32", k: 256, n: 9, cols: 3 }, { type: "Q8_0", k: 2048, n: 37, cols: 5 }] as const
  ) {
    const what = `matvec zCols ${JSON.stringify(c)} (seed ${rng.seed})`;
    const bytes = randomWeights(rng, c.type, c.k, c.n);
    const x = rng.normals(c.k * c.cols, 3);
    const nw = rng.normals(c.k);
    const yStride = c.n + 3;
    const weights = upload(device, bytes);
    const xBuf = upload(device, x);
    const nwBuf = upload(device, nw);
    const params = device.createBuffer({
      size: 256 * (c.cols + 1),
      usage: GPUBufferUsage.UNIFORM | GPUBufferUsage.COPY_DST,
    });
    const zShape: MatvecShape = { type: c.type, k: c.k, n: c.n, batch: 1, yStride, zCols: c.cols };
    const constants = matvecConstants(zShape, { norm: { eps } });
    const y = poisoned(device, (c.cols - 1) * yStride + c.n);
    const xn = poisoned(device, c.cols * c.k);
    device.queue.writeBuffer(params, 0, matvecParams(zShape));
    const enc = device.createCommandEncoder();
    const pass = enc.beginComputePass();
    const zOp = await prepareMatvec(cache, {
      device,
      shape: zShape,
      constants,
      bindings: {
        params: { buffer: params, offset: 0, size: MATVEC_PARAMS_BYTES },
        weights,
        x: xBuf,
        y,
        nw: nwBuf,
        xn,
      },
    });
    assert.deepEqual(zOp.grid.slice(2), [c.cols], `${what}: grid z`);
    encodeMatvec(pass, zOp);
    // Each column alone: the one-token step's dispatch (its x at its offset, y in a buffer of its own).
    const solo: { y: GPUBuffer; xn: GPUBuffer }[] = [];
    for (let j = 0; j < c.cols; j++) {
      const shape: MatvecShape = { type: c.type, k: c.k, n: c.n, batch: 1, xOffset: j * c.k };
      const one = { y: poisoned(device, c.n), xn: poisoned(device, c.cols * c.k) };
      device.queue.writeBuffer(params, 256 * (j + 1), matvecParams(shape));
      encodeMatvec(
        pass,
        await prepareMatvec(cache, {
          device,
          shape,
          constants,
          bindings: {
            params: { buffer: params, offset: 256 * (j + 1), size: MATVEC_PARAMS_BYTES },
            weights,
            x: xBuf,
            y: { buffer: one.y, size: 4 * c.n },
            nw: nwBuf,
            xn: one.xn,
          },
        }),
      );
      solo.push(one);
    }
    pass.end();
    device.queue.submit([enc.finish()]);
    const [yz, xnz, ...rest] = await readAll(device, [y, xn, ...solo.flatMap((o) => [o.y, o.xn])]);
    const yGot = new Float32Array(yz!);
    const xnGot = new Float32Array(xnz!);
    for (let j = 0; j < c.cols; j++) {
      const xnRef = refNorm(x.subarray(j * c.k, (j + 1) * c.k), nw, eps);
      const { ref, mag } = refProduct(c.type, bytes, {
        k: c.k,
        n: c.n,
        cols: 1,
        x: Float32Array.from(xnRef),
      });
      const col = yGot.subarray(j * yStride, j * yStride + c.n);
      assertDotClose(col, ref, mag, { what: `${what} column ${j}`, seed: rng.seed });
      const soloY = new Float32Array(rest[2 * j]!, 0, c.n);
      const soloXn = new Float32Array(rest[2 * j + 1]!, 4 * j * c.k, c.k);
      assert.deepEqual(
        new Uint32Array(col.slice().buffer),
        new Uint32Array(soloY.slice().buffer),
        `${what}: y of column ${j} ≢ its solo dispatch`,
      );
      const xnCol = xnGot.subarray(j * c.k, (j + 1) * c.k);
      assert.deepEqual(
        new Uint32Array(xnCol.slice().buffer),
        new Uint32Array(soloXn.slice().buffer),
        `${what}: xn of column ${j} ≢ its solo dispatch`,
      );
      for (let i = 0; i < c.k; i++) {
        assert.ok(
          Math.abs(xnCol[i]! - xnRef[i]!) <= 1e-5 * Math.abs(xnRef[i]!) + 1e-6,
          `${what}: xn[${j}][${i}]`,
        );
      }
    }
    assertPaddingPoisoned(yz!, c.n, c.cols, yStride, what);
  }
});

Deno.test("matvec NORM 2 (x ⊙ nw, the norm's scale left to the reader): the reference, each column its one-column dispatch's bits", async () => {
  const rng = new Rng();
  const { device } = await testGpu();
  const cache = new PipelineCache(device);
  // The fused router (F32, columns at a padded stride), a quantized type over 16 columns (XR 2, two
  // reduction passes at ROWS 4), and one column through the strength-reduced loop (sr_x).
  const cases = [
    { type: "F32", k: 256, n: 9, cols: 3, sr: false },
    { type: "Q8_0", k: 2048, n: 37, cols: 16, sr: false },
    { type: "IQ4_XS", k: 2048, n: 13, cols: 1, sr: true },
  ] as const;
  for (const c of cases) {
    const what = `matvec NORM 2 ${JSON.stringify(c)} (seed ${rng.seed})`;
    const bytes = randomWeights(rng, c.type, c.k, c.n);
    const x = rng.normals(c.k * c.cols, 3);
    const nw = rng.normals(c.k);
    const yStride = c.n + 3;
    const weights = upload(device, bytes);
    const xBuf = upload(device, x);
    const nwBuf = upload(device, nw);
    const params = device.createBuffer({
      size: 256 * (c.cols + 1),
      usage: GPUBufferUsage.UNIFORM | GPUBufferUsage.COPY_DST,
    });
    const shape: MatvecShape = { type: c.type, k: c.k, n: c.n, batch: c.cols, yStride };
    const opts = { weightNorm: true, ...(c.sr ? { sr: true, team: 32 } : undefined) };
    const constants = matvecConstants(shape, opts);
    assert.equal(constants.NORM, 2, `${what}: NORM`);
    const y = poisoned(device, (c.cols - 1) * yStride + c.n);
    device.queue.writeBuffer(params, 0, matvecParams(shape));
    const enc = device.createCommandEncoder();
    const pass = enc.beginComputePass();
    const bindings = (offset: number, yb: GPUBuffer, words: number) => ({
      params: { buffer: params, offset, size: MATVEC_PARAMS_BYTES },
      weights,
      x: xBuf,
      y: { buffer: yb, size: 4 * words },
      nw: nwBuf,
    });
    encodeMatvec(
      pass,
      await prepareMatvec(cache, {
        device,
        shape,
        constants,
        bindings: bindings(0, y, (c.cols - 1) * yStride + c.n),
      }),
    );
    // Each column alone: a one-column dispatch (a one-token step's router) on its x.
    const solo: GPUBuffer[] = [];
    for (let j = 0; j < c.cols; j++) {
      const one: MatvecShape = { type: c.type, k: c.k, n: c.n, batch: 1, xOffset: j * c.k };
      const yj = poisoned(device, c.n);
      device.queue.writeBuffer(params, 256 * (j + 1), matvecParams(one));
      encodeMatvec(
        pass,
        await prepareMatvec(cache, {
          device,
          shape: one,
          constants: matvecConstants(one, opts),
          bindings: bindings(256 * (j + 1), yj, c.n),
        }),
      );
      solo.push(yj);
    }
    pass.end();
    device.queue.submit([enc.finish()]);
    const [yAll, ...rest] = await readAll(device, [y, ...solo]);
    const yGot = new Float32Array(yAll!);
    for (let j = 0; j < c.cols; j++) {
      const xw = Float32Array.from({ length: c.k }, (_, i) => x[j * c.k + i]! * nw[i]!);
      const { ref, mag } = refProduct(c.type, bytes, { k: c.k, n: c.n, cols: 1, x: xw });
      const col = yGot.subarray(j * yStride, j * yStride + c.n);
      assertDotClose(col, ref, mag, { what: `${what} column ${j}`, seed: rng.seed });
      assert.deepEqual(
        new Uint32Array(col.slice().buffer),
        new Uint32Array(rest[j]!, 0, c.n),
        `${what}: column ${j} ≢ its one-column dispatch`,
      );
    }
    assertPaddingPoisoned(yAll!, c.n, c.cols, yStride, what);
  }
});

Deno.test("matvec SR (strength-reduced batch-1 loop) matches the reference and SR=0 bit for bit", async () => {
  const rng = new Rng();
  const { device } = await testGpu();
  const cache = new PipelineCache(device);
  const eps = 1e-6;
  // Odd N everywhere; K = 256 with TEAM 64 leaves half the team without units; K = 2304 and 4096 with
  // TEAM 128 run the remainder loop (per-lane counts not a multiple of UNROLL, or below it).
  const base = [
    { k: 256, n: 37, team: 32, unroll: 1, norm: false, acc: false, xOffset: 0 },
    { k: 256, n: 9, team: 64, unroll: 2, norm: true, acc: false, xOffset: 4 },
    { k: 2048, n: 21, team: 32, unroll: 4, norm: true, acc: false, xOffset: 0 },
    { k: 2048, n: 13, team: 64, unroll: 8, norm: false, acc: true, xOffset: 8 },
    { k: 2304, n: 11, team: 64, unroll: 4, norm: false, acc: false, xOffset: 0 },
    { k: 4096, n: 9, team: 64, unroll: 2, norm: true, acc: true, xOffset: 0 },
    { k: 4096, n: 5, team: 128, unroll: 8, norm: false, acc: false, xOffset: 0 },
    { k: 4096, n: 7, team: 32, unroll: 8, norm: false, acc: false, xOffset: 0 },
  ];
  const cases = (["IQ4_XS", "Q8_0"] as const).flatMap((type) => base.map((b) => ({ ...b, type })));
  const params = device.createBuffer({
    size: 256 * cases.length,
    usage: GPUBufferUsage.UNIFORM | GPUBufferUsage.COPY_DST,
  });
  const created: GPUBuffer[] = [params];
  const enc = device.createCommandEncoder();
  const pass = enc.beginComputePass();
  const pending: { what: string; y: GPUBuffer[]; ref: Float64Array; mag: Float64Array }[] = [];
  for (const [i, c] of cases.entries()) {
    const shape: MatvecShape = { type: c.type, k: c.k, n: c.n, batch: 1, xOffset: c.xOffset };
    const bytes = randomWeights(rng, c.type, c.k, c.n);
    const x = rng.normals(c.k, 3);
    const nw = rng.normals(c.k);
    const y0 = rng.normals(c.n);
    const xUsed = c.norm ? Float32Array.from(refNorm(x, nw, eps)) : x;
    const { ref, mag } = refProduct(c.type, bytes, { k: c.k, n: c.n, cols: 1, x: xUsed });
    if (c.acc) {
      for (let r = 0; r < c.n; r++) {
        ref[r] = ref[r]! + y0[r]!;
        mag[r] = mag[r]! + Math.abs(y0[r]!);
      }
    }
    const xAll = new Float32Array(c.xOffset + c.k).fill(Number.NaN);
    xAll.set(x, c.xOffset);
    const wBuf = upload(device, bytes);
    const xBuf = upload(device, xAll);
    const nwBuf = upload(device, nw);
    created.push(wBuf, xBuf, nwBuf);
    device.queue.writeBuffer(params, 256 * i, matvecParams(shape));
    const ys: GPUBuffer[] = [];
    // SR = 1, then SR = 0 at the same TEAM (ROWS 1: the array-free path) on the same inputs.
    for (const sr of [true, false]) {
      const y = poisoned(device, c.n);
      if (c.acc) device.queue.writeBuffer(y, 0, y0);
      const xn = poisoned(device, c.xOffset + c.k);
      created.push(y, xn);
      ys.push(y);
      const constants = matvecConstants(shape, {
        team: c.team,
        rows: 1,
        unroll: sr ? c.unroll : 2,
        sr,
        norm: c.norm ? { eps } : undefined,
        acc: c.acc,
      });
      const op = await prepareMatvec(cache, {
        device,
        shape,
        constants,
        bindings: {
          params: { buffer: params, offset: 256 * i, size: MATVEC_PARAMS_BYTES },
          weights: wBuf,
          x: xBuf,
          y: { buffer: y, size: 4 * c.n },
          nw: nwBuf,
          xn: { buffer: xn, size: 4 * (c.xOffset + c.k) },
        },
      });
      encodeMatvec(pass, op);
    }
    pending.push({ what: `matvec SR ${JSON.stringify(c)}`, y: ys, ref, mag });
  }
  pass.end();
  device.queue.submit([enc.finish()]);
  const outs = await readAll(device, pending.flatMap((p) => p.y));
  const failures: string[] = [];
  for (const [i, p] of pending.entries()) {
    const n = p.ref.length;
    const sr1 = outs[2 * i]!;
    const sr0 = outs[2 * i + 1]!;
    try {
      assertDotClose(new Float32Array(sr1, 0, n), p.ref, p.mag, { what: p.what, seed: rng.seed });
      assertPoisoned(new Uint32Array(sr1, 4 * n, GUARD_WORDS), POISON_F32, `${p.what} y guard`);
      const a = new Uint32Array(sr1, 0, n);
      const b = new Uint32Array(sr0, 0, n);
      const diff = a.findIndex((v, r) => v !== b[r]);
      assert.ok(
        diff < 0,
        `${p.what}: SR=1 differs from SR=0 at row ${diff}: ${new Float32Array(sr1)[diff]} vs ` +
          `${new Float32Array(sr0)[diff]} (seed ${rng.seed})`,
      );
    } catch (e) {
      failures.push((e as Error).message);
    }
  }
  created.forEach((b) => b.destroy());
  if (failures.length > 0) {
    throw new Error(`${failures.length} of ${pending.length} cases failed:\n${failures.join("\n")}`);
  }
});

Deno.test("matvecConstants rejects SR with a type, TEAM, ROWS, BATCH or UNROLL it does not take", () => {
  const shape: MatvecShape = { type: "IQ4_XS", k: 2048, n: 8, batch: 1 };
  assert.equal(matvecConstants(shape, { sr: true, unroll: 8 }).SR, 1);
  assert.equal(matvecConstants({ ...shape, type: "Q8_0" }, { sr: true, unroll: 4 }).UNROLL, 4);
  assert.equal(matvecConstants(shape).SR, 0); // the default stays SR=0
  assert.throws(() => matvecConstants({ ...shape, type: "F16" }, { sr: true }), /SR=1 takes IQ4_XS/);
  assert.throws(() => matvecConstants(shape, { sr: true, team: 16 }), /TEAM a multiple of 32/);
  assert.throws(() => matvecConstants(shape, { sr: true, rows: 2 }), /ROWS=1 and BATCH=1/);
  assert.throws(() => matvecConstants({ ...shape, batch: 2 }, { sr: true }), /ROWS=1 and BATCH=1/);
  assert.throws(() => matvecConstants(shape, { sr: true, unroll: 3 }), /UNROLL=3 with SR=1/);
  assert.throws(() => matvecConstants(shape, { unroll: 4 }), /4 and 8 need SR=1/);
});

Deno.test("matvecConstants: TEAM follows K and N only (a batched step sums each row as the solo step does)", () => {
  for (const [k, n] of [[2048, 257], [2048, 512], [2048, 4096], [4096, 2048], [2048, 248320], [256, 40]]) {
    const solo = matvecConstants({ type: "IQ4_XS", k: k!, n: n!, batch: 1 });
    for (const batch of [2, 5, 8]) {
      assert.equal(
        matvecConstants({ type: "IQ4_XS", k: k!, n: n!, batch }).TEAM,
        solo.TEAM,
        `[${k}, ${n}] batch ${batch}`,
      );
    }
  }
  // Short matrices get a wider team (H200 sweep), tall ones keep 32.
  assert.equal(matvecConstants({ type: "F32", k: 2048, n: 257, batch: 1 }).TEAM, 128);
  assert.equal(matvecConstants({ type: "IQ4_XS", k: 2048, n: 131072, batch: 1 }).TEAM, 32);
});

Deno.test("matvec XR=2 (named sums, up to 16 columns) matches the reference and each column's solo run bit for bit", async () => {
  const rng = new Rng();
  const { device } = await testGpu();
  const cache = new PipelineCache(device);
  // Types with and without a min; ROWS 1-4 (one pass at 16 columns with ROWS 1; 12 + 4 with ROWS 2; 4 passes of
  // one group with ROWS 4); TEAM 4 (K = 32, level 1 of the reduction over whole teams) to 128; 1 to 4 units per
  // invocation (K = 2304: 3 for some, 2 for others); batches that leave the last group partial (5, 13, 6);
  // UNROLL 1 and 2; N not a multiple of the rows per workgroup; the last case a slice (weight offset, padded x
  // and y strides, offsets).
  const base = [
    { type: "IQ4_XS", k: 4096, n: 37, batch: 16, rows: 1, unroll: 1 },
    { type: "Q6_K", k: 2048, n: 21, batch: 16, rows: 2, unroll: 2 },
    { type: "Q4_K", k: 2304, n: 13, batch: 13, rows: 4, unroll: 1 },
    { type: "Q8_0", k: 2048, n: 24, batch: 16, rows: 4, unroll: 2 },
    { type: "IQ4_XS", k: 2048, n: 40, batch: 8, rows: 2, unroll: 1 },
    { type: "F16", k: 32, n: 11, batch: 6, rows: 1, unroll: 2 },
    { type: "F32", k: 96, n: 9, batch: 5, rows: 3, unroll: 1, slice: true },
  ] as const;
  const cases = base.map((c) => {
    const sl = "slice" in c;
    const shape: MatvecShape = {
      type: c.type,
      k: c.k,
      n: c.n,
      batch: c.batch,
      wOffsetBytes: sl ? 4 * rng.int(1, 40) : 0,
      xOffset: sl ? 8 : 0,
      xStride: sl ? c.k + 4 : c.k,
      yOffset: sl ? 3 : 0,
      yStride: sl ? c.n + 2 : c.n,
    };
    return { c, shape, constants: matvecConstants(shape, { rows: c.rows, unroll: c.unroll, xr: 2 }) };
  });
  const slots = cases.reduce((s, c) => s + 1 + c.c.batch, 0);
  const params = device.createBuffer({
    size: 256 * slots,
    usage: GPUBufferUsage.UNIFORM | GPUBufferUsage.COPY_DST,
  });
  const created: GPUBuffer[] = [params];
  const enc = device.createCommandEncoder();
  const pass = enc.beginComputePass();
  let slot = 0;
  const pending: { what: string; y: GPUBuffer; solo: GPUBuffer; ref: Float64Array; mag: Float64Array }[] = [];
  for (const { c, shape: s, constants } of cases) {
    const bytes = randomWeights(rng, s.type, s.k, s.n);
    const wOff = s.wOffsetBytes!;
    const wAll = new Uint8Array(wOff + bytes.length + 4);
    wAll.set(bytes, wOff);
    const xDense = rng.normals(s.k * s.batch);
    const xAll = new Float32Array(s.xOffset! + s.xStride! * s.batch).fill(Number.NaN); // gaps must not be read
    for (let b = 0; b < s.batch; b++) {
      xAll.set(xDense.subarray(b * s.k, (b + 1) * s.k), s.xOffset! + b * s.xStride!);
    }
    const yWords = s.yOffset! + s.yStride! * s.batch;
    const wBuf = upload(device, wAll, "weights");
    const xBuf = upload(device, xAll, "x");
    // The batched dispatch, then one batch-1 dispatch per column at its default constants (its TEAM follows K
    // and N only), into a second buffer of the same layout.
    const y = poisoned(device, yWords);
    const solo = poisoned(device, yWords);
    created.push(wBuf, xBuf, y, solo);
    const runs: [MatvecShape, MatvecConstants, GPUBuffer][] = [[s, constants, y]];
    for (let b = 0; b < s.batch; b++) {
      const one: MatvecShape = {
        ...s,
        batch: 1,
        xOffset: s.xOffset! + b * s.xStride!,
        yOffset: s.yOffset! + b * s.yStride!,
      };
      runs.push([one, matvecConstants(one), solo]);
    }
    for (const [shape, k, out] of runs) {
      device.queue.writeBuffer(params, 256 * slot, matvecParams(shape));
      encodeMatvec(
        pass,
        await prepareMatvec(cache, {
          device,
          shape,
          constants: k,
          bindings: {
            params: { buffer: params, offset: 256 * slot, size: MATVEC_PARAMS_BYTES },
            weights: wBuf,
            x: xBuf,
            y: { buffer: out, offset: 0, size: 4 * yWords },
          },
        }),
      );
      slot++;
    }
    assert.equal(constants.TEAM, matvecConstants({ ...s, batch: 1 }).TEAM);
    pending.push({
      what: `matvec XR=2 ${JSON.stringify(c)} ${JSON.stringify(constants)}`,
      y,
      solo,
      ...refProduct(s.type, bytes, { k: s.k, n: s.n, cols: s.batch, x: xDense }),
    });
  }
  pass.end();
  device.queue.submit([enc.finish()]);
  const outs = await readAll(device, pending.flatMap((p) => [p.y, p.solo]));
  created.forEach((b) => b.destroy());
  checkEach(pending, (p, i) => {
    const s = cases[i]!.shape;
    const yOff = s.yOffset!;
    const yStride = s.yStride!;
    const got = new Float32Array(s.n * s.batch);
    const words = new Uint32Array(outs[2 * i]!);
    const soloWords = new Uint32Array(outs[2 * i + 1]!);
    const all = new Float32Array(outs[2 * i]!);
    for (let b = 0; b < s.batch; b++) {
      got.set(all.subarray(yOff + b * yStride, yOff + b * yStride + s.n), b * s.n);
      // Between and after the columns (through the guard band) everything stays poisoned.
      const end = b + 1 < s.batch ? yOff + (b + 1) * yStride : words.length;
      assertPoisoned(
        words.subarray(yOff + b * yStride + s.n, end),
        POISON_F32,
        `${p.what} gap ${b} (seed ${rng.seed})`,
      );
      for (let r = 0; r < s.n; r++) {
        const at = yOff + b * yStride + r;
        assert.ok(
          words[at] === soloWords[at],
          `${p.what}: column ${b} row ${r} is ${all[at]} batched but ${
            new Float32Array(outs[2 * i + 1]!)[at]
          } ` +
            `solo (seed ${rng.seed})`,
        );
      }
    }
    assertPoisoned(words.subarray(0, yOff), POISON_F32, `${p.what} head (seed ${rng.seed})`);
    assertDotClose(got, p.ref, p.mag, { what: p.what, seed: rng.seed });
  });
});

Deno.test("matvecConstants and checkMatvec: XR=2 takes 1..16 columns and ROWS 1..4, the arrays paths 1..8", () => {
  const dummy = { size: 1 << 24 } as unknown as GPUBuffer;
  Object.setPrototypeOf(dummy, GPUBuffer.prototype);
  const b = { params: dummy, weights: dummy, x: dummy, y: dummy };
  const shape: MatvecShape = { type: "IQ4_XS", k: 2048, n: 64, batch: 16 };
  assert.equal(MATVEC_MAX_BATCH, 16);
  // Above 8 columns the default is the named path (the only one that takes them).
  assert.equal(matvecConstants(shape).XR, 2);
  // ROWS 4 from N = 4096 below 65,536, and above 8 columns from N = 2048 on (ssm_out, the LM head); else 2.
  const rowsOf = (n: number, batch: number) => matvecConstants({ ...shape, n, batch }).ROWS;
  assert.deepEqual([rowsOf(2048, 8), rowsOf(2048, 9), rowsOf(248320, 8), rowsOf(248320, 16)], [2, 4, 2, 4]);
  assert.deepEqual([rowsOf(1024, 16), rowsOf(8192, 2)], [2, 4]);
  checkMatvec(shape, matvecConstants(shape, { rows: 4 }), b);
  assert.throws(() => checkMatvec(shape, matvecConstants(shape, { xr: 1 }), b), /needs XR=2/);
  assert.throws(() => checkMatvec(shape, matvecConstants(shape, { rows: 8 }), b), /XR=2 takes ROWS 1..4/);
  assert.throws(
    () => checkMatvec({ ...shape, batch: 17 }, matvecConstants({ ...shape, batch: 17 }), b),
    /BATCH/,
  );
  // Passes keep the partials within 32 KiB (with the IQ4 table) for every ROWS and batch.
  for (let rows = 1; rows <= 4; rows++) {
    for (let batch = 1; batch <= 16; batch++) {
      const c = matvecConstants({ ...shape, batch }, { rows, xr: 2 });
      assert.ok(
        matvecWorkgroupBytes(c) <= 32768,
        `ROWS ${rows} BATCH ${batch}: ${matvecWorkgroupBytes(c)} B`,
      );
    }
  }
});
