/**
 * The accepting side of the stage link: a worker's listener and the {@linkcode serveWorker} loop that answers
 * frames from a {@linkcode StageBackend} (the connecting side is link.ts). Each connection passes the hello and
 * auth check; a malformed frame closes that connection with one logged reason and the loop serves the others.
 * @module
 */
import { authModeMismatch, importLinkKey, makeProof, newNonce, transcriptHash, verifyProof } from "./auth.ts";
import { describe, payloadOf, setNoDelay, withTimeout } from "./_io.ts";
import {
  DEFAULT_HANDSHAKE_TIMEOUT_MS,
  DEFAULT_MAX_IN_FLIGHT,
  FrameConn,
  type LinkAddress,
  type StageBackend,
} from "./link.ts";
import { WireError } from "./errors.ts";
import { type Frame, limitsOf, type Reason } from "./frame.ts";
import { checkChain, type HelloInfo } from "./hello.ts";

/**
 * Opens the worker's listener: plain TCP, or TLS with `tls` (Deno.listenTls). Note: Deno gives no
 * setNoDelay on accepted TLS connections, so replies over TLS may wait on Nagle's algorithm.
 * @throws {Deno.errors.AddrInUse} and the other errors of Deno.listen/listenTls
 */
export function listenWorker(
  addr: LinkAddress,
  opts: { tls?: { cert: string; key: string } } = {},
): Deno.Listener {
  return opts.tls
    ? Deno.listenTls({ hostname: addr.hostname, port: addr.port, cert: opts.tls.cert, key: opts.tls.key })
    : Deno.listen({ hostname: addr.hostname, port: addr.port, transport: "tcp" });
}

// ---------------------------------------------------------------------------------------------------------
// The accepting side

/** Options of {@linkcode serveWorker}. */
export interface ServeOptions {
  /** Shared link key; undefined for none (a peer with a key is then refused). */
  readonly linkKey?: string;
  /** Where log lines go (default `console.error`): one line per refused or closed connection. */
  readonly log?: (line: string) => void;
  /** Whole-handshake timeout per connection (default {@linkcode DEFAULT_HANDSHAKE_TIMEOUT_MS}). */
  readonly handshakeTimeoutMs?: number;
  /** Requests one connection runs at once before reading stops (default {@linkcode DEFAULT_MAX_IN_FLIGHT}). */
  readonly maxInFlight?: number;
}

/** A running {@linkcode serveWorker} loop. */
export interface WorkerServer {
  /** Open connections. */
  readonly connections: number;
  /** Resolves when the loop has stopped (after {@linkcode WorkerServer.close}). */
  readonly done: Promise<void>;
  /** Stops accepting, closes every connection, and waits for the loop. */
  close(): Promise<void>;
}

function peerOf(conn: Deno.Conn): string {
  const a = conn.remoteAddr;
  return a.transport === "tcp" || a.transport === "udp" ? `peer ${a.hostname}:${a.port}` : "peer";
}

/**
 * Serves `backend` to every connection `listener` accepts (a `Deno.listen` or `Deno.listenTls` listener).
 * Each connection gets its hello and auth check; a malformed frame, a refused hello or a failed
 * authentication closes THAT connection with one log line and a CLOSE or HELLO_REFUSE frame naming the
 * reason. A backend failure answers its request with ERROR and keeps the connection. The loop itself
 * never throws.
 */
export function serveWorker(
  listener: Deno.Listener,
  backend: StageBackend,
  opts: ServeOptions = {},
): WorkerServer {
  const log = opts.log ?? ((line: string) => console.error(line));
  const conns = new Set<Deno.Conn>();
  const tasks = new Set<Promise<void>>();
  let stopping = false;
  const keyPromise = opts.linkKey === undefined ? Promise.resolve(undefined) : importLinkKey(opts.linkKey);
  keyPromise.catch(() => {});
  const loop = (async () => {
    while (!stopping) {
      let conn: Deno.Conn;
      try {
        conn = await listener.accept();
      } catch (e) {
        if (stopping || e instanceof Deno.errors.BadResource) break;
        log(`wire: accept failed: ${describe(e)}`);
        await new Promise((r) => setTimeout(r, 50));
        continue;
      }
      conns.add(conn);
      const task = serveConnection(conn, backend, { ...opts, log, key: keyPromise })
        .catch((e) => log(`wire: internal error serving ${peerOf(conn)}: ${describe(e)}`))
        .finally(() => {
          conns.delete(conn);
          tasks.delete(task);
        });
      tasks.add(task);
    }
  })();
  return {
    get connections() {
      return conns.size;
    },
    done: loop,
    async close() {
      stopping = true;
      try {
        listener.close();
      } catch { /* already closed: nothing left to release */ }
      for (const c of conns) {
        try {
          c.close();
        } catch { /* already closed by its task */ }
      }
      await loop;
      await Promise.all([...tasks]);
    },
  };
}

