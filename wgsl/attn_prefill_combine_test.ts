import assert from "node:assert/strict";
import { PipelineCache, variantKey } from "./kernel.ts";
import { sigmoid } from "../tests/ref/ops.ts";
import { poisoned, readAll, testGpu, upload } from "../tests/util/gpu.ts";
import { Rng } from "../tests/util/rng.ts";
import {
  ATTN_PREFILL_COMBINE,
  attnPrefillCombineBindGroup,
  type AttnPrefillCombineConstants,
  encodeAttnPrefillCombine,
} from "./attn_prefill_combine.ts";
import { packAttnParams } from "./attn_params.ts";
import { checkF32 } from "./_test_util.ts";

/** f32 exp of (m_s - M) and sums over <= 8 splits, a divide and the gate's sigmoid: ~1e-6 relative. */
const TOL = { atol: 1e-6, rtol: 1e-5 };

/** attn_prefill's stand-in for -inf: an empty split's m. */
const NEG = Math.fround(-3.0e38);

/**
 * Float64 merge of every row's splits: (sum_s e^(m_s-M) O_s) / (sum_s e^(m_s-M) l_s) * sigmoid(gate), splits
 * with m_s = NEG left out; rows of tokens >= nTokens are absent.
 */
function refCombine(part: Float32Array, qf: Float32Array, c: AttnPrefillCombineConstants, nTokens: number) {
  const pq = c.D_H + 4;
  const out = new Float64Array(c.D_H * c.H_Q * nTokens);
  for (let row = 0; row < c.H_Q * nTokens; row++) {
    const at = (s: number) => (row * c.NS + s) * pq;
    let mx = -Infinity;
    for (let s = 0; s < c.NS; s++) mx = Math.max(mx, part[at(s) + c.D_H]!);
    let l = 0;
    const acc = new Float64Array(c.D_H);
    for (let s = 0; s < c.NS; s++) {
      if (part[at(s) + c.D_H]! === NEG) continue;
      const w = Math.exp(part[at(s) + c.D_H]! - mx);
      l += w * part[at(s) + c.D_H + 1]!;
      for (let d = 0; d < c.D_H; d++) acc[d] = acc[d]! + w * part[at(s) + d]!;
    }
    for (let d = 0; d < c.D_H; d++) {
      out[row * c.D_H + d] = acc[d]! / l * sigmoid(qf[(2 * row + 1) * c.D_H + d]!);
    }
  }
  return out;
}

Deno.test("attn_prefill_combine: merges key-split partials of every row, skips empty splits, gates", async () => {
  const rng = new Rng();
  const { device } = await testGpu();
  const cache = new PipelineCache(device);
  // The engine's shape with 4 and 8 splits; 3 splits of 3 heads of 64 dims (a partial last workgroup); one
  // split; a grid covering absent tokens.
  const cases: { c: AttnPrefillCombineConstants; nTokens: number; nGrid: number }[] = [
    { c: { H_Q: 16, D_H: 256, NS: 4, WG: 256 }, nTokens: 5, nGrid: 5 },
    { c: { H_Q: 16, D_H: 256, NS: 8, WG: 256 }, nTokens: 3, nGrid: 4 },
    { c: { H_Q: 3, D_H: 64, NS: 3, WG: 32 }, nTokens: 7, nGrid: 7 },
    { c: { H_Q: 2, D_H: 128, NS: 1, WG: 64 }, nTokens: 2, nGrid: 3 },
    { c: { H_Q: 2, D_H: 64, NS: 32, WG: 32 }, nTokens: 3, nGrid: 3 },
    { c: { H_Q: rng.int(1, 8), D_H: 4 * rng.int(1, 40), NS: rng.int(2, 8), WG: 64 }, nTokens: 6, nGrid: 9 },
  ];
  const enc = device.createCommandEncoder();
  const pass = enc.beginComputePass();
  const runs = [];
  for (const k of cases) {
    const { c, nGrid } = k;
    const pq = c.D_H + 4;
    const part = new Float32Array(pq * c.NS * c.H_Q * nGrid);
    for (let r = 0; r < c.NS * c.H_Q * nGrid; r++) {
      // Split 0 always holds keys (as the split of key 0 does); later ones are empty one time in three,
      // their O poisoned (the combine must not read it).
      const empty = r % c.NS > 0 && rng.int(0, 2) === 0;
      part.set(empty ? new Float32Array(c.D_H).fill(NaN) : rng.normals(c.D_H, 3), r * pq);
      part[r * pq + c.D_H] = empty ? NEG : 4 * rng.normal();
      part[r * pq + c.D_H + 1] = empty ? 0 : 1 + 10 * rng.float();
    }
    const qf = rng.normals(2 * c.D_H * c.H_Q * nGrid, 2);
    const b = {
      params: upload(device, packAttnParams(rng.int(0, 1000), k.nTokens)),
      part: upload(device, part),
      qf: upload(device, qf),
      o: poisoned(device, c.D_H * c.H_Q * nGrid),
    };
    const pipeline = await cache.get(ATTN_PREFILL_COMBINE, c);
    const bg = attnPrefillCombineBindGroup(device, { pipeline, constants: c, nTokens: nGrid, buffers: b });
    encodeAttnPrefillCombine(pass, { pipeline, bindGroup: bg, constants: c, nTokens: nGrid });
    runs.push({ k, b, part, qf });
  }
  pass.end();
  device.queue.submit([enc.finish()]);
  const outs = await readAll(device, runs.map((r) => r.b.o));
  runs.forEach((r, i) => {
    const { c, nTokens } = r.k;
    const what = `${variantKey(ATTN_PREFILL_COMBINE, c)} nTokens=${nTokens}/${r.k.nGrid}`;
    // Rows of absent tokens stay poisoned: the guard band starts after the last present token.
    checkF32(outs[i]!, refCombine(r.part, r.qf, c, nTokens), TOL, { what, seed: rng.seed });
    Object.values(r.b).forEach((buf) => buf.destroy());
  });
});

Deno.test("attn_prefill_combine shape check throws before encoding", async () => {
  const { device } = await testGpu();
  const c: AttnPrefillCombineConstants = { H_Q: 16, D_H: 256, NS: 4, WG: 256 };
  const pipeline = await new PipelineCache(device).get(ATTN_PREFILL_COMBINE, c);
  const big = device.createBuffer({ size: 1 << 20, usage: GPUBufferUsage.STORAGE });
  const b = { params: big, part: big, qf: big, o: big };
  assert.throws(
    () => attnPrefillCombineBindGroup(device, { pipeline, constants: c, nTokens: 64, buffers: b }),
    /binding part holds 1048576 bytes but ne=\[260, 4, 16, 64\]/,
  );
  assert.throws(
    () =>
      attnPrefillCombineBindGroup(device, { pipeline, constants: { ...c, WG: 100 }, nTokens: 1, buffers: b }),
    /WG must be a power of two/,
  );
  big.destroy();
});
