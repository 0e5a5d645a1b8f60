/**
 * API-key middleware: when a key is set, every request but `GET /health` must carry it as
 * `x-api-key: KEY` (Anthropic) or `Authorization: Bearer KEY` (OpenAI); otherwise 401 in the dialect of
 * the path. The comparison takes the same time wherever the keys differ.
 * @module
 */
import type { Context, Next } from "hono";
import type { AppEnv } from "./_generate.ts";
import { ApiError, dialectOf, errorResponse } from "./errors.ts";

/** Paths served without a key. */
export const PUBLIC_PATHS: ReadonlySet<string> = new Set(["/health"]);

function sameKey(a: string, b: string): boolean {
  const x = new TextEncoder().encode(a), y = new TextEncoder().encode(b);
  let diff = x.length ^ y.length;
  for (let i = 0; i < Math.max(x.length, y.length); i++) diff |= (x[i] ?? 0) ^ (y[i] ?? 0);
  return diff === 0;
}

/** The key a request carries (x-api-key first, then a Bearer token), or undefined. */
export function presentedKey(headers: Headers): string | undefined {
  const x = headers.get("x-api-key");
  if (x !== null) return x;
  const m = /^Bearer\s+(.+)$/i.exec(headers.get("authorization") ?? "");
  return m?.[1]?.trim();
}

/** Middleware checking the API key (no-op when `apiKey` is undefined). */
export function auth(
  apiKey: string | undefined,
): (c: Context<AppEnv>, next: Next) => Promise<Response | void> {
  return async (c, next) => {
    if (apiKey === undefined || PUBLIC_PATHS.has(c.req.path)) return await next();
    const got = presentedKey(c.req.raw.headers);
    if (got === undefined || !sameKey(got, apiKey)) {
      const err = new ApiError(
        "authentication",
        got === undefined
          ? "Missing API key: send it as the x-api-key header or as Authorization: Bearer <key>"
          : "Invalid API key: the key sent does not match the server's --api-key",
      );
      return errorResponse(err, dialectOf(c.req.path), c.get("requestId"));
    }
    await next();
  };
}
