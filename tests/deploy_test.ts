/**
 * The service manifests in deploy/ against the CLI: every flag a unit, env file or plist passes is one the
 * command takes, every variable a command line uses is set in its env file, and the paths agree with
 * deploy/install.sh. (Not a systemd or plist parser: neither is installed on CI.)
 */
import assert from "node:assert/strict";
import { command as head } from "../cli/head.ts";
import { command as worker } from "../cli/worker.ts";

const DEPLOY = new URL("../deploy/", import.meta.url);
const read = (p: string) => Deno.readTextFileSync(new URL(p, DEPLOY));

/** `KEY=value` lines of an env file (systemd EnvironmentFile syntax, also sourced by sh), quotes removed. */
function parseEnv(text: string): Map<string, string> {
  const env = new Map<string, string>();
  for (const [i, line] of text.split("\n").entries()) {
    if (line.trim() === "" || line.startsWith("#")) continue;
    const m = /^([A-Z_][A-Z0-9_]*)=("([^"]*)"|[^\s"]*)$/.exec(line);
    assert.ok(m, `line ${i + 1} is not KEY=value or KEY="value": ${line}`);
    env.set(m[1]!, m[3] ?? m[2]!);
  }
  return env;
}

/** The `[Service]` keys of a unit file (the last value of a repeated key). */
function serviceSection(text: string): Map<string, string> {
  const keys = new Map<string, string>();
  let section = "";
  for (const line of text.split("\n")) {
    const s = /^\[(\w+)\]$/.exec(line);
    if (s) section = s[1]!;
    else if (section === "Service" && /^\w+=/.test(line)) {
      keys.set(line.slice(0, line.indexOf("=")), line.slice(line.indexOf("=") + 1));
    }
  }
  return keys;
}

function checkCommandLine(line: string, env: Map<string, string>, usage: string, name: string): void {
  const vars = [...line.matchAll(/\$\{?([A-Z_][A-Z0-9_]*)\}?/g)].map((m) => m[1]!);
  for (const v of vars) assert.ok(env.has(v), `${name}: $${v} is not set in its env file`);
  const expanded = line.replace(/"?\$\{?([A-Z_][A-Z0-9_]*)\}?"?/g, (_, v: string) => env.get(v) ?? "");
  const flags = [...expanded.matchAll(/(?:^|\s)(--[a-z0-9-]+)/g)].map((m) => m[1]!);
  assert.ok(flags.length >= 4, `${name}: too few flags found in ${line}`);
  for (const f of flags) {
    assert.match(usage, new RegExp(`(^|\\s)${f}\\b`), `${name}: ${f} is not a flag of the command`);
  }
}

Deno.test("deploy: systemd units pass only flags head and worker take, from their env files", () => {
  const install = read("install.sh");
  for (const [name, cmd] of [["head", head], ["worker", worker]] as const) {
    const unit = serviceSection(read(`systemd/llm-${name}.service`));
    const env = parseEnv(read(`systemd/${name}.env`));
    assert.equal(unit.get("Restart"), "on-failure");
    assert.equal(unit.get("EnvironmentFile"), `/etc/llm/${name}.env`);
    assert.ok(install.includes('"/etc/llm/$f.env"'), "install.sh writes /etc/llm/<name>.env");
    assert.ok(install.includes("install -m 600 -o root -g root"), "env files are root-only");
    assert.ok(env.has("LLM_LINK_KEY"), `${name}.env sets the link key`);
    const exec = unit.get("ExecStart")!;
    assert.ok(exec.startsWith(`/usr/local/bin/llm ${name} `), `${name}: ExecStart runs the installed llm`);
    checkCommandLine(exec.slice(exec.indexOf(" ") + 1), env, cmd.usage!, `llm-${name}.service`);
  }
});

Deno.test("deploy: the launchd plist keeps a worker alive with the flags worker takes", () => {
  const plist = read("launchd/dev.llm.worker.plist");
  assert.match(plist, /<key>KeepAlive<\/key>\s*<true\/>/);
  assert.match(plist, /<key>Label<\/key>\s*<string>dev\.llm\.worker<\/string>/);
  assert.ok(
    !/<!--[\s\S]*?--[^>][\s\S]*?-->/.test(plist),
    "no -- inside an XML comment (plist parsers refuse it)",
  );
  const sh = /exec \/usr\/local\/bin\/llm worker ([^<]*)<\/string>/.exec(plist);
  assert.ok(sh, "the plist runs /usr/local/bin/llm worker");
  checkCommandLine(sh[1]!, parseEnv(read("systemd/worker.env")), worker.usage!, "dev.llm.worker.plist");
});
