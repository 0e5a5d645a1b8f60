/**
 * Per-stage times of a split chain end to end (#19, #22), real processes on loopback: a head (layers 0:2,
 * `--draft 3`) and a worker (2:4) on the tiny synthetic qwen35moe. After a request `/metrics` shows, for
 * the head's range and the worker, compute seconds and RUN frames > 0, the worker's wire seconds > 0 and
 * both stages up, plus the draft counters; the dashboard's event feed carries the same stages (box, layers,
 * step and wire ms, link). After the worker is SIGKILLed the worker's stage reads down in both.
 * @module
 */
import assert from "node:assert/strict";
import { planModel, synthesize } from "../engine/mod.ts";
import { freePort, type Proc, spawnMod } from "./util/procs.ts";

/** The value of the series `name{labels}` (labels as written in the exposition); undefined when absent. */
function series(text: string, name: string, labels: string): number | undefined {
  const line = text.split("\n").find((l) => l.startsWith(`${name}{${labels}} `));
  return line === undefined ? undefined : Number(line.slice(line.lastIndexOf(" ") + 1));
}

/** The first `status` event of `GET /dashboard/events`. */
async function dashboardSnapshot(url: string): Promise<{ stages: Record<string, unknown>[] }> {
  const ac = new AbortController();
  const r = await fetch(`${url}/dashboard/events`, { signal: ac.signal });
  assert.equal(r.status, 200);
  const reader = r.body!.pipeThrough(new TextDecoderStream()).getReader();
  let text = "";
  while (!/\n\n/.test(text)) text += (await reader.read()).value ?? "";
  ac.abort();
  await reader.cancel().catch(() => {});
  const data = text.split("\n").find((l) => l.startsWith("data: "));
  assert.ok(data, text);
  return JSON.parse(data.slice("data: ".length));
}

Deno.test({
  name:
    "split metrics: per-stage compute and wire time, link up, drafts; the killed worker's stage reads down",
  sanitizeResources: false,
  sanitizeOps: false,
  async fn() {
    const dir = await Deno.makeTempDir({ prefix: "split_metrics_test_" });
    const procs: Proc[] = [];
    try {
      const model = `${dir}/tiny.gguf`;
      await synthesize(planModel({ arch: "qwen35moe", preset: "tiny", quant: "q8_0", seed: 1 }), {
        out: model,
      });
      const port = freePort();
      const w = spawnMod([
        "worker",
        "--model",
        model,
        "--layers",
        "2:4",
        "--listen",
        `127.0.0.1:${port}`,
        "--slots",
        "1",
        "--ctx",
        "128",
      ]);
      procs.push(w);
      await w.waitFor(/Listening on/);
      const h = spawnMod([
        "head",
        "--model",
        model,
        "--port",
        "0",
        "--slots",
        "1",
        "--ctx",
        "128",
        "--layers",
        "0:2",
        "--next",
        `127.0.0.1:${port}`,
        "--draft",
        "3",
        "--draft-cache",
        "4",
      ]);
      procs.push(h);
      const url = (await h.waitFor(/Listening on (http:\/\/\S+)/))[1]!;
      await h.waitFor(/ready: /);
      // Twice: whatever ids the tiny model picks, the second answer finds the first in the draft cache, so
      // drafts are proposed (prompt lookup alone depends on the ids repeating).
      for (let i = 0; i < 2; i++) {
        const r = await fetch(`${url}/v1/messages`, {
          method: "POST",
          headers: { "content-type": "application/json" },
          body: JSON.stringify({
            model: "m",
            max_tokens: 16,
            messages: [{ role: "user", content: "one two one two one two one two" }],
          }),
        });
        assert.equal(r.status, 200, await r.text());
      }

      const text = await (await fetch(`${url}/metrics`)).text();
      const l0 = 'stage="0",box="head",layers="0:2"';
      const l1 = `stage="1",box="127.0.0.1:${port}",layers="2:4"`;
      for (const l of [l0, l1]) {
        assert.ok(series(text, "llm_stage_compute_seconds_total", l)! > 0, `compute of ${l} in\n${text}`);
        assert.ok(series(text, "llm_stage_runs_total", l)! >= 2, `runs of ${l} (prompt and decode frames)`);
        assert.equal(series(text, "llm_stage_up", l), 1, `up of ${l}`);
      }
      assert.ok(series(text, "llm_stage_wire_seconds_total", l1)! > 0, `wire of the worker in\n${text}`);
      assert.equal(series(text, "llm_stage_wire_seconds_total", l0), undefined, "the head has no wire");
      const proposed = Number(/^llm_draft_tokens_proposed_total (\S+)$/m.exec(text)?.[1]);
      const accepted = Number(/^llm_draft_tokens_accepted_total (\S+)$/m.exec(text)?.[1]);
      assert.ok(proposed > 0 && accepted >= 0 && accepted <= proposed, `drafts in\n${text}`);

      const snap = await dashboardSnapshot(url);
      assert.deepEqual(snap.stages.map((s) => [s.box, s.layers, s.link]), [
        ["head", [0, 2], "local"],
        [`127.0.0.1:${port}`, [2, 4], "up"],
      ]);
      for (const s of snap.stages) assert.ok((s.stepMs as number) > 0, JSON.stringify(s));
      assert.ok((snap.stages[1]!.wireMs as number) > 0, JSON.stringify(snap.stages[1]));

      await w.kill("SIGKILL");
      let after = "";
      for (let i = 0; i < 100; i++) {
        after = await (await fetch(`${url}/metrics`)).text();
        if (series(after, "llm_stage_up", l1) === 0) break;
        await new Promise((r) => setTimeout(r, 100));
      }
      assert.equal(series(after, "llm_stage_up", l1), 0, `the killed worker still up in\n${after}`);
      assert.equal(series(after, "llm_stage_up", l0), 1);
      assert.ok(series(after, "llm_stage_compute_seconds_total", l1)! > 0, "its totals stay");
      const down = await dashboardSnapshot(url);
      assert.equal(down.stages[1]!.link, "down", JSON.stringify(down.stages[1]));
    } finally {
      await Promise.all(procs.map((p) => p.kill()));
      await Deno.remove(dir, { recursive: true });
    }
  },
});
