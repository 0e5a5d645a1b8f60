/**
 * The GPU forward pass (`engine/exec/stage.ts`) against the float64 reference (`tests/ref/forward.ts`) on the
 * synthesized tiny models of both architectures, and against llama.cpp's own outputs on the fixture models:
 * teacher-forced logits, free-running greedy tokens up to a certified near-tie, chunked prefill, layer splits,
 * interleaved slots and snapshots.
 * @module
 */
import assert from "node:assert/strict";
import { openGguf } from "../engine/gguf.ts";
import { planModel, type QuantPreset, synthesize } from "../engine/synth.ts";
import { argmaxCpu, type Int8Logged, Stage } from "../engine/mod.ts";
import { samplingParams } from "../engine/sampling.ts";
import type { ArchName } from "../engine/models/mod.ts";
import { RefModel } from "./ref/forward.ts";
import { testGpu } from "./util/gpu.ts";
import { Rng } from "./util/rng.ts";
import { fixturePath } from "./util/fixtures.ts";

/**
 * Logit tolerance against the float64 reference, relative to the position's largest |logit|: the GPU
 * accumulates in f32 over rows of at most 512 and 4 layers, a few 1e-6 relative (measured ~1e-6); a wrong
 * op shows up at 1e-1 or more.
 */
const REF_RTOL = 1e-3;
/** Logit tolerance against llama.cpp (fixtures README: ~1e-4 for a correct f32 engine, bugs are O(1)). */
const LLAMA_ATOL = 1e-2;
/** Generated tokens compared per prompt. */
const N_GEN = 32;

const dir = await Deno.makeTempDir({ prefix: "forward_test_" });

async function synthTiny(
  arch: ArchName,
  quant: QuantPreset,
  layout: "current" | "legacy",
  seed: number,
  nExpert?: number,
) {
  const out = `${dir}/${arch}-${quant}-${layout}-${nExpert ?? 8}.gguf`;
  await synthesize(planModel({ arch, preset: "tiny", quant, seed, layout, nExpert }), { out });
  return out;
}

/** Max |got - ref| over one position, and the tolerance for it. */
function logitError(got: ArrayLike<number>, ref: ArrayLike<number>): { err: number; tol: number } {
  let err = 0;
  let mag = 0;
  for (let i = 0; i < ref.length; i++) {
    const e = Math.abs(got[i]! - ref[i]!);
    if (!(e <= err)) err = Number.isNaN(e) ? Infinity : e;
    mag = Math.max(mag, Math.abs(ref[i]!));
  }
  return { err, tol: REF_RTOL * mag };
}

/** Top-1 minus top-2 of a logit row. */
function gap12(v: ArrayLike<number>): number {
  let a = -Infinity;
  let b = -Infinity;
  for (let i = 0; i < v.length; i++) {
    const x = v[i]!;
    if (x > a) [a, b] = [x, a];
    else if (x > b) b = x;
  }
  return a - b;
}

// normPrologueMaxRows 0: decode pushes every norm as a dispatch of its own (the path of tall mat-vecs such
// as a real LM head) instead of in the next mat-vec's prologue; 65536: every mat-vec here takes its norm in
// the prologue (the in-projections too, which the default 1024 leaves to a dispatch of their own);
// fuseDecodeRoute: decode ranks the experts in the gate·up prologue (the default is a moe_route dispatch);
// groupedExperts: prefill chunks over 8 tokens run the experts as grouped matmuls (moe_group + moe_matmul),
// with groupedMinTokensPerExpert 0 and groupedMatvecMaxTokensPerExpert 0 (by default the tiny models' 8
// experts, 2 used, get at most 16 tokens each in these chunks, so they run as grouped mat-vecs, moe_gmv: the
// other models cover that);
// nExpert 64: the router's rows for the shared expert's gate start 256-byte aligned, so the router and the
// shared gate run as one mat-vec (decode, and chunks of mat-vec columns at a stride of 65 words per column).
const MODELS: {
  arch: ArchName;
  quant: QuantPreset;
  layout: "current" | "legacy";
  normPrologueMaxRows?: number;
  fuseDecodeRoute?: boolean;
  groupedExperts?: boolean;
  kvF16?: boolean;
  nExpert?: number;
  /** Also show that the grouped mat-vecs ran: a per-column stage gives other bits. */
  gmv?: boolean;
}[] = [
  { arch: "qwen35moe", quant: "f32", layout: "current", gmv: true },
  { arch: "qwen35moe", quant: "iq4_xs", layout: "current", normPrologueMaxRows: 0 },
  { arch: "qwen3next", quant: "f32", layout: "legacy", normPrologueMaxRows: 65536 },
  { arch: "qwen3next", quant: "iq4_xs", layout: "current", fuseDecodeRoute: true },
  { arch: "qwen35moe", quant: "iq4_xs", layout: "current", groupedExperts: true },
  { arch: "qwen3next", quant: "q8_0", layout: "current", kvF16: true },
  { arch: "qwen35moe", quant: "q8_0", layout: "current", nExpert: 64 },
];

