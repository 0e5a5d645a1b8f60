/**
 * The MoE block: the router (with the shared expert's gate row), the top-k routing, the routed experts and the
 * shared expert (packed as one more expert where the file allows: one dispatch per pass), and the weighted
 * combine into the residual stream that also writes the next block's norm. Decode and short chunks run the
 * expert mat-vecs (f32 or int8 x); prefill chunks the same kernels with prefill constants, or with
 * groupedExperts the chunk's columns grouped by expert and run as grouped matmuls.
 * @module
 */
import type { Binding } from "../../wgsl/kernel.ts";
import type { GpuTensor } from "../gpu/weights.ts";
import type { GgmlTypeName } from "../quant/types.ts";
import { assert } from "../errors.ts";
import {
  type BuildContext,
  type FusedNorm,
  GraphBuilder,
  type LayerWeights,
  part0,
  sub,
  typeName,
} from "../graph/builder.ts";
import { fusedMatvec, fusesAll, matvec, roundX } from "./linear.ts";
import { normConstants } from "./norm.ts";
import {
  checkGroupedMatmul,
  groupedMatmulConstants,
  groupedMatmulFits,
  groupedMatmulGrid,
  groupedMatmulParams,
  type GroupedMatmulShape,
  MOE_MATMUL,
} from "../../wgsl/moe_matmul.ts";
import {
  checkGroupedMatvec,
  groupedMatvecConstants,
  groupedMatvecGrid,
  MOE_GMV,
} from "../../wgsl/moe_gmv.ts";
import {
  checkMoeGroup,
  MOE_GROUP,
  moeGroupGrid,
  moeGroupParams,
  type MoeGroupShape,
  moeGroupWords,
} from "../../wgsl/moe_group.ts";
import { MATVEC_Q8_TYPES, q8Layout } from "../../wgsl/matvec_q8.ts";
import {
  MOE_MATVEC,
  moeMatvecConstants,
  moeMatvecGrid,
  moeMatvecParams,
  type MoeMatvecShape,
} from "../../wgsl/moe_matvec.ts";
import {
  checkMoeMatvecQ8,
  MOE_MATVEC_Q8,
  type MoeMatvecQ8Bindings,
  moeMatvecQ8Constants,
  moeMatvecQ8Fits,
  moeMatvecQ8Grid,
} from "../../wgsl/moe_matvec_q8.ts";
import {
  MOE_ROUTE,
  moeRouteBindGroup,
  type MoeRouteConstants,
  moeRouteGrid,
  moeRouteWorkgroupBytes,
  moeWeightsScale,
} from "../../wgsl/moe_route.ts";
import { RESIDUAL_ADD, type ResidualAddConstants, residualAddGrid } from "../../wgsl/residual_add.ts";

/**
 * Most mat-vec columns whose router takes the deferred post-attention norm in grid z (each column a one-token
 * step's dispatch). On an H100 8 slots ran 955-957 tok/s so against 949-950 with the norm's own dispatch,
 * 16 slots 1,184-1,187 against 1,191-1,199: sixteen columns' workgroups re-reading the router's weights and
 * re-summing their norms cost more than the dispatch saved (docs/PERF.md, 2026-12-06).
 */
export const ROUTER_Z_NORM_MAX_COLS = 8;

/** Workgroup size of moe_route: one expert per invocation (the rank count is a serial loop over all experts). */
const MOE_ROUTE_WG = 256;

/** Fewest routed tokens per expert on average at which thin prefill chunks run grouped mat-vecs (moe_gmv). */
const GROUPED_MATVEC_MIN_TOKENS_PER_EXPERT = 4;

type ExpertSet = { gate: GpuTensor; up: GpuTensor; down: GpuTensor };

function routedExperts(lw: LayerWeights): ExpertSet {
  return { gate: lw.t("ffn_gate_exps"), up: lw.t("ffn_up_exps"), down: lw.t("ffn_down_exps") };
}

