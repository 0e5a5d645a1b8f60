/**
 * The stage link over TCP (optionally TLS): the connecting side's {@linkcode Link} (handshake, then
 * requests matched to replies by id, several in flight, per-request timeouts, clean close) and the
 * accepting side's {@linkcode serveWorker} loop that answers frames from a {@linkcode StageBackend}.
 *
 * Handshake (docs/WIRE.md "Handshake"): connector HELLO → acceptor HELLO_ACK (or HELLO_REFUSE) → connector
 * AUTH → acceptor READY (or HELLO_REFUSE). Both sides check the chain (`checkChain`); the
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
import { describe, payloadOf, setNoDelay, withTimeout } from "./_io.ts";
import { WireError } from "./errors.ts";
import {
  encodeFrame,
  type Frame,
  FrameDecoder,
  type FrameLimits,
  limitsOf,
  type RunBatchRequest,
  type RunRequest,
  type RunResult,
} from "./frame.ts";
import { checkWholeChain, type HelloInfo } from "./hello.ts";

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
  /**
   * Runs one row per slot as one batched step (RUN_BATCH, docs/WIRE.md); absent: the acceptor answers
   * ERROR `backend`.
   */
  runBatch?(req: RunBatchRequest): Promise<RunResult>;
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

  /** Why the link closed: the fault (a `timeout`, the peer closing, a bad frame); undefined while open or when
   * this side closed it. */
  get closedWith(): WireError | undefined {
    return this.#closedWith;
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

  /** Sends a RUN_BATCH and resolves with its result. @throws {WireError} as {@linkcode run} */
  async runBatch(req: RunBatchRequest, opts: { timeoutMs?: number } = {}): Promise<RunResult> {
    const what = `batched run of slots ${req.entries.map((e) => e.slot).join(",")}`;
    const f = await this.#request(
      { op: "run_batch", id: 0, run: req },
      "run_result",
      what,
      opts.timeoutMs ?? this.#timeoutMs,
    );
    if (f.op !== "run_result") throw new Error(`Internal error: runBatch got ${f.op}`);
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
