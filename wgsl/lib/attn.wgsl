// attn: the K/V tile staging shared by attn_decode and attn_prefill. A tile of TILE cache rows sits in
// workgroup memory as vec4s with a row stride of ATTN_ROW = D_H / 4 + 1 quads: the invocations of a q·k dot
// phase read the same d of different rows at once, and a stride of D_H (a multiple of 32 words) would put
// them all in one memory bank.
// The including kernel defines the constants TILE, D_H (a multiple of 4), WG: u32 and
// `fn attn_load4(is_k: bool, e: u32) -> vec4<f32>`: cache elements e..e+3 (e % 4 == 0) of K (is_k) or V.

const ATTN_DQ: u32 = D_H / 4u;
const ATTN_ROW: u32 = ATTN_DQ + 1u;

// attn_kv[row · ATTN_ROW + quad]: the staged tile.
var<workgroup> attn_kv: array<vec4<f32>, TILE * ATTN_ROW>;

// Stages the K (V) rows t0 .. t0 + TILE - 1 of the cache rows starting at element kv_base; zeros from `end` on.
fn attn_stage_tile(lid: u32, kv_base: u32, t0: u32, end: u32, is_k: bool) {
  for (var i = lid; i < TILE * ATTN_DQ; i += WG) {
    let row = i / ATTN_DQ;
    let col = i % ATTN_DQ;
    var x = vec4<f32>(0.0);
    if (t0 + row < end) {
      x = attn_load4(is_k, kv_base + (t0 + row) * D_H + 4u * col);
    }
    attn_kv[row * ATTN_ROW + col] = x;
  }
}
