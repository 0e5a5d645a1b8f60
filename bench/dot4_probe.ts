/**
 * Probe: does `dot4I8Packed` compile to the GPU's packed 8-bit dot instruction (DP4A) on this stack, or to
 * naga's polyfill (unpack, four multiplies, adds)? Times an issue-bound loop of eight independent dot products
 * per step three ways: `dot4I8Packed`, the polyfill written out by hand, and one integer multiply-add in place
 * of each dot (the cost of one instruction). A native instruction times like the multiply-add; the polyfill
 * like the hand-written unpacking. Also prints the adapter's features and WGSL language features.
 *
 * Usage: `deno run -A bench/dot4_probe.ts [--iters 4096]`. One JSON line per kernel, never asserts. No npm
 * imports: it runs on the lent GPU machine with nothing but Deno.
 * @module
 */
import { parseArgs } from "node:util";
import { acquireGpu } from "../engine/gpu/device.ts";
import { PROBE_THREADS, timeProbes } from "./_probe.ts";

const { values: args } = parseArgs({ options: { iters: { type: "string", default: "4096" } } });
const ITERS = Number(args.iters);

const OPS: Record<string, string> = {
  dot4I8Packed: "dot4I8Packed(x, y)",
  polyfill: "dot(bitcast<vec4<i32>>(vec4<u32>(x) << SH) >> vec4<u32>(24u), " +
    "bitcast<vec4<i32>>(vec4<u32>(y) << SH) >> vec4<u32>(24u))",
  imad: "bitcast<i32>(x * y)",
};

function source(op: string): string {
  return `
const SH = vec4<u32>(24u, 16u, 8u, 0u);
@group(0) @binding(0) var<storage, read_write> out: array<u32>;
fn op(x: u32, y: u32) -> i32 { return ${op}; }
@compute @workgroup_size(256)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
  var a = gid.x * 0x9E3779B9u;
  let b = gid.x ^ 0x85EBCA6Bu;
  var s = vec4<i32>(0);
  var t = vec4<i32>(0);
  for (var i = 0u; i < ${ITERS}u; i++) {
    s += vec4<i32>(op(a, b), op(a ^ 1u, b), op(a ^ 2u, b), op(a ^ 3u, b));
    t += vec4<i32>(op(a ^ 4u, b), op(a ^ 5u, b), op(a ^ 6u, b), op(a ^ 7u, b));
    a = a * 1664525u + 1013904223u;
  }
  let r = s + t;
  out[gid.x] = bitcast<u32>(r.x + r.y + r.z + r.w);
}
`;
}

const gpu = await acquireGpu();
const { device, adapter } = gpu;
const line = (o: Record<string, unknown>) => console.log(JSON.stringify({ bench: "dot4_probe", ...o }));
line({
  event: "start",
  summary: gpu.summary,
  features: [...adapter.features].sort(),
  wgslLanguageFeatures: [
    ...((navigator.gpu as unknown as { wgslLanguageFeatures?: Set<string> })
      .wgslLanguageFeatures ?? []),
  ].sort(),
});
const threads = PROBE_THREADS;
const best = await timeProbes(
  device,
  gpu.timestamps,
  Object.fromEntries(Object.entries(OPS).map(([name, op]) => [name, source(op)])),
);
for (const [name, t] of best) {
  const dots = threads * ITERS * 8;
  line({ kernel: name, ms: t * 1e3, gDotsPerSecond: dots / t / 1e9, vsImad: t / best.get("imad")! });
}
device.destroy();