async function serveConnection(
  conn: Deno.Conn,
  backend: StageBackend,
  opts: ServeOptions & { log: (line: string) => void; key: Promise<CryptoKey | undefined> },
): Promise<void> {
  setNoDelay(conn);
  const peer = peerOf(conn);
  const hello = backend.hello();
  const io = new FrameConn(conn, limitsOf(hello));
  const closeWith = async (op: "close" | "hello_refuse", reason: Reason) => {
    opts.log(`wire: closing connection from ${peer}: ${reason.message}`);
    await withTimeout(io.write({ op, id: 0, reason }), 1000, () => new WireError("timeout", "close"))
      .catch(() => {});
  };
  try {
    const key = await opts.key;
    const ms = opts.handshakeTimeoutMs ?? DEFAULT_HANDSHAKE_TIMEOUT_MS;
    const refused = await withTimeout(
      acceptHandshake(io, hello, key, peer),
      ms,
      () =>
        new WireError(
          "timeout",
          `${peer} did not complete the handshake within ${ms} ms: it stalled or is not a stage link`,
        ),
    );
    if (refused) {
      await closeWith("hello_refuse", refused);
      return;
    }
    await serveFrames(io, backend, {
      peer,
      maxInFlight: opts.maxInFlight ?? DEFAULT_MAX_IN_FLIGHT,
      log: opts.log,
    });
  } catch (e) {
    const err = e instanceof WireError ? e : new WireError("closed", `${describe(e)}`, { cause: e });
    await closeWith("close", { code: err.code, message: err.message });
  } finally {
    io.close();
  }
}

/** The acceptor's handshake; returns the refusal to send, or undefined when the peer is in. */
async function acceptHandshake(
  io: FrameConn,
  self: HelloInfo,
  key: CryptoKey | undefined,
  peer: string,
): Promise<Reason | undefined> {
  const hello = await io.next(peer);
  if (hello === undefined) throw new WireError("closed", `${peer} closed the connection before its hello`);
  if (hello.op !== "hello") {
    return { code: "unexpected", message: `${peer} sent ${hello.op} before its hello` };
  }
  const mode = authModeMismatch(key !== undefined, hello.hello.auth, peer);
  if (mode) return { code: mode.code, message: mode.message };
  const chain = checkChain(hello.hello.info, self, { prevName: peer, nextName: "this worker" });
  if (chain) return { code: "refused", message: chain.message };
  const ack: Frame = {
    op: "hello_ack",
    id: 0,
    hello: { auth: key !== undefined, nonce: newNonce(), info: self },
  };
  await io.write(ack);
  const auth = await io.next(peer);
  if (auth === undefined) {
    throw new WireError("closed", `${peer} closed the connection during authentication`);
  }
  if (auth.op === "close") throw new WireError(auth.reason.code, `${peer} gave up: ${auth.reason.message}`);
  if (auth.op !== "auth") return { code: "unexpected", message: `${peer} sent ${auth.op} instead of auth` };
  const transcript = await transcriptHash(hello.hello.payload ?? payloadOf(hello), payloadOf(ack));
  if (key && !(await verifyProof(key, "connector", transcript, auth.proof))) {
    return {
      code: "auth",
      message:
        `Wrong link key: ${peer}'s proof does not match this worker's key: give both the same --link-key`,
    };
  }
  await io.write({
    op: "ready",
    id: 0,
    proof: key ? await makeProof(key, "acceptor", transcript) : new Uint8Array(0),
  });
  return undefined;
}

async function serveFrames(
  io: FrameConn,
  backend: StageBackend,
  opts: { peer: string; maxInFlight: number; log: (line: string) => void },
): Promise<void> {
  let inFlight = 0;
  let slotFree: (() => void) | undefined;
  const answer = (id: number, work: () => Promise<Frame>) => {
    inFlight++;
    let p: Promise<Frame>;
    try {
      p = work(); // called now, in arrival order (StageBackend's contract)
    } catch (e) {
      p = Promise.reject(e);
    }
    p.catch((e): Frame => ({
      op: "error",
      id,
      reason: e instanceof WireError
        ? { code: e.code, message: e.message }
        : { code: "backend", message: describe(e) },
    }))
      .then((f) => io.write(f))
      .catch(() => {/* the connection is gone: its read loop reports that */})
      .finally(() => {
        inFlight--;
        slotFree?.();
      });
  };
  for (;;) {
    while (inFlight >= opts.maxInFlight) await new Promise<void>((r) => slotFree = r);
    const f = await io.next(opts.peer);
    if (f === undefined) return;
    const id = f.id;
    switch (f.op) {
      case "run":
        answer(id, async () => ({ op: "run_result", id, result: await backend.run(f.run) }));
        break;
      case "run_batch": {
        const run = backend.runBatch?.bind(backend);
        if (!run) {
          answer(id, () => Promise.reject(new WireError("backend", "This stage runs no batched frames")));
        } else answer(id, async () => ({ op: "run_result", id, result: await run(f.run) }));
        break;
      }
      case "snapshot_save": {
        const v = backend.snapshot.bind(backend);
        answer(id, () => Promise.resolve(v(f.slot)).then((value) => ({ op: "done", id, value })));
        break;
      }
      case "snapshot_restore":
        answer(
          id,
          () =>
            Promise.resolve(backend.restore(f.snapshotId, f.slot)).then(() => ({ op: "done", id, value: 0 })),
        );
        break;
      case "snapshot_drop":
        answer(
          id,
          () => Promise.resolve(backend.drop(f.snapshotId)).then(() => ({ op: "done", id, value: 0 })),
        );
        break;
      case "reset":
        answer(id, () => Promise.resolve(backend.reset(f.slot)).then(() => ({ op: "done", id, value: 0 })));
        break;
      case "ping":
        await io.write({ op: "pong", id, sentMs: f.sentMs });
        break;
      case "close":
        opts.log(`wire: ${opts.peer} closed the link: ${f.reason.message}`);
        return;
      case "error":
        throw new WireError(f.reason.code, `${opts.peer} reported: ${f.reason.message}`);
      default:
        throw new WireError(
          "unexpected",
          `${opts.peer} sent ${f.op}, which a worker never receives after the handshake`,
        );
    }
  }
}
