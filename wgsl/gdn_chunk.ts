/**
 * Host twin of the chunked gated DeltaNet prefill (spec qwen3next.md §8.6): `gdn_chunk_prep.wgsl` (conv, norms,
 * gates and the state-independent WY factors of every 64-token block, in parallel), `gdn_chunk.wgsl` (the scan
 * over the blocks, parallel over heads and state columns) and `gdn_chunk_norm.wgsl` (the gated RMSNorm, §8.7).
 * The three dispatches take the bindings of `gdn_step` plus two scratch buffers and compute the same y, state
 * and (with `gdn_conv_ring` after them) conv ring, up to f32 rounding: a drop-in for `gdn_step` when n > 1.
 *
 * A cut (params word 2, {@linkcode packGdnChunkParams}): with 0 < cut < n the dispatch runs its tokens as two
 * runs [0, cut) and [cut, n), each in 64-token blocks from its own start, and the scan copies the state after
 * token cut − 1 to a `tap` binding; y, state and tap are then bit for bit those of a dispatch of the first cut
 * tokens followed by one of the rest (the tap: the state between them). `gdn_conv_ring_tap` gives the conv
 * ring at the same point. A prompt-boundary snapshot at pos0 + cut without splitting the prefill in two.
 * @module
 */
import { bindGroup, type Binding, type KernelSpec, type PipelineCache } from "./kernel.ts";
import {
  bindingBytes,
  checkGdnStep,
  GDN_STEP,
  gdnDims,
  type GdnStepBindings,
  type GdnStepConstants,
} from "./gdn_step.ts";

/** Tokens per block of the chunked form (spec §8.6 chunk size); the kernels hard-wire it. */
export const GDN_CHUNK_TOKENS = 64;

/**
 * Words of the chunked prefill's params binding: u32 ne=[3] [pos0, n, cut] (`gdn_step`'s two words and the
 * cut; `gdn_chunk_norm` reads only n, `gdn_conv_ring` pos0 and n).
 */
export const GDN_CHUNK_PARAMS_WORDS = 3;

/**
 * Packs the chunked prefill's params: [pos0, nTokens, cut]. `cut` 0 (the default) is no cut; 0 < cut < nTokens
 * splits the dispatch's blocks at token `cut` and has the scan write the state there to its `tap` binding.
 * @throws {RangeError} on a position that is not a u32, a token count below 1, or a cut outside 0..nTokens-1 (a
 *   cut at nTokens is the dispatch's end: its final state is that snapshot)
 */
export function packGdnChunkParams(pos0: number, nTokens: number, cut = 0): Uint32Array<ArrayBuffer> {
  if (!Number.isInteger(pos0) || pos0 < 0 || pos0 > 0xffffffff) {
    throw new RangeError(`gdn_chunk: position must be a u32, got ${pos0}`);
  }
  if (!Number.isInteger(nTokens) || nTokens < 1) {
    throw new RangeError(`gdn_chunk: token count must be a positive integer, got ${nTokens}`);
  }
  if (!Number.isInteger(cut) || cut < 0 || cut >= nTokens) {
    const last = nTokens - 1;
    const why = cut === nTokens ? ": a cut at the end is the dispatch's final state, no tap needed" : "";
    throw new RangeError(
      `gdn_chunk: cut must be an integer in 0..${last} (0: no cut) for ${nTokens} token(s), got ${cut}${why}`,
    );
  }
  return Uint32Array.of(pos0, nTokens, cut);
}

/**
 * The token ranges [start, end) of the blocks of a dispatch of `nTokens` tokens cut at `cut` (0: no cut), in
 * block order: what the kernels compute on the GPU, for tests and tools.
 */
export function gdnChunkBlocks(nTokens: number, cut = 0): Array<[number, number]> {
  const T = GDN_CHUNK_TOKENS;
  const c1 = cut > 0 && cut < nTokens ? cut : nTokens;
  const out: Array<[number, number]> = [];
  for (let s = 0; s < c1; s += T) out.push([s, Math.min(s + T, c1)]);
  for (let s = c1; s < nTokens; s += T) out.push([s, Math.min(s + T, nTokens)]);
  return out;
}

/**
 * Constants of the chunked prefill: the same as `gdn_step`'s, same limits, and K_CONV <= 4 (each kernel takes its
 * subset).
 */
export type GdnChunkConstants = GdnStepConstants;

/**
 * Kernel spec of `gdn_chunk_prep` (constants: all of {@linkcode GdnChunkConstants}, and `COMPACT_SOLVE`: its
 * forward substitution as loops, see {@linkcode gdnCompactSolve}).
 */