for (const m of MODELS) {
  const norms = m.normPrologueMaxRows === 0
    ? ", norms as own dispatches"
    : m.normPrologueMaxRows
    ? `, norm prologues up to ${m.normPrologueMaxRows} rows`
    : "";
  const route = m.fuseDecodeRoute ? ", decode routing in the gate·up prologue" : "";
  const grouped = m.groupedExperts
    ? ", experts as grouped matmuls in prefill"
    : m.gmv
    ? ", experts as grouped mat-vecs in prefill (other bits than per column)"
    : "";
  const kv = m.kvF16 ? ", f16 KV cache (the reference rounds K and V alike)" : "";
  const experts = m.nExpert ? `, ${m.nExpert} experts (router and shared gate in one mat-vec)` : "";
  Deno.test(`GPU forward ≡ float64 reference: ${m.arch} ${m.quant} ${m.layout}${norms}${route}${grouped}${kv}${experts}, teacher-forced and greedy`, async () => {
    const rng = new Rng();
    const gpu = await testGpu();
    const path = await synthTiny(m.arch, m.quant, m.layout, rng.u32(), m.nExpert);
    using file = await openGguf(path);
    const stage = await Stage.load(gpu, file, {
      nCtx: 128,
      nSlots: 1,
      maxChunk: 16,
      normPrologueMaxRows: m.normPrologueMaxRows,
      fuseDecodeRoute: m.fuseDecodeRoute,
      groupedExperts: m.groupedExperts,
      groupedMinTokensPerExpert: m.groupedExperts ? 0 : undefined,
      groupedMatvecMaxTokensPerExpert: m.groupedExperts ? 0 : undefined,
      kvF16: m.kvF16,
    });
    // groupedExperts: the same stage without it, to show that the grouped path ran (other bits).
    // kvF16 too: an f32-KV stage, to show that the option reached the kernels (other bits).
    const plain = m.groupedExperts || m.kvF16 || m.gmv
      ? await Stage.load(gpu, file, { nCtx: 128, nSlots: 1, maxChunk: 16, groupedExperts: false })
      : undefined;
    const ref = await RefModel.load(file, { kvF16: m.kvF16 });
    try {
      for (let p = 0; p < 2; p++) {
        // Grouped: prompts wider than 8 tokens, so that the prefill takes the grouped path.
        const len = rng.int(m.groupedExperts ? 9 : 1, 20);
        const prompt = Array.from({ length: len }, () => rng.int(0, stage.hp.nVocab));
        const what = `${m.arch} ${m.quant} ${m.layout} prompt ${prompt} (seed ${rng.seed})`;
        ref.reset();
        // Free-running reference greedy, recording each step's logits.
        const refLogits: Float64Array[] = [ref.forward(prompt).at(-1)!];
        const refTokens: number[] = [];
        for (let i = 0; i < N_GEN; i++) {
          const id = argmaxCpu(refLogits.at(-1)!);
          refTokens.push(id);
          if (i + 1 < N_GEN) refLogits.push(ref.forward([id]).at(-1)!);
        }
        const got = await stage.generate(0, prompt, { nNew: N_GEN, batch: 8, top: 2 });
        assert.equal(got.tokens.length, N_GEN, what);
        for (let i = 0; i < N_GEN; i++) {
          if (got.tokens[i] === refTokens[i]) continue;
          // Allowed only at a certified near-tie of the reference (gap below the logit tolerance).
          const { tol } = logitError(refLogits[i]!, refLogits[i]!);
          assert.ok(
            gap12(refLogits[i]!) < 2 * tol,
            `${what}: step ${i} GPU ${got.tokens[i]} ref ${refTokens[i]}`,
          );
          break;
        }
        // Teacher-forced with the reference history: every position's logits.
        const history = [...prompt, ...refTokens.slice(0, -1)];
        const tf = await stage.run(0, { tokens: history }, 0, { rows: "all" });
        const V = stage.hp.nVocab;
        for (let i = 0; i < N_GEN; i++) {
          const at = prompt.length - 1 + i;
          const { err, tol } = logitError(tf.data.subarray(at * V, (at + 1) * V), refLogits[i]!);
          assert.ok(err <= tol, `${what}: position ${at} logit error ${err} > ${tol}`);
        }
        if (plain) {
          const other = await plain.run(0, { tokens: history }, 0, { rows: "all" });
          assert.ok(
            other.data.some((v, i) => v !== tf.data[i]),
            `${what}: ${m.kvF16 ? "f16 and f32 KV" : "grouped and per-column prefill"} agree bit for bit`,
          );
        }
      }
    } finally {
      stage.destroy();
      plain?.destroy();
    }
  });
}

