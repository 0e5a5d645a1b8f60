/**
 * GPU helpers for kernel tests: one shared device per test file, poisoned outputs, batched readback.
 * @module
 */
import { acquireGpu, type Gpu } from "../../engine/gpu/device.ts";

/** NaN bit pattern written into float outputs before a dispatch. */
export const POISON_F32 = 0x7fc00000;
/** Words of poison checked past the end of each output. */
export const GUARD_WORDS = 64;

let shared: Promise<Gpu> | undefined;

/** The test process's device (acquired once; a missing adapter fails the test, never skips it). */
export function testGpu(): Promise<Gpu> {
  shared ??= acquireGpu();
  return shared;
}

/** A storage buffer initialised with `data` (padded to 4 bytes), usable as input. */
export function upload(device: GPUDevice, data: ArrayBufferView, label = "input"): GPUBuffer {
  const size = Math.max(4, Math.ceil(data.byteLength / 4) * 4);
  const buf = device.createBuffer({
    label,
    size,
    usage: GPUBufferUsage.STORAGE | GPUBufferUsage.COPY_DST | GPUBufferUsage.COPY_SRC,
    mappedAtCreation: true,
  });
  new Uint8Array(buf.getMappedRange()).set(new Uint8Array(data.buffer, data.byteOffset, data.byteLength));
  buf.unmap();
  return buf;
}

/** An output storage buffer of `nWords` u32 words plus a guard band, all filled with `poison`. */
export function poisoned(
  device: GPUDevice,
  nWords: number,
  poison = POISON_F32,
  label = "output",
): GPUBuffer {
  const total = nWords + GUARD_WORDS;
  const buf = device.createBuffer({
    label,
    size: total * 4,
    usage: GPUBufferUsage.STORAGE | GPUBufferUsage.COPY_DST | GPUBufferUsage.COPY_SRC,
    mappedAtCreation: true,
  });
  new Uint32Array(buf.getMappedRange()).fill(poison >>> 0);
  buf.unmap();
  return buf;
}

/** Copies each buffer to a staging buffer and maps them all in one round (one readback floor). */
export async function readAll(device: GPUDevice, bufs: readonly GPUBuffer[]): Promise<ArrayBuffer[]> {
  const enc = device.createCommandEncoder();
  const staging = bufs.map((b) => {
    const s = device.createBuffer({ size: b.size, usage: GPUBufferUsage.MAP_READ | GPUBufferUsage.COPY_DST });
    enc.copyBufferToBuffer(b, 0, s, 0, b.size);
    return s;
  });
  device.queue.submit([enc.finish()]);
  await Promise.all(staging.map((s) => s.mapAsync(GPUMapMode.READ)));
  return staging.map((s) => {
    const copy = s.getMappedRange().slice(0);
    s.unmap();
    s.destroy();
    return copy;
  });
}
