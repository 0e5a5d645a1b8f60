import assert from "node:assert/strict";
import { PipelineCache } from "./kernel.ts";
import { rmsNorm, ropeNeox } from "../tests/ref/ops.ts";
import { POISON_F32, poisoned, readAll, testGpu, upload } from "../tests/util/gpu.ts";
import { Rng } from "../tests/util/rng.ts";
import {
  ATTN_QK_ROPE,
  attnQkRopeBindGroup,
  type AttnQkRopeConstants,
  attnQkRopeGrid,
  encodeAttnQkRope,
  QK_ROPE_ONE_COLUMN,
} from "./attn_qk_rope.ts";
import { kvCacheWords, packAttnParams } from "./attn_params.ts";
import { assertCloseEach, checkF32 } from "./_test_util.ts";

/** f32 norm over 256 values (sum of squares, sqrt, two multiplies): a few ulp. */
const TOL_NORM = { atol: 1e-6, rtol: 4e-6 };

/**
 * Rotated dims: the phase phi_j = p * theta^(-2j/n_rot) is computed in f32 (as llama.cpp does): half an ulp
 * of the product plus pow's error, ~1e-6 * phi_j rad at most, so the allowance scales with each pair's phase;
 * plus the kernel's sin/cos (f32 polynomial after an f32 reduction, a few e-8 absolute).
 */
const PHASE_REL = 2e-6;
const SINCOS_ABS = 2e-7;

/** Per-element rope allowance on top of TOL_NORM: (PHASE_REL * phi_j + SINCOS_ABS) * (|x_j| + |x_j+half|). */
function ropeAllowance(
  normed: Float64Array,
  opts: { dH: number; nRot: number; base: number; pos: readonly number[] },
): Float64Array {
  const { dH, nRot, base, pos } = opts;
  const half = nRot / 2;
  const out = new Float64Array(normed.length);
  const perToken = normed.length / pos.length;
  for (let o = 0; o < normed.length; o += dH) {
    const p = pos[Math.floor(o / perToken)]!;
    for (let j = 0; j < half; j++) {
      const e = (PHASE_REL * p * Math.pow(base, (-2 * j) / nRot) + SINCOS_ABS) *
        (Math.abs(normed[o + j]!) + Math.abs(normed[o + j + half]!));
      out[o + j] = e;
      out[o + j + half] = e;
    }
  }
  return out;
}

interface Case {
  c: AttnQkRopeConstants;
  pos0: number;
  nTokens: number; // present tokens (AttnParams.n_tokens)
  nGrid: number; // tokens the grid covers (>= nTokens)
}

function constants(hQ: number, hKv: number, pMax: number, kvF16 = false): AttnQkRopeConstants {
  return {
    H_Q: hQ,
    H_KV: hKv,
    D_H: 256,
    N_ROT: 64,
    P_MAX: pMax,
    WG: 64,
    ROPE_THETA: 1e7,
    EPS: 1e-6,
    KV_F16: kvF16,
    ...QK_ROPE_ONE_COLUMN,
  };
}

/** f16 cache storage: rounding to 11 significant bits (half an ulp, 2^-11 relative; subnormals 2^-25). */
const F16_REL = 2 ** -11;
const F16_ABS = 2 ** -25;

