import assert from "node:assert/strict";
import {
  EARLY_READ_VERSIONS,
  EARLY_READS,
  mapRead,
  ReadbackRing,
  readStats,
  StagingPool,
} from "./readback.ts";
import { testGpu, upload } from "../../tests/util/gpu.ts";

Deno.test("ReadbackRing: several slots in flight, packed copies, slots reused", async () => {
  const { device } = await testGpu();
  const src = upload(device, new Uint32Array(64).map((_, i) => i * 3 + 1));
  const ring = new ReadbackRing(device, { slots: 3, slotBytes: 32 });
  const enc = device.createCommandEncoder();
  const a = ring.record(enc, [{ src, srcOffsetBytes: 0, sizeBytes: 8 }, {
    src,
    srcOffsetBytes: 40,
    sizeBytes: 4,
  }]);
  const b = ring.record(enc, [{ src, srcOffsetBytes: 100, sizeBytes: 16 }]);
  const c = ring.record(enc, [{ src, srcOffsetBytes: 4, sizeBytes: 4 }]);
  assert.equal(ring.record(enc, [{ src, srcOffsetBytes: 0, sizeBytes: 4 }]), undefined, "all slots busy");
  device.queue.submit([enc.finish()]);
  const [ra, rb, rc] = await Promise.all([ring.map(a!), ring.map(b!), ring.map(c!)]);
  await ring.whenFree();
  assert.deepEqual([...new Uint32Array(ra!.buffer)], [1, 4, 31]);
  assert.deepEqual([...new Uint32Array(rb!.buffer)], [76, 79, 82, 85]);
  assert.deepEqual([...new Uint32Array(rc!.buffer)], [4]);
  assert.equal(ring.free, 3);
  assert.throws(
    () => ring.record(device.createCommandEncoder(), [{ src, srcOffsetBytes: 0, sizeBytes: 36 }]),
    /exceeds the ring slot size 32/,
  );
  ring.destroy();
  src.destroy();
});

/** A kernel that takes a while on lavapipe: out[i] = a hash of (seed, i) after `rounds` LCG steps. */
const HASH_WGSL = `
struct P { seed: u32, rounds: u32 }
@group(0) @binding(0) var<storage, read_write> out: array<u32>;
@group(0) @binding(1) var<uniform> p: P;
@compute @workgroup_size(64) fn main(@builtin(global_invocation_id) g: vec3u) {
  if (g.x >= arrayLength(&out)) { return; }
  var x = p.seed ^ (g.x * 2654435761u);
  for (var r = 0u; r < p.rounds; r++) { x = x * 1664525u + 1013904223u; }
  out[g.x] = x;
}`;

function hashRef(seed: number, i: number, rounds: number): number {
  let x = (seed ^ Math.imul(i, 2654435761)) >>> 0;
  for (let r = 0; r < rounds; r++) x = (Math.imul(x, 1664525) + 1013904223) >>> 0;
  return x;
}

Deno.test("mapRead: this Deno version reads early, and a buffer's first read waits for its promise", () => {
  // A new Deno must be checked before it joins EARLY_READ_VERSIONS: a buffer never mapped before panics there
  // (engine/gpu/readback.ts's module doc). This test's other cases are that check.
  assert.ok(
    EARLY_READ_VERSIONS.includes(Deno.version.deno),
    `Deno ${Deno.version.deno} is not in EARLY_READ_VERSIONS: run this file's tests with it added`,
  );
  assert.equal(EARLY_READS, Deno.env.get("LLM_EARLY_READ") !== "0");
});