function sharedExpert(lw: LayerWeights): ExpertSet {
  return { gate: lw.t("ffn_gate_shexp"), up: lw.t("ffn_up_shexp"), down: lw.t("ffn_down_shexp") };
}

/** Whether the shared expert's tensors follow the routed ones in their buffers: one expert more per pass. */
function sharedPacked(exps: ExpertSet, shexp: ExpertSet): boolean {
  const follows = (a: GpuTensor, b: GpuTensor) =>
    a.parts.length === 1 && b.parts.length === 1 && a.parts[0]!.buffer === b.parts[0]!.buffer &&
    b.parts[0]!.offsetBytes === a.parts[0]!.offsetBytes + a.parts[0]!.sizeBytes;
  return follows(exps.gate, shexp.gate) && follows(exps.up, shexp.up) && follows(exps.down, shexp.down);
}

/**
 * Whether moe_route rounds each token's x for the gate·up passes (int8Experts): the passes take int8 x, the
 * routing has a dispatch of its own, and its workgroup memory holds the token's x (with `norm`, the norm's
 * sums too).
 */
function routeRoundsX(g: GraphBuilder, exps: ExpertSet, norm: boolean): boolean {
  const hp = g.hp;
  const bytes = moeRouteWorkgroupBytes({
    N_EXPERT: hp.nExpert,
    N_EXPERT_USED: hp.nExpertUsed,
    KC: hp.nEmbd / 32,
    NORM: norm,
    WG: MOE_ROUTE_WG,
  });
  return g.opts.int8Experts && g.n <= g.maxCols && !(g.n === 1 && g.opts.fuseDecodeRoute) &&
    bytes <= g.device.limits.maxComputeWorkgroupStorageSize &&
    moeMatvecQ8Fits(gateUpShape(g, exps, hp.nExpertUsed, g.n, hp.nExpert, false));
}

/**
 * Whether layer lw's MoE block takes the post-attention norm into its router and routing, so that the norm
 * has no dispatch (nor mat-vec prologue) of its own. The router's mat-vec reads h times the norm weight
 * (matvec NORM 2: W·(h ⊙ w)); moe_route (NORM) sums each token's h², scales its logits by the norm's scale s
 * (the shared expert's gate logit in place) and rounds the normed row h·s·w for the gate·up passes, so
 * nothing reads a normed f32 row. Needs int8 x for every gate·up pass from moe_route, the router fused
 * with the shared expert's gate, and no routing fused into gate·up (fuseDecodeRoute) at any width.
 * Why: a batched step's norm had a dispatch of its own past 8 columns (0.41 of a 14.2 GPU-ms 16-slot step
 * on the H100), up to 8 columns grid-z routers that read the router's weights once per column, and summing
 * the norm in the router's prologue in rms_norm's order cost more than the dispatch (docs/PERF.md, the
 * thirtieth and fortieth sessions). The logits differ from the norm-first form's by f32 rounding. The rule
 * depends on the options and the model, not on the width up to the mat-vec columns: batched steps keep
 * their solo bits.
 */
export function moeTakesNorm(g: GraphBuilder, lw: LayerWeights): boolean {
  if (g.opts.fuseDecodeRoute || !g.opts.routerTakesNorm) return false;
  const exps = routedExperts(lw);
  if (!routeRoundsX(g, exps, true)) return false;
  if (!fusesAll([lw.t("ffn_gate_inp"), lw.t("ffn_gate_inp_shexp")])) return false;
  const shexp = sharedExpert(lw);
  if (sharedPacked(exps, shexp)) return true;
  // A shared expert of its own: its gate·up pass must take moe_route's int8 x too (experts()).
  return moeMatvecQ8Fits(gateUpShape(g, shexp, 1, g.n, 1, false)) &&
    q8Layout(typeName(shexp.gate)) === q8Layout(typeName(exps.gate));
}

