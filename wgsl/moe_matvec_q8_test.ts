import { bindGroup, PipelineCache } from "./kernel.ts";
import { type GgmlTypeName, typeInfo } from "../engine/quant/types.ts";
import { moeMatvecParams, type MoeMatvecShape } from "./moe_matvec.ts";
import {
  checkMoeMatvecQ8,
  MOE_MATVEC_Q8,
  MOE_MATVEC_Q8_BINDINGS,
  type MoeMatvecQ8Bindings,
  type MoeMatvecQ8Constants,
  moeMatvecQ8Constants,
  moeMatvecQ8Grid,
  q8ColumnWords,
} from "./moe_matvec_q8.ts";
import { decodeQ8x, q8Layout, q8xBytes } from "./matvec_q8.ts";
import { randomWeights } from "./_quant_testing.ts";
import { moeReference } from "./_moe_testing.ts";
import { quantizeOnGpu } from "./_q8_testing.ts";
import { GUARD_WORDS, POISON_F32, poisoned, readAll, testGpu, upload } from "../tests/util/gpu.ts";
import { assertPoisoned } from "../tests/util/close.ts";
import { Rng } from "../tests/util/rng.ts";
import assert from "node:assert/strict";

const TYPES: GgmlTypeName[] = ["Q8_0", "Q4_K", "Q5_K", "Q6_K", "IQ4_XS"];

/** Element index (within its 32-chunk) of byte `b` of quad word `w` in quantize_q8's byte order for `type`. */
function elementOf(type: GgmlTypeName, w: number, b: number): number {
  if (q8Layout(type) === 0) return 4 * w + b;
  const base = (w & 1) === 0 ? 4 * (w >> 1) : 4 * (w >> 1) + 2;
  return [base, base + 1, base + 16, base + 17][b]!;
}

/** Random int8 x columns in quantize_q8's format for `type`, and their dequantized values (d·q). */
function randomXq(
  rng: Rng,
  type: GgmlTypeName,
  k: number,
  cols: number,
): { words: Uint32Array; x: Float64Array } {
  const cw = q8ColumnWords(k);
  const words = new Uint32Array(cw * cols);
  const x = new Float64Array(k * cols);
  for (let col = 0; col < cols; col++) {
    const bytes = new Int8Array(words.buffer, 4 * cw * col, k);
    const d = new Float32Array(words.buffer, 4 * cw * col + k, k / 32);
    for (let c = 0; c < k / 32; c++) {
      d[c] = c === 1 ? 0 : 10 ** rng.int(-3, 1) * (0.5 + rng.float()); // chunk 1: an all-zero chunk
      for (let w = 0; w < 8; w++) {
        for (let b = 0; b < 4; b++) {
          const q = c === 1 ? 0 : rng.int(-127, 128);
          bytes[32 * c + 4 * w + b] = q;
          x[col * k + 32 * c + elementOf(type, w, b)] = d[c]! * q;
        }
      }
    }
  }
  return { words, x };
}

interface Case {
  shape: MoeMatvecShape;
  ids: Uint32Array;
  w: Uint8Array;
  /** x columns as int8 words (null: the gate·up pass's QOUT output feeds this down pass). */
  xq: Uint32Array | null;
  /** Dequantized x columns. */
  x: Float64Array;
}

function makeCase(
  rng: Rng,
  type: GgmlTypeName,
  gateUp: boolean,
  o: { k?: number; n?: number; nExpert?: number; ids?: Uint32Array; tokens?: number; shared: boolean },
): Case {
  const k = o.k ?? 256 * rng.int(1, 4);
  const n = o.n ?? rng.int(1, 70);
  const nExpert = o.nExpert ?? rng.int(2, 9);
  const ids = o.ids ??
    Uint32Array.from({ length: rng.int(1, 4) * (o.tokens ?? 1) }, () => rng.int(0, nExpert));
  const tokens = o.tokens ?? 1;
  const nCols = ids.length;
  const sharedCols = o.shared ? tokens : 0;
  const nMats = nExpert + (o.shared ? 1 : 0);
  const expertBytes = (k / typeInfo(type).blockElems) * typeInfo(type).blockBytes * n * nMats;
  const offGate = 8 * rng.int(0, 8);
  const offUp = gateUp ? Math.ceil((offGate + expertBytes) / 8) * 8 + 8 * rng.int(0, 8) : undefined;
  const w = new Uint8Array((offUp ?? offGate) + expertBytes);
  w.set(randomWeights(rng, type, k, n * nMats, 0.1), offGate);
  if (offUp !== undefined) w.set(randomWeights(rng, type, k, n * nMats, 0.1), offUp);
  const xDiv = gateUp ? nCols / tokens : 1;
  const { words, x } = randomXq(rng, type, k, gateUp ? tokens : nCols + sharedCols);
  return {
    shape: { type, k, n, nExpert, nCols, xDiv, offGateBytes: offGate, offUpBytes: offUp, gateUp, sharedCols },
    ids,
    w,
    xq: words,
    x,
  };
}

