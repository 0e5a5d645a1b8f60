import assert from "node:assert/strict";
import { GgufError } from "../errors.ts";
import {
  GGUF_VALUE_TYPE,
  GgufFile,
  type GgufKv,
  GgufMetadata,
  type GgufTensorInfo,
  openGguf,
} from "../gguf.ts";
import { archKey, type ArchKeyId, KEYS, tensorName } from "../names.ts";
import { GGML_TYPES } from "../quant/types.ts";
import { ARCHES, type ArchName, archOf, type Hparams } from "./mod.ts";
import { kvGroupOfVHead as kappa35 } from "./qwen35moe.ts";
import { kvGroupOfVHead as kappaNext } from "./qwen3next.ts";

import { FIXTURES } from "../../tests/util/fixtures.ts";
const fixturePath = (arch: ArchName) => new URL(`tiny-${arch}.q8_0.gguf`, FIXTURES).pathname;

async function fixture(arch: ArchName): Promise<GgufFile> {
  return await openGguf(fixturePath(arch));
}

/** A metadata copy of `meta` with arch keys set (value) or deleted (undefined). */
function withKeys(
  meta: GgufMetadata,
  arch: ArchName,
  edits: [ArchKeyId | string, GgufKv | undefined][],
): GgufMetadata {
  const m = new Map(meta.entries);
  for (const [id, kv] of edits) {
    const key = id.includes(".") ? id : archKey(arch, id as ArchKeyId);
    if (kv === undefined) m.delete(key);
    else m.set(key, kv);
  }
  return new GgufMetadata(m, meta.path);
}

const u32 = (value: number): GgufKv => ({ type: GGUF_VALUE_TYPE.UINT32, value });
const str = (value: string): GgufKv => ({ type: GGUF_VALUE_TYPE.STRING, value });
const i32s = (values: number[]): GgufKv => ({
  type: GGUF_VALUE_TYPE.ARRAY,
  value: { elemType: GGUF_VALUE_TYPE.INT32, values: Int32Array.from(values) },
});
const bools = (values: boolean[]): GgufKv => ({
  type: GGUF_VALUE_TYPE.ARRAY,
  value: { elemType: GGUF_VALUE_TYPE.BOOL, values },
});

/** A copy of `file` with its tensor table edited (metadata and parts kept). */
function withTensors(file: GgufFile, edit: (m: Map<string, GgufTensorInfo>) => void): GgufFile {
  const m = new Map(file.tensors);
  edit(m);
  return new GgufFile(file.parts, file.metadata, m, []);
}

function retype(t: GgufTensorInfo, name: string): GgufTensorInfo {
  const type = [...GGML_TYPES.values()].find((x) => x.name === name)!;
  return { ...t, type };
}

for (const arch of ["qwen3next", "qwen35moe"] as const) {
  Deno.test(`${arch}: the llama.cpp fixture loads with the fixture's dims and validates`, async () => {
    using file = await fixture(arch);
    const a = archOf(file.metadata);
    assert.equal(a.name, arch);
    const hp = a.readHparams(file.metadata);
    const want: Partial<Hparams> = {
      arch,
      blockCount: 4,
      nLayer: 4,
      nextnLayers: 0,
      nEmbd: 256,
      nVocab: 1024,
      nHead: 4,
      nHeadKv: 1,
      headDim: 256,
      ropeDim: 64,
      ropeBase: 1e7,
      nExpert: 8,
      nExpertUsed: 2,
      nFfExp: 256,
      nFfShexp: 256,
      expertWeightsScale: 1,
      ssmConv: 4,
      ssmInner: 512,
      ssmState: 128,
      ssmGroups: 2,
      ssmDtRank: 4,
      attnScale: 1 / 16,
    };
    for (const [k, v] of Object.entries(want)) assert.equal(hp[k as keyof Hparams], v, k);
    assert.ok(Math.abs(hp.rmsEps - 1e-6) < 1e-12);
    assert.deepEqual(hp.isAttention, [false, false, false, true]);
    assert.deepEqual(hp.ropeSections, arch === "qwen35moe" ? [11, 11, 10, 0] : []);
    const check = a.checkTensors(file, hp);
    const dn = arch === "qwen3next" ? "qkv_ba" : "qkv_beta_alpha";
    assert.deepEqual(check.layouts, [dn, dn, dn, undefined]);
    assert.equal(check.tiedOutput, false);
    assert.equal(check.specs.size, file.tensors.size);
    assert.deepEqual(check.mtpTensors, []);
  });
}

