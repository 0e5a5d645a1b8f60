/**
 * The stage link over TCP (optionally TLS): the connecting side's {@linkcode Link} (handshake, then
 * requests matched to replies by id, several in flight, per-request timeouts, clean close) and the
 * accepting side's {@linkcode serveWorker} loop that answers frames from a {@linkcode StageBackend}.
 *
 * Handshake (docs/WIRE.md "Handshake"): connector HELLO → acceptor HELLO_ACK (or HELLO_REFUSE) → connector
 * AUTH → acceptor READY (or HELLO_REFUSE). Both sides check the chain ({@linkcode checkChain}); the
 * connector checks the whole chain behind the acceptor ({@linkcode checkWholeChain} over its `downstream`).
 *
 * @example
 * ```ts
 * import { connectLink, serveWorker, type StageBackend } from "./link.ts";
 * import type { HelloInfo } from "./hello.ts";
 * declare const backend: StageBackend, headHello: HelloInfo;
 * const listener = Deno.listen({ hostname: "127.0.0.1", port: 9100 });
 * const server = serveWorker(listener, backend, { linkKey: Deno.env.get("LLM_LINK_KEY") });
 * const link = await connectLink({ hostname: "127.0.0.1", port: 9100 }, { hello: headHello });
 * console.log(link.peer.layers, await link.ping());
 * await link.close();
 * await server.close();
 * ```
 * @module
 */
import { authModeMismatch, importLinkKey, makeProof, newNonce, transcriptHash, verifyProof } from "./auth.ts";
import { WireError } from "./errors.ts";
import {
  encodeFrame,
  type Frame,
  FrameDecoder,
  type FrameLimits,
  HEADER_BYTES,
  limitsOf,
  type Reason,
  type RunRequest,
  type RunResult,
} from "./frame.ts";
import { checkChain, checkWholeChain, type HelloInfo } from "./hello.ts";

/**
 * What a worker serves: one stage. Structural, so the engine's stage adapts to it without importing wire/.
 * `serveWorker` calls these in the order the frames arrived, without waiting for earlier calls to finish
 * (several RUNs in flight keep a pipeline busy), so an implementation must apply them in call order: start
 * (enqueue) each call's work before returning from the call, or keep its own FIFO.
 */
export interface StageBackend {
  /** This stage's hello (called once per connection: `downstream` may change as the next stage reconnects). */
  hello(): HelloInfo;
  /** Runs rows through this stage (and, in a middle worker, the stages after it). */
  run(req: RunRequest): Promise<RunResult>;
  /** Saves `slot`'s state; returns a snapshot id. */
  snapshot(slot: number): number | Promise<number>;
  /** Restores snapshot `snapshotId` into `slot` (the snapshot stays). */
  restore(snapshotId: number, slot: number): void | Promise<void>;
  /** Frees snapshot `snapshotId`. */
  drop(snapshotId: number): void | Promise<void>;
  /** Empties `slot` (position 0, zero state). */
  reset(slot: number): void | Promise<void>;
}

/** Where to connect or listen. */
export interface LinkAddress {
  /** Host name or address. */
  readonly hostname: string;
  /** TCP port. */
  readonly port: number;
}

/** Default time a request may wait for its reply. */
export const DEFAULT_TIMEOUT_MS = 30_000;
/** Default time the whole handshake may take. */
export const DEFAULT_HANDSHAKE_TIMEOUT_MS = 10_000;
/** Default requests one worker connection runs at once before it stops reading (backpressure). */
export const DEFAULT_MAX_IN_FLIGHT = 32;
const READ_CHUNK_BYTES = 256 * 1024;

