import assert from "node:assert/strict";
import { testGpu } from "../../tests/util/gpu.ts";

Deno.test("acquireGpu: an adapter exists and the device has raised limits", async () => {
  const gpu = await testGpu();
  assert.ok(gpu.summary.length > 0);
  // The default binding limit is 128 MiB; raised limits are never below it.
  assert.ok(gpu.device.limits.maxStorageBufferBindingSize >= 128 * 2 ** 20, gpu.summary);
  assert.ok(gpu.device.limits.maxStorageBuffersPerShaderStage >= 8, gpu.summary);
});
