/**
 * Test helpers of the int8-x kernels (private; tests only): quantize_q8 run on the GPU, the reference
 * rounding every other int8 rounding in the engine must equal bit for bit.
 * @module
 */
import type { PipelineCache } from "./kernel.ts";
import type { GgmlTypeName } from "../engine/quant/types.ts";
import { GUARD_WORDS, poisoned, readAll, upload } from "../tests/util/gpu.ts";
import { encodeQ8, prepareQuantizeQ8, q8xBytes, quantizeQ8Params } from "./matvec_q8.ts";

/**
 * quantize_q8's output words for x (at element offset `xOff`; the gap before it is NaN and must not be read)
 * in the byte order of weights of `type`, and the poisoned guard words after them.
 */
export async function quantizeOnGpu(
  device: GPUDevice,
  cache: PipelineCache,
  type: GgmlTypeName,
  x: Float32Array,
  xOff = 0,
): Promise<{ words: Uint32Array; guard: Uint32Array }> {
  const k = x.length;
  const xAll = new Float32Array(xOff + k).fill(Number.NaN);
  xAll.set(x, xOff);
  const xBuf = upload(device, xAll, "x");
  const words = q8xBytes(k) / 4;
  const xqBuf = poisoned(device, words);
  const pb = device.createBuffer({ size: 16, usage: GPUBufferUsage.UNIFORM | GPUBufferUsage.COPY_DST });
  device.queue.writeBuffer(pb, 0, quantizeQ8Params({ type, k, xOffset: xOff }));
  const op = await prepareQuantizeQ8(cache, {
    device,
    shape: { type, k, xOffset: xOff },
    bindings: { params: pb, x: xBuf, xq: { buffer: xqBuf, offset: 0, size: 4 * words } },
  });
  const enc = device.createCommandEncoder();
  const pass = enc.beginComputePass();
  encodeQ8(pass, op);
  pass.end();
  device.queue.submit([enc.finish()]);
  const [out] = await readAll(device, [xqBuf]);
  [xBuf, xqBuf, pb].forEach((b) => b.destroy());
  return { words: new Uint32Array(out!, 0, words), guard: new Uint32Array(out!, 4 * words, GUARD_WORDS) };
}
