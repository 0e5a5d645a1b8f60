import { match, strictEqual } from "node:assert/strict";
import { PROTOCOL_VERSION } from "../wire/mod.ts";
import { buildInfo, embedBuild, VERSION } from "../version.ts";

const MOD = new URL("../mod.ts", import.meta.url).pathname;

async function cli(...args: string[]): Promise<{ code: number; out: string; err: string }> {
  const o = await new Deno.Command(Deno.execPath(), {
    args: ["run", "-A", MOD, ...args],
    stdout: "piped",
    stderr: "piped",
    env: { NO_COLOR: "1" },
  }).output();
  const dec = new TextDecoder();
  return { code: o.code, out: dec.decode(o.stdout), err: dec.decode(o.stderr) };
}

Deno.test("--version prints version, the checkout's commit and the wire protocol, for mod.ts and a command", async () => {
  const git = await new Deno.Command("git", {
    args: ["-C", new URL("..", import.meta.url).pathname, "rev-parse", "--short=12", "HEAD"],
    stdout: "piped",
  }).output();
  const commit = new TextDecoder().decode(git.stdout).trim();
  const want = `llm ${VERSION} (commit ${commit}, wire protocol ${PROTOCOL_VERSION})\n`;
  for (const args of [["--version"], ["tokenize", "--version"]]) {
    const r = await cli(...args);
    strictEqual(r.code, 0, r.err);
    strictEqual(r.out, want, args.join(" "));
  }
});

Deno.test("help: --help, -h, help, help CMD and CMD -h print usage and exit 0; an unknown command exits 2", async () => {
  for (const args of [["--help"], ["-h"], ["help"]]) {
    const r = await cli(...args);
    strictEqual(r.code, 0, r.err);
    match(r.out, /^Usage: .*<command>[\s\S]*\n {2}head {7}/, args.join(" "));
  }
  for (const args of [["help", "tokenize"], ["tokenize", "-h"], ["tokenize", "--model", "x", "--help"]]) {
    const r = await cli(...args);
    strictEqual(r.code, 0, r.err);
    match(r.out, /^Usage: mod\.ts tokenize --model/, args.join(" "));
  }
  const bad = await cli("bogus");
  strictEqual(bad.code, 2);
  match(bad.err, /^Unknown command "bogus"\nUsage:/);
});

Deno.test("embedBuild: a bundle's commit wins over the checkout's; a malformed one is refused", () => {
  embedBuild({ commit: "0123456789ab" });
  strictEqual(buildInfo().commit, "0123456789ab");
  let err: unknown;
  try {
    embedBuild({ commit: "not a commit" });
  } catch (e) {
    err = e;
  }
  match(String(err), /TypeError: Embedded commit "not a commit" is not 7-40 hex digits/);
});

Deno.test("a tree copied out of its checkout takes its commit from LLM_COMMIT, else says unknown", async () => {
  // version.ts and the wire module it imports, copied where no .git is (as the device's copy of the tree).
  const dir = await Deno.makeTempDir();
  try {
    const root = new URL("..", import.meta.url).pathname;
    await new Deno.Command("cp", { args: ["-r", `${root}version.ts`, `${root}wire`, dir] }).output();
    await Deno.writeTextFile(
      `${dir}/print.ts`,
      `import { buildInfo } from "./version.ts";\nconsole.log(buildInfo().commit);\n`,
    );
    const run = async (env: Record<string, string>) => {
      const o = await new Deno.Command(Deno.execPath(), {
        args: ["run", "-A", "--no-config", `${dir}/print.ts`],
        cwd: dir,
        env: { NO_COLOR: "1", ...env },
        clearEnv: true,
        stdout: "piped",
        stderr: "piped",
      }).output();
      strictEqual(o.code, 0, new TextDecoder().decode(o.stderr));
      return new TextDecoder().decode(o.stdout).trim();
    };
    strictEqual(await run({ LLM_COMMIT: "0123456789ab" }), "0123456789ab");
    strictEqual(await run({ LLM_COMMIT: "not hex" }), "unknown");
    strictEqual(await run({}), "unknown");
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});