/**
 * The reference's name for the rounding a logged int8 x fed (label `L<l>.<tensor>...` or `output...`), in a
 * chunk of n tokens with `used` experts per token. Expert passes: `L<l>.ffn_exps[+shexp].gate_up` logs x per
 * token; `.down` per activation column (token·used + slot for the routed ones, then one shared column per
 * token); `L<l>.ffn_shexp.*` the shared expert on its own (slot `used`).
 */
function int8Key(label: string, col: number, n: number, used: number): string {
  if (label.startsWith("output")) return `-1/head/${col}`;
  const e = /^L(\d+)\.ffn_(exps|exps\+shexp|shexp)\.(gate_up|down)$/.exec(label);
  if (e) {
    if (e[3] === "gate_up") return `${e[1]}/moe_in/${col}`;
    if (e[2] === "shexp") return `${e[1]}/moe_act/${col}.${used}`;
    return col < used * n
      ? `${e[1]}/moe_act/${Math.floor(col / used)}.${col % used}`
      : `${e[1]}/moe_act/${col - used * n}.${used}`;
  }
  const m = /^L(\d+)\.([a-z_]+)/.exec(label);
  assert.ok(m, `unexpected int8 mat-vec label ${label}`);
  const source = m[2] === "attn_output" ? "attn_o" : m[2] === "ssm_out" ? "ssm_o" : "in";
  return `${m[1]}/${source}/${col}`;
}