/** The MoE block of layer l; `norm`: the next block's norm, written by the combine. */
export async function moe(
  g: GraphBuilder,
  cx: BuildContext,
  l: number,
  lw: LayerWeights,
  norm: FusedNorm | undefined,
) {
  const hp = g.hp;
  const n = g.n;
  const A = cx.act;
  const K = hp.nExpertUsed;
  const routerWs = [lw.t("ffn_gate_inp"), lw.t("ffn_gate_inp_shexp")];
  const exps = routedExperts(lw);
  // The post-attention norm in the router and the routing (moeTakesNorm): the router reads h times the
  // norm's weight, moe_route applies each token's scale, and nothing writes the normed rows A.m.
  const takesNorm = moeTakesNorm(g, lw);
  const x = takesNorm ? A.h! : A.m!;
  const postNorm = lw.t("post_attention_norm");
  // Otherwise the router reads A.m and keeps f32 x under int8Experts: a deferred norm rides on this
  // mat-vec, and the expert passes round A.m themselves (moe_matvec_q8 XIN). Mat-vec columns (a batched
  // step, a short chunk) fuse too: each column's nExpert logits and then its shared expert's gate logit (one
  // dispatch less per layer; TEAM follows K and N, 257 rows either way, so every column keeps the bits of a
  // one-token step). A deferred norm rides on it for up to ROUTER_Z_NORM_MAX_COLS mat-vec columns too: the
  // columns in grid z, each a one-token step's dispatch with the norm in its prologue, instead of a norm
  // dispatch of its own and one mat-vec reading the router's weights once for all columns.
  const col = hp.nExpert + 1;
  const zNorm = n <= ROUTER_Z_NORM_MAX_COLS && !takesNorm;
  const routerFused = await fusedMatvec(
    g,
    takesNorm ? `L${l}.ffn_gate_inp+shexp+post_attention_norm` : `L${l}.ffn_gate_inp+shexp`,
    routerWs,
    x,
    A.router!,
    { f32: true, yStride: col, zNorm, weightNorm: takesNorm ? postNorm : undefined },
  );
  assert(
    !takesNorm || routerFused.length === 2,
    `L${l}: the router takes the norm only fused with shexp's gate`,
  );
  if (routerFused.length === 0) {
    await matvec(g, `L${l}.ffn_gate_inp`, routerWs[0]!, A.m!, A.router!, n, { f32: true, zNorm });
  }
  // The shared expert's gate logit: row nExpert of each column of the fused router output (stride col), or
  // its own mat-vec's.
  const fusedGam = routerFused.length === 2;
  const logitsCol = fusedGam ? col : hp.nExpert;
  const gam: Binding = fusedGam ? sub(A.router!, hp.nExpert, (n - 1) * col + 1) : A.gam!;
  const gCol = fusedGam ? col : 1;
  // The routing (softmax, top-k, weights) runs in a moe_route dispatch of its own. With fuseDecodeRoute,
  // decode runs it in the prologue of the routed gate·up pass instead (moe_matvec ROUTE, which writes ids and
  // weights for the down pass and the combine): one dispatch less, but every gate·up workgroup repeats the
  // ranking (measured slower on the H200, StageOptions.fuseDecodeRoute). Prefill never fuses: every workgroup
  // of the n·K columns would repeat it (route+gate·up 6.0 ms per layer for a 256-token chunk, docs/PERF.md).
  const route = {
    logits: A.router!,
    weights: A.wts!,
    nExpert: hp.nExpert,
    nExpertUsed: K,
    wScale: moeWeightsScale(hp.expertWeightsScale),
  };
  const fuseRoute = n === 1 && g.opts.fuseDecodeRoute;
  // int8Experts: moe_route also rounds each token's x for the gate·up passes that read int8 x (once,
  // instead of in every gate·up workgroup's prologue), where its workgroup memory holds the token's x.
  const xq8 = takesNorm || routeRoundsX(g, exps, false)
    ? {
      type: typeName(exps.gate),
      binding: g.q8Region(`L${l}.ffn_exps.gate_up`, hp.nEmbd, typeName(exps.gate), n, "in"),
    }
    : undefined;
  if (!fuseRoute) {
    const rc: MoeRouteConstants = {
      N_EXPERT: hp.nExpert,
      N_EXPERT_USED: K,
      WG: MOE_ROUTE_WG,
      W_SCALE: route.wScale,
      XQ: xq8 !== undefined,
      KC: xq8 ? hp.nEmbd / 32 : 1,
      LAYOUT: xq8 ? q8Layout(xq8.type) : 0,
      NORM: takesNorm,
      EPS: takesNorm ? hp.rmsEps : 0,
      LOGITS_COL: logitsCol,
    };
    await g.checked(
      takesNorm ? `L${l}.moe_route+post_attention_norm` : `L${l}.moe_route`,
      MOE_ROUTE,
      rc,
      (pipeline) =>
        moeRouteBindGroup(g.device, {
          pipeline,
          constants: rc,
          nTokens: n,
          buffers: {
            logits: A.router!,
            ids: A.ids!,
            weights: A.wts!,
            // Without XQ any read-only buffer: the router's weights.
            x: xq8 ? x : part0(routerWs[0]!),
            xq: xq8?.binding ?? g.scratch(),
            nw: part0(postNorm),
          },
        }),
      moeRouteGrid(n),
    );
  }
  const shexp = sharedExpert(lw);
  const fused = sharedPacked(exps, shexp);
  // Shared activations and outputs follow the routed ones: columns [K·n, (K+1)·n) of act and eo.
  let sho: Binding = { buffer: A.eo!, offset: 4 * hp.nEmbd * K * n, size: 4 * hp.nEmbd * n };
  if (fused) {
    await experts(g, `L${l}.ffn_exps+shexp`, {
      ...exps,
      ids: A.ids!,
      used: K,
      act: A.act!,
      out: A.eo!,
      nFf: hp.nFfExp,
      nExpert: hp.nExpert,
      shared: true,
      route: fuseRoute ? route : undefined,
      xq8,
    }, cx);
  } else {
    await experts(g, `L${l}.ffn_exps`, {
      ...exps,
      ids: A.ids!,
      used: K,
      act: A.act!,
      out: A.eo!,
      nFf: hp.nFfExp,
      nExpert: hp.nExpert,
      shared: false,
      route: fuseRoute ? route : undefined,
      xq8,
    }, cx);
    await experts(g, `L${l}.ffn_shexp`, {
      ...shexp,
      ids: cx.zeroIds,
      used: 1,
      act: A.sact!,
      out: A.sho!,
      nFf: hp.nFfShexp,
      nExpert: 1,
      shared: false,
      xq8,
    }, cx);
    sho = A.sho!;
  }
  if (!fusedGam) {
    await matvec(g, `L${l}.ffn_gate_inp_shexp`, routerWs[1]!, A.m!, A.gam!, n, { f32: true });
  }
  const c: ResidualAddConstants = {
    D: hp.nEmbd,
    N_TERMS: K,
    WEIGHTED: true,
    SHARED: true,
    ...normConstants(g, norm),
  };
  const params = g.storage(Uint32Array.of(n, gCol));
  await g.push(
    norm ? `L${l}.moe_combine+norm` : `L${l}.moe_combine`,
    RESIDUAL_ADD,
    c,
    [params, A.eo!, A.wts!, sho, gam, A.h!, norm ? part0(norm.w) : A.eo!, norm?.y ?? g.scratch()],
    residualAddGrid(c, n),
  );
}

