/**
 * The service manifests in deploy/, each read by a real parser, then checked against the CLI: every flag a
 * unit, env file, plist or Kubernetes manifest passes is one the command takes, every variable a command line
 * uses is set, and the paths and ports agree with deploy/install.sh and the head's HTTP routes.
 *
 * Parsers: the Kubernetes YAML with the npm `yaml` package (YAML 1.2, strict, duplicate keys refused), the
 * launchd plist with the npm `plist` package (xmldom underneath: malformed XML throws). No npm package parses
 * systemd units, so {@linkcode parseUnit} below does, from systemd.syntax(7): `[Section]` headers, `Key=value`
 * entries, `#`/`;` comment lines, trailing-backslash continuations. It is stricter than systemd, which only
 * warns: an entry before any section, a malformed line, an unknown section or a directive missing from
 * {@linkcode DIRECTIVES} fails. (systemd-analyze verify 252 accepted both units, apart from the missing
 * /usr/local/bin/llm, when this test was written; it is not run here, CI has no systemd.)
 */
import assert from "node:assert/strict";
import { parseAllDocuments } from "yaml";
import * as plist from "plist";
import { command as head } from "../cli/head.ts";
import { command as worker } from "../cli/worker.ts";
import { PUBLIC_PATHS } from "../server/auth.ts";

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

/**
 * Directives this test accepts per section, each checked in systemd.unit(5), systemd.service(5),
 * systemd.exec(5) or systemd.kill(5). Add one here after checking its man page.
 */
const DIRECTIVES: Readonly<Record<string, ReadonlySet<string>>> = {
  Unit: new Set(["Description", "Documentation", "After", "Before", "Wants", "Requires", "BindsTo"]),
  Service: new Set([
    "Type",
    "User",
    "Group",
    "SupplementaryGroups",
    "EnvironmentFile",
    "Environment",
    "CacheDirectory",
    "RuntimeDirectory",
    "StateDirectory",
    "WorkingDirectory",
    "ExecStart",
    "ExecStartPre",
    "ExecReload",
    "KillSignal",
    "KillMode",
    "TimeoutStopSec",
    "TimeoutStartSec",
    "Restart",
    "RestartSec",
    "NoNewPrivileges",
    "ProtectSystem",
    "ProtectHome",
    "PrivateTmp",
    "LimitNOFILE",
  ]),
  Install: new Set(["WantedBy", "RequiredBy", "Alias"]),
};

/** A unit file's entries per section, in file order (a repeated key keeps every value). */
type Unit = Map<string, [key: string, value: string][]>;

/**
 * Parses a unit file after systemd.syntax(7), strictly (see the module doc).
 * @throws {SyntaxError} naming the file's line and what is wrong with it
 */