Deno.test("attn_qk_rope matches norm + NeoX rope references and appends K/V at the right rows", async () => {
  const rng = new Rng();
  const { device } = await testGpu();
  const cache = new PipelineCache(device);
  const cases: Case[] = [
    { c: constants(16, 2, 40), pos0: 0, nTokens: 1, nGrid: 1 },
    { c: constants(16, 2, 40), pos0: 1, nTokens: 1, nGrid: 1 },
    { c: constants(16, 2, 48), pos0: 37, nTokens: 7, nGrid: 8 }, // grid covers one token more
    { c: constants(16, 2, 3010), pos0: 3000, nTokens: 1, nGrid: 1 },
    { c: { ...constants(4, 1, 700), WG: 256, ROPE_THETA: 5e6 }, pos0: rng.int(0, 600), nTokens: 3, nGrid: 3 },
    { c: constants(16, 2, 48, true), pos0: 37, nTokens: 7, nGrid: 8 }, // f16 cache
    { c: { ...constants(4, 1, 700, true), WG: 32 }, pos0: rng.int(0, 600), nTokens: 2, nGrid: 2 },
  ];
  const enc = device.createCommandEncoder();
  const pass = enc.beginComputePass();
  const runs = [];
  for (const k of cases) {
    const { c, pos0, nTokens, nGrid } = k;
    const dH = c.D_H;
    const qf = rng.normals(2 * dH * c.H_Q * nGrid, 2);
    const kIn = rng.normals(dH * c.H_KV * nGrid, 2);
    const vIn = rng.normals(dH * c.H_KV * nGrid, 2);
    const qNorm = Float32Array.from(rng.normals(dH), (x) => 1 + 0.3 * x);
    const kNorm = Float32Array.from(rng.normals(dH), (x) => 1 + 0.3 * x);
    // Cache rows before pos0 hold earlier tokens and must survive; rows from pos0 + nTokens stay poisoned.
    const cacheWords = kvCacheWords(c);
    const rowWords = c.KV_F16 ? dH / 2 : dH;
    const kc0 = new Uint32Array(cacheWords).fill(POISON_F32);
    const vc0 = new Uint32Array(cacheWords).fill(POISON_F32);
    for (let g = 0; g < c.H_KV; g++) {
      for (let i = 0; i < pos0 * rowWords; i++) {
        // Finite (f32, or both f16 halves), never the poison pattern.
        const mask = c.KV_F16 ? 0x3fff3fff : 0x3fffffff;
        kc0[g * c.P_MAX * rowWords + i] = rng.u32() & mask;
        vc0[g * c.P_MAX * rowWords + i] = rng.u32() & mask;
      }
    }
    const b = {
      params: upload(device, packAttnParams(pos0, nTokens)),
      qf: upload(device, qf),
      k: upload(device, kIn),
      v: upload(device, vIn),
      qNorm: upload(device, qNorm),
      kNorm: upload(device, kNorm),
      qOut: poisoned(device, dH * c.H_Q * nGrid),
      kCache: upload(device, kc0),
      vCache: upload(device, vc0),
    };
    const pipeline = await cache.get(ATTN_QK_ROPE, c);
    const bg = attnQkRopeBindGroup(device, { pipeline, constants: c, nTokens: nGrid, buffers: b });
    encodeAttnQkRope(pass, { pipeline, bindGroup: bg, constants: c, nTokens: nGrid });

    const pos = Array.from({ length: nTokens }, (_, t) => pos0 + t);
    const qRaw = new Float64Array(dH * c.H_Q * nTokens);
    for (let r = 0; r < c.H_Q * nTokens; r++) qRaw.set(qf.subarray(r * 2 * dH, r * 2 * dH + dH), r * dH);
    const qNormed = rmsNorm(qRaw, qNorm, { eps: c.EPS, n: dH });
    const kNormed = rmsNorm(kIn.subarray(0, dH * c.H_KV * nTokens), kNorm, { eps: c.EPS, n: dH });
    const ropeOpts = { headDim: dH, nRot: c.N_ROT, base: c.ROPE_THETA, pos };
    runs.push({
      k,
      b,
      kc0,
      vc0,
      vIn,
      qNormed,
      kNormed,
      qRef: ropeNeox(qNormed, ropeOpts),
      kRef: ropeNeox(kNormed, ropeOpts),
    });
  }
  pass.end();
  device.queue.submit([enc.finish()]);
  const outs = await readAll(device, runs.flatMap((r) => [r.b.qOut, r.b.kCache, r.b.vCache]));
  runs.forEach((r, i) => {
    const { c, pos0, nTokens, nGrid } = r.k;
    const dH = c.D_H;
    const seed = rng.seed;
    const what = `attn_qk_rope H_Q=${c.H_Q} H_KV=${c.H_KV} KV_F16=${c.KV_F16} pos0=${pos0} ` +
      `nTokens=${nTokens}/${nGrid}`;
    const ropeOpts = {
      dH,
      nRot: c.N_ROT,
      base: c.ROPE_THETA,
      pos: Array.from({ length: nTokens }, (_, t) => pos0 + t),
    };
    const qGot = new Float32Array(outs[3 * i]!, 0, r.qRef.length);
    assertCloseEach(qGot, r.qRef, ropeAllowance(r.qNormed, ropeOpts), TOL_NORM, {
      what: `${what} q_out`,
      seed,
    });
    // The token past n_tokens (grid padding) must stay poisoned.
    checkF32(outs[3 * i]!, [], TOL_NORM, {
      what: `${what} q_out past n_tokens`,
      seed,
      offsetWords: r.qRef.length,
    });
    // Dims past N_ROT are the normed values unrotated, at the norm's tolerance.
    const pass1 = (a: ArrayLike<number>, ref: Float64Array, label: string) => {
      const g: number[] = [];
      const rf: number[] = [];
      for (let j = 0; j < ref.length; j++) {
        if (j % dH >= c.N_ROT) {
          g.push(a[j]!);
          rf.push(ref[j]!);
        }
      }
      checkF32(new Float32Array(g).buffer, rf, TOL_NORM, {
        what: `${what} ${label} dims >= N_ROT`,
        seed,
        guard: false,
      });
    };
    pass1(qGot, r.qNormed, "q");
    const kc = c.KV_F16 ? new Float16Array(outs[3 * i + 1]!) : new Float32Array(outs[3 * i + 1]!);
    const vc = c.KV_F16 ? new Float16Array(outs[3 * i + 2]!) : new Float32Array(outs[3 * i + 2]!);
    const kcU = new Uint32Array(outs[3 * i + 1]!);
    const vcU = new Uint32Array(outs[3 * i + 2]!);
    const kGot = new Float64Array(dH * c.H_KV * nTokens);
    const vGot = new Float64Array(dH * c.H_KV * nTokens);
    for (let t = 0; t < nTokens; t++) {
      for (let g = 0; g < c.H_KV; g++) {
        const row = (g * c.P_MAX + pos0 + t) * dH;
        kGot.set(kc.subarray(row, row + dH), (t * c.H_KV + g) * dH);
        vGot.set(vc.subarray(row, row + dH), (t * c.H_KV + g) * dH);
      }
    }
    // V is copied: bit-exact in f32, rounded once to f16.
    const tolStore = c.KV_F16 ? { atol: F16_ABS, rtol: F16_REL } : { atol: 0, rtol: 0 };
    assertCloseEach(vGot, r.vIn.subarray(0, vGot.length), new Float64Array(vGot.length), tolStore, {
      what: `${what} v_cache rows`,
      seed,
    });
    const tolK = { atol: TOL_NORM.atol + tolStore.atol, rtol: TOL_NORM.rtol + tolStore.rtol };
    assertCloseEach(kGot, r.kRef, ropeAllowance(r.kNormed, ropeOpts), tolK, {
      what: `${what} k_cache rows`,
      seed,
    });
    if (!c.KV_F16) pass1(new Float32Array(kGot), r.kNormed, "k");
    // Every other cache row is exactly as before (earlier tokens kept, later rows still poisoned).
    for (let g = 0; g < c.H_KV; g++) {
      for (let p = 0; p < c.P_MAX; p++) {
        if (p >= pos0 && p < pos0 + nTokens) continue;
        const rowWords = c.KV_F16 ? dH / 2 : dH;
        for (let d = 0; d < rowWords; d++) {
          const w = (g * c.P_MAX + p) * rowWords + d;
          if (kcU[w] !== r.kc0[w] || vcU[w] !== r.vc0[w]) {
            assert.fail(`${what} (seed ${seed}): cache row ${p} of head ${g} changed at word ${d}`);
          }
        }
      }
    }
    Object.values(r.b).forEach((buf) => buf.destroy());
  });
});

