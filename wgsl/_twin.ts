/**
 * Shared checks for kernel twins (private): binding sizes against `ne`, grid limits, constant ranges.
 * Every twin runs these before it encodes anything, so a wrong shape throws on the CPU with the kernel,
 * binding and sizes named instead of reading or writing out of bounds on the GPU.
 * @module
 */
import type { Binding } from "./kernel.ts";

/** Bytes a binding exposes to the shader. */
export function bindingBytes(b: Binding): number {
  if (b instanceof GPUBuffer) return b.size;
  return b.size ?? b.buffer.size - (b.offset ?? 0);
}

/**
 * Throws when binding `name` of `kernel` holds fewer than `4 * product(ne)` bytes (all bindings here are
 * arrays of 32-bit words).
 */
export function checkBinding(kernel: string, name: string, b: Binding, ne: readonly number[]): void {
  const need = 4 * ne.reduce((a, x) => a * x, 1);
  const got = bindingBytes(b);
  if (got < need) {
    throw new RangeError(
      `Kernel ${kernel}: binding ${name} holds ${got} bytes but ne=[${
        ne.join(", ")
      }] of 32-bit words needs ` +
        `${need}: allocate the buffer for the shape the constants describe`,
    );
  }
}

/** Throws unless `v` is an integer in [lo, hi]; `what` names the kernel and the value. */
export function checkInt(what: string, v: number, lo: number, hi: number): void {
  if (!Number.isInteger(v) || v < lo || v > hi) {
    throw new RangeError(`${what} must be an integer in [${lo}, ${hi}], got ${v}`);
  }
}

/** Throws unless `cond`; `msg` says which constraint on which kernel failed and what to change. */
export function checkShape(cond: boolean, msg: string): void {
  if (!cond) throw new RangeError(msg);
}

/**
 * Throws unless `bytes` of workgroup memory fit the device; `what` names the kernel and the constants that
 * set it, `fix` says what to change.
 */
export function checkWorkgroupBytes(device: GPUDevice, what: string, bytes: number, fix: string): void {
  const max = device.limits.maxComputeWorkgroupStorageSize;
  checkShape(bytes <= max, `${what} need ${bytes} bytes of workgroup memory, the device has ${max}: ${fix}`);
}

/** Largest workgroup count per grid dimension WebGPU guarantees. */
export const MAX_WORKGROUPS_PER_DIM = 65535;

/** Whether `n` is a power of two. */
export function isPow2(n: number): boolean {
  return Number.isInteger(n) && n > 0 && (n & (n - 1)) === 0;
}