/** One MoE expert set (routed, or the shared expert as one expert) over the chunk: gate·up, then down. */
export async function experts(
  g: GraphBuilder,
  label: string,
  e: {
    gate: GpuTensor;
    up: GpuTensor;
    down: GpuTensor;
    ids: GPUBuffer;
    used: number;
    act: GPUBuffer;
    out: GPUBuffer;
    nFf: number;
    nExpert: number;
    /** Run the shared expert (packed right after the routed ones) as n extra columns. */
    shared: boolean;
    /** Route in the gate·up prologue: logits in, weights out (ids go to `ids`). */
    route?: { logits: GPUBuffer; weights: GPUBuffer; nExpert: number; nExpertUsed: number; wScale: number };
    /** The tokens' x rounded to int8 by moe_route, in the byte order of weights of `type`. */
    xq8?: { type: GgmlTypeName; binding: Binding };
  },
  cx: BuildContext,
) {
  const hp = g.hp;
  const n = g.n;
  const gp = e.gate.parts[0]!;
  const u = e.up.parts[0]!;
  assert(
    gp.buffer === u.buffer && e.gate.parts.length === 1 && e.up.parts.length === 1,
    `${label}: gate and up packed`,
  );
  const gu: MoeMatvecShape = {
    type: typeName(e.gate),
    k: hp.nEmbd,
    n: e.nFf,
    nExpert: e.nExpert,
    nCols: e.used * n,
    xDiv: e.used,
    offGateBytes: gp.offsetBytes,
    offUpBytes: u.offsetBytes,
    gateUp: true,
    sharedCols: e.shared ? n : 0,
  };
  // int8Experts: the expert passes take int8 x where their weights allow it (moe_matvec_q8 XIN: every
  // workgroup rounds its f32 x column in its prologue), up to the mat-vec chunk width as the dense ones.
  const int8 = g.opts.int8Experts && n <= g.maxCols && !e.route;
  // Prefill chunks under int8Experts: the f32 passes read x and the activations rounded as the int8
  // passes would (#roundX).
  const round = (t: GgmlTypeName) =>
    g.opts.int8Experts && n > g.maxCols && !e.route && MATVEC_Q8_TYPES.includes(t);
  // groupedExperts: prefill chunks group the columns by expert once (moe_group), for both passes, where
  // their experts get few routed tokens on average (up to groupedMatvecMaxTokensPerExpert: grouped mat-vecs,
  // moe_gmv) or many (groupedMinTokensPerExpert or more: grouped matmuls, moe_matmul); others run per column.
  const wgMax = g.device.limits.maxComputeWorkgroupStorageSize;
  const mean = (n * e.used) / e.nExpert;
  // Below 4 tokens per expert a grouped mat-vec decodes about as many units as the per-column mat-vecs (its
  // tiles hold 1-3 columns) and adds the tile search: the per-column path stays (943 tok/s at 64-token chunks
  // on the H200, docs/PERF.md).
  const gmv = mean >= GROUPED_MATVEC_MIN_TOKENS_PER_EXPERT && mean <= g.opts.groupedMatvecMaxTokensPerExpert;
  const thick = mean >= g.opts.groupedMinTokensPerExpert &&
    groupedMatmulFits(typeName(e.gate), wgMax) && groupedMatmulFits(typeName(e.down), wgMax);
  const groups = g.opts.groupedExperts && n > g.maxCols && (gmv || thick) && !e.route
    ? await moeGroup(g, `${label}.group`, e.ids, e.used * n, e.nExpert, e.shared)
    : undefined;
  const grouped = (
    m: GpuTensor,
    more: { upOffsetBytes?: number; xDiv: number; sharedX0: number },
  ): GroupedMatmulShape => ({
    type: typeName(m),
    k: m.ne[0]!,
    n: m.ne[1]!,
    nGroups: e.nExpert + (e.shared ? 1 : 0),
    shared: e.shared,
    cap: n,
    nRouted: e.used * n,
    wOffsetBytes: m.parts[0]!.offsetBytes,
    expertBytes: m.ne[1]! * m.rowBytes,
    xStride: m.ne[0]!,
    yStride: m.ne[1]!,
    ...more,
  });
  if (int8 && moeMatvecQ8Fits(gu)) {
    const xq8 = e.xq8 && q8Layout(e.xq8.type) === q8Layout(gu.type) ? e.xq8.binding : undefined;
    await expertsQ8(g, `${label}.gate_up`, gu, gp.buffer, e.ids, cx.act.m!, e.act, n, xq8);
  } else {
    const x = round(gu.type)
      ? await roundX(g, `${label}.gate_up`, cx.act.m!, hp.nEmbd, n, gu.type, "moe_in")
      : cx.act.m!;
    if (groups) {
      const shape = grouped(e.gate, { upOffsetBytes: u.offsetBytes, xDiv: e.used, sharedX0: 0 });
      await expertsGrouped(g, `${label}.gate_up`, shape, gp.buffer, x, e.act, groups, gmv);
    } else {
      await expertsF32(g, label, gu, e, gp.buffer, x, e.act, e.route);
    }
  }
  const dp = e.down.parts[0]!;
  assert(e.down.parts.length === 1, `${label}: down in one binding`);
  const dn: MoeMatvecShape = {
    type: typeName(e.down),
    k: e.nFf,
    n: hp.nEmbd,
    nExpert: e.nExpert,
    nCols: e.used * n,
    xDiv: 1,
    offGateBytes: dp.offsetBytes,
    gateUp: false,
    sharedCols: e.shared ? n : 0,
  };
  if (int8 && moeMatvecQ8Fits(dn)) {
    await expertsQ8(g, `${label}.down`, dn, dp.buffer, e.ids, e.act, e.out, e.used * n + (e.shared ? n : 0));
  } else {
    const cols = e.used * n + (e.shared ? n : 0);
    const act = round(dn.type)
      ? await roundX(g, `${label}.down`, e.act, e.nFf, cols, dn.type, "moe_act")
      : e.act;
    if (groups) {
      const shape = grouped(e.down, { xDiv: 1, sharedX0: e.used * n });
      await expertsGrouped(g, `${label}.down`, shape, dp.buffer, act, e.out, groups, gmv);
    } else {
      await expertsF32(g, label, dn, e, dp.buffer, act, e.out);
    }
  }
}

