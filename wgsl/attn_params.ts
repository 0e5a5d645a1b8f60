/**
 * The per-step parameter block shared by the attention kernels (`attn_qk_rope`, `attn_decode`,
 * `attn_prefill`): a small storage buffer the engine (or the GPU) advances, so dispatch sizes stay constant
 * and decode steps can be pre-encoded.
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
