/**
 * The gated attention block: q (with its gate), k and v projections, per-head q/k RMSNorm and RoPE with the
 * KV cache write, then prefill attention over the chunk or split-K decode attention (one dispatch over a
 * batched step's columns where the KV caches are pooled, else per slot), and the output projection into the
 * residual stream.
 * @module
 */
import type { Binding } from "../../wgsl/kernel.ts";
import {
  BATCH_TABLE_WORDS,
  type BuildContext,
  CHUNK_TABLE_OFFSET,
  column,
  GraphBuilder,
  type LayerWeights,
  MATVEC_MAX_COLS,
  padWords,
  part0,
  sub,
} from "../graph/builder.ts";
import { assert } from "../errors.ts";
import {
  columnProjections,
  fusedMatvec,
  matvec,
  matvecColumns,
  outProj,
  outProjQ8,
  q8Given,
  type Q8Target,
  soloSum,
} from "./linear.ts";
import {
  ATTN_QK_ROPE,
  attnQkRopeBindGroup,
  type AttnQkRopeConstants,
  attnQkRopeGrid,
  QK_ROPE_ONE_COLUMN,
} from "../../wgsl/attn_qk_rope.ts";
import {
  ATTN_DECODE,
  ATTN_DECODE_ONE_COLUMN,
  attnDecodeBindGroup,
  type AttnDecodeConstants,
  attnDecodeGrid,
} from "../../wgsl/attn_decode.ts";
import {
  ATTN_COMBINE,
  ATTN_COMBINE_NO_QX,
  attnCombineBindGroup,
  attnCombineColumnWords,
  type AttnCombineConstants,
  attnCombineGrid,
} from "../../wgsl/attn_combine.ts";
import {
  ATTN_PREFILL,
  attnPrefillBindGroup,
  attnPrefillConstants,
  attnPrefillGrid,
  attnPrefillOutNe,
} from "../../wgsl/attn_prefill.ts";
import {
  ATTN_PREFILL_COMBINE,
  attnPrefillCombineBindGroup,
  type AttnPrefillCombineConstants,
  attnPrefillCombineGrid,
} from "../../wgsl/attn_prefill_combine.ts";

/**
 * Most splits of the decode attention (the capacity of the partials buffers, 16 KiB per split for 35B-A3B):
 * at a 32k context 128 splits of 256 positions (8 tiles) give 256 workgroups. On the H200 (docs/PERF.md,
 * 2026-12-04) 128 splits of tiles of 64 ran 0.116 ms per layer at 32k against 0.147 for 256 of 32.
 */
export const ATTN_SPLITS = 128;

/**
 * Positions per tile of the decode attention (three barriers per tile; bench/attention.ts sweeps it). H200,
 * sixteenth session, `--decode-only --depths 32768 --sweep`: 128 splits of tiles of 32 (WG 256, KPT 1) 0.0999
 * ms per layer against 0.1122 for tiles of 64 (16: 0.0994; 256 splits of any tile 0.177 or more).
 */
export const ATTN_DECODE_TILE = 32;

/** Keys per invocation in attn_decode's q·k phase (2 halves its workgroup-memory reads; swept by the bench). */
export const ATTN_DECODE_KPT = 1;

/** Shortest decode split in positions (one tile): short contexts use few splits and combine few partials. */
export const ATTN_SPLIT_MIN = ATTN_DECODE_TILE;

/** Layer l's K and V cache pools (every slot at one stride), or undefined when the caches are per slot. */
function kvPools(cx: BuildContext, l: number) {
  const k = cx.states.pool(l, "k_cache");
  const v = cx.states.pool(l, "v_cache");
  if (k === undefined || v === undefined) return undefined;
  assert(k.strideBytes === v.strideBytes, "K and V caches share one slot stride");
  return { k, v };
}

/** Decode splits for a cache of `nCtx` positions: no more than its shortest splits can fill. */
export function attnSplits(nCtx: number): number {
  return Math.min(ATTN_SPLITS, Math.ceil(nCtx / ATTN_SPLIT_MIN));
}

