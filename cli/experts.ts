/**
 * The numerics flags that `head`, `worker`, `generate`, `probe` and the benches share. By default the commands
 * round x to int8 before every quantized mat-vec (StageOptions.int8Activations, the experts' included), as
 * llama.cpp's quantized mat-vecs round activations to q8_1; the numbers are in head's help. `--int8-experts`
 * rounds x for the expert mat-vecs alone (StageOptions.int8Experts; the projections keep f32 x), and
 * `--f32-experts` keeps f32 x everywhere: the exact path, the library's default. `--int8` names the default.
 * No imports: the benches read it on the lent GPU machine.
 * @module
 */

/** The flags as parseArgs gives them. */
export interface ExpertFlags {
  readonly int8?: boolean;
  readonly "int8-experts"?: boolean;
  readonly "f32-experts"?: boolean;
}

/** What each flag asks for, in the words of the usage error. */
const MEANING: Record<keyof ExpertFlags, string> = {
  int8: "--int8 (int8 x for every mat-vec, the default)",
  "int8-experts": "--int8-experts (int8 x for the expert mat-vecs alone)",
  "f32-experts": "--f32-experts (f32 x everywhere)",
};

/**
 * The usage error of flags that contradict each other (the command reports it and exits 2), or undefined:
 * any two of `--int8`, `--int8-experts` and `--f32-experts`.
 */
export function expertsConflict(v: ExpertFlags): string | undefined {
  const given = (Object.keys(MEANING) as (keyof ExpertFlags)[]).filter((k) => v[k]);
  if (given.length < 2) return undefined;
  return `${given.map((k) => MEANING[k]).join(" and ")} contradict each other: give one`;
}

/** StageOptions.int8Activations from the flags: on unless `--int8-experts` or `--f32-experts`. */
export function int8ActivationsFlag(v: ExpertFlags): boolean {
  return !v["int8-experts"] && !v["f32-experts"];
}

/** StageOptions.int8Experts from the flags: on unless `--f32-experts`. */
export function int8ExpertsFlag(v: ExpertFlags): boolean {
  return !v["f32-experts"];
}

/** The flag a head (or worker) needs for the numerics of `v`: "" for the default. */
export function numericsFlag(v: ExpertFlags): string {
  return v["f32-experts"] ? " --f32-experts" : v["int8-experts"] ? " --int8-experts" : "";
}
