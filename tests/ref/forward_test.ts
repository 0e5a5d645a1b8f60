import assert from "node:assert/strict";
import { type GgufFile, openGguf } from "../../engine/gguf.ts";
import { type GgufWriteTensor, writeGguf } from "../../engine/gguf_write.ts";
import { tensorName } from "../../engine/names.ts";
import { dequantize } from "../../engine/quant/dequant.ts";
import type { GgmlTypeName } from "../../engine/quant/types.ts";
import { assertClose } from "../util/close.ts";
import { Rng } from "../util/rng.ts";
import { firstMismatch, RefModel } from "./forward.ts";
import { matvec, rmsNorm } from "./ops.ts";

const FIXTURES = new URL("../fixtures", import.meta.url).pathname;
const MODELS = ["tiny-qwen3next", "tiny-qwen35moe"] as const;
/** Same ops in the same order: only exact equality is expected; a hair of slack for summation order. */
const SAME = { atol: 1e-12, rtol: 1e-12 };
/** Batched vs token-by-token, chunked vs recurrent DeltaNet: f64 rounding through 4 layers. */
const REORDERED = { atol: 1e-9, rtol: 1e-9 };

function randomTokens(rng: Rng, n: number, nVocab: number): number[] {
  return Array.from({ length: n }, () => rng.int(0, nVocab));
}

function assertRows(got: Float64Array[], want: Float64Array[], tol: typeof SAME, what: string, seed: number) {
  assert.equal(got.length, want.length, `${what}: ${got.length} rows, want ${want.length}`);
  got.forEach((g, i) => assertClose(g, want[i]!, tol, { what: `${what} row ${i}`, seed }));
}

