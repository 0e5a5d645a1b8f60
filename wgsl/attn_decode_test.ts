import assert from "node:assert/strict";
import { PipelineCache, variantKey } from "./kernel.ts";
import { attention } from "../tests/ref/ops.ts";
import { POISON_F32, poisoned, readAll, testGpu, upload } from "../tests/util/gpu.ts";
import { Rng } from "../tests/util/rng.ts";
import {
  ATTN_COMBINE,
  ATTN_COMBINE_NO_QX,
  attnCombineBindGroup,
  type AttnCombineConstants,
  encodeAttnCombine,
} from "./attn_combine.ts";
import {
  ATTN_DECODE,
  ATTN_DECODE_ONE_COLUMN,
  attnDecodeBindGroup,
  attnDecodeColumnWords,
  type AttnDecodeConstants,
  attnDecodeSplits,
  checkAttnDecode,
  encodeAttnDecode,
} from "./attn_decode.ts";
import { kvCacheWords, packAttnParams } from "./attn_params.ts";
import { checkF32 } from "./_test_util.ts";

/**
 * f32 dots of 256 terms (~1e-6 relative on scores of size ~1), exp and sums over up to 3001 positions in an
 * online softmax and a split merge: ~1e-5 relative on the output, with headroom.
 */
const TOL = { atol: 2e-6, rtol: 5e-5 };

/** Cache `ne=[D_H, P_MAX, H_KV]` (kernel layout) → `ne=[D_H, H_KV, nKv]` (reference layout). */
function toRefLayout(cache: Float32Array, dH: number, pMax: number, hKv: number, nKv: number): Float64Array {
  const out = new Float64Array(dH * hKv * nKv);
  for (let p = 0; p < nKv; p++) {
    for (let g = 0; g < hKv; g++) {
      for (let d = 0; d < dH; d++) out[(p * hKv + g) * dH + d] = cache[(g * pMax + p) * dH + d]!;
    }
  }
  return out;
}

interface Dims {
  hQ: number;
  hKv: number;
  dH: number;
}
const REAL: Dims = { hQ: 16, hKv: 2, dH: 256 };
const TINY: Dims = { hQ: 4, hKv: 1, dH: 256 };
const ODD: Dims = { hQ: 6, hKv: 2, dH: 128 };

