import assert from "node:assert/strict";
import fc from "fast-check";
import { f16BitsToF32, f32ToF16Bits } from "./_f16.ts";
import { WireError, type WireErrorCode } from "./errors.ts";
import {
  decodeFrame,
  encodeFrame,
  type Frame,
  FrameDecoder,
  type FrameLimits,
  HEADER_BYTES,
  limitsOf,
  OP,
  type RunRequest,
} from "./frame.ts";
import { sampleHello } from "./_testing.ts";

const HELLO = sampleHello();
const LIM: FrameLimits = limitsOf(HELLO); // nSlots 4, nEmbd 8, nCtx 256, maxRows 64, maxDraft 4, maxTopK 8

/** Rounds each value as the f16 wire does. */
function viaF16(xs: Float32Array): Float32Array {
  return xs.map((x) => f16BitsToF32(f32ToF16Bits(x)));
}

function throwsWire(fn: () => unknown, code: WireErrorCode, match?: RegExp): void {
  assert.throws(fn, (e: unknown) => {
    if (!(e instanceof WireError)) throw new Error(`expected WireError ${code}, got ${e}`);
    assert.deepStrictEqual(e.code, code, e.message);
    if (match && !match.test(e.message)) throw new Error(`message ${e.message} does not match ${match}`);
    return true;
  });
}

function run(over: Partial<RunRequest> = {}): RunRequest {
  return {
    slot: 1,
    basePos: 10,
    nEmbd: 8,
    rows: new Float32Array(16).map((_, i) => i - 3.25),
    dtype: "f32",
    want: "all",
    topK: 0,
    drafts: new Uint32Array(0),
    ...over,
  };
}

// ---------------------------------------------------------------------------------------------------------
// Arbitraries for every op

const u32 = fc.integer({ min: 0, max: 0xffff_ffff });
const slot = fc.integer({ min: 0, max: LIM.nSlots - 1 });
const message = fc.string({ maxLength: 200 });
const code = fc.constantFrom<WireErrorCode>("bad_magic", "refused", "auth", "timeout", "backend");

const samplingArb = fc.record({
  temperature: fc.double({ min: 0, max: 100, noNaN: true }),
  topK: u32,
  topP: fc.double({ min: 0, max: 1, noNaN: true }),
  minP: fc.double({ min: 0, max: 1, noNaN: true }),
  repeatPenalty: fc.double({ min: 0, max: 10, noNaN: true }),
  presencePenalty: fc.double({ min: -2, max: 2, noNaN: true }),
  frequencyPenalty: fc.double({ min: -2, max: 2, noNaN: true }),
  penaltyLastN: fc.integer({ min: -1, max: 256 }),
  seed: fc.maxSafeNat(),
  step: u32,
}, { requiredKeys: [] }).chain((base) =>
  fc.option(fc.uint32Array({ maxLength: 256 }), { nil: undefined }).map((history) => ({
    temperature: 0,
    topK: 0,
    topP: 1,
    minP: 0,
    repeatPenalty: 1,
    presencePenalty: 0,
    frequencyPenalty: 0,
    penaltyLastN: 64,
    seed: 1,
    step: 0,
    ...base,
    ...(history ? { history } : {}),
  }))
);

const runArb: fc.Arbitrary<RunRequest> = fc.record({
  slot,
  nRows: fc.integer({ min: 1, max: 6 }),
  dtype: fc.constantFrom("f32" as const, "f16" as const),
  want: fc.constantFrom("none" as const, "last" as const, "all" as const, "ids" as const),
  basePos: fc.integer({ min: 0, max: 200 }),
  nDraft: fc.integer({ min: 0, max: 4 }),
  topK: fc.integer({ min: 0, max: 8 }),
  sampling: fc.option(samplingArb, { nil: undefined }),
  seed: fc.integer(),
}).chain((r) =>
  fc.float32Array({ minLength: r.nRows * 8, maxLength: r.nRows * 8, noDefaultInfinity: true, noNaN: true })
    .chain(
      (rows) =>
        fc.uint32Array({
          minLength: Math.min(r.nDraft, r.nRows - 1),
          maxLength: Math.min(r.nDraft, r.nRows - 1),
        })
          .map((drafts) => ({
            slot: r.slot,
            basePos: r.basePos,
            nEmbd: 8,
            rows,
            dtype: r.dtype,
            want: r.want,
            topK: r.want === "ids" ? r.topK : 0,
            drafts,
            ...(r.want === "ids" && r.sampling ? { sampling: r.sampling } : {}),
          })),
    )
);