/** Checks one dispatch's shape and bindings, then records it into `pass`. */
async function encode(
  pass: GPUComputePassEncoder,
  device: GPUDevice,
  cache: PipelineCache,
  shape: MoeMatvecShape,
  consts: MoeMatvecQ8Constants,
  b: MoeMatvecQ8Bindings,
): Promise<void> {
  checkMoeMatvecQ8(shape, consts, b);
  const p = await cache.get(MOE_MATVEC_Q8, consts);
  pass.setPipeline(p);
  pass.setBindGroup(0, bindGroup(device, p, MOE_MATVEC_Q8_BINDINGS.map((n) => b[n])));
  pass.dispatchWorkgroups(...moeMatvecQ8Grid(shape, consts));
}

/** y (and its poisoned guard) against the reference, element by element. */
function checkY(got: ArrayBuffer, c: Case, what: string): void {
  const { ref, tol } = moeReference(c);
  const g = new Float32Array(got, 0, ref.length);
  const bad = [...g].findIndex((v, j) => !(Math.abs(v - ref[j]!) <= tol[j]!));
  assert.equal(bad, -1, `${what}: y[${bad}] = ${g[bad]}, want ${ref[bad]} ± ${tol[bad]}`);
  assertPoisoned(new Uint32Array(got, 4 * ref.length, GUARD_WORDS), POISON_F32, `${what}: y guard`);
}

Deno.test("moe_matvec_q8: routed experts by GPU ids with int8 x, gate·up with silu and plain down, every int8-x type", async () => {
  const rng = new Rng();
  const { device } = await testGpu();
  const cache = new PipelineCache(device);
  const cases: { c: Case; consts: MoeMatvecQ8Constants }[] = [];
  for (const type of TYPES) {
    for (const [gateUp, shared] of [[true, false], [true, true], [false, true], [false, false]]) {
      const tokens = rng.int(1, 3);
      const nExpert = rng.int(2, 9);
      const ids = Uint32Array.from({ length: rng.int(1, 4) * tokens }, () => rng.int(0, nExpert));
      const c = makeCase(rng, type, gateUp!, {
        tokens,
        nExpert,
        ids: gateUp ? ids : undefined,
        shared: shared!,
      });
      // TEAM 1..64 and ROWS 1..4 over the cases (more invocations per team than chunks included).
      const i = cases.length;
      const consts = {
        ...moeMatvecQ8Constants(c.shape),
        TEAM: [16, 4, 64, 1][i % 4]!,
        ROWS: [1, 3, 2, 4][i % 4]!,
      };
      cases.push({ c, consts });
    }
  }
  const enc = device.createCommandEncoder();
  const pass = enc.beginComputePass();
  const outs: GPUBuffer[] = [];
  for (const { c, consts } of cases) {
    const cols = c.shape.nCols + (c.shape.sharedCols ?? 0);
    const y = poisoned(device, c.shape.n * cols);
    outs.push(y);
    const w = upload(device, c.w);
    await encode(pass, device, cache, c.shape, consts, {
      params: upload(device, moeMatvecParams(c.shape)),
      ids: upload(device, c.ids),
      weights: w,
      weights2: w,
      xq: upload(device, c.xq!),
      y: { buffer: y, size: 4 * c.shape.n * cols },
      yq: poisoned(device, 1),
    });
  }
  pass.end();
  device.queue.submit([enc.finish()]);
  const got = await readAll(device, outs);
  cases.forEach(({ c, consts }, i) => {
    const what = `moe_matvec_q8 ${c.shape.type} ${c.shape.gateUp ? "gate·up" : "down"} k=${c.shape.k} ` +
      `n=${c.shape.n} ids=${[
        ...c.ids,
      ]} shared=${c.shape.sharedCols} TEAM ${consts.TEAM} ROWS ${consts.ROWS} ` +
      `(seed ${rng.seed})`;
    checkY(got[i]!, c, what);
  });
});

