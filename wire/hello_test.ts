import assert from "node:assert/strict";
import { WireError } from "./errors.ts";
import { checkChain, checkWholeChain, type HelloField, type HelloInfo, parseHelloInfo } from "./hello.ts";
import { sampleHeadHello, sampleHello } from "./_testing.ts";

const HEAD = sampleHeadHello();
const WORKER = sampleHello();
const names = { prevName: "this head", nextName: "worker 10.0.0.2:9100" };

Deno.test("hello: a matching head and last worker chain", () => {
  assert.equal(checkChain(HEAD, WORKER, names), undefined);
  assert.equal(checkWholeChain(HEAD, [WORKER]), undefined);
});

/** Each field's mismatch: the worker's change, the field reported, and what the message must name. */
const CASES: readonly [string, Partial<HelloInfo>, HelloField, RegExp][] = [
  [
    "protocol",
    { protocol: 1 },
    "protocol",
    /this head .*version 2 but worker 10\.0\.0\.2:9100 speaks version 1/,
  ],
  [
    "build version",
    { build: { version: "0.2.0", commit: "abc1234" } },
    "build",
    /runs 0\.1\.0 \(commit abc1234\) but .* runs 0\.2\.0 \(commit abc1234\)/,
  ],
  [
    "build commit",
    { build: { version: "0.1.0", commit: "def5678" } },
    "build",
    /commit abc1234.*commit def5678/,
  ],
  ["arch", { arch: "qwen3next" }, "arch", /this head has qwen35moe but worker .* has qwen3next/],
  [
    "total layers",
    { layers: { first: 6, end: 48, total: 48 } },
    "totalLayers",
    /model of 12 layers but .* one of 48/,
  ],
  ["width", { nEmbd: 16 }, "nEmbd", /nEmbd 8 but worker .* has 16/],
  [
    "state layout",
    { stateLayout: "kv=f16;ssm=f32" },
    "stateLayout",
    /"kv=f32;ssm=f32" but .* "kv=f16;ssm=f32"/,
  ],
  [
    "int8",
    { numerics: { int8Activations: true, int8Experts: true, hiddenDtype: "f32" } },
    "int8Activations",
    /int8 activations differ: this head runs f32 x everywhere \(--f32-experts\) but worker .* runs int8 x for every mat-vec \(the default\): start every stage with the same one of/,
  ],
  [
    "int8 experts",
    { numerics: { int8Activations: false, int8Experts: true, hiddenDtype: "f32" } },
    "int8Experts",
    /int8 x for the experts differs: .* runs f32 x everywhere \(--f32-experts\) but worker .* runs int8 x for the experts alone \(--int8-experts\): start every stage with the same one of: no numerics flag/,
  ],
  [
    "hidden dtype",
    { numerics: { int8Activations: false, int8Experts: false, hiddenDtype: "f16" } },
    "hiddenDtype",
    /sends f32 but .* expects f16/,
  ],
  ["fingerprint", { fingerprint: "cd".repeat(32) }, "fingerprint", /has (ab){32} but worker .* has (cd){32}/],
  [
    "range gap",
    { layers: { first: 7, end: 12, total: 12 } },
    "range",
    /ends at layer 6 but worker .* \(layers 7:12 of 12\) starts at layer 7: start it with --layers 6:12/,
  ],
  [
    "range overlap",
    { layers: { first: 5, end: 12, total: 12 } },
    "range",
    /ends at layer 6 but .* starts at layer 5/,
  ],
  [
    "last short",
    { layers: { first: 6, end: 10, total: 12 } },
    "last",
    /\(layers 6:10 of 12\) claims to be the last stage but ends before the last layer 11/,
  ],
  ["slots", { nSlots: 2 }, "nSlots", /worker .* has 2 slots but this head has 4: start it with --slots 4/],
  ["context", { nCtx: 128 }, "nCtx", /--ctx 128 but this head has --ctx 256/],
];

for (const [label, change, field, message] of CASES) {
  Deno.test(`hello: ${label} mismatch is refused naming both values`, () => {
    const r = checkChain(HEAD, sampleHello(change), names);
    assert.ok(r, `no refusal for ${label}`);
    assert.equal(r.field, field);
    assert.match(r.message, message);
  });
}