export const GDN_CHUNK_PREP: KernelSpec = {
  name: "gdn_chunk_prep",
  url: new URL("./gdn_chunk_prep.wgsl", import.meta.url),
  lib: ["gdn"],
  constants: { ...GDN_STEP.constants, COMPACT_SOLVE: "bool" },
};

/**
 * Whether the prep's forward substitution should run as loops (`COMPACT_SOLVE`) on this adapter: on CPU
 * adapters (lavapipe), where LLVM takes about 30 s to compile the written-out form at its first dispatch and
 * under 2 s the loops (docs/PERF.md). GPUs keep the written-out form, whose 16 row blocks stay in registers.
 * Both forms sum in the same order.
 */
export function gdnCompactSolve(info: Pick<GPUAdapterInfo, "isFallbackAdapter"> | undefined): boolean {
  return info?.isFallbackAdapter === true;
}

/** The prep's constants: `c` and COMPACT_SOLVE (default false), for its dispatch and its pipeline alike. */
function prepConstants(c: GdnChunkConstants, compactSolve = false): Record<string, number | boolean> {
  return { ...c, COMPACT_SOLVE: compactSolve };
}

/** Kernel spec of `gdn_chunk`, the scan (constants N_V, D_K, D_V and the {@linkcode GdnChunkScan} BJ, CJ). */
export const GDN_CHUNK: KernelSpec = {
  name: "gdn_chunk",
  url: new URL("./gdn_chunk.wgsl", import.meta.url),
  lib: [],
  constants: { N_V: "u32", D_K: "u32", D_V: "u32", BJ: "u32", CJ: "u32" },
};

/**
 * Workgroup shape of the scan: `BJ` state columns per workgroup (8, 16 or 32; grid N_V × D_V/BJ), `CJ` of them
 * per invocation (1 or 2; workgroup size 16·BJ/CJ).
 */
export interface GdnChunkScan {
  /** State columns per workgroup: 8, 16 or 32, dividing D_V. */
  readonly BJ: number;
  /** Columns per invocation: 1 or 2. */
  readonly CJ: number;
}

/**
 * The scan shape the engine asks for (bench/gdn_chunk.ts --scan times the others at real dims: on the H200
 * 16 columns per workgroup, 2 per invocation was the fastest shape at 512 and 2,048 tokens, docs/PERF.md);
 * {@linkcode gdnChunkScan} narrows it to what the dims allow.
 */
export const GDN_CHUNK_SCAN: GdnChunkScan = { BJ: 16, CJ: 2 };

/** Workgroup storage bound every adapter here meets (lavapipe's maxComputeWorkgroupStorageSize). */
const SCAN_STORAGE_MAX = 32768;

/** Workgroup storage bytes of the scan: st, vp, eg and dk (gdn_chunk.wgsl header). */
export function gdnChunkScanStorage(c: Pick<GdnChunkConstants, "D_K">, s: GdnChunkScan): number {
  return s.BJ * (16 * (c.D_K / 4 + 1) + 256) + 512;
}

/**
 * The scan shape for `c`: `want` (default {@linkcode GDN_CHUNK_SCAN}) with BJ halved (CJ kept while BJ/CJ >= 4)
 * until BJ divides D_V and the workgroup storage fits 32 KiB.
 * @throws {RangeError} on a `want` outside BJ ∈ {8, 16, 32}, CJ ∈ {1, 2}
 */
export function gdnChunkScan(
  c: Pick<GdnChunkConstants, "D_K" | "D_V">,
  want: GdnChunkScan = GDN_CHUNK_SCAN,
): GdnChunkScan {
  if (![8, 16, 32].includes(want.BJ) || ![1, 2].includes(want.CJ)) {
    throw new RangeError(
      `gdn_chunk: scan shape BJ=${want.BJ} CJ=${want.CJ} is not supported: BJ must be 8, 16 or 32, CJ 1 or 2`,
    );
  }
  let s = want;
  while (s.BJ > 8 && (c.D_V % s.BJ !== 0 || gdnChunkScanStorage(c, s) > SCAN_STORAGE_MAX)) {
    s = { BJ: s.BJ / 2, CJ: s.CJ };
  }
  return s;
}

/** Kernel spec of `gdn_chunk_norm`, the gated RMSNorm in place (constants from {@linkcode gdnNormConstants}). */
export const GDN_CHUNK_NORM: KernelSpec = {
  name: "gdn_chunk_norm",
  url: new URL("./gdn_chunk_norm.wgsl", import.meta.url),
  lib: ["rms", "q8pack"],
  constants: { N_V: "u32", D_V: "u32", Z_COL: "u32", EPS: "f32", QX: "bool", LAYOUT: "u32" },
};

