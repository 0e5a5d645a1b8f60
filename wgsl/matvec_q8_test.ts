import { PipelineCache } from "./kernel.ts";
import type { GgmlTypeName } from "../engine/quant/types.ts";
import { Rng } from "../tests/util/rng.ts";
import { assertPoisoned } from "../tests/util/close.ts";
import { GUARD_WORDS, POISON_F32, poisoned, readAll, testGpu, upload } from "../tests/util/gpu.ts";
import { assertDotClose, randomWeights, refProduct } from "./_quant_testing.ts";
import { quantizeOnGpu } from "./_q8_testing.ts";
import {
  checkMatvecQ8,
  checkMatvecQ8Fused,
  checkQuantizeQ8,
  decodeQ8x,
  encodeQ8,
  MATVEC_Q8_PARAMS_BYTES,
  type MatvecQ8Constants,
  matvecQ8Constants,
  matvecQ8FusedConstants,
  type MatvecQ8FusedShape,
  matvecQ8Params,
  type MatvecQ8Shape,
  prepareMatvecQ8,
  prepareMatvecQ8Fused,
  prepareQuantizeQ8,
  q8Layout,
  type Q8Op,
  q8xBytes,
  QUANTIZE_Q8_PARAMS_BYTES,
  type QuantizeQ8Bindings,
  quantizeQ8Params,
  type QuantizeQ8Shape,
} from "./matvec_q8.ts";
import assert from "node:assert/strict";
import { encodeRmsNorm, RMS_NORM, rmsNormBindGroup, type RmsNormConstants } from "./rms_norm.ts";

/** Element index (within its 32-chunk) of byte `b` of quad word `w` in quantize_q8's layout for `type`. */
function elementOf(type: GgmlTypeName, w: number, b: number): number {
  if (q8Layout(type) === 0) return 4 * w + b;
  const j = w >> 1;
  const base = (w & 1) === 0 ? 4 * j : 4 * j + 2;
  return [base, base + 1, base + 16, base + 17][b]!;
}

/** The dequantized x (d_c·q_i in element order) and the raw q values from quantize_q8's output words. */
function decodeXq(
  type: GgmlTypeName,
  k: number,
  words: Uint32Array,
): { deq: Float64Array; q: Int8Array; d: Float32Array } {
  const deq = new Float64Array(k);
  const q = new Int8Array(k);
  const d = new Float32Array(words.buffer, words.byteOffset + k, k / 32);
  const bytes = new Int8Array(words.buffer, words.byteOffset, k);
  for (let c = 0; c < k / 32; c++) {
    for (let w = 0; w < 8; w++) {
      for (let b = 0; b < 4; b++) {
        const e = 32 * c + elementOf(type, w, b);
        q[e] = bytes[32 * c + 4 * w + b]!;
        deq[e] = d[c]! * q[e]!;
      }
    }
  }
  return { deq, q, d };
}

const quantize = quantizeOnGpu;

Deno.test("quantize_q8 rounds every 32-element chunk to int8 at scale max|x|/127, in each type's byte order", async () => {
  const rng = new Rng();
  const { device } = await testGpu();
  const cache = new PipelineCache(device);
  for (const type of ["Q8_0", "Q4_K", "Q5_K", "Q6_K", "IQ4_XS"] as const) {
    for (const k of [32, 32 * rng.int(2, 70)]) {
      const x = rng.normals(k, 10 ** rng.int(-3, 3));
      if (k > 32) {
        x.fill(0, 0, 32); // an all-zero chunk: scale 0, all q 0
        x[40] = 1e4 * Math.abs(x[41]! + 1); // an outlier: the rest of its chunk rounds to small values
      }
      const xOff = 4 * rng.int(0, 5);
      const what = `quantize_q8 ${type} K=${k} x offset ${xOff} (seed ${rng.seed})`;
      const { words, guard } = await quantize(device, cache, type, x, xOff);
      assertPoisoned(guard, POISON_F32, what);
      const { q, d } = decodeXq(type, k, words);
      // The engine's reader of the same bytes (Stage.int8Log) agrees with this test's.
      const dec = decodeQ8x(type, k, new Uint8Array(words.buffer, words.byteOffset, q8xBytes(k)));
      assert.deepEqual([dec.q, dec.d], [q, new Float32Array(d)], `${what}: decodeQ8x`);
      for (let c = 0; c < k / 32; c++) {
        let amax = 0;
        for (let i = 0; i < 32; i++) amax = Math.max(amax, Math.abs(x[32 * c + i]!));
        const want = amax / 127;
        assert.ok(
          Math.abs(d[c]! - want) <= 2 ** -22 * want,
          `${what}: chunk ${c} scale ${d[c]} but max|x|/127 = ${want}`,
        );
        for (let i = 0; i < 32; i++) {
          const e = 32 * c + i;
          const exact = want === 0 ? 0 : x[e]! / d[c]!;
          assert.ok(
            Math.abs(q[e]!) <= 127 && Math.abs(q[e]! - exact) <= 0.5 + 1e-4,
            `${what}: element ${e} q ${q[e]} but x/d = ${exact}`,
          );
        }
      }
    }
  }
});

