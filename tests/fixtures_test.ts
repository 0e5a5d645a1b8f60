/**
 * The float64 reference forward (`tests/ref/forward.ts`) against llama.cpp's own outputs on the tiny
 * fixture models (`tests/fixtures/README.md`): teacher-forced logits at every position of every
 * turn, and greedy tokens up to the first certified near-tie. This is the independent check that our
 * reading of spec `qwen3next.md` is right for both architectures.
 * @module
 */
import assert from "node:assert/strict";
import { openGguf } from "../engine/gguf.ts";
import { RefModel } from "./ref/forward.ts";

const FIXTURES = new URL("./fixtures", import.meta.url).pathname;
/**
 * Absolute logit tolerance: llama.cpp computes in f32, we in f64, both on the same dequantized weights;
 * a correct forward lands within ~1e-4, a real bug shows up as errors of order 1 (fixtures README).
 */
const LOGIT_ATOL = 1e-2;

/** One `[token id, logit]` entry of a top-5 list. */
type Top = readonly [number, number];

/** One turn of a reference case (fixtures README). */
interface Turn {
  readonly input_ids: readonly number[];
  readonly prompt_top5: readonly (readonly Top[])[];
  readonly generated: readonly number[];
  readonly gen_top5: readonly (readonly Top[])[];
  readonly first_near_tie_step: number | null;
}

/** The parts of `<model>.expect.json` this test reads. */
interface Expect {
  readonly arch: string;
  readonly model_bytes: number;
  readonly reference: {
    readonly cases: readonly { readonly name: string; readonly turns: readonly Turn[] }[];
  };
}

function fail(path: string, what: string): never {
  throw new SyntaxError(`Fixture ${path}: ${what}: regenerate the fixture or fix this reader`);
}

function isIds(x: unknown): x is number[] {
  return Array.isArray(x) && x.every((v) => Number.isInteger(v));
}

function isTops(x: unknown): x is Top[][] {
  return Array.isArray(x) &&
    x.every((row) =>
      Array.isArray(row) && row.length === 5 &&
      row.every((e) =>
        Array.isArray(e) && e.length === 2 && Number.isInteger(e[0]) && typeof e[1] === "number"
      )
    );
}

/** Reads and shape-checks an expect file (no `any` leaks past this point). */
async function readExpect(path: string): Promise<Expect> {
  const j: unknown = JSON.parse(await Deno.readTextFile(path));
  if (typeof j !== "object" || j === null) fail(path, "not a JSON object");
  const o = j as Record<string, unknown>;
  if (typeof o.arch !== "string" || typeof o.model_bytes !== "number") fail(path, "no arch/model_bytes");
  const ref = o.reference as { cases?: unknown } | undefined;
  if (!Array.isArray(ref?.cases) || ref.cases.length === 0) fail(path, "no reference.cases");
  for (const c of ref.cases as { name?: unknown; turns?: unknown }[]) {
    if (typeof c.name !== "string" || !Array.isArray(c.turns) || c.turns.length === 0) fail(path, "bad case");
    for (const t of c.turns as Record<string, unknown>[]) {
      const ok = isIds(t.input_ids) && isIds(t.generated) && isTops(t.prompt_top5) && isTops(t.gen_top5) &&
        t.prompt_top5.length === t.input_ids.length && t.gen_top5.length === t.generated.length &&
        t.generated.length > 0 && (t.first_near_tie_step === null || Number.isInteger(t.first_near_tie_step));
      if (!ok) fail(path, `case ${c.name}: malformed turn`);
    }
  }
  return j as Expect;
}

/** Index of the largest logit, lowest id on exact ties (the fixtures' greedy rule). */
function argmax(x: Float64Array): number {
  let best = 0;
  for (let i = 1; i < x.length; i++) if (x[i]! > x[best]!) best = i;
  return best;
}

/**
 * Compares our logits with one llama.cpp top-5 list: each listed logit within tolerance, no other token
 * above the 5th by more than the tolerance, and the same top-1 unless llama.cpp's top-2 gap is within the
 * tolerance. Returns the largest error on the listed ids.
 */