/**
 * moe_group: the chunk's `nRouted` columns grouped by their expert in `ids` (and the shared expert's
 * columns as group nExpert), into a buffer of the graph that every layer's experts reuse in turn.
 */
export async function moeGroup(
  g: GraphBuilder,
  label: string,
  ids: GPUBuffer,
  nRouted: number,
  nExpert: number,
  shared: boolean,
) {
  const shape: MoeGroupShape = { nRouted, nTokens: g.n, nExpert, shared };
  const groups = g.grown("moe groups", 4 * moeGroupWords(shape));
  const params = g.storage(moeGroupParams(shape));
  checkMoeGroup(shape, { params, ids, groups });
  await g.push(label, MOE_GROUP, {}, [params, ids, groups], moeGroupGrid(shape));
  return groups;
}

/** One expert pass of a prefill chunk over moe_group's lists: grouped mat-vecs (`gmv`) or a grouped matmul. */
export async function expertsGrouped(
  g: GraphBuilder,
  label: string,
  shape: GroupedMatmulShape,
  weights: GPUBuffer,
  x: Binding,
  y: GPUBuffer,
  groups: GPUBuffer,
  gmv: boolean,
) {
  const b = { params: g.storage(groupedMatmulParams(shape)), weights, x, y, groups };
  const bindings = [b.params, b.weights, b.x, b.y, b.groups];
  if (gmv) {
    const c = groupedMatvecConstants(shape);
    checkGroupedMatvec(shape, c, b);
    await g.push(label, MOE_GMV, c, bindings, groupedMatvecGrid(shape, c));
    return;
  }
  const c = groupedMatmulConstants(shape);
  checkGroupedMatmul(shape, c, b);
  await g.push(label, MOE_MATMUL, c, bindings, groupedMatmulGrid(shape, c));
}