Deno.test("quantize_q8 over columns: each column's bits as its own dispatch; ROUND writes d·q as f32", async () => {
  const rng = new Rng();
  const { device } = await testGpu();
  const cache = new PipelineCache(device);
  for (const type of ["Q8_0", "Q6_K", "IQ4_XS"] as const) {
    const k = 32 * rng.int(1, 20);
    const cols = rng.int(2, 12);
    const xOff = 4 * rng.int(0, 3);
    const xStride = k + 4 * rng.int(0, 3);
    const what =
      `quantize_q8 ${type} K=${k} × ${cols} columns, x offset ${xOff} stride ${xStride} (seed ${rng.seed})`;
    const xAll = new Float32Array(xOff + (cols - 1) * xStride + k).fill(Number.NaN); // gaps must not be read
    for (let c = 0; c < cols; c++) xAll.set(rng.normals(k, 10 ** rng.int(-2, 2)), xOff + c * xStride);
    const xBuf = upload(device, xAll, "x");
    const words = (cols * q8xBytes(k)) / 4;
    const xqBuf = poisoned(device, words);
    const xnBuf = poisoned(device, xAll.length);
    const pb = device.createBuffer({ size: 16, usage: GPUBufferUsage.UNIFORM | GPUBufferUsage.COPY_DST });
    const shape = { type, k, xOffset: xOff, cols, xStride, round: true };
    device.queue.writeBuffer(pb, 0, quantizeQ8Params(shape));
    const op = await prepareQuantizeQ8(cache, {
      device,
      shape,
      bindings: {
        params: pb,
        x: xBuf,
        xq: { buffer: xqBuf, offset: 0, size: 4 * words },
        xn: { buffer: xnBuf, offset: 0, size: 4 * xAll.length },
      },
    });
    const enc = device.createCommandEncoder();
    const pass = enc.beginComputePass();
    pass.setPipeline(op.pipeline);
    pass.setBindGroup(0, op.bindGroup);
    pass.dispatchWorkgroups(...op.grid);
    pass.end();
    device.queue.submit([enc.finish()]);
    const [xqOut, xnOut] = await readAll(device, [xqBuf, xnBuf]);
    const xq = new Uint32Array(xqOut!);
    const xn = new Float32Array(xnOut!);
    assertPoisoned(new Uint32Array(xqOut!, 4 * words, GUARD_WORDS), POISON_F32, `${what}: xq guard`);
    for (let c = 0; c < cols; c++) {
      const col = xAll.subarray(xOff + c * xStride, xOff + c * xStride + k);
      const one = await quantize(device, cache, type, col, 0);
      const mine = xq.subarray((c * q8xBytes(k)) / 4, ((c + 1) * q8xBytes(k)) / 4);
      assert.deepEqual(mine, one.words.subarray(0, q8xBytes(k) / 4), `${what}: column ${c} bits`);
      const { q, d } = decodeXq(type, k, mine);
      for (let i = 0; i < k; i++) {
        const want = Math.fround(d[i >> 5]! * q[i]!);
        const got = xn[xOff + c * xStride + i]!;
        assert.ok(Object.is(got, want), `${what}: column ${c} element ${i} rounded ${got}, d·q = ${want}`);
      }
      // Between columns xn keeps its poison: ROUND writes x's own places only.
      if (c + 1 < cols) {
        assertPoisoned(
          new Uint32Array(xnOut!, 4 * (xOff + c * xStride + k), xStride - k),
          POISON_F32,
          `${what}: xn gap ${c}`,
        );
      }
    }
    for (const b of [xBuf, xqBuf, xnBuf, pb]) b.destroy();
  }
});

Deno.test("quantize_q8 QUADS (an invocation per quad word) gives the per-chunk bits: xq, and xn with NORM or ROUND", async () => {
  const rng = new Rng();
  const { device } = await testGpu();
  const cache = new PipelineCache(device);
  for (const mode of ["plain", "round", "norm"] as const) {
    for (const type of ["Q8_0", "IQ4_XS"] as const) {
      // K up to 2,560: above 1,024 the quad words of a column span several workgroups.
      const k = 32 * rng.int(1, 81);
      const cols = rng.int(1, 6);
      const xOff = 4 * rng.int(0, 3);
      const xStride = k + 4 * rng.int(0, 3);
      const what = `quantize_q8 QUADS ${mode} ${type} K=${k} × ${cols} columns, x offset ${xOff} stride ` +
        `${xStride} (seed ${rng.seed})`;
      const xAll = new Float32Array(xOff + (cols - 1) * xStride + k).fill(Number.NaN); // gaps must not be read
      for (let c = 0; c < cols; c++) xAll.set(rng.normals(k, 10 ** rng.int(-2, 2)), xOff + c * xStride);
      xAll.fill(0, xOff, xOff + Math.min(k, 32)); // an all-zero chunk
      const xBuf = upload(device, xAll, "x");
      const nwBuf = upload(device, rng.normals(k, 1), "nw");
      const words = (cols * q8xBytes(k)) / 4;
      const outs: GPUBuffer[] = [];
      const enc = device.createCommandEncoder();
      const pass = enc.beginComputePass();
      for (const quads of [false, true]) {
        const xqBuf = poisoned(device, words);
        const xnBuf = poisoned(device, xAll.length);
        outs.push(xqBuf, xnBuf);
        const shape = {
          type,
          k,
          xOffset: xOff,
          cols,
          xStride,
          round: mode === "round",
          norm: mode === "norm" ? { eps: 1e-6 } : undefined,
          quads,
        };
        const pb = device.createBuffer({ size: 16, usage: GPUBufferUsage.UNIFORM | GPUBufferUsage.COPY_DST });
        device.queue.writeBuffer(pb, 0, quantizeQ8Params(shape));
        const op = await prepareQuantizeQ8(cache, {
          device,
          shape,
          bindings: {
            params: pb,
            x: xBuf,
            xq: { buffer: xqBuf, offset: 0, size: 4 * words },
            nw: mode === "norm" ? nwBuf : undefined,
            xn: mode === "plain" ? undefined : { buffer: xnBuf, offset: 0, size: 4 * xAll.length },
          },
        });
        pass.setPipeline(op.pipeline);
        pass.setBindGroup(0, op.bindGroup);
        pass.dispatchWorkgroups(...op.grid);
      }
      pass.end();
      device.queue.submit([enc.finish()]);
      const [xq0, xn0, xq1, xn1] = await readAll(device, outs);
      assert.deepEqual(new Uint32Array(xq1!), new Uint32Array(xq0!), `${what}: xq`);
      assert.deepEqual(new Uint32Array(xn1!), new Uint32Array(xn0!), `${what}: xn`);
      assertPoisoned(new Uint32Array(xq1!, 4 * words, GUARD_WORDS), POISON_F32, `${what}: xq guard`);
      if (mode !== "plain") {
        // xn written at x's places (the per-chunk run's, compared above), not its NaN gaps' poison.
        assert.notEqual(new Uint32Array(xn1!)[xOff], POISON_F32, `${what}: xn written`);
      }
    }
  }
});