Deno.test("hello: more slots and a longer context than the head are fine", () => {
  assert.equal(checkChain(HEAD, sampleHello({ nSlots: 8, nCtx: 1024 })), undefined);
});

Deno.test("hello: whole chain: a middle worker's downstream must continue it and end with a last stage", () => {
  const mid = sampleHello({ layers: { first: 6, end: 9, total: 12 }, last: false });
  const tail = sampleHello({ layers: { first: 9, end: 12, total: 12 } });
  assert.equal(checkWholeChain(HEAD, [mid, tail]), undefined);
  const noTail = checkWholeChain(HEAD, [mid]);
  assert.equal(noTail?.field, "last");
  assert.match(noTail!.message, /chain ends at stage 2 \(layers 6:9 of 12\), which is not a last stage/);
  const gap = checkWholeChain(HEAD, [mid, sampleHello({ layers: { first: 10, end: 12, total: 12 } })]);
  assert.equal(gap?.field, "range");
  assert.match(gap!.message, /stage 2 .* ends at layer 9 but stage 3 .* starts at layer 10/);
  const early = checkWholeChain(HEAD, [sampleHello({ layers: { first: 6, end: 9, total: 12 } }), tail]);
  assert.equal(early?.field, "last");
  const badTail = checkWholeChain(HEAD, [
    mid,
    sampleHello({ layers: { first: 9, end: 12, total: 12 }, nSlots: 1 }),
  ]);
  assert.equal(badTail?.field, "nSlots");
});

Deno.test("hello: parseHelloInfo accepts a JSON round trip and names the first bad field", () => {
  const json = JSON.parse(JSON.stringify({ ...WORKER, downstream: [sampleHello()] }));
  assert.deepStrictEqual(parseHelloInfo(json, "worker x"), { ...WORKER, downstream: [sampleHello()] });
  const bad = (v: unknown, re: RegExp) =>
    assert.throws(
      () => parseHelloInfo(v, "worker x"),
      (e: unknown) => e instanceof WireError && e.code === "bad_hello" && re.test(e.message),
    );
  bad(null, /field \(hello\) must be an object/);
  bad({ ...json, arch: 7 }, /field arch must be a string .* got 7/);
  bad({ ...json, arch: "x".repeat(300) }, /field arch must be a string of at most 256/);
  bad({ ...json, last: "yes" }, /field last must be true or false/);
  bad({ ...json, nSlots: 0 }, /field nSlots must be an integer in \[1, 65535\] but got 0/);
  bad({ ...json, nCtx: 1.5 }, /field nCtx/);
  bad({ ...json, limits: { ...json.limits, maxFrameBytes: 10 } }, /limits\.maxFrameBytes/);
  bad(
    { ...json, numerics: { int8Activations: false, int8Experts: false, hiddenDtype: "bf16" } },
    /hiddenDtype must be "f32" or "f16" but got "bf16"/,
  );
  bad(
    { ...json, numerics: { int8Activations: false, int8Experts: "yes", hiddenDtype: "f32" } },
    /numerics\.int8Experts must be true or false/,
  );
  // A hello without int8Experts (before the field existed) says false.
  assert.equal(
    parseHelloInfo({ ...json, numerics: { int8Activations: false, hiddenDtype: "f32" } }, "worker x").numerics
      .int8Experts,
    false,
  );
  bad({ ...json, build: undefined }, /field build must be an object but it is missing/);
  bad(
    { ...json, downstream: [{ ...json, downstream: [WORKER] }] },
    /downstream\[\]\.downstream must be empty/,
  );
  bad({ ...json, downstream: "x" }, /field downstream must be an array/);
});

Deno.test("hello: a head and a worker of different KV element types (--kv-f16 on one) refuse each other", async () => {
  const { stateLayout } = await import("./chain.ts");
  assert.notEqual(stateLayout(true), stateLayout(false));
  const r = checkChain(
    sampleHeadHello({ stateLayout: stateLayout(false) }),
    sampleHello({ stateLayout: stateLayout(true) }),
    names,
  );
  assert.equal(r?.field, "stateLayout");
  assert.match(r!.message, /this head has "kv=f32;ssm=f32" but worker 10\.0\.0\.2:9100 has "kv=f16;ssm=f32"/);
});
