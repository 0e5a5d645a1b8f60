/**
 * `soloSum` (engine/blocks/linear.ts) on the 35B-A3B's shapes: the test models' K = 256 caps TEAM at 32 for
 * every mat-vec, so the batched ≡ solo bit tests cannot see a TEAM that follows the rows of a dispatch; this
 * checks the arithmetic where K = 2048 lets it differ.
 * @module
 */
import assert from "node:assert/strict";
import { soloSum } from "./linear.ts";
import type { GraphBuilder } from "../graph/builder.ts";
import type { GpuTensor } from "../gpu/weights.ts";
import { type GgmlTypeName, rowBytes, typeInfo } from "../quant/types.ts";
import { matvecConstants } from "../../wgsl/matvec.ts";
import { matvecQ8Constants } from "../../wgsl/matvec_q8.ts";

const buffer = Object.setPrototypeOf({ size: 1 << 30 }, GPUBuffer.prototype) as GPUBuffer;

/** Tensors of K = 2048 packed back to back in one buffer, rows `rows[i]` of type `types[i]`. */
function packed(rows: readonly number[], types: readonly GgmlTypeName[]): GpuTensor[] {
  let at = 0;
  return rows.map((n, i) => {
    const rb = rowBytes(types[i]!, 2048);
    const t: GpuTensor = {
      name: `w${i}`,
      type: typeInfo(types[i]!),
      ne: [2048, n],
      rowBytes: rb,
      parts: [{ buffer, offsetBytes: at, firstRow: 0, nRows: n, sizeBytes: n * rb }],
    };
    at += n * rb;
    return t;
  });
}

const graph = (n: number, maxCols = 16, int8Activations = false) =>
  ({ n, maxCols, opts: { int8Activations } }) as unknown as GraphBuilder;
const soloTeam = (...a: Parameters<typeof soloSum>) => soloSum(...a)?.team;

Deno.test("soloSum: mat-vec columns take the TEAM of the one-token step's fused in_proj, not their own", () => {
  // qwen35moe's DeltaNet in_proj: attn_qkv, attn_gate, ssm_beta, ssm_alpha (a joined to b).
  const ws = packed([8192, 4096, 32, 32], ["IQ4_XS", "IQ4_XS", "IQ4_XS", "IQ4_XS"]);
  const fused = matvecConstants({ type: "IQ4_XS", k: 2048, n: 12352, batch: 1 }).TEAM;
  const alone = matvecConstants({ type: "IQ4_XS", k: 2048, n: 32, batch: 8 }).TEAM;
  assert.equal(fused, 32);
  assert.equal(alone, 128, "ssm_beta alone in a batched step would sum in another order");
  for (const i of [0, 1, 2, 3]) assert.equal(soloTeam(graph(8), ws, i, ws[3]), fused, `tensor ${i}`);
  // Chunks of a few tokens run as mat-vec columns too.
  assert.equal(soloTeam(graph(5, 8), ws, 2, ws[3]), fused);
  // One token fuses them itself; prefill chunks run the matmul.
  assert.equal(soloTeam(graph(1), ws, 2, ws[3]), undefined);
  assert.equal(soloTeam(graph(64, 8), ws, 2, ws[3]), undefined);
  // ssm_alpha's output is not 256-byte aligned: without `joined` the run stops after beta.
  assert.equal(soloTeam(graph(8), ws, 3), undefined);
  assert.equal(soloTeam(graph(8), ws, 2), fused);
  // Another type ends the run: q and k fuse, v (Q8_0) runs alone in the one-token step too.
  const attn = packed([8192, 512, 512], ["IQ4_XS", "IQ4_XS", "Q8_0"]);
  const qk = matvecConstants({ type: "IQ4_XS", k: 2048, n: 8704, batch: 1 }).TEAM;
  assert.equal(soloTeam(graph(8), attn, 1), qk);
  assert.equal(soloTeam(graph(8), attn, 2), undefined);
  // A single tensor fuses with nothing.
  assert.equal(soloTeam(graph(8), attn.slice(2), 0), undefined);
});

Deno.test("soloSum under int8 activations: matvec_q8's TEAM and RED of the fused in_proj, not the tensor's own", () => {
  const ws = packed([8192, 4096, 32, 32], ["IQ4_XS", "IQ4_XS", "IQ4_XS", "IQ4_XS"]);
  const fused = matvecQ8Constants({ type: "IQ4_XS", k: 2048, n: 12352 });
  const alone = matvecQ8Constants({ type: "IQ4_XS", k: 2048, n: 32 });
  assert.deepEqual([fused.TEAM, fused.RED], [16, 0], "the fused in_proj is tall");
  assert.deepEqual([alone.TEAM, alone.RED], [32, 1], "ssm_beta alone would sum in another order");
  for (const i of [0, 1, 2, 3]) {
    assert.deepEqual(soloSum(graph(8, 16, true), ws, i, ws[3]), { team: 16, red: 0 }, `tensor ${i}`);
  }
  // A type the int8 mat-vecs do not read keeps f32 x, and the f32 mat-vec's TEAM.
  const bf = packed([8192, 512], ["BF16", "BF16"]);
  const f32 = matvecConstants({ type: "BF16", k: 2048, n: 8704, batch: 1 }).TEAM;
  assert.deepEqual(soloSum(graph(8, 16, true), bf, 1), { team: f32 });
});