Deno.test("kvGroupOfVHead: grouped for qwen3next, tiled for qwen35moe (spec §9)", async () => {
  const dims = { ssmGroups: 16, ssmDtRank: 32 };
  assert.deepEqual([0, 1, 2, 3, 30, 31].map((h) => kappaNext(dims, h)), [0, 0, 1, 1, 15, 15]);
  assert.deepEqual([0, 1, 15, 16, 17, 31].map((h) => kappa35(dims, h)), [0, 1, 15, 0, 1, 15]);
  // And through the fixture's hparams (n_k 2, n_v 4).
  for (const arch of ["qwen3next", "qwen35moe"] as const) {
    using file = await fixture(arch);
    const hp = ARCHES[arch].readHparams(file.metadata);
    const got = [0, 1, 2, 3].map(hp.kvGroupOfVHead);
    assert.deepEqual(got, arch === "qwen3next" ? [0, 0, 1, 1] : [0, 1, 0, 1]);
  }
});

Deno.test("readHparams rejects corrupted metadata with the key, the value and the rule", async () => {
  using next = await fixture("qwen3next");
  using moe = await fixture("qwen35moe");
  const cases: [ArchName, GgufMetadata, [ArchKeyId | string, GgufKv | undefined][], RegExp][] = [
    ["qwen3next", next.metadata, [["ssmInnerSize", u32(256)]], /ssm\.inner_size is 256: .*d_k == d_v/],
    [
      "qwen3next",
      next.metadata,
      [["valueLength", u32(128)]],
      /value_length is 128: .*== qwen3next\.attention\.key/,
    ],
    [
      "qwen3next",
      next.metadata,
      [["keyLength", undefined]],
      /key qwen3next\.attention\.key_length is missing/,
    ],
    [
      "qwen3next",
      next.metadata,
      [["ssmTimeStepRank", u32(3)]],
      /time_step_rank is 3: .*multiple of key heads/,
    ],
    ["qwen3next", next.metadata, [["expertUsedCount", u32(9)]], /expert_used_count is 9: .*\[1, 8\]/],
    ["qwen3next", next.metadata, [["expertCount", u32(0)]], /expert_count is 0: .*\[1, 65536\]/],
    ["qwen3next", next.metadata, [["headCountKv", u32(3)]], /head_count_kv is 3: .*divisor of/],
    [
      "qwen3next",
      next.metadata,
      [["ropeScalingType", str("yarn")]],
      /scaling\.type is yarn: .*without rope scaling/,
    ],
    [
      "qwen3next",
      next.metadata,
      [["ropeSections", i32s([11, 11, 9, 0])]],
      /summing to qwen3next\.rope\.dimension_count\/2 = 32/,
    ],
    [
      "qwen35moe",
      moe.metadata,
      [["ropeSections", i32s([11, 11, 8, 2])]],
      /dimension_sections is \[11, 11, 8, 2\]/,
    ],
    ["qwen35moe", moe.metadata, [["ropeSections", undefined]], /requires IMRoPE sections/],
    ["qwen35moe", moe.metadata, [["recurrentLayers", bools([true, true])]], /one entry per layer/],
    ["qwen35moe", moe.metadata, [["nextnPredictLayers", u32(4)]], /nextn_predict_layers is 4: .*\[0, 3\]/],
    ["qwen35moe", moe.metadata, [[KEYS.tokTokens, undefined]], /tokenizer\.ggml\.tokens is missing/],
    [
      "qwen35moe",
      moe.metadata,
      [[KEYS.architecture, str("qwen3next")]],
      /is "qwen3next" but the qwen35moe reader/,
    ],
    ["qwen35moe", moe.metadata, [["ssmStateSize", str("128")]], /expected an integer/],
  ];
  for (const [arch, meta, edits, re] of cases) {
    const m = withKeys(meta, arch, edits);
    assert.throws(() => ARCHES[arch].readHparams(m), (e: unknown) => {
      assert.ok(e instanceof GgufError, `${re}: ${e}`);
      assert.equal(e.code, "bad_value");
      assert.match(e.message, re);
      return true;
    });
  }
});