Deno.test("attn_decode + attn_combine match the float64 reference at positions 0 to 3000, any split count", async () => {
  const rng = new Rng();
  const { device } = await testGpu();
  const cache = new PipelineCache(device);
  // [dims, position, N_SPLIT, KV_F16, PER_MIN, TILE, WG, KPT]
  const cases: [Dims, number, number, boolean, number, number, number, number][] = [
    [REAL, 0, 64, false, 32, 32, 256, 1],
    [REAL, 1, 64, false, 64, 64, 256, 2],
    [REAL, 37, 64, false, 16, 16, 256, 1],
    [REAL, 3000, 64, false, 32, 32, 256, 1], // per split 64 positions: 47 splits used, the last one ragged
    [REAL, 3000, 128, false, 64, 64, 256, 2], // the engine's: 47 splits, the last one ragged in its second half
    [REAL, 3000, 256, false, 32, 32, 256, 2], // 94 splits of one tile
    [REAL, 2999, 32, false, 128, 64, 256, 1], // PER_MIN above the even share: 24 splits of 128, 8 unused; 2 scores each
    [REAL, 1500, 16, false, 64, 16, 128, 1], // 128 invocations: 2 key groups, 8 lanes per key
    [REAL, 1499, 16, false, 64, 32, 128, 2],
    [TINY, 37, 8, false, 16, 16, 256, 1],
    [TINY, 127, 8, false, 16, 16, 256, 1], // every split full, the last one included
    [TINY, rng.int(0, 700), 16, false, 64 * rng.int(1, 3), 64, 256, rng.int(1, 2)],
    [ODD, 300, 8, false, 16, 16, 256, 1], // 3 heads per KV head: a pad head, idle score lanes, 8 key groups
    [REAL, 37, 64, true, 32, 32, 256, 1], // f16 cache
    [REAL, 2000, 256, true, 32, 32, 256, 2], // f16 cache at depth
    [REAL, 700, 16, true, 64, 64, 256, 2],
    [REAL, 701, 16, true, 64, 64, 256, 1],
    [TINY, 127, 8, true, 16, 16, 256, 1],
    [ODD, 211, 4, true, 16, 16, 256, 1],
    [ODD, 212, 4, true, 32, 32, 256, 2],
  ];
  const enc = device.createCommandEncoder();
  const pass = enc.beginComputePass();
  const runs = [];
  for (const [dims, pos, nSplit, kvF16, perMin, tile, wg, kpt] of cases) {
    const { hQ, hKv, dH } = dims;
    const pMax = pos + 1 + rng.int(0, 40);
    const dc: AttnDecodeConstants = {
      H_Q: hQ,
      H_KV: hKv,
      D_H: dH,
      P_MAX: pMax,
      N_SPLIT: nSplit,
      TILE: tile,
      PER_MIN: perMin,
      WG: wg,
      SCALE: 1 / Math.sqrt(dH),
      KV_F16: kvF16,
      KPT: kpt,
      ...ATTN_DECODE_ONE_COLUMN,
    };
    const cc: AttnCombineConstants = {
      H_Q: hQ,
      D_H: dH,
      N_SPLIT: nSplit,
      TILE: dc.TILE,
      PER_MIN: perMin,
      WG: 256,
      CD: 16,
      QF_COL: 2 * dH * hQ,
      ...ATTN_COMBINE_NO_QX,
    };
    const q = rng.normals(dH * hQ);
    const qf = rng.normals(2 * dH * hQ, 2); // only the gate halves are read
    // The reference reads what the cache holds: f16-rounded values in the f16 variant.
    const kcStore = kvF16 ? new Float16Array(rng.normals(dH * pMax * hKv)) : rng.normals(dH * pMax * hKv);
    const vcStore = kvF16 ? new Float16Array(rng.normals(dH * pMax * hKv)) : rng.normals(dH * pMax * hKv);
    const kc = Float32Array.from(kcStore);
    const vc = Float32Array.from(vcStore);
    const b = {
      params: upload(device, packAttnParams(pos, 1)),
      q: upload(device, q),
      kCache: upload(device, kcStore),
      vCache: upload(device, vcStore),
      partO: poisoned(device, dH * hQ * nSplit),
      partMl: poisoned(device, 2 * hQ * nSplit),
      qf: upload(device, qf),
      o: poisoned(device, dH * hQ),
      xq: poisoned(device, 1), // attn_combine without QX writes none
    };
    const pd = await cache.get(ATTN_DECODE, dc);
    const pc = await cache.get(ATTN_COMBINE, cc);
    const bgD = attnDecodeBindGroup(device, { pipeline: pd, constants: dc, buffers: b });
    const bgC = attnCombineBindGroup(device, { pipeline: pc, constants: cc, buffers: b });
    encodeAttnDecode(pass, { pipeline: pd, bindGroup: bgD, constants: dc });
    encodeAttnCombine(pass, { pipeline: pc, bindGroup: bgC, constants: cc });
    const gate = new Float64Array(dH * hQ);
    for (let h = 0; h < hQ; h++) {
      for (let d = 0; d < dH; d++) gate[h * dH + d] = qf[h * 2 * dH + dH + d]!;
    }
    const common = {
      k: toRefLayout(kc, dH, pMax, hKv, pos + 1),
      v: toRefLayout(vc, dH, pMax, hKv, pos + 1),
      gate,
      headDim: dH,
      nHead: hQ,
      nHeadKv: hKv,
      scale: dc.SCALE,
    };
    const ref = attention(q, common);
    runs.push({ dc, pos, b, ref, q, common });
  }
  pass.end();
  device.queue.submit([enc.finish()]);
  const outs = await readAll(device, runs.flatMap((r) => [r.b.o, r.b.partMl]));
  runs.forEach((r, i) => {
    const { dc, pos } = r;
    const what = `${variantKey(ATTN_DECODE, dc)} pos=${pos}`;
    const o = outs[2 * i]!;
    checkF32(o, r.ref, TOL, { what, seed: rng.seed });
    // Split bookkeeping: the used splits report l >= 1 (their maximum counts once); the unused ones are
    // never written (still poisoned), and the combine read none of them (its output would be NaN).
    const ml = new Uint32Array(outs[2 * i + 1]!, 0, 2 * dc.H_Q * dc.N_SPLIT);
    const mlF = new Float32Array(ml.buffer, 0, ml.length);
    const { per, used } = attnDecodeSplits(dc, pos);
    assert.equal(used, Math.ceil((pos + 1) / per));
    for (let s = 0; s < dc.N_SPLIT; s++) {
      for (let h = 0; h < dc.H_Q; h++) {
        const w = (s * dc.H_Q + h) * 2 + 1;
        assert.ok(
          s < used ? mlF[w]! >= 1 : ml[w] === POISON_F32,
          `${what} (seed ${rng.seed}): split ${s} head ${h} has l=${mlF[w]} (${used} used)`,
        );
      }
    }
    // GQA: the data must tell the right grouping from a wrong one (h % H_KV), or the test proves nothing.
    if (dc.H_KV > 1 && pos > 0) {
      const wrong = attention(r.q, {
        ...r.common,
        nHead: dc.H_Q,
        nHeadKv: dc.H_KV,
        k: swapGroups(r.common.k, dc),
        v: swapGroups(r.common.v, dc),
      });
      assert.throws(() => checkF32(o, wrong, TOL, { what, seed: rng.seed }), /out of tolerance/);
    }
    Object.values(r.b).forEach((buf) => buf.destroy());
  });
});

