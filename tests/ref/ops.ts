/**
 * Float64 reference ops: one plain-loops function per kernel, written from spec `qwen3next.md`, readable
 * before fast. GPU kernels are tested against these; `forward.ts` composes them into the whole model.
 *
 * Conventions: every array is a flat `Float64Array` in GGUF order (`ne=[innermost, ...]`); inputs are
 * never modified (stateful ops return the new state); element `[i0, i1, i2]` of `ne=[n0, n1, n2]` lives at
 * `i0 + n0 * (i1 + n1 * i2)`.
 * @module
 */
import { dequantizeRow } from "../../engine/quant/dequant.ts";
import { type GgmlTypeName, rowBytes } from "../../engine/quant/types.ts";

/** ggml's lower bound on the sum of the selected routing probabilities before renormalizing (L5). */
export const MOE_WEIGHT_SUM_MIN = 6.1035e-5;

/** Logistic sigmoid `1 / (1 + e^-x)`. */
export function sigmoid(x: number): number {
  return 1 / (1 + Math.exp(-x));
}

/** SiLU `x * sigmoid(x)`. */
export function silu(x: number): number {
  return x / (1 + Math.exp(-x));
}

/** Softplus `log(1 + e^x)`, returning `x` itself for `x > 20` where the two agree to f64 precision (§8.2). */
export function softplus(x: number): number {
  return x > 20 ? x : Math.log1p(Math.exp(x));
}

/** Numerically stable softmax of a whole vector (subtract the max first). */
export function softmax(x: ArrayLike<number>): Float64Array {
  let max = -Infinity;
  for (let i = 0; i < x.length; i++) max = Math.max(max, x[i]!);
  const out = new Float64Array(x.length);
  let sum = 0;
  for (let i = 0; i < x.length; i++) {
    out[i] = Math.exp(x[i]! - max);
    sum += out[i]!;
  }
  for (let i = 0; i < x.length; i++) out[i] = out[i]! / sum;
  return out;
}

/**
 * RMSNorm of each row of `n` values (spec §5): `x_i / sqrt(mean(x²) + eps) * w_i`.
 * @param x rows, `ne=[n, nRows]` (`n` defaults to the whole length: one row)
 * @param w weight `ne=[n]` shared by all rows, or null for no weight
 */
export function rmsNorm(
  x: ArrayLike<number>,
  w: ArrayLike<number> | null,
  opts: { eps: number; n?: number },
): Float64Array {
  const n = opts.n ?? x.length;
  checkRows("rmsNorm", x.length, n);
  if (w !== null && w.length !== n) throw new RangeError(`rmsNorm: weight has ${w.length} values, rows ${n}`);
  const out = new Float64Array(x.length);
  for (let r = 0; r < x.length / n; r++) {
    let ss = 0;
    for (let i = 0; i < n; i++) ss += x[r * n + i]! ** 2;
    const inv = 1 / Math.sqrt(ss / n + opts.eps);
    for (let i = 0; i < n; i++) out[r * n + i] = x[r * n + i]! * inv * (w === null ? 1 : w[i]!);
  }
  return out;
}

/**
 * Gated RMSNorm of the DeltaNet output (spec §8.7): per row, `rmsNorm(x, w) * silu(z)`.
 * @param x rows `ne=[n, nRows]`
 * @param w weight `ne=[n]` shared by all rows (GGUF `ssm_norm`, no +1 offset)
 */
export function rmsNormGated(
  x: ArrayLike<number>,
  w: ArrayLike<number>,
  opts: { z: ArrayLike<number>; eps: number; n?: number },
): Float64Array {
  if (opts.z.length !== x.length) throw new RangeError(`rmsNormGated: z has ${opts.z.length}, x ${x.length}`);
  const out = rmsNorm(x, w, opts);
  for (let i = 0; i < out.length; i++) out[i] = out[i]! * silu(opts.z[i]!);
  return out;
}

