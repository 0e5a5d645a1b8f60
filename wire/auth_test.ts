import assert from "node:assert/strict";
import {
  authModeMismatch,
  constantTimeEqual,
  importLinkKey,
  linkKeyFrom,
  makeProof,
  newNonce,
  transcriptHash,
  verifyProof,
} from "./auth.ts";

const KEY_A = "correct horse battery staple";
const KEY_B = "correct horse battery stapler";

Deno.test("auth: a proof verifies with the same key, role and transcript only", async () => {
  const a = await importLinkKey(KEY_A);
  const b = await importLinkKey(KEY_B);
  const t = await transcriptHash(newNonce(), newNonce());
  const proof = await makeProof(a, "connector", t);
  assert.equal(proof.length, 32);
  assert.equal(await verifyProof(a, "connector", t, proof), true);
  assert.equal(await verifyProof(b, "connector", t, proof), false, "another key");
  assert.equal(await verifyProof(a, "acceptor", t, proof), false, "the other role's proof");
  const other = await transcriptHash(newNonce(), newNonce());
  assert.equal(await verifyProof(a, "connector", other, proof), false, "another transcript (replay)");
  const flipped = proof.slice();
  flipped[31]! ^= 1;
  assert.equal(await verifyProof(a, "connector", t, flipped), false, "one bit flipped");
  assert.equal(await verifyProof(a, "connector", t, proof.subarray(0, 16)), false, "truncated");
});

Deno.test("auth: the transcript covers both payloads and their boundary", async () => {
  const x = new Uint8Array([1, 2, 3]);
  const y = new Uint8Array([4]);
  const h = (a: Uint8Array, b: Uint8Array) => transcriptHash(a, b).then((d) => Array.from(d).join(","));
  assert.notEqual(await h(x, y), await h(y, x));
  assert.notEqual(await h(x, y), await h(new Uint8Array([1, 2]), new Uint8Array([3, 4])));
  assert.equal(await h(x, y), await h(x.slice(), y.slice()));
});

Deno.test("auth: constantTimeEqual, nonces, key length and key sources", async () => {
  assert.equal(constantTimeEqual(new Uint8Array([1, 2]), new Uint8Array([1, 2])), true);
  assert.equal(constantTimeEqual(new Uint8Array([1, 2]), new Uint8Array([1, 3])), false);
  assert.equal(constantTimeEqual(new Uint8Array([1]), new Uint8Array([1, 0])), false);
  assert.notDeepEqual(newNonce(), newNonce());
  await assert.rejects(importLinkKey("short"), /Link key has 5 characters but needs at least 16/);
  const env = (v?: string) => ({ get: (n: string) => (n === "LLM_LINK_KEY" ? v : undefined) });
  assert.equal(linkKeyFrom(undefined, env()), undefined);
  assert.equal(linkKeyFrom(undefined, env(KEY_A)), KEY_A);
  assert.equal(linkKeyFrom(KEY_B, env(KEY_A)), KEY_B, "the flag wins over the environment");
  assert.throws(() => linkKeyFrom(undefined, env("tiny")), /Link key from LLM_LINK_KEY has 4 characters/);
  assert.throws(() => linkKeyFrom("tiny", env()), /Link key from --link-key has 4 characters/);
});

Deno.test("auth: a key on one side only is refused with a message saying which side lacks it", () => {
  assert.equal(authModeMismatch(true, true, "w"), undefined);
  assert.equal(authModeMismatch(false, false, "w"), undefined);
  assert.match(
    authModeMismatch(true, false, "peer x")!.message,
    /this side has a link key but peer x has none/,
  );
  assert.match(
    authModeMismatch(false, true, "worker y")!.message,
    /worker y has a link key but this side has none/,
  );
  assert.equal(authModeMismatch(false, true, "w")!.code, "auth");
});
