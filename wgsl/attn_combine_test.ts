import assert from "node:assert/strict";
import { PipelineCache, variantKey } from "./kernel.ts";
import { sigmoid } from "../tests/ref/ops.ts";
import { GUARD_WORDS, POISON_F32, poisoned, readAll, testGpu, upload } from "../tests/util/gpu.ts";
import { Rng } from "../tests/util/rng.ts";
import {
  ATTN_COMBINE,
  ATTN_COMBINE_NO_QX,
  attnCombineBindGroup,
  attnCombineColumnWords,
  type AttnCombineConstants,
  encodeAttnCombine,
} from "./attn_combine.ts";
import { attnDecodeSplits } from "./attn_decode.ts";
import { packAttnParams } from "./attn_params.ts";
import { checkF32 } from "./_test_util.ts";
import { quantizeOnGpu } from "./_q8_testing.ts";
import { q8Layout, q8xBytes } from "./matvec_q8.ts";
import { assertPoisoned } from "../tests/util/close.ts";

/** f32 exp of (m_s - M) and sums over <= 256 splits, a divide and the gate's sigmoid: ~1e-6 relative. */
const TOL = { atol: 1e-6, rtol: 1e-5 };

/**
 * Float64 merge of the first `used` split partials: (sum_s e^(m_s-M) O_s) / (sum_s e^(m_s-M) l_s) *
 * sigmoid(gate).
 */
function refCombine(
  partO: Float32Array,
  partMl: Float32Array,
  qf: Float32Array,
  c: AttnCombineConstants,
  used: number,
): Float64Array {
  const out = new Float64Array(c.D_H * c.H_Q);
  for (let h = 0; h < c.H_Q; h++) {
    let mx = -Infinity;
    for (let s = 0; s < used; s++) mx = Math.max(mx, partMl[(s * c.H_Q + h) * 2]!);
    let l = 0;
    const acc = new Float64Array(c.D_H);
    for (let s = 0; s < used; s++) {
      const w = Math.exp(partMl[(s * c.H_Q + h) * 2]! - mx);
      l += w * partMl[(s * c.H_Q + h) * 2 + 1]!;
      for (let d = 0; d < c.D_H; d++) acc[d] = acc[d]! + w * partO[(s * c.H_Q + h) * c.D_H + d]!;
    }
    for (let d = 0; d < c.D_H; d++) {
      out[h * c.D_H + d] = (acc[d]! / l) * sigmoid(qf[h * 2 * c.D_H + c.D_H + d]!);
    }
  }
  return out;
}

/** The engine's shape at a short context: 16 heads of 256 dims, 64 splits of at least 32 positions. */
const ENGINE_SHAPE = {
  H_Q: 16,
  D_H: 256,
  N_SPLIT: 64,
  TILE: 32,
  PER_MIN: 32,
  WG: 256,
  CD: 16,
  ...ATTN_COMBINE_NO_QX,
} as const;

/** Combine constants whose split formula gives `used` splits at context `used` (TILE = PER_MIN = 1). */
function unit(
  c: { H_Q: number; D_H: number; N_SPLIT: number; WG: number; CD: number },
): AttnCombineConstants {
  return { ...c, TILE: 1, PER_MIN: 1, QF_COL: 2 * c.D_H * c.H_Q, ...ATTN_COMBINE_NO_QX };
}

