/**
 * WebGPU adapter and device acquisition with the adapter's maximum limits.
 * @module
 */
import { GpuError } from "../errors.ts";

/** A device plus what was granted, as every GPU-using part of the engine needs it. */
export interface Gpu {
  /** The adapter the device came from. */
  readonly adapter: GPUAdapter;
  /** The device, created with the adapter's maximum buffer, binding and workgroup limits. */
  readonly device: GPUDevice;
  /** Whether `shader-f16` was enabled. */
  readonly f16: boolean;
  /** Whether `timestamp-query` was enabled. */
  readonly timestamps: boolean;
  /** One-line description for logs: adapter, backend hints and key limits. */
  readonly summary: string;
}

/** Limits raised to the adapter's maximum: big weights and fused kernels need all of them. */
const RAISED_LIMITS = [
  "maxBufferSize",
  "maxStorageBufferBindingSize",
  "maxComputeWorkgroupStorageSize",
  "maxComputeInvocationsPerWorkgroup",
  "maxComputeWorkgroupSizeX",
  "maxComputeWorkgroupSizeY",
  "maxComputeWorkgroupSizeZ",
  "maxComputeWorkgroupsPerDimension",
  "maxStorageBuffersPerShaderStage",
  "maxBindingsPerBindGroup",
  "maxUniformBufferBindingSize",
] as const;

/**
 * The wgpu backends asked for when `DENO_WEBGPU_BACKEND` is not set: every native compute backend, not GL.
 *
 * Deno's default also opens wgpu's GL backend, which loads Mesa's EGL on Linux. A process that did so
 * from a thread other than the main one (a `Worker`, each module of `deno test`) aborts at exit about
 * once in eight runs with Mesa 22.3 (Debian 12; glibc: "double free or corruption" freeing that thread's
 * thread-specific data). Measured on lavapipe: 9 of 50 runs of six test modules that only request an
 * adapter; 0 of 60 with the GL backend left out. The engine never uses GL: its kernels need storage
 * buffers and limits the GL backend does not give.
 */
export const NATIVE_BACKENDS = "vulkan,metal,dx12";

/**
 * Acquires the high-performance adapter and a device with its maximum limits, `shader-f16` and
 * `timestamp-query` when present. Device loss is logged, never silent. Leaves wgpu's GL backend out
 * unless `DENO_WEBGPU_BACKEND` says otherwise ({@linkcode NATIVE_BACKENDS}).
 *
 * @throws {GpuError} when no adapter is found (says what to install) or the device request fails
 * @example
 * ```ts
 * const gpu = await acquireGpu();
 * console.log(gpu.summary);
 * ```
 */
export async function acquireGpu(): Promise<Gpu> {
  if (typeof navigator === "undefined" || !("gpu" in navigator)) {
    throw new GpuError("WebGPU is not available in this runtime: run under Deno 2.9 or newer");
  }
  chooseBackends();
  const adapter = await navigator.gpu.requestAdapter({ powerPreference: "high-performance" });
  if (!adapter) {
    throw new GpuError(
      "No WebGPU adapter found: install a Vulkan driver (on Debian without a GPU: " +
        "`apt-get install mesa-vulkan-drivers` for the lavapipe software adapter; with a GPU: its vendor's " +
        "Vulkan ICD), or set VK_DRIVER_FILES to the driver's ICD json (wgpu's GL backend is left out unless " +
        "DENO_WEBGPU_BACKEND names it)",
    );
  }
  const requiredLimits: Record<string, number> = {};
  for (const name of RAISED_LIMITS) {
    const v = (adapter.limits as unknown as Record<string, number | undefined>)[name];
    if (typeof v === "number") requiredLimits[name] = v;
  }
  const features: GPUFeatureName[] = [];
  for (const f of ["shader-f16", "timestamp-query"] as const) {
    if (adapter.features.has(f)) features.push(f);
  }
  let device: GPUDevice;
  try {
    device = await adapter.requestDevice({ requiredFeatures: features, requiredLimits });
  } catch (e) {
    throw new GpuError(`Requesting a WebGPU device from ${describe(adapter)} failed: ${String(e)}`, {
      cause: e,
    });
  }
  device.lost.then((info) => {
    if (info.reason !== "destroyed") console.error(`GPU device lost: ${info.message}`);
  });
  const l = device.limits;
  const summary = `${describe(adapter)}; f16=${features.includes("shader-f16")}` +
    `; maxBinding=${fmtBytes(l.maxStorageBufferBindingSize)}; maxBuffer=${fmtBytes(l.maxBufferSize)}` +
    `; wgStorage=${l.maxComputeWorkgroupStorageSize}B`;
  return {
    adapter,
    device,
    f16: features.includes("shader-f16"),
    timestamps: features.includes("timestamp-query"),
    summary,
  };
}

/**
 * Sets `DENO_WEBGPU_BACKEND` to {@linkcode NATIVE_BACKENDS} when unset (and on Linux `XDG_RUNTIME_DIR`
 * to the temp folder when unset). Deno reads them when a runtime
 * (the main one or a worker's) first creates its WebGPU instance, so this must run before the first
 * `requestAdapter` of every runtime; without env permission the default stands.
 */
function chooseBackends(): void {
  try {
    if (Deno.env.get("DENO_WEBGPU_BACKEND") === undefined) {
      Deno.env.set("DENO_WEBGPU_BACKEND", NATIVE_BACKENDS);
    }
    // Linux without a desktop session: the Vulkan loader's window-system layer prints "error:
    // XDG_RUNTIME_DIR is invalid or not set" twice on every start, though compute never uses it. A
    // harmless value (the temp folder) keeps that noise out of every GPU command's output.
    if (Deno.build.os === "linux" && !Deno.env.get("XDG_RUNTIME_DIR")) {
      Deno.env.set("XDG_RUNTIME_DIR", Deno.env.get("TMPDIR") || "/tmp");
    }
  } catch (e) {
    if (!(e instanceof Deno.errors.NotCapable || e instanceof Deno.errors.PermissionDenied)) throw e;
  }
}

function describe(adapter: GPUAdapter): string {
  const i = adapter.info;
  const name = i.description || i.device || "unknown adapter";
  return `${name} (vendor ${i.vendor || "?"}${i.architecture ? ", " + i.architecture : ""})`;
}

function fmtBytes(n: number): string {
  if (n >= 2 ** 30) return `${(n / 2 ** 30).toFixed(1)}GiB`;
  return `${(n / 2 ** 20).toFixed(0)}MiB`;
}