const resultArb = fc.oneof(
  fc.record({ kind: fc.constant("none" as const), timesUs: fc.array(u32, { maxLength: 16 }) }),
  fc.record({
    nRows: fc.integer({ min: 1, max: 5 }),
    dtype: fc.constantFrom("f32" as const, "f16" as const),
    timesUs: fc.array(u32, { maxLength: 16 }),
  }).chain((r) =>
    fc.float32Array({ minLength: r.nRows * 8, maxLength: r.nRows * 8, noNaN: true }).map((rows) => ({
      kind: "hidden" as const,
      rows,
      nEmbd: 8,
      dtype: r.dtype,
      timesUs: r.timesUs,
    }))
  ),
  fc.record({
    n: fc.integer({ min: 1, max: 5 }),
    topK: fc.integer({ min: 0, max: 8 }),
    timesUs: fc.array(u32, { maxLength: 16 }),
  }).chain((r) =>
    fc.tuple(
      fc.uint32Array({ minLength: r.n, maxLength: r.n }),
      fc.uint32Array({ minLength: r.n * r.topK, maxLength: r.n * r.topK }),
      fc.float32Array({ minLength: r.n * r.topK, maxLength: r.n * r.topK, noNaN: true }),
    ).map(([ids, topIds, topLogits]) => ({
      kind: "ids" as const,
      ids,
      topK: r.topK,
      topIds,
      topLogits,
      timesUs: r.timesUs,
    }))
  ),
);

const frameArb: fc.Arbitrary<Frame> = fc.oneof(
  fc.record({
    op: fc.constantFrom("hello" as const, "hello_ack" as const),
    id: u32,
    hello: fc.record({
      auth: fc.boolean(),
      nonce: fc.uint8Array({ minLength: 32, maxLength: 32 }),
      info: fc.constant(HELLO),
    }),
  }),
  fc.record({
    op: fc.constantFrom("hello_refuse" as const, "close" as const, "error" as const),
    id: u32,
    reason: fc.record({ code, message }),
  }),
  fc.record({
    op: fc.constantFrom("auth" as const, "ready" as const),
    id: u32,
    proof: fc.oneof(fc.constant(new Uint8Array(0)), fc.uint8Array({ minLength: 32, maxLength: 32 })),
  }),
  fc.record({ op: fc.constant("run" as const), id: u32, run: runArb }),
  fc.record({ op: fc.constant("run_result" as const), id: u32, result: resultArb }),
  fc.record({ op: fc.constantFrom("snapshot_save" as const, "reset" as const), id: u32, slot }),
  fc.record({ op: fc.constant("snapshot_restore" as const), id: u32, snapshotId: u32, slot }),
  fc.record({ op: fc.constant("snapshot_drop" as const), id: u32, snapshotId: u32 }),
  fc.record({ op: fc.constant("done" as const), id: u32, value: u32 }),
  fc.record({
    op: fc.constantFrom("ping" as const, "pong" as const),
    id: u32,
    sentMs: fc.double({ noNaN: true }),
  }),
);