// int8 rounding is discontinuous: the f32 engine and the float64 reference, 1e-7 apart before rounding, now
// and then round an element to neighbouring values, and state and routing carry that on (docs/ARCHITECTURE.md).
// So the reference checks each of the engine's rounding decisions against its own x and continues with it.
Deno.test("int8 activations (all, and the experts' alone): GPU ≡ float64 reference fed the GPU's checked rounding decisions", async () => {
  const rng = new Rng();
  const gpu = await testGpu();
  // normPrologueMaxRows 0: x is rounded by quantize_q8 dispatches instead of matvec_q8_fused prologues;
  // groupedExperts (with groupedMinTokensPerExpert 0): the 12-token chunk's experts read their rounded x
  // through the grouped matmul; experts: int8Experts alone (the projections keep f32 x, and only the experts'
  // x is rounded and logged).
  // 64 experts: the router fuses with the shared expert's gate, so the mat-vec chunks and one-token steps
  // take the post-attention norm into the router and moe_route (moeTakesNorm; checked below).
  const models = [
    ["qwen35moe", "iq4_xs", "current", undefined, false, false, undefined],
    ["qwen3next", "q8_0", "legacy", 0, true, false, undefined],
    ["qwen35moe", "iq4_xs", "current", undefined, false, true, undefined],
    ["qwen35moe", "q8_0", "current", undefined, false, false, 64],
  ] as const;
  for (const [arch, quant, layout, normPrologueMaxRows, groupedExperts, experts, nExpert] of models) {
    const path = await synthTiny(arch, quant, layout, rng.u32(), nExpert);
    using file = await openGguf(path);
    const stage = await Stage.load(gpu, file, {
      nCtx: 64,
      nSlots: 1,
      maxChunk: 16,
      int8Activations: !experts,
      int8Experts: experts,
      int8Log: true,
      normPrologueMaxRows,
      groupedExperts,
      groupedMinTokensPerExpert: groupedExperts ? 0 : undefined,
      groupedMatvecMaxTokensPerExpert: groupedExperts ? 0 : undefined,
    });
    const logged = new Map<string, Int8Logged>();
    const asked = new Set<string>();
    const ref = await RefModel.load(file, {
      int8Activations: !experts,
      int8Experts: experts,
      int8Decisions: (at) => {
        const key = `${at.layer}/${at.source}/${at.token}${at.slot === undefined ? "" : `.${at.slot}`}`;
        const e = logged.get(key);
        if (!e) throw new Error(`the GPU logged no int8 x for ${key}`);
        asked.add(key);
        return e;
      },
    });
    try {
      const tokens = Array.from({ length: 28 }, () => rng.int(0, stage.hp.nVocab));
      // A chunk of 12 (prefill: matmul and moe_matvec read x rounded by quantize_q8 ROUND), one of 8 and one
      // of 5 (mat-vec chunks), then one-token steps (the decode graph: the norm rides on the quantize).
      const chunks = [
        tokens.slice(0, 12),
        tokens.slice(12, 20),
        tokens.slice(20, 25),
        ...tokens.slice(25).map((t) => [t]),
      ];
      let base = 0;
      for (const chunk of chunks) {
        const what =
          `${arch} ${quant} ${layout} normPrologueMaxRows ${normPrologueMaxRows} grouped ${groupedExperts} ` +
          `experts alone ${experts} nExpert ${nExpert ?? 8} ` +
          `tokens ${base}..` +
          `${base + chunk.length} (seed ${rng.seed})`;
        const got = await stage.run(0, { tokens: chunk }, base, { rows: "all" });
        if (chunk.length <= 8) {
          // Mat-vec columns: the router takes the norm (matvec NORM 2, moe_route NORM) exactly where it fuses
          // with the shared expert's gate, and no post-attention norm has a dispatch of its own then.
          const labels = (await stage.graph(0, chunk.length, "all")).map((op) => op.label);
          const taken = labels.filter((l) => l.endsWith("moe_route+post_attention_norm")).length;
          assert.equal(taken, nExpert === 64 ? stage.hp.nLayer : 0, `${what}: routings that take the norm`);
          if (nExpert === 64) {
            const own = labels.filter((l) => /^L\d+\.post_attention_norm$/.test(l));
            assert.deepEqual(own, [], `${what}: post-attention norms of their own`);
          }
        }
        logged.clear();
        asked.clear();
        const times = new Map<string, number>();
        for (const e of await stage.int8Log()) {
          const key = int8Key(e.label, e.col, chunk.length, stage.hp.nExpertUsed);
          times.set(key, (times.get(key) ?? 0) + 1);
          const prev = logged.get(key);
          // Two mat-vecs reading the same x (attn_q, attn_k, ... unfused) must have rounded it alike.
          if (prev) {
            assert.deepEqual([prev.q, prev.d], [e.q, e.d], `${what}: ${key} rounded twice, differently`);
          }
          logged.set(key, e);
        }
        const sources = new Set([...logged.keys()].map((k) => k.split("/")[1]));
        if (experts) {
          assert.deepEqual([...sources].sort(), ["moe_act", "moe_in"], `${what}: int8 x outside the experts`);
        } else assert.ok(sources.has("in") && sources.has("moe_in"), `${what}: rounded x ${[...sources]}`);
        if (chunk.length > 8) {
          // A prefill chunk rounds a block's input once for all its projections (the rounded x is reused).
          const again = [...times].filter(([k, n]) => k.includes("/in/") && n > 1);
          assert.deepEqual(again, [], `${what}: inputs rounded more than once`);
        }
        let want: Float64Array[];
        try {
          want = ref.forward(chunk);
        } catch (e) {
          // The reference's check of a rounding decision: name the case and the seed that reproduces it.
          throw new Error(`${what}: ${(e as Error).message}`, { cause: e });
        }
        assert.deepEqual(
          [...logged.keys()].filter((k) => !asked.has(k)),
          [],
          `${what}: int8 x the reference never reads`,
        );
        const V = stage.hp.nVocab;
        for (let t = 0; t < chunk.length; t++) {
          const { err, tol } = logitError(got.data.subarray(t * V, (t + 1) * V), want[t]!);
          assert.ok(err <= tol, `${what}: position ${base + t} logit error ${err} > ${tol}`);
        }
        base += chunk.length;
      }
    } finally {
      stage.destroy();
    }
  }
});