Deno.test("attn_combine merges the used split partials only and applies the gate", async () => {
  const rng = new Rng();
  const { device } = await testGpu();
  const cache = new PipelineCache(device);
  const long = { ...ENGINE_SHAPE, N_SPLIT: 256, TILE: 16, PER_MIN: 16, QF_COL: 8192 };
  // [constants, position]: the splits used follow from the position as in attn_decode.
  const cases: [AttnCombineConstants, number][] = [
    [unit({ H_Q: 2, D_H: 8, N_SPLIT: 1, WG: 64, CD: 16 }), 0], // debug: one split, dims past D_H idle
    [unit({ H_Q: 16, D_H: 256, N_SPLIT: 64, WG: 256, CD: 16 }), 46], // real dims, 47 splits, 17 unused
    [unit({ H_Q: 4, D_H: 256, N_SPLIT: 16, WG: 64, CD: 16 }), 15], // every split used
    [unit({ H_Q: 16, D_H: 256, N_SPLIT: 64, WG: 128, CD: 32 }), 0], // only split 0 used
    [unit({ H_Q: 3, D_H: 100, N_SPLIT: 7, WG: 32, CD: 8 }), rng.int(0, 7)], // D_H not a multiple of CD
    // The engine's long-context constants: per = 128 positions at 32k, 256 splits, tails of the 4-way loop.
    [long, 32767],
    [long, rng.int(0, 5000)],
  ];
  const enc = device.createCommandEncoder();
  const pass = enc.beginComputePass();
  const runs = [];
  for (const [c, pos] of cases) {
    const { used } = attnDecodeSplits({ ...c, P_MAX: pos + 1 }, pos);
    const partO = new Float32Array(c.D_H * c.H_Q * c.N_SPLIT);
    const partMl = new Float32Array(2 * c.H_Q * c.N_SPLIT);
    for (let s = 0; s < c.N_SPLIT; s++) {
      for (let h = 0; h < c.H_Q; h++) {
        const k = s * c.H_Q + h;
        if (s < used) {
          partMl[2 * k] = rng.normal() * 4; // running maxima far apart: weights from ~e-10 to 1
          partMl[2 * k + 1] = 1 + rng.float() * 60;
          partO.set(rng.normals(c.D_H, 5), k * c.D_H);
        } else {
          // Never written by attn_decode: NaN here fails the test if the combine reads it.
          partMl[2 * k] = NaN;
          partMl[2 * k + 1] = NaN;
          partO.fill(NaN, k * c.D_H, (k + 1) * c.D_H);
        }
      }
    }
    const qf = rng.normals(2 * c.D_H * c.H_Q, 2);
    const b = {
      params: upload(device, packAttnParams(pos, 1)),
      partO: upload(device, partO),
      partMl: upload(device, partMl),
      qf: upload(device, qf),
      o: poisoned(device, c.D_H * c.H_Q),
      xq: poisoned(device, 1),
    };
    const pipeline = await cache.get(ATTN_COMBINE, c);
    const bg = attnCombineBindGroup(device, { pipeline, constants: c, buffers: b });
    encodeAttnCombine(pass, { pipeline, bindGroup: bg, constants: c });
    runs.push({ c, used, b, ref: refCombine(partO, partMl, qf, c, used) });
  }
  pass.end();
  device.queue.submit([enc.finish()]);
  const outs = await readAll(device, runs.map((r) => r.b.o));
  runs.forEach((r, i) => {
    const what = `${variantKey(ATTN_COMBINE, r.c)} used=${r.used}`;
    checkF32(outs[i]!, r.ref, TOL, { what, seed: rng.seed });
    Object.values(r.b).forEach((buf) => buf.destroy());
  });
});

Deno.test("attn_combine shape check throws before encoding", async () => {
  const { device } = await testGpu();
  const c = unit({ H_Q: 16, D_H: 256, N_SPLIT: 64, WG: 256, CD: 16 });
  const pipeline = await new PipelineCache(device).get(ATTN_COMBINE, c);
  const small = device.createBuffer({ size: 1024, usage: GPUBufferUsage.STORAGE });
  const xq = device.createBuffer({ size: 16, usage: GPUBufferUsage.STORAGE });
  const b = { params: small, partO: small, partMl: small, qf: small, o: small, xq };
  assert.throws(
    () => attnCombineBindGroup(device, { pipeline, constants: { ...c, QF_COL: 8191 }, buffers: b }),
    /QF_COL \(8191\) must be at least one column of qf/,
  );
  assert.throws(
    () => attnCombineBindGroup(device, { pipeline, constants: c, buffers: b }),
    /binding partO holds 1024 bytes but ne=\[256, 16, 64\]/,
  );
  assert.throws(
    () => attnCombineBindGroup(device, { pipeline, constants: { ...c, QX: true, CD: 64 }, buffers: b }),
    /QX rounds 32-dim chunks: CD \(64\) must divide 32/,
  );
  small.destroy();
  xq.destroy();
});