/** The gate·up pass of packed gate and up expert tensors over n tokens (used experts each). */
export function gateUpShape(
  g: GraphBuilder,
  e: { gate: GpuTensor; up: GpuTensor },
  used: number,
  n: number,
  nExpert: number,
  shared: boolean,
): MoeMatvecShape {
  return {
    type: typeName(e.gate),
    k: g.hp.nEmbd,
    n: e.gate.ne[1]!,
    nExpert,
    nCols: used * n,
    xDiv: used,
    offGateBytes: e.gate.parts[0]!.offsetBytes,
    offUpBytes: e.up.parts[0]!.offsetBytes,
    gateUp: true,
    sharedCols: shared ? n : 0,
  };
}

/** One expert pass through moe_matvec (f32 x); `route`: the gate·up pass routes in its prologue. */
export async function expertsF32(
  g: GraphBuilder,
  label: string,
  shape: MoeMatvecShape,
  e: { ids: GPUBuffer },
  weights: GPUBuffer,
  x: GPUBuffer,
  y: GPUBuffer,
  route?: { logits: GPUBuffer; weights: GPUBuffer; nExpert: number; nExpertUsed: number; wScale: number },
) {
  // Prefill chunks (wider than the graph's mat-vec columns, g.maxCols) take moe_matvec's prefill constants;
  // batched decode keeps the solo step's, so that its slots equal their solo runs bit for bit.
  const prefill = g.n > g.maxCols;
  if (!shape.gateUp) {
    const c = moeMatvecConstants(shape, undefined, g.opts.moeTuning?.down, prefill);
    await g.push(
      `${label}.down`,
      MOE_MATVEC,
      c,
      [g.storage(moeMatvecParams(shape)), e.ids, weights, x, y, x, g.scratch()],
      moeMatvecGrid(shape, c),
    );
    return;
  }
  const c = moeMatvecConstants(shape, route, g.opts.moeTuning?.gateUp, prefill);
  await g.push(
    route ? `${label}.route+gate_up` : `${label}.gate_up`,
    MOE_MATVEC,
    c,
    [
      g.storage(moeMatvecParams(shape)),
      e.ids,
      weights,
      x,
      y,
      route?.logits ?? x,
      route?.weights ?? g.scratch(),
    ],
    moeMatvecGrid(shape, c),
  );
}

