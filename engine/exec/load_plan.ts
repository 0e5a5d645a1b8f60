/**
 * Which tensors a stage uploads and which of them share one buffer, back to back: the routed and shared
 * experts' gate/up (and down) so one dispatch runs both, each layer's in-projections that read the same normed
 * input (one decode mat-vec for the group), the router with the shared expert's gate row; and the row order
 * a tensor is uploaded in where the file's differs from the kernels' (qwen3next's legacy `ssm_in`).
 * @module
 */
import type { GgufFile } from "../gguf.ts";
import type { Hparams, TensorCheck } from "../models/_arch.ts";
import type { HybridModel } from "../models/_hybrid.ts";
import { type TensorId, tensorName } from "../names.ts";
import { PACK_ALIGN_BYTES } from "../gpu/weights.ts";

/** What `uploadTensors` takes for one stage. */
export interface LoadPlan {
  /** Every tensor of the stage (each once). */
  readonly names: string[];
  /** Groups uploaded back to back into one buffer, in this order. */
  readonly packs: string[][];
  /** Source row of each canonical row, for tensors uploaded in another row order. */
  readonly rowOrder: Map<string, Uint32Array>;
}

/**
 * The tensors of layers `[a, b)` (with the embedding on the first stage, the output norm and head on the last)
 * and their packing.
 * @throws {RangeError} when tensors packed for one kernel differ in type (re-quantize them alike)
 */
export function loadPlan(
  file: GgufFile,
  hp: Hparams,
  check: TensorCheck,
  layers: readonly [number, number],
  model: HybridModel,
): LoadPlan {
  const [a, b] = layers;
  const names: string[] = [];
  const packs: string[][] = [];
  const rowOrder = new Map<string, Uint32Array>();
  if (a === 0) names.push(tensorName("token_embd"));
  for (let l = a; l < b; l++) {
    for (const [name, spec] of check.specs) {
      if (spec.layer === l && !spec.mtp) names.push(name);
    }
    const [gate, up, down] = (["ffn_gate_exps", "ffn_up_exps", "ffn_down_exps"] as const).map((id) =>
      tensorName(id, l)
    );
    const [sGate, sUp, sDown] = (["ffn_gate_shexp", "ffn_up_shexp", "ffn_down_shexp"] as const).map((id) =>
      tensorName(id, l)
    );
    if (sharedFusable(file, hp, [gate!, up!, down!], [sGate!, sUp!, sDown!])) {
      // The shared expert as expert index nExpert of each routed tensor: one dispatch runs both.
      packs.push([gate!, sGate!, up!, sUp!], [down!, sDown!]);
    } else {
      packs.push([gate!, up!], [sGate!, sUp!]);
    }
    const layout = check.layouts[l];
    const order = layout && model.inProjRowOrder?.(hp, layout);
    if (order) rowOrder.set(tensorName("ssm_in", l), order);
    // In-projections that read the same normed input, back to back: one decode mat-vec for the group.
    const group = hp.isAttention[l]
      ? inProjGroup(file, l, ["attn_q", "attn_k", "attn_v"])
      : inProjGroup(file, l, ["ssm_in", "attn_qkv", "attn_gate", "ssm_ba", "ssm_beta", "ssm_alpha"]);
    if (group.length > 1) packs.push(group);
    // The router and the shared expert's gate row: one decode mat-vec, logits then the gate logit.
    const router = inProjGroup(file, l, ["ffn_gate_inp", "ffn_gate_inp_shexp"]);
    if (router.length > 1) packs.push(router);
  }
  if (b === hp.nLayer) {
    names.push(tensorName("output_norm"));
    if (!check.tiedOutput) names.push(tensorName("output"));
    else if (a !== 0) names.push(tensorName("token_embd"));
  }
  for (const pack of packs) {
    const [g, ...rest] = pack.map((n) => file.tensor(n));
    for (const u of rest) {
      if (g!.type.id !== u.type.id) {
        throw new RangeError(
          `Tensors ${g!.name} (${g!.type.name}) and ${u.name} (${u.type.name}) differ in type; this engine ` +
            `reads them through one kernel and needs one type: re-quantize them alike`,
        );
      }
    }
  }
  return { names: [...new Set(names)], packs, rowOrder };
}

/**
 * The longest leading run of the present tensors `ids` of layer `l` that can be packed back to back for one
 * mat-vec: one type and row length, every tensor before the last a whole number of 256-byte units (no padding
 * between them) and of rows whose outputs land at 256-byte aligned offsets (bindable sub-ranges).
 */
function inProjGroup(file: GgufFile, l: number, ids: readonly TensorId[]): string[] {
  const names = ids.map((id) => tensorName(id, l)).filter((n) => file.tensors.has(n));
  const out: string[] = [];
  let rows = 0;
  for (const name of names) {
    const t = file.tensor(name);
    const first = out.length === 0 ? t : file.tensor(out[0]!);
    const prev = out.length === 0 ? undefined : file.tensor(out.at(-1)!);
    if (t.type.id !== first.type.id || t.ne[0] !== first.ne[0]) break;
    // ssm_alpha is read through ssm_beta's output range (gdn_step A_OFF), so its start need not be aligned.
    const joined = name === tensorName("ssm_alpha", l);
    if (prev && (prev.nbytes % PACK_ALIGN_BYTES !== 0 || (!joined && (rows * 4) % PACK_ALIGN_BYTES !== 0))) {
      break;
    }
    out.push(name);
    rows += t.nElems / (t.ne[0] ?? 1);
  }
  return out;
}

/**
 * Whether the shared expert can run as expert index nExpert of the routed tensors: same types, same FFN
 * width, and each routed tensor a whole number of 256-byte units so the packed shared matrix follows it
 * with no padding.
 */
function sharedFusable(
  file: GgufFile,
  hp: Hparams,
  routed: readonly string[],
  shared: readonly string[],
): boolean {
  if (hp.nFfExp !== hp.nFfShexp) return false;
  return routed.every((name, i) => {
    const r = file.tensor(name);
    const s = file.tensor(shared[i]!);
    return r.type.id === s.type.id && r.nbytes % PACK_ALIGN_BYTES === 0;
  });
}
