/**
 * Twin of `stream_read.wgsl`: a plain streaming read of a byte range, the bandwidth ceiling for the
 * weight-reading kernels (bench/matvec.ts compares each matvec with it in the same run).
 *
 * Uniform `Params` (16 bytes, in struct order): 0 count (vec4 words), 4 off (vec4 words), 8 magic, 12 pad.
 * Bindings: 0 params, 1 src, 2 out (16 bytes).
 * @module
 */
import { bindGroup, type Binding, type KernelSpec, type PipelineCache } from "./kernel.ts";
import { bindingBytes, checkInt, checkShape, MAX_WORKGROUPS_PER_DIM } from "./_twin.ts";

/** Kernel description of `stream_read.wgsl`. */
export const STREAM_READ: KernelSpec = {
  name: "stream_read",
  url: new URL("./stream_read.wgsl", import.meta.url),
  lib: [],
  constants: {},
};

/** Size of the uniform params block in bytes. */
export const STREAM_READ_PARAMS_BYTES = 16;

/** Default workgroup count: enough resident invocations to fill a large GPU, few enough to loop. */
export const STREAM_READ_WORKGROUPS = 4096;

/** A read of `sizeBytes` bytes starting at `offsetBytes` (both multiples of 16). */
export interface StreamReadShape {
  /** First byte (multiple of 16). */
  readonly offsetBytes: number;
  /** Bytes to read (multiple of 16). */
  readonly sizeBytes: number;
}

/** A checked, ready-to-encode stream read. */
export interface StreamReadOp {
  /** The pipeline. */
  readonly pipeline: GPUComputePipeline;
  /** Bind group 0. */
  readonly bindGroup: GPUBindGroup;
  /** Workgroups (1-D). */
  readonly workgroups: number;
}

/**
 * The uniform params of a read; `magic` is the XOR fold that triggers the (never wanted) write.
 * @throws {RangeError} when offset or size is not a multiple of 16
 */
export function streamReadParams(shape: StreamReadShape, magic = 0x9e3779b9): Uint32Array<ArrayBuffer> {
  checkShape(
    shape.offsetBytes % 16 === 0 && shape.sizeBytes % 16 === 0 && shape.offsetBytes >= 0 &&
      shape.sizeBytes > 0,
    `Kernel stream_read: offset ${shape.offsetBytes} and size ${shape.sizeBytes} must be multiples of 16`,
  );
  return new Uint32Array([shape.sizeBytes / 16, shape.offsetBytes / 16, magic >>> 0, 0]);
}

/**
 * Checks the read against its bindings, compiles the pipeline and builds the bind group.
 * @throws {RangeError} when the range exceeds the source binding or the workgroup count is out of range
 */
export async function prepareStreamRead(
  cache: PipelineCache,
  opts: {
    device: GPUDevice;
    shape: StreamReadShape;
    bindings: { params: Binding; src: Binding; out: Binding };
    workgroups?: number;
  },
): Promise<StreamReadOp> {
  const { shape, bindings: b } = opts;
  streamReadParams(shape);
  checkShape(
    bindingBytes(b.src) >= shape.offsetBytes + shape.sizeBytes,
    `Kernel stream_read: binding src holds ${bindingBytes(b.src)} bytes but the read ends at byte ` +
      `${shape.offsetBytes + shape.sizeBytes}`,
  );
  checkShape(bindingBytes(b.out) >= 16, `Kernel stream_read: binding out needs 16 bytes`);
  const workgroups = opts.workgroups ?? STREAM_READ_WORKGROUPS;
  checkInt("Kernel stream_read: workgroups", workgroups, 1, MAX_WORKGROUPS_PER_DIM);
  const pipeline = await cache.get(STREAM_READ, {});
  return {
    pipeline,
    bindGroup: bindGroup(opts.device, pipeline, [b.params, b.src, b.out]),
    workgroups,
  };
}

/** Records one stream read into a caller-owned compute pass. */
export function encodeStreamRead(pass: GPUComputePassEncoder, op: StreamReadOp): void {
  pass.setPipeline(op.pipeline);
  pass.setBindGroup(0, op.bindGroup);
  pass.dispatchWorkgroups(op.workgroups);
}