Deno.test("mapRead and StagingPool: each read returns the GPU's finished output, early from a buffer's second use", async () => {
  const { device } = await testGpu();
  const n = 4096;
  const out = device.createBuffer({ size: 4 * n, usage: GPUBufferUsage.STORAGE | GPUBufferUsage.COPY_SRC });
  const params = device.createBuffer({ size: 16, usage: GPUBufferUsage.UNIFORM | GPUBufferUsage.COPY_DST });
  const pipe = device.createComputePipeline({
    layout: "auto",
    compute: { module: device.createShaderModule({ code: HASH_WGSL }), entryPoint: "main" },
  });
  const bg = device.createBindGroup({
    layout: pipe.getBindGroupLayout(0),
    entries: [{ binding: 0, resource: { buffer: out } }, { binding: 1, resource: { buffer: params } }],
  });
  const pool = new StagingPool(device, { perSize: 4 });
  const before = { ...readStats };
  const rounds = 3000;
  const pending: { seed: number; bytes: Promise<ArrayBuffer> }[] = [];
  for (let k = 0; k < 24; k++) {
    const seed = (Math.random() * 2 ** 32) >>> 0;
    const staging = pool.take(4 * n);
    // Poison: the output buffer and the staging hold another seed's values from earlier rounds.
    device.queue.writeBuffer(params, 0, Uint32Array.of(seed, rounds, 0, 0));
    const enc = device.createCommandEncoder();
    const pass = enc.beginComputePass();
    pass.setPipeline(pipe);
    pass.setBindGroup(0, bg);
    pass.dispatchWorkgroups(n / 64);
    pass.end();
    enc.copyBufferToBuffer(out, 0, staging, 0, 4 * n);
    device.queue.submit([enc.finish()]);
    pending.push({ seed, bytes: pool.read(staging) });
    // Every few rounds let the releases land, so later rounds take buffers that were mapped before.
    if (k % 4 === 3) await new Promise((r) => setTimeout(r, 100));
  }
  for (const { seed, bytes } of pending) {
    const got = new Uint32Array(await bytes);
    assert.equal(got.length, n);
    for (const i of [0, 1, 63, 64, 2047, n - 1]) {
      assert.equal(got[i], hashRef(seed, i, rounds), `seed ${seed} [${i}]`);
    }
    for (let i = 0; i < n; i++) {
      if (got[i] !== hashRef(seed, i, rounds)) assert.fail(`seed ${seed}: word ${i} is not this round's`);
    }
  }
  const early = readStats.early - before.early;
  const awaited = readStats.awaited - before.awaited;
  assert.equal(readStats.fellBack - before.fellBack, 0, "no early read fell back");
  assert.equal(early + awaited, 24);
  // 4 buffers in flight per round: the first round's are new; later rounds reuse them (a loaded machine may
  // release a few late, and then the pool makes new ones).
  assert.ok(awaited >= 4 && awaited <= 12, `each new buffer's first read waits (${awaited} did)`);
  assert.ok(early >= 12, `reads from reused buffers are early (${early} were)`);
  await new Promise((r) => setTimeout(r, 100));
  const extra = Array.from({ length: 6 }, () => pool.take(4 * n));
  for (const b of extra) pool.give(b);
  assert.equal(pool.keptBytes, 4 * 4 * n, "perSize buffers kept, the rest destroyed");
  pool.destroy();
  assert.equal(pool.keptBytes, 0);
  out.destroy();
  params.destroy();
});

Deno.test("ReadbackRing: a mapped slot frees once unmapped; whenFree waits for it", async () => {
  const { device } = await testGpu();
  const src = upload(device, new Uint32Array(16).map((_, i) => i + 100));
  const ring = new ReadbackRing(device, { slots: 1, slotBytes: 16 });
  for (let round = 0; round < 3; round++) {
    await ring.whenFree();
    const enc = device.createCommandEncoder();
    const slot = ring.record(enc, [{ src, srcOffsetBytes: 4 * round, sizeBytes: 8 }]);
    assert.equal(slot, 0);
    device.queue.submit([enc.finish()]);
    const got = await ring.map(slot!);
    assert.deepEqual([...new Uint32Array(got.buffer)], [100 + round, 101 + round]);
  }
  await ring.whenFree();
  assert.equal(ring.free, 1);
  ring.destroy();
  src.destroy();
});

Deno.test("mapRead: a GPU error of the submitted work is dispatched before early bytes land", async () => {
  const { device } = await testGpu();
  let errors = 0;
  const onError = (ev: Event) => {
    ev.preventDefault();
    errors++;
  };
  device.addEventListener("uncapturederror", onError);
  const staging = device.createBuffer({ size: 16, usage: GPUBufferUsage.MAP_READ | GPUBufferUsage.COPY_DST });
  try {
    await mapRead(staging, 16).bytes; // its first read waits for the promise; the next ones are early
    for (let k = 0; k < 3; k++) {
      const before = { errors, early: readStats.early };
      const b = device.createBuffer({ size: 16, usage: GPUBufferUsage.COPY_SRC | GPUBufferUsage.COPY_DST });
      const enc = device.createCommandEncoder();
      enc.copyBufferToBuffer(b, 0, b, 0, 16); // invalid: a copy within one buffer
      device.queue.submit([enc.finish()]);
      const r = mapRead(staging, 16);
      await r.bytes;
      if (EARLY_READS) assert.equal(readStats.early, before.early + 1, "an early read");
      assert.ok(errors > before.errors, `round ${k}: the submission's error was seen before its bytes`);
      await r.released;
      b.destroy();
    }
  } finally {
    device.removeEventListener("uncapturederror", onError);
    staging.destroy();
  }
});