for (const name of MODELS) {
  Deno.test(`${name}: layer-range stages compose to the whole model across calls`, async () => {
    const rng = new Rng();
    using file = await openGguf(`${FIXTURES}/${name}.q8_0.gguf`);
    const whole = await RefModel.load(file);
    const n = whole.hp.nLayer;
    const stages = [
      await RefModel.load(file, { layers: [0, 1] }),
      await RefModel.load(file, { layers: [1, 3] }),
      await RefModel.load(file, { layers: [3, n] }),
    ];
    for (const len of [5, 1, 3]) {
      const tokens = randomTokens(rng, len, whole.hp.nVocab);
      const want = whole.forward(tokens);
      const h1 = stages[0]!.forward(tokens);
      assert.equal(h1[0]!.length, whole.hp.nEmbd);
      const got = stages[2]!.forwardHidden(stages[1]!.forwardHidden(h1));
      assertRows(got, want, SAME, `${name} split logits`, rng.seed);
    }
    assert.equal(stages[1]!.nPast, 9);
    assert.throws(() => stages[1]!.forward([1]), /range starting at layer 0/);
  });

  Deno.test(`${name}: batched prefill equals token by token, chunked DeltaNet equals recurrent`, async () => {
    const rng = new Rng();
    using file = await openGguf(`${FIXTURES}/${name}.q8_0.gguf`);
    const model = await RefModel.load(file);
    const chunked = await RefModel.load(file, { deltaNet: "chunked", chunk: 16 });
    const tokens = randomTokens(rng, 40, model.hp.nVocab); // two full chunks and a ragged one
    const batch = model.forward(tokens);
    assertRows(chunked.forward(tokens), batch, REORDERED, `${name} chunked`, rng.seed);
    model.reset();
    const single = tokens.slice(0, 12).map((t) => model.forward([t])[0]!);
    assertRows(single, batch.slice(0, 12), REORDERED, `${name} token by token`, rng.seed);
  });

  Deno.test(`${name}: snapshot and restore rewind every kind of state`, async () => {
    const rng = new Rng();
    using file = await openGguf(`${FIXTURES}/${name}.q8_0.gguf`);
    const model = await RefModel.load(file);
    const nv = model.hp.nVocab;
    model.forward(randomTokens(rng, 6, nv));
    const snap = model.snapshot();
    const next = randomTokens(rng, 4, nv);
    const first = model.forward(next);
    model.forward(randomTokens(rng, 3, nv)); // disturb KV, conv and recurrent state
    model.restore(snap);
    assert.equal(model.nPast, 6);
    assertRows(model.forward(next), first, SAME, `${name} after restore`, rng.seed);
    // and reset is not a no-op: the same tokens after different histories give different logits
    model.reset();
    const fresh = model.forward(next);
    assert.ok(Math.abs(fresh[0]![0]! - first[0]![0]!) > 1e-6, `seed ${rng.seed}: history had no effect`);
  });

  Deno.test(`${name}: named intermediates chain into each other and into the logits`, async () => {
    const rng = new Rng();
    using file = await openGguf(`${FIXTURES}/${name}.q8_0.gguf`);
    const model = await RefModel.load(file, { record: true });
    const hp = model.hp;
    const logits = model.forward(randomTokens(rng, 3, hp.nVocab));
    for (let layer = 0; layer < hp.nLayer; layer++) {
      const mixer = model.intermediate(hp.isAttention[layer] ? "attn_out" : "ssm_out", layer);
      const inp = model.intermediate("ffn_inp", layer);
      const out = model.intermediate("l_out", layer);
      const ffn = model.intermediate("ffn_out", layer);
      if (layer > 0) {
        const prev = model.intermediate("l_out", layer - 1);
        assertRows(inp, prev.map((p, t) => p.map((v, i) => v + mixer[t]![i]!)), SAME, "ffn_inp", rng.seed);
      }
      assertRows(out, inp.map((p, t) => p.map((v, i) => v + ffn[t]![i]!)), SAME, "l_out", rng.seed);
    }
    assert.throws(() => model.intermediate("attn_out", 0), /No intermediate attn_out of layer 0/);
    // final norm and LM head applied to the last l_out give the logits
    const outNorm = await load(file, tensorName("output_norm"));
    const output = await load(file, tensorName("output"));
    const last = model.intermediate("l_out", hp.nLayer - 1);
    const want = last.map((x) => matvec(output, rmsNorm(x, outNorm, { eps: hp.rmsEps })));
    assertRows(logits, want, SAME, `${name} logits from l_out`, rng.seed);
    // firstMismatch: none against itself; a perturbed ffn_norm of layer 2 is found there, not later
    const same = (n: Parameters<typeof model.intermediate>[0], l: number) => {
      const ssm = n === "ssm_out" || n === "ssm_conv" || n === "ssm_core";
      const otherKind = hp.isAttention[l] ? ssm : n === "attn_out";
      return otherKind ? undefined : model.intermediate(n, l);
    };
    assert.equal(firstMismatch(model, same, SAME), undefined);
    const bent = (n: Parameters<typeof model.intermediate>[0], l: number) => {
      const rows = same(n, l)?.map((r) => r.slice());
      if (rows !== undefined && l === 2 && n === "ffn_norm") rows[1]![7] = rows[1]![7]! + 1e-3;
      return rows;
    };
    const m = firstMismatch(model, bent, SAME);
    assert.deepEqual(m && [m.layer, m.name, m.token, m.index, m.nBad], [2, "ffn_norm", 1, 7, 1]);
  });
}

async function load(file: GgufFile, name: string): Promise<Float64Array> {
  const t = file.tensor(name);
  return dequantize(t.type.name as GgmlTypeName, await file.readTensor(name), t.nElems);
}

function f32Bytes(x: Float64Array): Uint8Array {
  return new Uint8Array(Float32Array.from(x).buffer);
}

/**
 * Rewrites the tiny qwen3next file with the legacy DeltaNet input layout of spec §8.1 variant A: `ssm_in`
 * = per key head g, rows [q_g | k_g | v_{rg..rg+r-1} | z_{rg..rg+r-1}] gathered from `attn_qkv` and
 * `attn_gate` (F32: Q8_0 values are exact in f32, so both files hold identical weights).
 */
