import assert from "node:assert/strict";
import { Rng } from "../../tests/util/rng.ts";
import { STOP_REASONS, StopMatcher, type StopReason } from "./stop.ts";

/** Definition, written independently of the matcher: the stop that ends first, ties to the longest. */
function reference(text: string, stops: string[]): { text: string; stop?: string } {
  const byLength = [...stops].sort((a, b) => b.length - a.length);
  for (let end = 1; end <= text.length; end++) {
    const head = text.slice(0, end);
    const s = byLength.find((x) => head.endsWith(x));
    if (s !== undefined) return { text: text.slice(0, end - s.length), stop: s };
  }
  return { text };
}

/** Streams `pieces`, stopping at the first match as an engine would; returns emitted text and the stop. */
function stream(pieces: string[], stops: string[]): { text: string; stop?: string } {
  const m = new StopMatcher(stops);
  let text = "";
  for (const p of pieces) {
    const r = m.push(p);
    text += r.text;
    if (r.stop !== undefined) {
      assert.equal(m.stopped, r.stop);
      assert.equal(m.flush(), "", "nothing is released after a stop");
      return { text, stop: r.stop };
    }
  }
  return { text: text + m.flush() };
}

Deno.test("a stop split across pieces is found and not emitted; only a possible stop prefix is held", () => {
  const m = new StopMatcher(["\n\nUser:"]);
  assert.deepEqual(m.push("Hello\n"), { text: "Hello" });
  assert.deepEqual(m.push("\nUs"), { text: "" });
  assert.deepEqual(m.push("er: hi"), { text: "", stop: "\n\nUser:" });
  assert.throws(() => m.push("more"), /after stop/);

  const w = new StopMatcher(["world!"]);
  assert.deepEqual(w.push("Hello wor"), { text: "Hello " });
  assert.deepEqual(w.push("ld?"), { text: "world?" });
  assert.deepEqual(w.push("w"), { text: "" });
  assert.equal(w.flush(), "w", "held text comes out at the end");
  assert.equal(w.stopped, undefined);
});

Deno.test("a stop at the very start emits nothing; text before a stop in the same piece is emitted", () => {
  assert.deepEqual(new StopMatcher(["STOP"]).push("STOP and more"), { text: "", stop: "STOP" });
  assert.deepEqual(new StopMatcher(["STOP"]).push("abSTOPcd"), { text: "ab", stop: "STOP" });
  const m = new StopMatcher(["<|x|>"]);
  assert.deepEqual(m.push("<|"), { text: "" });
  assert.deepEqual(m.push("x|>"), { text: "", stop: "<|x|>" });
});

Deno.test("overlapping stops: the one ending first wins, ties go to the longest", () => {
  assert.deepEqual(stream(["xab", "cd"], ["abcd", "bc"]), { text: "xa", stop: "bc" });
  assert.deepEqual(stream(["xa", "bc"], ["bc", "abc"]), { text: "x", stop: "abc" });
  assert.deepEqual(stream(["a", "a", "a", "b"], ["aab"]), { text: "a", stop: "aab" });
  assert.deepEqual(stream(["ab", "ab", "ac"], ["abac"]), { text: "ab", stop: "abac" });
  // The longer stop's prefix is held while the shorter one is not yet complete.
  const m = new StopMatcher(["abc", "bcd"]);
  assert.deepEqual(m.push("zab"), { text: "z" });
  assert.deepEqual(m.push("cd"), { text: "", stop: "abc" });
});

Deno.test("every split point (two and three pieces) gives the result of the whole text", () => {
  const cases: [string, string[]][] = [
    ["Hello world\n\nUser: next", ["\n\nUser:", "world!"]],
    ["aaabaab", ["aab", "ab"]],
    ["no stop here <|im", ["<|im_end|>"]],
    ["x<|im_end|>y", ["<|im_end|>", "|>"]],
    ["日本語のテキスト終わり", ["終わり", "キス"]],
    ["abc", ["abc"]],
  ];
  for (const [text, stops] of cases) {
    const want = reference(text, stops);
    assert.deepEqual(stream([text], stops), want, `${JSON.stringify(text)} whole`);
    for (let i = 0; i <= text.length; i++) {
      for (let j = i; j <= text.length; j++) {
        const pieces = [text.slice(0, i), text.slice(i, j), text.slice(j)];
        assert.deepEqual(
          stream(pieces, stops),
          want,
          `${JSON.stringify(pieces)} stops ${JSON.stringify(stops)}`,
        );
      }
    }
  }
});

Deno.test("fuzz: random texts, stops and splits agree with the definition", () => {
  const rng = new Rng();
  const word = (n: number) => Array.from({ length: n }, () => "ab"[rng.int(0, 2)]).join("");
  for (let n = 0; n < 500; n++) {
    const text = word(rng.int(0, 14));
    const stops = Array.from({ length: rng.int(1, 4) }, () => word(rng.int(1, 5)));
    const pieces: string[] = [];
    for (let i = 0; i < text.length;) {
      const k = rng.int(0, 4);
      pieces.push(text.slice(i, i + k));
      i += k;
    }
    assert.deepEqual(
      stream(pieces, stops),
      reference(text, stops),
      `seed ${rng.seed} pieces ${JSON.stringify(pieces)} stops ${stops}`,
    );
  }
});

Deno.test("no stops passes text through at once; an empty stop string is rejected", () => {
  const m = new StopMatcher([]);
  assert.deepEqual(m.push("anything <|"), { text: "anything <|" });
  assert.equal(m.flush(), "");
  assert.throws(
    () => new StopMatcher(["ok", ""]),
    (e: unknown) => e instanceof RangeError && /#1 is empty/.test(e.message),
  );
});

Deno.test("StopReason lists exactly the five reasons", () => {
  const all: Record<StopReason, true> = {
    eos: true,
    stop: true,
    max_tokens: true,
    context: true,
    tool_use: true,
  };
  assert.deepEqual([...STOP_REASONS].sort(), Object.keys(all).sort());
});