/**
 * One expert pass through moe_matvec_q8: int8 x given (`xq8`), or with XIN f32 x (xCols columns) rounded to
 * int8 in every workgroup's prologue, the rounded x written to the int8 log (int8Log) or to a scratch buffer.
 */
export async function expertsQ8(
  g: GraphBuilder,
  label: string,
  shape: MoeMatvecShape,
  weights: GPUBuffer,
  ids: GPUBuffer,
  x: GPUBuffer,
  y: GPUBuffer,
  xCols: number,
  xq8?: Binding,
) {
  // x already rounded (moe_route XQ): read it as it is; otherwise XIN rounds it in every workgroup and
  // workgroups (0, col) log it. Mat-vec columns of several tokens may take other ROWS (the same bits).
  const pass = shape.gateUp ? "gateUp" : "down";
  const rows = g.n > 1 && g.n <= g.maxCols ? g.opts.moeTuning?.batchedQ8Rows?.[pass] : undefined;
  const c = moeMatvecQ8Constants(shape, undefined, { xin: !xq8, ...(rows === undefined ? {} : { rows }) });
  const b: MoeMatvecQ8Bindings = {
    params: g.storage(moeMatvecParams(shape)),
    ids,
    weights,
    weights2: weights,
    xq: xq8 ?? x,
    y,
    yq: xq8 ? g.scratch() : g.q8Region(label, shape.k, shape.type, xCols, "act"),
  };
  checkMoeMatvecQ8(shape, c, b);
  await g.push(
    label,
    MOE_MATVEC_Q8,
    c,
    [b.params, ids, weights, weights, b.xq, y, b.yq],
    moeMatvecQ8Grid(shape, c),
  );
}
