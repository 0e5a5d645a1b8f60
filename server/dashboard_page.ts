/**
 * The dashboard page as strings (served by `dashboard.ts`; a bundle or compiled binary carries them with
 * the code, and no build step runs): the HTML shell, the stylesheet and the script. The script builds every
 * node with `createElement` and `textContent` (model output and anything from the server is untrusted
 * text, never markup), and the page's Content-Security-Policy lets only these same-origin files run.
 *
 * The script (plain ES2020, no template literals so it can live in a `String.raw` literal):
 * - chat: `POST /v1/chat/completions` with `stream: true`, read through `fetch` (Stop aborts it, and the
 *   head cancels the generation when the connection closes); thinking (`reasoning_content`) folded in a
 *   `<details>`, tool calls as their own boxes, tokens, time to first token and tok/s per answer; the
 *   conversation and settings in `localStorage`, the API key in `sessionStorage`;
 * - live view: `GET /dashboard/events` read through `fetch` (so the key goes in a header), redrawn on
 *   each `status` event; reconnects every 2 s after a failure.
 * @module
 */

/** The page's HTML; `keyRequired` makes it ask for the API key before any data request. */
export function dashboardHtml(opts: { keyRequired: boolean }): string {
  return String.raw`<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>webgpu-llm head</title>
<link rel="icon" href="data:,">
<link rel="stylesheet" href="/dashboard/app.css">
<script src="/dashboard/app.js" defer></script>
</head>
<body data-key-required="${opts.keyRequired ? "1" : "0"}">
<header>
  <h1>webgpu-llm</h1>
  <nav>
    <button type="button" id="tab-chat" class="tab" aria-pressed="true">Chat</button>
    <button type="button" id="tab-live" class="tab" aria-pressed="false">Live</button>
  </nav>
  <span id="conn" class="conn">connecting</span>
  <button type="button" id="key-btn" class="small">API key</button>
</header>
<dialog id="key-dialog">
  <form id="key-form" method="dialog">
    <label for="key-input">This server needs its API key (kept for this browser tab only)</label>
    <input id="key-input" type="password" autocomplete="off" required>
    <p id="key-msg" class="err"></p>
    <button type="submit" id="key-ok">Use key</button>
  </form>
</dialog>
<main data-tab="chat">
<section id="chat-pane" class="pane">
  <div id="log" aria-live="polite"></div>
  <form id="composer">
    <textarea id="input" rows="2" placeholder="Message (Enter sends, Shift+Enter: new line)"></textarea>
    <div class="row">
      <button type="submit" id="send">Send</button>
      <button type="button" id="stop" disabled>Stop</button>
      <button type="button" id="clear" class="small">Clear</button>
    </div>
  </form>
  <details id="settings">
    <summary>Settings</summary>
    <div class="grid">
      <label>max tokens <input id="s-max" type="number" min="1" step="1" value="256"></label>
      <label>temperature <input id="s-temp" type="number" min="0" max="2" step="0.05" value="0.7"></label>
      <label>top-p <input id="s-topp" type="number" min="0" max="1" step="0.05" value="0.95"></label>
      <label>top-k <input id="s-topk" type="number" min="0" step="1" value="40"></label>
      <label>min-p <input id="s-minp" type="number" min="0" max="1" step="0.01" value="0.05"></label>
      <label>seed <input id="s-seed" type="number" step="1" placeholder="random"></label>
      <label class="check"><input id="s-think" type="checkbox" checked> thinking</label>
    </div>
    <label>system prompt <textarea id="s-system" rows="2"></textarea></label>
    <label>tools (JSON array of OpenAI tool definitions) <textarea id="s-tools" rows="2" placeholder="[]"></textarea></label>
  </details>
</section>
<section id="live-pane" class="pane">
  <div class="cards">
    <div class="card"><h2>Model</h2><dl id="model"></dl></div>
    <div class="card"><h2>GPU</h2><dl id="gpu"></dl></div>
    <div class="card"><h2>Queue</h2><dl id="queue"></dl></div>
  </div>
  <h2>Slots</h2>
  <table id="slots"><thead><tr><th>slot</th><th>state</th><th>prompt</th><th>tokens</th><th>tok/s</th><th>age</th></tr></thead><tbody></tbody></table>
  <p id="slots-note" class="note"></p>
  <div class="charts">
    <figure><figcaption>Time to first token (ms), 5 min</figcaption><div id="chart-ttft" class="chart"></div></figure>
    <figure><figcaption>Generated tok/s, 5 min</figcaption><div id="chart-tps" class="chart"></div></figure>
  </div>
  <h2>Stages</h2>
  <table id="stages"><thead><tr><th>box</th><th>layers</th><th>step</th><th>wire</th><th>link</th></tr></thead><tbody></tbody></table>
</section>
</main>
</body>
</html>
`;
}

