import assert from "node:assert/strict";
import { type GgufFile, openGguf } from "./gguf.ts";
import { ARCHES, type ArchName, archOf } from "./models/mod.ts";
import { KEYS, parseTensorName, type TensorId } from "./names.ts";
import { dequantize } from "./quant/mod.ts";
import type { GgmlTypeName } from "./quant/types.ts";
import { planModel, type QuantPreset, synthesize, type SynthOptions } from "./synth.ts";
import { synthVocab } from "./_synth_vocab.ts";
import { Tokenizer } from "./text/mod.ts";
import { RefModel } from "../tests/ref/forward.ts";

import { FIXTURES } from "../tests/util/fixtures.ts";
const SEED = Number(Deno.env.get("SEED") ?? crypto.getRandomValues(new Uint32Array(1))[0]) >>> 0;
const tmp = await Deno.makeTempDir({ prefix: "synth_test_" });
addEventListener("unload", () => Deno.removeSync(tmp, { recursive: true }));

/**
 * The type the stock tables give a tensor, written from spec `quants.md` (last section) and the fixture
 * README independently of `tensorType`: 1-D, router, conv and shared-expert gate F32; for iq4_xs `output`
 * Q6_K and `attn_v` Q5_K (n_head/n_head_kv = 4 in tiny, 8 in the real models).
 */
function stockType(quant: QuantPreset, name: string, ne: readonly number[]): GgmlTypeName {
  const id = parseTensorName(name)!.id;
  const f32: TensorId[] = ["ffn_gate_inp", "ssm_conv1d", "ffn_gate_inp_shexp"];
  if (quant === "f32" || ne.length === 1 || f32.includes(id)) return "F32";
  if (quant === "q8_0") return "Q8_0";
  if (quant !== "iq4_xs") throw new Error(`no stock table for ${quant}`);
  return id === "output" ? "Q6_K" : id === "attn_v" ? "Q5_K" : "IQ4_XS";
}

async function synthOpen(
  o: SynthOptions,
  extra: { splitParts?: number; explicitMaxElems?: number } = {},
): Promise<GgufFile> {
  const out = `${tmp}/${o.arch}-${o.quant}-${o.layout ?? "current"}${o.mtp ? "-mtp" : ""}-${
    extra.splitParts ?? 1
  }.gguf`;
  const r = await synthesize(planModel(o), { out, ...extra });
  return await openGguf(r.paths[0]!);
}

/** Checks a synthesized file: architecture check passes, every tensor has the stock type and planned ne. */
function checkFile(f: GgufFile, o: SynthOptions): void {
  const arch = archOf(f.metadata);
  assert.equal(arch.name, o.arch);
  const hp = arch.readHparams(f.metadata);
  const c = arch.checkTensors(f, hp);
  const dn = o.layout === "legacy" ? "ssm_in" : o.arch === "qwen3next" ? "qkv_ba" : "qkv_beta_alpha";
  assert.deepEqual(c.layouts, [dn, dn, dn, undefined], `seed ${SEED}`);
  assert.equal(c.tiedOutput, false);
  const plan = planModel(o);
  assert.equal(f.tensors.size, plan.tensors.length);
  for (const p of plan.tensors) {
    const t = f.tensor(p.spec.name);
    assert.deepEqual(t.ne, p.spec.ne, p.spec.name);
    assert.equal(t.type.name, stockType(o.quant, t.name, t.ne), `${t.name} in ${o.quant}`);
    assert.equal(t.nbytes, p.nbytes, t.name);
  }
}

Deno.test("synth q8_0 tiny has exactly the llama.cpp fixture's metadata keys, tensor names, shapes and types", async () => {
  for (const arch of ["qwen3next", "qwen35moe"] as const) {
    using fx = await openGguf(new URL(`tiny-${arch}.q8_0.gguf`, FIXTURES).pathname);
    using f = await synthOpen({ arch, preset: "tiny", quant: "q8_0", seed: SEED });
    // The fixture has no chat template; ours adds one.
    assert.deepEqual(
      [...f.metadata.entries.keys()].filter((k) => k !== KEYS.chatTemplate).sort(),
      [...fx.metadata.entries.keys()].sort(),
    );
    for (const [k, v] of fx.metadata.entries) {
      if (
        k === KEYS.name || k.startsWith("tokenizer.ggml.tokens") || k === KEYS.tokMerges ||
        k === KEYS.tokTypes
      ) {
        continue;
      }
      assert.deepEqual(f.metadata.entries.get(k), v, k);
    }
    const table = (g: GgufFile) =>
      [...g.tensors.values()].map((t) => `${t.name} ${t.type.name} [${t.ne}]`).sort();
    assert.deepEqual(table(f), table(fx));
    checkFile(f, { arch, preset: "tiny", quant: "q8_0", seed: SEED });
  }
});