/** What decoding `f` must give: f16 rows rounded, everything else as sent. */
function expected(f: Frame): Frame {
  if (f.op === "run" && f.run.dtype === "f16") return { ...f, run: { ...f.run, rows: viaF16(f.run.rows) } };
  if (f.op === "run_result" && f.result.kind === "hidden" && f.result.dtype === "f16") {
    return { ...f, result: { ...f.result, rows: viaF16(f.result.rows) } };
  }
  return f;
}

/** Typed arrays compare by content and type; decoded f32 rows may be views, so compare copies. */
function plain(f: Frame): unknown {
  return JSON.parse(
    JSON.stringify(
      f,
      (k, v) =>
        k === "payload"
          ? undefined
          : ArrayBuffer.isView(v)
          ? { type: v.constructor.name, values: Array.from(v as unknown as ArrayLike<number>) }
          : v,
    ),
  );
}

Deno.test("frame: every op round-trips (random frames, f16 rows rounded to nearest)", () => {
  fc.assert(
    fc.property(frameArb, (f) => {
      assert.deepStrictEqual(plain(decodeFrame(encodeFrame(f), LIM)), plain(expected(f)));
    }),
    { numRuns: 400 },
  );
});

Deno.test("frame: the stream decoder gives the same frames for any split of the byte stream", () => {
  fc.assert(
    fc.property(
      fc.array(frameArb, { minLength: 1, maxLength: 6 }),
      fc.array(fc.nat(), { maxLength: 20 }),
      (fs, cuts) => {
        const bytes = new Uint8Array(fs.reduce((s, f) => s + encodeFrame(f).length, 0));
        let at = 0;
        for (const f of fs) {
          const b = encodeFrame(f);
          bytes.set(b, at);
          at += b.length;
        }
        const points = [...new Set(cuts.map((c) => c % (bytes.length + 1)))].sort((a, b) => a - b);
        const dec = new FrameDecoder(LIM);
        const got: Frame[] = [];
        let prev = 0;
        for (const p of [...points, bytes.length]) {
          got.push(...dec.push(bytes.slice(prev, p)));
          prev = p;
        }
        dec.end();
        assert.deepStrictEqual(plain(got as unknown as Frame), plain(fs.map(expected) as unknown as Frame));
      },
    ),
    { numRuns: 150 },
  );
});

Deno.test("frame: f32 rows are exact, f16 rows round to nearest even and keep the special values", () => {
  const rows = new Float32Array([
    0,
    -0,
    1,
    1 / 3,
    65504,
    65520,
    1e-8,
    2 ** -24,
    3 * 2 ** -25,
    Infinity,
    -Infinity,
    NaN,
  ]);
  const padded = new Float32Array(16);
  padded.set(rows);
  const f32 = decodeFrame(encodeFrame({ op: "run", id: 1, run: run({ rows: padded }) }), LIM);
  if (f32.op !== "run") throw new Error("not a run");
  assert.deepStrictEqual(Array.from(f32.run.rows).map(String), Array.from(padded).map(String));
  const f16 = decodeFrame(encodeFrame({ op: "run", id: 1, run: run({ rows: padded, dtype: "f16" }) }), LIM);
  if (f16.op !== "run") throw new Error("not a run");
  const got = Array.from(f16.run.rows.subarray(0, rows.length)).map(String);
  // 1/3 → 0x3555 = 0.333251953125; 65520 rounds up to Inf; 3·2^-25 is a tie → even (2·2^-24).
  assert.deepStrictEqual(got, [
    "0",
    "0",
    "1",
    "0.333251953125",
    "65504",
    "Infinity",
    "0",
    String(2 ** -24),
    String(2 * 2 ** -24),
    "Infinity",
    "-Infinity",
    "NaN",
  ]);
  assert.deepStrictEqual(Object.is(f16.run.rows[1], -0), true);
  // Every finite f16 value survives f16 → f32 → f16 unchanged.
  for (let h = 0; h < 0x10000; h++) {
    if ((h & 0x7c00) === 0x7c00 && (h & 0x3ff) !== 0) continue;
    const back = f32ToF16Bits(f16BitsToF32(h));
    if (back !== h) throw new Error(`f16 0x${h.toString(16)} came back as 0x${back.toString(16)}`);
  }
});

