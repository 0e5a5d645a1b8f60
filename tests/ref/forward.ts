/**
 * The float64 reference forward pass of `qwen3next` and `qwen35moe` (spec `qwen3next.md` §5-§11): every
 * weight dequantized to `Float64Array`, the layer loop composed from `ops.ts`, per-sequence state, an
 * optional layer range for pipeline stages, and named intermediates for debugging. Slow on purpose:
 * meant for the tiny fixture models.
 * @module
 */
import type { GgufFile } from "../../engine/gguf.ts";
import { archOf, convChannels, type DeltaNetLayout, type Hparams } from "../../engine/models/mod.ts";
import { type TensorId, tensorName } from "../../engine/names.ts";
import { dequantize } from "../../engine/quant/dequant.ts";
import type { GgmlTypeName } from "../../engine/quant/types.ts";
import { MATVEC_Q8_TYPES } from "../../wgsl/matvec_q8.ts";
import {
  attention,
  conv1dStep,
  deltaNetChunked,
  deltaNetGates,
  deltaNetStep,
  l2Norm,
  matvec,
  moeFfn,
  rmsNorm,
  rmsNormGated,
  ropeNeox,
  silu,
} from "./ops.ts";

/**
 * Names of the recorded per-layer intermediates, one row per token (shared with the engine's forward):
 * - `attn_norm`: mixer input (RMSNorm of the residual), `ne=[nEmbd]`;
 * - `attn_out`: full-attention mixer output (attention layers), `ne=[nEmbd]`;
 * - `ssm_conv`: DeltaNet conv output after SiLU, `ne=[C]`;
 * - `ssm_core`: DeltaNet core output before the gated norm, `ne=[dV, nV]`;
 * - `ssm_out`: DeltaNet mixer output (DeltaNet layers), `ne=[nEmbd]`;
 * - `ffn_inp`: residual after the mixer; `ffn_norm`: its RMSNorm (MoE input);
 * - `ffn_out`: MoE output (routed + gated shared expert); `l_out`: the layer's output residual.
 */
export type IntermediateName =
  | "attn_norm"
  | "attn_out"
  | "ssm_conv"
  | "ssm_core"
  | "ssm_out"
  | "ffn_inp"
  | "ffn_norm"
  | "ffn_out"
  | "l_out";

/** Every intermediate name in the order a layer computes them (each layer has a subset: its kind's). */
export const INTERMEDIATE_ORDER: readonly IntermediateName[] = [
  "attn_norm",
  "ssm_conv",
  "ssm_core",
  "ssm_out",
  "attn_out",
  "ffn_inp",
  "ffn_norm",
  "ffn_out",
  "l_out",
];

/** Where two forwards first disagree (see {@linkcode firstMismatch}). */
export interface Mismatch {
  /** Layer index. */
  readonly layer: number;
  /** Intermediate name. */
  readonly name: IntermediateName;
  /** Token (row) within the forward call. */
  readonly token: number;
  /** Element within the row. */
  readonly index: number;
  /** The other forward's value. */
  readonly got: number;
  /** The reference value. */
  readonly want: number;
  /** Elements of that row out of tolerance. */
  readonly nBad: number;
}