/**
 * L2 normalization of each row of `n` values (ggml `l2_norm`, spec §8.4): `x / max(‖x‖₂, eps)`.
 * @param x rows `ne=[n, nRows]`
 */
export function l2Norm(x: ArrayLike<number>, opts: { eps: number; n?: number }): Float64Array {
  const n = opts.n ?? x.length;
  checkRows("l2Norm", x.length, n);
  const out = new Float64Array(x.length);
  for (let r = 0; r < x.length / n; r++) {
    let ss = 0;
    for (let i = 0; i < n; i++) ss += x[r * n + i]! ** 2;
    const inv = 1 / Math.max(Math.sqrt(ss), opts.eps);
    for (let i = 0; i < n; i++) out[r * n + i] = x[r * n + i]! * inv;
  }
  return out;
}

/**
 * Matrix-vector product `y[r] = Σ_c w[c + ne0·r] · x[c]` over a dequantized matrix (GGUF `ne=[ne0, ne1]`:
 * ne1 rows of ne0).
 * @param w matrix `ne=[ne0, ne1]`
 * @param x vector `ne=[ne0]`
 * @returns `ne=[ne1]`
 */
export function matvec(
  w: ArrayLike<number>,
  x: ArrayLike<number>,
  opts: { ne1?: number } = {},
): Float64Array {
  const ne0 = x.length;
  const ne1 = opts.ne1 ?? w.length / ne0;
  if (!Number.isInteger(ne1) || ne0 * ne1 !== w.length) {
    throw new RangeError(`matvec: matrix of ${w.length} values is not ne=[${ne0}, ${opts.ne1 ?? "?"}]`);
  }
  const y = new Float64Array(ne1);
  for (let r = 0; r < ne1; r++) {
    let acc = 0;
    for (let c = 0; c < ne0; c++) acc += w[r * ne0 + c]! * x[c]!;
    y[r] = acc;
  }
  return y;
}

/**
 * Matrix-vector product over a quantized matrix: each row's block bytes decoded by the reference
 * dequantizer, then {@linkcode matvec}'s sum.
 * @param w matrix `ne=[ne0, ne1]` of type `w.type`, all ne1 rows of bytes
 * @param x vector `ne=[ne0]`
 * @returns `ne=[ne1]`
 */
export function matvecQuant(
  w: { type: GgmlTypeName; bytes: Uint8Array },
  x: ArrayLike<number>,
): Float64Array {
  const ne0 = x.length;
  const ne1 = w.bytes.length / rowBytes(w.type, ne0);
  if (!Number.isInteger(ne1)) {
    throw new RangeError(`matvecQuant: ${w.bytes.length} bytes of ${w.type} are not whole rows of ${ne0}`);
  }
  const y = new Float64Array(ne1);
  for (let r = 0; r < ne1; r++) {
    const row = dequantizeRow(w.type, w.bytes, ne0, r);
    let acc = 0;
    for (let c = 0; c < ne0; c++) acc += row[c]! * x[c]!;
    y[r] = acc;
  }
  return y;
}

/**
 * Partial NeoX (half-split) rotary embedding (spec §7.4): in each head the first `nRot` dims rotate in
 * pairs `(j, j + nRot/2)` by angle `pos · base^(-2j/nRot)`; dims `nRot..headDim-1` pass through.
 * @param x `ne=[headDim, nHead, nTokens]`
 * @param opts `pos[t]` is the position of token t (`pos.length` = nTokens)
 */