Deno.test("attn_decode columns: one dispatch over columns at other slots and positions = reference = solo bits, other regions untouched", async () => {
  const rng = new Rng();
  const { device } = await testGpu();
  const cache = new PipelineCache(device);
  const base = { N_SPLIT: 8, TILE: 32, PER_MIN: 32, WG: 256, P_COL: 64 };
  // [dims, KV_F16, KPT, slots in the pool, columns' slots, columns' positions]; the last column region of the
  // partials (one more than the columns) is never written.
  const cases: [Dims, boolean, number, number, number[], number[]][] = [
    [REAL, false, 1, 4, [2, 0, 3], [rng.int(100, 299), 0, 37]],
    [ODD, true, 2, 3, [1, 2], [rng.int(0, 299), 150]],
    // A batched step's widest: 16 columns (MAX_BATCH_SLOTS) on 16 of 17 pooled slots in a scrambled order.
    [ODD, false, 1, 17, rng.permutation(17).slice(0, 16), Array.from({ length: 16 }, () => rng.int(0, 299))],
  ];
  const enc = device.createCommandEncoder();
  const pass = enc.beginComputePass();
  const runs = [];
  for (const [dims, kvF16, kpt, nSlots, slots, positions] of cases) {
    const { hQ, hKv, dH } = dims;
    const pMax = 300;
    const one = {
      ...base,
      H_Q: hQ,
      H_KV: hKv,
      D_H: dH,
      P_MAX: pMax,
      SCALE: 1 / Math.sqrt(dH),
      KV_F16: kvF16,
      KPT: kpt,
    };
    const slotWords = kvCacheWords(one);
    // A slot stride past its cache (256-byte aligned plus 64 words of gap, NaN there) as a pool's may be.
    const kvCol = Math.ceil(slotWords / 64) * 64 + 64;
    const dc: AttnDecodeConstants = { ...one, KV_COL: kvCol };
    const solo: AttnDecodeConstants = { ...one, ...ATTN_DECODE_ONE_COLUMN };
    const nCol = slots.length;
    const w = attnDecodeColumnWords(dc);
    const nO = dH * hQ * base.N_SPLIT;
    const nMl = 2 * hQ * base.N_SPLIT;
    // Pools: every slot's cache random (f16-rounded in the f16 variant), NaN between them.
    const pools = [0, 1].map(() => {
      const pool = new Uint32Array(nSlots * kvCol).fill(0xffffffff);
      const vals: Float32Array[] = [];
      for (let s = 0; s < nSlots; s++) {
        const store = kvF16 ? new Float16Array(rng.normals(dH * pMax * hKv)) : rng.normals(dH * pMax * hKv);
        pool.set(new Uint32Array(store.buffer, 0, slotWords), s * kvCol);
        vals.push(Float32Array.from(store));
      }
      return { pool, vals };
    });
    const table = new Uint32Array(nCol * base.P_COL).fill(0xffffffff);
    const q = rng.normals(dH * hQ * nCol);
    const cc: AttnCombineConstants = {
      H_Q: hQ,
      D_H: dH,
      N_SPLIT: base.N_SPLIT,
      TILE: base.TILE,
      PER_MIN: base.PER_MIN,
      WG: 256,
      CD: 16,
      QF_COL: 2 * dH * hQ,
      ...ATTN_COMBINE_NO_QX,
    };
    const qf = rng.normals(2 * dH * hQ * nCol, 2);
    const pd = await cache.get(ATTN_DECODE, dc);
    const pdSolo = await cache.get(ATTN_DECODE, solo);
    const cols = positions.map((pos, j) => {
      const slot = slots[j]!;
      table.set([pos, 1, slot], j * base.P_COL);
      const qj = q.subarray(j * dH * hQ, (j + 1) * dH * hQ);
      // The column alone: its own params, q, its slot's caches and partials.
      const sb = {
        params: upload(device, packAttnParams(pos, 1)),
        q: upload(device, qj),
        kCache: upload(device, pools[0]!.pool.subarray(slot * kvCol, slot * kvCol + slotWords)),
        vCache: upload(device, pools[1]!.pool.subarray(slot * kvCol, slot * kvCol + slotWords)),
        partO: poisoned(device, nO),
        partMl: poisoned(device, nMl),
      };
      encodeAttnDecode(pass, {
        pipeline: pdSolo,
        bindGroup: attnDecodeBindGroup(device, { pipeline: pdSolo, constants: solo, buffers: sb }),
        constants: solo,
      });
      const gate = new Float64Array(dH * hQ);
      for (let h = 0; h < hQ; h++) {
        for (let d = 0; d < dH; d++) gate[h * dH + d] = qf[(j * hQ + h) * 2 * dH + dH + d]!;
      }
      const ref = attention(qj, {
        k: toRefLayout(pools[0]!.vals[slot]!, dH, pMax, hKv, pos + 1),
        v: toRefLayout(pools[1]!.vals[slot]!, dH, pMax, hKv, pos + 1),
        gate,
        headDim: dH,
        nHead: hQ,
        nHeadKv: hKv,
        scale: dc.SCALE,
      });
      return { pos, slot, sb, ref };
    });
    const b = {
      params: upload(device, table),
      q: upload(device, q),
      kCache: upload(device, pools[0]!.pool),
      vCache: upload(device, pools[1]!.pool),
      partO: poisoned(device, nCol * w.partO + nO),
      partMl: poisoned(device, nCol * w.partMl + nMl),
      qf: upload(device, qf),
      o: poisoned(device, dH * hQ * nCol),
      xq: poisoned(device, 1), // attn_combine without QX writes none
    };
    const bg = attnDecodeBindGroup(device, {
      pipeline: pd,
      constants: dc,
      buffers: b,
      cols: nCol,
      slots: nSlots,
    });
    encodeAttnDecode(pass, { pipeline: pd, bindGroup: bg, constants: dc, cols: nCol });
    const pc = await cache.get(ATTN_COMBINE, cc);
    const bgC = attnCombineBindGroup(device, { pipeline: pc, constants: cc, buffers: b, cols: nCol });
    encodeAttnCombine(pass, { pipeline: pc, bindGroup: bgC, constants: cc, cols: nCol });
    runs.push({ dc, positions, slots, b, cols, w, nO, nMl });
  }
  pass.end();
  device.queue.submit([enc.finish()]);
  const outs = await readAll(
    device,
    runs.flatMap((r) => [r.b.o, r.b.partO, r.b.partMl, ...r.cols.flatMap((c) => [c.sb.partO, c.sb.partMl])]),
  );
  let at = 0;
  for (const r of runs) {
    const what = `${variantKey(ATTN_DECODE, r.dc)} columns at slots [${r.slots}] positions [${r.positions}]`;
    const o = outs[at++]!;
    checkF32(o, r.cols.flatMap((c) => [...c.ref]), TOL, { what, seed: rng.seed });
    const all = [new Uint32Array(outs[at++]!), new Uint32Array(outs[at++]!)];
    // Each column's region is bit for bit its solo dispatch's partials (the unused splits poisoned in both).
    const inRegion = [new Uint8Array(all[0]!.length), new Uint8Array(all[1]!.length)];
    r.cols.forEach((c, j) => {
      [[r.w.partO, r.nO], [r.w.partMl, r.nMl]].forEach(([stride, n], k) => {
        const soloWords = new Uint32Array(outs[at++]!, 0, n);
        for (let i = 0; i < n!; i++) {
          inRegion[k]![j * stride! + i] = 1;
          if (all[k]![j * stride! + i] !== soloWords[i]) {
            assert.fail(
              `${what} (seed ${rng.seed}): column ${j} ${["partO", "partMl"][k]}[${i}] differs from solo`,
            );
          }
        }
      });
      Object.values(c.sb).forEach((buf) => buf.destroy());
    });
    // Everything outside the columns' regions (the padding, the region past the last column) still poisoned.
    all.forEach((words, k) => {
      for (let i = 0; i < words.length; i++) {
        if (!inRegion[k]![i] && words[i] !== POISON_F32) {
          assert.fail(
            `${what} (seed ${rng.seed}): ${["partO", "partMl"][k]} word ${i} outside the columns written`,
          );
        }
      }
    });
    Object.values(r.b).forEach((buf) => buf.destroy());
  }
});

