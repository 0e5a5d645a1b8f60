/**
 * The layer map (docs/ARCHITECTURE.md), checked on the import graph read from the source: `engine/` never
 * imports `server/`, `cli/` or `wire/`; `server/` and `cli/` reach the engine only through `engine/mod.ts`;
 * `wgsl/` (tests aside) imports nothing of the engine but the ggml type table (`engine/quant/types.ts`); and
 * no module imports itself through a cycle (type-only imports count too).
 * @module
 */
import assert from "node:assert/strict";

const ROOT = new URL("../", import.meta.url);
const FOLDERS = ["engine", "wgsl", "server", "cli", "wire", "tests", "bench"];

/** Every `.ts` file of the project, relative to the root. */
async function sources(): Promise<string[]> {
  // The root's modules (mod.ts, version.ts, ...), then every folder.
  const out = [...Deno.readDirSync(ROOT)].filter((e) => e.isFile && e.name.endsWith(".ts")).map((e) =>
    e.name
  );
  const walk = async (dir: string) => {
    let entries: Deno.DirEntry[];
    try {
      entries = [...Deno.readDirSync(new URL(dir, ROOT))];
    } catch {
      return;
    }
    for (const e of entries) {
      const path = `${dir}/${e.name}`;
      if (e.isDirectory) await walk(path);
      else if (e.isFile && e.name.endsWith(".ts")) out.push(path);
    }
  };
  for (const f of FOLDERS) await walk(f);
  return out.sort();
}

/** The project files `file` imports or re-exports (static and dynamic imports of relative paths). */
function importsOf(file: string, text: string): string[] {
  const specs = new Set<string>();
  // Strip comments so that examples in doc comments do not count.
  const code = text.replace(/\/\*[\s\S]*?\*\//g, "").replace(/^\s*\/\/.*$/gm, "");
  for (const m of code.matchAll(/(?:\bfrom\s*|\bimport\s*\(?\s*)["']([^"']+)["']/g)) specs.add(m[1]!);
  const out: string[] = [];
  for (const s of specs) {
    if (!s.startsWith(".")) continue;
    out.push(new URL(s, new URL(file, ROOT)).pathname.slice(ROOT.pathname.length));
  }
  return out;
}

/** Tests and their helpers (`_testing.ts`, `_test_*.ts`, `tests/`): they may reach anywhere. */
const isTest = (f: string) =>
  f.endsWith("_test.ts") || f.endsWith("_testing.ts") || f.startsWith("tests/") || f.includes("/_test_");

/** The rule breaks and the cycles of an import graph (file → the project files it imports). */
function checkGraph(graph: ReadonlyMap<string, readonly string[]>): { broken: string[]; cycles: string[] } {
  const broken: string[] = [];
  for (const [f, deps] of graph) {
    for (const d of deps) {
      const missing = !graph.has(d) && !d.endsWith(".wgsl") && !d.endsWith(".json");
      if (missing && !isTest(f)) broken.push(`${f} imports missing ${d}`);
      if (f.startsWith("engine/") && !isTest(f) && /^(server|cli|wire)\//.test(d)) {
        broken.push(`${f} (engine) imports ${d}: the engine never depends on the head, the CLI or the wire`);
      }
      if (/^(server|cli)\//.test(f) && d.startsWith("engine/") && d !== "engine/mod.ts" && !isTest(f)) {
        broken.push(`${f} imports ${d}: server/ and cli/ reach the engine only through engine/mod.ts`);
      }
      if (f.startsWith("wgsl/") && !isTest(f) && d.startsWith("engine/") && d !== "engine/quant/types.ts") {
        broken.push(
          `${f} (a kernel twin) imports ${d}: wgsl/ takes only the ggml type table from the engine`,
        );
      }
    }
  }
  // Cycles: depth-first search with colours over the whole graph.
  const colour = new Map<string, 1 | 2>();
  const stack: string[] = [];
  const cycles: string[] = [];
  const visit = (f: string) => {
    colour.set(f, 1);
    stack.push(f);
    for (const d of graph.get(f) ?? []) {
      if (!graph.has(d)) continue;
      const c = colour.get(d);
      if (c === 1) cycles.push([...stack.slice(stack.indexOf(d)), d].join(" → "));
      else if (c === undefined) visit(d);
    }
    stack.pop();
    colour.set(f, 2);
  };
  for (const f of graph.keys()) if (!colour.has(f)) visit(f);
  return { broken, cycles };
}

Deno.test("layering: the import graph keeps the layer map and has no cycles", async () => {
  const files = await sources();
  const graph = new Map<string, string[]>();
  // This file's own test strings are not its imports.
  for (const f of files.filter((f) => f !== "tests/layering_test.ts")) {
    graph.set(f, importsOf(f, await Deno.readTextFile(new URL(f, ROOT))));
  }
  assert.ok((graph.get("engine/mod.ts") ?? []).length > 10, "the reader finds engine/mod.ts's imports");
  const { broken, cycles } = checkGraph(graph);
  assert.deepEqual(broken, [], broken.join("\n"));
  assert.deepEqual(cycles, [], `import cycles:\n${cycles.join("\n")}`);
});

Deno.test("layering: the checker sees each forbidden import and a cycle", () => {
  assert.deepEqual(importsOf("server/x.ts", `import { a } from "../engine/exec/stage.ts";`), [
    "engine/exec/stage.ts",
  ]);
  assert.deepEqual(importsOf("engine/a.ts", `export * from "./b.ts";\nconst m = await import("./c.ts");`), [
    "engine/b.ts",
    "engine/c.ts",
  ]);
  assert.deepEqual(importsOf("engine/a.ts", `/** import { x } from "./doc.ts"; */\n// from "./no.ts"`), []);
  const graph = new Map<string, string[]>([
    ["engine/mod.ts", ["engine/a.ts"]],
    ["engine/a.ts", ["server/app.ts", "engine/b.ts"]],
    ["engine/b.ts", ["engine/a.ts"]],
    ["server/app.ts", ["engine/a.ts", "engine/mod.ts"]],
    ["cli/x.ts", ["engine/mod.ts"]],
    ["wgsl/k.ts", ["engine/quant/types.ts", "engine/gguf.ts"]],
    ["engine/quant/types.ts", []],
    ["engine/gguf.ts", []],
  ]);
  const { broken, cycles } = checkGraph(graph);
  assert.equal(broken.length, 3, broken.join("\n"));
  assert.match(broken[0]!, /^engine\/a\.ts \(engine\) imports server\/app\.ts/);
  assert.match(broken[1]!, /^server\/app\.ts imports engine\/a\.ts/);
  assert.match(broken[2]!, /^wgsl\/k\.ts .* imports engine\/gguf\.ts/);
  assert.ok(cycles.some((c) => c.includes("engine/a.ts → engine/b.ts → engine/a.ts")), cycles.join("\n"));
});

Deno.test("layering: no engine module over 800 lines, the stage executor under 600 (#17's sizes)", async () => {
  const long: string[] = [];
  for (const f of await sources()) {
    if (!f.startsWith("engine/") || isTest(f)) continue;
    const lines = (await Deno.readTextFile(new URL(f, ROOT))).split("\n").length - 1;
    const max = f === "engine/exec/stage.ts" ? 599 : 800;
    if (lines > max) long.push(`${f}: ${lines} lines (at most ${max}): split it by responsibility`);
  }
  assert.deepEqual(long, []);
});