/** Gated attention of layer l: q/k/v projections, q/k norms and RoPE, the KV cache write, attention, output. */
export async function attention(g: GraphBuilder, cx: BuildContext, l: number, lw: LayerWeights) {
  const hp = g.hp;
  const n = g.n;
  const A = cx.act;
  let qf: Binding = A.qf!;
  let k: Binding = A.k!;
  let v: Binding = A.v!;
  const nQf = 2 * hp.nHead * hp.headDim;
  const nKv = hp.nHeadKv * hp.headDim;
  const qkv = [lw.t("attn_q"), lw.t("attn_k"), lw.t("attn_v")];
  // A batched step, or a short chunk whose caches are pooled (its tokens run as a batched step's columns, below):
  // each column's [qf | k | v] in one column of inproj, `inCol` words apart (one mat-vec where the one-token
  // step fuses them); attn_qk_rope and attn_combine read the columns at that stride.
  const pools = kvPools(cx, l);
  let inCol = 0;
  if (cx.batch || (matvecColumns(g) && pools)) {
    inCol = padWords(nQf + 2 * nKv);
    const names = ["attn_q", "attn_k", "attn_v"];
    await columnProjections(g, l, "attn_in_proj", qkv, names, A.a!, A.inproj!, inCol);
    qf = sub(A.inproj!, 0, n * inCol);
    k = sub(A.inproj!, nQf, n * inCol - nQf);
    v = sub(A.inproj!, nQf + nKv, n * inCol - nQf - nKv);
  } else {
    const fused = await fusedMatvec(g, `L${l}.attn_in_proj`, qkv, A.a!, A.inproj!);
    // Mat-vec columns run them one by one, each summed as in the one-token step's fused mat-vec.
    const sum = (i: number) => soloSum(g, qkv, i);
    if (fused.length >= 2) {
      qf = sub(A.inproj!, 0, nQf);
      k = sub(A.inproj!, nQf, nKv);
    } else {
      await matvec(g, `L${l}.attn_q`, qkv[0]!, A.a!, A.qf!, n, { sum: sum(0) });
      await matvec(g, `L${l}.attn_k`, qkv[1]!, A.a!, A.k!, n, { sum: sum(1) });
    }
    if (fused.length === 3) v = sub(A.inproj!, nQf + nKv, nKv);
    else await matvec(g, `L${l}.attn_v`, qkv[2]!, A.a!, A.v!, n, { sum: sum(2) });
  }
  // A batched step's columns, or a chunk of a few tokens (drafts checked in one frame, a prompt's tail) as the
  // columns of a batched step on one slot (the chunk table, CHUNK_TABLE_OFFSET), so every token gets the bits
  // of a one-token step: RoPE writes every column's K/V first; column c then attends positions up to its own.
  if (cx.batch || (n >= 2 && n <= MATVEC_MAX_COLS && pools)) {
    const nQ = hp.nHead * hp.headDim;
    const nCol = cx.batch ? cx.batch.slots.length : n;
    const table: Binding = cx.batch?.table ??
      { buffer: cx.pos, offset: CHUNK_TABLE_OFFSET, size: 4 * BATCH_TABLE_WORDS * n };
    // Every column's qf, k and v: the batched in-projection's columns, or the chunk's tokens.
    const cq = inCol > 0 ? qf : sub(A.qf!, 0, nCol * nQf);
    const ck = inCol > 0 ? k : sub(A.k!, 0, nCol * nKv);
    const cv = inCol > 0 ? v : sub(A.v!, 0, nCol * nKv);
    // Column b of one of them, `words` long.
    let dc: AttnDecodeConstants | undefined;
    if (pools) {
      // RoPE with the KV write, then attn_decode: one dispatch each over every column (each column writes and
      // reads its slot's rows of the pooled caches, into its own region of the partials).
      const cols = { n: nCol, slots: cx.states.nSlots, kvCol: pools.k.strideBytes / 4, inCol };
      await qkRope(g, `L${l}.attn_qk_rope`, lw, cx, 1, {
        params: table,
        qf: cq,
        k: ck,
        v: cv,
        qOut: sub(A.q!, 0, nCol * nQ),
        kCache: pools.k.buffer,
        vCache: pools.v.buffer,
      }, cols);
      dc = await decodeSplits(g, `L${l}.attn_decode`, cx, {
        pos: table,
        q: sub(A.q!, 0, nCol * nQ),
        kCache: pools.k.buffer,
        vCache: pools.v.buffer,
      }, cols);
    }
    // Caches per slot (a batched step only): RoPE and attn_decode per slot on its column of q and its caches,
    // into the column's region of the partials. Then one combine over every column.
    for (const [b, slot] of (pools ? [] : cx.batch!.slots).entries()) {
      const kCache = cx.states.binding(slot, l, "k_cache");
      const vCache = cx.states.binding(slot, l, "v_cache");
      const qB = sub(A.q!, b * nQ, nQ);
      const pos = cx.batch!.pos[b]!;
      await qkRope(g, `L${l}.attn_qk_rope.${b}`, lw, cx, 1, {
        params: pos,
        qf: column(cq, b, inCol || nQf, nQf),
        k: column(ck, b, inCol || nKv, nKv),
        v: column(cv, b, inCol || nKv, nKv),
        qOut: qB,
        kCache,
        vCache,
      });
      dc = await decodeSplits(g, `L${l}.attn_decode.${b}`, cx, { pos, q: qB, kCache, vCache }, b);
    }
    // attn_output reads o as int8 x of the columns: the combine writes it (QX: a workgroup per 32 dims, o's
    // bits unchanged) where its chunks are whole, and attn_output skips its own quantize.
    const qx = hp.headDim % 32 === 0
      ? outProjQ8(g, `L${l}.attn_output`, lw.t("attn_output"), A.o!)
      : undefined;
    await combineSplits(
      g,
      `L${l}.attn_combine`,
      cx,
      dc!,
      {
        params: table,
        qf: cq,
        o: sub(A.o!, 0, nCol * nQ),
      },
      nCol,
      inCol || nQf,
      qx,
    );
    if (qx) q8Given(g, A.o!, lw.t("attn_output"), qx);
  } else {
    const kCache = cx.states.binding(cx.slot, l, "k_cache");
    const vCache = cx.states.binding(cx.slot, l, "v_cache");
    await qkRope(g, `L${l}.attn_qk_rope`, lw, cx, n, {
      params: cx.pos,
      qf,
      k,
      v,
      qOut: A.q!,
      kCache,
      vCache,
    });
    if (n === 1) {
      await attnDecode(g, `L${l}`, "", cx, { pos: cx.pos, q: A.q!, kCache, vCache, qf, o: A.o! });
    } else {
      // The variant is the first of attn_prefill's preferred list whose workgroup memory fits the device; key
      // splits (NS) where the chunk alone has few workgroups, merged by attn_prefill_combine.
      const pc = attnPrefillConstants(
        {
          H_Q: hp.nHead,
          H_KV: hp.nHeadKv,
          D_H: hp.headDim,
          P_MAX: cx.nCtx,
          SCALE: hp.attnScale,
          KV_F16: g.opts.kvF16,
        },
        { maxWorkgroupBytes: g.device.limits.maxComputeWorkgroupStorageSize, nTokens: n },
      );
      const partWords = attnPrefillOutNe(pc, n).reduce((a, x) => a * x, 1);
      const part = pc.NS > 1 ? g.grown("attn_prefill partials", 4 * partWords) : undefined;
      await g.checked(
        `L${l}.attn_prefill`,
        ATTN_PREFILL,
        pc,
        (pipeline) =>
          attnPrefillBindGroup(g.device, {
            pipeline,
            constants: pc,
            nTokens: n,
            buffers: { params: cx.pos, q: A.q!, qf, kCache, vCache, o: part ?? A.o! },
          }),
        attnPrefillGrid(pc, n),
      );
      if (part) {
        const cc: AttnPrefillCombineConstants = { H_Q: hp.nHead, D_H: hp.headDim, NS: pc.NS, WG: 256 };
        await g.checked(
          `L${l}.attn_prefill_combine`,
          ATTN_PREFILL_COMBINE,
          cc,
          (pipeline) =>
            attnPrefillCombineBindGroup(g.device, {
              pipeline,
              constants: cc,
              nTokens: n,
              buffers: { params: cx.pos, part, qf, o: A.o! },
            }),
          attnPrefillCombineGrid(cc, n),
        );
      }
    }
  }
  await outProj(g, `L${l}.attn_output`, lw.t("attn_output"), A.o!, A.t!, A.h!);
}