function checkTop5(got: Float64Array, want: readonly Top[], where: string): number {
  let maxErr = 0;
  for (const [id, logit] of want) {
    const err = Math.abs(got[id]! - logit);
    maxErr = Math.max(maxErr, err);
    if (!(err <= LOGIT_ATOL)) {
      throw new Error(
        `${where}: logit of token ${id} is ${got[id]} but llama.cpp has ${logit} (error ${err}, tolerance ` +
          `${LOGIT_ATOL}); top-5 wanted ${JSON.stringify(want)}`,
      );
    }
  }
  const listed = new Set(want.map(([id]) => id));
  const fifth = want[4]![1];
  for (let i = 0; i < got.length; i++) {
    if (!listed.has(i) && got[i]! > fifth + LOGIT_ATOL) {
      throw new Error(`${where}: token ${i} has logit ${got[i]} above llama.cpp's 5th-best ${fifth}`);
    }
  }
  const [top1, top2] = [want[0]!, want[1]!];
  if (top1[1] - top2[1] > LOGIT_ATOL) {
    assert.equal(argmax(got), top1[0], `${where}: top-1 token differs from llama.cpp's`);
  }
  return maxErr;
}

/**
 * Feeds the reference history (each turn's inputs as one batch, then `generated[:-1]` one token at a time;
 * the next turn starts with the last generated token) and checks every position. The greedy check runs on
 * the same pass: up to the first near-tie the free-running history equals the reference history (each
 * earlier step was checked equal), so the argmax here is exactly the free-running choice.
 * @returns the largest logit error seen
 */
function runCase(model: RefModel, name: string, turns: readonly Turn[]): number {
  model.reset();
  let maxErr = 0;
  turns.forEach((turn, k) => {
    const where = `${name} turn ${k}`;
    if (k > 0) {
      assert.equal(
        turn.input_ids[0],
        turns[k - 1]!.generated.at(-1),
        `${where}: does not continue turn ${k - 1}`,
      );
    }
    const logits = model.forward(turn.input_ids);
    logits.forEach((l, i) => {
      maxErr = Math.max(maxErr, checkTop5(l, turn.prompt_top5[i]!, `${where} prompt position ${i}`));
    });
    let l = logits.at(-1)!;
    const tie = turn.first_near_tie_step;
    for (let j = 0; j < turn.generated.length; j++) {
      if (j > 0) l = model.forward([turn.generated[j - 1]!])[0]!;
      const at = `${where} generation step ${j}`;
      maxErr = Math.max(maxErr, checkTop5(l, turn.gen_top5[j]!, at));
      const pick = argmax(l);
      if (tie === null || j < tie) {
        assert.equal(pick, turn.generated[j], `${at}: greedy token differs from llama.cpp's`);
      } else if (j === tie) {
        const top2 = turn.gen_top5[j]!.slice(0, 2).map(([id]) => id);
        assert.ok(top2.includes(pick), `${at}: greedy token ${pick} is not one of the near-tied ${top2}`);
      }
    }
  });
  return maxErr;
}

for (const model of ["tiny-qwen3next", "tiny-qwen35moe"]) {
  Deno.test(`${model}: float64 reference forward matches llama.cpp at every position`, async () => {
    const exp = await readExpect(`${FIXTURES}/${model}.q8_0.expect.json`);
    const path = `${FIXTURES}/${model}.q8_0.gguf`;
    assert.equal(
      (await Deno.stat(path)).size,
      exp.model_bytes,
      `${path} is not the file the fixture describes`,
    );
    using file = await openGguf(path);
    const ref = await RefModel.load(file);
    assert.equal(ref.hp.arch, exp.arch);
    for (const c of exp.reference.cases) {
      const err = runCase(ref, `${model} case ${c.name}`, c.turns);
      // A float64 forward must land far inside the bound: flag drift long before it reaches it.
      assert.ok(err < 1e-3, `${model} case ${c.name}: max logit error ${err} is suspiciously large`);
    }
  });
}

// The tiny models have n_k = 2 key heads and n_v = 4 value heads (r = 2): swap κ between the two rules
// of spec §9 and the fixtures must catch it (errors of order 10 in practice).
const WRONG_KAPPA: Record<string, (h: number) => number> = {
  "tiny-qwen3next": (h) => h % 2, // qwen35moe's tiled rule instead of floor(h / r)
  "tiny-qwen35moe": (h) => Math.floor(h / 2), // qwen3next's grouped rule instead of h mod n_k
};

for (const [model, kvGroupOfVHead] of Object.entries(WRONG_KAPPA)) {
  Deno.test(`${model}: the fixture rejects the other architecture's DeltaNet head mapping (κ)`, async () => {
    const exp = await readExpect(`${FIXTURES}/${model}.q8_0.expect.json`);
    using file = await openGguf(`${FIXTURES}/${model}.q8_0.gguf`);
    const wrong = await RefModel.load(file, { kvGroupOfVHead });
    assert.throws(() => runCase(wrong, "wrong κ", exp.reference.cases[0]!.turns), /llama\.cpp/);
  });
}
