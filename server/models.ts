/**
 * `GET /v1/models`: the one model served, in a list both SDKs read: OpenAI's `{object: "list", data: [{id,
 * object: "model", created, owned_by}]}` and Anthropic's `{data: [{type: "model", id, display_name,
 * created_at}], has_more, first_id, last_id}` share the same entries.
 * @module
 */
import type { Context } from "hono";
import type { EngineStatus } from "../engine/mod.ts";

/** The `GET /v1/models` handler; `startedAt` is reported as the model's creation time. */
export function modelsHandler(status: () => EngineStatus, startedAt: Date): (c: Context) => Response {
  return (c) => {
    const st = status();
    const entry = {
      id: st.model,
      object: "model",
      type: "model",
      display_name: `${st.model} (${st.arch})`,
      created: Math.floor(startedAt.getTime() / 1000),
      created_at: startedAt.toISOString(),
      owned_by: "local",
      meta: { arch: st.arch, n_ctx: st.nCtx, n_slots: st.nSlots, state: st.state },
    };
    return c.json({ object: "list", data: [entry], has_more: false, first_id: st.model, last_id: st.model });
  };
}