async function writeLegacy(src: GgufFile, path: string): Promise<void> {
  const model = await RefModel.load(src);
  const hp = model.hp;
  const D = hp.nEmbd, nK = hp.ssmGroups, nV = hp.ssmDtRank, dK = hp.ssmState, dV = hp.ssmInner / nV;
  const r = nV / nK;
  const tensors: GgufWriteTensor[] = [];
  for (const [name, t] of src.tensors) {
    const layer = hp.isAttention.findIndex((att, i) => !att && name === tensorName("attn_qkv", i));
    if (layer >= 0) {
      const qkv = await load(src, name);
      const gate = await load(src, tensorName("attn_gate", layer));
      const rows = (m: Float64Array, row0: number, n: number) => m.subarray(row0 * D, (row0 + n) * D);
      const out = new Float64Array(D * (2 * nK * dK + 2 * nV * dV));
      let o = 0;
      for (let g = 0; g < nK; g++) {
        for (
          const part of [
            rows(qkv, g * dK, dK),
            rows(qkv, nK * dK + g * dK, dK),
            rows(qkv, 2 * nK * dK + g * r * dV, r * dV),
            rows(gate, g * r * dV, r * dV),
          ]
        ) {
          out.set(part, o);
          o += part.length;
        }
      }
      tensors.push({
        name: tensorName("ssm_in", layer),
        type: "F32",
        ne: [D, out.length / D],
        data: f32Bytes(out),
      });
      continue;
    }
    if (hp.isAttention.some((att, i) => !att && name === tensorName("attn_gate", i))) continue;
    tensors.push({ name, type: t.type.name as GgmlTypeName, ne: t.ne, data: await src.readTensor(name) });
  }
  await writeGguf(path, { kv: [...src.metadata.entries], tensors });
}

Deno.test("tiny-qwen3next: the legacy ssm_in layout gives the same logits as attn_qkv + attn_gate", async () => {
  const rng = new Rng();
  using file = await openGguf(`${FIXTURES}/tiny-qwen3next.q8_0.gguf`);
  const dir = await Deno.makeTempDir();
  try {
    const path = `${dir}/legacy.gguf`;
    await writeLegacy(file, path);
    using legacy = await openGguf(path);
    assert.ok(legacy.tensors.has(tensorName("ssm_in", 0)) && !legacy.tensors.has(tensorName("attn_qkv", 0)));
    const a = await RefModel.load(file);
    const b = await RefModel.load(legacy);
    const tokens = randomTokens(rng, 6, a.hp.nVocab);
    assertRows(b.forward(tokens), a.forward(tokens), SAME, "legacy layout logits", rng.seed);
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});

Deno.test("tiny-qwen35moe: without output.weight the LM head is tied to token_embd", async () => {
  const rng = new Rng();
  using file = await openGguf(`${FIXTURES}/tiny-qwen35moe.q8_0.gguf`);
  const dir = await Deno.makeTempDir();
  try {
    const path = `${dir}/tied.gguf`;
    const tensors: GgufWriteTensor[] = [];
    for (const [name, t] of file.tensors) {
      if (name === tensorName("output")) continue;
      tensors.push({ name, type: t.type.name as GgmlTypeName, ne: t.ne, data: await file.readTensor(name) });
    }
    await writeGguf(path, { kv: [...file.metadata.entries], tensors });
    using tied = await openGguf(path);
    const model = await RefModel.load(tied, { record: true });
    const logits = model.forward(randomTokens(rng, 3, model.hp.nVocab));
    const embd = await load(file, tensorName("token_embd"));
    const outNorm = await load(file, tensorName("output_norm"));
    const want = model.intermediate("l_out", model.hp.nLayer - 1).map((x) =>
      matvec(embd, rmsNorm(x, outNorm, { eps: model.hp.rmsEps }))
    );
    assertRows(logits, want, SAME, "tied logits", rng.seed);
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});

Deno.test("RefModel rejects bad layer ranges and token ids", async () => {
  using file = await openGguf(`${FIXTURES}/tiny-qwen35moe.q8_0.gguf`);
  await assert.rejects(() => RefModel.load(file, { layers: [2, 2] }), RangeError);
  await assert.rejects(() => RefModel.load(file, { layers: [0, 5] }), RangeError);
  const model = await RefModel.load(file, { layers: [0, 1] });
  assert.throws(() => model.forward([1024]), /outside the vocabulary/);
  assert.throws(() => model.forwardHidden([new Float64Array(3)]), /Hidden row of 3/);
});
