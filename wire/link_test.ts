import assert from "node:assert/strict";
import fc from "fast-check";
import { WireError, type WireErrorCode } from "./errors.ts";
import { encodeFrame, type Frame, FrameDecoder, HEADER_BYTES, limitsOf, type RunRequest } from "./frame.ts";
import type { HelloInfo } from "./hello.ts";
import {
  connectLink,
  type ConnectOptions,
  FrameConn,
  type Link,
  parseAddress,
  readTlsFlags,
} from "./link.ts";
import { listenWorker, type ServeOptions, serveWorker, type WorkerServer } from "./serve.ts";
import { FakeBackend, sampleHeadHello, sampleHello } from "./_testing.ts";

const KEY = "a link key of enough length";
const HEAD = sampleHeadHello();

interface Rig {
  readonly port: number;
  readonly backend: FakeBackend;
  readonly server: WorkerServer;
  readonly log: string[];
  connect(opts?: Partial<ConnectOptions>): Promise<Link>;
  [Symbol.asyncDispose](): Promise<void>;
}

/** A worker on a loopback port serving a FakeBackend with hello `hello`. */
function rig(
  opts: { hello?: HelloInfo; serve?: Omit<ServeOptions, "log">; tls?: { cert: string; key: string } } = {},
): Rig {
  const listener = listenWorker({ hostname: "127.0.0.1", port: 0 }, opts.tls ? { tls: opts.tls } : {});
  const port = (listener.addr as Deno.NetAddr).port;
  const backend = new FakeBackend(opts.hello ?? sampleHello());
  const log: string[] = [];
  const server = serveWorker(listener, backend, { ...opts.serve, log: (l) => log.push(l) });
  const links: Link[] = [];
  return {
    port,
    backend,
    server,
    log,
    async connect(o = {}) {
      const link = await connectLink({ hostname: "127.0.0.1", port }, { hello: HEAD, ...o });
      links.push(link);
      return link;
    },
    async [Symbol.asyncDispose]() {
      for (const l of links) await l.close();
      await server.close();
    },
  };
}

function run(over: Partial<RunRequest> = {}): RunRequest {
  return {
    slot: 0,
    basePos: 0,
    nEmbd: 8,
    rows: new Float32Array(8).fill(0.5),
    dtype: "f32",
    want: "ids",
    topK: 2,
    drafts: new Uint32Array(0),
    ...over,
  };
}

async function rejectsWire(p: Promise<unknown>, code: WireErrorCode, re: RegExp): Promise<WireError> {
  try {
    await p;
  } catch (e) {
    if (!(e instanceof WireError)) throw new Error(`expected WireError ${code}, got ${e}`);
    assert.equal(e.code, code, e.message);
    assert.match(e.message, re);
    return e;
  }
  throw new Error(`expected WireError ${code}, but it resolved`);
}

/** Waits until `cond` holds (the server logs after the client saw the refusal). */
async function until(cond: () => boolean, what: string): Promise<void> {
  for (let i = 0; i < 200 && !cond(); i++) await new Promise((r) => setTimeout(r, 5));
  assert.ok(cond(), `timed out waiting for ${what}`);
}

Deno.test("link: handshake, every request op, and clean close", async () => {
  await using r = rig();
  const link = await r.connect();
  assert.deepStrictEqual(link.peer, sampleHello());
  assert.ok((await link.ping()) >= 0);
  const res = await link.run(
    run({ slot: 2, basePos: 5, rows: new Float32Array(24), drafts: new Uint32Array([7, 8]) }),
  );
  assert.equal(res.kind, "ids");
  if (res.kind !== "ids") return;
  assert.deepStrictEqual(Array.from(res.ids), [2005, 2006, 2007]);
  assert.deepStrictEqual(Array.from(res.topIds), [2005, 2006, 2006, 2007, 2007, 2008]);
  assert.deepStrictEqual(res.timesUs, [7]);
  const hidden = await link.run(
    run({ want: "all", topK: 0, dtype: "f16", rows: new Float32Array(16).fill(1 / 3) }),
  );
  assert.equal(hidden.kind, "hidden");
  // 1/3 arrives as f16 0.333251953125; the fake adds 1 and replies in f16 too: 1.3330078125.
  if (hidden.kind === "hidden") assert.equal(hidden.rows[15], 1.3330078125);
  const snap = await link.snapshotSave(1);
  await link.snapshotRestore(snap, 3);
  await link.snapshotDrop(snap);
  await link.reset(1);
  assert.deepStrictEqual(r.backend.calls.slice(2), [
    "snapshot:1",
    `restore:${snap}:3`,
    `drop:${snap}`,
    "reset:1",
  ]);
  await link.close();
  assert.equal(link.isClosed, true);
  await rejectsWire(link.ping(), "closed", /is closed: reconnect first/);
  await until(() => r.log.length === 1, "the close log line");
  assert.match(r.log[0]!, /closed the link: the link is no longer needed/);
});