/** quantize_q8 of `shape` over `bindings`, with its params uniform made here (destroy it after the run). */
async function quantizeOp(
  device: GPUDevice,
  cache: PipelineCache,
  shape: QuantizeQ8Shape,
  bindings: Omit<QuantizeQ8Bindings, "params">,
): Promise<{ op: Q8Op; params: GPUBuffer }> {
  const params = device.createBuffer({ size: 16, usage: GPUBufferUsage.UNIFORM | GPUBufferUsage.COPY_DST });
  device.queue.writeBuffer(params, 0, quantizeQ8Params(shape));
  return { op: await prepareQuantizeQ8(cache, { device, shape, bindings: { params, ...bindings } }), params };
}

Deno.test("quantize_q8 BOTH: the columns in both byte orders, each with the bits of a dispatch in its order", async () => {
  const rng = new Rng();
  const { device } = await testGpu();
  const cache = new PipelineCache(device);
  for (const norm of [false, true]) {
    for (const type of ["Q8_0", "IQ4_XS"] as const) {
      const other = type === "Q8_0" ? "IQ4_XS" : "Q8_0";
      const k = 32 * rng.int(1, 81);
      const cols = rng.int(1, 6);
      const xStride = k + 4 * rng.int(0, 3);
      const what = `quantize_q8 BOTH ${norm ? "norm" : "plain"} ${type} K=${k} × ${cols} columns, stride ` +
        `${xStride} (seed ${rng.seed})`;
      const xAll = new Float32Array((cols - 1) * xStride + k).fill(Number.NaN); // gaps must not be read
      for (let c = 0; c < cols; c++) xAll.set(rng.normals(k, 10 ** rng.int(-2, 2)), c * xStride);
      const xBuf = upload(device, xAll, "x");
      const nwBuf = upload(device, rng.normals(k, 1), "nw");
      const words = (cols * q8xBytes(k)) / 4;
      // The second copy after a gap of 8 words that must stay poisoned.
      const alt = words + 8;
      const outs: GPUBuffer[] = [];
      const params: GPUBuffer[] = [];
      const enc = device.createCommandEncoder();
      const pass = enc.beginComputePass();
      // Both orders in one dispatch, then each order on its own.
      for (const [t, both] of [[type, alt], [type, undefined], [other, undefined]] as const) {
        const xqBuf = poisoned(device, (both ?? 0) + words);
        const xnBuf = poisoned(device, xAll.length);
        outs.push(xqBuf, xnBuf);
        const shape = { type: t, k, cols, xStride, norm: norm ? { eps: 1e-6 } : undefined, both };
        const q = await quantizeOp(device, cache, shape, {
          x: xBuf,
          xq: { buffer: xqBuf, offset: 0, size: 4 * ((both ?? 0) + words) },
          nw: norm ? nwBuf : undefined,
          xn: norm ? { buffer: xnBuf, offset: 0, size: 4 * xAll.length } : undefined,
        });
        params.push(q.params);
        encodeQ8(pass, q.op);
      }
      pass.end();
      device.queue.submit([enc.finish()]);
      const [xqBoth, xnBoth, xqOne, xnOne, xqOther] = await readAll(device, outs);
      assert.deepEqual(
        new Uint32Array(xqBoth!, 0, words),
        new Uint32Array(xqOne!, 0, words),
        `${what}: ${type}`,
      );
      assert.deepEqual(
        new Uint32Array(xqBoth!, 4 * alt, words),
        new Uint32Array(xqOther!, 0, words),
        `${what}: the ${other} copy`,
      );
      assert.deepEqual(new Uint32Array(xnBoth!), new Uint32Array(xnOne!), `${what}: xn`);
      assertPoisoned(
        new Uint32Array(xqBoth!, 4 * words, 8),
        POISON_F32,
        `${what}: the gap between the copies`,
      );
      assertPoisoned(
        new Uint32Array(xqBoth!, 4 * (alt + words), GUARD_WORDS),
        POISON_F32,
        `${what}: xq guard`,
      );
      [xBuf, nwBuf, ...outs, ...params].forEach((b) => b.destroy());
    }
  }
});

