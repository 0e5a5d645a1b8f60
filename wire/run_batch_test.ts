/**
 * RUN_BATCH (docs/WIRE.md, protocol 2): round trips of frames with and without sampling blocks and histories,
 * f32 and f16 rows, and each malformed field's specific WireError.
 * @module
 */
import assert from "node:assert/strict";
import { WireError, type WireErrorCode } from "./errors.ts";
import {
  decodeFrame,
  encodeFrame,
  type FrameLimits,
  HEADER_BYTES,
  limitsOf,
  OP,
  type RunBatchRequest,
  type WireSampling,
} from "./frame.ts";
import { sampleHello } from "./_testing.ts";

const LIM: FrameLimits = limitsOf(sampleHello()); // nSlots 4, nEmbd 8, nCtx 256, maxRows 64, maxTopK 8

const SAMPLING: WireSampling = {
  temperature: 0.7,
  topK: 40,
  topP: 0.9,
  minP: 0.05,
  repeatPenalty: 1.1,
  presencePenalty: 0,
  frequencyPenalty: 0.25,
  penaltyLastN: 64,
  seed: 2 ** 40 + 3,
  step: 9,
  history: Uint32Array.of(5, 6, 7),
};

const { history: _, ...rest } = SAMPLING;
const NO_HISTORY: WireSampling = { ...rest, seed: 1 };

function batch(over: Partial<RunBatchRequest> = {}): RunBatchRequest {
  return {
    entries: [
      { slot: 2, basePos: 17 },
      { slot: 0, basePos: 4, sampling: SAMPLING },
      { slot: 3, basePos: 255, sampling: NO_HISTORY },
    ],
    nEmbd: 8,
    rows: new Float32Array(24).map((_, i) => i * 0.375 - 2),
    dtype: "f32",
    want: "ids",
    topK: 4,
    ...over,
  };
}

function throwsWire(fn: () => unknown, code: WireErrorCode, match?: RegExp): void {
  assert.throws(fn, (e: unknown) => {
    if (!(e instanceof WireError)) throw new Error(`expected WireError ${code}, got ${e}`);
    assert.equal(e.code, code, e.message);
    if (match && !match.test(e.message)) throw new Error(`message ${e.message} does not match ${match}`);
    return true;
  });
}

/** A frame of RUN_BATCH with exactly `payload`. */
function raw(payload: Uint8Array): Uint8Array {
  const b = new Uint8Array(HEADER_BYTES + payload.length);
  const dv = new DataView(b.buffer);
  dv.setUint32(0, 0x4d4c4c57, true);
  dv.setUint32(4, payload.length, true);
  b[8] = OP.run_batch;
  dv.setUint32(12, 1, true);
  b.set(payload, HEADER_BYTES);
  return b;
}

/** The payload of `r` (a good frame by default) with `edit` applied. */
function payload(edit: (dv: DataView, b: Uint8Array) => void, r = batch()): Uint8Array {
  const p = encodeFrame({ op: "run_batch", id: 1, run: r }).slice(HEADER_BYTES);
  edit(new DataView(p.buffer), p);
  return p;
}

Deno.test("RUN_BATCH: entries, sampling blocks, histories and rows round-trip (f32 exact, f16 rounded)", () => {
  assert.equal(OP.run_batch, 0x12);
  const r = batch();
  const f = decodeFrame(encodeFrame({ op: "run_batch", id: 7, run: r }), LIM);
  assert.equal(f.op, "run_batch");
  if (f.op !== "run_batch") return;
  assert.equal(f.id, 7);
  assert.deepEqual(f.run, r);
  const plain = batch({
    entries: [{ slot: 1, basePos: 0 }],
    rows: new Float32Array(8).fill(1.5),
    want: "none",
    topK: 0,
  });
  const g = decodeFrame(encodeFrame({ op: "run_batch", id: 8, run: plain }), LIM);
  assert.deepEqual(g.op === "run_batch" && g.run, plain);
  // 16 fixed bytes, 8 per entry, 72 + 12 and 72 sampling bytes, 3 rows of 8 f16.
  const h = encodeFrame({ op: "run_batch", id: 9, run: batch({ dtype: "f16" }) });
  assert.equal(h.length, HEADER_BYTES + 16 + 3 * 8 + 72 + 12 + 72 + 3 * 8 * 2);
  const d = decodeFrame(h, LIM);
  assert.deepEqual(d.op === "run_batch" && Array.from(d.run.rows), Array.from(batch().rows)); // exact in f16
});