export function ropeNeox(
  x: ArrayLike<number>,
  opts: { headDim: number; nRot: number; base: number; pos: readonly number[] },
): Float64Array {
  const { headDim, nRot, base, pos } = opts;
  if (nRot % 2 !== 0 || nRot > headDim) throw new RangeError(`ropeNeox: nRot ${nRot} vs headDim ${headDim}`);
  const nTokens = pos.length;
  const nHead = x.length / (headDim * nTokens);
  if (!Number.isInteger(nHead)) {
    throw new RangeError(`ropeNeox: ${x.length} values are not ne=[${headDim}, ?, ${nTokens}]`);
  }
  const half = nRot / 2;
  const out = Float64Array.from(x);
  for (let t = 0; t < nTokens; t++) {
    for (let h = 0; h < nHead; h++) {
      const o = (t * nHead + h) * headDim;
      for (let j = 0; j < half; j++) {
        const phi = pos[t]! * Math.pow(base, (-2 * j) / nRot);
        const c = Math.cos(phi);
        const s = Math.sin(phi);
        const a = x[o + j]!;
        const b = x[o + j + half]!;
        out[o + j] = a * c - b * s;
        out[o + j + half] = a * s + b * c;
      }
    }
  }
  return out;
}

/**
 * Causal grouped-query attention with the sigmoid output gate (spec §7.6-7.7). Query token t sits at
 * cache position `nKv - nTokens + t` and sees cache positions up to and including its own. Query head h
 * reads KV head `floor(h / (nHead / nHeadKv))`.
 * @param q queries (already normed and rotated), `ne=[headDim, nHead, nTokens]`
 * @param opts `k`, `v`: cache `ne=[headDim, nHeadKv, nKv]`; `gate`: `ne=[headDim, nHead, nTokens]`
 *   (raw, sigmoid applied here) or undefined for no gate; `scale`: logit scale (1/√headDim)
 * @returns `ne=[headDim, nHead, nTokens]`
 */
export function attention(
  q: ArrayLike<number>,
  opts: {
    k: ArrayLike<number>;
    v: ArrayLike<number>;
    gate?: ArrayLike<number>;
    headDim: number;
    nHead: number;
    nHeadKv: number;
    scale: number;
  },
): Float64Array {
  const { k, v, gate, headDim, nHead, nHeadKv, scale } = opts;
  const nTokens = q.length / (headDim * nHead);
  const nKv = k.length / (headDim * nHeadKv);
  if (
    !Number.isInteger(nTokens) || !Number.isInteger(nKv) || v.length !== k.length || nHead % nHeadKv !== 0
  ) {
    throw new RangeError(
      `attention: q ${q.length}, k ${k.length}, v ${v.length} do not fit headDim ${headDim}, ` +
        `nHead ${nHead}, nHeadKv ${nHeadKv}`,
    );
  }
  if (nKv < nTokens) throw new RangeError(`attention: ${nTokens} queries but only ${nKv} cached positions`);
  if (gate !== undefined && gate.length !== q.length) throw new RangeError(`attention: gate length`);
  const group = nHead / nHeadKv;
  const out = new Float64Array(q.length);
  for (let t = 0; t < nTokens; t++) {
    const last = nKv - nTokens + t;
    for (let h = 0; h < nHead; h++) {
      const g = Math.floor(h / group);
      const qo = (t * nHead + h) * headDim;
      const s = new Float64Array(last + 1);
      for (let p = 0; p <= last; p++) {
        const ko = (p * nHeadKv + g) * headDim;
        let dot = 0;
        for (let i = 0; i < headDim; i++) dot += q[qo + i]! * k[ko + i]!;
        s[p] = dot * scale;
      }
      const a = softmax(s);
      for (let p = 0; p <= last; p++) {
        const vo = (p * nHeadKv + g) * headDim;
        for (let i = 0; i < headDim; i++) out[qo + i] = out[qo + i]! + a[p]! * v[vo + i]!;
      }
      if (gate !== undefined) {
        for (let i = 0; i < headDim; i++) out[qo + i] = out[qo + i]! * sigmoid(gate[qo + i]!);
      }
    }
  }
  return out;
}