Deno.test("quantize_q8 NORM: xn has the bits of rms_norm's output, and xq is xn rounded to int8", async () => {
  const rng = new Rng();
  const { device } = await testGpu();
  const cache = new PipelineCache(device);
  for (const type of ["Q8_0", "Q4_K", "Q5_K", "Q6_K", "IQ4_XS"] as const) {
    // K above 8192 takes several workgroups, each summing x² itself.
    for (const k of [256, 256 * rng.int(33, 48)]) {
      const xOff = 4 * rng.int(1, 5);
      const eps = 1e-6;
      const what = `quantize_q8 NORM ${type} K=${k} x offset ${xOff} (seed ${rng.seed})`;
      const x = rng.normals(k, 10 ** rng.int(-2, 2));
      const nw = rng.normals(k, 1);
      const xAll = new Float32Array(xOff + k).fill(Number.NaN);
      xAll.set(x, xOff);
      const xBuf = upload(device, xAll, "x");
      const nwBuf = upload(device, nw, "nw");
      const words = q8xBytes(k) / 4;
      const xqBuf = poisoned(device, words);
      const xnBuf = poisoned(device, xOff + k);
      const pb = device.createBuffer({ size: 16, usage: GPUBufferUsage.UNIFORM | GPUBufferUsage.COPY_DST });
      const shape = { type, k, xOffset: xOff, norm: { eps } };
      device.queue.writeBuffer(pb, 0, quantizeQ8Params(shape));
      const op = await prepareQuantizeQ8(cache, {
        device,
        shape,
        bindings: {
          params: pb,
          x: xBuf,
          xq: { buffer: xqBuf, offset: 0, size: 4 * words },
          nw: nwBuf,
          xn: { buffer: xnBuf, offset: 0, size: 4 * (xOff + k) },
        },
      });
      // rms_norm on the same row (its own copy: a bound offset must be 256-byte aligned), for the bits.
      const x0Buf = upload(device, x, "x0");
      const rc: RmsNormConstants = { N: k, EPS: eps, WG: 256 };
      const rp = await cache.get(RMS_NORM, rc);
      const yBuf = poisoned(device, k);
      const rbg = rmsNormBindGroup(device, {
        pipeline: rp,
        constants: rc,
        nRows: 1,
        buffers: {
          x: x0Buf,
          w: nwBuf,
          y: { buffer: yBuf, size: 4 * k },
        },
      });
      const enc = device.createCommandEncoder();
      const pass = enc.beginComputePass();
      encodeQ8(pass, op);
      encodeRmsNorm(pass, { pipeline: rp, bindGroup: rbg, constants: rc, nRows: 1 });
      pass.end();
      device.queue.submit([enc.finish()]);
      const [xqOut, xnOut, yOut] = await readAll(device, [xqBuf, xnBuf, yBuf]);
      [xBuf, x0Buf, nwBuf, xqBuf, xnBuf, pb, yBuf].forEach((b) => b.destroy());
      assertPoisoned(new Uint32Array(xqOut!, 4 * words, GUARD_WORDS), POISON_F32, `${what} xq guard`);
      assertPoisoned(new Uint32Array(xnOut!, 0, xOff), POISON_F32, `${what} xn head`);
      assertPoisoned(new Uint32Array(xnOut!, 4 * (xOff + k), GUARD_WORDS), POISON_F32, `${what} xn guard`);
      const xn = new Float32Array(xnOut!, 4 * xOff, k);
      const y = new Float32Array(yOut!, 0, k);
      // The float64 norm, then the bits of rms_norm.
      let ss = 0;
      for (let i = 0; i < k; i++) ss += x[i]! * x[i]!;
      const scale = 1 / Math.sqrt(ss / k + eps);
      for (let i = 0; i < k; i++) {
        const ref = x[i]! * scale * nw[i]!;
        assert.ok(
          Math.abs(xn[i]! - ref) <= 1e-5 * Math.abs(ref) + 1e-30,
          `${what}: xn[${i}] = ${xn[i]} but the float64 norm is ${ref}`,
        );
        assert.ok(Object.is(xn[i], y[i]), `${what}: xn[${i}] = ${xn[i]} but rms_norm wrote ${y[i]}`);
      }
      // xq: xn rounded per chunk.
      const { q, d } = decodeXq(type, k, new Uint32Array(xqOut!, 0, words));
      for (let c = 0; c < k / 32; c++) {
        let amax = 0;
        for (let i = 0; i < 32; i++) amax = Math.max(amax, Math.abs(xn[32 * c + i]!));
        assert.ok(Math.abs(d[c]! - amax / 127) <= 2 ** -22 * amax / 127, `${what}: chunk ${c} scale ${d[c]}`);
        for (let i = 0; i < 32; i++) {
          const e = 32 * c + i;
          assert.ok(
            Math.abs(q[e]! - xn[e]! / d[c]!) <= 0.5 + 1e-4,
            `${what}: element ${e} q ${q[e]} but xn/d = ${xn[e]! / d[c]!}`,
          );
        }
      }
    }
  }
});

/** quantize_q8 NORM over `cols` columns of x (stride `xStride`): the xq words and the whole xn buffer. */
async function quantizeNorm(
  device: GPUDevice,
  cache: PipelineCache,
  type: GgmlTypeName,
  x: Float32Array,
  nw: Float32Array,
  shape: { k: number; cols: number; xStride: number },
): Promise<{ xq: Uint32Array; xn: Float32Array }> {
  const { k, cols, xStride } = shape;
  const xBuf = upload(device, x, "x");
  const nwBuf = upload(device, nw, "nw");
  const words = (cols * q8xBytes(k)) / 4;
  const xqBuf = poisoned(device, words);
  const xnBuf = poisoned(device, x.length);
  const pb = device.createBuffer({ size: 16, usage: GPUBufferUsage.UNIFORM | GPUBufferUsage.COPY_DST });
  const qs = { type, k, cols, xStride, norm: { eps: 1e-6 } };
  device.queue.writeBuffer(pb, 0, quantizeQ8Params(qs));
  const op = await prepareQuantizeQ8(cache, {
    device,
    shape: qs,
    bindings: {
      params: pb,
      x: xBuf,
      xq: { buffer: xqBuf, offset: 0, size: 4 * words },
      nw: nwBuf,
      xn: { buffer: xnBuf, offset: 0, size: 4 * x.length },
    },
  });
  const enc = device.createCommandEncoder();
  const pass = enc.beginComputePass();
  encodeQ8(pass, op);
  pass.end();
  device.queue.submit([enc.finish()]);
  const [xqOut, xnOut] = await readAll(device, [xqBuf, xnBuf]);
  [xBuf, nwBuf, xqBuf, xnBuf, pb].forEach((b) => b.destroy());
  return { xq: new Uint32Array(xqOut!, 0, words), xn: new Float32Array(xnOut!, 0, x.length) };
}