Deno.test("RUN_BATCH: each malformed field gives its specific WireError", () => {
  const dec = (p: Uint8Array) => decodeFrame(raw(p), LIM);
  throwsWire(() => dec(new Uint8Array(10)), "short_payload", /10 bytes is shorter than the 16 bytes/);
  throwsWire(() => dec(payload((dv) => dv.setUint16(0, 0, true))), "out_of_range", /nEntries 0/);
  throwsWire(
    () => dec(payload((dv) => dv.setUint16(0, 5, true))),
    "out_of_range",
    /nEntries 5 is outside \[1, 4\]/,
  );
  throwsWire(() => dec(payload((_dv, b) => b[2] = 2)), "bad_value", /want is 2/);
  throwsWire(() => dec(payload((_dv, b) => b[3] = 3)), "bad_value", /dtype is 3/);
  throwsWire(() => dec(payload((dv) => dv.setUint32(4, 16, true))), "bad_value", /nEmbd is 16/);
  throwsWire(
    () => dec(payload((dv) => dv.setUint16(8, 9, true))),
    "out_of_range",
    /topK 9 is outside \[0, 8\]/,
  );
  throwsWire(() => dec(payload((_dv, b) => b[12] = 1)), "bad_flags", /reserved byte 12/);
  // Entry 0 starts at 16: slot, flags, reserved, basePos.
  throwsWire(
    () => dec(payload((dv) => dv.setUint16(16, 4, true))),
    "out_of_range",
    /slot 4 is outside \[0, 3\]/,
  );
  throwsWire(
    () => dec(payload((dv) => dv.setUint16(16, 0, true))),
    "bad_value",
    /slot is 0 but must be a slot not/,
  );
  throwsWire(() => dec(payload((_dv, b) => b[18] = 2)), "bad_value", /sampling flags/);
  throwsWire(() => dec(payload((_dv, b) => b[18] = 4)), "bad_value", /sampling flags/);
  throwsWire(() => dec(payload((_dv, b) => b[19] = 1)), "bad_flags", /reserved byte 19/);
  throwsWire(() => dec(payload((dv) => dv.setUint32(20, 256, true))), "out_of_range", /basePos \+ 1 257/);
  // Entry 1 (at 24) samples: its block starts at 32.
  throwsWire(() => dec(payload((dv) => dv.setFloat64(32, NaN, true))), "bad_value", /temperature/);
  throwsWire(() => dec(payload((dv) => dv.setUint32(32 + 68, 257, true))), "out_of_range", /nHistory 257/);
  throwsWire(
    () => dec(payload((_dv, b) => b[26] = 1)),
    "bad_value",
    /nHistory is 3 but must be 0 without the history flag/,
  );
  const none = batch({
    want: "none",
    topK: 0,
    entries: [{ slot: 1, basePos: 3 }],
    rows: new Float32Array(8),
  });
  throwsWire(() => dec(payload((_dv, b) => b[18] = 1, none)), "bad_value", /0 when want is none/);
  const good = payload(() => {});
  throwsWire(() => dec(good.subarray(0, good.length - 4)), "bad_length", /3 entries and 3 f32 rows/);
  throwsWire(() => dec(good.subarray(0, 40)), "short_payload", /sampling block/);
  const longer = new Uint8Array(good.length + 4);
  longer.set(good);
  throwsWire(() => dec(longer), "bad_length");
  assert.throws(
    () => encodeFrame({ op: "run_batch", id: 1, run: batch({ rows: new Float32Array(16) }) }),
    RangeError,
  );
});
