/**
 * Kernel loader and pipeline cache: WGSL sources specialised by prepended typed constants
 * (STYLE.md "Kernels"), compiled once per variant key `name{K=V,...}`.
 * @module
 */
import { WGSL_SOURCES } from "./_sources.ts";

/** WGSL type of a specialisation constant. */
export type ConstType = "u32" | "i32" | "f32" | "bool";

/** Static description of one kernel, owned by its twin `wgsl/<name>.ts`. */
export interface KernelSpec {
  /** File stem of `wgsl/<name>.wgsl`; also the pipeline label prefix. */
  readonly name: string;
  /** Location of the `.wgsl` source. */
  readonly url: URL;
  /** Shared libraries from `wgsl/lib/<lib>.wgsl`, prepended in this order. */
  readonly lib: readonly string[];
  /** Every constant the source uses and never declares, with its WGSL type. */
  readonly constants: Readonly<Record<string, ConstType>>;
  /** Entry point (default `main`). */
  readonly entry?: string;
}

/** Values of a kernel's constants. */
export type ConstValues = Readonly<Record<string, number | boolean>>;

const KERNEL_DIR = new URL("./", import.meta.url);
const LIB_DIR = new URL("./lib/", import.meta.url);
const sourceCache = new Map<string, string>();

/**
 * A source by URL: from the embedded map when the URL names a file of this folder (always so in a bundle or
 * compiled binary, where the twins' `import.meta.url` is the bundle's), else read from disk (test probes).
 */
function readSource(url: URL): string {
  const key = url.href;
  let src = sourceCache.get(key);
  if (src === undefined) {
    const rel = key.startsWith(KERNEL_DIR.href) ? key.slice(KERNEL_DIR.href.length) : undefined;
    src = rel === undefined ? undefined : WGSL_SOURCES[rel];
    if (src === undefined) {
      try {
        src = Deno.readTextFileSync(url);
      } catch (e) {
        throw new Error(
          `Kernel source ${url.href} is not embedded (wgsl/_sources.ts) and cannot be read: ${
            e instanceof Error ? e.message : String(e)
          }: add the file to wgsl/ and run \`deno task gen:wgsl\``,
          { cause: e },
        );
      }
    }
    sourceCache.set(key, src);
  }
  return src;
}

/** The variant key `name{K=V,...}` with sorted keys: pipeline cache key and GPU label. */
export function variantKey(spec: KernelSpec, values: ConstValues): string {
  const keys = Object.keys(values).sort();
  return `${spec.name}{${keys.map((k) => `${k}=${values[k]}`).join(",")}}`;
}

function renderConst(name: string, type: ConstType, v: number | boolean): string {
  switch (type) {
    case "bool":
      if (typeof v !== "boolean") throw new TypeError(`Constant ${name} must be a boolean, got ${v}`);
      return `const ${name}: bool = ${v};`;
    case "u32":
      if (typeof v !== "number" || !Number.isInteger(v) || v < 0 || v > 0xffffffff) {
        throw new RangeError(`Constant ${name} must be a u32, got ${v}`);
      }
      return `const ${name}: u32 = ${v}u;`;
    case "i32":
      if (typeof v !== "number" || !Number.isInteger(v) || v < -(2 ** 31) || v >= 2 ** 31) {
        throw new RangeError(`Constant ${name} must be an i32, got ${v}`);
      }
      return `const ${name}: i32 = ${v}i;`;
    case "f32":
      if (typeof v !== "number" || !Number.isFinite(v)) {
        throw new RangeError(`Constant ${name} must be a finite f32, got ${v}`);
      }
      return `const ${name}: f32 = ${v.toExponential()}f;`;
    default: {
      const never: never = type;
      throw new Error(`Internal error: constant type ${never}`);
    }
  }
}

/**
 * Builds the full WGSL text of a variant: `enable f16;` when asked, constants, libraries, kernel.
 * @throws {RangeError} on a missing, unlisted or ill-typed constant
 */
export function buildSource(spec: KernelSpec, values: ConstValues, opts: { f16?: boolean } = {}): string {
  const lines: string[] = [];
  if (opts.f16) lines.push("enable f16;");
  for (const [name, type] of Object.entries(spec.constants)) {
    const v = values[name];
    if (v === undefined) throw new RangeError(`Kernel ${spec.name}: constant ${name} is missing`);
    lines.push(renderConst(name, type, v));
  }
  for (const name of Object.keys(values)) {
    if (!(name in spec.constants)) {
      throw new RangeError(`Kernel ${spec.name}: constant ${name} is not listed`);
    }
  }
  for (const lib of spec.lib) lines.push(readSource(new URL(`${lib}.wgsl`, LIB_DIR)));
  lines.push(readSource(spec.url));
  return lines.join("\n");
}

/** Compiles and caches compute pipelines per variant key on one device. */
export class PipelineCache {
  static readonly #shared = new WeakMap<GPUDevice, Map<boolean, PipelineCache>>();