/** Parses `HOST:PORT` (IPv6 as `[::1]:PORT`). @throws {TypeError} naming the bad part */
export function parseAddress(s: string): LinkAddress {
  const m = /^(?:\[([^\]]+)\]|([^:]*)):(\d{1,5})$/.exec(s);
  const port = m ? Number(m[3]) : NaN;
  if (!m || !(port >= 1 && port <= 65535)) {
    throw new TypeError(
      `Address ${JSON.stringify(s)} is not HOST:PORT with a port in 1..65535: e.g. 10.0.0.2:9100`,
    );
  }
  return { hostname: m[1] ?? (m[2] || "0.0.0.0"), port };
}

function setNoDelay(conn: Deno.Conn): void {
  const c = conn as Deno.Conn & { setNoDelay?: (on: boolean) => void };
  if (typeof c.setNoDelay === "function") c.setNoDelay(true);
}

function describe(e: unknown): string {
  return e instanceof Error ? e.message : String(e);
}

/**
 * One connection as frames: reads on demand (reading stops while nobody asks, which is the backpressure),
 * serialized full writes. Used by {@linkcode Link} and {@linkcode serveWorker}; exported for other
 * transports and tests.
 */
export class FrameConn {
  /** The underlying connection. */
  readonly conn: Deno.Conn;
  readonly #decoder: FrameDecoder;
  readonly #queue: Frame[] = [];
  #ended = false;
  #reading: Promise<void> | undefined;
  #tail: Promise<void> = Promise.resolve();
  #writeFailed: unknown;

  /**
   * Wraps `conn`.
   * @param limits what this side accepts (its own hello: {@linkcode limitsOf})
   */
  constructor(conn: Deno.Conn, limits: FrameLimits) {
    this.conn = conn;
    this.#decoder = new FrameDecoder(limits);
  }

  async #fill(peer: string): Promise<void> {
    const buf = new Uint8Array(READ_CHUNK_BYTES);
    let n: number | null;
    try {
      n = await this.conn.read(buf);
    } catch (e) {
      throw new WireError("closed", `Connection to ${peer} failed: ${describe(e)}`, { cause: e });
    }
    if (n === null) {
      this.#ended = true;
      this.#decoder.end();
      return;
    }
    this.#queue.push(...this.#decoder.push(buf.slice(0, n)));
  }

  /**
   * The next frame; undefined at a clean end of stream.
   * @param peer names the peer in messages
   * @throws {WireError} a decode fault, `truncated` at an end inside a frame, `closed` on a socket error
   */
  async next(peer: string): Promise<Frame | undefined> {
    while (this.#queue.length === 0) {
      if (this.#ended) return undefined;
      this.#reading ??= this.#fill(peer).finally(() => this.#reading = undefined);
      await this.#reading;
    }
    return this.#queue.shift();
  }

  /**
   * Queues `f` behind earlier writes; resolves when all its bytes are written.
   * @throws the socket's error when the connection failed
   */
  write(f: Frame): Promise<void> {
    const bytes = encodeFrame(f);
    const p = this.#tail.then(async () => {
      if (this.#writeFailed) throw this.#writeFailed;
      try {
        for (let at = 0; at < bytes.length;) at += await this.conn.write(bytes.subarray(at));
      } catch (e) {
        this.#writeFailed = e;
        throw e;
      }
    });
    this.#tail = p.catch(() => {});
    return p;
  }

  /** Closes the connection (idempotent). */
  close(): void {
    try {
      this.conn.close();
    } catch { /* already closed: nothing left to release */ }
  }
}

function withTimeout<T>(p: Promise<T>, ms: number, err: () => WireError): Promise<T> {
  if (!Number.isFinite(ms)) return p;
  let timer: ReturnType<typeof setTimeout> | undefined;
  const t = new Promise<never>((_, reject) => {
    timer = setTimeout(() => reject(err()), ms);
  });
  return Promise.race([p, t]).finally(() => clearTimeout(timer));
}

/** The bytes of `f` after its header, as {@linkcode encodeFrame} writes them. */
function payloadOf(f: Frame): Uint8Array {
  return encodeFrame(f).subarray(HEADER_BYTES);
}