Deno.test("quantize_q8 NORM over columns: each column's xq and xn bits as its own NORM dispatch", async () => {
  const rng = new Rng();
  const { device } = await testGpu();
  const cache = new PipelineCache(device);
  for (const type of ["Q8_0", "IQ4_XS"] as const) {
    for (const k of [256, 256 * rng.int(33, 40)]) {
      const cols = rng.int(2, 5);
      const xStride = k + 4 * rng.int(0, 3);
      const what = `quantize_q8 NORM ${type} K=${k} × ${cols} columns, stride ${xStride} (seed ${rng.seed})`;
      const x = new Float32Array((cols - 1) * xStride + k).fill(Number.NaN); // gaps must not be read
      for (let c = 0; c < cols; c++) x.set(rng.normals(k, 10 ** rng.int(-2, 2)), c * xStride);
      const nw = rng.normals(k, 1);
      const all = await quantizeNorm(device, cache, type, x, nw, { k, cols, xStride });
      for (let c = 0; c < cols; c++) {
        const one = await quantizeNorm(device, cache, type, x.slice(c * xStride, c * xStride + k), nw, {
          k,
          cols: 1,
          xStride: k,
        });
        const w = q8xBytes(k) / 4;
        assert.deepEqual(all.xq.subarray(c * w, (c + 1) * w), one.xq, `${what}: column ${c} int8 x`);
        const xn = all.xn.subarray(c * xStride, c * xStride + k);
        for (let i = 0; i < k; i++) {
          assert.ok(
            Object.is(xn[i], one.xn[i]),
            `${what}: column ${c} xn[${i}] ${xn[i]}, alone ${one.xn[i]}`,
          );
        }
      }
    }
  }
});

interface Case {
  shape: MatvecQ8Shape;
  constants: MatvecQ8Constants;
  what: string;
}

function cases(rng: Rng, type: GgmlTypeName): Case[] {
  const be = type === "Q8_0" ? 32 : 256;
  const list: {
    shape: MatvecQ8Shape;
    opts?: Parameters<typeof matvecQ8Constants>[1];
  }[] = [
    { shape: { type, k: be, n: 1 } }, // debug: one block, one row
    { shape: { type, k: 3 * be, n: 37 }, opts: { rows: 4 } }, // N not a multiple of the rows per workgroup
    { shape: { type, k: 5 * be, n: 21 }, opts: { rows: 3, team: 4 } }, // a team smaller than the chunks
    { shape: { type, k: 2 * be, n: 19 }, opts: { rows: 2, team: 64 } }, // a team larger than the chunks
    { shape: { type, k: 3 * be, n: 23 }, opts: { rows: 4, team: 2 } }, // fewer lanes than rows per team
    { shape: { type, k: 4 * be, n: 17 }, opts: { rows: 1, team: 8 } }, // one run of 8 per row
    // The other team reduction (one invocation per row), a team larger and one smaller than the rows.
    { shape: { type, k: 4 * be, n: 29 }, opts: { rows: 3, team: 16, red: 0 } },
    { shape: { type, k: 2 * be, n: 13 }, opts: { rows: 4, team: 2, red: 0, acc: true } },
    // Several row groups per workgroup (N not a multiple of them), with table copies (IQ4_XS reads them).
    { shape: { type, k: 2 * be, n: 230 }, opts: { rows: 2, team: 16, groups: 3, copies: 16 } },
    { shape: { type, k: 3 * be, n: 70 }, opts: { rows: 4, team: 32, groups: 2, copies: 4, red: 0 } },
    // The next chunk's loads before this one's math: steps of one, several and none per lane (ROWS 3, 1).
    { shape: { type, k: 5 * be, n: 45 }, opts: { rows: 3, team: 2, pf: 1 } },
    { shape: { type, k: 2 * be, n: 33 }, opts: { rows: 1, team: 8, pf: 1, red: 0, acc: true } },
    // A slice: rows at a byte offset, y at an offset, y += W·x.
    {
      shape: { type, k: be * rng.int(1, 4), n: rng.int(1, 40), wOffsetBytes: 8 * rng.int(1, 20), yOffset: 5 },
      opts: { acc: true },
    },
    { shape: { type, k: be * rng.int(1, 9), n: rng.int(1, 90) } }, // random, default constants
  ];
  if (type === "IQ4_XS") {
    list.push({ shape: { type, k: 2048, n: 40 }, opts: { rows: 4 } }); // real K, TEAM 32
    list.push({ shape: { type, k: 256, n: 8200 } }); // the tall defaults: TEAM 8 (K), ROWS 1, RED 0
    list.push({ shape: { type, k: 256, n: 32800 } }); // from 32768 rows ROWS 4
  } else list.push({ shape: { type, k: 2048, n: 9000 } }); // real K, the tall defaults: TEAM 16, RED 0
  return list.map(({ shape, opts }) => {
    const constants = matvecQ8Constants(shape, opts);
    return {
      shape,
      constants,
      what: `matvec_q8 ${type} ne=[${shape.k}, ${shape.n}] ${JSON.stringify(constants)}`,
    };
  });
}

