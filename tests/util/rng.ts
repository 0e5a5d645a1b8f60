/**
 * Seeded randomness for tests: fresh each run unless `SEED` is set, always printed on failure.
 * @module
 */

/** A small deterministic PRNG (SplitMix32-style) with helpers for test data. */
export class Rng {
  /** The seed this stream started from: print it in every failure message. */
  readonly seed: number;
  #s: number;

  /** @param seed 32-bit seed; default: `SEED` from the environment, else a fresh random one */
  constructor(seed?: number) {
    this.seed = seed ?? envSeed() ?? crypto.getRandomValues(new Uint32Array(1))[0]!;
    this.#s = this.seed >>> 0;
  }

  /** Uniform u32. */
  u32(): number {
    this.#s = (this.#s + 0x9e3779b9) >>> 0;
    let z = this.#s;
    z = Math.imul(z ^ (z >>> 16), 0x85ebca6b);
    z = Math.imul(z ^ (z >>> 13), 0xc2b2ae35);
    return (z ^ (z >>> 16)) >>> 0;
  }

  /** Uniform in [0, 1). */
  float(): number {
    return this.u32() / 2 ** 32;
  }

  /** Uniform integer in [lo, hi). */
  int(lo: number, hi: number): number {
    return lo + Math.floor(this.float() * (hi - lo));
  }

  /** Standard normal (Box-Muller). */
  normal(): number {
    const u = 1 - this.float();
    return Math.sqrt(-2 * Math.log(u)) * Math.cos(2 * Math.PI * this.float());
  }

  /** `n` normals scaled by `scale`, rounded to f32. */
  normals(n: number, scale = 1): Float32Array<ArrayBuffer> {
    const out = new Float32Array(n);
    for (let i = 0; i < n; i++) out[i] = this.normal() * scale;
    return out;
  }

  /** 0..n-1 in a random order (Fisher-Yates). */
  permutation(n: number): number[] {
    const out = Array.from({ length: n }, (_, i) => i);
    for (let i = n - 1; i > 0; i--) {
      const j = this.int(0, i + 1);
      [out[i], out[j]] = [out[j]!, out[i]!];
    }
    return out;
  }

  /** `n` random bytes. */
  bytes(n: number): Uint8Array<ArrayBuffer> {
    const out = new Uint8Array(n);
    for (let i = 0; i < n; i++) out[i] = this.u32() & 0xff;
    return out;
  }
}

function envSeed(): number | undefined {
  const s = Deno.env.get("SEED");
  if (s === undefined || s === "") return undefined;
  const n = Number(s);
  if (!Number.isInteger(n)) throw new TypeError(`SEED must be an integer, got ${s}`);
  return n >>> 0;
}