/**
 * Causal depthwise conv1d over a rolling state (spec §8.3), without the SiLU that follows it. For token t
 * the window is `[x_{t-K+1} … x_t]` over the concatenation `[state | x]`, and
 * `y_t[ch] = Σ_k w[k + K·ch] · window[k][ch]` (tap K-1 multiplies the current token).
 * @param x inputs `ne=[nCh, nTokens]`
 * @param opts `state`: the previous K-1 inputs, oldest first, `ne=[nCh, K-1]`; `w`: taps `ne=[K, nCh]`
 * @returns `y` `ne=[nCh, nTokens]` and the new state (the last K-1 inputs), same layout as `state`
 */
export function conv1dStep(
  x: ArrayLike<number>,
  opts: { state: ArrayLike<number>; w: ArrayLike<number>; nCh: number },
): { y: Float64Array; state: Float64Array } {
  const { state, w, nCh } = opts;
  const kConv = w.length / nCh;
  const nTokens = x.length / nCh;
  if (
    !Number.isInteger(kConv) || kConv < 1 || state.length !== nCh * (kConv - 1) || !Number.isInteger(nTokens)
  ) {
    throw new RangeError(`conv1dStep: x ${x.length}, state ${state.length}, w ${w.length} vs nCh ${nCh}`);
  }
  // all = [state rows | x rows]: row r of ne=[nCh, K-1+nTokens]
  const all = new Float64Array(state.length + x.length);
  all.set(Array.from(state), 0);
  all.set(Array.from(x), state.length);
  const y = new Float64Array(x.length);
  for (let t = 0; t < nTokens; t++) {
    for (let ch = 0; ch < nCh; ch++) {
      let acc = 0;
      for (let k = 0; k < kConv; k++) acc += w[k + kConv * ch]! * all[(t + k) * nCh + ch]!;
      y[t * nCh + ch] = acc;
    }
  }
  return { y, state: all.slice(all.length - state.length) };
}

/**
 * DeltaNet gates of spec §8.2 for every value head of every token: `β = sigmoid(b)` and
 * `g = ssmA · softplus(a + dtBias)` (ssmA = −exp(A_log) < 0 as stored in GGUF, so g ≤ 0).
 * @param b beta logits `ne=[nV, nTokens]`
 * @param opts `a`: alpha logits `ne=[nV, nTokens]`; `ssmA`, `dtBias`: `ne=[nV]`
 * @returns `beta` and `g`, both `ne=[nV, nTokens]`
 */
export function deltaNetGates(
  b: ArrayLike<number>,
  opts: { a: ArrayLike<number>; ssmA: ArrayLike<number>; dtBias: ArrayLike<number> },
): { beta: Float64Array; g: Float64Array } {
  const nV = opts.ssmA.length;
  if (opts.a.length !== b.length || b.length % nV !== 0 || opts.dtBias.length !== nV) {
    throw new RangeError(
      `deltaNetGates: b ${b.length}, a ${opts.a.length}, ssmA ${nV}, dtBias ${opts.dtBias.length}`,
    );
  }
  const beta = Float64Array.from(b, sigmoid);
  const g = Float64Array.from(opts.a, (v, i) => opts.ssmA[i % nV]! * softplus(v + opts.dtBias[i % nV]!));
  return { beta, g };
}

/** Shapes and head mapping of a gated DeltaNet call. */
export interface DeltaNetShape {
  /** Key head dim (`ssmState`). */
  readonly dK: number;
  /** Value head dim. */
  readonly dV: number;
  /** Key heads (`ssmGroups`). */
  readonly nK: number;
  /** Value heads (`ssmDtRank`). */
  readonly nV: number;
  /** κ of spec §9: the key head serving value head h (file order). */
  readonly kHeadOf: (h: number) => number;
  /** Query scale; default `1/√dK` (spec §8.4). */
  readonly scale?: number;
}

/** Per-token inputs of a gated DeltaNet call (all already through conv, SiLU, L2 norm and gates). */
export interface DeltaNetInputs {
  /** L2-normalized queries, NOT yet scaled: `ne=[dK, nK, nTokens]`. */
  readonly q: ArrayLike<number>;
  /** L2-normalized keys: `ne=[dK, nK, nTokens]`. */
  readonly k: ArrayLike<number>;
  /** Values: `ne=[dV, nV, nTokens]`. */
  readonly v: ArrayLike<number>;
  /** Write strength β = sigmoid(b): `ne=[nV, nTokens]`. */
  readonly beta: ArrayLike<number>;
  /** Log decay g ≤ 0: `ne=[nV, nTokens]`. */
  readonly g: ArrayLike<number>;
}

