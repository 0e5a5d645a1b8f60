import assert from "node:assert/strict";
import { PipelineCache } from "./kernel.ts";
import type { GgmlTypeName } from "../engine/quant/types.ts";
import { Rng } from "../tests/util/rng.ts";
import { assertPoisoned } from "../tests/util/close.ts";
import { GUARD_WORDS, POISON_F32, poisoned, readAll, testGpu, upload } from "../tests/util/gpu.ts";
import { assertDotClose, randomWeights, refProduct } from "./_quant_testing.ts";
import { quantizeOnGpu } from "./_q8_testing.ts";
import {
  decodeQ8x,
  encodeQ8,
  MATVEC_Q8_PARAMS_BYTES,
  matvecQ8Constants,
  matvecQ8Params,
  prepareMatvecQ8,
  q8xBytes,
} from "./matvec_q8.ts";
import {
  checkMatvecQ8b,
  MATVEC_Q8B_PARAMS_BYTES,
  matvecQ8bConstants,
  matvecQ8bParams,
  type MatvecQ8bShape,
  matvecQ8bWorkgroupBytes,
  prepareMatvecQ8b,
} from "./matvec_q8b.ts";

type Opts = Parameters<typeof matvecQ8bConstants>[1];

/** Cases of one type: every column count class, both reductions and ROWS, ACC, slices and strides. */
function cases(rng: Rng, type: GgmlTypeName): { shape: MatvecQ8bShape; opts: Opts }[] {
  const be = type === "Q8_0" ? 32 : 256;
  // Where K % 128 != 0 quantize_q8's packing (9K/8 bytes a column) is no multiple of 16: columns padded.
  const pad = (k: number) => k % 128 === 0 ? undefined : 16 * Math.ceil(q8xBytes(k) / 16);
  const list: { shape: MatvecQ8bShape; opts: Opts }[] = [
    { shape: { type, k: be, n: 3, cols: 2 }, opts: {} }, // debug: one block, a pair of columns
    // A column group and a part of one; TEAM above the chunks; RED 0 (with ROWS 2: rows per workgroup a
    // multiple of TEAM) and ACC.
    { shape: { type, k: 3 * be, n: 37, cols: 5 }, opts: { rows: 2, team: 64 } },
    { shape: { type, k: 4 * be, n: 29, cols: 8 }, opts: { team: 16, red: 0, acc: true } },
    { shape: { type, k: 2 * be, n: 45, cols: 11 }, opts: { rows: 2, team: 4, red: 0 } },
    // ROWS 3 and 4 (RED 0 at TEAM 16: 48 and 64 rows per workgroup).
    { shape: { type, k: 3 * be, n: 53, cols: 13 }, opts: { rows: 4, team: 16, red: 0 } },
    { shape: { type, k: 2 * be, n: 21, cols: 6 }, opts: { rows: 3, team: 16, red: 0 } },
    { shape: { type, k: be, n: 70, cols: 9 }, opts: { rows: 4 } },
    // 16 columns, a slice: rows at a byte offset, y at an offset with a padded stride, x columns padded.
    {
      shape: {
        type,
        k: be * rng.int(1, 4),
        n: rng.int(1, 40),
        cols: 16,
        wOffsetBytes: 8 * rng.int(1, 20),
        yOffset: 5,
        yStride: 50,
        xStrideBytes: 16 * Math.ceil(q8xBytes(be * 4) / 16) + 32,
      },
      opts: { acc: true, rows: 2 },
    },
    // Real K and the solo defaults (tall: TEAM 16, RED 0).
    { shape: { type, k: 2048, n: rng.int(8192, 8300), cols: rng.int(2, 16) }, opts: {} },
  ];
  return list.map(({ shape, opts }) => ({
    shape: shape.xStrideBytes === undefined ? { ...shape, xStrideBytes: pad(shape.k) } : shape,
    opts,
  }));
}