Deno.test("attn_combine columns: one dispatch over columns at other positions = reference = solo bits", async () => {
  const rng = new Rng();
  const { device } = await testGpu();
  const cache = new PipelineCache(device);
  const cases: [AttnCombineConstants, number[]][] = [
    [{ ...ENGINE_SHAPE, QF_COL: 8192 }, [
      40,
      0,
      rng.int(0, 2047),
    ]],
    // Partials not a multiple of 64 words per column (padding between columns), D_H not a multiple of CD.
    [unit({ H_Q: 3, D_H: 100, N_SPLIT: 7, WG: 32, CD: 8 }), [6, rng.int(0, 7)]],
    // qf in a fused in-projection's columns: other words (NaN) between the columns' qf.
    [{ ...unit({ H_Q: 3, D_H: 100, N_SPLIT: 7, WG: 32, CD: 8 }), QF_COL: 600 + 37 }, [3, 5, rng.int(0, 7)]],
    [{ ...ENGINE_SHAPE, QF_COL: 8192 + 1088 }, [
      rng.int(0, 2047),
      17,
    ]],
    // A batched step's widest: 16 columns (MAX_BATCH_SLOTS).
    [unit({ H_Q: 3, D_H: 100, N_SPLIT: 7, WG: 32, CD: 8 }), Array.from({ length: 16 }, () => rng.int(0, 7))],
  ];
  const enc = device.createCommandEncoder();
  const pass = enc.beginComputePass();
  const runs = [];
  for (const [c, positions] of cases) {
    const nCol = positions.length;
    const w = attnCombineColumnWords(c);
    const nO = c.D_H * c.H_Q * c.N_SPLIT;
    const nMl = 2 * c.H_Q * c.N_SPLIT;
    // NaN everywhere a column must not read: unused splits, the padding between columns.
    const partO = new Float32Array((nCol - 1) * w.partO + nO).fill(NaN);
    const partMl = new Float32Array((nCol - 1) * w.partMl + nMl).fill(NaN);
    const table = new Uint32Array(nCol * w.params).fill(0xffffffff);
    const qfW = 2 * c.D_H * c.H_Q;
    const qf = new Float32Array((nCol - 1) * c.QF_COL + qfW).fill(NaN);
    for (let j = 0; j < nCol; j++) qf.set(rng.normals(qfW, 2), j * c.QF_COL);
    const qfB = upload(device, qf);
    // A column alone: qf packed.
    const c1 = { ...c, QF_COL: qfW };
    const cols = positions.map((pos, j) => {
      const { used } = attnDecodeSplits({ ...c, P_MAX: pos + 1 }, pos);
      const o = partO.subarray(j * w.partO, j * w.partO + nO);
      const ml = partMl.subarray(j * w.partMl, j * w.partMl + nMl);
      for (let k = 0; k < used * c.H_Q; k++) {
        ml[2 * k] = rng.normal() * 4;
        ml[2 * k + 1] = 1 + rng.float() * 60;
        o.set(rng.normals(c.D_H, 5), k * c.D_H);
      }
      table.set([pos, 1], j * w.params);
      const qfj = qf.subarray(j * c.QF_COL, j * c.QF_COL + qfW);
      // The column alone: its own params and partials.
      const sb = {
        params: upload(device, packAttnParams(pos, 1)),
        partO: upload(device, o),
        partMl: upload(device, ml),
        qf: upload(device, qfj),
        o: poisoned(device, c.D_H * c.H_Q),
        xq: poisoned(device, 1),
      };
      return { used, sb, ref: refCombine(o, ml, qfj, c, used) };
    });
    const b = {
      params: upload(device, table),
      partO: upload(device, partO),
      partMl: upload(device, partMl),
      qf: qfB,
      o: poisoned(device, c.D_H * c.H_Q * nCol),
      xq: poisoned(device, 1),
    };
    const pipeline = await cache.get(ATTN_COMBINE, c);
    const bg = attnCombineBindGroup(device, { pipeline, constants: c, buffers: b, cols: nCol });
    encodeAttnCombine(pass, { pipeline, bindGroup: bg, constants: c, cols: nCol });
    const p1 = await cache.get(ATTN_COMBINE, c1);
    for (const col of cols) {
      const sbg = attnCombineBindGroup(device, { pipeline: p1, constants: c1, buffers: col.sb });
      encodeAttnCombine(pass, { pipeline: p1, bindGroup: sbg, constants: c1 });
    }
    runs.push({ c, positions, b, cols });
  }
  pass.end();
  device.queue.submit([enc.finish()]);
  const outs = await readAll(device, runs.flatMap((r) => [r.b.o, ...r.cols.map((col) => col.sb.o)]));
  let at = 0;
  for (const r of runs) {
    const n = r.c.D_H * r.c.H_Q;
    const all = outs[at++]!;
    const what = `${variantKey(ATTN_COMBINE, r.c)} columns at positions [${r.positions}]`;
    checkF32(all, r.cols.flatMap((col) => [...col.ref]), TOL, { what, seed: rng.seed });
    r.cols.forEach((col, j) => {
      const solo = new Uint32Array(outs[at++]!, 0, n);
      const got = new Uint32Array(all, j * n * 4, n);
      for (let i = 0; i < n; i++) {
        if (got[i] !== solo[i]) {
          assert.fail(`${what} (seed ${rng.seed}): column ${j} o[${i}] differs from solo`);
        }
      }
      Object.values(col.sb).forEach((buf) => buf.destroy());
    });
    [r.b.params, r.b.partO, r.b.partMl, r.b.o, r.b.xq].forEach((buf) => buf.destroy());
  }
});