Deno.test("moe_matvec_q8 QOUT: gate·up writes its output as quantize_q8 would round it, and down reads it", async () => {
  const rng = new Rng();
  const { device } = await testGpu();
  const cache = new PipelineCache(device);
  for (const [upType, downType] of [["IQ4_XS", "IQ4_XS"], ["Q8_0", "IQ4_XS"], ["IQ4_XS", "Q8_0"]] as const) {
    const tokens = rng.int(1, 3);
    const nExpert = rng.int(2, 6);
    const used = rng.int(1, 4);
    const ids = Uint32Array.from({ length: used * tokens }, () => rng.int(0, nExpert));
    const nFf = 256 * rng.int(1, 3);
    const embd = 256 * rng.int(1, 3);
    const gu = makeCase(rng, upType, true, { k: embd, n: nFf, nExpert, ids, tokens, shared: true });
    const cols = gu.shape.nCols + tokens;
    // TEAM 8 ROWS 1 and TEAM 16 ROWS 2: 32 rows per workgroup; TEAM 4 ROWS 2: 128 (several chunks each).
    const team = [8, 16, 4][rng.int(0, 3)]!;
    const guConsts = { ...moeMatvecQ8Constants(gu.shape, downType), TEAM: team, ROWS: team === 8 ? 1 : 2 };
    const y = poisoned(device, nFf * cols);
    const yqWords = q8ColumnWords(nFf) * cols;
    const yq = poisoned(device, yqWords);
    const w = upload(device, gu.w);
    let enc = device.createCommandEncoder();
    let pass = enc.beginComputePass();
    await encode(pass, device, cache, gu.shape, guConsts, {
      params: upload(device, moeMatvecParams(gu.shape)),
      ids: upload(device, ids),
      weights: w,
      weights2: w,
      xq: upload(device, gu.xq!),
      y: { buffer: y, size: 4 * nFf * cols },
      yq: { buffer: yq, size: 4 * yqWords },
    });
    pass.end();
    device.queue.submit([enc.finish()]);
    const [gy, gyq] = await readAll(device, [y, yq]);
    const what = `moe_matvec_q8 QOUT ${upType} → ${downType} embd=${embd} ff=${nFf} ids=${[...ids]} ` +
      `TEAM ${team} (seed ${rng.seed})`;
    checkY(gy!, gu, what);
    assertPoisoned(new Uint32Array(gyq!, 4 * yqWords, GUARD_WORDS), POISON_F32, `${what}: yq guard`);
    // yq has the bits quantize_q8 gives each column of y.
    const yf = new Float32Array(gy!, 0, nFf * cols);
    for (let col = 0; col < cols; col++) {
      const { words: want } = await quantizeOnGpu(
        device,
        cache,
        downType,
        yf.subarray(col * nFf, (col + 1) * nFf),
      );
      const have = new Uint32Array(gyq!, 4 * q8ColumnWords(nFf) * col, q8ColumnWords(nFf));
      assert.deepEqual([...have], [...want], `${what}: yq column ${col}`);
    }
    // The down pass reads yq (column col = the gate·up column col) and matches float64 on its dequantized x.
    const x = new Float64Array(nFf * cols);
    for (let col = 0; col < cols; col++) {
      const bytes = new Uint8Array(gyq!, 4 * q8ColumnWords(nFf) * col, q8xBytes(nFf));
      const { q, d } = decodeQ8x(downType, nFf, bytes);
      for (let i = 0; i < nFf; i++) x[col * nFf + i] = d[i >> 5]! * q[i]!;
    }
    const dn = makeCase(rng, downType, false, { k: nFf, n: embd, nExpert, ids, tokens, shared: true });
    const down: Case = { ...dn, shape: { ...dn.shape, xDiv: 1 }, xq: null, x };
    const dy = poisoned(device, embd * cols);
    const dw = upload(device, down.w);
    enc = device.createCommandEncoder();
    pass = enc.beginComputePass();
    await encode(pass, device, cache, down.shape, moeMatvecQ8Constants(down.shape), {
      params: upload(device, moeMatvecParams(down.shape)),
      ids: upload(device, ids),
      weights: dw,
      weights2: dw,
      xq: yq,
      y: { buffer: dy, size: 4 * embd * cols },
      yq: poisoned(device, 1),
    });
    pass.end();
    device.queue.submit([enc.finish()]);
    const [ddy] = await readAll(device, [dy]);
    checkY(ddy!, down, `${what}: down`);
  }
});

