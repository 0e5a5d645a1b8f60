import { bindGroup, PipelineCache } from "../engine/gpu/kernel.ts";
import { dequantize } from "../engine/quant/dequant.ts";
import { type GgmlTypeName, typeInfo } from "../engine/quant/types.ts";
import {
  checkMoeMatvec,
  MOE_MATVEC,
  MOE_MATVEC_BINDINGS,
  moeMatvecConstants,
  moeMatvecGrid,
  moeMatvecParams,
  type MoeMatvecShape,
} from "./moe_matvec.ts";
import { DOT_ATOL, DOT_RTOL, randomWeights } from "./_quant_testing.ts";
import { QUANT_TYPES } from "./_quant.ts";
import { checkF32 } from "./_test_util.ts";
import { poisoned, readAll, testGpu, upload } from "../tests/util/gpu.ts";
import { Rng } from "../tests/util/rng.ts";

interface Case {
  shape: MoeMatvecShape;
  ids: Uint32Array;
  w: Uint8Array;
  x: Float32Array;
}

function makeCase(rng: Rng, type: GgmlTypeName, gateUp: boolean, withShared: boolean): Case {
  const be = Math.max(32, typeInfo(type).blockElems);
  const k = be * rng.int(1, 3);
  const n = rng.int(1, 40);
  const nExpert = rng.int(2, 9);
  const used = rng.int(1, 4);
  const tokens = rng.int(1, 4);
  const nCols = used * tokens;
  const sharedCols = withShared ? tokens : 0;
  // The shared expert, when present, is matrix index nExpert right after the routed ones.
  const nMats = nExpert + (withShared ? 1 : 0);
  const expertBytes = (k / typeInfo(type).blockElems) * typeInfo(type).blockBytes * n * nMats;
  const offGate = 4 * rng.int(0, 8);
  const offUp = gateUp ? Math.ceil((offGate + expertBytes) / 4) * 4 + 4 * rng.int(0, 8) : undefined;
  const total = (offUp ?? offGate) + expertBytes;
  const w = new Uint8Array(total);
  w.set(randomWeights(rng, type, k, n * nMats, 0.1), offGate);
  if (offUp !== undefined) w.set(randomWeights(rng, type, k, n * nMats, 0.1), offUp);
  const ids = Uint32Array.from({ length: nCols }, () => rng.int(0, nExpert));
  const xDiv = gateUp ? used : 1;
  const x = rng.normals(k * (gateUp ? nCols / xDiv : nCols + sharedCols));
  return {
    shape: { type, k, n, nExpert, nCols, xDiv, offGateBytes: offGate, offUpBytes: offUp, gateUp, sharedCols },
    ids,
    w,
    x,
  };
}

/** Float64 reference and its magnitude Σ|terms| (gate·up: the product rule bound). */
function reference(c: Case): { ref: Float64Array; tol: Float64Array } {
  const { type, k, n, nExpert, xDiv, gateUp } = c.shape;
  const shared = c.shape.sharedCols ?? 0;
  const nCols = c.shape.nCols + shared;
  const nMats = nExpert + (shared > 0 ? 1 : 0);
  const rb = (k / typeInfo(type).blockElems) * typeInfo(type).blockBytes;
  const mat = (off: number) => dequantize(type, c.w.subarray(off, off + rb * n * nMats), k * n * nMats);
  const g = mat(c.shape.offGateBytes);
  const u = gateUp ? mat(c.shape.offUpBytes!) : undefined;
  const ref = new Float64Array(n * nCols);
  const tol = new Float64Array(n * nCols);
  for (let col = 0; col < nCols; col++) {
    const routed = col < c.shape.nCols;
    const e = routed ? c.ids[col]! : nExpert;
    const xc = routed ? Math.floor(col / xDiv) : gateUp ? col - c.shape.nCols : col;
    for (let r = 0; r < n; r++) {
      let sg = 0, mg = 0, su = 0, mu = 0;
      for (let i = 0; i < k; i++) {
        const xv = c.x[xc * k + i]!;
        sg += g[(e * n + r) * k + i]! * xv;
        mg += Math.abs(g[(e * n + r) * k + i]! * xv);
        if (u) {
          su += u[(e * n + r) * k + i]! * xv;
          mu += Math.abs(u[(e * n + r) * k + i]! * xv);
        }
      }
      if (u) {
        const sig = 1 / (1 + Math.exp(-sg));
        ref[col * n + r] = sg * sig * su;
        // Relative error DOT_RTOL on each dot, carried through silu (derivative ≤ 1.1) and the product.
        tol[col * n + r] = DOT_RTOL * (1.1 * mg * Math.abs(su) + Math.abs(sg * sig) * mu) + DOT_ATOL;
      } else {
        ref[col * n + r] = sg;
        tol[col * n + r] = DOT_RTOL * mg + DOT_ATOL;
      }
    }
  }
  return { ref, tol };
}

Deno.test("moe_matvec: routed experts by GPU ids, gate·up with silu and plain down, every type", async () => {
  const rng = new Rng();
  const { device } = await testGpu();
  const cache = new PipelineCache(device);
  const cases: Case[] = [];
  for (const type of QUANT_TYPES) {
    const shared = rng.u32() % 2 === 0;
    cases.push(makeCase(rng, type, true, shared), makeCase(rng, type, false, !shared));
  }
  const enc = device.createCommandEncoder();
  const pass = enc.beginComputePass();
  const outs: GPUBuffer[] = [];
  for (const c of cases) {
    const consts = moeMatvecConstants(c.shape);
    const cols = c.shape.nCols + (c.shape.sharedCols ?? 0);
    const y = poisoned(device, c.shape.n * cols);
    outs.push(y);
    const b = {
      params: upload(device, moeMatvecParams(c.shape)),
      ids: upload(device, c.ids),
      weights: upload(device, c.w),
      x: upload(device, c.x),
      y: { buffer: y, size: 4 * c.shape.n * cols },
    };
    checkMoeMatvec(c.shape, consts, b);
    const p = await cache.get(MOE_MATVEC, consts);
    pass.setPipeline(p);
    pass.setBindGroup(0, bindGroup(device, p, MOE_MATVEC_BINDINGS.map((n) => b[n])));
    pass.dispatchWorkgroups(...moeMatvecGrid(c.shape, consts));
  }
  pass.end();
  device.queue.submit([enc.finish()]);
  const got = await readAll(device, outs);
  cases.forEach((c, i) => {
    const { ref, tol } = reference(c);
    const what =
      `moe_matvec ${c.shape.type} ${c.shape.gateUp ? "gate·up" : "down"} k=${c.shape.k} n=${c.shape.n} ` +
      `ids=${[...c.ids]} shared=${c.shape.sharedCols}`;
    // Per-element tolerance: compare |got-ref| against tol by scaling into assertClose's form.
    const g = new Float32Array(got[i]!, 0, ref.length);
    const scaled = Float64Array.from(g, (v, j) => (v - ref[j]!) / tol[j]!);
    checkF32(
      Float32Array.from(scaled).buffer,
      new Float64Array(ref.length),
      { atol: 1, rtol: 0 },
      { what, seed: rng.seed, guard: false },
    );
    checkF32(got[i]!, ref, { atol: Infinity, rtol: 0 }, { what: `${what} guard`, seed: rng.seed });
  });
});