// The checks above must be able to fail: a scale off by one step or an element rounded one step off, in the row
// chunk with the largest scale (where the drift INT8_X_DRIFT allows least), is refused by the reference.
Deno.test("int8 activations: the reference refuses a rounding decision off by a step", async () => {
  const rng = new Rng();
  const gpu = await testGpu();
  const path = await synthTiny("qwen35moe", "iq4_xs", "current", rng.u32());
  using file = await openGguf(path);
  const stage = await Stage.load(gpu, file, {
    nCtx: 64,
    nSlots: 1,
    maxChunk: 16,
    int8Activations: true,
    int8Log: true,
  });
  try {
    const chunk = Array.from({ length: 12 }, () => rng.int(0, stage.hp.nVocab));
    await stage.run(0, { tokens: chunk }, 0, { rows: "all" });
    const logged = new Map<string, Int8Logged>();
    for (const e of await stage.int8Log()) {
      logged.set(int8Key(e.label, e.col, chunk.length, stage.hp.nExpertUsed), e);
    }
    // One decision (layer 0's input, token 3) altered in its largest-scale chunk; every other as logged.
    const target = "0/in/3";
    const e = logged.get(target)!;
    assert.ok(e, `the GPU logged ${target}`);
    const c = e.d.indexOf(Math.max(...e.d));
    const alter = (how: "scale" | "element") => {
      const q = Int8Array.from(e.q);
      const d = Float32Array.from(e.d);
      if (how === "scale") d[c] = d[c]! * 128 / 127;
      else {
        const i = 32 * c + q.subarray(32 * c, 32 * c + 32).findIndex((v) => Math.abs(v) < 127);
        q[i] = q[i]! + 1;
      }
      return { ...e, q, d };
    };
    const refWith = (swap?: Int8Logged) =>
      RefModel.load(file, {
        int8Activations: true,
        int8Decisions: (at) => {
          const key = `${at.layer}/${at.source}/${at.token}${at.slot === undefined ? "" : `.${at.slot}`}`;
          return key === target && swap ? swap : logged.get(key)!;
        },
      });
    (await refWith()).forward(chunk); // as logged: accepted
    const what = `seed ${rng.seed}, chunk ${c}`;
    await assert.rejects(
      async () => (await refWith(alter("scale"))).forward(chunk),
      new RegExp(`layer 0 in token 3 .*chunk ${c} scale`),
      `${what}: a scale off by a step`,
    );
    await assert.rejects(
      async () => (await refWith(alter("element"))).forward(chunk),
      /layer 0 in token 3 .*element \d+ is -?\d+ but x\/d = /,
      `${what}: an element off by a step`,
    );
  } finally {
    stage.destroy();
  }
});

Deno.test("chunked prefill (chunks 1, 7, 64) equals token-by-token feeding within f32 summation order", async () => {
  const rng = new Rng();
  const gpu = await testGpu();
  using file = await openGguf(fixturePath("tiny-qwen35moe.q8_0.gguf"));
  const tokens = Array.from({ length: 70 }, () => rng.int(0, 1021));
  const results: Float32Array[] = [];
  for (const maxChunk of [1, 7, 64]) {
    const stage = await Stage.load(gpu, file, { nCtx: 128, nSlots: 1, maxChunk });
    results.push((await stage.run(0, { tokens }, 0, { rows: "all" })).data);
    stage.destroy();
  }
  // Different chunkings run different matvec batch variants, and chunks wider than 8 run the chunked (WY)
  // DeltaNet form instead of the recurrence: the same math in another f32 order, so the logits agree to f32
  // rounding at most.
  for (const [i, r] of results.entries()) {
    const { err, tol } = logitError(r, results[0]!);
    assert.ok(err <= tol * 1e-2, `chunking ${[1, 7, 64][i]}: max error ${err} (seed ${rng.seed})`);
  }
});

