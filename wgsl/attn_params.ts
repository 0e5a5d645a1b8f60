/**
 * What the attention kernels (`attn_qk_rope`, `attn_decode`, `attn_prefill`) share: the per-step parameter
 * block, a small storage buffer the engine (or the GPU) advances so dispatch sizes stay constant and decode
 * steps can be pre-encoded; and the KV cache layout.
 * @module
 */

/**
 * Word layout of `AttnParams` (u32 each): `pos0` at word 0 (offset 0), `n_tokens` at word 1 (offset 4).
 * Decode: `pos0` = position of the new token, `n_tokens` = 1. Prefill: `pos0` = position of the chunk's
 * first token, `n_tokens` = tokens in the chunk.
 */
export const ATTN_PARAMS_WORDS = 2;

/** Bytes of one `AttnParams` block. */
export const ATTN_PARAMS_BYTES = ATTN_PARAMS_WORDS * 4;

/**
 * Packs `AttnParams` for `queue.writeBuffer`.
 * @throws {RangeError} when a value is not a u32 or `nTokens` is 0
 */
export function packAttnParams(pos0: number, nTokens: number): Uint32Array {
  if (!Number.isInteger(pos0) || pos0 < 0 || pos0 > 0xffffffff) {
    throw new RangeError(`AttnParams pos0 must be a u32, got ${pos0}`);
  }
  if (!Number.isInteger(nTokens) || nTokens < 1 || nTokens > 0xffffffff) {
    throw new RangeError(`AttnParams nTokens must be a u32 >= 1, got ${nTokens}`);
  }
  return Uint32Array.of(pos0, nTokens);
}

/**
 * 32-bit words of one KV cache binding (K or V of one slot and layer), layout `ne=[D_H, P_MAX, H_KV]`
 * (K[g][p][d]): one f32 per word, or with `KV_F16` two f16 per word (dims 2w and 2w+1 in word w of a row,
 * the even dim in the low half).
 * @throws {RangeError} when KV_F16 is set and D_H is odd
 */
export function kvCacheWords(
  c: { readonly D_H: number; readonly P_MAX: number; readonly H_KV: number; readonly KV_F16: boolean },
): number {
  if (c.KV_F16 && c.D_H % 2 !== 0) throw new RangeError(`KV cache: KV_F16 needs an even D_H, got ${c.D_H}`);
  return (c.D_H * c.P_MAX * c.H_KV) / (c.KV_F16 ? 2 : 1);
}