Deno.test("synth tiny: both archs × f32, q8_0, iq4_xs × layouts pass the architecture check", async () => {
  const cases: SynthOptions[] = [
    { arch: "qwen3next", preset: "tiny", quant: "f32", seed: SEED },
    { arch: "qwen35moe", preset: "tiny", quant: "f32", seed: SEED },
    { arch: "qwen3next", preset: "tiny", quant: "q8_0", seed: SEED, layout: "legacy" },
    { arch: "qwen3next", preset: "tiny", quant: "iq4_xs", seed: SEED, layout: "legacy" },
    { arch: "qwen35moe", preset: "tiny", quant: "iq4_xs", seed: SEED },
  ];
  for (const o of cases) {
    using f = await synthOpen(o);
    checkFile(f, o);
  }
  assert.throws(
    () => planModel({ arch: "qwen35moe", preset: "tiny", quant: "q8_0", seed: 1, layout: "legacy" }),
    /Layout "legacy" \(ssm_in\) is not a qwen35moe layout/,
  );
});

Deno.test("synth tiny: every other quant recipe puts its type on the matrices and F32 elsewhere", async () => {
  const matrixType: [QuantPreset, GgmlTypeName][] = [
    ["f16", "F16"],
    ["bf16", "BF16"],
    ["q4_0", "Q4_0"],
    ["q4_k", "Q4_K"],
    ["q5_k", "Q5_K"],
    ["q6_k", "Q6_K"],
    ["iq4_nl", "IQ4_NL"],
  ];
  for (const [quant, type] of matrixType) {
    const o: SynthOptions = { arch: "qwen35moe", preset: "tiny", quant, seed: SEED };
    // Streamed random blocks (fast, and covers the calibrated path of every type).
    using f = await synthOpen(o, { explicitMaxElems: 0 });
    const a = archOf(f.metadata);
    a.checkTensors(f, a.readHparams(f.metadata));
    for (const t of f.tensors.values()) {
      const id = parseTensorName(t.name)!.id;
      const want = t.ne.length === 1 || id === "ffn_gate_inp" || id === "ssm_conv1d" ? "F32" : type;
      assert.equal(t.type.name, want, `${quant}: ${t.name}`);
    }
  }
});

Deno.test("synth --mtp appends one MTP block (block_count 5, nextn_predict_layers 1) the check accepts", async () => {
  const o: SynthOptions = { arch: "qwen35moe", preset: "tiny", quant: "q8_0", seed: SEED, mtp: true };
  using f = await synthOpen(o);
  const a = ARCHES.qwen35moe;
  const hp = a.readHparams(f.metadata);
  assert.equal(hp.blockCount, 5);
  assert.equal(hp.nLayer, 4);
  assert.equal(hp.nextnLayers, 1);
  const c = a.checkTensors(f, hp);
  // An attention layer's 16 tensors plus eh_proj, enorm, hnorm, shared_head_norm.
  assert.equal(c.mtpTensors.length, 20);
  assert.ok(c.mtpTensors.every((n) => parseTensorName(n)?.layer === 4));
  assert.deepEqual(f.tensor(c.mtpTensors.find((n) => n.includes("eh_proj"))!).ne, [512, 256]);
});

Deno.test("synth --split-parts 3 writes three parts that open as one model", async () => {
  const o: SynthOptions = { arch: "qwen3next", preset: "tiny", quant: "q8_0", seed: SEED };
  using f = await synthOpen(o, { splitParts: 3 });
  assert.equal(f.parts.length, 3);
  assert.match(f.parts[2]!.path, /-00003-of-00003\.gguf$/);
  assert.ok(new Set([...f.tensors.values()].map((t) => t.part)).size === 3);
  checkFile(f, o);
});

