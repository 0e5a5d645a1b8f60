import assert from "node:assert/strict";
import { PipelineCache, variantKey } from "./kernel.ts";
import { attention } from "../tests/ref/ops.ts";
import { GUARD_WORDS, POISON_F32, poisoned, readAll, testGpu, upload } from "../tests/util/gpu.ts";
import { Rng } from "../tests/util/rng.ts";
import {
  ATTN_PREFILL,
  attnPrefillBindGroup,
  type AttnPrefillConstants,
  attnPrefillConstants,
  attnPrefillOutNe,
  encodeAttnPrefill,
} from "./attn_prefill.ts";
import {
  ATTN_PREFILL_COMBINE,
  attnPrefillCombineBindGroup,
  type AttnPrefillCombineConstants,
  encodeAttnPrefillCombine,
} from "./attn_prefill_combine.ts";
import {
  ATTN_QK_ROPE,
  attnQkRopeBindGroup,
  type AttnQkRopeConstants,
  encodeAttnQkRope,
  QK_ROPE_ONE_COLUMN,
} from "./attn_qk_rope.ts";
import { packAttnParams } from "./attn_params.ts";
import { assertCloseEach } from "./_test_util.ts";
import { assertPoisoned } from "../tests/util/close.ts";

/**
 * The reference runs on the kernel's own q_out and K cache (attn_qk_rope is tested on its own), so only
 * attention's f32 error counts. It is relative to what an output is a weighted sum of, not to the output
 * (random values cancel): 256-term dots put scores ~1e-6 off, then exp and sums over <= 720 positions. Each
 * element lands within 1.6e-6 of sum(p |v|) * sigmoid(gate) over many seeds; the allowance is 5e-6 of it.
 * (A fixed atol of 2e-6 failed on seed 1336865883: values of std 2 from an empty cache, 3.3e-6 off.)
 */
const ATTN_REL = 5e-6;

/** Checks `o` against the reference attention with the allowance above, and the guard band after it. */
function checkAttention(
  o: ArrayBuffer,
  q: Float32Array,
  opts: Parameters<typeof attention>[1] & { v: Float64Array },
  ctx: { what: string; seed: number },
): void {
  const ref = attention(q, opts);
  const mag = attention(q, { ...opts, v: opts.v.map(Math.abs) });
  assertCloseEach(new Float32Array(o, 0, ref.length), ref, mag.map((m) => ATTN_REL * m), NO_TOL, ctx);
  assertPoisoned(
    new Uint32Array(o, ref.length * 4, GUARD_WORDS),
    POISON_F32,
    `${ctx.what} (seed ${ctx.seed})`,
  );
}

const NO_TOL = { atol: 0, rtol: 0 };

interface Case {
  hQ: number;
  hKv: number;
  pos0: number;
  nTokens: number; // AttnParams.n_tokens
  nGrid: number; // capacity the grids cover
  bq?: number;
  dc?: number;
  kvF16?: boolean;
  /** Key splits (then attn_prefill_combine merges them) and the fewest tiles per split. */
  ns?: number;
  splitMin?: number;
  /** q read from its binding instead of workgroup memory. */
  qGlobal?: boolean;
}