/**
 * Constants of `gdn_chunk_norm` for a layer's `c`: z's tokens (or a batched step's columns) `zCol` words apart,
 * default N_V·D_V (back to back; a fused in-projection's column stride otherwise). `qx`: also round the output
 * to int8 into the `xq` binding, in the byte order `layout` (`q8Layout` of the output projection's weights).
 * @throws {RangeError} when zCol is shorter than one token's z, or QX with D_V not a multiple of 32
 */
export function gdnNormConstants(
  c: { readonly N_V: number; readonly D_V: number; readonly EPS: number },
  zCol = c.N_V * c.D_V,
  qx?: { readonly layout: number },
): { N_V: number; D_V: number; Z_COL: number; EPS: number; QX: boolean; LAYOUT: number } {
  if (!Number.isInteger(zCol) || zCol < c.N_V * c.D_V) {
    throw new RangeError(
      `gdn_chunk_norm: Z_COL=${zCol} is shorter than one token's z (N_V·D_V = ${c.N_V * c.D_V})`,
    );
  }
  if (qx && c.D_V % 32 !== 0) {
    throw new RangeError(`gdn_chunk_norm: QX rounds whole 32-element chunks of a head, but D_V=${c.D_V}`);
  }
  return { N_V: c.N_V, D_V: c.D_V, Z_COL: zCol, EPS: c.EPS, QX: qx !== undefined, LAYOUT: qx?.layout ?? 0 };
}

/** Binding order of `gdn_chunk_prep` (binding i = entry i); `wsQkw`, `wsUp` are the scratch. */
export const GDN_CHUNK_PREP_BINDINGS = [
  "params",
  "xQkv",
  "b",
  "a",
  "convW",
  "dtBias",
  "ssmA",
  "convRing",
  "wsQkw",
  "wsUp",
] as const;

/**
 * Binding order of `gdn_chunk` (the scan); `tap`: the state after the cut (see {@linkcode gdnChunkDispatches}
 * for what it takes without one).
 */
export const GDN_CHUNK_BINDINGS = ["params", "wsQkw", "wsUp", "state", "y", "tap"] as const;

/** Binding order of `gdn_chunk_norm`. */
export const GDN_CHUNK_NORM_BINDINGS = ["params", "z", "normW", "y", "xq"] as const;

/** The two scratch buffers of the chunked prefill; sizes from {@linkcode gdnChunkScratchBytes}. */
export interface GdnChunkScratch {
  /** Per (block, head): Q, K, W, each ne=[D_K, 64] f32. */
  readonly wsQkw: Binding;
  /** Per (block, head): U ne=[D_V, 64], P ne=[64, 64], G ne=[64], f32. */
  readonly wsUp: Binding;
}

/**
 * Scratch bytes of the chunked prefill for dispatches of up to `maxTokens` tokens, cut or not: NB =
 * ceil(maxTokens/64) + 1 blocks per head (a cut can add one block: two runs, each with a short last block).
 */
export interface GdnChunkScratchBytes {
  /** Bytes of {@linkcode GdnChunkScratch.wsQkw}: 4·3·64·D_K·N_V·NB. */
  readonly wsQkw: number;
  /** Bytes of {@linkcode GdnChunkScratch.wsUp}: 4·(64·D_V + 64·64 + 64)·N_V·NB. */
  readonly wsUp: number;
}

/**
 * Scratch sizes for dispatches of up to `maxTokens` tokens with or without a cut, ceil(maxTokens/64) + 1
 * blocks per head (the caller allocates them, STORAGE usage; one pair can serve every layer, the dispatches of
 * one layer finish reading them before the next layer's prep).
 * @throws {RangeError} on a token count below 1
 */
export function gdnChunkScratchBytes(c: GdnChunkConstants, maxTokens: number): GdnChunkScratchBytes {
  if (!Number.isInteger(maxTokens) || maxTokens < 1) {
    throw new RangeError(`gdn_chunk: maxTokens must be a positive integer, got ${maxTokens}`);
  }
  const T = GDN_CHUNK_TOKENS;
  const blocks = gdnChunkMaxBlocks(maxTokens) * c.N_V;
  return {
    wsQkw: 4 * 3 * T * c.D_K * blocks,
    wsUp: 4 * (T * c.D_V + T * T + T) * blocks,
  };
}

/**
 * Blocks per head for dispatches of up to `maxTokens` tokens, cut or not (the prep's grid):
 * ceil(maxTokens/64) + 1.
 */
export function gdnChunkMaxBlocks(maxTokens: number): number {
  return Math.ceil(maxTokens / GDN_CHUNK_TOKENS) + 1;
}