Deno.test("synth values: per-element draws and streamed random blocks both give sane, seeded scales", async () => {
  const cases: [QuantPreset, number | undefined][] = [["q8_0", undefined], ["q8_0", 0], ["iq4_xs", 0], [
    "q4_k",
    0,
  ], [
    "q6_k",
    0,
  ], ["bf16", 0]];
  for (const [quant, explicitMaxElems] of cases) {
    const o: SynthOptions = { arch: "qwen35moe", preset: "tiny", quant, seed: SEED };
    const out = `${tmp}/values-${quant}-${explicitMaxElems}.gguf`;
    await synthesize(planModel(o), { out, ...(explicitMaxElems === undefined ? {} : { explicitMaxElems }) });
    using f = await openGguf(out);
    const values = async (name: string) => {
      const t = f.tensor(name);
      return dequantize(t.type.name as GgmlTypeName, await f.readTensor(name), t.nElems);
    };
    const std = (v: Float64Array) => Math.sqrt(v.reduce((a, x) => a + x * x, 0) / v.length);
    for (const name of ["blk.0.ffn_down_exps.weight", "blk.3.attn_q.weight", "blk.1.attn_qkv.weight"]) {
      const s = std(await values(name));
      assert.ok(
        Math.abs(s * 16 - 1) < 0.25,
        `${quant} ${name}: std ${s}, want ~1/16 (seed ${SEED}, ${explicitMaxElems})`,
      );
    }
    const a = await values("blk.0.ssm_a");
    assert.ok(a.every((x) => x < -0.4 && x > -2.1), `ssm_a ${a}`);
    const n = await values("blk.2.attn_norm.weight");
    assert.ok(n.every((x) => x > 0.79 && x < 1.21));
    const dt = await values("blk.2.ssm_dt.bias");
    assert.ok(dt.every((x) => Math.abs(x) <= 0.5));
  }
  // Chunk size does not change the stream; the seed does.
  const small = planModel({ arch: "qwen3next", preset: "tiny", quant: "q8_0", seed: SEED });
  const bytesOf = async (seed: number, chunkBytes: number) => {
    const out = `${tmp}/chunk-${seed}-${chunkBytes}.gguf`;
    await synthesize({ ...small, options: { ...small.options, seed } }, {
      out,
      explicitMaxElems: 0,
      chunkBytes,
    });
    return await Deno.readFile(out);
  };
  const a = await bytesOf(SEED, 1 << 24), b = await bytesOf(SEED, 4096), c = await bytesOf(SEED + 1, 1 << 24);
  assert.deepEqual(a, b);
  assert.notDeepEqual(a, c);
});

Deno.test("synth full-size plans: real names, shapes, types and sizes without writing data", () => {
  const cases: [ArchName, "35b-a3b" | "80b-a3b", number, number, number][] = [
    // arch, preset, layers, vocab, tensors: 3 globals + DeltaNet 19 (35B) / 18 (80B) + attention 16 per layer
    ["qwen35moe", "35b-a3b", 40, 248320, 3 + 30 * 19 + 10 * 16],
    ["qwen3next", "80b-a3b", 48, 151936, 3 + 36 * 18 + 12 * 16],
  ];
  for (const [arch, preset, nLayer, nVocab, nTensors] of cases) {
    const plan = planModel({ arch, preset, quant: "iq4_xs", seed: 1 });
    const hp = plan.hparams;
    assert.equal(hp.nLayer, nLayer);
    assert.equal(hp.nVocab, nVocab);
    assert.equal(plan.tensors.length, nTensors);
    const E = arch === "qwen35moe" ? 256 : 512;
    const want: Record<string, [number[], GgmlTypeName]> = {
      "token_embd.weight": [[2048, nVocab], "IQ4_XS"],
      "output.weight": [[2048, nVocab], "Q6_K"],
      "blk.3.attn_q.weight": [[2048, 8192], "IQ4_XS"],
      "blk.3.attn_k.weight": [[2048, 512], "IQ4_XS"],
      "blk.3.attn_v.weight": [[2048, 512], "Q5_K"],
      "blk.3.attn_output.weight": [[4096, 2048], "IQ4_XS"],
      "blk.3.attn_q_norm.weight": [[256], "F32"],
      "blk.0.attn_qkv.weight": [[2048, 8192], "IQ4_XS"],
      "blk.0.attn_gate.weight": [[2048, 4096], "IQ4_XS"],
      "blk.0.ssm_conv1d.weight": [[4, 8192], "F32"],
      "blk.0.ssm_a": [[32], "F32"],
      "blk.0.ssm_dt.bias": [[32], "F32"],
      "blk.0.ssm_norm.weight": [[128], "F32"],
      "blk.0.ssm_out.weight": [[4096, 2048], "IQ4_XS"],
      "blk.0.ffn_gate_inp.weight": [[2048, E], "F32"],
      "blk.0.ffn_gate_exps.weight": [[2048, 512, E], "IQ4_XS"],
      "blk.0.ffn_down_exps.weight": [[512, 2048, E], "IQ4_XS"],
      "blk.0.ffn_gate_inp_shexp.weight": [[2048], "F32"],
      "blk.0.ffn_down_shexp.weight": [[512, 2048], "IQ4_XS"],
      ...(arch === "qwen35moe"
        ? {
          "blk.0.ssm_beta.weight": [[2048, 32], "IQ4_XS"],
          "blk.0.ssm_alpha.weight": [[2048, 32], "IQ4_XS"],
        }
        : { "blk.0.ssm_ba.weight": [[2048, 64], "IQ4_XS"] }),
    };
    const byName = new Map(plan.tensors.map((t) => [t.spec.name, t]));
    for (const [name, [ne, type]] of Object.entries(want)) {
      const t = byName.get(name);
      assert.ok(t, `${arch} ${name} planned`);
      assert.deepEqual(t.spec.ne, ne, name);
      assert.equal(t.type, type, name);
    }
    for (const t of plan.tensors) {
      assert.equal(t.type, stockType("iq4_xs", t.spec.name, t.spec.ne), t.spec.name);
    }
    // Spec `gguf.md` §6: one IQ4_XS expert tensor is ≈ 143 MB (35B) / 285 MB (80B).
    const exps = byName.get("blk.0.ffn_up_exps.weight")!.nbytes;
    assert.equal(exps, (2048 * 512 * E * 4.25) / 8);
  }
});

