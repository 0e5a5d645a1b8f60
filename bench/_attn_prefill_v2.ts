/**
 * The flash prefill kernel before the register-blocked rewrite (`bench/_attn_prefill_v2.wgsl`), kept for
 * bench/attention.ts only: its spec and the constant choice the engine made for it (BQ, TILE, DC, TV, SK,
 * OD, WG from the device's workgroup memory). Bindings and grid are those of `wgsl/attn_prefill.ts`.
 * @module
 */
import type { KernelSpec } from "../wgsl/kernel.ts";

/** Constants of `_attn_prefill_v2.wgsl` (see its header). */
export type AttnPrefillV2Constants = {
  readonly H_Q: number;
  readonly H_KV: number;
  readonly D_H: number;
  readonly P_MAX: number;
  readonly BQ: number;
  readonly TILE: number;
  readonly DC: number;
  readonly TV: number;
  readonly SK: number;
  readonly OD: number;
  readonly WG: number;
  readonly SCALE: number;
  readonly KV_F16: boolean;
};

/** Kernel spec of `_attn_prefill_v2.wgsl`. */
export const ATTN_PREFILL_V2: KernelSpec = {
  name: "attn_prefill_v2",
  url: new URL("./_attn_prefill_v2.wgsl", import.meta.url),
  lib: [],
  constants: {
    H_Q: "u32",
    H_KV: "u32",
    D_H: "u32",
    P_MAX: "u32",
    BQ: "u32",
    TILE: "u32",
    DC: "u32",
    TV: "u32",
    SK: "u32",
    OD: "u32",
    WG: "u32",
    SCALE: "f32",
    KV_F16: "bool",
  },
};

/** Workgroup memory of one variant in bytes. */
export function attnPrefillV2WorkgroupBytes(c: AttnPrefillV2Constants): number {
  const r = c.BQ * c.H_Q / c.H_KV;
  const dq = c.D_H / 4;
  const kvQuads = Math.max(c.TILE * (c.DC / 4 + 1), c.TV * dq);
  return 16 * (r * dq + kvQuads) + 4 * (c.TILE * (r + 1) + r * c.TILE / c.SK + r);
}

/** Whether the variant's work splits evenly (the old twin's checks, short of the device limit). */
function splits(c: AttnPrefillV2Constants): boolean {
  const r = c.BQ * c.H_Q / c.H_KV;
  const spi = r * c.TILE / c.WG;
  const opi = r * c.D_H / c.WG;
  const dg = c.D_H / c.OD;
  return Number.isInteger(spi) && spi % c.SK === 0 && c.TILE % c.SK === 0 && c.WG % (c.TILE / c.SK) === 0 &&
    c.OD % 4 === 0 && Number.isInteger(opi) && opi % c.OD === 0 && Number.isInteger(dg) && c.WG % dg === 0 &&
    r % (c.WG / dg) === 0 && c.D_H % c.DC === 0 && c.TILE % c.TV === 0;
}

/**
 * The old engine's choice: the largest query block (at most 64 rows) that fits `maxWorkgroupBytes`, with
 * `bq`, `tile` (32), `dc` (64) as overrides; undefined when the variant does not fit or split evenly.
 */
export function attnPrefillV2Constants(
  shape: Pick<AttnPrefillV2Constants, "H_Q" | "H_KV" | "D_H" | "P_MAX" | "SCALE" | "KV_F16">,
  opts: { maxWorkgroupBytes: number; bq?: number; tile?: number; dc?: number },
): AttnPrefillV2Constants | undefined {
  const g = shape.H_Q / shape.H_KV;
  const tile = opts.tile ?? 32;
  const dc = opts.dc ?? Math.min(64, shape.D_H);
  const build = (bq: number): AttnPrefillV2Constants => {
    const r = bq * g;
    let wg = 256;
    while (wg > 1 && ((r * tile) % wg !== 0 || (r * shape.D_H / 4) % wg !== 0)) wg /= 2;
    const spi = r * tile / wg;
    let sk = 1;
    for (let k = 1; k * k <= spi; k++) if (spi % k === 0 && tile % k === 0 && wg % (tile / k) === 0) sk = k;
    const opi = r * shape.D_H / wg;
    const od = opi % 8 === 0 && wg % (shape.D_H / 8) === 0 && r % (wg / (shape.D_H / 8)) === 0 ? 8 : 4;
    let tv = 1;
    for (let t = 1; t <= tile; t++) if (tile % t === 0 && t * shape.D_H / 4 <= tile * (dc / 4 + 1)) tv = t;
    return { ...shape, BQ: bq, TILE: tile, DC: dc, TV: tv, SK: sk, OD: od, WG: wg };
  };
  const fits = (c: AttnPrefillV2Constants) =>
    splits(c) && attnPrefillV2WorkgroupBytes(c) <= opts.maxWorkgroupBytes;
  if (opts.bq !== undefined) {
    const c = build(opts.bq);
    return fits(c) ? c : undefined;
  }
  for (let bq = Math.max(1, Math.floor(64 / g)); bq >= 1; bq = Math.floor(bq / 2)) {
    const c = build(bq);
    if (fits(c)) return c;
  }
  return undefined;
}
