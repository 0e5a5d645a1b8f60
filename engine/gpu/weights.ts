/**
 * Streams GGUF tensors into GPU storage buffers through one reusable staging chunk; never holds a whole
 * model (or a whole large tensor) in JS memory. A tensor larger than the device's binding limit is split
 * along its slowest dimension into row ranges, each its own buffer (row ranges are byte-contiguous).
 * @module
 */
import type { GgufFile, GgufTensorInfo } from "../gguf.ts";
import type { GgmlTypeInfo } from "../quant/types.ts";

/** One GPU buffer range holding rows `[firstRow, firstRow + nRows)` of a tensor (rows = everything past ne0). */
export interface GpuTensorPart {
  /** The buffer (STORAGE | COPY_DST | COPY_SRC), sized to a multiple of 4 bytes. */
  readonly buffer: GPUBuffer;
  /** Byte offset of row `firstRow` in `buffer` (non-zero only for tensors packed with others). */
  readonly offsetBytes: number;
  /** First row (flattened over ne1..ne3) stored in this part. */
  readonly firstRow: number;
  /** Rows in this part. */
  readonly nRows: number;
  /** Bytes of tensor data in this part (before padding to 4). */
  readonly sizeBytes: number;
}

/** A tensor resident on the GPU in its on-disk block layout. */
export interface GpuTensor {
  /** GGUF tensor name. */
  readonly name: string;
  /** Element type. */
  readonly type: GgmlTypeInfo;
  /** Shape, innermost first. */
  readonly ne: readonly number[];
  /** Bytes of one row of ne0 elements. */
  readonly rowBytes: number;
  /** The parts, in row order; one part unless the tensor exceeds the binding limit. */
  readonly parts: readonly GpuTensorPart[];
}

/** Progress of an upload, reported after each chunk. */
export interface UploadProgress {
  /** Bytes uploaded so far. */
  readonly doneBytes: number;
  /** Bytes to upload in all. */
  readonly totalBytes: number;
  /** Tensors completed so far. */
  readonly doneTensors: number;
  /** Tensors to upload in all. */
  readonly totalTensors: number;
}

/** Default staging chunk: large enough for full writeBuffer bandwidth, small enough to keep RSS low. */
const DEFAULT_CHUNK_BYTES = 64 * 2 ** 20;

/** Alignment of each tensor inside a pack: the storage-buffer offset alignment WebGPU guarantees. */
export const PACK_ALIGN_BYTES = 256;

/**
 * Uploads `names` from `file` to `device`, in the order of the list.
 *
 * @param opts.packs groups of names stored back to back in ONE buffer (each at a 256-byte aligned offset),
 *   for kernels that read several tensors through one binding (expert gate and up); every name of a pack
 *   must also be in `names`, and a pack must fit the part limit
 * @param opts.rowOrder per tensor, the source row of each stored row (a lossless permutation, e.g. the
 *   legacy `ssm_in` rows gathered into canonical order); such a tensor is read whole, so keep it small
 * @param opts.maxPartBytes largest buffer per part (default: the device's maxStorageBufferBindingSize)
 * @param opts.onProgress called after each chunk
 * @param opts.onBytes called synchronously with every chunk of tensor bytes as read from the file (before any
 *   row permutation), `offsetBytes` within the tensor: a fingerprint hashes the weights during the upload
 *   without reading them twice. The chunk's buffer is reused after the call returns: copy what you keep
 * @throws {RangeError} when one row alone, or a pack, exceeds the part limit (it cannot be bound)
 */
export async function uploadTensors(
  device: GPUDevice,
  file: GgufFile,
  opts: {
    names: readonly string[];
    packs?: readonly (readonly string[])[];
    rowOrder?: ReadonlyMap<string, Uint32Array>;
    maxPartBytes?: number;
    chunkBytes?: number;
    onProgress?: (p: UploadProgress) => void;
    onBytes?: (name: string, chunk: Uint8Array, offsetBytes: number) => void;
  },
): Promise<Map<string, GpuTensor>> {
  const infos = opts.names.map((n) => file.tensor(n));
  const maxPart = Math.min(opts.maxPartBytes ?? Infinity, device.limits.maxStorageBufferBindingSize);
  const chunkBytes = Math.max(4, Math.floor((opts.chunkBytes ?? DEFAULT_CHUNK_BYTES) / 4) * 4);
  const staging = new Uint8Array(chunkBytes);
  const totalBytes = infos.reduce((s, t) => s + t.nbytes, 0);
  const planned = new Map<string, GpuTensor>();
  for (const pack of opts.packs ?? []) {
    for (const [name, t] of planPack(device, pack.map((n) => file.tensor(n)), maxPart)) planned.set(name, t);
  }
  const out = new Map<string, GpuTensor>();
  let doneBytes = 0;
  const progress = () =>
    opts.onProgress?.({ doneBytes, totalBytes, doneTensors: out.size, totalTensors: infos.length });
  for (const info of infos) {
    const tensor = planned.get(info.name) ?? planParts(device, info, maxPart);
    const order = opts.rowOrder?.get(info.name);
    let whole: Uint8Array | undefined;
    if (order) {
      const raw = await file.readTensor(info.name);
      opts.onBytes?.(info.name, raw, 0);
      whole = permuteRows(raw, tensor.rowBytes, order, info.name);
    }
    for (const part of tensor.parts) {
      const base = part.firstRow * tensor.rowBytes;
      for (let at = 0; at < part.sizeBytes; at += chunkBytes) {
        const n = Math.min(chunkBytes, part.sizeBytes - at);
        if (whole) staging.set(whole.subarray(base + at, base + at + n));
        else {
          await file.readTensorInto(info.name, staging.subarray(0, n), base + at);
          opts.onBytes?.(info.name, staging.subarray(0, n), base + at);
        }
        const padded = Math.ceil(n / 4) * 4;
        if (padded !== n) staging.fill(0, n, padded);
        device.queue.writeBuffer(part.buffer, part.offsetBytes + at, staging, 0, padded);
        doneBytes += n;
        progress();
      }
    }
    out.set(info.name, tensor);
  }
  progress();
  return out;
}