/**
 * Gated DeltaNet, token by token in the exact order of spec §8.5: decay, read with k, delta, rank-1 write,
 * read with the scaled q after the write. The state is stored transposed per head as in L4:
 * `state[i + dK·(j + dV·h)] = S_h[i][j]` (`ne=[dK, dV, nV]`, i the key index, j the value index).
 * @param state incoming state `ne=[dK, dV, nV]` (not modified)
 * @returns outputs `o` `ne=[dV, nV, nTokens]` and the new state
 */
export function deltaNetStep(
  state: ArrayLike<number>,
  opts: DeltaNetShape & DeltaNetInputs,
): { o: Float64Array; state: Float64Array } {
  const { dK, dV, nK, nV, kHeadOf, q, k, v, beta, g } = opts;
  const nTokens = checkDeltaNet("deltaNetStep", state, opts);
  const scale = opts.scale ?? 1 / Math.sqrt(dK);
  const S = Float64Array.from(state);
  const o = new Float64Array(dV * nV * nTokens);
  const u = new Float64Array(dV);
  for (let t = 0; t < nTokens; t++) {
    for (let h = 0; h < nV; h++) {
      const kh = kHeadOf(h);
      const ko = (t * nK + kh) * dK;
      const vo = (t * nV + h) * dV;
      const so = h * dK * dV;
      const decay = Math.exp(g[t * nV + h]!);
      const b = beta[t * nV + h]!;
      for (let x = 0; x < dK * dV; x++) S[so + x] = S[so + x]! * decay; // (1)
      for (let j = 0; j < dV; j++) { // (2), (3)
        let acc = 0;
        for (let i = 0; i < dK; i++) acc += S[so + j * dK + i]! * k[ko + i]!;
        u[j] = b * (v[vo + j]! - acc);
      }
      for (let j = 0; j < dV; j++) { // (4)
        for (let i = 0; i < dK; i++) S[so + j * dK + i] = S[so + j * dK + i]! + k[ko + i]! * u[j]!;
      }
      for (let j = 0; j < dV; j++) { // (5)
        let acc = 0;
        for (let i = 0; i < dK; i++) acc += S[so + j * dK + i]! * q[ko + i]! * scale;
        o[vo + j] = acc;
      }
    }
  }
  return { o, state: S };
}

/**
 * Gated DeltaNet in the chunked form of spec §8.6 (chunks of `chunk` tokens, a shorter last chunk instead
 * of zero padding, which is equivalent). Same arguments, state layout and result as
 * {@linkcode deltaNetStep}, to which it must agree up to rounding.
 */