/** Options of {@linkcode RefModel.load}. */
export interface RefModelOptions {
  /**
   * Layer range `[a, b)` this model runs (default: all decoder layers). `a = 0` embeds tokens; `b = nLayer`
   * produces logits; otherwise the model maps hidden rows to hidden rows (a pipeline stage).
   */
  readonly layers?: readonly [number, number];
  /** Record the named intermediates of each forward call (see {@linkcode RefModel.intermediate}). */
  readonly record?: boolean;
  /** DeltaNet core: token-by-token recurrence (default, spec §8.5) or the chunked form (§8.6). */
  readonly deltaNet?: "recurrent" | "chunked";
  /** Chunk size of the chunked DeltaNet core (default 64, spec §8.6). */
  readonly chunk?: number;
  /** Debugging only: replaces the architecture's κ (spec §9), to try the alternative mapping. */
  readonly kvGroupOfVHead?: (h: number) => number;
  /**
   * Mirror of `StageOptions.int8Activations`: x rounded to int8 per 32 elements ({@linkcode roundQ8}) before
   * each mat-vec of a weight of a type in `MATVEC_Q8_TYPES` (Q8_0, Q4_K, Q5_K, Q6_K, IQ4_XS: projections, output projections, LM head, the experts' gate·up
   * and down, each pair of passes by its own weights' type; not the router). The engine rounds only in mat-vec
   * chunks (at most 8 tokens). On its own this rounding
   * decides near-ties differently from the f32 engine now and then; `int8Decisions` shares the engine's.
   */
  readonly int8Activations?: boolean;
  /**
   * Mirror of `StageOptions.int8Experts`: the experts' gate·up and down pairs round their x as under
   * int8Activations, the other mat-vecs do not (implied by int8Activations).
   */
  readonly int8Experts?: boolean;
  /** Mirror of `StageOptions.kvF16`: K and V rounded to f16 (nearest) when written to the cache. */
  readonly kvF16?: boolean;
  /**
   * With int8Activations: the engine's rounding decisions (`Stage.int8Log` of the same chunk), asked per
   * rounding by layer (-1 for the LM head), x source (`in`: the normed mixer input; `attn_o`, `ssm_o`: the
   * output projections' inputs; `head`; `moe_in`: the experts' input, `moe_act`: the hidden activations of
   * expert `slot`) and token of the forward call. Each is checked against this model's
   * own x (within the drift {@linkcode INT8_X_DRIFT} allows: q to ½ step of x/d, d to max|x|/127) and then
   * used instead of its own rounding, so that a near-tie rounded the other way does not set the two apart.
   */
  readonly int8Decisions?: (at: Int8At) => { readonly q: ArrayLike<number>; readonly d: ArrayLike<number> };
}

/** Which rounding `RefModelOptions.int8Decisions` is asked for. */
export interface Int8At {
  /** Decoder layer, or -1 for the LM head. */
  readonly layer: number;
  /** The x the mat-vec reads. */
  readonly source: "in" | "attn_o" | "ssm_o" | "head" | "moe_in" | "moe_act";
  /** Token index within the forward call. */
  readonly token: number;
  /** moe_act: the selected expert's rank (0..nUsed-1), or nUsed for the shared expert. */
  readonly slot?: number;
}

/**
 * How far an engine's x may drift from this model's in f32 rounding, as a fraction of the row's max|x| (the
 * whole row the mat-vec reads, not one 32-element chunk): a few times the drift of a DeltaNet output after
 * four layers. The checks of a rounding decision follow from it: an element's q within ½ +
 * INT8_X_DRIFT·max|row|/d steps of x/d, a chunk's d within {@linkcode INT8_D_RTOL} of max|x|/127 plus
 * INT8_X_DRIFT·max|row|/127. History: a slack of 1e-3 steps (8e-6 of the chunk's max|x|) failed once in a
 * clean-clone run on a random tiny model (2026-12-05: layer 2's ssm_out input, x/d = 66.501 rounded to 66,
 * 8.2e-6 of max|x| past the half); a scale tolerance relative to the chunk alone failed once (2026-12-06,
 * clean-clone run at 7c1bab6: layer 2's ssm_out input, a chunk of values near zero, d 1.10906e-6 against
 * 1.10958e-6, relative 4.7e-4): the drift of a small element is set by the row's scale, not its own. A wrong
 * rounding rule (floor, a scale off by one step, the wrong chunk's max) is off by up to a whole step in every
 * chunk, and most chunks' max|x| is near the row's.
 */
export const INT8_X_DRIFT = 2e-5;
/** Relative tolerance of an engine's chunk scale against this model's max|x|/127 (beside the row's drift). */
export const INT8_D_RTOL = 1e-4;

/**
 * x as `quantize_q8` leaves it: per 32-element chunk d = max|x| / 127, each element d·round(x / d) (ties to
 * even, within ±127), in float64.
 */
export function roundQ8(x: ArrayLike<number>): Float64Array {
  const out = new Float64Array(x.length);
  for (let c = 0; c < x.length; c += 32) {
    let amax = 0;
    for (let i = c; i < c + 32; i++) amax = Math.max(amax, Math.abs(x[i]!));
    const d = amax / 127;
    for (let i = c; i < c + 32; i++) {
      if (d === 0) continue;
      const v = x[i]! / d;
      let q = Math.round(v);
      if (Math.abs(v - Math.trunc(v)) === 0.5 && q % 2 !== 0) q -= 1; // ties to even
      out[i] = d * Math.max(-127, Math.min(127, q));
    }
  }
  return out;
}