Deno.test("link: several requests in flight, answered out of order, each matched by its id", async () => {
  await using r = rig();
  r.backend.delayMs = (req) => [60, 5, 30, 0][req.slot]!;
  const link = await r.connect();
  const done: number[] = [];
  const reqs = [0, 1, 2, 3].map((slot) =>
    link.run(run({ slot, basePos: slot * 10 })).then((res) => (done.push(slot), res))
  );
  assert.equal(link.inFlight, 4);
  const results = await Promise.all(reqs);
  results.forEach((res, slot) => {
    assert.equal(res.kind, "ids");
    if (res.kind === "ids") assert.equal(res.ids[0], slot * 1000 + slot * 10);
  });
  assert.deepStrictEqual(done, [3, 1, 2, 0], "replies came back in completion order");
  assert.deepStrictEqual(
    r.backend.calls,
    ["run:0:0:1", "run:1:10:1", "run:2:20:1", "run:3:30:1"],
    "called in frame order",
  );
});

Deno.test("link: a backend failure answers that request only; the link stays open", async () => {
  await using r = rig();
  const link = await r.connect();
  await rejectsWire(
    link.snapshotRestore(99, 0),
    "backend",
    /failed restore of snapshot 99 into slot 0: Snapshot 99 does not exist/,
  );
  assert.equal(link.isClosed, false);
  assert.ok((await link.ping()) >= 0);
});

Deno.test("link: a request the worker refuses as out of range gets its specific error, link closed", async () => {
  await using r = rig({ hello: sampleHello({ nSlots: 8 }) });
  const link = await r.connect({ hello: sampleHeadHello({ nSlots: 8 }) });
  r.backend.calls.length = 0;
  // The worker's decoder checks the slot against its own limits: simulate a head that ignores them.
  await rejectsWire(link.run(run({ slot: 8 })), "out_of_range", /slot 8 is outside \[0, 7\]/);
  assert.equal(link.isClosed, true);
  await until(() => r.log.length === 1, "the log line");
  assert.match(
    r.log[0]!,
    /closing connection from peer 127\.0\.0\.1:\d+: Frame run: slot 8 is outside \[0, 7\]/,
  );
  assert.deepStrictEqual(r.backend.calls, []);
});

Deno.test("link: a stalled worker times out with a specific error and the link closes", async () => {
  await using r = rig();
  const link = await r.connect({ timeoutMs: 150 });
  r.backend.stall = true;
  const other = link.run(run({ slot: 1 }), { timeoutMs: 10_000 });
  await rejectsWire(
    link.run(run()),
    "timeout",
    /did not answer run of slot 0 at position 0 \(request \d+\) within 150 ms/,
  );
  await rejectsWire(other, "timeout", /within 150 ms/);
  assert.equal(link.isClosed, true);
  assert.equal((await link.closed)?.code, "timeout");
});

Deno.test("link: a peer that never answers the hello times out", async () => {
  const listener = Deno.listen({ hostname: "127.0.0.1", port: 0 });
  const accepted = listener.accept();
  await rejectsWire(
    connectLink({ hostname: "127.0.0.1", port: (listener.addr as Deno.NetAddr).port }, {
      hello: HEAD,
      handshakeTimeoutMs: 150,
    }),
    "timeout",
    /did not complete the handshake within 150 ms/,
  );
  (await accepted).close();
  listener.close();
});

