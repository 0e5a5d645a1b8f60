/**
 * The layer loop both architectures share (spec `qwen3next.md` §3): a hybrid stack of gated DeltaNet and
 * gated attention mixers, each followed by an MoE block with a shared expert. The architectures differ only
 * in their DeltaNet input projections ({@linkcode HybridModel}), which each keeps in its own file.
 * @module
 */
import type { DeltaNetLayout, Hparams } from "./_arch.ts";
import {
  type BuildContext,
  GraphBuilder,
  type Op,
  padWords,
  part0,
  sub,
  typeName,
} from "../graph/builder.ts";
import { attention } from "../blocks/attention.ts";
import { deltaNet, type DeltaNetInputsOf } from "../blocks/deltanet.ts";
import { matvec, outProjAdds } from "../blocks/linear.ts";
import { moe, moeTakesNorm } from "../blocks/moe.ts";
import { norm, residual } from "../blocks/norm.ts";
import { GET_ROWS, getRowsConstants, getRowsGrid, getRowsParams } from "../../wgsl/get_rows.ts";

/** What an architecture adds to the shared layer loop. */
export interface HybridModel {
  /** The DeltaNet input projections of one layer (its tensors and their packing). */
  readonly deltaNetInputs: DeltaNetInputsOf;
  /**
   * The row order to upload a DeltaNet layer's input projection in, when the file's differs from the
   * canonical one the kernels read (qwen3next's legacy `ssm_in`): source row of each canonical row.
   */
  readonly inProjRowOrder?: (hp: Hparams, layout: DeltaNetLayout) => Uint32Array | undefined;
}

/**
 * Builds the dispatch list of one chunk (or batched step) of `g.n` tokens over `cx`'s layers: the embedding
 * (first stage), each layer's norm → mixer (attention or DeltaNet) → residual + norm → MoE, and the output
 * norm and LM head (last stage, when rows are wanted).
 */
export async function buildHybrid(g: GraphBuilder, cx: BuildContext, model: HybridModel): Promise<Op[]> {
  const hp = g.hp;
  const n = g.n;
  const A = cx.act;
  if (cx.embd && cx.batch) {
    // One row per slot, from the id its previous step's argmax or sampler wrote.
    const shape = { type: typeName(cx.embd), k: hp.nEmbd, n: hp.nVocab, nTokens: 1 };
    const c = getRowsConstants(shape);
    const params = g.storage(getRowsParams(shape));
    for (const [b, tok] of cx.batch.tok.entries()) {
      await g.push(`get_rows.${b}`, GET_ROWS, c, [
        params,
        tok,
        part0(cx.embd),
        sub(A.h!, b * hp.nEmbd, hp.nEmbd),
      ], getRowsGrid(shape));
    }
  } else if (cx.embd) {
    const shape = { type: typeName(cx.embd), k: hp.nEmbd, n: hp.nVocab, nTokens: n };
    const c = getRowsConstants(shape);
    await g.push("get_rows", GET_ROWS, c, [
      g.storage(getRowsParams(shape)),
      A.tokens!,
      part0(cx.embd),
      A.h!,
    ], getRowsGrid(shape));
  }
  // Decode (n = 1): every norm rides on the mat-vec that reads it (matvec NORM: x = h, the normed rows
  // written for the block's other readers) and each output projection adds into h itself (ACC), so no norm
  // and no residual add has a dispatch of its own. Other mat-vec columns (a batched step, a short chunk): the
  // output projections add into h too, each norm a dispatch. Prefill: each norm but the stage's first rides
  // on the residual add before it (residual_add NORM).
  const decode = n === 1;
  // Rows whose residual adds also write the next norm (StageOptions.combineNormMinRows); fewer rows (and
  // decode) get each norm on its own: deferred into a mat-vec's prologue at decode, a dispatch otherwise.
  const fuseNorms = n >= g.opts.combineNormMinRows; // never at decode: the option is at least 2
  const head = cx.outNorm !== undefined && cx.lmHead !== undefined && cx.rows !== "none";
  // The fused output norm writes every row in place; the LM head reads from row 0, so fuse it only when
  // that is the row it wants.
  const fuseOutNorm = head && fuseNorms && cx.rows === "all";
  for (const [i, lw] of cx.layers.entries()) {
    const l = cx.firstLayer + i;
    if (i === 0 || !fuseNorms) await norm(g, `L${l}.attn_norm`, A.h!, lw.t("attn_norm"), A.a!);
    if (lw.attention) await attention(g, cx, l, lw);
    else await deltaNet(g, cx, l, lw, model.deltaNetInputs);
    // Where the router and the routing take the post-attention norm (moeTakesNorm), nothing writes its rows.
    const postNorm = !moeTakesNorm(g, lw);
    if (outProjAdds(g)) {
      if (postNorm) await norm(g, `L${l}.post_attention_norm`, A.h!, lw.t("post_attention_norm"), A.m!);
    } else if (!fuseNorms || !postNorm) {
      await residual(g, `L${l}.residual_mixer`, A.t!, A.h!);
      if (postNorm) await norm(g, `L${l}.post_attention_norm`, A.h!, lw.t("post_attention_norm"), A.m!);
    } else {
      await residual(g, `L${l}.residual_mixer+post_attention_norm`, A.t!, A.h!, {
        w: lw.t("post_attention_norm"),
        y: A.m!,
      });
    }
    const next = cx.layers[i + 1];
    const nextNorm = !fuseNorms
      ? undefined
      : next
      ? { w: next.t("attn_norm"), y: A.a! }
      : fuseOutNorm
      ? { w: cx.outNorm!, y: A.a! }
      : undefined;
    await moe(g, cx, l, lw, nextNorm);
    g.onLayer?.(g.ops);
  }
  // Every row (decode, a batched step): the output norm as every block's, deferred where the LM head's
  // mat-vec (or its int8 quantize over the columns) takes it.
  const everyRow = decode || cx.rows === "all";
  if (head && everyRow && !fuseOutNorm) await norm(g, "output_norm", A.h!, cx.outNorm!, A.a!);
  // The last row alone (a prompt's chunk): normed into row 0, which the LM head reads.
  if (head && !everyRow) {
    await g.rmsNorm("output_norm", sub(A.h!, (n - 1) * hp.nEmbd, hp.nEmbd), cx.outNorm!, A.a!, 1);
  }
  if (head) {
    // A batched step's logits rows start 256-byte aligned: each slot's sampler binds its own row.
    await matvec(g, "output", cx.lmHead!, A.a!, A.logits!, cx.rows === "all" ? n : 1, {
      yStride: cx.batch ? padWords(hp.nVocab) : undefined,
    });
  }
  return g.ops;
}