/** The stylesheet: one column on a phone (tabs switch chat and live view), two side by side from 900 px. */
export const DASHBOARD_CSS = String.raw`
:root { color-scheme: light dark; --fg: #1d1f23; --bg: #fafafa; --muted: #6b7079; --line: #d9dce1;
  --card: #fff; --accent: #2f6fde; --user: #e8f0fd; --warn: #b3261e; --ok: #1e7d32; }
@media (prefers-color-scheme: dark) { :root { --fg: #e4e6ea; --bg: #15171a; --muted: #9aa0a8; --line: #33373d;
  --card: #1e2125; --accent: #7aa7f5; --user: #23324a; --warn: #f2867e; --ok: #7ccf85; } }
* { box-sizing: border-box; }
html, body { margin: 0; height: 100%; }
body { font: 15px/1.45 system-ui, sans-serif; color: var(--fg); background: var(--bg); display: flex;
  flex-direction: column; }
header { display: flex; align-items: center; gap: .6rem; padding: .5rem .8rem; border-bottom: 1px solid var(--line); }
header h1 { font-size: 1rem; margin: 0; }
nav { display: flex; gap: .3rem; }
.conn { margin-left: auto; font-size: .8rem; color: var(--muted); }
.conn.ok { color: var(--ok); }
.conn.bad { color: var(--warn); }
button { font: inherit; padding: .35rem .8rem; border: 1px solid var(--line); border-radius: 6px;
  background: var(--card); color: var(--fg); cursor: pointer; }
button[disabled] { opacity: .45; cursor: default; }
button.small { font-size: .8rem; padding: .2rem .5rem; }
#send { background: var(--accent); color: #fff; border-color: var(--accent); }
.tab[aria-pressed="true"] { border-color: var(--accent); color: var(--accent); }
main { flex: 1; min-height: 0; display: grid; grid-template-columns: 1fr; }
.pane { min-height: 0; overflow: auto; padding: .8rem; }
main[data-tab="chat"] #live-pane, main[data-tab="live"] #chat-pane { display: none; }
@media (min-width: 900px) {
  nav { display: none; }
  main { grid-template-columns: minmax(0, 3fr) minmax(0, 2fr); }
  main[data-tab] #live-pane, main[data-tab] #chat-pane { display: block; }
  #live-pane { border-left: 1px solid var(--line); }
}
#chat-pane { display: flex; flex-direction: column; gap: .6rem; }
#log { flex: 1; display: flex; flex-direction: column; gap: .6rem; min-height: 8rem; }
.msg { padding: .5rem .7rem; border-radius: 8px; background: var(--card); border: 1px solid var(--line);
  overflow-wrap: anywhere; }
.msg.user { background: var(--user); align-self: flex-end; max-width: 90%; }
.msg .text { white-space: pre-wrap; }
.msg .err { color: var(--warn); }
.msg details.thinking { color: var(--muted); margin-bottom: .3rem; }
.msg details.thinking pre, .tool pre { white-space: pre-wrap; margin: .3rem 0 0; font-size: .85rem; }
.tool { border: 1px dashed var(--accent); border-radius: 6px; padding: .3rem .5rem; margin: .3rem 0; }
.tool .name { font-family: ui-monospace, monospace; font-weight: 600; }
.stats { font-size: .78rem; color: var(--muted); margin-top: .3rem; }
#composer textarea, #settings textarea { width: 100%; font: inherit; padding: .4rem; border-radius: 6px;
  border: 1px solid var(--line); background: var(--card); color: var(--fg); }
.row { display: flex; gap: .4rem; margin-top: .3rem; }
.grid { display: grid; grid-template-columns: repeat(auto-fill, minmax(9rem, 1fr)); gap: .4rem; margin: .4rem 0; }
.grid label, #settings > label { display: flex; flex-direction: column; font-size: .8rem; color: var(--muted); }
.grid label.check { flex-direction: row; align-items: center; gap: .3rem; }
.grid input[type="number"] { font: inherit; padding: .2rem .3rem; width: 100%; }
h2 { font-size: .9rem; margin: .8rem 0 .3rem; text-transform: uppercase; letter-spacing: .04em; color: var(--muted); }
.cards { display: grid; grid-template-columns: repeat(auto-fit, minmax(12rem, 1fr)); gap: .6rem; }
.card { background: var(--card); border: 1px solid var(--line); border-radius: 8px; padding: .2rem .7rem .5rem; }
.card h2 { margin-top: .4rem; }
dl { display: grid; grid-template-columns: auto 1fr; gap: .1rem .6rem; margin: 0; font-size: .85rem; }
dt { color: var(--muted); }
dd { margin: 0; overflow-wrap: anywhere; }
table { width: 100%; border-collapse: collapse; font-size: .85rem; font-variant-numeric: tabular-nums; }
th, td { text-align: left; padding: .2rem .4rem; border-bottom: 1px solid var(--line); }
td.idle { color: var(--muted); }
td.generating { color: var(--ok); font-weight: 600; }
td.prefilling, td.queued { color: var(--accent); font-weight: 600; }
td.down, td.slow, td.reconnecting { color: var(--warn); font-weight: 600; }
.note { font-size: .78rem; color: var(--muted); }
.charts { display: grid; grid-template-columns: repeat(auto-fit, minmax(14rem, 1fr)); gap: .6rem; }
figure { margin: .6rem 0 0; }
figcaption { font-size: .78rem; color: var(--muted); }
.chart svg { width: 100%; height: 64px; display: block; background: var(--card); border: 1px solid var(--line);
  border-radius: 6px; }
.chart .line { fill: none; stroke: var(--accent); stroke-width: 1.5; }
.chart .dot { fill: var(--accent); }
.chart .label { font-size: 10px; fill: var(--muted); }
dialog { border: 1px solid var(--line); border-radius: 8px; background: var(--card); color: var(--fg); max-width: 24rem; }
dialog form { display: flex; flex-direction: column; gap: .5rem; }
dialog input { font: inherit; padding: .3rem; }
.err { color: var(--warn); font-size: .85rem; margin: 0; }
`;

