/**
 * `mod.ts probe HOST:PORT`: connects to a worker exactly as a head started with the same flags would (the
 * head's hello from the model and its sizing flags, `connectLink` with the head's names for both sides, so the
 * worker's and the head's chain checks and the link key's proofs all run), then prints what the worker and
 * the stages behind it serve and the round-trip time. Exits 0 only when that head would be accepted;
 * otherwise 1 with the message the head would log.
 * @module
 */
import type { Command } from "./command.ts";
import { parseArgs } from "node:util";
import { archOf, KEYS, modelFingerprint, openGguf } from "../engine/mod.ts";
import {
  connectLink,
  DEFAULT_HANDSHAKE_TIMEOUT_MS,
  type HelloInfo,
  parseAddress,
  readTlsFlags,
  WireError,
  type WireErrorCode,
} from "../wire/mod.ts";
import { helloOf } from "../wire/chain.ts";
import { buildInfo } from "../version.ts";
import { parseLayers } from "./worker.ts";
import { expertsConflict, int8ActivationsFlag, int8ExpertsFlag, numericsFlag } from "./experts.ts";

const USAGE = `Usage: deno run -A mod.ts probe HOST:PORT --model F.gguf --layers 0:a [options]
  HOST:PORT         the worker's --listen address (the head's --next)
  --model F         the head's GGUF (its fingerprint, architecture and width go into the hello)
  --layers 0:a      the head's range: the worker must start at layer a
  --slots N         the head's slots (default 4): the worker must have at least as many
  --ctx N           the head's context (default 8192): the worker must have at least as much
  --kv-f16          the head runs with --kv-f16 (every stage must agree)
  --int8-experts    the head runs with --int8-experts, int8 x for the experts alone (every stage must agree)
  --f32-experts     the head runs with --f32-experts, f32 x everywhere (every stage must agree)
  --int8            the default (int8 x for every mat-vec): a no-op, taken for old command lines
  --link-key K      the chain's key (or LLM_LINK_KEY), as the head would use it
  --tls-ca F        connect over TLS trusting this CA (PEM), as the head's --tls-ca
  --pings N         round trips to time (default 5)
  --timeout S       seconds the handshake may take (default ${DEFAULT_HANDSHAKE_TIMEOUT_MS / 1000})
Exits 0 when a head with these flags would accept the worker and the chain behind it, else 1 with the
message that head would log.`;

function int(flag: string, value: string, min: number): number {
  const n = Number(value);
  if (!Number.isInteger(n) || n < min) {
    throw new RangeError(`--${flag} ${value} must be an integer >= ${min}`);
  }
  return n;
}

/** What to do about a failed probe, by the link error's code. */
function hint(code: WireErrorCode, where: string): string {
  switch (code) {
    case "refused":
      return "a head started with these flags would be refused: change the flag or the worker the message names";
    case "auth":
      return "give the head and every worker the same --link-key (or LLM_LINK_KEY)";
    case "closed":
      return `is a worker running and listening at ${where} (its --listen), and does a firewall let it through?`;
    case "timeout":
    case "bad_magic":
    case "truncated":
    case "unexpected":
    case "oversize":
    case "unknown_op":
    case "bad_flags":
    case "short_payload":
    case "bad_length":
      return `${where} answers, but not as a stage link: give a worker's --listen port, not the head's HTTP port`;
    case "bad_hello":
    case "bad_value":
    case "out_of_range":
    case "backend":
      return "run the same build on every box";
    default: {
      const never: never = code;
      return String(never);
    }
  }
}

/** One stage's hello as lines. */
function describeStage(h: HelloInfo, name: string): string[] {
  return [
    `${name}`,
    `  model        ${h.arch}, fingerprint ${h.fingerprint}`,
    `  layers       ${h.layers.first}:${h.layers.end} of ${h.layers.total}${
      h.last ? " (last stage: output norm, LM head)" : ""
    }`,
    `  width        nEmbd ${h.nEmbd}`,
    `  slots        ${h.nSlots}, context ${h.nCtx} positions per slot`,
    `  state        ${h.stateLayout}; int8 activations ${
      h.numerics.int8Activations ? "on" : h.numerics.int8Experts ? "experts only" : "off"
    }; hidden ` +
    `rows ${h.numerics.hiddenDtype}`,
    `  build        ${h.build.version} (commit ${h.build.commit}), wire protocol ${h.protocol}`,
    `  limits       frames up to ${h.limits.maxFrameBytes} bytes, ${h.limits.maxRows} rows, top-k ${h.limits.maxTopK}`,
  ];
}

