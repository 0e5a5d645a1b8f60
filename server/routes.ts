/**
 * The head's routes and their methods, in one table: the app answers other methods with 405 and `Allow`,
 * CORS preflights list them, and `/metrics` labels requests by route (`other` for unknown paths, so a
 * scanner cannot grow the label set).
 * @module
 */

const GET = ["GET", "HEAD"] as const;

/** Every fixed route and its methods. */
export const ROUTES: Readonly<Record<string, readonly string[]>> = {
  "/v1/messages": ["POST"],
  "/v1/messages/count_tokens": ["POST"],
  "/v1/chat/completions": ["POST"],
  "/completion": ["POST"],
  "/v1/models": GET,
  "/health": GET,
  "/metrics": GET,
};

/** Prefix of `GET /v1/models/{id}` (ids may hold slashes: `Qwen/Qwen3-Next`). */
export const MODEL_PREFIX = "/v1/models/";

/** The route a path belongs to, as `/metrics` labels it (`other` when none). */
export function routeOf(path: string): string {
  if (Object.hasOwn(ROUTES, path)) return path;
  return path.startsWith(MODEL_PREFIX) && path.length > MODEL_PREFIX.length ? "/v1/models/{id}" : "other";
}

/** Methods a path takes; undefined for an unknown path. */
export function methodsOf(path: string): readonly string[] | undefined {
  const r = routeOf(path);
  return r === "other" ? undefined : r === "/v1/models/{id}" ? GET : ROUTES[r];
}