Deno.test("moe_matvec_q8 XIN: every workgroup rounds f32 x as quantize_q8 does, logs it, and multiplies by it", async () => {
  const rng = new Rng();
  const { device } = await testGpu();
  const cache = new PipelineCache(device);
  for (const type of TYPES) {
    for (const gateUp of [true, false]) {
      const tokens = rng.int(1, 3);
      const nExpert = rng.int(2, 6);
      const ids = Uint32Array.from({ length: rng.int(1, 4) * tokens }, () => rng.int(0, nExpert));
      const c = makeCase(rng, type, gateUp, { tokens, nExpert, ids: gateUp ? ids : undefined, shared: true });
      const xCols = gateUp ? tokens : c.shape.nCols + tokens;
      const xf = rng.normals(c.shape.k * xCols, 10 ** rng.int(-2, 2));
      xf.fill(0, 32, 64); // an all-zero chunk
      const team = [4, 16, 64][rng.int(0, 3)]!;
      const consts = moeMatvecQ8Constants(c.shape, undefined, { team, rows: rng.int(1, 5), xin: true });
      const cols = c.shape.nCols + tokens;
      const y = poisoned(device, c.shape.n * cols);
      const logWords = q8ColumnWords(c.shape.k) * xCols;
      const log = poisoned(device, logWords);
      const w = upload(device, c.w);
      const enc = device.createCommandEncoder();
      const pass = enc.beginComputePass();
      await encode(pass, device, cache, c.shape, consts, {
        params: upload(device, moeMatvecParams(c.shape)),
        ids: upload(device, c.ids),
        weights: w,
        weights2: w,
        xq: upload(device, xf),
        y: { buffer: y, size: 4 * c.shape.n * cols },
        yq: { buffer: log, size: 4 * logWords },
      });
      pass.end();
      device.queue.submit([enc.finish()]);
      const [gy, glog] = await readAll(device, [y, log]);
      const what = `moe_matvec_q8 XIN ${type} ${gateUp ? "gate·up" : "down"} k=${c.shape.k} n=${c.shape.n} ` +
        `ids=${[...c.ids]} TEAM ${consts.TEAM} ROWS ${consts.ROWS} (seed ${rng.seed})`;
      assertPoisoned(new Uint32Array(glog!, 4 * logWords, GUARD_WORDS), POISON_F32, `${what}: log guard`);
      const x = new Float64Array(c.shape.k * xCols);
      const cw = q8ColumnWords(c.shape.k);
      for (let col = 0; col < xCols; col++) {
        const { words: want } = await quantizeOnGpu(
          device,
          cache,
          type,
          xf.subarray(col * c.shape.k, (col + 1) * c.shape.k),
        );
        assert.deepEqual(
          [...new Uint32Array(glog!, 4 * cw * col, cw)],
          [...want],
          `${what}: int8 x column ${col}`,
        );
        const { q, d } = decodeQ8x(type, c.shape.k, new Uint8Array(glog!, 4 * cw * col, q8xBytes(c.shape.k)));
        for (let i = 0; i < c.shape.k; i++) x[col * c.shape.k + i] = d[i >> 5]! * q[i]!;
      }
      checkY(gy!, { ...c, xq: null, x }, what);
    }
  }
});

Deno.test("moe_matvec_q8 ROWS keeps the bits at TEAM <= 16 (y, XIN's log, QOUT's int8 y)", async () => {
  const rng = new Rng();
  const { device } = await testGpu();
  const cache = new PipelineCache(device);
  for (const type of TYPES) {
    for (const mode of ["xq", "xin", "qout"] as const) {
      const gateUp = mode !== "xin";
      const tokens = rng.int(1, 3);
      const nExpert = rng.int(2, 6);
      const ids = Uint32Array.from({ length: rng.int(1, 4) * tokens }, () => rng.int(0, nExpert));
      // N past a whole number of row blocks (QOUT: multiples of 32).
      const k = 256 * rng.int(1, 5);
      const n = mode === "qout" ? 32 * rng.int(3, 7) : rng.int(40, 140);
      const c = makeCase(rng, type, gateUp, {
        k,
        n,
        tokens,
        nExpert,
        ids: gateUp ? ids : undefined,
        shared: true,
      });
      const xCols = gateUp ? tokens : c.shape.nCols + tokens;
      const cols = c.shape.nCols + tokens;
      const xf = rng.normals(k * xCols, 1);
      // TEAM up to 16, as the engine's: above it a row's reduction starts at its place in the workgroup.
      const team = mode === "qout" ? 8 : [4, 16][rng.int(0, 2)]!;
      const base = moeMatvecQ8Constants(c.shape, mode === "qout" ? "IQ4_XS" : undefined, {
        team,
        rows: 1,
        xin: mode === "xin",
      });
      const variants = [base, { ...base, ROWS: 2 }, { ...base, ROWS: mode === "qout" ? 4 : 3 }];
      const yqWords = q8ColumnWords(mode === "qout" ? n : k) * (mode === "qout" ? cols : xCols);
      const w = upload(device, c.w);
      const params = upload(device, moeMatvecParams(c.shape));
      const idsBuf = upload(device, c.ids);
      const xq = upload(device, mode === "xin" ? xf : c.xq!);
      const outs: GPUBuffer[] = [];
      const enc = device.createCommandEncoder();
      const pass = enc.beginComputePass();
      for (const consts of variants) {
        const y = poisoned(device, n * cols);
        const yq = poisoned(device, yqWords);
        outs.push(y, yq);
        await encode(pass, device, cache, c.shape, consts, {
          params,
          ids: idsBuf,
          weights: w,
          weights2: w,
          xq,
          y: { buffer: y, size: 4 * n * cols },
          yq: { buffer: yq, size: 4 * yqWords },
        });
      }
      pass.end();
      device.queue.submit([enc.finish()]);
      const got = await readAll(device, outs);
      const what = `moe_matvec_q8 ${mode} ${type} k=${k} n=${n} ids=${[
        ...c.ids,
      ]} TEAM ${team} (seed ${rng.seed})`;
      if (mode === "xq") checkY(got[0]!, c, what);
      for (let v = 1; v < variants.length; v++) {
        const vw = `${what} at ROWS ${variants[v]!.ROWS}`;
        assert.deepEqual(new Uint32Array(got[2 * v]!), new Uint32Array(got[0]!), `${vw}: y`);
        if (mode !== "xq") {
          assert.deepEqual(new Uint32Array(got[2 * v + 1]!), new Uint32Array(got[1]!), `${vw}: yq`);
        }
      }
    }
  }
});

