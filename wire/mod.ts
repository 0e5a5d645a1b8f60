/**
 * The stage link of split serving: binary frames, the hello and chain check, HMAC authentication, and the
 * TCP/TLS link with its worker accept loop. Independent of the engine: a worker adapts its stage to
 * {@linkcode StageBackend}. The protocol is specified in docs/WIRE.md.
 *
 * @example
 * ```ts
 * import { connectLink, type HelloInfo, parseAddress } from "./mod.ts";
 * declare const headHello: HelloInfo;
 * const link = await connectLink(parseAddress("10.0.0.2:9100"), { hello: headHello, linkKey: Deno.env.get("LLM_LINK_KEY") });
 * const result = await link.run({
 *   slot: 0, basePos: 0, nEmbd: headHello.nEmbd, rows: new Float32Array(headHello.nEmbd), dtype: "f32",
 *   want: "ids", topK: 0, drafts: new Uint32Array(0),
 * });
 * await link.close();
 * ```
 * @module
 */
export * from "./errors.ts";
export * from "./hello.ts";
export * from "./frame.ts";
export * from "./auth.ts";
export * from "./link.ts";
export * from "./serve.ts";
