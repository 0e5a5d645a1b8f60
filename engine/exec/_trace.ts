/**
 * A decode trace for finding where a scheduler's time goes (issue #20: the service against the engine): with
 * `LLM_TRACE_DECODE=1` the decode driver prints one JSON line per landed batch and per call to stderr, the
 * service one per request handed to the worker (`submit`, main thread) and received there (`worker-got`), the
 * runner one per prompt piece and decode turn (`t`: `performance.now()` of the printing thread; `at`: ms since
 * the epoch, comparable across threads). Off otherwise, at the cost of one boolean test per batch.
 * @module
 */

/** Whether `LLM_TRACE_DECODE=1` (false where the environment cannot be read). */
export const TRACE_DECODE: boolean = (() => {
  try {
    return Deno.env.get("LLM_TRACE_DECODE") === "1";
  } catch {
    return false;
  }
})();

/** Prints `{trace: what, t, ...fields}` as one line to stderr when tracing. */
export function trace(what: string, fields: Record<string, unknown>): void {
  if (!TRACE_DECODE) return;
  const t = performance.now();
  const at = Math.round((performance.timeOrigin + t) * 1000) / 1000;
  console.error(JSON.stringify({ trace: what, t: Math.round(t * 1000) / 1000, at, ...fields }));
}