/**
 * Checks constants, the `gdn_step` bindings (params: {@linkcode GDN_CHUNK_PARAMS_WORDS} words), the scratch
 * sizes for dispatches of up to `maxTokens` tokens and, when given, the state-sized `tap`.
 * @throws {RangeError} naming the constant or binding, what it has and what it needs
 */
export function checkGdnChunk(
  c: GdnChunkConstants,
  opts: { bindings: GdnStepBindings; scratch: GdnChunkScratch; maxTokens: number; tap?: Binding },
): void {
  if (c.K_CONV > 4) {
    throw new RangeError(
      `gdn_chunk: K_CONV=${c.K_CONV} exceeds 4 (gdn_chunk_prep keeps each channel's taps and window in one ` +
        `vec4): this model's ssm.conv_kernel is not supported`,
    );
  }
  checkGdnStep(c, opts);
  const params = bindingBytes(opts.bindings.params);
  if (params < 4 * GDN_CHUNK_PARAMS_WORDS) {
    throw new RangeError(
      `gdn_chunk binding params has ${params} bytes but needs ${4 * GDN_CHUNK_PARAMS_WORDS} ` +
        `(u32 ne=[3]: [pos0, n, cut], cut 0 for none): pack it with packGdnChunkParams`,
    );
  }
  if (opts.tap !== undefined) {
    const need = 4 * gdnDims(c).state;
    const got = bindingBytes(opts.tap);
    if (got < need) {
      throw new RangeError(
        `gdn_chunk binding tap has ${got} bytes but needs ${need} (the state after the cut, ne=[${c.D_K}, ` +
          `${c.D_V}, ${c.N_V}] f32 as the state binding)`,
      );
    }
    const scan = { ...opts.bindings, ...opts.scratch };
    for (const name of GDN_CHUNK_BINDINGS.filter((k) => k !== "tap")) {
      if (bindingsOverlap(opts.tap, scan[name])) {
        throw new RangeError(
          `gdn_chunk binding tap overlaps the scan's binding ${name}: the tap is written, give it its own bytes`,
        );
      }
    }
  }
  if (opts.maxTokens > 65535) {
    throw new RangeError(`gdn_chunk: maxTokens=${opts.maxTokens} exceeds 65535 (norm grid): split the chunk`);
  }
  const need = gdnChunkScratchBytes(c, opts.maxTokens);
  for (const name of ["wsQkw", "wsUp"] as const) {
    const got = bindingBytes(opts.scratch[name]);
    if (got < need[name]) {
      throw new RangeError(
        `gdn_chunk scratch ${name} has ${got} bytes but needs ${
          need[name]
        } for ${opts.maxTokens} token(s): ` +
          `size it with gdnChunkScratchBytes`,
      );
    }
  }
}

/** Whether two bindings share bytes of one buffer (a written binding must share none with another). */
export function bindingsOverlap(a: Binding, b: Binding): boolean {
  const buf = (x: Binding) => x instanceof GPUBuffer ? x : x.buffer;
  if (buf(a) !== buf(b)) return false;
  const start = (x: Binding) => x instanceof GPUBuffer ? 0 : x.offset ?? 0;
  return start(a) < start(b) + bindingBytes(b) && start(b) < start(a) + bindingBytes(a);
}

/** One dispatch of the chunked prefill: kernel, its constants, bindings in binding order, grid. */
export interface GdnChunkDispatch {
  /** The kernel. */
  readonly spec: KernelSpec;
  /** Its constants (the subset of {@linkcode GdnChunkConstants} it lists). */
  readonly constants: Readonly<Record<string, number | boolean>>;
  /** Bindings, binding i = entry i. */
  readonly bindings: readonly Binding[];
  /** Workgroup grid. */
  readonly grid: readonly [number, number, number];
}

/**
 * The three dispatches of one chunked prefill, in recording order: prep, scan, norm (for an engine that
 * records dispatches itself; {@linkcode encodeGdnChunk} records them into a pass). Record `gdn_conv_ring`
 * after them, as after `gdn_step` (and, for a cut, `gdn_conv_ring_tap` before that). The position, token
 * count and cut come from the params buffer (GPU-side, {@linkcode packGdnChunkParams}); the grids are sized
 * for `maxTokens`.
 *
 * `tap`: the scan's binding 5, written with the state after the cut when params hold one (state-sized, not
 * aliasing another binding). Without it the scan's tap takes `bindings.z`, which the scan does not otherwise
 * bind (as the norm's xq takes a scratch buffer) and never writes without a cut: params with a cut need a
 * `tap`, or the scan overwrites z before the norm reads it.
 * @throws {RangeError} from {@linkcode checkGdnChunk}
 */