Deno.test("link: a hello mismatch is refused at connect naming both values, and logged once", async () => {
  await using r = rig({ hello: sampleHello({ nSlots: 2 }) });
  await rejectsWire(
    r.connect(),
    "refused",
    /refused the connection: Too few slots: this worker has 2 slots but peer 127\.0\.0\.1:\d+ has 4/,
  );
  await until(() => r.log.length === 1, "the log line");
  assert.match(r.log[0]!, /Too few slots/);
  // Another protocol version is refused by the worker's decoder before the JSON is read.
  await rejectsWire(
    r.connect({ hello: sampleHeadHello({ protocol: 1 }) }),
    "refused",
    /refused the connection: Wire protocol differs: the peer speaks version 1 but this side speaks version 2/,
  );
  await until(() => r.log.length === 2, "the second log line");
  // The connector checks too (a worker that does not refuse): the whole chain must end at a last stage.
  await using r2 = rig({ hello: sampleHello({ last: false, layers: { first: 6, end: 9, total: 12 } }) });
  await rejectsWire(
    r2.connect(),
    "refused",
    /chain ends at worker 127\.0\.0\.1:\d+ \(layers 6:9 of 12\), which is not a last stage/,
  );
});

Deno.test("link: wrong key, missing key and unexpected key are refused with clear messages", async () => {
  await using r = rig({ serve: { linkKey: KEY } });
  await rejectsWire(
    r.connect({ linkKey: KEY + "!" }),
    "auth",
    /refused the connection: Wrong link key: peer .* does not match this worker's key/,
  );
  await rejectsWire(
    r.connect(),
    "auth",
    /Unauthenticated peer refused: this side has a link key but peer 127\.0\.0\.1:\d+ has none/,
  );
  const ok = await r.connect({ linkKey: KEY });
  assert.ok((await ok.ping()) >= 0);
  await until(() => r.log.length === 2, "two log lines");
  assert.match(r.log.join("\n"), /Wrong link key[^]*Unauthenticated peer refused/);
  await using open = rig();
  await rejectsWire(open.connect({ linkKey: KEY }), "auth", /has a link key but this side has none/);
});

Deno.test("link: TLS with --tls-cert/--tls-key and --tls-ca", async () => {
  const dir = new URL("./testdata/", import.meta.url).pathname;
  const tls = await readTlsFlags({
    tlsCert: dir + "link_test_cert.pem",
    tlsKey: dir + "link_test_key.pem",
    tlsCa: dir + "link_test_cert.pem",
  });
  await using r = rig({ tls: tls.listen!, serve: { linkKey: KEY } });
  const link = await r.connect({ linkKey: KEY, tls: tls.connect! });
  const res = await link.run(run({ slot: 1, basePos: 3 }));
  assert.equal(res.kind === "ids" && res.ids[0], 1003);
  // Without the CA the certificate is not trusted.
  await rejectsWire(r.connect({ linkKey: KEY, tls: {} }), "closed", /Cannot connect|Connection to|failed/);
  await assert.rejects(
    readTlsFlags({ tlsCert: "x.pem" }),
    /--tls-cert and --tls-key go together but only --tls-cert/,
  );
  await assert.rejects(
    readTlsFlags({ tlsCa: "/nonexistent.pem" }),
    /Cannot read --tls-ca \/nonexistent\.pem/,
  );
});

Deno.test("link: parseAddress", () => {
  assert.deepStrictEqual(parseAddress("10.0.0.2:9100"), { hostname: "10.0.0.2", port: 9100 });
  assert.deepStrictEqual(parseAddress("[::1]:80"), { hostname: "::1", port: 80 });
  assert.deepStrictEqual(parseAddress(":9100"), { hostname: "0.0.0.0", port: 9100 });
  assert.throws(() => parseAddress("host"), /is not HOST:PORT/);
  assert.throws(() => parseAddress("host:70000"), /is not HOST:PORT/);
});