Deno.test("matvec_q8 equals the float64 product of the dequantized weights and the dequantized int8 x", async () => {
  const rng = new Rng();
  const { device } = await testGpu();
  const cache = new PipelineCache(device);
  const failures: string[] = [];
  for (const type of ["Q8_0", "Q4_K", "Q5_K", "Q6_K", "IQ4_XS"] as const) {
    for (const c of cases(rng, type)) {
      const s = c.shape;
      const x = rng.normals(s.k);
      const { words } = await quantize(device, cache, type, x, 0);
      const { deq } = decodeXq(type, s.k, words);
      const bytes = randomWeights(rng, type, s.k, s.n);
      const wOff = s.wOffsetBytes ?? 0;
      const wAll = new Uint8Array(wOff + bytes.length);
      wAll.set(bytes, wOff);
      const yOff = s.yOffset ?? 0;
      const yWords = yOff + s.n;
      const y0 = rng.normals(s.n); // ACC: the values y starts with
      const wBuf = upload(device, wAll, "weights");
      const xqBuf = upload(device, words, "xq");
      const yBuf = poisoned(device, yWords);
      if (c.constants.ACC) device.queue.writeBuffer(yBuf, 4 * yOff, y0);
      const pb = device.createBuffer({ size: 256, usage: GPUBufferUsage.UNIFORM | GPUBufferUsage.COPY_DST });
      device.queue.writeBuffer(pb, 0, matvecQ8Params(s));
      const op = await prepareMatvecQ8(cache, {
        device,
        shape: s,
        constants: c.constants,
        bindings: {
          params: { buffer: pb, offset: 0, size: MATVEC_Q8_PARAMS_BYTES },
          weights: wBuf,
          xq: xqBuf,
          y: { buffer: yBuf, offset: 0, size: 4 * yWords },
        },
      });
      const enc = device.createCommandEncoder();
      const pass = enc.beginComputePass();
      encodeQ8(pass, op);
      pass.end();
      device.queue.submit([enc.finish()]);
      const [out] = await readAll(device, [yBuf]);
      [wBuf, xqBuf, yBuf, pb].forEach((b) => b.destroy());
      const xf = new Float32Array(deq); // d·q is exact in f32 (8-bit q times an f32 d)
      const { ref, mag } = refProduct(type, bytes, { k: s.k, n: s.n, cols: 1, x: xf });
      if (c.constants.ACC) {
        for (let r = 0; r < s.n; r++) {
          ref[r] = ref[r]! + y0[r]!;
          mag[r] = mag[r]! + Math.abs(y0[r]!);
        }
      }
      try {
        assertDotClose(new Float32Array(out!, 4 * yOff, s.n), ref, mag, { what: c.what, seed: rng.seed });
        assertPoisoned(new Uint32Array(out!, 0, yOff), POISON_F32, `${c.what} head (seed ${rng.seed})`);
        assertPoisoned(
          new Uint32Array(out!, 4 * yWords, GUARD_WORDS),
          POISON_F32,
          `${c.what} (seed ${rng.seed})`,
        );
      } catch (e) {
        failures.push((e as Error).message);
      }
    }
  }
  if (failures.length > 0) throw new Error(`${failures.length} cases failed:\n${failures.join("\n")}`);
});