/**
 * q/k norms, RoPE and the KV cache write of `nTokens` tokens; with `cols`, one token of each of `cols.n`
 * columns of a batched step (params: the column table; caches: the pools of `cols.slots` slots at `kvCol`
 * words).
 */
export async function qkRope(
  g: GraphBuilder,
  label: string,
  lw: LayerWeights,
  cx: BuildContext,
  nTokens: number,
  buffers: {
    params: Binding;
    qf: Binding;
    k: Binding;
    v: Binding;
    qOut: Binding;
    kCache: Binding;
    vCache: Binding;
  },
  cols?: { n: number; slots: number; kvCol: number; inCol: number },
) {
  const hp = g.hp;
  const rope: AttnQkRopeConstants = {
    H_Q: hp.nHead,
    H_KV: hp.nHeadKv,
    D_H: hp.headDim,
    N_ROT: hp.ropeDim,
    P_MAX: cx.nCtx,
    WG: 64,
    ROPE_THETA: hp.ropeBase,
    EPS: hp.rmsEps,
    KV_F16: g.opts.kvF16,
    ...(cols ? { P_COL: BATCH_TABLE_WORDS, KV_COL: cols.kvCol, IN_COL: cols.inCol } : QK_ROPE_ONE_COLUMN),
  };
  await g.checked(
    label,
    ATTN_QK_ROPE,
    rope,
    (pipeline) =>
      attnQkRopeBindGroup(g.device, {
        pipeline,
        constants: rope,
        nTokens,
        buffers: {
          ...buffers,
          qNorm: part0(lw.t("attn_q_norm")),
          kNorm: part0(lw.t("attn_k_norm")),
        },
        cols: cols?.n,
        slots: cols?.slots,
      }),
    attnQkRopeGrid(rope, nTokens, cols?.n),
  );
}

