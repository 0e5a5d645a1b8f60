import assert from "node:assert/strict";
import { testGpu } from "../../tests/util/gpu.ts";
import { NATIVE_BACKENDS } from "./device.ts";

Deno.test("acquireGpu: an adapter exists and the device has raised limits", async () => {
  const gpu = await testGpu();
  assert.ok(gpu.summary.length > 0);
  // The default binding limit is 128 MiB; raised limits are never below it.
  assert.ok(gpu.device.limits.maxStorageBufferBindingSize >= 128 * 2 ** 20, gpu.summary);
  assert.ok(gpu.device.limits.maxStorageBuffersPerShaderStage >= 8, gpu.summary);
});

Deno.test("acquireGpu leaves wgpu's GL backend out unless DENO_WEBGPU_BACKEND is set", async () => {
  const device = new URL("./device.ts", import.meta.url).href;
  const script = `import { acquireGpu } from ${JSON.stringify(device)};\n` +
    `const g = await acquireGpu();\nconsole.log(Deno.env.get("DENO_WEBGPU_BACKEND"));\ng.device.destroy();`;
  const backendAfter = async (preset: string | undefined): Promise<string> => {
    const env = { ...Deno.env.toObject() };
    delete env.DENO_WEBGPU_BACKEND;
    if (preset !== undefined) env.DENO_WEBGPU_BACKEND = preset;
    const out = await new Deno.Command(Deno.execPath(), {
      args: ["eval", "--no-lock", script],
      env,
      clearEnv: true,
      stdout: "piped",
      stderr: "piped",
    }).output();
    const text = new TextDecoder().decode(out.stdout).trim();
    assert.ok(out.success, new TextDecoder().decode(out.stderr));
    return text;
  };
  assert.equal(await backendAfter(undefined), NATIVE_BACKENDS);
  assert.equal(await backendAfter("vulkan"), "vulkan");
});

Deno.test("acquireGpu on Linux without XDG_RUNTIME_DIR: no loader complaint on stderr", {
  ignore: Deno.build.os !== "linux",
}, async () => {
  const device = new URL("./device.ts", import.meta.url).href;
  const script = `import { acquireGpu } from ${JSON.stringify(device)};\n` +
    `const g = await acquireGpu();\ng.device.destroy();`;
  const env = { ...Deno.env.toObject() };
  delete env.XDG_RUNTIME_DIR;
  const out = await new Deno.Command(Deno.execPath(), {
    args: ["eval", "--no-lock", script],
    env,
    clearEnv: true,
    stdout: "piped",
    stderr: "piped",
  }).output();
  const stderr = new TextDecoder().decode(out.stderr);
  assert.ok(out.success, stderr);
  assert.doesNotMatch(stderr, /XDG_RUNTIME_DIR/);
});
