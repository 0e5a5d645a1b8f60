/**
 * `deno task bundle`: builds `out/llm.js`, one self-contained JavaScript file that runs every command with
 * nothing but a `deno` binary (`deno run -A out/llm.js head ...`). It carries the WGSL kernels (as text,
 * `wgsl/_sources.ts`), the built-in chat templates, the engine's Worker module (`tools/bundle_entry.ts`
 * says how) and the npm packages the CLI imports, and embeds the git commit it was built from.
 *
 * ```sh
 * deno task bundle                    # out/llm.js
 * deno run -A tools/bundle.ts --out /tmp/llm.js
 * ```
 * @module
 */
import { dirname, resolve } from "node:path";
import { parseArgs } from "node:util";
import { listWgsl, renderSources, SOURCES_FILE } from "./gen_wgsl_sources.ts";

const ROOT = new URL("../", import.meta.url);

/**
 * The npm packages the CLI may carry (the HTTP framework and the chat-template interpreter). Any other in
 * the bundle means a command imports a test-only package (the API SDKs, fast-check, a browser driver).
 */
export const BUNDLED_PACKAGES: readonly string[] = ["hono", "@huggingface/jinja"];

/** The npm packages inlined in a bundle, read off the module paths esbuild writes as comments. */
export function bundledPackages(text: string): string[] {
  // `// ../../root/.cache/deno/npm/registry.npmjs.org/hono/4.13.19/dist/index.js`, or with a node_modules
  // folder `// node_modules/.deno/hono@4.13.19/node_modules/hono/dist/index.js`.
  const re = /^\/\/ .*?(?:\/npm\/[^/]+\/|\/node_modules\/)((?:@[^/]+\/)?[^/@.][^/]*)\//gm;
  return [...new Set([...text.matchAll(re)].map((m) => m[1]!))].sort();
}

/** The commit of this checkout (12 hex digits), or `"unknown"` when git cannot tell. */
export async function checkoutCommit(): Promise<string> {
  try {
    const o = await new Deno.Command("git", {
      args: ["-C", ROOT.pathname, "rev-parse", "--short=12", "HEAD"],
      stdout: "piped",
      stderr: "null",
    }).output();
    const text = new TextDecoder().decode(o.stdout).trim();
    return o.success && /^[0-9a-f]{7,40}$/.test(text) ? text : "unknown";
  } catch (e) {
    if (e instanceof Deno.errors.NotFound) return "unknown";
    throw e;
  }
}

/**
 * Builds the bundle at `out` (a path); returns its size in bytes.
 * @throws {Error} when `wgsl/_sources.ts` is stale, `deno bundle` fails, or the result still imports npm
 */
export async function buildBundle(out: string, opts: { commit: string }): Promise<number> {
  const path = resolve(out);
  if (Deno.readTextFileSync(SOURCES_FILE) !== renderSources(listWgsl())) {
    throw new Error(
      "wgsl/_sources.ts does not list exactly the .wgsl files of wgsl/, so the bundle would miss kernels: " +
        "run `deno task gen:wgsl` first",
    );
  }
  // The entry carries this build's commit, so it is written for each build, into a folder of its own so that
  // concurrent builds (a test beside `deno task bundle`) never share it.
  const tmp = await Deno.makeTempDir({ prefix: "llm_bundle_" });
  try {
    const entry = `${tmp}/entry.ts`;
    Deno.writeTextFileSync(
      entry,
      `import { runBundle } from ${JSON.stringify(new URL("tools/bundle_entry.ts", ROOT).href)};\n` +
        `await runBundle({ commit: ${JSON.stringify(opts.commit)} });\n`,
    );
    Deno.mkdirSync(dirname(path), { recursive: true });
    const o = await new Deno.Command(Deno.execPath(), {
      args: [
        "bundle",
        "--quiet",
        "--config",
        new URL("deno.json", ROOT).pathname,
        "--platform",
        "deno",
        "--output",
        path,
        entry,
      ],
      cwd: ROOT.pathname,
      stdout: "inherit",
      stderr: "inherit",
    }).output();
    if (!o.success) throw new Error(`deno bundle failed (exit ${o.code}): see its output above`);
  } finally {
    await Deno.remove(tmp, { recursive: true });
  }
  const text = Deno.readTextFileSync(path);
  const leftover = text.match(/\bfrom\s*["']npm:[^"']+["']|\bimport\(\s*["']npm:[^"']+["']/);
  if (leftover) throw new Error(`The bundle ${out} still imports ${leftover[0]}: packages must be inlined`);
  const packages = bundledPackages(text);
  const extra = packages.filter((p) => !BUNDLED_PACKAGES.includes(p));
  if (extra.length > 0 || !packages.includes("hono")) {
    throw new Error(
      `The bundle ${out} carries the npm packages ${packages.join(", ")}: expected only ` +
        `${BUNDLED_PACKAGES.join(", ")}; a command imports ${extra.join(", ") || "none of hono"}`,
    );
  }
  const shebang = "#!/usr/bin/env -S deno run -A\n";
  Deno.writeTextFileSync(path, shebang + text);
  Deno.chmodSync(path, 0o755);
  return shebang.length + text.length;
}

if (import.meta.main) {
  const { values } = parseArgs({
    args: Deno.args,
    options: { out: { type: "string", default: new URL("out/llm.js", ROOT).pathname } },
    strict: true,
  });
  const commit = await checkoutCommit();
  try {
    const bytes = await buildBundle(values.out, { commit });
    console.log(`${values.out}: ${(bytes / 1e6).toFixed(2)} MB, commit ${commit}`);
  } catch (e) {
    console.error(`error: ${e instanceof Error ? e.message : String(e)}`);
    Deno.exit(1);
  }
}
