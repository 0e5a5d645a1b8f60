/**
 * Timing of GPU work for the kernel benchmarks: `reps` repetitions recorded into one compute pass, timed with
 * timestamp queries around the pass when the adapter has them (else wall clock around submit and
 * `onSubmittedWorkDone`), after untimed warm-up passes (pipelines, clocks), best of several. No npm imports.
 * @module
 */

/** Times compute passes on one device; reuse one per benchmark. */
export class PassTimer {
  readonly #device: GPUDevice;
  readonly #querySet: GPUQuerySet | undefined;
  readonly #resolve: GPUBuffer;
  readonly #read: GPUBuffer;

  /** @param timestamps whether the device was created with `timestamp-query` */
  constructor(device: GPUDevice, timestamps: boolean) {
    this.#device = device;
    this.#querySet = timestamps ? device.createQuerySet({ type: "timestamp", count: 2 }) : undefined;
    this.#resolve = device.createBuffer({
      size: 16,
      usage: GPUBufferUsage.QUERY_RESOLVE | GPUBufferUsage.COPY_SRC,
    });
    this.#read = device.createBuffer({ size: 16, usage: GPUBufferUsage.COPY_DST | GPUBufferUsage.MAP_READ });
  }

  /**
   * Seconds per repetition: `encode(pass, i)` for i < `reps` in one pass, the best of `timed` (default 3)
   * timed passes after untimed ones that run for at least `warmMs` (default 50) of wall time. The H200 idles
   * at a low SM clock and a single warm pass of a few ms left later kernels of a run slower than earlier ones
   * (docs/PERF.md); the best of several passes is the one at full clock.
   */
  async perRep(
    encode: (pass: GPUComputePassEncoder, i: number) => void,
    reps: number,
    opts: { warmMs?: number; timed?: number } = {},
  ): Promise<number> {
    const warmMs = opts.warmMs ?? 50;
    const t0 = performance.now();
    for (let i = 0; i < 100; i++) {
      await this.#run(encode, reps, false);
      if (performance.now() - t0 >= warmMs) break;
    }
    let best = Infinity;
    for (let i = 0; i < (opts.timed ?? 3); i++) best = Math.min(best, await this.#run(encode, reps, true));
    return best / reps;
  }

  async #run(
    encode: (pass: GPUComputePassEncoder, i: number) => void,
    reps: number,
    timed: boolean,
  ): Promise<number> {
    const device = this.#device;
    const qs = timed ? this.#querySet : undefined;
    const enc = device.createCommandEncoder();
    const pass = enc.beginComputePass(
      qs
        ? { timestampWrites: { querySet: qs, beginningOfPassWriteIndex: 0, endOfPassWriteIndex: 1 } }
        : undefined,
    );
    for (let i = 0; i < reps; i++) encode(pass, i);
    pass.end();
    if (qs) {
      enc.resolveQuerySet(qs, 0, 2, this.#resolve, 0);
      enc.copyBufferToBuffer(this.#resolve, 0, this.#read, 0, 16);
    }
    const t0 = performance.now();
    device.queue.submit([enc.finish()]);
    await device.queue.onSubmittedWorkDone();
    const wall = (performance.now() - t0) / 1000;
    if (!qs) return wall;
    await this.#read.mapAsync(GPUMapMode.READ);
    const ts = new BigUint64Array(this.#read.getMappedRange().slice(0));
    this.#read.unmap();
    return Number(ts[1]! - ts[0]!) / 1e9;
  }
}