/** TLS material as the CLI flags give it: `--tls-cert`/`--tls-key` (listening side), `--tls-ca` (connecting side). */
export interface TlsFlags {
  /** PEM certificate chain file of a listening worker. */
  readonly tlsCert?: string;
  /** PEM private key file of a listening worker. */
  readonly tlsKey?: string;
  /** PEM CA file the connecting side trusts (besides the system's roots). */
  readonly tlsCa?: string;
}

/** TLS material read from {@linkcode TlsFlags}. */
export interface TlsMaterial {
  /** Listening side: certificate chain and key (PEM). */
  readonly listen?: { readonly cert: string; readonly key: string };
  /** Connecting side: extra trusted CAs (PEM); present whenever `--tls-ca` was given. */
  readonly connect?: { readonly caCerts: readonly string[] };
}

/**
 * Reads the TLS files named by the flags.
 * @throws {TypeError} when only one of `--tls-cert`/`--tls-key` is given, or a file cannot be read
 */
export async function readTlsFlags(flags: TlsFlags): Promise<TlsMaterial> {
  if ((flags.tlsCert === undefined) !== (flags.tlsKey === undefined)) {
    throw new TypeError(
      `--tls-cert and --tls-key go together but only ${
        flags.tlsCert ? "--tls-cert" : "--tls-key"
      } was given: ` +
        `pass both (PEM files)`,
    );
  }
  const read = async (flag: string, path: string) => {
    try {
      return await Deno.readTextFile(path);
    } catch (e) {
      throw new TypeError(`Cannot read ${flag} ${path}: ${describe(e)}: pass a readable PEM file`, {
        cause: e,
      });
    }
  };
  return {
    ...(flags.tlsCert && flags.tlsKey
      ? {
        listen: { cert: await read("--tls-cert", flags.tlsCert), key: await read("--tls-key", flags.tlsKey) },
      }
      : {}),
    ...(flags.tlsCa ? { connect: { caCerts: [await read("--tls-ca", flags.tlsCa)] } } : {}),
  };
}

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

/** Options of {@linkcode connectLink} and {@linkcode openLink}. */
export interface ConnectOptions {
  /** This side's hello (its limits are what it accepts in replies). */
  readonly hello: HelloInfo;
  /** Shared link key; undefined for none (the peer must then have none either). */
  readonly linkKey?: string;
  /** TLS: connect with `Deno.startTls`, trusting `caCerts` (PEM) besides the system's. */
  readonly tls?: { readonly caCerts?: readonly string[] };
  /** Per-request reply timeout (default {@linkcode DEFAULT_TIMEOUT_MS}); a timeout closes the link. */
  readonly timeoutMs?: number;
  /** Whole-handshake timeout (default {@linkcode DEFAULT_HANDSHAKE_TIMEOUT_MS}). */
  readonly handshakeTimeoutMs?: number;
  /** How messages name the peer (default `worker HOST:PORT`). */
  readonly peerName?: string;
  /** How messages name this side (default `this stage`). */
  readonly selfName?: string;
}

/**
 * Connects to a worker, sets TCP_NODELAY, optionally starts TLS, and runs the handshake.
 * @throws {WireError} `refused` (chain mismatch, naming both values), `auth` (key missing or wrong),
 *   `timeout`, `closed` (connection refused or dropped), or a decode fault from the peer's frames
 */
export async function connectLink(addr: LinkAddress, opts: ConnectOptions): Promise<Link> {
  const peerName = opts.peerName ?? `worker ${addr.hostname}:${addr.port}`;
  let conn: Deno.Conn;
  try {
    const tcp = await Deno.connect({ hostname: addr.hostname, port: addr.port, transport: "tcp" });
    setNoDelay(tcp);
    conn = tcp;
    if (opts.tls) {
      conn = await Deno.startTls(tcp, {
        hostname: addr.hostname,
        ...(opts.tls.caCerts ? { caCerts: [...opts.tls.caCerts] } : {}),
      });
    }
  } catch (e) {
    throw new WireError(
      "closed",
      `Cannot connect to ${peerName}: ${describe(e)}: check that the worker runs and listens there`,
      { cause: e },
    );
  }
  return await openLink(conn, { ...opts, peerName });
}