export function deltaNetChunked(
  state: ArrayLike<number>,
  opts: DeltaNetShape & DeltaNetInputs & { chunk?: number },
): { o: Float64Array; state: Float64Array } {
  const { dK, dV, nK, nV, kHeadOf, q, k, v, beta, g } = opts;
  const nTokens = checkDeltaNet("deltaNetChunked", state, opts);
  const cs = opts.chunk ?? 64;
  if (!Number.isInteger(cs) || cs < 1) throw new RangeError(`deltaNetChunked: chunk ${cs}`);
  const scale = opts.scale ?? 1 / Math.sqrt(dK);
  const Snew = Float64Array.from(state);
  const o = new Float64Array(dV * nV * nTokens);
  for (let h = 0; h < nV; h++) {
    const kh = kHeadOf(h);
    const so = h * dK * dV;
    // S[i][j] = Snew[so + j*dK + i]
    for (let c0 = 0; c0 < nTokens; c0 += cs) {
      const n = Math.min(cs, nTokens - c0);
      // this chunk's rows of head h: K, Q (scaled) ne=[dK, n]; Vm ne=[dV, n]; β, g per token
      const K = new Float64Array(n * dK), Q = new Float64Array(n * dK), Vm = new Float64Array(n * dV);
      const B = new Float64Array(n), G = new Float64Array(n);
      for (let t = 0, acc = 0; t < n; t++) {
        for (let i = 0; i < dK; i++) {
          K[t * dK + i] = k[((c0 + t) * nK + kh) * dK + i]!;
          Q[t * dK + i] = q[((c0 + t) * nK + kh) * dK + i]! * scale;
        }
        for (let j = 0; j < dV; j++) Vm[t * dV + j] = v[((c0 + t) * nV + h) * dV + j]!;
        B[t] = beta[(c0 + t) * nV + h]!;
        G[t] = acc += g[(c0 + t) * nV + h]!; // cumulative log-decay within the chunk
      }
      const dot = (a: Float64Array, ta: number, b: Float64Array, tb: number) => {
        let s = 0;
        for (let i = 0; i < dK; i++) s += a[ta * dK + i]! * b[tb * dK + i]!;
        return s;
      };
      // M[t][s] = β_t (k_t·k_s) e^{G_t-G_s}, s < t
      const M = new Float64Array(n * n);
      for (let t = 0; t < n; t++) {
        for (let s = 0; s < t; s++) M[t * n + s] = B[t]! * dot(K, t, K, s) * Math.exp(G[t]! - G[s]!);
      }
      // (I + M) U = diag(β) Vm and (I + M) Wk = diag(β e^G) K by forward substitution
      const U = new Float64Array(n * dV);
      const Wk = new Float64Array(n * dK);
      for (let t = 0; t < n; t++) {
        for (let j = 0; j < dV; j++) {
          let acc = B[t]! * Vm[t * dV + j]!;
          for (let s = 0; s < t; s++) acc -= M[t * n + s]! * U[s * dV + j]!;
          U[t * dV + j] = acc;
        }
        for (let i = 0; i < dK; i++) {
          let acc = B[t]! * Math.exp(G[t]!) * K[t * dK + i]!;
          for (let s = 0; s < t; s++) acc -= M[t * n + s]! * Wk[s * dK + i]!;
          Wk[t * dK + i] = acc;
        }
      }
      // V' = U - Wk S
      const Vp = new Float64Array(n * dV);
      for (let t = 0; t < n; t++) {
        for (let j = 0; j < dV; j++) {
          let acc = U[t * dV + j]!;
          for (let i = 0; i < dK; i++) acc -= Wk[t * dK + i]! * Snew[so + j * dK + i]!;
          Vp[t * dV + j] = acc;
        }
      }
      // O = diag(e^G) Q S + ((Q Kᵀ) ⊙ Dec_incl_diag) V'
      for (let t = 0; t < n; t++) {
        const eg = Math.exp(G[t]!);
        const qk = new Float64Array(t + 1);
        for (let s = 0; s <= t; s++) qk[s] = dot(Q, t, K, s) * Math.exp(G[t]! - G[s]!);
        for (let j = 0; j < dV; j++) {
          let inter = 0;
          for (let i = 0; i < dK; i++) inter += Q[t * dK + i]! * Snew[so + j * dK + i]!;
          let intra = 0;
          for (let s = 0; s <= t; s++) intra += qk[s]! * Vp[s * dV + j]!;
          o[((c0 + t) * nV + h) * dV + j] = eg * inter + intra;
        }
      }
      // S_next = e^{G_last} S + (diag(e^{G_last - G}) K)ᵀ V'
      const gl = G[n - 1]!;
      for (let j = 0; j < dV; j++) {
        for (let i = 0; i < dK; i++) {
          let acc = Math.exp(gl) * Snew[so + j * dK + i]!;
          for (let t = 0; t < n; t++) acc += Math.exp(gl - G[t]!) * K[t * dK + i]! * Vp[t * dV + j]!;
          Snew[so + j * dK + i] = acc;
        }
      }
    }
  }
  return { o, state: Snew };
}