/** Split-K decode attention of one token and the combine of its splits (with the output gate). */
export async function attnDecode(
  g: GraphBuilder,
  label: string,
  suffix: string,
  cx: BuildContext,
  x: { pos: Binding; q: Binding; kCache: Binding; vCache: Binding; qf: Binding; o: Binding },
) {
  const dc = await decodeSplits(g, `${label}.attn_decode${suffix}`, cx, x);
  await combineSplits(g, `${label}.attn_combine${suffix}`, cx, dc, { params: x.pos, qf: x.qf, o: x.o });
}

/**
 * attn_decode of one token into the partials, or into column `col`'s region of them (a batched step's,
 * laid out as `attnCombineColumnWords` says), or with `col` the columns of a batched step in one dispatch
 * (pos: the column table; q: every column's; caches: the pools of `col.slots` slots at `kvCol` words; each
 * column into its region); returns its constants.
 */
async function decodeSplits(
  g: GraphBuilder,
  label: string,
  cx: BuildContext,
  x: { pos: Binding; q: Binding; kCache: Binding; vCache: Binding },
  col?: number | { n: number; slots: number; kvCol: number },
): Promise<AttnDecodeConstants> {
  const hp = g.hp;
  const A = cx.act;
  const dc: AttnDecodeConstants = {
    H_Q: hp.nHead,
    H_KV: hp.nHeadKv,
    D_H: hp.headDim,
    P_MAX: cx.nCtx,
    N_SPLIT: attnSplits(cx.nCtx),
    TILE: ATTN_DECODE_TILE,
    PER_MIN: ATTN_SPLIT_MIN,
    WG: 256,
    SCALE: hp.attnScale,
    KV_F16: g.opts.kvF16,
    KPT: ATTN_DECODE_KPT,
    ...(typeof col === "object" ? { P_COL: BATCH_TABLE_WORDS, KV_COL: col.kvCol } : ATTN_DECODE_ONE_COLUMN),
  };
  const cols = typeof col === "object" ? col : undefined;
  let partO: Binding = A.partO!;
  let partMl: Binding = A.partMl!;
  if (typeof col === "number") {
    const w = attnCombineColumnWords(combineConstants(dc));
    partO = sub(A.partO!, col * w.partO, dc.D_H * dc.H_Q * dc.N_SPLIT);
    partMl = sub(A.partMl!, col * w.partMl, 2 * dc.H_Q * dc.N_SPLIT);
  }
  await g.checked(
    label,
    ATTN_DECODE,
    dc,
    (pipeline) =>
      attnDecodeBindGroup(g.device, {
        pipeline,
        constants: dc,
        buffers: { params: x.pos, q: x.q, kCache: x.kCache, vCache: x.vCache, partO, partMl },
        cols: cols?.n,
        slots: cols?.slots,
      }),
    attnDecodeGrid(dc, cols?.n),
  );
  return dc;
}

/** The combine constants that go with attn_decode's. */
function combineConstants(dc: AttnDecodeConstants, qfCol = 2 * dc.H_Q * dc.D_H): AttnCombineConstants {
  return {
    H_Q: dc.H_Q,
    D_H: dc.D_H,
    N_SPLIT: dc.N_SPLIT,
    TILE: dc.TILE,
    PER_MIN: dc.PER_MIN,
    WG: 256,
    CD: 16,
    QF_COL: qfCol,
    ...ATTN_COMBINE_NO_QX,
  };
}

/**
 * attn_combine of one token, or of `cols` columns in one dispatch (params: the batched step's column table;
 * each column's partials where `decodeSplits` put them; o holds the columns as tokens, qf `qfCol` words
 * apart).
 */
async function combineSplits(
  g: GraphBuilder,
  label: string,
  cx: BuildContext,
  dc: AttnDecodeConstants,
  x: { params: Binding; qf: Binding; o: Binding },
  cols = 1,
  qfCol = 2 * dc.H_Q * dc.D_H,
  qx?: Q8Target,
) {
  const A = cx.act;
  const cc: AttnCombineConstants = {
    ...combineConstants(dc, qfCol),
    ...(qx ? { QX: true, LAYOUT: qx.layout } : ATTN_COMBINE_NO_QX),
  };
  await g.checked(
    qx ? `${label}+q8` : label,
    ATTN_COMBINE,
    cc,
    (pipeline) =>
      attnCombineBindGroup(g.device, {
        pipeline,
        constants: cc,
        buffers: {
          params: x.params,
          partO: A.partO!,
          partMl: A.partMl!,
          qf: x.qf,
          o: x.o,
          xq: qx?.binding ?? g.scratch(),
        },
        cols,
      }),
    attnCombineGrid(cc, cols),
  );
}