Deno.test("synth vocabularies: valid byte-level BPE, specials where chat.md puts them, tokenizer round trip", () => {
  const tiny = synthVocab(1024, { kind: "tiny" }, SEED);
  assert.equal(tiny.tokens.length, 1024);
  assert.equal(new Set(tiny.tokens).size, 1024);
  assert.deepEqual(tiny.tokens.slice(1021), ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]);
  assert.deepEqual([tiny.bos, tiny.eos, tiny.pad], [1021, 1023, 1021]);
  assert.deepEqual([...tiny.types.slice(1020)], [1, 3, 3, 3]);
  assert.equal(tiny.merges.length, 765);
  const id = new Map(tiny.tokens.map((t, i) => [t, i]));
  tiny.merges.forEach((m, rank) => {
    const [a, b] = m.split(" ") as [string, string];
    assert.ok(id.get(a)! < 256 + rank && id.get(b)! < 256 + rank, m);
    assert.equal(id.get(a + b), 256 + rank, m);
  });
  const tok = Tokenizer.fromVocab({
    model: "gpt2",
    pre: "qwen2",
    tokens: tiny.tokens,
    tokenTypes: tiny.types,
    merges: tiny.merges,
  });
  const english = "The quick brown fox jumps over the lazy dog. Hello world!";
  const nIds = tok.encode(english).length;
  assert.ok(
    nIds < english.length * 0.6,
    `merges learned on English: ${nIds} tokens for ${english.length} bytes`,
  );
  assert.equal(tok.encode(" the").length, 1);
  for (const text of [english, "ünïcödé 12345\n\ttabs\u0000 and 🙂", ""]) {
    assert.equal(tok.decode(tok.encode(text)), text);
  }

  for (const [nVocab, base, pad] of [[248320, 248044, 248055], [151936, 151643, 151643]] as const) {
    const v = synthVocab(nVocab, { kind: "qwen", base, pad }, SEED);
    assert.equal(v.tokens.length, nVocab);
    assert.equal(new Set(v.tokens).size, nVocab);
    assert.equal(v.merges.length, base - 256);
    assert.deepEqual([v.tokens[base], v.tokens[base + 1], v.tokens[base + 2]], [
      "<|endoftext|>",
      "<|im_start|>",
      "<|im_end|>",
    ]);
    assert.equal(v.tokens[base + 25], "</think>");
    assert.deepEqual([v.types[base], v.types[base + 14], v.types[base + 25], v.types[nVocab - 1]], [
      3,
      4,
      4,
      5,
    ]);
    assert.deepEqual([v.bos, v.eos, v.pad], [base, base + 2, pad]);
  }
});

Deno.test("synth tiny models give non-degenerate logits under the float64 reference forward", async () => {
  const tokens = [1021, 72, 101, 108, 108, 111, 44, 32, 119, 111, 114, 108, 100];
  for (const [arch, quant] of [["qwen3next", "q8_0"], ["qwen35moe", "iq4_xs"]] as const) {
    using f = await synthOpen({ arch, preset: "tiny", quant, seed: SEED });
    const model = await RefModel.load(f);
    const logits = model.forward(tokens);
    const argmaxes = new Set<number>();
    let clearGaps = 0;
    for (const [p, row] of logits.entries()) {
      assert.ok(
        row.every(Number.isFinite),
        `${arch} ${quant} position ${p}: non-finite logits (seed ${SEED})`,
      );
      const mean = row.reduce((a, x) => a + x, 0) / row.length;
      const std = Math.sqrt(row.reduce((a, x) => a + (x - mean) ** 2, 0) / row.length);
      assert.ok(std > 0.3 && std < 10, `${arch} ${quant} position ${p}: logit std ${std} (seed ${SEED})`);
      const sorted = [...row].sort((a, b) => b - a);
      if (sorted[0]! - sorted[1]! > 0.05) clearGaps++;
      argmaxes.add(row.indexOf(sorted[0]!));
    }
    // Greedy decoding needs clear winners most of the time, and the prediction must follow the input.
    assert.ok(
      clearGaps >= tokens.length / 2,
      `${arch} ${quant}: only ${clearGaps} clear top-1 gaps (seed ${SEED})`,
    );
    assert.ok(argmaxes.size >= 3, `${arch} ${quant}: argmax barely depends on the input (seed ${SEED})`);
  }
});