export function gdnChunkDispatches(
  c: GdnChunkConstants,
  opts: {
    bindings: GdnStepBindings;
    scratch: GdnChunkScratch;
    maxTokens: number;
    scan?: GdnChunkScan;
    tap?: Binding;
    /** The prep's COMPACT_SOLVE ({@linkcode gdnCompactSolve}; default false). */
    compactSolve?: boolean;
  },
): GdnChunkDispatch[] {
  checkGdnChunk(c, opts);
  // The norm's xq binding (QX only; prefill does not round here) takes a scratch buffer it does not touch;
  // the scan's tap without a cut takes z (bound only in the norm).
  const all = { ...opts.bindings, ...opts.scratch, xq: opts.scratch.wsQkw, tap: opts.tap ?? opts.bindings.z };
  const blocks = gdnChunkMaxBlocks(opts.maxTokens);
  const s = gdnChunkScan(c, opts.scan);
  return [
    {
      spec: GDN_CHUNK_PREP,
      constants: prepConstants(c, opts.compactSolve),
      bindings: GDN_CHUNK_PREP_BINDINGS.map((k) => all[k]),
      grid: [c.N_V, blocks, 1],
    },
    {
      spec: GDN_CHUNK,
      constants: scanConstants(c, s),
      bindings: GDN_CHUNK_BINDINGS.map((k) => all[k]),
      grid: [c.N_V, c.D_V / s.BJ, 1],
    },
    {
      spec: GDN_CHUNK_NORM,
      constants: gdnNormConstants(c),
      bindings: GDN_CHUNK_NORM_BINDINGS.map((k) => all[k]),
      grid: [c.N_V, opts.maxTokens, 1],
    },
  ];
}

/** Constants of the scan `gdn_chunk` for `c` and shape `s` (as {@linkcode gdnChunkScan} returns it). */
export function scanConstants(c: GdnChunkConstants, s: GdnChunkScan): Record<string, number> {
  return { N_V: c.N_V, D_K: c.D_K, D_V: c.D_V, BJ: s.BJ, CJ: s.CJ };
}

/** Compiled pipelines of the chunked prefill, in dispatch order. */
export type GdnChunkPipelines = readonly [GPUComputePipeline, GPUComputePipeline, GPUComputePipeline];

/** Compiles (or takes from `cache`) the three pipelines of the chunked prefill for `c`. */
export async function prepareGdnChunk(
  cache: PipelineCache,
  c: GdnChunkConstants,
  opts: { scan?: GdnChunkScan; compactSolve?: boolean } = {},
): Promise<GdnChunkPipelines> {
  return [
    await cache.get(GDN_CHUNK_PREP, prepConstants(c, opts.compactSolve)),
    await cache.get(GDN_CHUNK, scanConstants(c, gdnChunkScan(c, opts.scan))),
    await cache.get(GDN_CHUNK_NORM, gdnNormConstants(c)),
  ];
}

/**
 * Records the chunked prefill (three dispatches) into a caller-supplied compute pass: the drop-in for
 * `encodeGdnStep` when n > 1, with the same bindings (params of {@linkcode GDN_CHUNK_PARAMS_WORDS} words) plus
 * the scratch. Record `encodeGdnConvRing` right after it in the same pass, as after `gdn_step` (for a cut, its
 * tap dispatch before that). A dispatch of n = 1 is correct too, but `gdn_step` is the faster
 * decode.
 * @throws {RangeError} from {@linkcode checkGdnChunk}, before anything is recorded
 */
export function encodeGdnChunk(
  pass: GPUComputePassEncoder,
  opts: {
    device: GPUDevice;
    pipelines: GdnChunkPipelines;
    constants: GdnChunkConstants;
    bindings: GdnStepBindings;
    scratch: GdnChunkScratch;
    maxTokens: number;
    /** The scan shape the pipelines were prepared with (default {@linkcode GDN_CHUNK_SCAN}). */
    scan?: GdnChunkScan;
    /** The state after the cut in params, as in {@linkcode gdnChunkDispatches}. */
    tap?: Binding;
  },
): void {
  const dispatches = gdnChunkDispatches(opts.constants, opts);
  const groups = dispatches.map((d, i) => bindGroup(opts.device, opts.pipelines[i]!, d.bindings));
  dispatches.forEach((d, i) => {
    pass.setPipeline(opts.pipelines[i]!);
    pass.setBindGroup(0, groups[i]!);
    pass.dispatchWorkgroups(...d.grid);
  });
}
