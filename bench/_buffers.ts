/**
 * Buffers for the kernel benchmarks: storage buffers filled with random bytes or random f32 in [-0.5, 0.5),
 * written in chunks of at most 16 MiB (a multi-GB weight buffer never exists whole on the CPU). No npm imports.
 * @module
 */

/** A storage buffer (COPY_DST too) of `bytes` random bytes, or random f32 values with `f32`. */
export function randomBuffer(device: GPUDevice, bytes: number, opts: { f32?: boolean } = {}): GPUBuffer {
  const buf = device.createBuffer({ size: bytes, usage: GPUBufferUsage.STORAGE | GPUBufferUsage.COPY_DST });
  const chunk = new Uint8Array(Math.min(bytes, 16 << 20));
  if (opts.f32) new Float32Array(chunk.buffer).forEach((_, i, a) => a[i] = Math.random() - 0.5);
  else for (let o = 0; o < chunk.length; o += 65536) crypto.getRandomValues(chunk.subarray(o, o + 65536));
  for (let o = 0; o < bytes; o += chunk.length) {
    device.queue.writeBuffer(buf, o, chunk, 0, Math.min(chunk.length, bytes - o));
  }
  return buf;
}