/**
 * Runs the connector's handshake over an open connection and returns the link (closes `conn` on failure).
 * @throws {WireError} as {@linkcode connectLink}
 */
export async function openLink(conn: Deno.Conn, opts: ConnectOptions): Promise<Link> {
  const peer = opts.peerName ?? "the worker";
  const self = opts.selfName ?? "this stage";
  const io = new FrameConn(conn, limitsOf(opts.hello));
  const key = opts.linkKey === undefined ? undefined : await importLinkKey(opts.linkKey);
  const refuse = async (e: WireError): Promise<never> => {
    await io.write({ op: "close", id: 0, reason: { code: e.code, message: e.message } }).catch(() => {});
    throw e;
  };
  const handshake = async (): Promise<HelloInfo> => {
    const hello: Frame = {
      op: "hello",
      id: 0,
      hello: { auth: key !== undefined, nonce: newNonce(), info: opts.hello },
    };
    await io.write(hello);
    const ack = await io.next(peer);
    if (ack === undefined) throw new WireError("closed", `${peer} closed the connection during the hello`);
    if (ack.op === "hello_refuse" || ack.op === "close") {
      throw new WireError(ack.reason.code, `${peer} refused the connection: ${ack.reason.message}`);
    }
    if (ack.op !== "hello_ack") {
      return await refuse(
        new WireError("unexpected", `${peer} answered the hello with ${ack.op}, not hello_ack`),
      );
    }
    const info = ack.hello.info;
    const mode = authModeMismatch(key !== undefined, ack.hello.auth, peer);
    if (mode) return await refuse(mode);
    const chain = checkWholeChain(opts.hello, [info, ...info.downstream], {
      headName: self,
      names: [peer, ...info.downstream.map((_, i) => `${peer}'s downstream stage ${i + 1}`)],
    });
    if (chain) return await refuse(new WireError("refused", chain.message));
    const transcript = await transcriptHash(payloadOf(hello), ack.hello.payload ?? payloadOf(ack));
    const proof = key ? await makeProof(key, "connector", transcript) : new Uint8Array(0);
    await io.write({ op: "auth", id: 0, proof });
    const ready = await io.next(peer);
    if (ready === undefined) {
      throw new WireError("closed", `${peer} closed the connection during authentication`);
    }
    if (ready.op === "hello_refuse" || ready.op === "close") {
      throw new WireError(ready.reason.code, `${peer} refused the connection: ${ready.reason.message}`);
    }
    if (ready.op !== "ready") {
      return await refuse(new WireError("unexpected", `${peer} answered auth with ${ready.op}, not ready`));
    }
    if (key && !(await verifyProof(key, "acceptor", transcript, ready.proof))) {
      return await refuse(
        new WireError(
          "auth",
          `Wrong link key: ${peer}'s proof does not match this side's key: give both the same --link-key`,
        ),
      );
    }
    return info;
  };
  const ms = opts.handshakeTimeoutMs ?? DEFAULT_HANDSHAKE_TIMEOUT_MS;
  try {
    const info = await withTimeout(
      handshake(),
      ms,
      () =>
        new WireError(
          "timeout",
          `${peer} did not complete the handshake within ${ms} ms: the peer stalled or is not a stage link`,
        ),
    );
    return new Link(io, info, { peerName: peer, timeoutMs: opts.timeoutMs ?? DEFAULT_TIMEOUT_MS });
  } catch (e) {
    io.close();
    throw e instanceof WireError
      ? e
      : new WireError("closed", `Handshake with ${peer} failed: ${describe(e)}`, { cause: e });
  }
}