/** Dequantized weights of one layer (absent entries belong to the other layer kind or layout). */
type LayerWeights = Partial<Record<TensorId, Float64Array>>;

/** Per-sequence state of one layer (the arrays a snapshot copies). */
export interface RefLayerState {
  /** Attention: rotated keys, `ne=[headDim, nHeadKv, nPast]` as a list of per-position rows. */
  k: Float64Array[];
  /** Attention: values, same layout as `k`. */
  v: Float64Array[];
  /** DeltaNet: the previous ssmConv − 1 conv inputs, oldest first, `ne=[C, ssmConv − 1]`. */
  conv: Float64Array;
  /** DeltaNet: recurrent state, `ne=[dK, dV, nV]` (transposed per head, see `deltaNetStep`). */
  ssm: Float64Array;
}

/** A copy of a model's per-sequence state (see {@linkcode RefModel.snapshot}). */
export interface RefState {
  /** Positions consumed so far. */
  readonly nPast: number;
  /** Per layer of the range, deep copies. */
  readonly layers: readonly RefLayerState[];
}

/**
 * A whole model (or a layer range of it) in float64, with one sequence's state.
 * @example
 * ```ts
 * const file = await openGguf("tiny-qwen3next.q8_0.gguf");
 * const model = await RefModel.load(file);
 * const logits = model.forward([1, 2, 3]); // one Float64Array(nVocab) per token
 * ```
 */
export class RefModel {
  /** Hyper-parameters of the file. */
  readonly hp: Hparams;
  /** The layer range `[a, b)` this model runs. */
  readonly layers: readonly [number, number];
  readonly #w: LayerWeights[];
  readonly #layouts: readonly (DeltaNetLayout | undefined)[];
  readonly #global: { embd?: Float64Array; outNorm?: Float64Array; output?: Float64Array };
  readonly #record: boolean;
  readonly #core: "recurrent" | "chunked";
  readonly #chunk: number;
  readonly #int8: boolean;
  readonly #int8Experts: boolean;
  readonly #kvF16: boolean;
  readonly #decisions: RefModelOptions["int8Decisions"];
  /** Weight type per `layer/id` (and `output`), for int8Activations. */
  readonly #types: ReadonlyMap<string, GgmlTypeName>;
  #state: RefLayerState[] = [];
  #nPast = 0;
  #rec = new Map<string, Float64Array[]>();

  private constructor(
    hp: Hparams,
    parts: {
      layers: readonly [number, number];
      w: LayerWeights[];
      layouts: readonly (DeltaNetLayout | undefined)[];
      global: { embd?: Float64Array; outNorm?: Float64Array; output?: Float64Array };
      opts: RefModelOptions;
      types: ReadonlyMap<string, GgmlTypeName>;
    },
  ) {
    this.hp = hp;
    this.layers = parts.layers;
    this.#w = parts.w;
    this.#layouts = parts.layouts;
    this.#global = parts.global;
    this.#record = parts.opts.record ?? false;
    this.#core = parts.opts.deltaNet ?? "recurrent";
    this.#chunk = parts.opts.chunk ?? 64;
    this.#int8 = parts.opts.int8Activations ?? false;
    this.#int8Experts = this.#int8 || (parts.opts.int8Experts ?? false);
    this.#kvF16 = parts.opts.kvF16 ?? false;
    this.#decisions = parts.opts.int8Decisions;
    this.#types = parts.types;
    this.reset();
  }

