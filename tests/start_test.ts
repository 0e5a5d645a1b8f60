/**
 * `npm start` runs the head with `head.imports.json` instead of `deno.json`, so that a first start fetches only
 * the head's npm packages (not the test-only SDKs, playwright, fast-check, yaml, plist, nor a second Deno from
 * package.json). These checks keep that true as the code grows.
 * @module
 */
import assert from "node:assert/strict";

const root = new URL("../", import.meta.url);
const readJson = async (name: string) => JSON.parse(await Deno.readTextFile(new URL(name, root)));

Deno.test("npm start: the head runs without deno.json, with head.imports.json's packages only", async () => {
  const pkg = await readJson("package.json");
  assert.equal(pkg.scripts.start, "deno run -A --no-config --import-map=head.imports.json mod.ts head");
  // Every package the head's map names is pinned exactly as deno.json pins it (one version everywhere).
  const head: Record<string, string> = (await readJson("head.imports.json")).imports;
  const all: Record<string, string> = (await readJson("deno.json")).imports;
  for (const [name, spec] of Object.entries(head)) {
    assert.equal(spec, all[name], `${name} in head.imports.json`);
  }
  // The whole command graph (every command is imported lazily from mod.ts) resolves through that map alone,
  // and its npm packages are exactly the map's: a new npm import in the head's graph fails here.
  const out = await new Deno.Command(Deno.execPath(), {
    args: ["info", "--json", "--no-config", "--import-map=head.imports.json", "mod.ts"],
    cwd: root,
    stdout: "piped",
    stderr: "piped",
  }).output();
  assert.ok(out.success, new TextDecoder().decode(out.stderr));
  const info = JSON.parse(new TextDecoder().decode(out.stdout));
  const errors = (info.modules as { specifier: string; error?: string }[]).filter((m) => m.error);
  assert.deepEqual(errors, [], "every module resolves without deno.json");
  const npm = Object.keys(info.npmPackages ?? {}).sort();
  const expected = Object.values(head).map((s) => s.replace(/^npm:/, "")).sort();
  assert.deepEqual(npm, expected);
});