/** The `probe` command. */
export const command: Command = {
  usage: USAGE,
  summary: "check a worker as a head with these flags would (hello, key, chain) and print what it serves",
  async run(argv: string[]): Promise<number> {
    const { values, positionals } = parseArgs({
      args: argv,
      options: {
        model: { type: "string" },
        layers: { type: "string" },
        slots: { type: "string", default: "4" },
        ctx: { type: "string", default: "8192" },
        "kv-f16": { type: "boolean", default: false },
        int8: { type: "boolean", default: false },
        "int8-experts": { type: "boolean", default: false },
        "f32-experts": { type: "boolean", default: false },
        "link-key": { type: "string" },
        "tls-ca": { type: "string" },
        pings: { type: "string", default: "5" },
        timeout: { type: "string", default: String(DEFAULT_HANDSHAKE_TIMEOUT_MS / 1000) },
        debug: { type: "boolean", default: false },
      },
      allowPositionals: true,
      strict: true,
    });
    const conflict = expertsConflict(values);
    if (conflict !== undefined) {
      console.error(`error: ${conflict}`);
      return 2;
    }
    const [target, ...extra] = positionals;
    if (target === undefined || extra.length > 0) {
      throw new RangeError("Give exactly one HOST:PORT to probe: the worker's --listen address");
    }
    const addr = parseAddress(target);
    if (!values.model) {
      throw new RangeError("--model is required: the head's GGUF (the hello carries its fingerprint)");
    }
    if (!values.layers) {
      throw new RangeError("--layers 0:a is required: the head's range (the worker starts at a)");
    }
    const layers = parseLayers(values.layers);
    if (layers[0] !== 0) {
      throw new RangeError(`--layers ${values.layers}: the head runs the first range, 0:a`);
    }
    const nSlots = int("slots", values.slots, 1);
    const nCtx = int("ctx", values.ctx, 2);
    const pings = int("pings", values.pings, 1);
    const timeoutS = Number(values.timeout);
    if (!(Number.isFinite(timeoutS) && timeoutS > 0)) {
      throw new RangeError(`--timeout ${values.timeout} must be a positive number of seconds`);
    }
    // The key and TLS exactly as the head takes them (cli/head.ts splitOptions).
    const linkKey = values["link-key"] ?? Deno.env.get("LLM_LINK_KEY");
    if (linkKey === "") throw new RangeError("--link-key is empty: give a key or leave the flag out");
    const tls = await readTlsFlags({ tlsCa: values["tls-ca"] });

    let hello: HelloInfo;
    {
      using file = await openGguf(values.model);
      const arch = file.metadata.getString(KEYS.architecture);
      const hp = archOf(file.metadata).readHparams(file.metadata);
      if (layers[1] >= hp.nLayer || layers[1] < 1) {
        throw new RangeError(
          `--layers ${values.layers} of ${values.model}: a split head runs layers 0:a with 0 < a < ${hp.nLayer}`,
        );
      }
      const { fingerprint } = await modelFingerprint(file);
      hello = helloOf({
        arch,
        layers: { first: 0, end: layers[1], total: hp.nLayer },
        nEmbd: hp.nEmbd,
        nSlots,
        nCtx,
        // The stage's rule (int8ExpertsOf) holds already: the flags give int8 activations only with int8 experts.
        int8Activations: int8ActivationsFlag(values),
        int8Experts: int8ExpertsFlag(values),
        kvF16: values["kv-f16"],
        fingerprint,
      }, { build: buildInfo(), last: false });
    }

    const where = `${addr.hostname}:${addr.port}`;
    let link;
    try {
      // The names wire/chain.ts gives both sides, so every message is the one the head would log.
      link = await connectLink(addr, {
        hello,
        linkKey,
        tls: tls.connect,
        peerName: `worker ${where}`,
        selfName: `this stage (layers 0:${layers[1]})`,
        handshakeTimeoutMs: timeoutS * 1000,
      });
    } catch (e) {
      if (!(e instanceof WireError)) throw e;
      console.error(`error: ${e.message}`);
      console.error(`hint: ${hint(e.code, where)}`);
      return 1;
    }
    try {
      const rtts: number[] = [];
      for (let i = 0; i < pings; i++) rtts.push(await link.ping());
      rtts.sort((a, b) => a - b);
      const ms = (x: number) => `${x.toFixed(2)} ms`;
      const peer = link.peer;
      const lines = [
        `Accepted: a head with --layers 0:${layers[1]} --slots ${nSlots} --ctx ${nCtx}${
          values["kv-f16"] ? " --kv-f16" : ""
        }${numericsFlag(values)} can use the chain at ${where}`,
        ...describeStage(peer, `worker ${where}`),
        ...peer.downstream.flatMap((h, i) => describeStage(h, `behind it, stage ${i + 2}`)),
        `round trip   min ${ms(rtts[0]!)}, median ${ms(rtts[Math.floor(rtts.length / 2)]!)}, max ${
          ms(rtts.at(-1)!)
        } over ${pings} ping(s)`,
      ];
      console.log(lines.join("\n"));
      return 0;
    } finally {
      await link.close("probe done");
    }
  },
};