/**
 * MoE routing (spec §10): softmax over all experts, the `nUsed` most probable (ties to the lower index),
 * weights renormalized by `max(Σ selected, 6.1035e-5)`, then multiplied by `weightsScale` when given and
 * non-zero.
 * @param logits router logits `ne=[nExpert]`
 * @returns selected expert ids in descending probability, their weights, and all probabilities
 */
export function moeRoute(
  logits: ArrayLike<number>,
  opts: { nUsed: number; weightsScale?: number },
): { ids: number[]; weights: Float64Array; probs: Float64Array } {
  const probs = softmax(logits);
  if (!Number.isInteger(opts.nUsed) || opts.nUsed < 1 || opts.nUsed > probs.length) {
    throw new RangeError(`moeRoute: nUsed ${opts.nUsed} of ${probs.length} experts`);
  }
  const order = Array.from(probs.keys()).sort((a, b) => probs[b]! - probs[a]! || a - b);
  const ids = order.slice(0, opts.nUsed);
  let sum = 0;
  for (const e of ids) sum += probs[e]!;
  const denom = Math.max(sum, MOE_WEIGHT_SUM_MIN);
  const scale = opts.weightsScale !== undefined && opts.weightsScale !== 0 ? opts.weightsScale : 1;
  const weights = Float64Array.from(ids, (e) => (probs[e]! / denom) * scale);
  return { ids, weights, probs };
}

/**
 * One SwiGLU expert (spec §10): `down · (silu(gate · x) ⊙ (up · x))`.
 * @param x input `ne=[nEmbd]`
 * @param opts `gate`, `up`: `ne=[nEmbd, nFf]`; `down`: `ne=[nFf, nEmbd]`
 * @returns `ne=[nEmbd]`
 */
export function expertFfn(
  x: ArrayLike<number>,
  opts: {
    gate: ArrayLike<number>;
    up: ArrayLike<number>;
    down: ArrayLike<number>;
    /** What the down projection reads instead of the hidden activations (int8 activations). */
    act?: (hid: Float64Array) => ArrayLike<number>;
  },
): Float64Array {
  const a = matvec(opts.gate, x);
  const b = matvec(opts.up, x);
  if (a.length !== b.length || opts.down.length !== a.length * x.length) {
    throw new RangeError(
      `expertFfn: gate ${opts.gate.length}, up ${opts.up.length}, down ${opts.down.length}`,
    );
  }
  const hid = new Float64Array(a.length);
  for (let i = 0; i < a.length; i++) hid[i] = silu(a[i]!) * b[i]!;
  return matvec(opts.down, opts.act ? opts.act(hid) : hid);
}

/** Weights of one MoE FFN block (spec §4, §10), dequantized. */
export interface MoeWeights {
  /** Router `ne=[nEmbd, nExpert]`. */
  readonly gateInp: ArrayLike<number>;
  /** Expert gate and up projections `ne=[nEmbd, nFf, nExpert]`. */
  readonly gateExps: Float64Array;
  /** See `gateExps`. */
  readonly upExps: Float64Array;
  /** Expert down projections `ne=[nFf, nEmbd, nExpert]`. */
  readonly downExps: Float64Array;
  /** Shared-expert gate logit weights `ne=[nEmbd]`. */
  readonly gateInpShexp: ArrayLike<number>;
  /** Shared expert gate and up projections `ne=[nEmbd, nFfShexp]`. */
  readonly gateShexp: ArrayLike<number>;
  /** See `gateShexp`. */
  readonly upShexp: ArrayLike<number>;
  /** Shared expert down projection `ne=[nFfShexp, nEmbd]`. */
  readonly downShexp: ArrayLike<number>;
}