// ---------------------------------------------------------------------------------------------------------
// Every malformed-frame class

function withHeader(bytes: Uint8Array, edit: (dv: DataView, b: Uint8Array) => void): Uint8Array {
  const b = bytes.slice();
  edit(new DataView(b.buffer), b);
  return b;
}

const GOOD_RUN = encodeFrame({ op: "run", id: 3, run: run() });

Deno.test("frame: each malformed header gives its specific WireError", () => {
  throwsWire(
    () => decodeFrame(withHeader(GOOD_RUN, (_dv, b) => b[0] = 0x48), LIM),
    "bad_magic",
    /magic is 0x4d4c4c48/,
  );
  throwsWire(
    () => decodeFrame(withHeader(GOOD_RUN, (dv) => dv.setUint32(4, LIM.maxFrameBytes, true)), LIM),
    "oversize",
    /exceeds the maximum frame size of 1048576/,
  );
  throwsWire(() => decodeFrame(withHeader(GOOD_RUN, (_dv, b) => b[8] = 0x77), LIM), "unknown_op", /op 0x77/);
  throwsWire(() => decodeFrame(withHeader(GOOD_RUN, (_dv, b) => b[9] = 1), LIM), "bad_flags", /flags 0x1/);
  throwsWire(() => decodeFrame(withHeader(GOOD_RUN, (_dv, b) => b[11] = 1), LIM), "bad_flags", /reserved/);
  throwsWire(() => decodeFrame(GOOD_RUN.subarray(0, 10), LIM), "truncated");
  throwsWire(() => decodeFrame(GOOD_RUN.subarray(0, GOOD_RUN.length - 1), LIM), "truncated");
  const longer = new Uint8Array(GOOD_RUN.length + 1);
  longer.set(GOOD_RUN);
  throwsWire(() => decodeFrame(longer, LIM), "bad_length", /header says/);
});

/** A frame of op `op` with exactly `payload`. */
function raw(op: number, payload: Uint8Array, id = 1): Uint8Array {
  const b = new Uint8Array(HEADER_BYTES + payload.length);
  const dv = new DataView(b.buffer);
  dv.setUint32(0, 0x4d4c4c57, true);
  dv.setUint32(4, payload.length, true);
  b[8] = op;
  dv.setUint32(12, id, true);
  b.set(payload, HEADER_BYTES);
  return b;
}

/** The payload of a good RUN with `edit` applied. */
function runPayload(edit: (dv: DataView, b: Uint8Array) => void, r: RunRequest = run()): Uint8Array {
  const p = encodeFrame({ op: "run", id: 1, run: r }).slice(HEADER_BYTES);
  edit(new DataView(p.buffer), p);
  return p;
}

