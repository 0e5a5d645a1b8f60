import { deepStrictEqual } from "node:assert/strict";
import { listWgsl, renderSources, SOURCES_FILE } from "../tools/gen_wgsl_sources.ts";
import { WGSL_SOURCES } from "../wgsl/_sources.ts";

Deno.test("wgsl/_sources.ts embeds exactly the .wgsl files of wgsl/ (else run `deno task gen:wgsl`)", () => {
  const paths = listWgsl();
  deepStrictEqual(Deno.readTextFileSync(SOURCES_FILE), renderSources(paths));
  deepStrictEqual(Object.keys(WGSL_SOURCES).sort(), [...paths].sort());
  for (const p of paths) {
    deepStrictEqual(WGSL_SOURCES[p], Deno.readTextFileSync(new URL(`../wgsl/${p}`, import.meta.url)), p);
  }
});