interface Pending {
  readonly what: string;
  readonly expect: Frame["op"];
  readonly resolve: (f: Frame) => void;
  readonly reject: (e: WireError) => void;
  readonly timer: ReturnType<typeof setTimeout> | undefined;
}

/**
 * An open, authenticated link to the next stage. Requests may overlap; each reply is matched by its
 * request id. A request that is not answered within the timeout, a malformed frame, an ERROR with id 0 or
 * a CLOSE from the peer closes the link and rejects every pending request with that reason.
 */
export class Link {
  /** The peer's hello. */
  readonly peer: HelloInfo;
  /** How messages name the peer. */
  readonly peerName: string;
  /** Resolves when the link has closed, with the reason (undefined after {@linkcode close}). */
  readonly closed: Promise<WireError | undefined>;
  readonly #io: FrameConn;
  readonly #timeoutMs: number;
  readonly #pending = new Map<number, Pending>();
  #nextId = 1;
  #closedWith: WireError | undefined;
  #isClosed = false;
  #resolveClosed!: (e: WireError | undefined) => void;

  /** Use {@linkcode connectLink} or {@linkcode openLink}. */
  constructor(io: FrameConn, peer: HelloInfo, opts: { peerName: string; timeoutMs: number }) {
    this.#io = io;
    this.peer = peer;
    this.peerName = opts.peerName;
    this.#timeoutMs = opts.timeoutMs;
    this.closed = new Promise((r) => this.#resolveClosed = r);
    this.#readLoop();
  }

  /** True once the link is closed (by either side or by a fault). */
  get isClosed(): boolean {
    return this.#isClosed;
  }

  /** Requests waiting for their reply. */
  get inFlight(): number {
    return this.#pending.size;
  }

  async #readLoop(): Promise<void> {
    try {
      for (;;) {
        const f = await this.#io.next(this.peerName);
        if (f === undefined) {
          this.#shutdown(new WireError("closed", `${this.peerName} closed the connection`));
          return;
        }
        if (f.op === "close" || (f.op === "error" && f.id === 0)) {
          this.#shutdown(
            new WireError(f.reason.code, `${this.peerName} closed the link: ${f.reason.message}`),
          );
          return;
        }
        const p = this.#pending.get(f.id);
        if (p === undefined || (f.op !== p.expect && f.op !== "error")) {
          const what = p === undefined
            ? "no request of this link has"
            : `request ${f.id} (${p.what}) expects ${p.expect}`;
          throw new WireError("unexpected", `${this.peerName} sent ${f.op} with id ${f.id} but ${what}`);
        }
        this.#pending.delete(f.id);
        clearTimeout(p.timer);
        if (f.op === "error") {
          p.reject(new WireError(f.reason.code, `${this.peerName} failed ${p.what}: ${f.reason.message}`));
        } else p.resolve(f);
      }
    } catch (e) {
      const err = e instanceof WireError
        ? e
        : new WireError("closed", `Link to ${this.peerName} failed: ${describe(e)}`);
      if (!this.#isClosed) {
        await this.#io.write({ op: "close", id: 0, reason: { code: err.code, message: err.message } }).catch(
          () => {},
        );
      }
      this.#shutdown(err);
    }
  }

  #shutdown(reason: WireError | undefined): void {
    if (this.#isClosed) return;
    this.#isClosed = true;
    this.#closedWith = reason;
    const err = reason ?? new WireError("closed", `Link to ${this.peerName} was closed by this side`);
    for (const p of this.#pending.values()) {
      clearTimeout(p.timer);
      p.reject(err);
    }
    this.#pending.clear();
    this.#io.close();
    this.#resolveClosed(reason);
  }

  #request(f: Frame, expect: Frame["op"], what: string, timeoutMs: number): Promise<Frame> {
    if (this.#isClosed) {
      return Promise.reject(
        this.#closedWith ?? new WireError("closed", `Link to ${this.peerName} is closed: reconnect first`),
      );
    }
    const id = this.#nextId;
    this.#nextId = this.#nextId >= 0xffff_ffff ? 1 : this.#nextId + 1;
    return new Promise<Frame>((resolve, reject) => {
      const timer = Number.isFinite(timeoutMs)
        ? setTimeout(() => {
          this.#shutdown(
            new WireError(
              "timeout",
              `${this.peerName} did not answer ${what} (request ${id}) within ${timeoutMs} ms: the stage ` +
                `stalled or the network dropped: the link is closed`,
            ),
          );
        }, timeoutMs)
        : undefined;
      this.#pending.set(id, { what, expect, resolve, reject, timer });
      this.#io.write({ ...f, id } as Frame).catch((e) =>
        this.#shutdown(
          new WireError("closed", `Cannot send ${what} to ${this.peerName}: ${describe(e)}`, { cause: e }),
        )
      );
    });
  }

  /**
   * Sends a RUN and resolves with its result.
   * @throws {WireError} `timeout`/`closed` (the link is then closed), or the peer's error for this request
   *   (`backend`, `out_of_range`, ...; the link stays open)
   */
  async run(req: RunRequest, opts: { timeoutMs?: number } = {}): Promise<RunResult> {
    const what = `run of slot ${req.slot} at position ${req.basePos}`;
    const f = await this.#request(
      { op: "run", id: 0, run: req },
      "run_result",
      what,
      opts.timeoutMs ?? this.#timeoutMs,
    );
    if (f.op !== "run_result") throw new Error(`Internal error: run got ${f.op}`);
    return f.result;
  }

  async #done(f: Frame, what: string): Promise<number> {
    const r = await this.#request(f, "done", what, this.#timeoutMs);
    if (r.op !== "done") throw new Error(`Internal error: ${what} got ${r.op}`);
    return r.value;
  }

  /** Saves `slot`'s state on the peer; resolves with the snapshot id. @throws {WireError} as {@linkcode run} */
  snapshotSave(slot: number): Promise<number> {
    return this.#done({ op: "snapshot_save", id: 0, slot }, `snapshot of slot ${slot}`);
  }

  /** Restores snapshot `snapshotId` into `slot` on the peer. @throws {WireError} as {@linkcode run} */
  async snapshotRestore(snapshotId: number, slot: number): Promise<void> {
    await this.#done(
      { op: "snapshot_restore", id: 0, snapshotId, slot },
      `restore of snapshot ${snapshotId} into slot ${slot}`,
    );
  }

  /** Frees snapshot `snapshotId` on the peer. @throws {WireError} as {@linkcode run} */
  async snapshotDrop(snapshotId: number): Promise<void> {
    await this.#done({ op: "snapshot_drop", id: 0, snapshotId }, `drop of snapshot ${snapshotId}`);
  }

  /** Empties `slot` on the peer. @throws {WireError} as {@linkcode run} */
  async reset(slot: number): Promise<void> {
    await this.#done({ op: "reset", id: 0, slot }, `reset of slot ${slot}`);
  }

  /** Round trip in ms. @throws {WireError} as {@linkcode run} */
  async ping(opts: { timeoutMs?: number } = {}): Promise<number> {
    const t0 = performance.now();
    await this.#request({ op: "ping", id: 0, sentMs: t0 }, "pong", "ping", opts.timeoutMs ?? this.#timeoutMs);
    return performance.now() - t0;
  }

  /** Sends CLOSE and closes; pending requests reject with `closed`. Safe to call twice. */
  async close(message = "the link is no longer needed"): Promise<void> {
    if (this.#isClosed) return;
    const write = this.#io.write({ op: "close", id: 0, reason: { code: "closed", message } });
    await withTimeout(write, 1000, () => new WireError("timeout", "close")).catch(() => {});
    this.#shutdown(undefined);
  }
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