Deno.test("frame: each malformed RUN payload gives its specific WireError", () => {
  const dec = (p: Uint8Array) => decodeFrame(raw(OP.run, p), LIM);
  throwsWire(() => dec(new Uint8Array(10)), "short_payload", /10 bytes is shorter than the 24 bytes/);
  throwsWire(() => dec(runPayload(() => {}).subarray(0, 30)), "bad_length", /payload is 30 bytes but/);
  const extra = new Uint8Array(runPayload(() => {}).length + 4);
  extra.set(runPayload(() => {}));
  throwsWire(() => dec(extra), "bad_length");
  throwsWire(
    () => dec(runPayload((dv) => dv.setUint16(0, 4, true))),
    "out_of_range",
    /slot 4 is outside \[0, 3\]/,
  );
  throwsWire(
    () => dec(runPayload((dv) => dv.setUint32(4, 65, true))),
    "out_of_range",
    /nRows 65 is outside \[1, 64\]/,
  );
  throwsWire(() => dec(runPayload((dv) => dv.setUint32(4, 0, true))), "out_of_range", /nRows 0/);
  throwsWire(
    () => dec(runPayload((dv) => dv.setUint32(8, 255, true))),
    "out_of_range",
    /basePos \+ nRows 257/,
  );
  throwsWire(
    () => dec(runPayload((dv) => dv.setUint16(16, 2, true))),
    "out_of_range",
    /nDraft 2 is outside \[0, 1\]/,
  );
  throwsWire(
    () => dec(runPayload((dv) => dv.setUint16(18, 1, true))),
    "out_of_range",
    /topK 1 is outside \[0, 0\]/,
  );
  throwsWire(() => dec(runPayload((_dv, b) => b[2] = 9)), "bad_value", /want is 9/);
  throwsWire(() => dec(runPayload((_dv, b) => b[3] = 2)), "bad_value", /dtype is 2/);
  throwsWire(
    () => dec(runPayload((dv) => dv.setUint32(12, 16, true))),
    "bad_value",
    /nEmbd is 16 but must be the receiver's width 8/,
  );
  throwsWire(() => dec(runPayload((_dv, b) => b[20] = 4)), "bad_value", /sampling flags/);
  throwsWire(() => dec(runPayload((_dv, b) => b[22] = 1)), "bad_flags", /reserved byte 22/);
  const sampled = run({
    want: "ids",
    topK: 2,
    sampling: {
      temperature: 0.7,
      topK: 40,
      topP: 0.9,
      minP: 0.05,
      repeatPenalty: 1,
      presencePenalty: 0,
      frequencyPenalty: 0,
      penaltyLastN: 64,
      seed: 42,
      step: 3,
    },
  });
  throwsWire(
    () => dec(runPayload((dv) => dv.setFloat64(24, NaN, true), sampled)),
    "bad_value",
    /temperature is NaN/,
  );
  throwsWire(
    () => dec(runPayload((dv) => dv.setBigUint64(72, 2n ** 60n, true), sampled)),
    "bad_value",
    /seed/,
  );
  throwsWire(
    () => dec(runPayload((dv) => dv.setUint32(92, 1, true), sampled)),
    "bad_value",
    /nHistory is 1 but must be 0 without the history flag/,
  );
  throwsWire(() => dec(runPayload(() => {}, sampled).subarray(0, 50)), "short_payload", /sampling block/);
  // Each sampling field outside its domain, the flags out of their combinations, a history beyond its cap.
  throwsWire(
    () => dec(runPayload((dv) => dv.setFloat64(24, -0.5, true), sampled)),
    "bad_value",
    /temperature/,
  );
  throwsWire(
    () => dec(runPayload((dv) => dv.setFloat64(32, 1.5, true), sampled)),
    "bad_value",
    /topP is 1.5/,
  );
  throwsWire(() => dec(runPayload((dv) => dv.setFloat64(40, -1, true), sampled)), "bad_value", /minP/);
  throwsWire(
    () => dec(runPayload((dv) => dv.setFloat64(48, Infinity, true), sampled)),
    "bad_value",
    /repeat/,
  );
  throwsWire(() => dec(runPayload((dv) => dv.setInt32(84, -2, true), sampled)), "bad_value", /penaltyLastN/);
  throwsWire(() => dec(runPayload((_dv, b) => b[20] = 2)), "bad_value", /sampling flags is 2/);
  throwsWire(
    () => dec(runPayload((dv, b) => (b[2] = 0, dv.setUint16(18, 0, true)), sampled)),
    "bad_value",
    /0 when want is none/,
  );
  const withHistory = run({
    want: "ids",
    topK: 0,
    drafts: Uint32Array.of(7),
    rows: new Float32Array(16),
    sampling: { ...sampled.sampling!, history: Uint32Array.of(1, 2, 3) },
  });
  const back = dec(runPayload(() => {}, withHistory));
  assert.ok(back.op === "run");
  assert.deepStrictEqual(plain(back), plain({ op: "run", id: 1, run: withHistory }));
  throwsWire(
    () => dec(runPayload((dv) => dv.setUint32(92, 257, true), withHistory)),
    "out_of_range",
    /nHistory 257/,
  );
  throwsWire(
    () => dec(runPayload((dv) => dv.setUint32(92, 4, true), withHistory)),
    "bad_length",
  );
});