  /**
   * Reads hyper-parameters, checks the tensor list, and dequantizes every weight the layer range needs.
   * @throws {GgufError} when the file is not a valid model of a supported architecture
   * @throws {RangeError} when `layers` is not a range within `[0, nLayer]`
   */
  static async load(file: GgufFile, opts: RefModelOptions = {}): Promise<RefModel> {
    const arch = archOf(file.metadata);
    const read = arch.readHparams(file.metadata);
    const hp = opts.kvGroupOfVHead === undefined ? read : { ...read, kvGroupOfVHead: opts.kvGroupOfVHead };
    const check = arch.checkTensors(file, hp);
    const [a, b] = opts.layers ?? [0, hp.nLayer];
    if (!Number.isInteger(a) || !Number.isInteger(b) || a < 0 || b > hp.nLayer || a >= b) {
      throw new RangeError(
        `Layer range [${a}, ${b}) is not a range with 0 <= a < b <= nLayer = ${hp.nLayer}`,
      );
    }
    const load = async (name: string): Promise<Float64Array> => {
      const t = file.tensor(name);
      return dequantize(t.type.name as GgmlTypeName, await file.readTensor(name), t.nElems);
    };
    const global: { embd?: Float64Array; outNorm?: Float64Array; output?: Float64Array } = {};
    if (a === 0) global.embd = await load(tensorName("token_embd"));
    if (b === hp.nLayer) {
      global.outNorm = await load(tensorName("output_norm"));
      global.output = check.tiedOutput
        ? (global.embd ?? await load(tensorName("token_embd")))
        : await load(tensorName("output"));
    }
    const types = new Map<string, GgmlTypeName>();
    const typeOf = (name: string) => file.tensor(name).type.name as GgmlTypeName;
    if (b === hp.nLayer) {
      types.set("output", typeOf(tensorName(check.tiedOutput ? "token_embd" : "output")));
    }
    const w: LayerWeights[] = [];
    for (let layer = a; layer < b; layer++) {
      const lw: LayerWeights = {};
      for (const [name, spec] of check.specs) {
        if (spec.layer !== layer) continue;
        lw[spec.id] = await load(name);
        types.set(`${layer}/${spec.id}`, typeOf(name));
      }
      w.push(lw);
    }
    return new RefModel(hp, { layers: [a, b], w, layouts: check.layouts, global, opts, types });
  }

  /** Positions consumed since the last reset. */
  get nPast(): number {
    return this.#nPast;
  }