/**
 * The MoE FFN of spec §10: routed experts ({@linkcode moeRoute}, {@linkcode expertFfn}) weighted and summed,
 * plus the shared expert scaled by `sigmoid(gateInpShexp · x)`.
 * @param x input `ne=[nEmbd]` (the post-attention RMSNorm output)
 * @returns `ne=[nEmbd]`
 */
export function moeFfn(
  x: ArrayLike<number>,
  opts: MoeWeights & {
    nExpert: number;
    nUsed: number;
    weightsScale?: number;
    /**
     * What the expert mat-vecs read instead of the exact values (int8 activations): `in` the x of the gate and
     * up projections, `act` the hidden activations of selected expert `slot` (0..nUsed-1; nUsed: the shared
     * expert) for its down projection. The router reads x as it is.
     */
    x8?: {
      in?: (x: Float64Array) => ArrayLike<number>;
      act?: (hid: Float64Array, slot: number) => ArrayLike<number>;
    };
  },
): Float64Array {
  const D = x.length;
  const F = opts.gateExps.length / (D * opts.nExpert);
  if (
    !Number.isInteger(F) || opts.upExps.length !== opts.gateExps.length ||
    opts.downExps.length !== F * D * opts.nExpert
  ) {
    throw new RangeError(
      `moeFfn: expert tensors ${opts.gateExps.length}/${opts.upExps.length}/${opts.downExps.length} do not ` +
        `fit nEmbd ${D} and nExpert ${opts.nExpert}`,
    );
  }
  const route = moeRoute(matvec(opts.gateInp, x, { ne1: opts.nExpert }), opts);
  const out = new Float64Array(D);
  const xe = opts.x8?.in ? opts.x8.in(Float64Array.from(x)) : x;
  const act = opts.x8?.act;
  route.ids.forEach((e, i) => {
    const y = expertFfn(xe, {
      gate: opts.gateExps.subarray(e * D * F, (e + 1) * D * F),
      up: opts.upExps.subarray(e * D * F, (e + 1) * D * F),
      down: opts.downExps.subarray(e * F * D, (e + 1) * F * D),
      act: act && ((hid) => act(hid, i)),
    });
    for (let d = 0; d < D; d++) out[d] = out[d]! + route.weights[i]! * y[d]!;
  });
  const shared = expertFfn(xe, {
    gate: opts.gateShexp,
    up: opts.upShexp,
    down: opts.downShexp,
    act: act && ((hid) => act(hid, opts.nUsed)),
  });
  const gam = sigmoid(matvec(opts.gateInpShexp, x, { ne1: 1 })[0]!);
  for (let d = 0; d < D; d++) out[d] = out[d]! + gam * shared[d]!;
  return out;
}

function checkRows(what: string, len: number, n: number): void {
  if (!Number.isInteger(n) || n < 1 || len % n !== 0) {
    throw new RangeError(`${what}: ${len} values are not whole rows of ${n}`);
  }
}

function checkDeltaNet(what: string, state: ArrayLike<number>, o: DeltaNetShape & DeltaNetInputs): number {
  const { dK, dV, nK, nV } = o;
  const nTokens = o.beta.length / nV;
  const ok = state.length === dK * dV * nV && Number.isInteger(nTokens) && o.g.length === nV * nTokens &&
    o.q.length === dK * nK * nTokens && o.k.length === o.q.length && o.v.length === dV * nV * nTokens;
  if (!ok) {
    throw new RangeError(
      `${what}: state ${state.length}, q ${o.q.length}, k ${o.k.length}, v ${o.v.length}, beta ` +
        `${o.beta.length}, g ${o.g.length} do not fit dK ${dK}, dV ${dV}, nK ${nK}, nV ${nV}`,
    );
  }
  for (let h = 0; h < nV; h++) {
    const kh = o.kHeadOf(h);
    if (!Number.isInteger(kh) || kh < 0 || kh >= nK) throw new RangeError(`${what}: kHeadOf(${h}) = ${kh}`);
  }
  return nTokens;
}