function permuteRows(bytes: Uint8Array, rowBytes: number, order: Uint32Array, name: string): Uint8Array {
  const nRows = bytes.length / rowBytes;
  if (order.length !== nRows) {
    throw new Error(
      `Internal error: row order of ${name} has ${order.length} rows but the tensor has ${nRows}`,
    );
  }
  const out = new Uint8Array(bytes.length);
  for (let r = 0; r < nRows; r++) {
    const src = order[r]!;
    if (src >= nRows) throw new Error(`Internal error: row order of ${name} names row ${src} of ${nRows}`);
    out.set(bytes.subarray(src * rowBytes, (src + 1) * rowBytes), r * rowBytes);
  }
  return out;
}

function planPack(
  device: GPUDevice,
  infos: readonly GgufTensorInfo[],
  maxPartBytes: number,
): Map<string, GpuTensor> {
  let size = 0;
  const offsets = infos.map((info) => {
    const at = size;
    size = Math.ceil((at + info.nbytes) / PACK_ALIGN_BYTES) * PACK_ALIGN_BYTES;
    return at;
  });
  const names = infos.map((i) => i.name).join(" + ");
  if (size > maxPartBytes) {
    throw new RangeError(
      `Tensors ${names} (${size} bytes together) exceed the GPU binding limit of ${maxPartBytes} bytes: ` +
        `this adapter cannot run this model`,
    );
  }
  const buffer = device.createBuffer({
    label: names,
    size: Math.max(4, size),
    usage: GPUBufferUsage.STORAGE | GPUBufferUsage.COPY_DST | GPUBufferUsage.COPY_SRC,
  });
  return new Map(infos.map((info, i) => {
    const ne0 = info.ne[0] ?? 1;
    const rowBytes = (ne0 / info.type.blockElems) * info.type.blockBytes;
    const part = {
      buffer,
      offsetBytes: offsets[i]!,
      firstRow: 0,
      nRows: info.nElems / ne0,
      sizeBytes: info.nbytes,
    };
    return [info.name, { name: info.name, type: info.type, ne: info.ne, rowBytes, parts: [part] }];
  }));
}

function planParts(device: GPUDevice, info: GgufTensorInfo, maxPartBytes: number): GpuTensor {
  const ne0 = info.ne[0] ?? 1;
  const rowBytes = (ne0 / info.type.blockElems) * info.type.blockBytes;
  const nRows = info.nElems / ne0;
  if (rowBytes > maxPartBytes) {
    throw new RangeError(
      `Tensor ${info.name}: one row of ${rowBytes} bytes exceeds the GPU binding limit of ${maxPartBytes} bytes: ` +
        `this adapter cannot run this model`,
    );
  }
  const rowsPerPart = Math.max(1, Math.floor(maxPartBytes / rowBytes));
  const parts: GpuTensorPart[] = [];
  for (let first = 0; first < nRows; first += rowsPerPart) {
    const rows = Math.min(rowsPerPart, nRows - first);
    const sizeBytes = rows * rowBytes;
    const buffer = device.createBuffer({
      label: parts.length === 0 && first + rows >= nRows ? info.name : `${info.name}[rows ${first}+${rows}]`,
      size: Math.max(4, Math.ceil(sizeBytes / 4) * 4),
      usage: GPUBufferUsage.STORAGE | GPUBufferUsage.COPY_DST | GPUBufferUsage.COPY_SRC,
    });
    parts.push({ buffer, offsetBytes: 0, firstRow: first, nRows: rows, sizeBytes });
  }
  return { name: info.name, type: info.type, ne: info.ne, rowBytes, parts };
}
