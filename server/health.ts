/**
 * `GET /health`: `200 {"status":"ok", …slots}` when the model is ready; `503 {"status":"loading",
 * "progress", "loaded_bytes", "total_bytes"}` while it loads; `500 {"status":"error"}` after a failed load.
 * Never needs the API key (load balancers and scripts poll it).
 * @module
 */
import type { Context } from "hono";
import type { EngineStatus } from "../engine/mod.ts";

/** The `GET /health` handler. */
export function healthHandler(status: () => EngineStatus): (c: Context) => Response {
  return (c) => {
    const st = status();
    switch (st.state) {
      case "ready":
        return c.json({
          status: "ok",
          model: st.model,
          slots_idle: st.nSlots - st.busySlots,
          slots_processing: st.busySlots,
          queued: st.queued,
        });
      case "loading":
        return c.json(
          {
            status: "loading",
            progress: st.totalBytes > 0 ? st.loadedBytes / st.totalBytes : 0,
            loaded_bytes: st.loadedBytes,
            total_bytes: st.totalBytes,
          },
          503,
          { "retry-after": "5" },
        );
      case "failed":
        return c.json(
          { status: "error", message: `Model ${st.model} failed to load: see the server log` },
          500,
        );
      default: {
        const never: never = st.state;
        throw new Error(`Internal error: unknown engine state ${String(never)}`);
      }
    }
  };
}
