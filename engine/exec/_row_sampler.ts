/**
 * The GPU sampler over logits rows the caller already has (a split's last stage when a RUN's logits come back
 * anyway, for top-k pairs; other sampled runs draw in their own pass: `RunOptions.sample`), drawing
 * one id per row as consecutive decode steps of one sequence: row j at RNG step `step + j`, each drawn id
 * appended to the penalty history before row j + 1, exactly as the decode driver's steps do. It is the decode
 * driver's selector ({@linkcode buildSelector}: the same `sample` kernel, constants and UNUSED-token mask), one
 * per row, each row's sampler state copied from the one before, so the ids are the bits `generate()` draws
 * from the same logits.
 * @module
 */
import type { StagingPool } from "../gpu/readback.ts";
import type { PipelineCache } from "../../wgsl/kernel.ts";
import { encodeOps, padWords } from "../graph/builder.ts";
import { SAMPLE_HIST, sampleParamWords } from "../sampling.ts";
import { packSampleState } from "../../wgsl/sample.ts";
import { STORAGE } from "./activations.ts";
import { buildSelector, type Selector } from "./_selector.ts";
import type { RowSampleOptions } from "./options.ts";

export type { RowSampleOptions };

/** Rows the first rows buffer holds (a RUN's ids: 1 + up to 7 drafts). */
const MIN_ROWS = 8;

/** One id per logits row from the GPU sampler; see the module doc. */
export class RowSampler {
  readonly #device: GPUDevice;
  readonly #cache: PipelineCache;
  readonly #owned: GPUBuffer[];
  readonly #nVocab: number;
  readonly #mask: Uint32Array<ArrayBuffer> | undefined;
  readonly #stagings: StagingPool;
  /** Logits rows, each at a 256-byte aligned offset (the selectors bind one row each). */
  #rows: GPUBuffer | undefined;
  readonly #sels: Selector[] = [];
  #dummy: GPUBuffer | undefined;

  /**
   * A sampler on `device` for `nVocab`-wide rows; its buffers go to `owned` (freed with the stage).
   * @param o `mask`: the UNUSED-token mask words the stage's decode driver samples with; `stagings`: the
   * stage's staging buffers (the ids are read early: engine/gpu/readback.ts)
   */
  constructor(
    device: GPUDevice,
    o: {
      cache: PipelineCache;
      owned: GPUBuffer[];
      nVocab: number;
      mask: Uint32Array<ArrayBuffer> | undefined;
      stagings: StagingPool;
    },
  ) {
    this.#device = device;
    this.#cache = o.cache;
    this.#owned = o.owned;
    this.#nVocab = o.nVocab;
    this.#mask = o.mask;
    this.#stagings = o.stagings;
  }

  /**
   * Draws one id per row of `logits` (ne=[nVocab, n], f32).
   * @returns the ids; 0xFFFFFFFF (≥ nVocab) where the sampler found no usable logit in a row
   */
  async sample(logits: Float32Array<ArrayBuffer>, o: RowSampleOptions): Promise<Uint32Array> {
    const V = this.#nVocab;
    const n = logits.length / V;
    if (!Number.isInteger(n) || n < 1) throw new RangeError(`${logits.length} logits are not rows of ${V}`);
    const device = this.#device;
    const stride = padWords(V);
    const rows = await this.#ensure(n);
    for (let j = 0; j < n; j++) device.queue.writeBuffer(rows, 4 * j * stride, logits, j * V, V);
    const first = this.#sels[0]!.sampler!;
    device.queue.writeBuffer(first.params, 0, sampleParamWords(o.sampling, { maskUnused: !!this.#mask }));
    device.queue.writeBuffer(
      first.state,
      0,
      packSampleState(SAMPLE_HIST, { step: o.step, history: o.history.slice(-SAMPLE_HIST) }),
    );
    const read = this.#stagings.take(4 * n);
    const enc = device.createCommandEncoder();
    for (let j = 0; j < n; j++) {
      const sel = this.#sels[j]!;
      if (j > 0) {
        // Row j continues row j - 1's stream: its RNG step and history as the kernel left them.
        const from = this.#sels[j - 1]!.sampler!;
        enc.copyBufferToBuffer(from.params, 0, sel.sampler!.params, 0, from.params.size);
        enc.copyBufferToBuffer(from.state, 0, sel.sampler!.state, 0, from.state.size);
      }
      const pass = enc.beginComputePass();
      encodeOps(pass, sel.stepOps);
      pass.end();
      enc.copyBufferToBuffer(sel.idRing, 0, read, 4 * j, 4);
    }
    device.queue.submit([enc.finish()]);
    return new Uint32Array(await this.#stagings.read(read));
  }

  /** The rows buffer and one selector per row, for `n` rows (grown on demand, kept). */
  async #ensure(n: number): Promise<GPUBuffer> {
    const V = this.#nVocab;
    const device = this.#device;
    if (!this.#rows || this.#rows.size < 4 * n * padWords(V)) {
      // Selectors bind the rows buffer: a bigger one means new selectors (a frame has at most 8 rows to
      // draw from, so this happens about once).
      const size = 4 * Math.max(n, MIN_ROWS) * padWords(V);
      this.#rows = device.createBuffer({ label: "row_sampler.rows", size, usage: STORAGE });
      this.#owned.push(this.#rows);
      this.#sels.length = 0;
    }
    if (!this.#dummy) {
      this.#dummy = device.createBuffer({ label: "row_sampler.next", size: 16, usage: STORAGE });
      this.#owned.push(this.#dummy);
    }
    const sb = {
      device,
      cache: this.#cache,
      owned: this.#owned,
      logits: this.#rows,
      unusedMask: this.#mask,
    };
    while (this.#sels.length < n) {
      this.#sels.push(
        await buildSelector(sb, V, {
          row: this.#sels.length,
          nextToken: this.#dummy,
          S: 1,
          top: 0,
          sampling: true,
        }),
      );
    }
    return this.#rows;
  }
}
