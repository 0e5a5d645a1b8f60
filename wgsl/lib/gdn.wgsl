// gdn: helpers shared by the gated DeltaNet kernels (gdn_step, gdn_chunk_prep). The including kernel
// defines the constants N_K, N_V, D_K, D_V: u32 and BA_GROUPED: bool (see gdn_step.wgsl).

// softplus(x) = log(1 + e^x), x itself above 20 (where the two agree in f32).
fn gdn_softplus(x: f32) -> f32 {
  if (x > 20.0) {
    return x;
  }
  return log(1.0 + exp(x));
}

// Global channel of local channel lc of v-head h (key head g): q of g, k of g, then v of h (spec §8.1
// canonical order q | k | v of the conv input).
fn gdn_channel(lc: u32, g: u32, h: u32) -> u32 {
  if (lc < D_K) {
    return g * D_K + lc;
  }
  if (lc < 2u * D_K) {
    return N_K * D_K + g * D_K + (lc - D_K);
  }
  return 2u * N_K * D_K + h * D_V + (lc - 2u * D_K);
}

// Index of b[h] of token t (spec §8.1 grouping of qwen3next's ssm_ba when BA_GROUPED: per key head κ,
// [b of its r = N_V/N_K v-heads | a of them]; a's index is this plus r).
fn gdn_ba_index(t: u32, h: u32) -> u32 {
  if (BA_GROUPED) {
    let r = N_V / N_K;
    return t * 2u * N_V + 2u * r * (h / r) + h % r;
  }
  return t * N_V + h;
}