Deno.test("matvec_q8_fused gives the bits of quantize_q8 then matvec_q8: the int8 x, the normed x and y", async () => {
  const rng = new Rng();
  const { device } = await testGpu();
  const cache = new PipelineCache(device);
  const failures: string[] = [];
  for (const type of ["Q8_0", "Q4_K", "Q5_K", "Q6_K", "IQ4_XS"] as const) {
    const be = type === "Q8_0" ? 32 : 256;
    const list: { shape: MatvecQ8FusedShape; opts?: Parameters<typeof matvecQ8Constants>[1] }[] = [
      { shape: { type, k: be, n: 1 } },
      // A norm, x at an offset, several workgroups (only workgroup 0 writes xo and xn).
      { shape: { type, k: 2048, n: 300, xOffset: 8, norm: { eps: 1e-6 } } },
      // More chunks than invocations (each takes two), y += W·x at an offset.
      { shape: { type, k: 9216, n: 9, yOffset: 3, norm: { eps: 1e-5 } }, opts: { acc: true } },
      // The tall defaults (IQ4_XS: ROWS 4), row groups, table copies.
      { shape: { type, k: 512, n: 8200, xOffset: 4 } },
      { shape: { type, k: 4 * be, n: 70 }, opts: { rows: 2, team: 8, groups: 3, copies: 4, red: 0 } },
      { shape: { type, k: 3 * be, n: 50, norm: { eps: 1e-6 } }, opts: { rows: 4, team: 4, pf: 1 } },
    ];
    for (const { shape: s, opts } of list) {
      const c = matvecQ8FusedConstants(s, opts);
      const what =
        `matvec_q8_fused ${type} ne=[${s.k}, ${s.n}] x offset ${s.xOffset ?? 0} norm ${!!s.norm} ` +
        `${JSON.stringify(c)} (seed ${rng.seed})`;
      const xOff = s.xOffset ?? 0;
      const yOff = s.yOffset ?? 0;
      const x = rng.normals(s.k, 10 ** rng.int(-2, 2));
      const xAll = new Float32Array(xOff + s.k).fill(Number.NaN); // the offset's gap must not be read
      xAll.set(x, xOff);
      const nw = rng.normals(s.k, 1);
      const bytes = randomWeights(rng, type, s.k, s.n);
      const y0 = rng.normals(yOff + s.n);
      const qWords = q8xBytes(s.k) / 4;
      const xBuf = upload(device, xAll, "x");
      const nwBuf = upload(device, nw, "nw");
      const wBuf = upload(device, bytes, "weights");
      // Two-dispatch path: quantize_q8 into xq (xn1), matvec_q8 into y1; fused: xo, xn2, y2.
      const xqBuf = poisoned(device, qWords);
      const xoBuf = poisoned(device, qWords);
      const xn1Buf = poisoned(device, xOff + s.k);
      const xn2Buf = poisoned(device, xOff + s.k);
      const y1Buf = poisoned(device, yOff + s.n);
      const y2Buf = poisoned(device, yOff + s.n);
      if (c.ACC) [y1Buf, y2Buf].forEach((b) => device.queue.writeBuffer(b, 0, y0));
      const uniform = (data: Uint32Array<ArrayBuffer>) => {
        const b = device.createBuffer({ size: 256, usage: GPUBufferUsage.UNIFORM | GPUBufferUsage.COPY_DST });
        device.queue.writeBuffer(b, 0, data);
        return b;
      };
      const qShape = { type, k: s.k, xOffset: xOff, norm: s.norm };
      const qp = uniform(quantizeQ8Params(qShape));
      const mp = uniform(matvecQ8Params(s));
      const nb = (xn: GPUBuffer) =>
        s.norm ? { nw: nwBuf, xn: { buffer: xn, offset: 0, size: 4 * (xOff + s.k) } } : {};
      const qop = await prepareQuantizeQ8(cache, {
        device,
        shape: qShape,
        bindings: { params: qp, x: xBuf, xq: { buffer: xqBuf, offset: 0, size: 4 * qWords }, ...nb(xn1Buf) },
      });
      const { NORM: _n, EPS: _e, KC: _k, ...body } = c;
      const mop = await prepareMatvecQ8(cache, {
        device,
        shape: s,
        constants: body,
        bindings: {
          params: { buffer: mp, offset: 0, size: MATVEC_Q8_PARAMS_BYTES },
          weights: wBuf,
          xq: { buffer: xqBuf, offset: 0, size: 4 * qWords },
          y: { buffer: y1Buf, offset: 0, size: 4 * (yOff + s.n) },
        },
      });
      const fop = await prepareMatvecQ8Fused(cache, {
        device,
        shape: s,
        constants: c,
        bindings: {
          params: { buffer: mp, offset: 0, size: MATVEC_Q8_PARAMS_BYTES },
          weights: wBuf,
          x: xBuf,
          ...nb(xn2Buf),
          xo: { buffer: xoBuf, offset: 0, size: 4 * qWords },
          y: { buffer: y2Buf, offset: 0, size: 4 * (yOff + s.n) },
        },
      });
      const enc = device.createCommandEncoder();
      for (const op of [qop, mop, fop]) {
        const pass = enc.beginComputePass();
        encodeQ8(pass, op);
        pass.end();
      }
      device.queue.submit([enc.finish()]);
      const [xq, xo, xn1, xn2, y1, y2] = await readAll(device, [xqBuf, xoBuf, xn1Buf, xn2Buf, y1Buf, y2Buf]);
      [xBuf, nwBuf, wBuf, xqBuf, xoBuf, xn1Buf, xn2Buf, y1Buf, y2Buf, qp, mp].forEach((b) => b.destroy());
      try {
        const same = (a: ArrayBuffer, b: ArrayBuffer, n: number, name: string) => {
          const u = new Uint32Array(a, 0, n);
          const v = new Uint32Array(b, 0, n);
          const i = u.findIndex((w, j) => w !== v[j]);
          assert.ok(i < 0, `${what}: ${name} word ${i} is ${v[i]} fused but ${u[i]} from the two dispatches`);
        };
        same(xq!, xo!, qWords + GUARD_WORDS, "xo");
        if (s.norm) same(xn1!, xn2!, xOff + s.k + GUARD_WORDS, "xn");
        else assertPoisoned(new Uint32Array(xn2!), POISON_F32, `${what}: xn without a norm`);
        same(y1!, y2!, yOff + s.n + GUARD_WORDS, "y");
        assertPoisoned(new Uint32Array(xo!, 4 * qWords, GUARD_WORDS), POISON_F32, `${what}: xo guard`);
        assertPoisoned(new Uint32Array(y2!, 4 * (yOff + s.n), GUARD_WORDS), POISON_F32, `${what}: y guard`);
        // And y against the float64 product with the int8 x it logged.
        const { deq } = decodeXq(type, s.k, new Uint32Array(xo!, 0, qWords));
        const { ref, mag } = refProduct(type, bytes, { k: s.k, n: s.n, cols: 1, x: new Float32Array(deq) });
        if (c.ACC) {
          for (let r = 0; r < s.n; r++) {
            ref[r] = ref[r]! + y0[yOff + r]!;
            mag[r] = mag[r]! + Math.abs(y0[yOff + r]!);
          }
        }
        assertDotClose(new Float32Array(y2!, 4 * yOff, s.n), ref, mag, { what, seed: rng.seed });
      } catch (e) {
        failures.push((e as Error).message);
      }
    }
  }
  if (failures.length > 0) throw new Error(`${failures.length} cases failed:\n${failures.join("\n")}`);
});

