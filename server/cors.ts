/**
 * CORS for browser clients, off unless the head is started with `--cors ORIGIN` (one origin, a
 * comma-separated list, or `*`). When on: `OPTIONS` preflights of known routes answer 204 with the allowed
 * methods and headers (before the API key check: browsers send no credentials on a preflight), and every
 * answer to an allowed origin carries `Access-Control-Allow-Origin` and the exposed headers. A preflight
 * from another origin gets 403 naming the allowed ones. When off, `OPTIONS` is an unknown method (405).
 * @module
 */
import type { Context, Next } from "hono";
import type { AppEnv } from "./_generate.ts";
import { ApiError, dialectOf, errorResponse } from "./errors.ts";

/** Request headers a browser client may send. */
export const CORS_ALLOW_HEADERS =
  "authorization, content-type, x-api-key, x-request-id, anthropic-version, anthropic-beta";
/** Response headers a browser client may read. */
export const CORS_EXPOSE_HEADERS = "request-id, retry-after";
/** Seconds a browser may cache a preflight answer. */
export const CORS_MAX_AGE_S = 600;

/**
 * Parses `--cors`: `*` or a comma-separated list of origins (`scheme://host[:port]`, no path).
 * @throws {RangeError} naming the malformed origin
 */
export function parseCorsOrigins(spec: string): readonly string[] {
  const list = spec.split(",").map((s) => s.trim()).filter((s) => s !== "");
  if (list.length === 0) throw new RangeError("--cors is empty: give an origin such as https://app.example");
  for (const o of list) {
    if (o === "*") continue;
    let u: URL | undefined;
    try {
      u = new URL(o);
    } catch (e) {
      throw new RangeError(
        `--cors ${o} is not an origin: give scheme://host[:port], e.g. https://app.example`,
        {
          cause: e,
        },
      );
    }
    if (u.origin !== o) {
      throw new RangeError(
        `--cors ${o} is not an origin (${u.origin} is): give scheme://host[:port] without path`,
      );
    }
  }
  return list;
}

/**
 * The CORS middleware; `allowMethods(path)` gives the methods of a known path (undefined: unknown path).
 * A no-op when `origins` is undefined.
 */
export function cors(
  origins: readonly string[] | undefined,
  allowMethods: (path: string) => readonly string[] | undefined,
): (c: Context<AppEnv>, next: Next) => Promise<Response | void> {
  return async (c, next) => {
    if (origins === undefined) return await next();
    const origin = c.req.header("origin");
    const allowed = origin === undefined
      ? undefined
      : origins.includes("*")
      ? "*"
      : origins.includes(origin)
      ? origin
      : undefined;
    const methods = allowMethods(c.req.path);
    if (c.req.method === "OPTIONS" && methods !== undefined) {
      if (allowed === undefined) {
        const err = new ApiError(
          "forbidden",
          `Origin ${origin ?? "(none)"} is not allowed by this server's --cors (${origins.join(", ")})`,
        );
        return errorResponse(err, dialectOf(c.req.path), c.get("requestId"));
      }
      return c.body(null, 204, {
        "access-control-allow-origin": allowed,
        "access-control-allow-methods": [...methods, "OPTIONS"].join(", "),
        "access-control-allow-headers": CORS_ALLOW_HEADERS,
        "access-control-max-age": String(CORS_MAX_AGE_S),
        "vary": "Origin",
      });
    }
    await next();
    if (allowed !== undefined) {
      c.res.headers.set("access-control-allow-origin", allowed);
      c.res.headers.set("access-control-expose-headers", CORS_EXPOSE_HEADERS);
      c.res.headers.append("vary", "Origin");
    }
  };
}