Deno.test("attn_prefill: chunks after a cache of any depth match the reference, across tiles and tails", async () => {
  const rng = new Rng();
  const { device } = await testGpu();
  const cache = new PipelineCache(device);
  const maxWorkgroupBytes = device.limits.maxComputeWorkgroupStorageSize;
  const dH = 256;
  const cases: Case[] = [
    { hQ: 16, hKv: 2, pos0: 37, nTokens: 1, nGrid: 1, bq: 2, dc: 16 },
    { hQ: 16, hKv: 2, pos0: 5, nTokens: 7, nGrid: 8, bq: 2 }, // grid covers one absent token
    // The engine's variant (BQ=2, DC=32, TILE=64): 3 tiles, the causal edge inside tile 2, a ragged end.
    { hQ: 16, hKv: 2, pos0: 100, nTokens: 64, nGrid: 64 },
    { hQ: 16, hKv: 2, pos0: 131, nTokens: 7, nGrid: 7 }, // unaligned depth, 7-token chunk, odd tail block
    { hQ: 16, hKv: 2, pos0: 64, nTokens: 1, nGrid: 1 }, // one token exactly at a tile edge
    // From an empty cache: the first query sees one key; keys end mid-tile (ragged last tile).
    { hQ: 16, hKv: 2, pos0: 0, nTokens: 45, nGrid: 48, bq: 2, dc: 32 },
    // 32 K and 32 V stages (2 rows) per tile; then 4-row blocks of 1 token (WG 16) and 4 tokens of 4 heads.
    { hQ: 16, hKv: 2, pos0: 19, nTokens: 9, nGrid: 10, bq: 1, dc: 8 },
    { hQ: 4, hKv: 1, pos0: 3, nTokens: 13, nGrid: 13, bq: 4 },
    { hQ: 4, hKv: 1, pos0: rng.int(1, 90), nTokens: rng.int(1, 30), nGrid: 30, bq: 1 },
    { hQ: 16, hKv: 2, pos0: rng.int(0, 200), nTokens: rng.int(1, 40), nGrid: 40, bq: 1 },
    { hQ: 16, hKv: 2, pos0: 29, nTokens: 7, nGrid: 7, bq: 2, dc: 16, kvF16: true },
    { hQ: 4, hKv: 1, pos0: 3, nTokens: 13, nGrid: 13, bq: 4, kvF16: true },
    // Depth far past the tile, f16 cache, a 3-token tail block, the engine's variant.
    { hQ: 16, hKv: 2, pos0: 301, nTokens: 19, nGrid: 19, kvF16: true },
    // Key splits: one tile each (the block of positions 319-320 straddles tiles 4 and 5: row 319 sees nothing
    // of split 5, whose partial the combine must skip), splits 6 and 7 empty; SPLIT_MIN 4 leaves split 3 of 4 empty; 2 splits
    // of 4-token blocks (190-193 straddles 192); f16; random.
    { hQ: 16, hKv: 2, pos0: 301, nTokens: 21, nGrid: 24, ns: 8, splitMin: 1 },
    { hQ: 16, hKv: 2, pos0: 600, nTokens: 9, nGrid: 9, ns: 4 },
    { hQ: 4, hKv: 1, pos0: 190, nTokens: 13, nGrid: 16, bq: 4, ns: 2, splitMin: 1 },
    { hQ: 16, hKv: 2, pos0: 190, nTokens: 5, nGrid: 5, ns: 3, splitMin: 1, kvF16: true },
    { hQ: 4, hKv: 1, pos0: 700, nTokens: 3, nGrid: 3, bq: 1, ns: 32, splitMin: 1 }, // 12 of 32 splits used
    // q from its binding: 8-token blocks (64 rows, WG 256), 64-dim stages of 4-token blocks (f16), with splits.
    { hQ: 16, hKv: 2, pos0: 77, nTokens: 19, nGrid: 20, bq: 8, dc: 16, qGlobal: true },
    { hQ: 16, hKv: 2, pos0: 150, nTokens: 9, nGrid: 9, bq: 4, dc: 64, qGlobal: true, kvF16: true },
    { hQ: 4, hKv: 1, pos0: 301, nTokens: 11, nGrid: 12, bq: 2, dc: 32, qGlobal: true, ns: 3, splitMin: 1 },
    {
      hQ: 4,
      hKv: 1,
      pos0: rng.int(0, 400),
      nTokens: rng.int(1, 30),
      nGrid: 30,
      bq: 1,
      ns: rng.int(2, 5),
      splitMin: rng.int(1, 3),
    },
  ];
  const enc = device.createCommandEncoder();
  const pass = enc.beginComputePass();
  const runs = [];
  for (const k of cases) {
    const { hQ, hKv, pos0, nGrid } = k;
    const pMax = pos0 + nGrid + rng.int(0, 20);
    const rc: AttnQkRopeConstants = {
      H_Q: hQ,
      H_KV: hKv,
      D_H: dH,
      N_ROT: 64,
      P_MAX: pMax,
      WG: 64,
      ROPE_THETA: 1e7,
      EPS: 1e-6,
      KV_F16: k.kvF16 ?? false,
      ...QK_ROPE_ONE_COLUMN,
    };
    const pc = attnPrefillConstants(
      { H_Q: hQ, H_KV: hKv, D_H: dH, P_MAX: pMax, SCALE: 1 / Math.sqrt(dH), KV_F16: k.kvF16 ?? false },
      { maxWorkgroupBytes, bq: k.bq, dc: k.dc, ns: k.ns, splitMin: k.splitMin, qGlobal: k.qGlobal },
    );
    const qf = rng.normals(2 * dH * hQ * nGrid, 2);
    // Earlier chunks' K/V (rows < pos0); attn_qk_rope appends this chunk's rows.
    const kc = k.kvF16 ? new Float16Array(rng.normals(dH * pMax * hKv)) : rng.normals(dH * pMax * hKv);
    const vc = k.kvF16 ? new Float16Array(rng.normals(dH * pMax * hKv)) : rng.normals(dH * pMax * hKv);
    const b = {
      params: upload(device, packAttnParams(pos0, k.nTokens)),
      qf: upload(device, qf),
      k: upload(device, rng.normals(dH * hKv * nGrid, 2)),
      v: upload(device, rng.normals(dH * hKv * nGrid, 2)),
      qNorm: upload(device, Float32Array.from(rng.normals(dH), (x) => 1 + 0.3 * x)),
      kNorm: upload(device, Float32Array.from(rng.normals(dH), (x) => 1 + 0.3 * x)),
      qOut: poisoned(device, dH * hQ * nGrid),
      kCache: upload(device, kc),
      vCache: upload(device, vc),
      o: poisoned(device, dH * hQ * nGrid),
      part: poisoned(device, attnPrefillOutNe(pc, nGrid).reduce((a, x) => a * x, 1)),
    };
    const pr = await cache.get(ATTN_QK_ROPE, rc);
    const pp = await cache.get(ATTN_PREFILL, pc);
    const bgR = attnQkRopeBindGroup(device, { pipeline: pr, constants: rc, nTokens: nGrid, buffers: b });
    const bgP = attnPrefillBindGroup(device, {
      pipeline: pp,
      constants: pc,
      nTokens: nGrid,
      buffers: { ...b, q: b.qOut, o: pc.NS > 1 ? b.part : b.o },
    });
    encodeAttnQkRope(pass, { pipeline: pr, bindGroup: bgR, constants: rc, nTokens: nGrid });
    encodeAttnPrefill(pass, { pipeline: pp, bindGroup: bgP, constants: pc, nTokens: nGrid });
    if (pc.NS > 1) {
      const cc: AttnPrefillCombineConstants = { H_Q: hQ, D_H: dH, NS: pc.NS, WG: 64 };
      const pcm = await cache.get(ATTN_PREFILL_COMBINE, cc);
      const bgC = attnPrefillCombineBindGroup(device, {
        pipeline: pcm,
        constants: cc,
        nTokens: nGrid,
        buffers: b,
      });
      encodeAttnPrefillCombine(pass, { pipeline: pcm, bindGroup: bgC, constants: cc, nTokens: nGrid });
    }
    runs.push({ k, pc, b, qf });
  }
  pass.end();
  device.queue.submit([enc.finish()]);
  const outs = await readAll(device, runs.flatMap((r) => [r.b.o, r.b.qOut, r.b.kCache, r.b.vCache]));
  runs.forEach((r, i) => {
    const { k, pc } = r;
    const n = k.nTokens;
    const nKv = k.pos0 + n;
    const q = new Float32Array(outs[4 * i + 1]!, 0, dH * k.hQ * n);
    // The reference reads what the cache holds (f16 values in the f16 variant).
    const kc = k.kvF16 ? new Float16Array(outs[4 * i + 2]!) : new Float32Array(outs[4 * i + 2]!);
    const vc = k.kvF16 ? new Float16Array(outs[4 * i + 3]!) : new Float32Array(outs[4 * i + 3]!);
    const refK = new Float64Array(dH * k.hKv * nKv);
    const refV = new Float64Array(dH * k.hKv * nKv);
    for (let p = 0; p < nKv; p++) {
      for (let g = 0; g < k.hKv; g++) {
        const src = (g * pc.P_MAX + p) * dH;
        refK.set(kc.subarray(src, src + dH), (p * k.hKv + g) * dH);
        refV.set(vc.subarray(src, src + dH), (p * k.hKv + g) * dH);
      }
    }
    const gate = new Float64Array(dH * k.hQ * n);
    for (let row = 0; row < k.hQ * n; row++) {
      gate.set(r.qf.subarray(row * 2 * dH + dH, row * 2 * dH + 2 * dH), row * dH);
    }
    const opts = { k: refK, v: refV, gate, headDim: dH, nHead: k.hQ, nHeadKv: k.hKv, scale: pc.SCALE };
    const what = `${variantKey(ATTN_PREFILL, pc)} pos0=${k.pos0} nTokens=${n}/${k.nGrid}`;
    // The guard band after token n-1 covers an absent grid token's output too.
    checkAttention(outs[4 * i]!, q, opts, { what, seed: rng.seed });
    if (k.hKv > 1) {
      // A wrong grouping (h % H_KV instead of h / G) must not pass: swap the KV heads in the reference.
      const swap = (kv: Float64Array) => {
        const out = Float64Array.from(kv);
        for (let p = 0; p < nKv; p++) {
          out.set(kv.subarray((p * 2 + 1) * dH, (p * 2 + 2) * dH), p * 2 * dH);
          out.set(kv.subarray(p * 2 * dH, (p * 2 + 1) * dH), (p * 2 + 1) * dH);
        }
        return out;
      };
      assert.throws(
        () =>
          checkAttention(outs[4 * i]!, q, { ...opts, k: swap(refK), v: swap(refV) }, {
            what,
            seed: rng.seed,
          }),
        /out of tolerance/,
      );
    }
    Object.values(r.b).forEach((buf) => buf.destroy());
  });
});

