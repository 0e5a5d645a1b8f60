/**
 * Probe: how fast can WGSL turn IQ4_XS indices into int8 dot products, with no memory traffic at all? Each
 * invocation decodes pseudo-random qs words (one multiply-add per word makes the next) through a workgroup
 * table and sums the packed products with `dot4I8Packed`, the inner work of matvec_q8's IQ4_XS path. The
 * rate in weights per second bounds any mat-vec built on that decode: the streaming ceiling at 70% needs
 * 0.7·ceiling/(136/256 B) weights per second (`--ceiling-gbs`, default 4300: the H200's `stream_read` on the
 * tall shapes).
 *
 * Schemes (per qs word = 8 weights):
 * - `none`: the nibbles masked out as they are (no codebook; the floor of the decode's cost);
 * - `pair`: matvec_q8's 256-entry byte-pair table, 4 lookups and 2 multiply-adds;
 * - `pair_c16`, `pair_c32`: the same with 16 or 32 interleaved copies (lane l reads copy l % C);
 * - `nibble`: one 16-entry table per byte position (values pre-shifted), 8 lookups, no multiply-adds;
 * - `triple`: a 4096-entry table of 12-bit indices (3 weights each, 16 KiB), 8 lookups per 3 words.
 *
 * Usage: `deno run -A bench/lookup_probe.ts [--iters 2048] [--ceiling-gbs 4300]`. One JSON line per scheme,
 * never asserts. No npm imports: it runs on the lent GPU machine with nothing but Deno.
 * @module
 */
import { parseArgs } from "node:util";
import { acquireGpu } from "../engine/gpu/device.ts";
import { PROBE_THREADS, timeProbes } from "./_probe.ts";

const { values: args } = parseArgs({
  options: {
    iters: { type: "string", default: "2048" },
    "ceiling-gbs": { type: "string", default: "4300" },
  },
});
const ITERS = Number(args.iters);
const CEILING_GBS = Number(args["ceiling-gbs"]);

interface Scheme {
  /** Workgroup table words. */
  words: number;
  /** WGSL: the table's word i from its index (a pseudo-codebook: any value times alike). */
  fill: string;
  /** WGSL body: adds the dot products of the 3 qs words w0..w2 (24 weights) against xa..xf to `s`. */
  body: string;
}

const PAIR = (copies: number): Scheme => ({
  words: 256 * copies,
  fill: "(i * 0x2F0047u) & 0x00FF00FFu",
  body: [0, 1, 2].map((k) => {
    const at = (e: string) => copies === 1 ? `tab[${e}]` : `tab[(${e}) * ${copies}u + cp]`;
    return `
    {
      let w = w${k};
      let t0 = ${at("w & 0xFFu")};
      let t1 = ${at("(w >> 8u) & 0xFFu")};
      let t2 = ${at("(w >> 16u) & 0xFFu")};
      let t3 = ${at("w >> 24u")};
      s += dot4I8Packed(t0 + t1 * 256u, x${k}a) + dot4I8Packed(t2 + t3 * 256u, x${k}b);
    }`;
  }).join(""),
});

const SCHEMES: Record<string, Scheme> = {
  none: {
    words: 1,
    fill: "0u",
    body: [0, 1, 2].map((k) => `
    s += dot4I8Packed(w${k} & 0x0F0F0F0Fu, x${k}a) + dot4I8Packed((w${k} >> 4u) & 0x0F0F0F0Fu, x${k}b);`)
      .join(""),
  },
  pair: PAIR(1),
  pair_c16: PAIR(16),
  pair_c32: PAIR(32),
  nibble: {
    // Table p (byte position p of the packed word) at 16·p: the value in byte p.
    words: 64,
    fill: "((i * 37u) & 0xFFu) << (8u * (i >> 4u))",
    body: [0, 1, 2].map((k) => `
    {
      let w = w${k};
      let lo = tab[w & 15u] | tab[16u + ((w >> 8u) & 15u)] | tab[32u + ((w >> 16u) & 15u)] |
        tab[48u + ((w >> 24u) & 15u)];
      let hi = tab[(w >> 4u) & 15u] | tab[16u + ((w >> 12u) & 15u)] | tab[32u + ((w >> 20u) & 15u)] |
        tab[48u + (w >> 28u)];
      s += dot4I8Packed(lo, x${k}a) + dot4I8Packed(hi, x${k}b);
    }`).join(""),
  },
  triple: {
    words: 4096,
    fill: "(i * 0x10203u) & 0x00FFFFFFu",
    // 96 bits = 8 indices of 12 bits (3 weights each, byte 3 zero).
    body: `
    s += dot4I8Packed(tab[w0 & 0xFFFu], x0a) + dot4I8Packed(tab[(w0 >> 12u) & 0xFFFu], x0b) +
      dot4I8Packed(tab[(w0 >> 24u) | ((w1 & 0xFu) << 8u)], x1a) + dot4I8Packed(tab[(w1 >> 4u) & 0xFFFu], x1b) +
      dot4I8Packed(tab[(w1 >> 16u) & 0xFFFu], x2a) + dot4I8Packed(tab[(w1 >> 28u) | ((w2 & 0xFFu) << 4u)], x2b) +
      dot4I8Packed(tab[(w2 >> 8u) & 0xFFFu], x0a ^ 1u) + dot4I8Packed(tab[w2 >> 20u], x0b ^ 1u);`,
  },
};

function source(s: Scheme): string {
  return `
@group(0) @binding(0) var<storage, read_write> out: array<u32>;
var<workgroup> tab: array<u32, ${s.words}>;
@compute @workgroup_size(256)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
  for (var i = lid; i < ${s.words}u; i += 256u) {
    tab[i] = ${s.fill};
  }
  workgroupBarrier();
  let cp = lid % 32u;
  let x0a = gid.x * 0x01010101u;
  let x0b = x0a ^ 0x5A5A5A5Au;
  let x1a = x0a + 0x11u;
  let x1b = x0b + 0x22u;
  let x2a = x0a ^ 0x33u;
  let x2b = x0b ^ 0x44u;
  var w0 = gid.x * 0x9E3779B9u;
  var w1 = w0 ^ 0x85EBCA6Bu;
  var w2 = w0 ^ 0xC2B2AE35u;
  var s = 0;
  for (var it = 0u; it < ${ITERS}u; it++) {
    ${s.body}
    w0 = w0 * 1664525u + 1013904223u;
    w1 = w1 * 1664525u + 1013904223u;
    w2 = w2 * 1664525u + 1013904223u;
  }
  out[gid.x] = bitcast<u32>(s);
}
`;
}

const gpu = await acquireGpu();
const { device } = gpu;
const line = (o: Record<string, unknown>) => console.log(JSON.stringify({ bench: "lookup_probe", ...o }));
line({ event: "start", summary: gpu.summary, iters: ITERS, ceilingGBs: CEILING_GBS });
const threads = PROBE_THREADS;
const best = await timeProbes(
  device,
  gpu.timestamps,
  Object.fromEntries(Object.entries(SCHEMES).map(([name, sc]) => [name, source(sc)])),
);
// Weights per second that 70% of the ceiling asks of IQ4_XS (136 bytes per 256 weights).
const needed = 0.7 * CEILING_GBS * 1e9 / (136 / 256);
for (const [name, t] of best) {
  const weights = threads * ITERS * 24;
  const rate = weights / t;
  line({ scheme: name, ms: t * 1e3, gWeightsPerSecond: rate / 1e9, vsNeededAt70: rate / needed });
}
device.destroy();