/** Runs one dispatch (matvec_q8 or matvec_q8b) into a fresh pass. */
function run(device: GPUDevice, op: Parameters<typeof encodeQ8>[1]): void {
  const enc = device.createCommandEncoder();
  const pass = enc.beginComputePass();
  encodeQ8(pass, op);
  pass.end();
  device.queue.submit([enc.finish()]);
}

Deno.test("matvec_q8b: each column equals the float64 product and matvec_q8's bits for that column alone", async () => {
  const rng = new Rng();
  const { device } = await testGpu();
  const cache = new PipelineCache(device);
  const failures: string[] = [];
  let xsumRuns = 0;
  let noXsumRuns = 0;
  const cases2 = (type: GgmlTypeName) =>
    cases(rng, type).flatMap(({ shape, opts }, i, all) =>
      // The K-quants with XSUM (each column's x sums once per workgroup) where it fits, and without it on the
      // first case and the real K (CI time).
      type.endsWith("_K")
        ? [true, ...(i === 0 || i === all.length - 1 ? [false] : [])].map((xsum) => ({
          shape,
          opts: { ...opts, xsum },
        }))
        : [{ shape, opts }]
    ).filter(({ shape, opts }) =>
      matvecQ8bWorkgroupBytes(matvecQ8bConstants(shape, opts)) <= device.limits.maxComputeWorkgroupStorageSize
    );
  for (const type of ["Q8_0", "Q4_K", "Q5_K", "Q6_K", "IQ4_XS"] as const) {
    for (const { shape: s, opts } of cases2(type)) {
      const c = matvecQ8bConstants(s, opts);
      if (c.XSUM > 0) xsumRuns++;
      else if (type.endsWith("_K")) noXsumRuns++;
      const what = `matvec_q8b ${type} ne=[${s.k}, ${s.n}] × ${s.cols} ${JSON.stringify(c)}`;
      const xStride = s.xStrideBytes ?? q8xBytes(s.k);
      // Each column's int8 x (quantize_q8's bits, tested column by column elsewhere), at its stride.
      const xqAll = new Uint8Array((s.cols - 1) * xStride + q8xBytes(s.k)).fill(0xff);
      const deq = new Float32Array(s.k * s.cols);
      const cols: Uint32Array[] = [];
      for (let j = 0; j < s.cols; j++) {
        const { words } = await quantizeOnGpu(device, cache, type, rng.normals(s.k, 10 ** rng.int(-1, 1)));
        cols.push(words);
        xqAll.set(new Uint8Array(words.buffer, words.byteOffset, q8xBytes(s.k)), j * xStride);
        const { q, d } = decodeQ8x(type, s.k, new Uint8Array(words.buffer, words.byteOffset, q8xBytes(s.k)));
        for (let i = 0; i < s.k; i++) deq[j * s.k + i] = d[i >> 5]! * q[i]!; // d·q: exact in f32
      }
      const bytes = randomWeights(rng, type, s.k, s.n);
      const wOff = s.wOffsetBytes ?? 0;
      const wAll = new Uint8Array(wOff + bytes.length);
      wAll.set(bytes, wOff);
      const yOff = s.yOffset ?? 0;
      const yStride = s.yStride ?? s.n;
      const yWords = yOff + (s.cols - 1) * yStride + s.n;
      const y0 = rng.normals(yWords); // ACC: the values y starts with
      const wBuf = upload(device, wAll, "weights");
      const xqBuf = upload(device, xqAll, "xq");
      const yBuf = poisoned(device, yWords);
      if (c.ACC) {
        for (let j = 0; j < s.cols; j++) {
          const at = yOff + j * yStride;
          device.queue.writeBuffer(yBuf, 4 * at, y0.subarray(at, at + s.n));
        }
      }
      const pb = device.createBuffer({ size: 256, usage: GPUBufferUsage.UNIFORM | GPUBufferUsage.COPY_DST });
      device.queue.writeBuffer(pb, 0, matvecQ8bParams(s));
      run(
        device,
        await prepareMatvecQ8b(cache, {
          device,
          shape: s,
          constants: c,
          bindings: {
            params: { buffer: pb, offset: 0, size: MATVEC_Q8B_PARAMS_BYTES },
            weights: wBuf,
            xq: xqBuf,
            y: { buffer: yBuf, offset: 0, size: 4 * yWords },
          },
        }),
      );
      const [out] = await readAll(device, [yBuf]);
      const got = new Float32Array(out!);
      const { ref, mag } = refProduct(type, bytes, { k: s.k, n: s.n, cols: s.cols, x: deq });
      try {
        for (let j = 0; j < s.cols; j++) {
          const at = yOff + j * yStride;
          const want = ref.subarray(j * s.n, (j + 1) * s.n);
          const m = mag.subarray(j * s.n, (j + 1) * s.n);
          if (c.ACC) {
            for (let r = 0; r < s.n; r++) {
              want[r] = want[r]! + y0[at + r]!;
              m[r] = m[r]! + Math.abs(y0[at + r]!);
            }
          }
          assertDotClose(got.subarray(at, at + s.n), want, m, {
            what: `${what} column ${j}`,
            seed: rng.seed,
          });
          // The gap after the column's rows keeps its poison.
          const gap = j + 1 < s.cols ? yStride - s.n : 0;
          assertPoisoned(new Uint32Array(out!, 4 * (at + s.n), gap), POISON_F32, `${what} gap ${j}`);
          // matvec_q8 on this column alone (same TEAM and RED, its own ROWS default): the same bits.
          const solo = matvecQ8Constants(s, { team: c.TEAM, red: c.RED, acc: c.ACC === 1 });
          const one = { type, k: s.k, n: s.n, wOffsetBytes: wOff };
          const colBuf = upload(device, cols[j]!, "xq column");
          const soloY = device.createBuffer({
            size: 4 * s.n,
            usage: GPUBufferUsage.STORAGE | GPUBufferUsage.COPY_SRC | GPUBufferUsage.COPY_DST,
          });
          device.queue.writeBuffer(soloY, 0, y0.subarray(at, at + s.n));
          const spb = device.createBuffer({
            size: 256,
            usage: GPUBufferUsage.UNIFORM | GPUBufferUsage.COPY_DST,
          });
          device.queue.writeBuffer(spb, 0, matvecQ8Params(one));
          run(
            device,
            await prepareMatvecQ8(cache, {
              device,
              shape: one,
              constants: solo,
              bindings: {
                params: { buffer: spb, offset: 0, size: MATVEC_Q8_PARAMS_BYTES },
                weights: wBuf,
                xq: colBuf,
                y: soloY,
              },
            }),
          );
          const [soloOut] = await readAll(device, [soloY]);
          [colBuf, soloY, spb].forEach((b) => b.destroy());
          const sy = new Float32Array(soloOut!, 0, s.n);
          for (let r = 0; r < s.n; r++) {
            assert.ok(
              Object.is(got[at + r], sy[r]),
              `${what}: column ${j} row ${r} is ${got[at + r]}, matvec_q8 alone ${sy[r]} (ROWS ${solo.ROWS})`,
            );
          }
        }
        assertPoisoned(new Uint32Array(out!, 0, yOff), POISON_F32, `${what} head`);
        assertPoisoned(new Uint32Array(out!, 4 * yWords, GUARD_WORDS), POISON_F32, `${what} tail`);
      } catch (e) {
        failures.push(`${(e as Error).message} (seed ${rng.seed})`);
      }
      [wBuf, xqBuf, yBuf, pb].forEach((b) => b.destroy());
    }
  }
  if (failures.length > 0) throw new Error(`${failures.length} cases failed:\n${failures.join("\n")}`);
  assert.ok(xsumRuns >= 15, `the K-quants ran with XSUM (${xsumRuns} cases)`);
  assert.ok(noXsumRuns >= 6, `the K-quants ran without XSUM (${noXsumRuns} cases)`);
});

