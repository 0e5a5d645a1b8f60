import assert from "node:assert/strict";
import {
  bindGroup,
  buildSource,
  foldTypeChains,
  type KernelSpec,
  PipelineCache,
  variantKey,
} from "./kernel.ts";
import { MATVEC } from "./matvec.ts";
import { poisoned, readAll, testGpu, upload } from "../tests/util/gpu.ts";

const PROBE: KernelSpec = {
  name: "kernel_test_probe",
  url: new URL("./_kernel_test_probe.wgsl", import.meta.url),
  lib: [],
  constants: { SCALE: "f32", OFFSET: "f32", USE_F16: "bool", WG: "u32" },
};

Deno.test("variantKey sorts constants", () => {
  assert.equal(
    variantKey(PROBE, { WG: 64, OFFSET: 1, SCALE: 2, USE_F16: false }),
    "kernel_test_probe{OFFSET=1,SCALE=2,USE_F16=false,WG=64}",
  );
});

Deno.test("buildSource rejects missing, unlisted and ill-typed constants", () => {
  assert.throws(() => buildSource(PROBE, { SCALE: 1, OFFSET: 0, USE_F16: false }), /constant WG is missing/);
  assert.throws(
    () => buildSource(PROBE, { SCALE: 1, OFFSET: 0, USE_F16: false, WG: 64, EXTRA: 1 }),
    /constant EXTRA is not listed/,
  );
  assert.throws(() => buildSource(PROBE, { SCALE: 1, OFFSET: 0, USE_F16: 1, WG: 64 }), /must be a boolean/);
  assert.throws(() => buildSource(PROBE, { SCALE: 1, OFFSET: 0, USE_F16: false, WG: -1 }), /must be a u32/);
  const src = buildSource(PROBE, { SCALE: 0.5, OFFSET: -2, USE_F16: true, WG: 64 }, { f16: true });
  assert.match(src, /^enable f16;\nconst SCALE: f32 = 5e-1f;\nconst OFFSET: f32 = -2e\+0f;/);
});

// Guards against a runtime whose f16 shaders return zeros (seen in an older Deno, PLATFORM.md).
Deno.test("foldTypeChains keeps the one return of TYPE's branch, or the chain's last; buildSource folds", () => {
  const chain = [
    "fn pos(c: u32) -> u32 {",
    "  if (TYPE == 12u) { return k4(c); }",
    "  if (TYPE == 8u) { return q8(c); }",
    "  return f32p(c);",
    "}",
    "if (TYPE == 8u) {",
    "  x = 1u;",
    "}",
  ].join("\n");
  const body = (ret: string) => ["fn pos(c: u32) -> u32 {", ret, "}", "if (TYPE == 8u) {", "  x = 1u;", "}"];
  assert.equal(foldTypeChains(chain, 8), body("  return q8(c);").join("\n"));
  assert.equal(foldTypeChains(chain, 12), body("  return k4(c);").join("\n"));
  assert.equal(foldTypeChains(chain, 0), body("  return f32p(c);").join("\n"), "no branch: the last return");
  assert.throws(() => foldTypeChains("  if (TYPE == 8u) { return a; }\n  x = 2u;", 8), /not a plain return/);
  // A real kernel: lib/quant.wgsl's chains are gone, the taken decoder stays, the others are not called.
  const values = { TYPE: 23, TEAM: 32, ROWS: 4, BATCH: 1, ACC: 0, NORM: 0, EPS: 0, UNROLL: 2, XR: 0, SR: 0 };
  const src = buildSource(MATVEC, values);
  assert.doesNotMatch(src, /if \(TYPE == \d+u\) \{ return/);
  assert.match(src, /^\s*return iq4xs_q\(rb, c, j\);$/m);
  assert.doesNotMatch(src, /return q4k_q\(/);
});

Deno.test("specialised kernels compute on the adapter, f32 and f16 variants", async () => {
  const { device, f16 } = await testGpu();
  const cache = new PipelineCache(device, { f16 });
  const n = 300; // not a multiple of the workgroup size: the bounds guard is exercised
  const x = new Float32Array(n).map((_, i) => i / 8);
  const xb = upload(device, x);
  const variants = f16 ? [false, true] : [false];
  const outs: GPUBuffer[] = [];
  const enc = device.createCommandEncoder();
  const pass = enc.beginComputePass();
  for (const useF16 of variants) {
    const p = await cache.get(PROBE, { SCALE: 2, OFFSET: 0.5, USE_F16: useF16, WG: 64 });
    const y = poisoned(device, n);
    outs.push(y);
    pass.setPipeline(p);
    pass.setBindGroup(0, bindGroup(device, p, [xb, { buffer: y, offset: 0, size: n * 4 }]));
    pass.dispatchWorkgroups(Math.ceil(n / 64));
  }
  pass.end();
  device.queue.submit([enc.finish()]);
  const got = await readAll(device, outs);
  got.forEach((buf, v) => {
    const y = new Float32Array(buf, 0, n);
    for (let i = 0; i < n; i++) {
      // i/8*2 is exact in f16 for i < 300 (at most 75, 3 fractional bits).
      assert.equal(y[i], x[i]! * 2 + 0.5, `variant ${variants[v]} element ${i}`);
    }
    assert.ok(Number.isNaN(new Float32Array(buf)[n]), "guard band overwritten");
  });
  xb.destroy();
  outs.forEach((b) => b.destroy());
});