Deno.test("readHparams: defaults, MTP count and the recurrent_layers override", async () => {
  using moe = await fixture("qwen35moe");
  const a = ARCHES.qwen35moe;
  // Interval absent → 4; expert_feed_forward_length absent → feed_forward_length / k_top (1024 / 2).
  let hp = a.readHparams(withKeys(moe.metadata, "qwen35moe", [["fullAttentionInterval", undefined], [
    "expertFfLength",
    undefined,
  ]]));
  assert.deepEqual(hp.isAttention, [false, false, false, true]);
  assert.equal(hp.nFfExp, 512);
  hp = a.readHparams(withKeys(moe.metadata, "qwen35moe", [["fullAttentionInterval", u32(2)]]));
  assert.deepEqual(hp.isAttention, [false, true, false, true]);
  hp = a.readHparams(
    withKeys(moe.metadata, "qwen35moe", [["recurrentLayers", bools([false, true, true, true])]]),
  );
  assert.deepEqual(hp.isAttention, [true, false, false, false]);
  hp = a.readHparams(withKeys(moe.metadata, "qwen35moe", [["recurrentLayers", i32s([1, 0, 1, 0])]]));
  assert.deepEqual(hp.isAttention, [false, true, false, true]);
  hp = a.readHparams(withKeys(moe.metadata, "qwen35moe", [["nextnPredictLayers", u32(1)]]));
  assert.equal(hp.nLayer, 3);
  assert.equal(hp.nextnLayers, 1);
  assert.deepEqual(hp.isAttention, [false, false, false]);
  hp = a.readHparams(withKeys(moe.metadata, "qwen35moe", [["expertWeightsScale", u32(0)], [
    "attnScale",
    { type: GGUF_VALUE_TYPE.FLOAT32, value: 0.125 },
  ]]));
  assert.equal(hp.expertWeightsScale, 1);
  assert.equal(hp.attnScale, 0.125);
  hp = a.readHparams(withKeys(moe.metadata, "qwen35moe", [["headCountKv", i32s([0, 0, 0, 1])]]));
  assert.equal(hp.nHeadKv, 1);
  using next = await fixture("qwen3next");
  const sections = withKeys(next.metadata, "qwen3next", [["ropeSections", i32s([11, 11, 10, 0])]]);
  assert.deepEqual(ARCHES.qwen3next.readHparams(sections).ropeSections, [11, 11, 10, 0]);
});