Deno.test("every layer boundary as a two-stage split equals the unsplit stage, bit for bit", async () => {
  const rng = new Rng();
  const gpu = await testGpu();
  using file = await openGguf(fixturePath("tiny-qwen3next.q8_0.gguf"));
  const whole = await Stage.load(gpu, file, { nCtx: 64, nSlots: 1, maxChunk: 8 });
  const tokens = Array.from({ length: 12 }, () => rng.int(0, 1021));
  const want = (await whole.run(0, { tokens }, 0, { rows: "all" })).data;
  const nLayer = whole.hp.nLayer;
  whole.destroy();
  for (let cut = 1; cut < nLayer; cut++) {
    const a = await Stage.load(gpu, file, { nCtx: 64, nSlots: 1, maxChunk: 8, layers: [0, cut] });
    const b = await Stage.load(gpu, file, { nCtx: 64, nSlots: 1, maxChunk: 8, layers: [cut, nLayer] });
    const hidden = await a.run(0, { tokens }, 0, { rows: "all" });
    assert.equal(hidden.kind, "hidden");
    const got = await b.run(0, { hidden: hidden.data, nTokens: tokens.length }, 0, { rows: "all" });
    assert.deepEqual(got.data, want, `split at layer ${cut} (seed ${rng.seed})`);
    a.destroy();
    b.destroy();
  }
});

Deno.test("two slots interleaved step by step equal their solo runs; snapshot, run on, restore, rerun", async () => {
  const rng = new Rng();
  const gpu = await testGpu();
  using file = await openGguf(fixturePath("tiny-qwen35moe.q8_0.gguf"));
  const stage = await Stage.load(gpu, file, { nCtx: 64, nSlots: 2, maxChunk: 8 });
  try {
    const prompts = [0, 1].map(() => Array.from({ length: rng.int(2, 10) }, () => rng.int(0, 1021)));
    const solo: number[][] = [];
    for (const p of prompts) solo.push((await stage.generate(0, p, { nNew: 12 })).tokens);
    // Interleaved: prefill both, then one step each in turn (CPU-fed, through run()).
    const seqs = prompts.map((p) => [...p]);
    const gen: number[][] = [[], []];
    for (const s of [0, 1]) gen[s]!.push(argmaxCpu((await stage.run(s, { tokens: seqs[s]! }, 0)).data));
    for (let i = 1; i < 12; i++) {
      for (const s of [0, 1]) {
        const prev = gen[s]!.at(-1)!;
        const out = await stage.run(s, { tokens: [prev] }, stage.length(s));
        gen[s]!.push(argmaxCpu(out.data));
      }
    }
    assert.deepEqual(gen, solo, `seed ${rng.seed}`);
    // Snapshot after the prompt, run on, restore, rerun: the same tokens again.
    await stage.run(1, { tokens: prompts[1]! }, 0);
    const snap = stage.snapshot(1);
    const first = await stage.run(1, { tokens: [solo[1]![0]!, solo[1]![1]!] }, prompts[1]!.length, {
      rows: "all",
    });
    stage.restore(snap, 1);
    assert.equal(stage.length(1), prompts[1]!.length);
    const again = await stage.run(1, { tokens: [solo[1]![0]!, solo[1]![1]!] }, prompts[1]!.length, {
      rows: "all",
    });
    assert.deepEqual(again.data, first.data, `seed ${rng.seed}`);
    // Restoring into the other slot continues the same sequence there.
    stage.restore(snap, 0);
    const other = await stage.run(0, { tokens: [solo[1]![0]!, solo[1]![1]!] }, prompts[1]!.length, {
      rows: "all",
    });
    assert.deepEqual(other.data, first.data, `seed ${rng.seed}`);
    stage.states.drop(snap);
    // Generation continuing a prefilled slot (base) equals generation over the whole sequence.
    const whole = [...prompts[0]!, ...prompts[1]!];
    const ref = await stage.generate(1, whole, { nNew: 10, batch: 4 });
    await stage.run(0, { tokens: prompts[0]! }, 0);
    const cont = await stage.generate(0, prompts[1]!, { nNew: 10, batch: 4, base: prompts[0]!.length });
    assert.deepEqual(cont.tokens, ref.tokens, `generate from base (seed ${rng.seed})`);
    assert.equal(stage.length(0), stage.length(1));
    // A run aborted mid-generation keeps what it emitted and rewinds the slot to match it exactly.
    const full = await stage.generate(0, prompts[0]!, { nNew: 20, batch: 4 });
    const ac = new AbortController();
    let seen = 0;
    const cut = await stage.generate(0, prompts[0]!, {
      nNew: 20,
      batch: 4,
      signal: ac.signal,
      onTokens: (ids) => {
        seen += ids.length;
        if (seen >= 6) ac.abort();
      },
    });
    assert.equal(cut.reason, "cancelled");
    assert.ok(cut.tokens.length < 20, `aborted run emitted ${cut.tokens.length}`);
    assert.deepEqual(cut.tokens, full.tokens.slice(0, cut.tokens.length), `seed ${rng.seed}`);
    assert.equal(stage.length(0), prompts[0]!.length + cut.tokens.length - 1);
    const next = await stage.run(0, { tokens: [cut.tokens.at(-1)!] }, stage.length(0));
    assert.equal(
      argmaxCpu(next.data),
      full.tokens[cut.tokens.length],
      `state after abort (seed ${rng.seed})`,
    );
  } finally {
    stage.destroy();
  }
});

