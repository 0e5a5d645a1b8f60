/**
 * The dashboard's stage view in a real headless browser (Debian's `chromium`, driven by `playwright-core`)
 * against a split chain of real processes on loopback (#22 with #19): a head (layers 0:2) and a worker
 * (2:4) on the tiny synthetic qwen35moe. While an answer streams, the page's stage table shows both boxes in
 * layer order with their layers, step times and the worker's wire time, links `local` and `up`; after the
 * worker is SIGKILLed its row reads `down` (highlighted) while the stream ends with an error event; after
 * the worker restarts on the same port, the next request succeeds and the row reads `up` again. No console
 * errors on the way.
 * @module
 */
import assert from "node:assert/strict";
import { chromium, type Page } from "playwright-core";
import { planModel, synthesize } from "../engine/mod.ts";
import { chromiumPath } from "./util/browser.ts";
import { freePort, type Proc, spawnMod } from "./util/procs.ts";

const WAIT_MS = 60_000;

/** The DOM calls the in-page function makes (Deno's types have no DOM; the casts vanish when compiled). */
interface Doc {
  querySelectorAll(selector: string): ArrayLike<{ textContent: string | null; className?: string }>;
}

/** The stage table's rows: each cell's text and, last, the link cell's class. */
function stageRows(page: Page): Promise<string[][]> {
  return page.evaluate(() => {
    const doc = (globalThis as unknown as { document: Doc }).document;
    return Array.from(doc.querySelectorAll("#stages tbody tr"), (r) => {
      const cells = Array.from((r as unknown as Doc).querySelectorAll("td"));
      return [...cells.map((c) => c.textContent ?? ""), cells[4]?.className ?? ""];
    });
  });
}

/** Polls the stage table until `ok` holds for its rows; the last rows in the error otherwise. */
async function untilRows(page: Page, what: string, ok: (rows: string[][]) => boolean): Promise<string[][]> {
  const end = Date.now() + WAIT_MS;
  let rows: string[][] = [];
  while (Date.now() < end) {
    rows = await stageRows(page);
    if (ok(rows)) return rows;
    await new Promise((r) => setTimeout(r, 200));
  }
  throw new Error(`Timed out waiting for ${what}; the stage table: ${JSON.stringify(rows)}`);
}

Deno.test({
  name:
    "dashboard stage view in headless chromium: split head and worker live, a killed worker reads down, " +
    "then up after its restart",
  // playwright-core keeps its browser pipe and timers until close; the test closes them in `finally`.
  sanitizeOps: false,
  sanitizeResources: false,
  async fn() {
    const executablePath = chromiumPath();
    const dir = await Deno.makeTempDir({ prefix: "dashboard_split_test_" });
    const procs: Proc[] = [];
    const browser = await chromium.launch({ executablePath, args: ["--no-sandbox"] });
    const problems: string[] = [];
    try {
      const model = `${dir}/tiny.gguf`;
      await synthesize(planModel({ arch: "qwen35moe", preset: "tiny", quant: "q8_0", seed: 1 }), {
        out: model,
      });
      const port = freePort();
      const worker = () =>
        spawnMod([
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
          "1024",
        ]);
      const w = worker();
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
        "1024",
        "--layers",
        "0:2",
        "--next",
        `127.0.0.1:${port}`,
      ]);
      procs.push(h);
      const url = (await h.waitFor(/Listening on (http:\/\/\S+)/))[1]!;
      await h.waitFor(/ready: /);

      // A long greedy answer streams while the page is looked at.
      const r = await fetch(`${url}/v1/messages`, {
        method: "POST",
        headers: { "content-type": "application/json" },
        body: JSON.stringify({
          model: "m",
          max_tokens: 960,
          temperature: 0,
          stream: true,
          messages: [{ role: "user", content: "Tell me a long story" }],
        }),
      });
      assert.equal(r.status, 200);
      let sse = "";
      const reading = (async () => {
        for await (const chunk of r.body!.pipeThrough(new TextDecoderStream())) sse += chunk;
      })();

      const context = await browser.newContext({ viewport: { width: 1280, height: 820 } });
      const page = await context.newPage();
      page.on("console", (m) => {
        if (m.type() === "error" || m.type() === "warning") problems.push(`console.${m.type()}: ${m.text()}`);
      });
      page.on("pageerror", (e) => problems.push(`page error: ${e.message}`));
      await page.goto(url);

      const box = `127.0.0.1:${port}`;
      const live = await untilRows(
        page,
        "both stages with step and wire times",
        (rows) => rows.length === 2 && /ms$/.test(rows[0]![2]!) && /ms$/.test(rows[1]![2]!),
      );
      assert.deepEqual(live.map((c) => [c[0], c[1], c[4]]), [["head", "0–2", "local"], [box, "2–4", "up"]]);
      assert.match(live[1]![3]!, /ms$/, "the worker's wire time");
      assert.ok(!/event: error/.test(sse), "the answer is still streaming without error");

      await w.kill("SIGKILL");
      const down = await untilRows(
        page,
        "the killed worker's row to read down",
        (rows) => rows[1]?.[4] === "down",
      );
      assert.equal(down[1]![5], "down", "the link cell is highlighted (td.down)");
      assert.equal(down[0]![4], "local", "the head's own stage stays local");
      await reading;
      assert.match(sse, /event: error\ndata: /, "the stream ends with an error event");

      const w2 = worker();
      procs.push(w2);
      await w2.waitFor(/Listening on/);
      const again = await fetch(`${url}/v1/messages`, {
        method: "POST",
        headers: { "content-type": "application/json" },
        body: JSON.stringify({ model: "m", max_tokens: 8, messages: [{ role: "user", content: "Hello" }] }),
      });
      assert.equal(again.status, 200, await again.text());
      await untilRows(page, "the restarted worker's row to read up", (rows) => rows[1]?.[4] === "up");
      assert.deepEqual(problems, [], "no console errors or warnings");
    } finally {
      await browser.close();
      await Promise.all(procs.map((p) => p.kill()));
      await Deno.remove(dir, { recursive: true });
    }
  },
});