Deno.test("matvec_q8b checks throw before encoding", () => {
  const shape: MatvecQ8bShape = { type: "Q8_0", k: 128, n: 8, cols: 4 };
  const c = matvecQ8bConstants(shape);
  const slice = (size: number) => ({ buffer: {} as GPUBuffer, offset: 0, size });
  // Q8_0 K=128: rows of 136 bytes; x columns of 144 bytes.
  const ok = { params: slice(32), weights: slice(8 * 136), xq: slice(4 * 144), y: slice(4 * 32) };
  checkMatvecQ8b(shape, c, ok);
  assert.throws(() => checkMatvecQ8b(shape, { ...c, BATCH: 5 }, ok), /BATCH=5 but the shape has 4 columns/);
  assert.throws(() => checkMatvecQ8b({ ...shape, cols: 17 }, { ...c, BATCH: 17 }, ok), /BATCH must be/);
  assert.throws(() => checkMatvecQ8b(shape, { ...c, ROWS: 5 }, ok), /ROWS must be/);
  assert.throws(
    () => checkMatvecQ8b(shape, { ...c, XSUM: 4 }, ok),
    /XSUM=4 must be 0, or K\/32 = 4 with Q4_K/,
  );
  const q6: MatvecQ8bShape = { ...shape, type: "Q6_K", k: 256 };
  assert.equal(matvecQ8bConstants(q6).XSUM, 8, "Q6_K: XSUM K/32 where it fits");
  assert.equal(matvecQ8bConstants(q6, { xsum: false }).XSUM, 0);
  assert.equal(matvecQ8bConstants({ ...q6, k: 4096, cols: 16 }).XSUM, 0, "not where it does not fit 16 KiB");
  assert.equal(matvecQ8bConstants(shape, { xsum: true }).XSUM, 0, "Q8_0 has no x sums");
  // ROWS by shape (the bits do not depend on it): small, middling, tall, and the LM head by columns.
  const rowsOf = (n: number, cols: number, maxWorkgroupBytes = 32768) =>
    matvecQ8bConstants({ ...shape, n, cols }, { maxWorkgroupBytes }).ROWS;
  assert.deepEqual([
    rowsOf(512, 16),
    rowsOf(4096, 16),
    rowsOf(12352, 8),
    rowsOf(248320, 8),
    rowsOf(248320, 16),
  ], [
    1,
    2,
    2,
    2,
    3,
  ]);
  assert.equal(matvecQ8bConstants({ ...shape, n: 512 }, { rows: 2 }).ROWS, 2, "an asked ROWS wins");
  assert.equal(rowsOf(248320, 16, 12288), 2, "ROWS 3's partials (13,320 bytes) do not fit 12 KiB: 2");
  assert.throws(() => checkMatvecQ8b({ ...shape, type: "F32" }, c, ok), /not F32: use matvec/);
  assert.throws(
    () => checkMatvecQ8b(shape, c, { ...ok, xq: slice(4 * 143) }),
    /binding xq holds 572 bytes but Q8_0 ne=\[128, 8\] × 4 columns needs 576/,
  );
  assert.throws(
    () => checkMatvecQ8b(shape, c, { ...ok, y: slice(4 * 31) }),
    /binding y holds 124 bytes .* 128/,
  );
  assert.throws(() => checkMatvecQ8b({ ...shape, yStride: 7 }, c, ok), /y stride 7 ≥ N=8/);
  assert.throws(
    () => checkMatvecQ8b({ ...shape, k: 64 }, c, { ...ok, weights: slice(8 * 68) }),
    /x stride 72 bytes must be a multiple of 16 .*pad the columns/,
  );
});