Deno.test("generate with GPU sampling: seeded runs repeat, seeds differ, greedy settings equal argmax", async () => {
  const rng = new Rng();
  const gpu = await testGpu();
  using file = await openGguf(fixturePath("tiny-qwen35moe.q8_0.gguf"));
  const stage = await Stage.load(gpu, file, { nCtx: 64, nSlots: 1, maxChunk: 8 });
  try {
    const prompt = Array.from({ length: 5 }, () => rng.int(0, 1021));
    const hot = samplingParams({ temperature: 1.5, topK: 0, topP: 1, minP: 0, seed: 1234 });
    const a = await stage.generate(0, prompt, { nNew: 24, batch: 4, sampling: hot });
    const b = await stage.generate(0, prompt, { nNew: 24, batch: 4, sampling: hot });
    const c = await stage.generate(0, prompt, { nNew: 24, batch: 4, sampling: { ...hot, seed: 99 } });
    const greedy = await stage.generate(0, prompt, { nNew: 24, batch: 4 });
    const cold = await stage.generate(0, prompt, {
      nNew: 24,
      batch: 4,
      sampling: samplingParams({ temperature: 0, seed: 5 }),
    });
    assert.deepEqual(a.tokens, b.tokens, "same seed, same tokens");
    assert.notDeepEqual(a.tokens, c.tokens, "another seed, other tokens");
    assert.notDeepEqual(a.tokens, greedy.tokens, "temperature 1.5 over 24 tokens leaves the greedy path");
    assert.deepEqual(cold.tokens, greedy.tokens, `temperature 0 is the greedy path (seed ${rng.seed})`);
    // A repetition penalty at temperature 0 runs the sampler and can only change ids, never the rest.
    const penalized = await stage.generate(0, prompt, {
      nNew: 24,
      batch: 4,
      sampling: samplingParams({ temperature: 0, repeatPenalty: 1.5, seed: 5 }),
    });
    assert.equal(penalized.tokens.length, 24);
  } finally {
    stage.destroy();
  }
});

Deno.test("generate reports each stop reason: length, stop id (state rewound exactly), context full", async () => {
  const rng = new Rng();
  const gpu = await testGpu();
  using file = await openGguf(fixturePath("tiny-qwen3next.q8_0.gguf"));
  const stage = await Stage.load(gpu, file, { nCtx: 24, nSlots: 1, maxChunk: 8 });
  try {
    const prompt = Array.from({ length: 6 }, () => rng.int(0, 1021));
    const full = await stage.generate(0, prompt, { nNew: 12, batch: 4 });
    assert.equal(full.reason, "length");
    assert.equal(full.tokens.length, 12);
    // Stop at the 7th id: found late inside a batch, the overshoot is dropped and the slot rewound.
    const stopId = full.tokens[6]!;
    const firstAt = full.tokens.indexOf(stopId);
    const stopped = await stage.generate(0, prompt, { nNew: 12, batch: 4, stopIds: [stopId] });
    assert.equal(stopped.reason, "stop");
    assert.deepEqual(stopped.tokens, full.tokens.slice(0, firstAt + 1), `seed ${rng.seed}`);
    assert.equal(stage.length(0), prompt.length + firstAt);
    const next = await stage.run(0, { tokens: [stopId] }, stage.length(0));
    assert.equal(
      argmaxCpu(next.data),
      full.tokens[firstAt + 1],
      `state after a late stop (seed ${rng.seed})`,
    );
    // Context: 24 positions hold the prompt and 18 fed ids, so at most 19 ids come out.
    const ctx = await stage.generate(0, prompt, { nNew: 40, batch: 4 });
    assert.equal(ctx.reason, "context");
    assert.equal(ctx.tokens.length, 24 - prompt.length + 1);
  } finally {
    stage.destroy();
  }
});