// ---------------------------------------------------------------------------------------------------------
// Fuzzing a live worker from raw sockets

/** Connects a raw socket; with `handshake`, completes a key-less hello first. */
async function rawPeer(port: number, handshake: boolean): Promise<Deno.TcpConn> {
  const conn = await Deno.connect({ hostname: "127.0.0.1", port });
  if (handshake) {
    const io = new FrameConn(conn, limitsOf(HEAD));
    await io.write({ op: "hello", id: 0, hello: { auth: false, nonce: new Uint8Array(32), info: HEAD } });
    assert.equal((await io.next("worker"))?.op, "hello_ack");
    await io.write({ op: "auth", id: 0, proof: new Uint8Array(0) });
    assert.equal((await io.next("worker"))?.op, "ready");
  }
  return conn;
}

/** Sends `bytes`, half-closes, and reads until the worker closes (or 2 s pass); returns the frames read. */
async function throwAt(port: number, handshake: boolean, bytes: Uint8Array): Promise<Frame[]> {
  const conn = await rawPeer(port, handshake);
  try {
    await conn.write(bytes).catch(() => 0);
    await conn.closeWrite().catch(() => {});
    const dec = new FrameDecoder(limitsOf(HEAD));
    const frames: Frame[] = [];
    const buf = new Uint8Array(65536);
    const deadline = Date.now() + 2000;
    while (Date.now() < deadline) {
      const n = await conn.read(buf).catch(() => null);
      if (n === null) break;
      frames.push(...dec.push(buf.slice(0, n)));
    }
    return frames;
  } finally {
    conn.close();
  }
}

const validFrames: Frame[] = [
  {
    op: "run",
    id: 1,
    run: run({ slot: 1, basePos: 2, drafts: new Uint32Array([5]), rows: new Float32Array(16) }),
  },
  { op: "snapshot_restore", id: 2, snapshotId: 1, slot: 3 },
  { op: "reset", id: 3, slot: 1 },
  { op: "ping", id: 4, sentMs: 1 },
];

Deno.test("link: random, truncated and corrupted frames from raw sockets never crash the worker; it keeps serving", async () => {
  await using r = rig();
  const good = await r.connect();
  const before = r.log.length;
  // One malformed frame after a good handshake: exactly one log line with its reason, and a CLOSE frame.
  const bad = encodeFrame(validFrames[0]!);
  bad[HEADER_BYTES + 2] = 9;
  const replies = await throwAt(r.port, true, bad);
  assert.equal(replies.at(-1)?.op, "close");
  await until(() => r.log.length === before + 1, "one log line");
  assert.match(r.log.at(-1)!, /closing connection from peer 127\.0\.0\.1:\d+: Frame run: want is 9/);

  const stream = fc.oneof(
    fc.uint8Array({ maxLength: 300 }),
    fc.tuple(
      fc.constantFrom(...validFrames),
      fc.nat(),
      fc.array(fc.tuple(fc.nat(), fc.nat(255)), { maxLength: 3 }),
    ).map(
      ([f, cut, flips]) => {
        const b = encodeFrame(f);
        for (const [at, v] of flips) b[at % b.length] = v;
        return b.subarray(0, cut % (b.length + 1));
      },
    ),
  );
  await fc.assert(
    fc.asyncProperty(
      fc.boolean(),
      fc.array(stream, { minLength: 1, maxLength: 3 }),
      async (handshake, parts) => {
        const bytes = new Uint8Array(parts.reduce((s, p) => s + p.length, 0));
        let at = 0;
        for (const p of parts) {
          bytes.set(p, at);
          at += p.length;
        }
        await throwAt(r.port, handshake, bytes);
      },
    ),
    { numRuns: 300 },
  );
  // The worker still serves: the link opened before the fuzzing, and a new one.
  const res = await good.run(run({ slot: 3, basePos: 1 }));
  assert.equal(res.kind === "ids" && res.ids[0], 3001);
  const fresh = await r.connect();
  assert.ok((await fresh.ping()) >= 0);
  assert.ok(r.log.every((l) => l.startsWith("wire: ")), "every log line is the worker's own");
});