/** Exchanges KV heads so that query head h meets the KV head a wrong grouping (h % H_KV) would give. */
function swapGroups(kv: Float64Array, dc: AttnDecodeConstants): Float64Array {
  const out = Float64Array.from(kv);
  const nKv = kv.length / (dc.D_H * dc.H_KV);
  for (let p = 0; p < nKv; p++) {
    for (let g = 0; g < dc.H_KV; g++) {
      const src = (p * dc.H_KV + ((g + 1) % dc.H_KV)) * dc.D_H;
      out.set(kv.subarray(src, src + dc.D_H), (p * dc.H_KV + g) * dc.D_H);
    }
  }
  return out;
}

Deno.test("attn_decode shape check throws before encoding", async () => {
  const { device } = await testGpu();
  const dc: AttnDecodeConstants = {
    H_Q: 16,
    H_KV: 2,
    D_H: 256,
    P_MAX: 64,
    N_SPLIT: 8,
    TILE: 32,
    PER_MIN: 32,
    WG: 256,
    SCALE: 0.0625,
    KV_F16: false,
    KPT: 1,
    ...ATTN_DECODE_ONE_COLUMN,
  };
  const pipeline = await new PipelineCache(device).get(ATTN_DECODE, dc);
  const small = device.createBuffer({ size: 1024, usage: GPUBufferUsage.STORAGE });
  const b = { params: small, q: small, kCache: small, vCache: small, partO: small, partMl: small };
  assert.throws(
    () => attnDecodeBindGroup(device, { pipeline, constants: dc, buffers: b }),
    /binding q holds 1024/,
  );
  // 8 heads per KV head and tiles of 64: 21 KiB of workgroup memory.
  assert.throws(() => checkAttnDecode({ ...dc, TILE: 64, PER_MIN: 64 }, 16384), /workgroup memory/);
  assert.throws(
    () => checkAttnDecode({ ...dc, WG: 128, TILE: 64, PER_MIN: 64 }, 32768),
    /TILE must be a power/,
  );
  assert.throws(
    () => attnDecodeBindGroup(device, { pipeline, constants: { ...dc, TILE: 4, PER_MIN: 4 }, buffers: b }),
    /D_H \/ 8 \(32\) must be a multiple of WG \* KPT \/ TILE \(64\)/,
  );
  assert.throws(() => checkAttnDecode({ ...dc, KPT: 3 }, 32768), /KPT must be 1 or 2/);
  assert.throws(
    () => checkAttnDecode({ ...dc, KPT: 2, TILE: 128, PER_MIN: 128 }, 32768),
    /must be <= 2 \* WG/,
  );
  assert.throws(
    () => attnDecodeBindGroup(device, { pipeline, constants: { ...dc, H_Q: 18 }, buffers: b }),
    /must be <= 8/,
  );
  assert.throws(
    () => attnDecodeBindGroup(device, { pipeline, constants: { ...dc, H_Q: 15 }, buffers: b }),
    /multiple of H_KV/,
  );
  assert.throws(
    () => attnDecodeBindGroup(device, { pipeline, constants: { ...dc, PER_MIN: 48 }, buffers: b }),
    /PER_MIN \(48\) must be a positive multiple of TILE/,
  );
  // Columns: strides present and sane, buffers for every column and slot.
  assert.throws(() => checkAttnDecode({ ...dc, P_COL: 2 }, 32768), /P_COL must be 0 or >= 3/);
  assert.throws(() => checkAttnDecode({ ...dc, KV_COL: 64 }, 32768), /KV_COL must be 0 or a multiple of 4/);
  assert.throws(() => checkAttnDecode({ ...dc, KV_COL: 256 * 64 * 2 + 2 }, 32768), /KV_COL must be 0/);
  assert.throws(
    () => attnDecodeBindGroup(device, { pipeline, constants: dc, buffers: b, cols: 2 }),
    /2 columns need a P_COL stride/,
  );
  assert.throws(
    () => attnDecodeBindGroup(device, { pipeline, constants: { ...dc, P_COL: 64 }, buffers: b, slots: 2 }),
    /2 slots need P_COL and KV_COL strides/,
  );
  // One slot's caches (128 KiB) and two columns' partials (2 x 128 KiB).
  const one = device.createBuffer({ size: 256 * 64 * 2 * 4, usage: GPUBufferUsage.STORAGE });
  const big = device.createBuffer({ size: 2 * 256 * 16 * 8 * 4, usage: GPUBufferUsage.STORAGE });
  const cols = { ...dc, P_COL: 64, KV_COL: 256 * 64 * 2 };
  const full = { params: small, q: one, kCache: one, vCache: one, partO: big, partMl: one };
  attnDecodeBindGroup(device, { pipeline, constants: cols, buffers: full, cols: 2 });
  assert.throws(
    () => attnDecodeBindGroup(device, { pipeline, constants: cols, buffers: full, cols: 2, slots: 2 }),
    /binding kCache holds/,
  );
  big.destroy();
  one.destroy();
  small.destroy();
});
