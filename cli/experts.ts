/**
 * The expert numerics flags that `head`, `worker`, `generate` and `probe` share. The commands round x to int8
 * for the expert mat-vecs by default (StageOptions.int8Experts, as llama.cpp's q8_1 mat-vecs round
 * activations; the reason and the numbers are in head's help); `--f32-experts` keeps f32 x there (the exact
 * path, the library's default); `--int8-experts`, the default now, is still taken; `--int8` rounds every
 * quantized mat-vec's x, the experts' included.
 * @module
 */

/** The flags as parseArgs gives them. */
export interface ExpertFlags {
  readonly int8?: boolean;
  readonly "int8-experts"?: boolean;
  readonly "f32-experts"?: boolean;
}

/**
 * The usage error of flags that contradict each other (the command reports it and exits 2), or undefined:
 * `--f32-experts` with `--int8-experts`, or with `--int8` (which rounds the experts' x too).
 */
export function expertsConflict(v: ExpertFlags): string | undefined {
  if (!v["f32-experts"]) return undefined;
  if (v["int8-experts"]) {
    return "--int8-experts and --f32-experts contradict each other: give one (int8 x for the experts is the " +
      "default; --f32-experts keeps f32 x)";
  }
  if (v.int8) {
    return "--int8 and --f32-experts contradict each other: --int8 rounds the experts' x too; give one";
  }
  return undefined;
}

/** StageOptions.int8Experts from the flags: on unless `--f32-experts` (`--int8` implies it either way). */
export function int8ExpertsFlag(v: ExpertFlags): boolean {
  return !v["f32-experts"];
}