Deno.test("bad runs fail with specific errors and lose nothing", async () => {
  const gpu = await testGpu();
  using file = await openGguf(fixturePath("tiny-qwen3next.q8_0.gguf"));
  const stage = await Stage.load(gpu, file, { nCtx: 16, nSlots: 1, maxChunk: 8 });
  try {
    await stage.run(0, { tokens: [1, 2, 3] }, 0);
    await assert.rejects(
      stage.run(0, { tokens: [4] }, 1),
      /Slot 0 holds 3 tokens but the run continues at position 1/,
    );
    await assert.rejects(
      stage.run(0, { tokens: new Array(14).fill(1) }, 3),
      /17 tokens does not fit the context of 16/,
    );
    await assert.rejects(
      stage.run(0, { tokens: [1024] }, 3),
      /Token id 1024 is outside the vocabulary 0..1023/,
    );
    await assert.rejects(stage.run(1, { tokens: [1] }, 0), /Slot 1 does not exist/);
    assert.equal(stage.length(0), 3, "a rejected run leaves the slot as it was");
    await assert.rejects(
      Stage.load(gpu, file, { nCtx: 16, nSlots: 1, layers: [2, 9] }),
      /Layer range 2:9 is not within 0:4/,
    );
  } finally {
    stage.destroy();
  }
});

/** One turn of a llama.cpp reference case (tests/fixtures/README.md). */
interface Turn {
  readonly input_ids: number[];
  readonly prompt_top5: [number, number][][];
  readonly generated: number[];
  readonly gen_top5: [number, number][][];
  readonly first_near_tie_step: number | null;
}

for (const name of ["tiny-qwen3next", "tiny-qwen35moe"]) {
  Deno.test(`GPU forward reproduces llama.cpp on ${name}.q8_0: teacher-forced logits and greedy tokens`, async () => {
    const gpu = await testGpu();
    using file = await openGguf(fixturePath(`${name}.q8_0.gguf`));
    const expect = JSON.parse(await Deno.readTextFile(fixturePath(`${name}.q8_0.expect.json`)));
    const cases = expect.reference.cases as { name: string; turns: Turn[] }[];
    assert.ok(cases.length > 0);
    const stage = await Stage.load(gpu, file, { nCtx: 256, nSlots: 1, maxChunk: 32 });
    const V = stage.hp.nVocab;
    const checkTop = (row: Float32Array, top: [number, number][], what: string) => {
      for (const [id, logit] of top) {
        assert.ok(
          Math.abs(row[id]! - logit) <= LLAMA_ATOL,
          `${what}: logit of ${id} is ${row[id]}, llama.cpp ${logit}`,
        );
      }
    };
    try {
      for (const c of cases) {
        // Teacher-forced through every turn with the reference history.
        let pos = 0;
        for (const [t, turn] of c.turns.entries()) {
          const fed = await stage.run(0, { tokens: turn.input_ids }, pos, { rows: "all" });
          pos += turn.input_ids.length;
          turn.prompt_top5.forEach((top, i) =>
            checkTop(fed.data.subarray(i * V, (i + 1) * V), top, `${name} ${c.name} turn ${t} input ${i}`)
          );
          const hist = turn.generated.slice(0, -1);
          if (hist.length > 0) {
            const gen = await stage.run(0, { tokens: hist }, pos, { rows: "all" });
            pos += hist.length;
            for (let j = 1; j < turn.generated.length; j++) {
              checkTop(
                gen.data.subarray((j - 1) * V, j * V),
                turn.gen_top5[j]!,
                `${name} ${c.name} turn ${t} gen ${j}`,
              );
            }
          }
        }
        // Free-running greedy from the first turn, up to the first certified near-tie.
        const turn = c.turns[0]!;
        const got = await stage.generate(0, turn.input_ids, { nNew: turn.generated.length, top: 2 });
        const upTo = turn.first_near_tie_step ?? turn.generated.length;
        assert.deepEqual(got.tokens.slice(0, upTo), turn.generated.slice(0, upTo), `${name} ${c.name}`);
        if (upTo < turn.generated.length) {
          const tied = turn.gen_top5[upTo]!.slice(0, 2).map(([id]) => id);
          assert.ok(tied.includes(got.tokens[upTo]!), `${name} ${c.name}: near-tie step ${upTo}`);
        }
      }
    } finally {
      stage.destroy();
    }
  });
}

globalThis.addEventListener("unload", () => {
  Deno.removeSync(dir, { recursive: true });
});