/** The script (see the module doc). */
export const DASHBOARD_JS = String.raw`"use strict";
(function () {
  var KEY = "llm.apiKey", CONV = "llm.conversation", SETTINGS = "llm.settings";
  var keyRequired = document.body.dataset.keyRequired === "1";
  var $ = function (id) { return document.getElementById(id); };

  // Every node from here on is built with textContent: model output and server data are text, never markup.
  function el(tag, cls, text) {
    var e = document.createElement(tag);
    if (cls) e.className = cls;
    if (text !== undefined && text !== null) e.textContent = String(text);
    return e;
  }
  function sleep(ms) { return new Promise(function (r) { setTimeout(r, ms); }); }
  function fmtBytes(b) {
    if (b === null || b === undefined) return "—";
    var u = ["B", "KiB", "MiB", "GiB", "TiB"], i = 0;
    while (b >= 1024 && i < u.length - 1) { b /= 1024; i++; }
    return (i === 0 ? String(b) : b.toFixed(1)) + " " + u[i];
  }
  function fmtMs(ms) {
    if (ms === null || ms === undefined) return "—";
    return ms < 1000 ? Math.round(ms) + " ms" : (ms / 1000).toFixed(1) + " s";
  }
  // A per-frame time: tenths below 10 ms (a split's wire time is often a fraction of a millisecond).
  function fmtStep(ms) {
    if (ms === null || ms === undefined) return "—";
    return ms < 10 ? ms.toFixed(1) + " ms" : fmtMs(ms);
  }
  function fmtRate(r) { return r === null || r === undefined ? "—" : r.toFixed(1); }

  // ---- API key ----
  function apiKey() { return sessionStorage.getItem(KEY) || ""; }
  function authHeaders(json) {
    var h = {};
    if (json) h["content-type"] = "application/json";
    var k = apiKey();
    if (k) h["authorization"] = "Bearer " + k;
    return h;
  }
  function askKey(message) {
    $("key-msg").textContent = message || "";
    $("key-input").value = "";
    if (!$("key-dialog").open) $("key-dialog").showModal();
  }
  $("key-form").addEventListener("submit", function () {
    sessionStorage.setItem(KEY, $("key-input").value);
    startLive();
  });
  $("key-btn").addEventListener("click", function () { askKey(""); });

  // ---- tabs (phone-sized screens show one pane at a time) ----
  function showTab(name) {
    document.querySelector("main").dataset.tab = name;
    $("tab-chat").setAttribute("aria-pressed", String(name === "chat"));
    $("tab-live").setAttribute("aria-pressed", String(name === "live"));
  }
  $("tab-chat").addEventListener("click", function () { showTab("chat"); });
  $("tab-live").addEventListener("click", function () { showTab("live"); });

  // ---- SSE over fetch (EventSource cannot send the key) ----
  async function readSse(resp, onFrame) {
    var reader = resp.body.pipeThrough(new TextDecoderStream()).getReader();
    var buf = "";
    for (;;) {
      var r = await reader.read();
      if (r.done) return;
      buf += r.value.replace(/\r\n/g, "\n");
      var i;
      while ((i = buf.indexOf("\n\n")) >= 0) {
        var frame = buf.slice(0, i), ev = null, data = [];
        buf = buf.slice(i + 2);
        frame.split("\n").forEach(function (line) {
          if (line.indexOf("event:") === 0) ev = line.slice(6).trim();
          else if (line.indexOf("data:") === 0) data.push(line.slice(5).replace(/^ /, ""));
        });
        if (data.length > 0) onFrame(ev, data.join("\n"));
      }
    }
  }
  async function errorText(resp) {
    try {
      var j = await resp.json();
      return (j && j.error && j.error.message) || ("HTTP " + resp.status);
    } catch (_e) {
      return "HTTP " + resp.status;
    }
  }

  // ---- live view ----
  var liveAbort = null;
  function setConn(text, ok) {
    var c = $("conn");
    c.textContent = text;
    c.className = "conn " + (ok ? "ok" : "bad");
  }
  async function startLive() {
    if (liveAbort) liveAbort.abort();
    var ctl = new AbortController();
    liveAbort = ctl;
    if (keyRequired && !apiKey()) { setConn("needs API key", false); askKey(""); return; }
    while (!ctl.signal.aborted) {
      try {
        var resp = await fetch("/dashboard/events", { headers: authHeaders(false), signal: ctl.signal });
        if (resp.status === 401) {
          setConn("needs API key", false);
          askKey(await errorText(resp));
          return;
        }
        if (!resp.ok) throw new Error(await errorText(resp));
        setConn("live", true);
        await readSse(resp, function (ev, data) { if (ev === "status") renderLive(JSON.parse(data)); });
      } catch (e) {
        if (ctl.signal.aborted) return;
        setConn("reconnecting: " + (e && e.message ? e.message : String(e)), false);
      }
      await sleep(2000);
    }
  }
  function fillDl(dl, pairs) {
    dl.replaceChildren();
    pairs.forEach(function (p) { dl.append(el("dt", null, p[0]), el("dd", null, p[1])); });
  }
  function row(tbody, cells, classes) {
    var tr = el("tr");
    cells.forEach(function (c, i) { tr.append(el("td", classes && classes[i] ? classes[i] : null, c)); });
    tbody.append(tr);
    return tr;
  }
  function renderLive(s) {
    var m = s.model;
    var stateText = s.state === "loading"
      ? "loading " + Math.round(100 * s.load.loadedBytes / Math.max(s.load.totalBytes, 1)) + "%"
      : s.state;
    fillDl($("model"), [
      ["name", m.name || "—"], ["arch", m.arch || "—"], ["quant", m.quant || "not reported"],
      ["size", fmtBytes(m.sizeBytes)], ["context", m.nCtx + " per slot"],
      ["layers", m.nLayer === null ? "not reported" : m.nLayer],
      ["fingerprint", m.fingerprint ? m.fingerprint.slice(0, 16) : "not reported"], ["state", stateText],
    ]);
    fillDl($("gpu"), [
      ["adapter", s.gpu.adapter || "not reported by the engine"],
      ["memory", s.gpu.memoryBytes === null ? "not reported" : fmtBytes(s.gpu.memoryBytes)],
    ]);
    fillDl($("queue"), [
      ["busy", s.slots.busy + " / " + s.slots.total], ["queued", s.slots.queued],
      ["requests", s.counters.requests], ["prefix hits", s.counters.prefixHits],
      ["generated", s.counters.generatedTokens],
    ]);
    var tbody = $("slots").tBodies[0];
    tbody.replaceChildren();
    var now = s.timeMs;
    if (s.slots.perSlot) {
      s.slots.perSlot.forEach(function (p) {
        var state = p.phase === "prefilling"
          ? "prefilling " + p.prefilledTokens + "/" + p.promptTokens : p.phase;
        row(tbody, [p.slot, state, p.promptTokens, p.generatedTokens,
          p.tokPerS !== undefined ? fmtRate(p.tokPerS)
            : p.ageMs > 0 && p.generatedTokens > 0 ? fmtRate(1000 * p.generatedTokens / p.ageMs) : "—",
          p.phase === "idle" ? "—" : fmtMs(p.ageMs)], [null, p.phase]);
      });
      $("slots-note").textContent = "";
    } else {
      var running = s.requests.filter(function (r) { return r.phase !== "queued"; });
      for (var i = 0; i < s.slots.total; i++) {
        var r = running[i];
        if (r) {
          row(tbody, [i, r.phase, r.promptTokens, r.generatedTokens + " / " + r.maxTokens, fmtRate(r.tokPerS),
            fmtMs(r.ageMs)], [null, r.phase]).dataset.request = r.id;
        } else {
          row(tbody, [i, "idle", "—", "—", "—", "—"], [null, "idle"]);
        }
      }
      $("slots-note").textContent = "The engine reports busy/queued counts only: rows list the head's " +
        "running requests in admission order, not engine slot numbers.";
    }
    var b = s.history.buckets;
    chart($("chart-ttft"), b.map(function (x) { return x.ttftMs; }), s.history.bucketMs, "ms");
    chart($("chart-tps"), b.map(function (x) { return x.tokPerS; }), s.history.bucketMs, "tok/s");
    var st = $("stages").tBodies[0];
    st.replaceChildren();
    s.stages.forEach(function (g) {
      var tr = row(st, [g.box, g.layers ? g.layers[0] + "–" + g.layers[1] : "all", fmtStep(g.stepMs),
        g.wireMs === null ? "—" : fmtStep(g.wireMs), g.link], [null, null, null, null, g.link]);
      // Why a worker is down, on hover (a title is text: the message is untrusted).
      if (g.error) tr.cells[4].title = String(g.error);
      if (g.compute) tr.cells[2].title = g.compute.count + " frames, " + fmtMs(g.compute.totalMs) + " in all";
    });
    void now;
  }

  // A line chart of one value per bucket (null: no sample) as inline SVG; the newest bucket is on the right.
  var SVG = "http://www.w3.org/2000/svg";
  function svgEl(tag, attrs) {
    var e = document.createElementNS(SVG, tag);
    Object.keys(attrs).forEach(function (k) { e.setAttribute(k, String(attrs[k])); });
    return e;
  }
  function chart(box, values, bucketMs, unit) {
    var W = 300, H = 64, top = 12, n = values.length;
    var max = 0;
    values.forEach(function (v) { if (v !== null && v > max) max = v; });
    var svg = svgEl("svg", { viewBox: "0 0 " + W + " " + H, preserveAspectRatio: "none", role: "img" });
    var pts = [], dots = [];
    values.forEach(function (v, i) {
      if (v === null) return;
      var x = n > 1 ? (i * W) / (n - 1) : 0;
      var y = H - 2 - (max > 0 ? (v / max) * (H - top - 4) : 0);
      pts.push(x.toFixed(1) + "," + y.toFixed(1));
      // A bucket with a value but no neighbour would draw no line: mark each sample.
      if (v > 0) dots.push(svgEl("circle", { class: "dot", cx: x.toFixed(1), cy: y.toFixed(1), r: 2 }));
    });
    if (pts.length > 0) {
      svg.append(svgEl("polyline", { class: "line", points: pts.join(" ") }));
    }
    dots.forEach(function (d) { svg.append(d); });
    var last = null;
    for (var i = n - 1; i >= 0; i--) { if (values[i] !== null) { last = values[i]; break; } }
    var label = svgEl("text", { class: "label", x: 4, y: 10 });
    label.textContent = "max " + (max >= 100 ? Math.round(max) : max.toFixed(1)) + " " + unit +
      " · now " + (last === null ? "—" : (last >= 100 ? Math.round(last) : last.toFixed(1))) + " · " +
      Math.round(n * bucketMs / 60000) + " min";
    svg.append(label);
    box.replaceChildren(svg);
  }

  // ---- chat ----
  var conversation = [];
  try { conversation = JSON.parse(localStorage.getItem(CONV) || "[]"); } catch (_e) { conversation = []; }
  if (!Array.isArray(conversation)) conversation = [];
  function save() { localStorage.setItem(CONV, JSON.stringify(conversation)); }

  var FIELDS = ["s-max", "s-temp", "s-topp", "s-topk", "s-minp", "s-seed", "s-system", "s-tools"];
  (function loadSettings() {
    var s = {};
    try { s = JSON.parse(localStorage.getItem(SETTINGS) || "{}") || {}; } catch (_e) { s = {}; }
    FIELDS.forEach(function (id) { if (typeof s[id] === "string") $(id).value = s[id]; });
    if (typeof s["s-think"] === "boolean") $("s-think").checked = s["s-think"];
  })();
  $("settings").addEventListener("change", function () {
    var s = {};
    FIELDS.forEach(function (id) { s[id] = $(id).value; });
    s["s-think"] = $("s-think").checked;
    localStorage.setItem(SETTINGS, JSON.stringify(s));
  });

  // One message's view; answers get parts as they stream in.
  function messageView(m) {
    var box = el("div", "msg " + m.role);
    var v = { box: box, thinking: null, thinkingText: null, text: el("div", "text"), stats: el("div", "stats") };
    if (m.role === "assistant") {
      box.append(v.text, v.stats);
      if (m.reasoning) addThinking(v, m.reasoning);
      if (m.content) v.text.append(document.createTextNode(m.content));
      (m.toolCalls || []).forEach(function (c) { addTool(v, c); });
      if (m.error) box.append(el("div", "err", m.error));
      if (m.stats) v.stats.textContent = statsText(m.stats);
    } else {
      v.text.textContent = m.content;
      box.append(v.text);
    }
    $("log").append(box);
    return v;
  }
  function addThinking(v, text) {
    if (!v.thinking) {
      v.thinking = el("details", "thinking");
      v.thinking.append(el("summary", null, "Thinking"));
      v.thinkingText = el("pre");
      v.thinking.append(v.thinkingText);
      v.box.insertBefore(v.thinking, v.text);
    }
    v.thinkingText.append(document.createTextNode(text));
  }
  function addTool(v, call) {
    var t = el("div", "tool");
    t.append(el("span", null, "Tool call: "), el("span", "name", call.name), el("pre", null, call.arguments));
    v.box.insertBefore(t, v.stats);
  }
  function statsText(s) {
    var parts = [];
    if (s.promptTokens !== null) parts.push(s.promptTokens + " prompt");
    parts.push((s.exact ? "" : "≈") + s.outputTokens + " tokens");
    parts.push("TTFT " + fmtMs(s.ttftMs));
    parts.push(fmtRate(s.tokPerS) + " tok/s");
    parts.push(s.finish);
    return parts.join(" · ");
  }
  function renderAll() {
    $("log").replaceChildren();
    conversation.forEach(messageView);
    scrollDown();
  }
  function scrollDown() { var p = $("chat-pane"); p.scrollTop = p.scrollHeight; }

  function num(id, parse) {
    var raw = $(id).value.trim();
    if (raw === "") return undefined;
    var n = parse(raw);
    if (!isFinite(n)) throw new Error("Setting " + id.slice(2) + " is not a number: " + raw);
    return n;
  }
  function requestBody() {
    var msgs = [];
    var sys = $("s-system").value.trim();
    if (sys) msgs.push({ role: "system", content: sys });
    conversation.forEach(function (m) {
      if (m.role === "user") msgs.push({ role: "user", content: m.content });
      else if (m.role === "assistant" && !m.error) msgs.push({ role: "assistant", content: m.content || "" });
    });
    var body = {
      stream: true,
      stream_options: { include_usage: true },
      messages: msgs,
      max_tokens: num("s-max", parseInt),
      temperature: num("s-temp", parseFloat),
      top_p: num("s-topp", parseFloat),
      top_k: num("s-topk", parseInt),
      min_p: num("s-minp", parseFloat),
      seed: num("s-seed", parseInt),
      chat_template_kwargs: { enable_thinking: $("s-think").checked },
    };
    var tools = $("s-tools").value.trim();
    if (tools) {
      try { body.tools = JSON.parse(tools); } catch (e) { throw new Error("Settings: tools is not JSON: " + e.message); }
    }
    return body;
  }

  var chatAbort = null;
  function busy(on) {
    $("send").disabled = on;
    $("stop").disabled = !on;
  }
  async function send(text) {
    var user = { role: "user", content: text };
    var answer = { role: "assistant", content: "", reasoning: "", toolCalls: [], stats: null };
    var body;
    try {
      conversation.push(user);
      body = requestBody();
    } catch (e) {
      conversation.pop();
      alertInline(e.message);
      return;
    }
    messageView(user);
    conversation.push(answer);
    var v = messageView(answer);
    v.box.dataset.streaming = "1";
    scrollDown();
    var ctl = new AbortController();
    chatAbort = ctl;
    busy(true);
    var t0 = performance.now(), tFirst = null, deltas = 0, usage = null, finish = "stopped";
    var first = function () { if (tFirst === null) tFirst = performance.now(); deltas++; };
    try {
      var resp = await fetch("/v1/chat/completions", {
        method: "POST", headers: authHeaders(true), body: JSON.stringify(body), signal: ctl.signal,
      });
      if (resp.status === 401) askKey(await errorText(resp));
      if (!resp.ok) throw new Error(await errorText(resp));
      await readSse(resp, function (_ev, data) {
        if (data === "[DONE]") return;
        var j = JSON.parse(data);
        if (j.error) throw new Error(j.error.message || "server error");
        if (j.usage) usage = j.usage;
        var ch = j.choices && j.choices[0];
        if (!ch) return;
        var d = ch.delta || {};
        if (d.reasoning_content) { first(); answer.reasoning += d.reasoning_content; addThinking(v, d.reasoning_content); }
        if (d.content) { first(); answer.content += d.content; v.text.append(document.createTextNode(d.content)); }
        if (d.tool_calls) {
          d.tool_calls.forEach(function (c) {
            first();
            var call = { name: c.function.name, arguments: c.function.arguments };
            answer.toolCalls.push(call);
            addTool(v, call);
          });
        }
        if (ch.finish_reason) finish = ch.finish_reason;
        scrollDown();
      });
    } catch (e) {
      if (!ctl.signal.aborted) {
        answer.error = e && e.message ? e.message : String(e);
        v.box.append(el("div", "err", answer.error));
        finish = "error";
      }
    }
    var tEnd = performance.now();
    var out = usage ? usage.completion_tokens : deltas;
    answer.stats = {
      promptTokens: usage ? usage.prompt_tokens : null,
      outputTokens: out,
      exact: usage !== null,
      ttftMs: tFirst === null ? null : tFirst - t0,
      tokPerS: tFirst !== null && tEnd - tFirst > 0 && out > 1 ? ((out - 1) * 1000) / (tEnd - tFirst) : null,
      finish: finish,
    };
    v.stats.textContent = statsText(answer.stats);
    delete v.box.dataset.streaming;
    v.box.dataset.finish = finish;
    save();
    busy(false);
    chatAbort = null;
  }
  function alertInline(message) {
    var box = el("div", "msg assistant");
    box.append(el("div", "err", message));
    $("log").append(box);
  }
  $("composer").addEventListener("submit", function (e) {
    e.preventDefault();
    var text = $("input").value;
    if (!text.trim() || chatAbort) return;
    $("input").value = "";
    send(text);
  });
  $("input").addEventListener("keydown", function (e) {
    if (e.key === "Enter" && !e.shiftKey && !e.isComposing) {
      e.preventDefault();
      $("composer").requestSubmit();
    }
  });
  $("stop").addEventListener("click", function () { if (chatAbort) chatAbort.abort(); });
  $("clear").addEventListener("click", function () {
    if (chatAbort) chatAbort.abort();
    conversation = [];
    save();
    renderAll();
  });

  renderAll();
  startLive();
})();
`;