Deno.test("frame: malformed payloads of the other ops give their specific WireError", () => {
  throwsWire(() => decodeFrame(raw(OP.reset, new Uint8Array([9, 0, 0, 0])), LIM), "out_of_range", /slot 9/);
  throwsWire(() => decodeFrame(raw(OP.snapshot_save, new Uint8Array([1])), LIM), "short_payload");
  throwsWire(() => decodeFrame(raw(OP.snapshot_restore, new Uint8Array(12)), LIM), "bad_length");
  throwsWire(
    () => decodeFrame(raw(OP.snapshot_restore, new Uint8Array([1, 0, 0, 0, 7, 0, 0, 0])), LIM),
    "out_of_range",
  );
  throwsWire(() => decodeFrame(raw(OP.ping, new Uint8Array(4)), LIM), "short_payload");
  throwsWire(() => decodeFrame(raw(OP.auth, new Uint8Array(5)), LIM), "short_payload", /proof/);
  throwsWire(() => decodeFrame(raw(OP.auth, new Uint8Array(33)), LIM), "bad_length");
  throwsWire(
    () => decodeFrame(raw(OP.error, new Uint8Array([200, 0, 0, 0])), LIM),
    "bad_value",
    /error code is 200/,
  );
  throwsWire(() => decodeFrame(raw(OP.error, new Uint8Array([1, 0, 0, 0, 0xff])), LIM), "bad_value", /UTF-8/);
  throwsWire(
    () => decodeFrame(raw(OP.error, new Uint8Array(4 + 4097).fill(65, 4).fill(0, 0, 4).fill(1, 0, 1)), LIM),
    "out_of_range",
  );
  const result = (edit: (dv: DataView, b: Uint8Array) => void) => {
    const f = encodeFrame({
      op: "run_result",
      id: 1,
      result: { kind: "hidden", rows: new Float32Array(8), nEmbd: 8, dtype: "f32", timesUs: [] },
    });
    edit(new DataView(f.buffer, HEADER_BYTES), f.subarray(HEADER_BYTES));
    return decodeFrame(f, LIM);
  };
  throwsWire(() => result((_dv, b) => b[0] = 3), "bad_value", /kind is 3/);
  throwsWire(() => result((dv) => dv.setUint32(4, 65, true)), "out_of_range", /nRows 65/);
  throwsWire(() => result((dv) => dv.setUint32(4, 2, true)), "bad_length");
  throwsWire(() => result((dv) => dv.setUint32(8, 4, true)), "bad_value", /nEmbd is 4/);
  throwsWire(() => result((_dv, b) => b[2] = 17), "out_of_range", /nTimes 17/);
});

