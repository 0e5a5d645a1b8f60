/**
 * Prefill chunk widths that between them use every kernel variant a chunk of 9..maxChunk tokens can: the
 * variants change only where a chunk's tiles or splits change (the matmul's tile at multiples of 128 tokens,
 * the grouped experts' token tile and the attention's key splits at powers of two), so a graph of each width
 * class, built at warm-up, compiles them all before the first request rather than inside some request's time
 * to first token (or inside the gap of the streams it interleaves with: a prompt piece of an unusual width).
 * @module
 */
import { MATVEC_MAX_COLS } from "../graph/builder.ts";

/** The widths: 9 (the narrowest chunk past the mat-vec's columns), powers of two and one past them from 16,
 * one past each multiple of 128, and `maxChunk`; ascending, at most `maxChunk`. */
export function prefillWidthClasses(maxChunk: number, columns: number = MATVEC_MAX_COLS): number[] {
  const w = new Set<number>();
  const add = (n: number) => {
    if (n > columns && n <= maxChunk) w.add(n);
  };
  add(columns + 1);
  for (let p = 16; p <= maxChunk; p *= 2) [p, p + 1].forEach(add);
  for (let m = 128; m < maxChunk; m += 128) add(m + 1);
  add(maxChunk);
  return [...w].sort((a, b) => a - b);
}

/**
 * Builds `stage`'s graph of each of {@linkcode prefillWidthClasses} on `slot` and of every width 2..8 (the
 * column path's variants, one per width: prompt rests after the snapshot point, drafted frames, a split
 * chain's batched frames; built with every row returned, which compiles what fewer rows need too), up to the
 * widest chunk its context holds (a chunk wider than the context never runs, and its graph would grow the
 * shared scratch for nothing). CPU work and pipeline compiles, no GPU run: a stage's graphs share their bind
 * groups and scratch, so these cost little memory. Returns the widths built.
 */
export async function buildWidthClasses(
  stage: {
    readonly maxChunk: number;
    readonly nCtx: number;
    graph(slot: number, n: number, rows: "last" | "all"): Promise<unknown>;
  },
  slot: number,
): Promise<number[]> {
  const cap = Math.min(stage.maxChunk, stage.nCtx);
  const columns = Array.from({ length: Math.min(MATVEC_MAX_COLS, cap) - 1 }, (_, i) => i + 2);
  for (const n of columns) await stage.graph(slot, n, "all");
  const widths = prefillWidthClasses(cap);
  for (const n of widths) await stage.graph(slot, n, "last");
  return [...columns, ...widths];
}