Deno.test("matvec_q8 and quantize_q8 checks throw before encoding", async () => {
  const buf = (size: number) => {
    const b = { size } as unknown as GPUBuffer;
    Object.setPrototypeOf(b, GPUBuffer.prototype);
    return b;
  };
  const big = buf(1 << 20);
  const shape: MatvecQ8Shape = { type: "IQ4_XS", k: 512, n: 4 };
  const b = { params: big, weights: big, xq: big, y: big };
  const c = matvecQ8Constants(shape);
  assert.throws(
    () => checkMatvecQ8({ ...shape, type: "Q4_0" }, c, b),
    /read Q8_0, Q4_K, Q5_K, Q6_K or IQ4_XS weights, not Q4_0/,
  );
  assert.throws(() => checkMatvecQ8({ ...shape, k: 480 }, c, b), /K=480/);
  assert.throws(() => checkMatvecQ8({ ...shape, wOffsetBytes: 4 }, c, b), /multiple of 8/);
  assert.throws(() => checkMatvecQ8(shape, { ...c, ROWS: 5 }, b), /ROWS must be an integer in \[1, 4\]/);
  assert.throws(() => checkMatvecQ8(shape, { ...c, RED: 2 }, b), /RED must be an integer in \[0, 1\]/);
  assert.throws(() => checkMatvecQ8(shape, { ...c, COPIES: 3 }, b), /COPIES=3 must be 1, 2, 4, 8, 16 or 32/);
  assert.throws(() => checkMatvecQ8(shape, { ...c, GROUPS: 0 }, b), /GROUPS must be an integer in \[1, 64\]/);
  assert.throws(() => checkMatvecQ8(shape, { ...c, PF: 2 }, b), /PF must be an integer in \[0, 1\]/);
  assert.throws(() => checkMatvecQ8(shape, { ...c, TYPE: 8 }, b), /TYPE=8 but the shape says IQ4_XS/);
  assert.throws(() => checkMatvecQ8(shape, c, { ...b, xq: buf(q8xBytes(512) - 4) }), /binding xq/);
  assert.throws(() => checkMatvecQ8(shape, c, { ...b, weights: buf(4 * 136 - 8) }), /binding weights/);
  const fs: MatvecQ8FusedShape = { ...shape, norm: { eps: 1e-6 } };
  const fc = matvecQ8FusedConstants(fs);
  const fb = { params: big, weights: big, x: big, nw: big, xn: big, xo: big, y: big };
  checkMatvecQ8Fused(fs, fc, fb);
  assert.throws(() => checkMatvecQ8Fused(fs, { ...fc, KC: 8 }, fb), /KC=8 but K=512 has 16 chunks/);
  assert.throws(
    () => checkMatvecQ8Fused({ ...fs, norm: undefined }, fc, fb),
    /NORM=1 but the shape has no norm/,
  );
  assert.throws(() => checkMatvecQ8Fused(fs, fc, { ...fb, nw: undefined }), /needs the nw and xn/);
  assert.throws(() => checkMatvecQ8Fused({ ...fs, xOffset: 6 }, fc, fb), /x offset 6/);
  assert.throws(() => checkMatvecQ8Fused(fs, fc, { ...fb, xo: buf(q8xBytes(512) - 4) }), /binding xo/);
  assert.throws(() => checkMatvecQ8Fused(fs, fc, { ...fb, x: buf(2044) }), /binding x holds/);
  assert.throws(() => checkMatvecQ8Fused(fs, { ...fc, ROWS: 0 }, fb), /matvec_q8_fused: ROWS/);
  // Workgroup memory over the device's limit: refused before compiling, naming the fix.
  const small = { limits: { maxComputeWorkgroupStorageSize: 16384 } } as unknown as GPUDevice;
  const cache = {} as PipelineCache;
  await assert.rejects(
    prepareMatvecQ8(cache, { device: small, shape, bindings: b, constants: { ...c, COPIES: 16 } }),
    /COPIES=16, ROWS=1 need 17408 bytes of workgroup memory, the device has 16384: use fewer copies/,
  );
  await assert.rejects(
    prepareMatvecQ8Fused(cache, { device: small, shape: fs, bindings: fb, constants: { ...fc, COPIES: 16 } }),
    /matvec_q8_fused: K=512, COPIES=16, ROWS=1 need 19008 bytes .* use quantize_q8 and matvec_q8/,
  );
  const q = { params: buf(QUANTIZE_Q8_PARAMS_BYTES), x: big, xq: big };
  assert.throws(() => checkQuantizeQ8({ type: "Q8_0", k: 48 }, q), /K=48/);
  // Both byte orders: the second copy after the first, with quads, and room for both.
  const w64 = q8xBytes(64) / 4;
  checkQuantizeQ8({ type: "Q8_0", k: 64, cols: 2, both: 2 * w64 }, { ...q, xq: buf(16 * w64) });
  assert.throws(
    () => checkQuantizeQ8({ type: "Q8_0", k: 64, cols: 2, both: w64 }, q),
    /must follow the first/,
  );
  assert.throws(
    () => checkQuantizeQ8({ type: "Q8_0", k: 64, cols: 2, both: 2 * w64, quads: false }, q),
    /with quads/,
  );
  assert.throws(
    () => checkQuantizeQ8({ type: "Q8_0", k: 64, cols: 2, both: 2 * w64 }, { ...q, xq: buf(12 * w64) }),
    /binding xq/,
  );
  assert.throws(
    () => checkQuantizeQ8({ type: "Q8_0", k: 64, norm: { eps: 1e-6 } }, q),
    /needs the nw and xn/,
  );
  assert.throws(
    () => checkQuantizeQ8({ type: "Q8_0", k: 64, norm: { eps: 0 } }, { ...q, nw: buf(256), xn: buf(256) }),
    /epsilon 0/,
  );
  assert.throws(
    () => checkQuantizeQ8({ type: "Q8_0", k: 64, norm: { eps: 1e-6 } }, { ...q, nw: buf(128), xn: buf(256) }),
    /binding nw/,
  );
  assert.throws(() => checkQuantizeQ8({ type: "F16", k: 64 }, q), /not F16/);
  assert.throws(() => checkQuantizeQ8({ type: "Q8_0", k: 64, xOffset: 2 }, q), /multiple of 4/);
  assert.throws(
    () => checkQuantizeQ8({ type: "Q8_0", k: 64 }, { ...q, xq: buf(q8xBytes(64) - 4) }),
    /binding xq/,
  );
});