Deno.test("moe_matvec_q8 checks throw before encoding: types, K, alignment, QOUT chunks, bindings", () => {
  const shape: MoeMatvecShape = {
    type: "IQ4_XS",
    k: 512,
    n: 64,
    nExpert: 4,
    nCols: 2,
    xDiv: 2,
    offGateBytes: 0,
    offUpBytes: 4 * 64 * 272,
    gateUp: true,
  };
  const b = (words: number): GPUBuffer => ({ size: 4 * words }) as unknown as GPUBuffer;
  const ok: MoeMatvecQ8Bindings = {
    params: b(11),
    ids: b(2),
    weights: b(2 * 4 * 64 * 68 + 8),
    weights2: b(2 * 4 * 64 * 68 + 8),
    xq: b(q8ColumnWords(512)),
    y: b(64 * 2),
    yq: b(q8ColumnWords(64) * 2),
  };
  const c = moeMatvecQ8Constants(shape, "IQ4_XS");
  checkMoeMatvecQ8(shape, c, ok);
  const throws = (s: MoeMatvecShape, cc: MoeMatvecQ8Constants, bb: MoeMatvecQ8Bindings, re: RegExp) =>
    assert.throws(() => checkMoeMatvecQ8(s, cc, bb), re);
  throws(
    { ...shape, type: "Q4_0" },
    c,
    ok,
    /moe_matvec_q8: int8-x expert mat-vecs read Q8_0, Q4_K, Q5_K, Q6_K or IQ4_XS/,
  );
  throws({ ...shape, type: "Q8_0", k: 96 }, { ...c, TYPE: 8 }, ok, /K=96 must be a multiple of 128/);
  throws({ ...shape, offUpBytes: 4 * 64 * 272 + 4 }, c, ok, /offUpBytes=.* multiple of 8/);
  throws({ ...shape, n: 48 }, c, ok, /QOUT rounds whole 32-row chunks/);
  throws(shape, { ...c, TEAM: 16, ROWS: 1 }, ok, /QOUT rounds whole 32-row chunks/);
  throws(shape, c, { ...ok, xq: b(q8ColumnWords(512) - 1) }, /binding xq/);
  throws(shape, c, { ...ok, yq: b(q8ColumnWords(64)) }, /binding yq/);
  throws(shape, { ...c, TYPE: 8 }, ok, /moe_matvec_q8: TYPE=8/);
  const xin = moeMatvecQ8Constants(shape, undefined, { team: 16, rows: 2, xin: true });
  const okXin = { ...ok, xq: b(512 * 1), yq: b(q8ColumnWords(512)) };
  checkMoeMatvecQ8(shape, xin, okXin);
  throws(shape, { ...xin, KC: 8 }, okXin, /XIN needs KC = K\/32 = 16/);
  throws(shape, { ...xin, QOUT: true }, okXin, /XIN and QOUT both write yq/);
  throws(shape, xin, { ...okXin, xq: b(511) }, /binding xq \(f32 x with XIN\)/);
  throws(shape, xin, { ...okXin, yq: b(q8ColumnWords(512) - 1) }, /binding yq \(the int8 x with XIN\)/);
});
