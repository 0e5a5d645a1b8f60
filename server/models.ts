/**
 * `GET /v1/models`: the one model served, in a list both SDKs read: OpenAI's `{object: "list", data: [{id,
 * object: "model", created, owned_by}]}` and Anthropic's `{data: [{type: "model", id, display_name,
 * created_at}], has_more, first_id, last_id}` share the same entries. `GET /v1/models/{id}` gives the entry
 * alone (404 for another id).
 * @module
 */
import type { Context } from "hono";
import type { EngineStatus } from "../engine/mod.ts";
import { ApiError } from "./errors.ts";

/** The model entry of `st` as both SDKs read it. */
function modelEntry(st: EngineStatus, startedAt: Date): Record<string, unknown> {
  return {
    id: st.model,
    object: "model",
    type: "model",
    display_name: `${st.model} (${st.arch})`,
    created: Math.floor(startedAt.getTime() / 1000),
    created_at: startedAt.toISOString(),
    owned_by: "local",
    meta: { arch: st.arch, n_ctx: st.nCtx, n_slots: st.nSlots, state: st.state },
  };
}

/** The `GET /v1/models` handler; `startedAt` is reported as the model's creation time. */
export function modelsHandler(status: () => EngineStatus, startedAt: Date): (c: Context) => Response {
  return (c) => {
    const st = status();
    const entry = modelEntry(st, startedAt);
    return c.json({ object: "list", data: [entry], has_more: false, first_id: st.model, last_id: st.model });
  };
}

/**
 * The `GET /v1/models/{id}` handler: the served model's entry.
 * @throws {ApiError} 404 for any other id, naming the served one
 */
export function modelHandler(status: () => EngineStatus, startedAt: Date): (c: Context) => Response {
  return (c) => {
    const st = status();
    const id = decodeURIComponent(c.req.path.slice("/v1/models/".length));
    if (id !== st.model) {
      throw new ApiError(
        "not_found",
        `Model ${JSON.stringify(id)} is not served here: this server serves ${JSON.stringify(st.model)} only`,
        { param: "model" },
      );
    }
    return c.json(modelEntry(st, startedAt));
  };
}
