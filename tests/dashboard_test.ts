/**
 * The dashboard in a real headless browser (Debian's `chromium`, driven by `playwright-core`) against a head
 * on the real engine (tiny synthetic qwen35moe on the WebGPU adapter) behind an API key: the page asks for
 * the key and loads without console errors, an answer streams into the page, Stop aborts the request and
 * the engine frees the slot, the live view shows the running request, `<script>` in a message and markup in
 * model output render as text, the conversation survives a reload, and a phone-sized screen gets tabs.
 *
 * No chromium means failure with the install command, never a skip (CI's .ci/run installs it).
 * `DASHBOARD_SCREENSHOT=docs/dashboard.png deno test -A tests/dashboard_test.ts` also writes the README's
 * screenshot, taken while an answer streams.
 */
import assert from "node:assert/strict";
import { chromium, type Page } from "playwright-core";
import { ChatTemplate, openGguf, planModel, startEngine, synthesize, Tokenizer } from "../engine/mod.ts";
import { createApp } from "../server/app.ts";
import { serveHttp1 } from "../server/http1.ts";
import { chromiumPath } from "./util/browser.ts";

const KEY = "dashboard-test-key";
const WAIT_MS = 30_000;
/** The first answer also builds the GPU pipelines (seconds on lavapipe, more under a parallel test run). */
const FIRST_ANSWER_MS = 90_000;

/** The DOM calls the in-page functions make (Deno's types have no DOM; the casts vanish when compiled). */
interface Doc {
  querySelector(selector: string): { textContent: string | null } | null;
  querySelectorAll(selector: string): ArrayLike<{ textContent: string | null }>;
  getElementById(id: string): { textContent: string | null; open?: boolean } | null;
  documentElement: { scrollWidth: number };
}