Deno.test("attn_prefill shape check throws before encoding", async () => {
  const { device } = await testGpu();
  const pc: AttnPrefillConstants = attnPrefillConstants(
    { H_Q: 16, H_KV: 2, D_H: 256, P_MAX: 64, SCALE: 0.0625, KV_F16: false },
    { maxWorkgroupBytes: device.limits.maxComputeWorkgroupStorageSize, bq: 2 },
  );
  const pipeline = await new PipelineCache(device).get(ATTN_PREFILL, pc);
  const big = device.createBuffer({ size: 1 << 20, usage: GPUBufferUsage.STORAGE });
  const b = { params: big, q: big, qf: big, kCache: big, vCache: big, o: big };
  assert.throws(
    () => attnPrefillBindGroup(device, { pipeline, constants: pc, nTokens: 64, buffers: b }),
    /binding qf holds 1048576 bytes but ne=\[512, 16, 64\]/,
  );
  assert.throws(
    () =>
      attnPrefillBindGroup(device, {
        pipeline,
        constants: { ...pc, BQ: 8, WG: 256 },
        nTokens: 1,
        buffers: b,
      }),
    /workgroup memory/,
  );
  assert.throws(
    () => attnPrefillBindGroup(device, { pipeline, constants: { ...pc, TILE: 32 }, nTokens: 1, buffers: b }),
    /4 x 4 score and 4 x 16 output blocks/,
  );
  big.destroy();
});