Deno.test("checkTensors names the wrong tensor, what it expected and why", async () => {
  using next = await fixture("qwen3next");
  using moe = await fixture("qwen35moe");
  const files = { qwen3next: next, qwen35moe: moe };
  const n = (id: Parameters<typeof tensorName>[0], l?: number) => tensorName(id, l);
  const cases: [ArchName, (m: Map<string, GgufTensorInfo>) => void, RegExp][] = [
    [
      "qwen3next",
      (m) => m.set(n("ssm_a", 1), { ...m.get(n("ssm_a", 1))!, ne: [8] }),
      /^Tensor blk\.1\.ssm_a has ne=\[8\] but qwen3next expects ne=\[4\] \(ssm\.time_step_rank\): re-export the GGUF/,
    ],
    [
      "qwen35moe",
      (m) => m.set(n("attn_qkv", 0), { ...m.get(n("attn_qkv", 0))!, ne: [256, 1280] }),
      /^Tensor blk\.0\.attn_qkv\.weight has ne=\[256, 1280\] but qwen35moe expects ne=\[256, 1024\] \(embedding_length, 2·ssm/,
    ],
    [
      "qwen3next",
      (m) => m.delete(n("ssm_out", 2)),
      /^Tensor blk\.2\.ssm_out\.weight is missing but qwen3next requires/,
    ],
    ["qwen35moe", (m) => m.delete(n("attn_k_norm", 3)), /^Tensor blk\.3\.attn_k_norm\.weight is missing/],
    ["qwen35moe", (m) => m.delete(n("output_norm")), /^Tensor output_norm\.weight is missing/],
    [
      "qwen3next",
      (m) => m.set(n("ssm_conv1d", 0), retype(m.get(n("ssm_conv1d", 0))!, "Q8_0")),
      /^Tensor blk\.0\.ssm_conv1d\.weight has type Q8_0 but qwen3next accepts F32, F16, BF16/,
    ],
    [
      "qwen35moe",
      (m) => m.set(n("ffn_up_exps", 1), retype(m.get(n("ffn_up_exps", 1))!, "Q2_K")),
      /^Tensor blk\.1\.ffn_up_exps\.weight has type Q2_K/,
    ],
    [
      "qwen3next",
      (m) => m.set("blk.0.mystery.weight", m.get(n("ssm_a", 0))!),
      /^Tensor blk\.0\.mystery\.weight \(an unknown tensor name\) is not part of a qwen3next model/,
    ],
    [
      "qwen35moe",
      (m) => m.set(n("ssm_in", 3), m.get(n("attn_q", 3))!),
      /^Tensor blk\.3\.ssm_in\.weight \(registry id ssm_in, not used by qwen35moe\)/,
    ],
    [
      // qwen35moe needs separate beta/alpha: a grouped ssm_ba in their place is the wrong layout.
      "qwen35moe",
      (m) => {
        m.set(n("ssm_ba", 1), m.get(n("ssm_beta", 1))!);
        m.delete(n("ssm_beta", 1));
        m.delete(n("ssm_alpha", 1));
      },
      /^Layer 1 stores its DeltaNet inputs as "qkv_ba" but qwen35moe files use "qkv_beta_alpha"/,
    ],
    [
      // A legacy ssm_in next to the current attn_qkv: mixed layouts.
      "qwen3next",
      (m) => m.set(n("ssm_in", 0), { ...m.get(n("attn_qkv", 0))!, ne: [256, 1536] }),
      /^Tensor blk\.0\.attn_qkv\.weight does not belong to layer 0's DeltaNet layout "ssm_in"/,
    ],
    [
      "qwen3next",
      (m) => {
        m.delete(n("ssm_a", 0));
        m.delete(n("ssm_a", 1));
      },
      /^Tensor blk\.0\.ssm_a is missing .*\(and 1 more problem\(s\), next: Tensor blk\.1\.ssm_a is missing/,
    ],
  ];
  for (const [arch, edit, re] of cases) {
    const f = withTensors(files[arch], edit);
    const a = ARCHES[arch];
    const hp = a.readHparams(f.metadata);
    assert.throws(() => a.checkTensors(f, hp), (e: unknown) => {
      assert.ok(e instanceof GgufError, String(e));
      assert.equal(e.code, "bad_tensor");
      assert.match(e.message, re);
      assert.match(e.message, /\(file .*tiny-qwen/);
      return true;
    });
  }
});

Deno.test("checkTensors: tied output, legacy ssm_in layout, [D, 1] shexp gate, MTP block", async () => {
  using next = await fixture("qwen3next");
  using moe = await fixture("qwen35moe");
  const a = ARCHES.qwen3next;
  const hp = a.readHparams(next.metadata);
  const tied = withTensors(next, (m) => m.delete(tensorName("output")));
  assert.equal(a.checkTensors(tied, hp).tiedOutput, true);

  const legacy = withTensors(next, (m) => {
    const qkv = m.get(tensorName("attn_qkv", 1))!;
    m.set(tensorName("ssm_in", 1), { ...qkv, ne: [256, 2 * 2 * 128 + 2 * 512] });
    m.delete(tensorName("attn_qkv", 1));
    m.delete(tensorName("attn_gate", 1));
    const sh = m.get(tensorName("ffn_gate_inp_shexp", 0))!;
    m.set(tensorName("ffn_gate_inp_shexp", 0), { ...sh, ne: [256, 1] });
  });
  assert.deepEqual(a.checkTensors(legacy, hp).layouts, ["qkv_ba", "ssm_in", "qkv_ba", undefined]);

  // qwen35moe with nextn_predict_layers = 1: layer 3 becomes the MTP block (an attention block), optional.
  const b = ARCHES.qwen35moe;
  const meta = withKeys(moe.metadata, "qwen35moe", [["nextnPredictLayers", u32(1)], [
    "recurrentLayers",
    i32s([1, 1, 1, 0]),
  ]]);
  const mtp = new GgufFile(moe.parts, meta, moe.tensors, []);
  const hpm = b.readHparams(meta);
  const c = b.checkTensors(mtp, hpm);
  assert.equal(c.layouts.length, 3);
  assert.ok(c.mtpTensors.includes(tensorName("attn_q", 3)));
  assert.ok(c.mtpTensors.every((t) => t.startsWith(tensorName("attn_norm", 3).slice(0, 6))));
  const noMtp = withTensors(mtp, (m) => {
    for (const k of [...m.keys()]) if (k.startsWith(tensorName("attn_norm", 3).slice(0, 6))) m.delete(k);
  });
  assert.deepEqual(b.checkTensors(noMtp, hpm).mtpTensors, []);
});