Deno.test("frame: a malformed hello gives bad_hello, another protocol version gives refused naming both", () => {
  const good = encodeFrame({
    op: "hello",
    id: 0,
    hello: { auth: false, nonce: new Uint8Array(32), info: HELLO },
  });
  const payload = good.slice(HEADER_BYTES);
  const withJson = (json: string) => {
    const j = new TextEncoder().encode(json);
    const p = new Uint8Array(36 + j.length);
    p.set(payload.subarray(0, 36));
    p.set(j, 36);
    return raw(OP.hello, p);
  };
  throwsWire(() => decodeFrame(withJson("{not json"), LIM), "bad_hello", /not valid UTF-8 JSON/);
  throwsWire(
    () => decodeFrame(withJson(JSON.stringify({ ...HELLO, nEmbd: "8" })), LIM),
    "bad_hello",
    /field nEmbd must be an integer/,
  );
  throwsWire(
    () => decodeFrame(withJson(JSON.stringify({ ...HELLO, fingerprint: "xyz" })), LIM),
    "bad_hello",
    /fingerprint must be 64 lowercase hex/,
  );
  throwsWire(
    () => decodeFrame(withJson(JSON.stringify({ ...HELLO, layers: { first: 5, end: 5, total: 12 } })), LIM),
    "bad_hello",
    /layers/,
  );
  throwsWire(
    () => decodeFrame(withJson(JSON.stringify({ ...HELLO, protocol: 1 })), LIM),
    "bad_hello",
    /header protocol 2 but the hello JSON says 1/,
  );
  throwsWire(() => decodeFrame(withJson("[]"), LIM), "bad_hello");
  // Version 1 (before RUN_BATCH) is refused.
  const v1 = payload.slice();
  v1[0] = 1;
  throwsWire(
    () => decodeFrame(raw(OP.hello, v1), LIM),
    "refused",
    /peer speaks version 1 but this side speaks version 2/,
  );
  throwsWire(() => decodeFrame(raw(OP.hello, payload.subarray(0, 20)), LIM), "short_payload");
});

Deno.test("frame: the stream decoder refuses an oversize length before buffering the payload, and a cut stream", () => {
  const dec = new FrameDecoder(LIM);
  throwsWire(
    () =>
      dec.push(withHeader(GOOD_RUN, (dv) => dv.setUint32(4, 0xffff_fff0, true)).subarray(0, HEADER_BYTES)),
    "oversize",
  );
  throwsWire(() => dec.push(GOOD_RUN), "oversize"); // poisoned: the stream lost sync
  const cut = new FrameDecoder(LIM);
  assert.deepStrictEqual(cut.push(GOOD_RUN.subarray(0, 20)), []);
  throwsWire(() => cut.end(), "truncated", /ended inside frame run with 4 of its/);
});

Deno.test("frame: random and corrupted byte streams raise only WireError", () => {
  const check = (chunks: Uint8Array[]) => {
    const dec = new FrameDecoder(LIM);
    try {
      for (const c of chunks) dec.push(c);
      dec.end();
    } catch (e) {
      if (!(e instanceof WireError) || e.message.startsWith("Internal error")) throw e;
    }
  };
  fc.assert(fc.property(fc.array(fc.uint8Array({ maxLength: 200 }), { maxLength: 8 }), check), {
    numRuns: 500,
  });
  // A valid header of every op with a random payload of mostly small bytes (so that enumerations and counts
  // often pass and the later checks are reached).
  const smallBytes = fc.array(
    fc.oneof({ arbitrary: fc.constant(0), weight: 4 }, fc.integer({ min: 0, max: 3 }), fc.nat(255)),
    {
      maxLength: 120,
    },
  ).map((a) => new Uint8Array(a));
  fc.assert(
    fc.property(fc.constantFrom(...Object.values(OP)), smallBytes, (op, payload) => {
      check([raw(op, payload)]);
    }),
    { numRuns: 3000 },
  );
  // Valid frames with bytes flipped, truncated or spliced: these reach deep into every payload decoder.
  fc.assert(
    fc.property(
      frameArb,
      fc.array(fc.tuple(fc.nat(), fc.integer({ min: 0, max: 255 })), { maxLength: 4 }),
      fc.nat(),
      (f, flips, cut) => {
        const b = encodeFrame(f);
        // Flips land in the first 40 payload bytes, where every op keeps its counts and enumerations.
        const span = Math.max(1, Math.min(40, b.length - HEADER_BYTES));
        for (const [at, v] of flips) b[HEADER_BYTES + (at % span)] = v;
        check([b.subarray(0, Math.min(b.length, HEADER_BYTES + (cut % (b.length + 1))))]);
        check([b]);
      },
    ),
    { numRuns: 1500 },
  );
});