Deno.test("attn_qk_rope shape check throws before encoding", async () => {
  const { device } = await testGpu();
  const c = constants(16, 2, 64);
  const pipeline = await new PipelineCache(device).get(ATTN_QK_ROPE, c);
  const big = device.createBuffer({ size: 1 << 20, usage: GPUBufferUsage.STORAGE });
  const small = device.createBuffer({ size: 1024, usage: GPUBufferUsage.STORAGE });
  const b = {
    params: big,
    qf: big,
    k: big,
    v: big,
    qNorm: big,
    kNorm: big,
    qOut: big,
    kCache: small,
    vCache: big,
  };
  assert.throws(
    () => attnQkRopeBindGroup(device, { pipeline, constants: c, nTokens: 1, buffers: b }),
    /binding kCache holds 1024 bytes but ne=\[32768\]/,
  );
  assert.throws(
    () => attnQkRopeBindGroup(device, { pipeline, constants: { ...c, N_ROT: 65 }, nTokens: 1, buffers: b }),
    /N_ROT must be even/,
  );
  big.destroy();
  small.destroy();
});

Deno.test("attn_qk_rope columns: one dispatch over columns at other slots and positions = reference = solo bits, other slots untouched", async () => {
  const rng = new Rng();
  const { device } = await testGpu();
  const cache = new PipelineCache(device);
  const P_COL = 64;
  const cases = [
    { c: constants(16, 2, 40), nSlots: 4, slots: [3, 0, 2] },
    { c: { ...constants(4, 1, 70, true), WG: 32 }, nSlots: 3, slots: [1, 2] },
    // A batched step's widest: 16 columns (MAX_BATCH_SLOTS) on 16 of 17 pooled slots in a scrambled order.
    { c: { ...constants(4, 1, 70), WG: 32 }, nSlots: 17, slots: rng.permutation(17).slice(0, 16) },
    // A fused in-projection's columns: [qf | k | v] per column in one buffer (IN_COL), NaN between the parts.
    { c: constants(16, 2, 40), nSlots: 4, slots: [2, 3, 1], packed: true },
    { c: { ...constants(4, 1, 70, true), WG: 32 }, nSlots: 3, slots: [0, 2], packed: true },
  ];
  const enc = device.createCommandEncoder();
  const pass = enc.beginComputePass();
  const runs = [];
  for (const k of cases) {
    const c1 = k.c;
    const dH = c1.D_H;
    const nCol = k.slots.length;
    const words = kvCacheWords(c1);
    // Slots 256 bytes apart plus one spare block, so the padding between slots is checked too.
    const kvCol = Math.ceil(words / 64) * 64 + 64;
    // Packed: qf at word 0 of a column, k and v 256-byte aligned after it, columns IN_COL words apart.
    const qfW = 2 * dH * c1.H_Q;
    const kvW = dH * c1.H_KV;
    const kAt = Math.ceil(qfW / 64) * 64;
    const vAt = kAt + Math.ceil(kvW / 64) * 64;
    const inCol = k.packed ? vAt + kvW + 29 : 0;
    const c = { ...c1, P_COL, KV_COL: kvCol, IN_COL: inCol };
    const pos = k.slots.map((_, j) => (j === 1 ? 0 : rng.int(1, c.P_MAX)));
    const table = new Uint32Array(nCol * P_COL).fill(0xffffffff);
    k.slots.forEach((s, j) => table.set([pos[j]!, 1, s], j * P_COL));
    const qf = rng.normals(2 * dH * c.H_Q * nCol, 2);
    const kIn = rng.normals(dH * c.H_KV * nCol, 2);
    const vIn = rng.normals(dH * c.H_KV * nCol, 2);
    const qNorm = Float32Array.from(rng.normals(dH), (x) => 1 + 0.3 * x);
    const kNorm = Float32Array.from(rng.normals(dH), (x) => 1 + 0.3 * x);
    // Pools of random bits (every slot, the padding): only each column's row at its position may change.
    const poolWords = (k.nSlots - 1) * kvCol + words;
    const kp0 = new Uint32Array(poolWords).map(() => rng.u32());
    const vp0 = new Uint32Array(poolWords).map(() => rng.u32());
    const qfB = upload(device, qf);
    const kB = upload(device, kIn);
    const vB = upload(device, vIn);
    const qnB = upload(device, qNorm);
    const knB = upload(device, kNorm);
    const packed = new Float32Array(nCol * inCol).fill(NaN);
    for (let j = 0; k.packed && j < nCol; j++) {
      packed.set(qf.subarray(j * qfW, (j + 1) * qfW), j * inCol);
      packed.set(kIn.subarray(j * kvW, (j + 1) * kvW), j * inCol + kAt);
      packed.set(vIn.subarray(j * kvW, (j + 1) * kvW), j * inCol + vAt);
    }
    const pB = k.packed ? upload(device, packed) : undefined;
    const part = (at: number) => ({ buffer: pB!, offset: 4 * at, size: 4 * (nCol * inCol - at) });
    const b = {
      params: upload(device, table),
      qf: pB ? part(0) : qfB,
      k: pB ? part(kAt) : kB,
      v: pB ? part(vAt) : vB,
      qNorm: qnB,
      kNorm: knB,
      qOut: poisoned(device, dH * c.H_Q * nCol),
      kCache: upload(device, kp0),
      vCache: upload(device, vp0),
    };
    const pipeline = await cache.get(ATTN_QK_ROPE, c);
    const bg = attnQkRopeBindGroup(device, {
      pipeline,
      constants: c,
      nTokens: 1,
      buffers: b,
      cols: nCol,
      slots: k.nSlots,
    });
    pass.setPipeline(pipeline);
    pass.setBindGroup(0, bg);
    pass.dispatchWorkgroups(...attnQkRopeGrid(c, 1, nCol));
    // Each column alone: its own params, its slot's caches as buffers of their own.
    const solo = [];
    const soloPipe = await cache.get(ATTN_QK_ROPE, c1);
    for (const [j, s] of k.slots.entries()) {
      const sb = {
        params: upload(device, packAttnParams(pos[j]!, 1)),
        qf: { buffer: qfB, offset: j * 2 * dH * c.H_Q * 4, size: 2 * dH * c.H_Q * 4 },
        k: { buffer: kB, offset: j * dH * c.H_KV * 4, size: dH * c.H_KV * 4 },
        v: { buffer: vB, offset: j * dH * c.H_KV * 4, size: dH * c.H_KV * 4 },
        qNorm: qnB,
        kNorm: knB,
        qOut: poisoned(device, dH * c.H_Q),
        kCache: upload(device, kp0.subarray(s * kvCol, s * kvCol + words)),
        vCache: upload(device, vp0.subarray(s * kvCol, s * kvCol + words)),
      };
      const sbg = attnQkRopeBindGroup(device, { pipeline: soloPipe, constants: c1, nTokens: 1, buffers: sb });
      encodeAttnQkRope(pass, { pipeline: soloPipe, bindGroup: sbg, constants: c1, nTokens: 1 });
      solo.push(sb);
    }
    const owned = [qfB, kB, vB, ...(pB ? [pB] : [])];
    runs.push({ k, c, pos, kvCol, words, b, solo, qf, kIn, vIn, qNorm, kNorm, kp0, vp0, owned });
  }
  pass.end();
  device.queue.submit([enc.finish()]);
  const outs = await readAll(
    device,
    runs.flatMap((
      r,
    ) => [r.b.qOut, r.b.kCache, r.b.vCache, ...r.solo.flatMap((s) => [s.qOut, s.kCache, s.vCache])]),
  );
  let at = 0;
  for (const r of runs) {
    const { c, k } = r;
    const dH = c.D_H;
    const seed = rng.seed;
    const nCol = k.slots.length;
    const what = `attn_qk_rope columns H_Q=${c.H_Q} KV_F16=${c.KV_F16} slots [${k.slots}] of ${k.nSlots} ` +
      `positions [${r.pos}]`;
    const [qo, kp, vp] = [outs[at]!, outs[at + 1]!, outs[at + 2]!];
    at += 3;
    checkF32(qo, [], TOL_NORM, {
      what: `${what} q_out past the columns`,
      seed,
      offsetWords: dH * c.H_Q * nCol,
    });
    const kpU = new Uint32Array(kp);
    const vpU = new Uint32Array(vp);
    const rowWords = c.KV_F16 ? dH / 2 : dH;
    // Words each column may write: its slot's rows at its position.
    const mine = new Set<number>();
    for (const [j, s] of k.slots.entries()) {
      for (let g = 0; g < c.H_KV; g++) {
        for (let d = 0; d < rowWords; d++) mine.add(s * r.kvCol + (g * c.P_MAX + r.pos[j]!) * rowWords + d);
      }
    }
    for (let w = 0; w < kpU.length; w++) {
      if (!mine.has(w) && (kpU[w] !== r.kp0[w] || vpU[w] !== r.vp0[w])) {
        assert.fail(`${what} (seed ${seed}): pool word ${w} outside the columns' rows changed`);
      }
    }
    for (const [j, s] of k.slots.entries()) {
      const [sq, sk, sv] = [outs[at]!, outs[at + 1]!, outs[at + 2]!];
      at += 3;
      const nQ = dH * c.H_Q;
      const qGot = new Float32Array(qo, j * nQ * 4, nQ);
      const same = (a: Uint32Array, b: Uint32Array, part: string) => {
        for (let i = 0; i < b.length; i++) {
          if (a[i] !== b[i]) {
            assert.fail(`${what} (seed ${seed}): column ${j} ${part} word ${i} differs from solo`);
          }
        }
      };
      same(new Uint32Array(qo, j * nQ * 4, nQ), new Uint32Array(sq, 0, nQ), "q_out");
      same(kpU.subarray(s * r.kvCol, s * r.kvCol + r.words), new Uint32Array(sk, 0, r.words), "k cache");
      same(vpU.subarray(s * r.kvCol, s * r.kvCol + r.words), new Uint32Array(sv, 0, r.words), "v cache");
      // The float64 reference for this column's token at its position.
      const ropeOpts = { dH, nRot: c.N_ROT, base: c.ROPE_THETA, pos: [r.pos[j]!] };
      const qRaw = new Float64Array(nQ);
      for (let h = 0; h < c.H_Q; h++) {
        const src = (j * c.H_Q + h) * 2 * dH;
        qRaw.set(r.qf.subarray(src, src + dH), h * dH);
      }
      const qNormed = rmsNorm(qRaw, r.qNorm, { eps: c.EPS, n: dH });
      const rope = { headDim: dH, nRot: c.N_ROT, base: c.ROPE_THETA, pos: [r.pos[j]!] };
      assertCloseEach(qGot, ropeNeox(qNormed, rope), ropeAllowance(qNormed, ropeOpts), TOL_NORM, {
        what: `${what} column ${j} q_out`,
        seed,
      });
      const nKv = dH * c.H_KV;
      const kNormed = rmsNorm(r.kIn.subarray(j * nKv, (j + 1) * nKv), r.kNorm, { eps: c.EPS, n: dH });
      const kc = c.KV_F16 ? new Float16Array(kp) : new Float32Array(kp);
      const vc = c.KV_F16 ? new Float16Array(vp) : new Float32Array(vp);
      const elemsPerWord = c.KV_F16 ? 2 : 1;
      const kGot = new Float64Array(nKv);
      const vGot = new Float64Array(nKv);
      for (let g = 0; g < c.H_KV; g++) {
        const row = (s * r.kvCol) * elemsPerWord + (g * c.P_MAX + r.pos[j]!) * dH;
        kGot.set(kc.subarray(row, row + dH), g * dH);
        vGot.set(vc.subarray(row, row + dH), g * dH);
      }
      const tolStore = c.KV_F16 ? { atol: F16_ABS, rtol: F16_REL } : { atol: 0, rtol: 0 };
      assertCloseEach(vGot, r.vIn.subarray(j * nKv, (j + 1) * nKv), new Float64Array(nKv), tolStore, {
        what: `${what} column ${j} v row`,
        seed,
      });
      const tolK = { atol: TOL_NORM.atol + tolStore.atol, rtol: TOL_NORM.rtol + tolStore.rtol };
      assertCloseEach(kGot, ropeNeox(kNormed, rope), ropeAllowance(kNormed, ropeOpts), tolK, {
        what: `${what} column ${j} k row`,
        seed,
      });
    }
    for (const buf of [...Object.values(r.b), ...r.owned]) if (buf instanceof GPUBuffer) buf.destroy();
    for (const sb of r.solo) [sb.params, sb.qOut, sb.kCache, sb.vCache].forEach((buf) => buf.destroy());
  }
});