  /** Starts a new sequence: empty KV caches, zero conv and recurrent states. */
  reset(): void {
    const hp = this.hp;
    this.#nPast = 0;
    this.#state = [];
    for (let layer = this.layers[0]; layer < this.layers[1]; layer++) {
      const dn = !hp.isAttention[layer];
      this.#state.push({
        k: [],
        v: [],
        conv: new Float64Array(dn ? convChannels(hp) * (hp.ssmConv - 1) : 0),
        ssm: new Float64Array(dn ? hp.ssmState * hp.ssmState * hp.ssmDtRank : 0),
      });
    }
  }

  /** A deep copy of the per-sequence state, for {@linkcode RefModel.restore}. */
  snapshot(): RefState {
    return { nPast: this.#nPast, layers: this.#state.map(copyState) };
  }

  /** Returns to a state taken by {@linkcode RefModel.snapshot} (the snapshot stays reusable). */
  restore(s: RefState): void {
    if (s.layers.length !== this.#state.length) throw new RangeError(`Snapshot of another layer range`);
    this.#nPast = s.nPast;
    this.#state = s.layers.map(copyState);
  }

  /**
   * Runs tokens through the first stage (layer range starting at 0), advancing the state.
   * @returns per token: logits `ne=[nVocab]` when the range ends at the last layer, else hidden rows
   *   `ne=[nEmbd]`
   */
  forward(tokens: readonly number[]): Float64Array[] {
    const embd = this.#global.embd;
    if (embd === undefined) {
      throw new RangeError(`forward(tokens) needs a range starting at layer 0, this one is [${this.layers}]`);
    }
    const D = this.hp.nEmbd;
    const rows = tokens.map((t) => {
      if (!Number.isInteger(t) || t < 0 || t >= this.hp.nVocab) {
        throw new RangeError(`Token id ${t} is outside the vocabulary [0, ${this.hp.nVocab})`);
      }
      return embd.slice(t * D, (t + 1) * D);
    });
    return this.#run(rows);
  }

  /**
   * Runs hidden rows (the previous stage's output, `ne=[nEmbd]` each) through this layer range.
   * @returns logits or hidden rows, as {@linkcode RefModel.forward}
   */
  forwardHidden(rows: readonly Float64Array[]): Float64Array[] {
    for (const r of rows) {
      if (r.length !== this.hp.nEmbd) {
        throw new RangeError(`Hidden row of ${r.length}, want ${this.hp.nEmbd}`);
      }
    }
    return this.#run(rows.map((r) => Float64Array.from(r)));
  }

  /**
   * Rows (one per token) of intermediate `name` of `layer` from the last forward call; needs `record`.
   * @throws {RangeError} when nothing was recorded under that name and layer
   */
  intermediate(name: IntermediateName, layer: number): Float64Array[] {
    const rows = this.#rec.get(`${layer}/${name}`);
    if (rows === undefined) {
      throw new RangeError(
        `No intermediate ${name} of layer ${layer} was recorded (record: ${this.#record}, layers ` +
          `[${this.layers}]; ${name} exists only on its layer kind)`,
      );
    }
    return rows;
  }

  #put(name: IntermediateName, layer: number, rows: readonly Float64Array[]): void {
    if (this.#record) this.#rec.set(`${layer}/${name}`, rows.map((r) => Float64Array.from(r)));
  }

  /**
   * x as the mat-vec of weight `key` (`layer/id` or `output`) reads it for token `token` of the call:
   * int8-rounded under int8Activations (with the engine's decisions when given).
   */
  #x8(key: string, x: Float64Array, token: number): Float64Array {
    const t = this.#types.get(key);
    if (!this.#int8 || t === undefined || !MATVEC_Q8_TYPES.includes(t)) return x;
    if (!this.#decisions) return roundQ8(x);
    const [l, id] = key === "output" ? ["-1", "output"] : key.split("/");
    const source = id === "output"
      ? "head"
      : id === "attn_output"
      ? "attn_o"
      : id === "ssm_out"
      ? "ssm_o"
      : "in";
    return this.#decided({ layer: Number(l), source, token }, x, key);
  }

  /** x rounded as the engine decided at `at` (int8Decisions), each decision checked against x first. */
  #decided(at: Int8At, x: Float64Array, key: string): Float64Array {
    const { q, d } = this.#decisions!(at);
    const where = `int8 decision of layer ${at.layer} ${at.source} token ${at.token}` +
      `${at.slot === undefined ? "" : ` slot ${at.slot}`} (${key})`;
    if (q.length !== x.length || d.length !== x.length / 32) {
      throw new Error(`${where}: ${q.length} values and ${d.length} scales for ${x.length} elements`);
    }
    const out = new Float64Array(x.length);
    // The engine's x may differ from this x by the drift, in absolute terms the same over the whole row.
    let rowMax = 0;
    for (const v of x) rowMax = Math.max(rowMax, Math.abs(v));
    const drift = INT8_X_DRIFT * rowMax;
    for (let c = 0; c < x.length / 32; c++) {
      let amax = 0;
      for (let i = 32 * c; i < 32 * c + 32; i++) amax = Math.max(amax, Math.abs(x[i]!));
      const dc = d[c]!;
      if (!(Math.abs(dc - amax / 127) <= (INT8_D_RTOL * amax + drift) / 127 + 1e-30)) {
        throw new Error(`${where}: chunk ${c} scale ${dc} but max|x|/127 = ${amax / 127}`);
      }
      for (let i = 32 * c; i < 32 * c + 32; i++) {
        const want = dc === 0 ? 0 : x[i]! / dc;
        if (!(Math.abs(want - q[i]!) <= 0.5 + (dc === 0 ? 0 : drift / dc))) {
          throw new Error(`${where}: element ${i} is ${q[i]} but x/d = ${want}`);
        }
        out[i] = dc * q[i]!;
      }
    }
    return out;
  }

  #run(h: Float64Array[]): Float64Array[] {
    const hp = this.hp;
    this.#rec = new Map();
    const pos = h.map((_, i) => this.#nPast + i);
    for (let layer = this.layers[0]; layer < this.layers[1]; layer++) {
      const w = this.#w[layer - this.layers[0]]!;
      const st = this.#state[layer - this.layers[0]]!;
      const a = h.map((x) => rmsNorm(x, need(w, "attn_norm", layer), { eps: hp.rmsEps }));
      this.#put("attn_norm", layer, a);
      let mix: Float64Array[];
      if (hp.isAttention[layer]) {
        mix = this.#attention(layer, w, st, a, pos);
        this.#put("attn_out", layer, mix);
      } else {
        mix = this.#deltaNet(layer, w, st, a);
        this.#put("ssm_out", layer, mix);
      }
      h = h.map((x, t) => add(x, mix[t]!));
      this.#put("ffn_inp", layer, h);
      const m = h.map((x) => rmsNorm(x, need(w, "post_attention_norm", layer), { eps: hp.rmsEps }));
      this.#put("ffn_norm", layer, m);
      const f = m.map((x, t) => this.#moe(layer, w, x, t));
      this.#put("ffn_out", layer, f);
      h = h.map((x, t) => add(x, f[t]!));
      this.#put("l_out", layer, h);
    }
    this.#nPast += h.length;
    const { outNorm, output } = this.#global;
    if (outNorm === undefined || output === undefined) return h;
    return h.map((x, t) => matvec(output, this.#x8("output", rmsNorm(x, outNorm, { eps: hp.rmsEps }), t)));
  }

  /** Spec §7: q/gate interleaved per head, QK-norm, partial NeoX rope, causal GQA, sigmoid gate. */
  #attention(
    layer: number,
    w: LayerWeights,
    st: RefLayerState,
    a: Float64Array[],
    pos: number[],
  ): Float64Array[] {
    const hp = this.hp;
    const hd = hp.headDim;
    const nT = a.length;
    const q = new Float64Array(hd * hp.nHead * nT);
    const gate = new Float64Array(hd * hp.nHead * nT);
    const kNew = new Float64Array(hd * hp.nHeadKv * nT);
    const vNew = new Float64Array(hd * hp.nHeadKv * nT);
    for (let t = 0; t < nT; t++) {
      const qf = matvec(need(w, "attn_q", layer), this.#x8(`${layer}/attn_q`, a[t]!, t));
      for (let h = 0; h < hp.nHead; h++) {
        q.set(qf.subarray(2 * hd * h, 2 * hd * h + hd), (t * hp.nHead + h) * hd);
        gate.set(qf.subarray(2 * hd * h + hd, 2 * hd * (h + 1)), (t * hp.nHead + h) * hd);
      }
      kNew.set(matvec(need(w, "attn_k", layer), this.#x8(`${layer}/attn_k`, a[t]!, t)), t * hd * hp.nHeadKv);
      vNew.set(matvec(need(w, "attn_v", layer), this.#x8(`${layer}/attn_v`, a[t]!, t)), t * hd * hp.nHeadKv);
    }
    const rope = { headDim: hd, nRot: hp.ropeDim, base: hp.ropeBase, pos };
    const qr = ropeNeox(rmsNorm(q, need(w, "attn_q_norm", layer), { eps: hp.rmsEps, n: hd }), rope);
    const kr = ropeNeox(rmsNorm(kNew, need(w, "attn_k_norm", layer), { eps: hp.rmsEps, n: hd }), rope);
    const kvRow = hd * hp.nHeadKv;
    for (let t = 0; t < nT; t++) {
      const k = kr.slice(t * kvRow, (t + 1) * kvRow);
      const v = vNew.slice(t * kvRow, (t + 1) * kvRow);
      if (this.#kvF16) { for (const row of [k, v]) row.forEach((x, i) => row[i] = Math.f16round(x)); }
      st.k.push(k);
      st.v.push(v);
    }
    const o = attention(qr, {
      k: concat(st.k),
      v: concat(st.v),
      gate,
      headDim: hd,
      nHead: hp.nHead,
      nHeadKv: hp.nHeadKv,
      scale: hp.attnScale,
    });
    const out = need(w, "attn_output", layer);
    const qRow = hd * hp.nHead;
    return a.map((_, t) =>
      matvec(out, this.#x8(`${layer}/attn_output`, o.slice(t * qRow, (t + 1) * qRow), t))
    );
  }

  /** Spec §8: projections (per layout), conv + SiLU, L2 norms, gates, the DeltaNet core, gated norm, out. */
  #deltaNet(layer: number, w: LayerWeights, st: RefLayerState, a: Float64Array[]): Float64Array[] {
    const hp = this.hp;
    const nK = hp.ssmGroups, nV = hp.ssmDtRank, dK = hp.ssmState, dV = hp.ssmInner / nV, r = nV / nK;
    const C = convChannels(hp);
    const nT = a.length;
    const x = new Float64Array(C * nT);
    const z = new Float64Array(nV * dV * nT);
    const b = new Float64Array(nV * nT);
    const al = new Float64Array(nV * nT);
    const layout = this.#layouts[layer];
    for (let t = 0; t < nT; t++) {
      const ai = a[t]!;
      switch (layout) {
        case "ssm_in": {
          // §8.1 variant A: nK groups of [q_g | k_g | v_{rg..rg+r-1} | z_{rg..rg+r-1}]
          const p = matvec(need(w, "ssm_in", layer), this.#x8(`${layer}/ssm_in`, ai, t));
          const gs = 2 * dK + 2 * r * dV;
          for (let g = 0; g < nK; g++) {
            const o = g * gs;
            x.set(p.subarray(o, o + dK), t * C + g * dK);
            x.set(p.subarray(o + dK, o + 2 * dK), t * C + nK * dK + g * dK);
            x.set(p.subarray(o + 2 * dK, o + 2 * dK + r * dV), t * C + 2 * nK * dK + g * r * dV);
            z.set(p.subarray(o + 2 * dK + r * dV, o + gs), t * nV * dV + g * r * dV);
          }
          break;
        }
        case "qkv_ba":
        case "qkv_beta_alpha":
          x.set(matvec(need(w, "attn_qkv", layer), this.#x8(`${layer}/attn_qkv`, ai, t)), t * C);
          z.set(matvec(need(w, "attn_gate", layer), this.#x8(`${layer}/attn_gate`, ai, t)), t * nV * dV);
          break;
        case undefined:
          throw new Error(`Internal error: layer ${layer} is DeltaNet but has no layout`);
      }
      if (layout === "qkv_beta_alpha") {
        b.set(matvec(need(w, "ssm_beta", layer), this.#x8(`${layer}/ssm_beta`, ai, t)), t * nV);
        al.set(matvec(need(w, "ssm_alpha", layer), this.#x8(`${layer}/ssm_alpha`, ai, t)), t * nV);
      } else {
        // §8.1: nK groups of 2r: [b_{rg..rg+r-1} | a_{rg..rg+r-1}]
        const u = matvec(need(w, "ssm_ba", layer), this.#x8(`${layer}/ssm_ba`, ai, t));
        for (let g = 0; g < nK; g++) {
          for (let j = 0; j < r; j++) {
            b[t * nV + r * g + j] = u[2 * r * g + j]!;
            al[t * nV + r * g + j] = u[2 * r * g + r + j]!;
          }
        }
      }
    }
    // §8.3 conv + SiLU
    const cv = conv1dStep(x, { state: st.conv, w: need(w, "ssm_conv1d", layer), nCh: C });
    st.conv = cv.state;
    const y = cv.y.map(silu);
    this.#put("ssm_conv", layer, rowsOf(y, C));
    // §8.4 split and L2-normalize (q is scaled inside the core)
    const q = new Float64Array(dK * nK * nT);
    const k = new Float64Array(dK * nK * nT);
    const v = new Float64Array(dV * nV * nT);
    for (let t = 0; t < nT; t++) {
      q.set(y.subarray(t * C, t * C + nK * dK), t * nK * dK);
      k.set(y.subarray(t * C + nK * dK, t * C + 2 * nK * dK), t * nK * dK);
      v.set(y.subarray(t * C + 2 * nK * dK, (t + 1) * C), t * nV * dV);
    }
    // §8.2 gates
    const { beta, g } = deltaNetGates(b, {
      a: al,
      ssmA: need(w, "ssm_a", layer),
      dtBias: need(w, "ssm_dt", layer),
    });
    const core = this.#core === "chunked" ? deltaNetChunked : deltaNetStep;
    const res = core(st.ssm, {
      chunk: this.#chunk,
      dK,
      dV,
      nK,
      nV,
      kHeadOf: hp.kvGroupOfVHead,
      q: l2Norm(q, { eps: hp.rmsEps, n: dK }),
      k: l2Norm(k, { eps: hp.rmsEps, n: dK }),
      v,
      beta,
      g,
    });
    st.ssm = res.state;
    this.#put("ssm_core", layer, rowsOf(res.o, nV * dV));
    // §8.7 gated norm per value head, then the output projection
    const on = rmsNormGated(res.o, need(w, "ssm_norm", layer), { z, eps: hp.rmsEps, n: dV });
    const out = need(w, "ssm_out", layer);
    return rowsOf(on, nV * dV).map((row, t) => matvec(out, this.#x8(`${layer}/ssm_out`, row, t)));
  }

  /** Spec §10: routed top-k experts plus the sigmoid-gated shared expert. */
  #moe(layer: number, w: LayerWeights, m: Float64Array, token: number): Float64Array {
    // int8Activations or int8Experts: the gate·up pair and the down pair (routed and shared alike) round their
    // x when their weights are of a type the engine's moe_matvec_q8 passes read.
    const q8 = (id: string) => {
      const t = this.#types.get(`${layer}/${id}`);
      return this.#int8Experts && t !== undefined && MATVEC_Q8_TYPES.includes(t);
    };
    const round = (x: Float64Array, at: Int8At, key: string) =>
      this.#decisions ? this.#decided(at, x, key) : roundQ8(x);
    const x8 = {
      in: q8("ffn_gate_exps") && q8("ffn_up_exps")
        ? (x: Float64Array) => round(x, { layer, source: "moe_in", token }, `${layer}/ffn_gate_exps`)
        : undefined,
      act: q8("ffn_down_exps")
        ? (hid: Float64Array, slot: number) =>
          round(hid, { layer, source: "moe_act", token, slot }, `${layer}/ffn_down_exps`)
        : undefined,
    };
    return moeFfn(m, {
      x8,
      gateInp: need(w, "ffn_gate_inp", layer),
      gateExps: need(w, "ffn_gate_exps", layer),
      upExps: need(w, "ffn_up_exps", layer),
      downExps: need(w, "ffn_down_exps", layer),
      gateInpShexp: need(w, "ffn_gate_inp_shexp", layer),
      gateShexp: need(w, "ffn_gate_shexp", layer),
      upShexp: need(w, "ffn_up_shexp", layer),
      downShexp: need(w, "ffn_down_shexp", layer),
      nExpert: this.hp.nExpert,
      nUsed: this.hp.nExpertUsed,
      weightsScale: this.hp.expertWeightsScale,
    });
  }
}

/**
 * The first intermediate (layer by layer, then in {@linkcode INTERMEDIATE_ORDER}) where another forward's
 * rows differ from the reference's recording of the same call beyond `|got − want| <= atol + rtol·|want|`
 * (NaN never passes); undefined when every intermediate `got` provides agrees. `got` returns undefined for
 * intermediates the other forward does not expose, which are skipped.
 * @param ref a model loaded with `record: true`, after the forward call to compare
 */
export function firstMismatch(
  ref: RefModel,
  got: (name: IntermediateName, layer: number) => readonly ArrayLike<number>[] | undefined,
  tol: { atol: number; rtol: number },
): Mismatch | undefined {
  for (let layer = ref.layers[0]; layer < ref.layers[1]; layer++) {
    for (const name of INTERMEDIATE_ORDER) {
      const rows = got(name, layer);
      if (rows === undefined) continue;
      const want = ref.intermediate(name, layer);
      if (rows.length !== want.length) {
        throw new RangeError(
          `Intermediate ${name} of layer ${layer}: ${rows.length} rows, want ${want.length}`,
        );
      }
      for (let t = 0; t < want.length; t++) {
        const g = rows[t]!, w = want[t]!;
        if (g.length !== w.length) {
          throw new RangeError(
            `Intermediate ${name} of layer ${layer} row ${t}: ${g.length} values, want ${w.length}`,
          );
        }
        let first = -1, nBad = 0;
        for (let i = 0; i < w.length; i++) {
          if (!(Math.abs(g[i]! - w[i]!) <= tol.atol + tol.rtol * Math.abs(w[i]!))) {
            nBad++;
            if (first < 0) first = i;
          }
        }
        if (nBad > 0) return { layer, name, token: t, index: first, got: g[first]!, want: w[first]!, nBad };
      }
    }
  }
  return undefined;
}

function need(w: LayerWeights, id: TensorId, layer: number): Float64Array {
  const t = w[id];
  if (t === undefined) throw new Error(`Internal error: tensor ${tensorName(id, layer)} was not loaded`);
  return t;
}

function add(x: Float64Array, y: Float64Array): Float64Array {
  return x.map((v, i) => v + y[i]!);
}

function concat(rows: readonly Float64Array[]): Float64Array {
  const n = rows[0]?.length ?? 0;
  const out = new Float64Array(n * rows.length);
  rows.forEach((r, i) => out.set(r, i * n));
  return out;
}

function rowsOf(x: Float64Array, n: number): Float64Array[] {
  return Array.from({ length: x.length / n }, (_, t) => x.slice(t * n, (t + 1) * n));
}

function copyState(s: RefLayerState): RefLayerState {
  return {
    k: s.k.map((r) => r.slice()),
    v: s.v.map((r) => r.slice()),
    conv: s.conv.slice(),
    ssm: s.ssm.slice(),
  };
}