Deno.test("attn_combine QX: o with the bits of the variant without it, and xq quantize_q8's words of o", async () => {
  const rng = new Rng();
  const { device } = await testGpu();
  const cache = new PipelineCache(device);
  const cases: [AttnCombineConstants, number[]][] = [
    [{ ...ENGINE_SHAPE, QF_COL: 8192 + 1088 }, [
      40,
      0,
      rng.int(0, 2047),
    ]],
    // CD 8: four groups of dims per chunk.
    [{ ...unit({ H_Q: 3, D_H: 64, N_SPLIT: 7, WG: 32, CD: 8 }), QF_COL: 384 + 37 }, [6, rng.int(0, 7)]],
  ];
  for (const [c0, positions] of cases) {
    for (const type of ["Q8_0", "IQ4_XS"] as const) {
      const c = { ...c0, QX: true, LAYOUT: q8Layout(type) };
      const nCol = positions.length;
      const w = attnCombineColumnWords(c);
      const K = c.D_H * c.H_Q;
      const partO = new Float32Array((nCol - 1) * w.partO + K * c.N_SPLIT).fill(NaN);
      const partMl = new Float32Array((nCol - 1) * w.partMl + 2 * c.H_Q * c.N_SPLIT).fill(NaN);
      const table = new Uint32Array(nCol * w.params).fill(0xffffffff);
      const qf = new Float32Array((nCol - 1) * c.QF_COL + 2 * K).fill(NaN);
      positions.forEach((pos, j) => {
        const { used } = attnDecodeSplits({ ...c, P_MAX: pos + 1 }, pos);
        for (let k = 0; k < used * c.H_Q; k++) {
          partMl[j * w.partMl + 2 * k] = rng.normal() * 4;
          partMl[j * w.partMl + 2 * k + 1] = 1 + rng.float() * 60;
          partO.set(rng.normals(c.D_H, 5), j * w.partO + k * c.D_H);
        }
        table.set([pos, 1], j * w.params);
        qf.set(rng.normals(2 * K, 2), j * c.QF_COL);
      });
      const inputs = {
        params: upload(device, table),
        partO: upload(device, partO),
        partMl: upload(device, partMl),
        qf: upload(device, qf),
      };
      const xqWords = nCol * (q8xBytes(K) / 4);
      const withQx = { ...inputs, o: poisoned(device, K * nCol), xq: poisoned(device, xqWords) };
      const without = { ...inputs, o: poisoned(device, K * nCol), xq: poisoned(device, 1) };
      const enc = device.createCommandEncoder();
      const pass = enc.beginComputePass();
      for (const [cc, b] of [[c, withQx], [c0, without]] as const) {
        const pipeline = await cache.get(ATTN_COMBINE, cc);
        const bg = attnCombineBindGroup(device, { pipeline, constants: cc, buffers: b, cols: nCol });
        encodeAttnCombine(pass, { pipeline, bindGroup: bg, constants: cc, cols: nCol });
      }
      pass.end();
      device.queue.submit([enc.finish()]);
      const [oQx, xq, o] = await readAll(device, [withQx.o, withQx.xq, without.o]);
      const what = `${variantKey(ATTN_COMBINE, c)} columns at positions [${positions}] (seed ${rng.seed})`;
      assert.deepEqual(new Uint32Array(oQx!, 0, K * nCol), new Uint32Array(o!, 0, K * nCol), `${what}: o`);
      for (let j = 0; j < nCol; j++) {
        const want = await quantizeOnGpu(device, cache, type, new Float32Array(o!, 4 * j * K, K));
        const got = new Uint32Array(xq!, 4 * j * (q8xBytes(K) / 4), q8xBytes(K) / 4);
        assert.deepEqual(got, want.words, `${what}: column ${j}'s int8 x`);
      }
      assertPoisoned(new Uint32Array(xq!, 4 * xqWords, GUARD_WORDS), POISON_F32, `${what}: past xq`);
      [...Object.values(inputs), withQx.o, withQx.xq, without.o, without.xq].forEach((buf) => buf.destroy());
    }
  }
});