function parseUnit(text: string, name: string): Unit {
  const unit: Unit = new Map();
  let section: [string, string][] | undefined;
  const lines = text.replace(/\n$/, "").split("\n");
  for (let i = 0; i < lines.length; i++) {
    const at = `${name}:${i + 1}`;
    let line = lines[i]!.trim();
    if (line === "" || line.startsWith("#") || line.startsWith(";")) continue;
    // A trailing backslash joins the next line, the backslash becoming a space (systemd.syntax(7)).
    while (line.endsWith("\\")) {
      const next = lines[++i];
      if (next === undefined) throw new SyntaxError(`${at}: continuation at the end of the file`);
      if (/^\s*[#;]/.test(next)) throw new SyntaxError(`${name}:${i + 1}: comment inside a continuation`);
      line = line.slice(0, -1) + " " + next.trim();
    }
    const header = /^\[([^\[\]]+)\]$/.exec(line);
    if (header) {
      const s = header[1]!;
      if (!(s in DIRECTIVES) && !s.startsWith("X-")) throw new SyntaxError(`${at}: unknown section [${s}]`);
      if (unit.has(s)) throw new SyntaxError(`${at}: section [${s}] given twice`);
      unit.set(s, section = []);
      continue;
    }
    const entry = /^([A-Za-z0-9-]+)\s*=\s*(.*)$/.exec(line);
    if (!entry) throw new SyntaxError(`${at}: neither [Section], Key=value nor a comment: ${line}`);
    if (!section) throw new SyntaxError(`${at}: ${entry[1]}= before any [Section]`);
    const sectionName = [...unit.keys()].at(-1)!;
    if (DIRECTIVES[sectionName] && !DIRECTIVES[sectionName].has(entry[1]!)) {
      throw new SyntaxError(`${at}: ${entry[1]}= is not a [${sectionName}] directive this test knows`);
    }
    section.push([entry[1]!, entry[2]!]);
  }
  return unit;
}

/** The one value of `key` in `section` of a parsed unit (a directive given twice fails). */
function one(unit: Unit, section: string, key: string): string {
  const values = (unit.get(section) ?? []).filter(([k]) => k === key);
  assert.equal(values.length, 1, `[${section}] ${key}= is given ${values.length} times, expected once`);
  return values[0]![1];
}

/** Flags of a command's usage text: `--flag` → whether it takes a value (`--port N`) or not (`--kv-f16`). */
function usageFlags(usage: string): Map<string, boolean> {
  const flags = new Map<string, boolean>();
  for (const m of usage.matchAll(/^ {2}(--[a-z0-9-]+)( \S+)?/gm)) flags.set(m[1]!, !!m[2]);
  return flags;
}

function checkCommandLine(line: string, env: Map<string, string>, usage: string, name: string): void {
  const vars = [...line.matchAll(/\$\{?([A-Z_][A-Z0-9_]*)\}?/g)].map((m) => m[1]!);
  for (const v of vars) {
    assert.ok(env.has(v), `${name}: $${v} is not set in its env file (or the container's env)`);
  }
  const expanded = line.replace(/"?\$\{?([A-Z_][A-Z0-9_]*)\}?"?/g, (_, v: string) => env.get(v) ?? "");
  const flags = [...expanded.matchAll(/(?:^|\s)(--[a-z0-9-]+)/g)].map((m) => m[1]!);
  assert.ok(flags.length >= 4, `${name}: too few flags found in ${line}`);
  for (const f of flags) {
    assert.match(usage, new RegExp(`(^|\\s)${f}\\b`), `${name}: ${f} is not a flag of the command`);
  }
}

Deno.test("deploy: the unit parser follows systemd.syntax(7) and refuses what systemd would misread", () => {
  const u = parseUnit("# c\n; c\n[Service]\nExecStart=/bin/a \\\n  --x 1\nEnvironment = A=1\n", "t");
  assert.deepEqual(u.get("Service"), [["ExecStart", "/bin/a  --x 1"], ["Environment", "A=1"]]);
  for (
    const [text, msg] of [
      ["Type=simple\n", /before any \[Section\]/],
      ["[Service]\nRestrt=always\n", /Restrt= is not a \[Service\] directive/],
      ["[Servce]\n", /unknown section \[Servce\]/],
      ["[Service]\nExecStart /bin/a\n", /neither \[Section\]/],
      ["[Service]\nExecStart=/bin/a \\\n", /continuation at the end/],
      ["[Service]\nExecStart=/bin/a \\\n# x\n --y\n", /comment inside a continuation/],
      ["[Unit]\n[Unit]\n", /given twice/],
    ] as const
  ) assert.throws(() => parseUnit(text, "t"), msg);
});

Deno.test("deploy: systemd units pass only flags head and worker take, from their env files", () => {
  const install = read("install.sh");
  for (const [name, cmd] of [["head", head], ["worker", worker]] as const) {
    const unit = parseUnit(read(`systemd/llm-${name}.service`), `llm-${name}.service`);
    const env = parseEnv(read(`systemd/${name}.env`));
    assert.deepEqual([...unit.keys()], ["Unit", "Service", "Install"]);
    assert.equal(one(unit, "Service", "Restart"), "on-failure");
    assert.equal(one(unit, "Service", "EnvironmentFile"), `/etc/llm/${name}.env`);
    assert.equal(one(unit, "Install", "WantedBy"), "multi-user.target");
    assert.ok(install.includes('"/etc/llm/$f.env"'), "install.sh writes /etc/llm/<name>.env");
    assert.ok(install.includes("install -m 600 -o root -g root"), "env files are root-only");
    assert.ok(env.has("LLM_LINK_KEY"), `${name}.env sets the link key`);
    const exec = one(unit, "Service", "ExecStart");
    assert.ok(exec.startsWith(`/usr/local/bin/llm ${name} `), `${name}: ExecStart runs the installed llm`);
    checkCommandLine(exec.slice(exec.indexOf(" ") + 1), env, cmd.usage!, `llm-${name}.service`);
  }
});

Deno.test("deploy: the launchd plist keeps a worker alive with the flags worker takes", () => {
  const text = read("launchd/dev.llm.worker.plist");
  assert.ok(
    !/<!--[\s\S]*?--[^>][\s\S]*?-->/.test(text),
    "no -- inside an XML comment (plist parsers refuse it)",
  );
  const p = plist.parse(text) as Record<string, unknown>;
  assert.equal(p.Label, "dev.llm.worker");
  assert.equal(p.KeepAlive, true);
  assert.equal(p.RunAtLoad, true);
  assert.equal(p.ThrottleInterval, 5);
  const args = p.ProgramArguments;
  assert.ok(Array.isArray(args) && args.length === 3 && args.every((a) => typeof a === "string"));
  assert.deepEqual(args.slice(0, 2), ["/bin/sh", "-c"]);
  assert.ok(
    (args[2] as string).includes('. "__HOME__/.config/llm/worker.env"'),
    "reads install.sh's ~/.config/llm/worker.env",
  );
  const sh = /exec \/usr\/local\/bin\/llm worker (.*)$/.exec(args[2] as string);
  assert.ok(sh, "the plist runs /usr/local/bin/llm worker");
  checkCommandLine(sh[1]!, parseEnv(read("systemd/worker.env")), worker.usage!, "dev.llm.worker.plist");
  assert.equal(p.StandardErrorPath, "__HOME__/Library/Logs/llm-worker.log");
});

/** A node of a parsed manifest, narrowed with {@linkcode obj}, {@linkcode arr} and {@linkcode str}. */
type Node = unknown;

function obj(v: Node, what: string): Record<string, Node> {
  assert.ok(v !== null && typeof v === "object" && !Array.isArray(v), `${what} is not a mapping`);
  return v as Record<string, Node>;
}
function arr(v: Node, what: string): Node[] {
  assert.ok(Array.isArray(v), `${what} is not a list`);
  return v;
}
function str(v: Node, what: string): string {
  assert.equal(typeof v, "string", `${what} is not a string`);
  return v as string;
}

/** Every document of deploy/kubernetes/*.yaml, parsed strictly, by `kind/name`. */
function kubernetesManifests(): Map<string, Record<string, Node>> {
  const docs = new Map<string, Record<string, Node>>();
  const files = [...Deno.readDirSync(new URL("kubernetes/", DEPLOY))].map((e) => e.name)
    .filter((n) => /\.ya?ml$/.test(n)).sort();
  assert.deepEqual(files, ["deployment.yaml", "secret.example.yaml", "service.yaml"]);
  for (const file of files) {
    for (const doc of parseAllDocuments(read(`kubernetes/${file}`), { strict: true, uniqueKeys: true })) {
      const problems = [...doc.errors, ...doc.warnings].map(String);
      assert.deepEqual(problems, [], `${file} does not parse cleanly: ${problems.join("; ")}`);
      const m = obj(doc.toJS(), file);
      str(m.apiVersion, `${file}: apiVersion`);
      const name = str(obj(m.metadata, `${file}: metadata`).name, `${file}: metadata.name`);
      docs.set(`${str(m.kind, `${file}: kind`)}/${name}`, m);
    }
  }
  return docs;
}

/** The `--flag value` arguments of a container's args, after the flags the usage declares (value or not). */
function checkArgs(
  args: string[],
  env: Map<string, string>,
  usage: string,
  name: string,
): Map<string, string> {
  // Kubernetes expands $(NAME) from the container's env; an undefined one stays literal, so every one used
  // must be defined. The line then goes through the same check as the units' ExecStart.
  const line = args.map((a) => a.replace(/\$\(([A-Za-z_][A-Za-z0-9_]*)\)/g, "${$1}")).join(" ");
  checkCommandLine(line, env, usage, name);
  const flags = usageFlags(usage);
  const given = new Map<string, string>();
  for (let i = 0; i < args.length; i++) {
    const f = args[i]!;
    assert.ok(flags.has(f), `${name}: ${f} is not a flag of the command (or a value without its flag)`);
    if (flags.get(f)) {
      const value = args[++i];
      assert.ok(value !== undefined && !value.startsWith("--"), `${name}: ${f} needs a value`);
      given.set(f, value);
    } else given.set(f, "");
  }
  return given;
}

Deno.test("deploy: the Kubernetes head runs llm head with its flags, probes /health on its port, keys from the Secret", () => {
  const docs = kubernetesManifests();
  const deployment = docs.get("Deployment/llm-head"), service = docs.get("Service/llm-head");
  const secret = docs.get("Secret/llm-keys");
  assert.ok(
    deployment && service && secret,
    `expected Deployment, Service and Secret, got ${[...docs.keys()]}`,
  );
  assert.equal(deployment.apiVersion, "apps/v1");

  const spec = obj(deployment.spec, "Deployment spec");
  const template = obj(spec.template, "pod template");
  const labels = obj(obj(template.metadata, "template metadata").labels, "template labels");
  assert.deepEqual(obj(spec.selector, "selector").matchLabels, labels, "the selector matches the pods");
  assert.deepEqual(obj(service.spec, "Service spec").selector, labels, "the Service selects the pods");
  const pod = obj(template.spec, "pod spec");
  assert.equal(pod.restartPolicy, "Always");
  const [c, ...more] = arr(pod.containers, "containers").map((x) => obj(x, "container"));
  assert.ok(c && more.length === 0, "one container");
  assert.deepEqual(c.command, ["/usr/local/bin/llm", "head"], "runs the llm that install.sh installs");

  // Environment: literal values, and Secret references that must name the example Secret's keys.
  const secretKeys = Object.keys(obj(secret.stringData, "Secret stringData"));
  const env = new Map<string, string>();
  for (const e of arr(c.env, "env").map((x) => obj(x, "env entry"))) {
    const name = str(e.name, "env name");
    if (e.value !== undefined) env.set(name, str(e.value, `${name} value`));
    else {
      const ref = obj(obj(e.valueFrom, `${name} valueFrom`).secretKeyRef, `${name} secretKeyRef`);
      assert.equal(ref.name, "llm-keys", `${name} comes from the Secret llm-keys`);
      assert.ok(
        secretKeys.includes(str(ref.key, `${name} key`)),
        `${name}: the Secret has no key ${ref.key}`,
      );
      env.set(name, `<secret ${ref.key}>`);
    }
  }
  assert.equal(env.get("LLM_LINK_KEY"), "<secret link-key>", "the link key comes from the Secret");
  assert.match(head.usage!, /LLM_LINK_KEY/, "the head reads LLM_LINK_KEY");

  const flags = checkArgs(arr(c.args, "args").map((a) => str(a, "arg")), env, head.usage!, "deployment.yaml");
  assert.ok(!flags.has("--link-key"), "the link key stays out of the args (LLM_LINK_KEY)");
  assert.equal(flags.get("--host"), "0.0.0.0", "listens on the pod's address, not loopback");

  // The port: --port is the container port the probes and the Service reach by its name.
  const ports = arr(c.ports, "ports").map((x) => obj(x, "port"));
  const http = ports.find((p) => p.name === "http");
  assert.ok(http, "a container port named http");
  assert.equal(String(http.containerPort), flags.get("--port"), "containerPort is the head's --port");
  const svcPort = obj(arr(obj(service.spec, "Service spec").ports, "Service ports")[0], "Service port");
  assert.equal(svcPort.targetPort, "http", "the Service targets the head's port");
  for (const probe of ["startupProbe", "readinessProbe", "livenessProbe"]) {
    const get = obj(obj(c[probe], probe).httpGet, `${probe}.httpGet`);
    assert.equal(get.path, "/health", `${probe} polls /health`);
    assert.equal(get.port, "http", `${probe} polls the head's port`);
  }
  assert.ok(PUBLIC_PATHS.has("/health"), "/health answers without the API key, so probes need none");
  assert.ok(
    Number(pod.terminationGracePeriodSeconds) > Number(flags.get("--grace") ?? 30),
    "Kubernetes waits longer than the head's --grace before it kills",
  );

  // The model path lies in a read-only mount of a declared volume.
  const model = flags.get("--model")!;
  const mounts = arr(c.volumeMounts, "volumeMounts").map((x) => obj(x, "volumeMount"));
  const mount = mounts.find((m) => model.startsWith(str(m.mountPath, "mountPath") + "/"));
  assert.ok(mount, `--model ${model} is under a volume mount`);
  assert.equal(mount.readOnly, true);
  const volumes = arr(pod.volumes, "volumes").map((x) => obj(x, "volume"));
  assert.ok(
    volumes.some((v) => v.name === mount.name && v.persistentVolumeClaim),
    "the model's volume is a PVC",
  );

  const resources = obj(c.resources, "resources");
  for (const k of ["requests", "limits"]) {
    const r = obj(resources[k], k);
    assert.ok(r.memory && Object.keys(r).some((n) => n.endsWith("/gpu")), `${k}: memory and a GPU`);
  }
});

Deno.test("deploy: the Kubernetes image installs the bundle and deno with install.sh into /usr/local", () => {
  const docker = read("kubernetes/Dockerfile");
  const instructions = docker.replace(/\\\n/g, " ").split("\n").filter((l) => l.trim() && !l.startsWith("#"));
  const copy = instructions.find((l) => l.startsWith("COPY "));
  assert.equal(copy, "COPY out/deno out/llm.js deploy/install.sh /tmp/llm/");
  assert.match(Deno.readTextFileSync(new URL("../tools/bundle.ts", import.meta.url)), /"out\/llm\.js"/);
  const run = instructions.find((l) => l.startsWith("RUN ") && l.includes("install.sh"));
  assert.ok(run?.includes("--prefix /usr/local --deno /tmp/llm/deno --bundle /tmp/llm/llm.js"));
  for (const flag of ["--prefix", "--deno", "--bundle"]) {
    assert.ok(read("install.sh").includes(`    ${flag})`), `install.sh takes ${flag}`);
  }
  assert.ok(instructions.includes('ENTRYPOINT ["/usr/local/bin/llm"]'));
  assert.ok(/^USER 10001$/m.test(docker), "the image runs as the user the pod's securityContext names");
});