  /**
   * The cache every stage on `device` shares (per `f16` setting): a process that loads several stages on one
   * device (a local split chain, tests) compiles each variant once. A compile is tens of ms on a native
   * driver and 0.1-0.5 s on lavapipe, most of a stage's start.
   */
  static shared(device: GPUDevice, opts: { f16?: boolean } = {}): PipelineCache {
    const f16 = opts.f16 ?? false;
    let byF16 = PipelineCache.#shared.get(device);
    if (!byF16) PipelineCache.#shared.set(device, byF16 = new Map());
    let cache = byF16.get(f16);
    if (!cache) byF16.set(f16, cache = new PipelineCache(device, { f16 }));
    return cache;
  }

  readonly #device: GPUDevice;
  readonly #f16: boolean;
  readonly #pipelines = new Map<string, GPUComputePipeline>();

  /**
   * Creates an empty cache for `device`.
   * @param opts.f16 enable `shader-f16` in every module (only when the device has it)
   */
  constructor(device: GPUDevice, opts: { f16?: boolean } = {}) {
    this.#device = device;
    this.#f16 = opts.f16 ?? false;
  }

  /** Variants compiled so far. */
  get size(): number {
    return this.#pipelines.size;
  }

  /** The pipeline of one variant, compiled on first use; WGSL errors throw with the variant key. */
  async get(spec: KernelSpec, values: ConstValues): Promise<GPUComputePipeline> {
    const key = variantKey(spec, values);
    const hit = this.#pipelines.get(key);
    if (hit) return hit;
    const code = buildSource(spec, values, { f16: this.#f16 });
    const module = this.#device.createShaderModule({ label: key, code });
    const info = await module.getCompilationInfo();
    const errors = info.messages.filter((m) => m.type === "error");
    if (errors.length > 0) {
      const text = errors.map((m) => `  line ${m.lineNum}:${m.linePos}: ${m.message}`).join("\n");
      throw new Error(`Internal error: WGSL of ${key} does not compile:\n${text}`);
    }
    this.#device.pushErrorScope("validation");
    const pipeline = this.#device.createComputePipeline({
      label: key,
      layout: "auto",
      compute: { module, entryPoint: spec.entry ?? "main" },
    });
    const err = await this.#device.popErrorScope();
    if (err) throw new Error(`Internal error: pipeline ${key} is invalid: ${err.message}`);
    this.#pipelines.set(key, pipeline);
    return pipeline;
  }
}

/** A buffer binding: a whole buffer, or a byte range of one. */
export type Binding = GPUBuffer | { buffer: GPUBuffer; offset?: number; size?: number };

/**
 * Bind groups by pipeline and bindings, for {@linkcode withBindGroups}: a stage's graphs of one chunk width on
 * different slots (or of one slot's step and chunk) bind mostly the same buffers, and creating a bind group is
 * most of the cost of building a graph (the native side: about 35 µs per dispatch on this project's CI
 * machine), which a request pays on the first run of each slot and width.
 */
export interface BindGroupCache {
  get(key: string): GPUBindGroup | undefined;
  set(key: string, group: GPUBindGroup): unknown;
  /** The bindings of the latest group {@linkcode bindGroup} returned under this cache (set by it). */
  last?: readonly Binding[];
}

const LAYOUTS = new WeakMap<GPUComputePipeline, { id: number; layout: GPUBindGroupLayout }>();
const BUFFER_IDS = new WeakMap<GPUBuffer, number>();
let nextId = 0;
let activeCache: BindGroupCache | undefined;

/** Runs `f` with {@linkcode bindGroup} reusing the groups of `cache` (and filling it). */
export function withBindGroups<T>(cache: BindGroupCache, f: () => T): T {
  const prev = activeCache;
  activeCache = cache;
  try {
    return f();
  } finally {
    activeCache = prev;
  }
}

/** Bind group 0 of `pipeline` with binding i = `bindings[i]` (from the active cache when one has it). */
export function bindGroup(
  device: GPUDevice,
  pipeline: GPUComputePipeline,
  bindings: readonly Binding[],
): GPUBindGroup {
  let pl = LAYOUTS.get(pipeline);
  if (!pl) LAYOUTS.set(pipeline, pl = { id: nextId++, layout: pipeline.getBindGroupLayout(0) });
  const cache = activeCache;
  let key = "";
  if (cache) {
    cache.last = bindings;
    key = `${pl.id}`;
    for (const b of bindings) {
      const buf = b instanceof GPUBuffer ? b : b.buffer;
      let id = BUFFER_IDS.get(buf);
      if (id === undefined) BUFFER_IDS.set(buf, id = nextId++);
      key += b instanceof GPUBuffer ? `|${id}` : `|${id}:${b.offset ?? 0}:${b.size ?? "-"}`;
    }
    const hit = cache.get(key);
    if (hit) return hit;
  }
  const group = device.createBindGroup({
    layout: pl.layout,
    entries: bindings.map((b, i) => ({
      binding: i,
      resource: b instanceof GPUBuffer ? { buffer: b } : b,
    })),
  });
  cache?.set(key, group);
  return group;
}