/** Waits until `fn` returns true in Deno (not in the page), polling. */
async function until(what: string, fn: () => boolean, timeoutMs = WAIT_MS): Promise<void> {
  const end = Date.now() + timeoutMs;
  while (!fn()) {
    if (Date.now() > end) throw new Error(`Timed out after ${timeoutMs} ms waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 50));
  }
}

/** Sets the chat's settings fields (opens the folded settings first). */
async function settings(
  page: Page,
  s: { max: number; temp: number; think: boolean; seed?: number },
): Promise<void> {
  await page.evaluate(() => {
    (globalThis as unknown as { document: Doc }).document.getElementById("settings")!.open = true;
  });
  await page.fill("#s-max", String(s.max));
  await page.fill("#s-temp", String(s.temp));
  await page.setChecked("#s-think", s.think);
  await page.fill("#s-seed", s.seed === undefined ? "" : String(s.seed));
}

/** Text of the last assistant message (its thinking and its answer). */
function lastAnswer(page: Page): Promise<string> {
  return page.evaluate(() => {
    const all = (globalThis as unknown as { document: Doc }).document.querySelectorAll("#log .msg.assistant");
    return all[all.length - 1]?.textContent ?? "";
  });
}

Deno.test({
  name: "dashboard: chat, stop, live view and escaping in headless chromium against the real engine",
  // playwright-core keeps its browser pipe and timers until close; the test closes them in `finally`.
  sanitizeOps: false,
  sanitizeResources: false,
  async fn(t) {
    const executablePath = chromiumPath();
    const dir = await Deno.makeTempDir({ prefix: "dashboard_test_" });
    const path = `${dir}/tiny.gguf`;
    await synthesize(planModel({ arch: "qwen35moe", preset: "tiny", quant: "q8_0", seed: 1 }), { out: path });
    let tokenizer: Tokenizer, template: ChatTemplate;
    {
      using f = await openGguf(path);
      tokenizer = Tokenizer.fromGguf(f.metadata);
      template = ChatTemplate.fromGguf(f.metadata);
    }
    // No warm-up: at 4,096 positions it would build every prefill width class up to 2,048 tokens.
    const engine = startEngine({
      model: path,
      nCtx: 4096,
      nSlots: 2,
      queueSize: 2,
      warmUp: false,
      onLog: () => {},
    });
    const app = createApp({
      engine,
      tokenizer,
      template,
      apiKey: KEY,
      tempDefault: 0,
      tempCap: 2,
      bodyLimitBytes: 1 << 20,
    });
    const server = serveHttp1({ hostname: "127.0.0.1", port: 0, log: () => {} }, (req) => app.fetch(req));
    const base = `http://127.0.0.1:${server.addr.port}`;
    const browser = await chromium.launch({ executablePath, args: ["--no-sandbox"] });
    const problems: string[] = [];
    const dialogs: string[] = [];
    try {
      const context = await browser.newContext({ viewport: { width: 1280, height: 820 } });
      const page = await context.newPage();
      page.on("console", (m) => {
        if (m.type() === "error" || m.type() === "warning") problems.push(`console.${m.type()}: ${m.text()}`);
      });
      page.on("pageerror", (e) => problems.push(`page error: ${e.message}`));
      page.on("dialog", (d) => {
        dialogs.push(d.message());
        void d.dismiss();
      });
      await until("the engine to load", () => engine.status().state !== "loading", 60_000);
      assert.equal(engine.status().state, "ready");

      await t.step("the page asks for the key, then the live view shows the model", async () => {
        await page.goto(base);
        await page.waitForSelector("#key-dialog[open]", { timeout: WAIT_MS });
        await page.fill("#key-input", KEY);
        await page.click("#key-ok");
        await page.waitForFunction(
          (name) =>
            (globalThis as unknown as { document: Doc }).document.getElementById("model")?.textContent
              ?.includes(name) === true,
          engine.status().model,
          { timeout: WAIT_MS },
        );
        assert.equal(await page.textContent("#conn"), "live");
        assert.match((await page.textContent("#queue")) ?? "", /busy0 \/ 2/);
        assert.equal(await page.locator("#slots td.idle").count(), 2);
        assert.equal(await page.locator("#stages tbody tr").count(), 1);
        assert.match((await page.textContent("#stages tbody")) ?? "", /^local/);
      });

      await t.step("a message streams an answer with token counts and tok/s", async () => {
        await settings(page, { max: 12, temp: 0, think: false });
        await page.fill("#input", "Hello");
        await page.click("#send");
        await page.waitForSelector("#log .msg.assistant[data-finish]", { timeout: FIRST_ANSWER_MS });
        assert.equal(await page.getAttribute("#log .msg.assistant", "data-finish"), "length");
        const stats = (await page.textContent("#log .msg.assistant .stats")) ?? "";
        assert.match(stats, /^\d+ prompt · 12 tokens · TTFT [\d.]+ m?s · [\d.]+ tok\/s · length$/);
        assert.ok((await lastAnswer(page)).length > 0, "the answer holds text");
      });

      await t.step("the live view shows the running request; Stop cancels it on the server", async () => {
        // A fixed seed (the model and the earlier greedy turns are fixed too): an unseeded draw could end the
        // story on its own within a second, before Stop (it did once in CI: busySlots was 0).
        await settings(page, { max: 3000, temp: 0.8, think: false, seed: 5 });
        await page.fill("#input", "Tell me a long story");
        await page.click("#send");
        // Streaming: text arrives while the answer is still marked as streaming.
        await page.waitForFunction(
          () => {
            const doc = (globalThis as unknown as { document: Doc }).document;
            return (doc.querySelector("#log .msg.assistant[data-streaming]")?.textContent?.length ?? 0) > 20;
          },
          undefined,
          { timeout: WAIT_MS },
        );
        await page.waitForSelector("#slots td.generating", { timeout: WAIT_MS });
        assert.equal(engine.status().busySlots, 1);
        // The engine's own per-slot view (status().slots): its slot number, ids so far and rate.
        assert.equal(await page.textContent("#slots-note"), "", "the engine reports each slot");
        await page.waitForFunction(
          () => {
            const doc = (globalThis as unknown as { document: Doc }).document;
            const cells = Array.from(doc.querySelectorAll("#slots tbody tr")).map((r) =>
              Array.from((r as unknown as Doc).querySelectorAll("td"), (c) => c.textContent ?? "")
            ).find((c) => c[1] === "generating");
            return cells !== undefined && Number(cells[3]) > 0 && /^[\d.]+$/.test(cells[4] ?? "");
          },
          undefined,
          { timeout: WAIT_MS },
        );
        const slot = engine.status().slots?.find((s) => s.phase === "generating")?.slot;
        assert.ok(slot !== undefined, "the engine names the generating slot");
        assert.equal(
          await page.locator("#slots tbody tr", { has: page.locator("td.generating") }).locator("td").first()
            .textContent(),
          String(slot),
        );
        assert.match((await page.textContent("#queue")) ?? "", /busy1 \/ 2/);
        const shot = Deno.env.get("DASHBOARD_SCREENSHOT");
        if (shot !== undefined && shot !== "") {
          await page.waitForTimeout(2500);
          await page.screenshot({ path: shot });
        }
        await page.click("#stop");
        await page.waitForSelector("#log .msg.assistant[data-finish='stopped']", { timeout: WAIT_MS });
        await until("the engine to free the slot after Stop", () => engine.status().busySlots === 0, 5000);
        const stopped = await lastAnswer(page);
        await page.waitForSelector("#slots td.generating", { state: "detached", timeout: WAIT_MS });
        assert.equal(await lastAnswer(page), stopped, "nothing arrives after Stop");
        assert.ok(!(await page.isDisabled("#send")) && (await page.isDisabled("#stop")));
      });

      await t.step("a message holding <script> renders as text", async () => {
        await settings(page, { max: 4, temp: 0, think: false });
        const evil = "<script>alert(1)</script><img src=x onerror=alert(2)>";
        await page.fill("#input", evil);
        await page.click("#send");
        await page.waitForFunction(
          () =>
            (globalThis as unknown as { document: Doc }).document.querySelectorAll(
              "#log .msg.assistant[data-finish]",
            ).length === 3,
          undefined,
          { timeout: WAIT_MS },
        );
        const users = await page.locator("#log .msg.user .text").allTextContents();
        assert.equal(users.at(-1), evil);
        assert.equal(await page.locator("#log script, #log img").count(), 0, "no element made from the text");
      });

      await t.step("markup in model output (text, thinking, tool call) renders as text", async () => {
        const evil = '<img src=x onerror="alert(3)"><script>alert(4)</script>';
        const chunk = (delta: Record<string, unknown>, finish: string | null = null) =>
          `data: ${JSON.stringify({ choices: [{ index: 0, delta, finish_reason: finish }] })}\n\n`;
        await page.route("**/v1/chat/completions", (route) =>
          route.fulfill({
            status: 200,
            headers: { "content-type": "text/event-stream" },
            body: chunk({ role: "assistant", content: "" }) + chunk({ reasoning_content: evil }) +
              chunk({ content: evil }) +
              chunk({
                tool_calls: [{
                  index: 0,
                  id: "c1",
                  type: "function",
                  function: { name: evil, arguments: evil },
                }],
              }) + chunk({}, "tool_calls") +
              `data: ${
                JSON.stringify({ choices: [], usage: { prompt_tokens: 5, completion_tokens: 9 } })
              }\n\n` +
              "data: [DONE]\n\n",
          }));
        await page.fill("#input", "show me markup");
        await page.click("#send");
        await page.waitForFunction(
          () =>
            (globalThis as unknown as { document: Doc }).document.querySelectorAll(
              "#log .msg.assistant[data-finish]",
            ).length === 4,
          undefined,
          { timeout: WAIT_MS },
        );
        await page.unroute("**/v1/chat/completions");
        const last = page.locator("#log .msg.assistant").last();
        assert.equal(await last.locator(".text").textContent(), evil);
        assert.equal(await last.locator("details.thinking pre").textContent(), evil);
        assert.equal(await last.locator("details.thinking").getAttribute("open"), null, "thinking is folded");
        assert.equal(await last.locator(".tool .name").textContent(), evil);
        assert.match(
          (await last.locator(".stats").textContent()) ?? "",
          /^5 prompt · 9 tokens .* tool_calls$/,
        );
        assert.equal(await page.locator("#log script, #log img").count(), 0, "no element made from the text");
      });

      await t.step("the conversation survives a reload; the key stays for the tab", async () => {
        const before = await page.locator("#log .msg").count();
        await page.reload();
        await page.waitForFunction(
          () =>
            (globalThis as unknown as { document: Doc }).document.getElementById("conn")?.textContent ===
              "live",
          undefined,
          { timeout: WAIT_MS },
        );
        assert.equal(await page.locator("#log .msg").count(), before);
        assert.equal(await page.locator("#key-dialog[open]").count(), 0);
      });

      await t.step("a phone-sized screen shows one pane at a time", async () => {
        await page.setViewportSize({ width: 390, height: 800 });
        await page.click("#tab-live");
        assert.ok(await page.isVisible("#slots") && !(await page.isVisible("#log")));
        await page.click("#tab-chat");
        assert.ok(await page.isVisible("#input") && !(await page.isVisible("#slots")));
        const width = await page.evaluate(() =>
          (globalThis as unknown as { document: Doc }).document.documentElement.scrollWidth
        );
        assert.ok(width <= 390, `the page is ${width} px wide on a 390 px screen`);
      });

      assert.deepEqual(dialogs, [], "no alert() ran");
      assert.deepEqual(problems, [], "no console errors or warnings");
    } finally {
      await browser.close();
      await server.shutdown();
      await engine.close({ cancel: true });
      await Deno.remove(dir, { recursive: true });
    }
  },
});
