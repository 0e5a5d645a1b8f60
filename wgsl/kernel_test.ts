import assert from "node:assert/strict";
import { bindGroup, buildSource, type KernelSpec, PipelineCache, variantKey } from "./kernel.ts";
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
