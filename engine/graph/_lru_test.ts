import assert from "node:assert/strict";
import { LruMap } from "./_lru.ts";

Deno.test("LruMap: keeps the most recently used entries, evicts the oldest with onEvict, get refreshes", () => {
  const evicted: string[] = [];
  const m = new LruMap<string, number>(3, (v, k) => evicted.push(`${k}=${v}`));
  m.set("a", 1).set("b", 2).set("c", 3);
  assert.equal(m.get("a"), 1); // a is now the newest: b goes first
  m.set("d", 4);
  assert.deepEqual(evicted, ["b=2"]);
  assert.equal(m.get("b"), undefined);
  m.set("c", 30); // replacing is not evicting
  m.set("e", 5);
  assert.deepEqual(evicted, ["b=2", "a=1"]);
  assert.deepEqual([...m.values()], [4, 30, 5]);
  assert.equal(m.size, 3);
  assert.ok(m.delete("d"));
  assert.ok(!m.delete("d"));
  assert.deepEqual(evicted, ["b=2", "a=1"], "delete is not eviction");
  assert.throws(() => new LruMap(0), /integer ≥ 1, got 0/);
});
