/**
 * `plan` and `probe` end to end on the tiny synthetic qwen35moe: `plan` prints the commands for two boxes on
 * loopback, the worker command it printed is started as a real process, and `probe` with the head command's
 * flags is accepted (exit 0, the worker's fields printed); a mismatched --ctx, the wrong range, --f32-experts
 * against the worker's default int8 experts, a wrong or missing link key, a closed port and a port that is not
 * a stage link each exit 1 with the message the head would log. `plan --measure` prints a speed; a plan that
 * cannot fit exits 1 with its shortfall.
 * @module
 */
import assert from "node:assert/strict";
import { checkChain, type HelloInfo } from "../wire/mod.ts";
import { helloOf } from "../wire/chain.ts";
import { fingerprintFile, planModel, synthesize } from "../engine/mod.ts";
import { command as planCommand } from "../cli/plan.ts";
import { buildInfo } from "../version.ts";

const MOD = new URL("../mod.ts", import.meta.url).pathname;
const KEY = "plan-probe-test-key-0123456789";

/** Runs `mod.ts` with `args` to its end; its exit code and output. */
async function llm(args: string[], env: Record<string, string> = {}) {
  const out = await new Deno.Command(Deno.execPath(), {
    args: ["run", "-A", MOD, ...args],
    env: { NO_COLOR: "1", ...env },
    stdout: "piped",
    stderr: "piped",
  }).output();
  const d = new TextDecoder();
  return { code: out.code, stdout: d.decode(out.stdout), stderr: d.decode(out.stderr) };
}

/** A `mod.ts` process left running; `ready` resolves on the first stderr line matching `re`. */
function start(args: string[], re: RegExp, env: Record<string, string>) {
  const child = new Deno.Command(Deno.execPath(), {
    args: ["run", "-A", MOD, ...args],
    env: { NO_COLOR: "1", ...env },
    stdout: "null",
    stderr: "piped",
  }).spawn();
  const log: string[] = [];
  const ready = (async () => {
    let buf = "";
    for await (const chunk of child.stderr.pipeThrough(new TextDecoderStream())) {
      buf += chunk;
      log.push(chunk);
      if (re.test(buf)) return;
    }
    throw new Error(`Process exited before ${re}:\n${log.join("")}`);
  })();
  // Keep draining stderr after the match so the child never blocks on a full pipe.
  const drained = ready.then(async () => {
    for await (const chunk of child.stderr.pipeThrough(new TextDecoderStream())) log.push(chunk);
  }).catch(() => {});
  return {
    ready,
    log,
    async stop() {
      try {
        child.kill("SIGTERM");
      } catch { /* already gone */ }
      await child.status;
      await drained;
    },
  };
}

function freePort(): number {
  const l = Deno.listen({ hostname: "127.0.0.1", port: 0 });
  const port = (l.addr as Deno.NetAddr).port;
  l.close();
  return port;
}

/** Splits a printed command line into its words (the plan quotes nothing for these paths). */
const words = (line: string) => line.trim().split(/\s+/);
const flag = (ws: string[], name: string) => ws[ws.indexOf(name) + 1]!;

Deno.test("plan's commands start a worker that probe accepts with the head's flags; probe refuses mismatches as the head would", async () => {
  const dir = await Deno.makeTempDir({ prefix: "plan_probe_" });
  const model = `${dir}/tiny.gguf`;
  await synthesize(planModel({ arch: "qwen35moe", preset: "tiny", quant: "q8_0", seed: 1 }), { out: model });
  const port = freePort();
  const planned = await llm([
    "plan",
    "--model",
    model,
    "--box",
    "head=0.03",
    "--box",
    "127.0.0.1=0.03",
    "--ctx",
    "256",
    "--slots",
    "2",
    // The boxes are sized for the activations of 256-token chunks (the default 2,048 needs ~100 MiB here).
    "--chunk",
    "256",
    "--headroom",
    "0",
    "--port",
    String(port),
  ]);
  assert.equal(planned.code, 0, planned.stderr);
  const lines = planned.stdout.split("\n");
  const headLine = lines.find((l) => l.trim().startsWith("llm head "));
  const workerLine = lines.find((l) => l.trim().startsWith("llm worker "));
  assert.ok(headLine && workerLine, planned.stdout);
  const head = words(headLine);
  const wk = words(workerLine);
  const a = Number(flag(head, "--layers").split(":")[1]);
  assert.deepEqual(flag(head, "--next"), `127.0.0.1:${port}`);
  assert.equal(flag(wk, "--layers"), `${a}:4`);
  assert.equal(flag(wk, "--listen"), `0.0.0.0:${port}`);
  assert.match(planned.stdout, new RegExp(`^head\\s+1\\s+0:${a}\\s`, "m"));

  const worker = start(wk.slice(1), /Listening on /, { LLM_LINK_KEY: KEY });
  try {
    await worker.ready;
    const target = `127.0.0.1:${port}`;
    const headFlags = ["--model", model, "--layers", flag(head, "--layers"), "--slots", "2", "--ctx", "256"];

    const ok = await llm(["probe", target, ...headFlags, "--link-key", KEY, "--pings", "3"]);
    assert.equal(ok.code, 0, ok.stderr + ok.stdout);
    const fp = await fingerprintFile(model);
    for (
      const want of [
        `Accepted: a head with --layers 0:${a} --slots 2 --ctx 256 can use the chain at ${target}`,
        `model        qwen35moe, fingerprint ${fp}`,
        `layers       ${a}:4 of 4 (last stage: output norm, LM head)`,
        "width        nEmbd 256",
        "slots        2, context 256 positions per slot",
        // int8 x for every mat-vec: the worker's (and the probing head's) default.
        "state        kv=f32;ssm=f32; int8 activations on; hidden rows f32",
        `build        ${buildInfo().version} (commit `,
        "wire protocol 2",
        "over 3 ping(s)",
      ]
    ) assert.ok(ok.stdout.includes(want), `missing "${want}" in:\n${ok.stdout}`);

    // A head with a longer context: the worker's chain check refuses it, with the message the head would log.
    const ctx = await llm(["probe", target, ...headFlags.slice(0, -1), "512", "--link-key", KEY]);
    assert.equal(ctx.code, 1, ctx.stdout);
    const info = (nCtx: number, first: number, end: number): HelloInfo =>
      helloOf({
        arch: "qwen35moe",
        layers: { first, end, total: 4 },
        nEmbd: 256,
        nSlots: 2,
        nCtx,
        int8Activations: true,
        int8Experts: true,
        kvF16: false,
        fingerprint: fp,
      }, { build: buildInfo(), last: first > 0 });
    const expected = checkChain(info(512, 0, a), info(256, a, 4), {
      prevName: "PEER",
      nextName: "this worker",
    });
    assert.ok(expected);
    const [before, after] = expected.message.split("PEER");
    const got = /^error: (.*)$/m.exec(ctx.stderr)?.[1] ?? "";
    assert.ok(
      got.startsWith(`worker ${target} refused the connection: ${before}peer 127.0.0.1:`),
      ctx.stderr,
    );
    assert.ok(got.endsWith(after!), ctx.stderr);
    assert.match(ctx.stderr, /hint: a head started with these flags would be refused/);

    // A range that does not end where the worker starts.
    const other = a > 1 ? a - 1 : a + 1;
    const range = await llm([
      "probe",
      target,
      ...headFlags.slice(0, 3),
      `0:${other}`,
      ...headFlags.slice(4),
      "--link-key",
      KEY,
    ]);
    assert.equal(range.code, 1);
    assert.match(
      range.stderr,
      new RegExp(`Layer ranges do not chain: .* ends at layer ${other} .* starts at layer ${a}`),
    );

    // The worker runs int8 x for every mat-vec by default: a head with --f32-experts or --int8-experts is
    // refused, and --int8 (the default) is accepted.
    for (
      const [flag, runs] of [["--f32-experts", "f32 x everywhere"], [
        "--int8-experts",
        "int8 x for the experts alone",
      ]]
    ) {
      const r = await llm(["probe", target, ...headFlags, flag!, "--link-key", KEY]);
      assert.equal(r.code, 1, r.stdout);
      assert.match(
        r.stderr,
        new RegExp(
          `^error: worker 127\\.0\\.0\\.1:\\d+ refused the connection: int8 activations differ: .* runs ${runs} ` +
            `\\(${flag}\\) but .* runs int8 x for every mat-vec \\(the default\\): start every stage with the same one of`,
          "m",
        ),
      );
    }
    const int8 = await llm(["probe", target, ...headFlags, "--int8", "--link-key", KEY]);
    assert.equal(int8.code, 0, int8.stderr);

    // The wrong key, and none.
    const wrong = await llm(["probe", target, ...headFlags, "--link-key", "not-the-key-of-this-chain"]);
    assert.equal(wrong.code, 1);
    assert.match(wrong.stderr, /^error: worker 127\.0\.0\.1:\d+ refused the connection: Wrong link key: /m);
    assert.match(wrong.stderr, /hint: give the head and every worker the same --link-key/);
    const none = await llm(["probe", target, ...headFlags]);
    assert.equal(none.code, 1);
    assert.match(
      none.stderr,
      /refused the connection: Unauthenticated peer refused: this side has a link key but peer 127\.0\.0\.1:\d+ has none/,
    );
    // The key from the environment, as the head takes it.
    const env = await llm(["probe", target, ...headFlags], { LLM_LINK_KEY: KEY });
    assert.equal(env.code, 0, env.stderr);
  } finally {
    await worker.stop();
  }

  // Nobody listening, and a port that answers but is not a stage link.
  const closed = await llm(["probe", `127.0.0.1:${freePort()}`, "--model", model, "--layers", "0:2"]);
  assert.equal(closed.code, 1);
  assert.match(
    closed.stderr,
    /^error: Cannot connect to worker 127\.0\.0\.1:\d+: .*check that the worker runs/m,
  );
  assert.match(closed.stderr, /hint: is a worker running and listening at/);
  const http = Deno.listen({ hostname: "127.0.0.1", port: 0 });
  const served = (async () => {
    for await (const conn of http) {
      await conn.write(new TextEncoder().encode("HTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\n\r\n"));
      conn.close();
    }
  })().catch(() => {});
  try {
    const notLink = await llm([
      "probe",
      `127.0.0.1:${(http.addr as Deno.NetAddr).port}`,
      "--model",
      model,
      "--layers",
      "0:2",
      "--timeout",
      "3",
    ]);
    assert.equal(notLink.code, 1);
    assert.match(notLink.stderr, /hint: .* answers, but not as a stage link: give a worker's --listen port/);
  } finally {
    http.close();
    await served;
  }

  // A plan that cannot fit: exit 1 and the shortfall.
  const tight = await llm([
    "plan",
    "--model",
    model,
    "--box",
    "a=0.01",
    "--box",
    "b=0.01",
    "--headroom",
    "0",
  ]);
  assert.equal(tight.code, 1);
  assert.match(tight.stderr, /^error: Box a \(10\.2 MiB\) is too small for even one layer: .* short/m);
  await Deno.remove(dir, { recursive: true });
});

Deno.test("plan --measure times each planned stage on this GPU and prints a speed", async () => {
  const dir = await Deno.makeTempDir({ prefix: "plan_measure_" });
  const model = `${dir}/tiny.gguf`;
  await synthesize(planModel({ arch: "qwen3next", preset: "tiny", quant: "q8_0", seed: 2 }), { out: model });
  const out: string[] = [];
  const log = console.log;
  console.log = (...a: unknown[]) => out.push(a.join(" "));
  try {
    const code = await planCommand.run([
      "--model",
      model,
      "--box",
      "a=1",
      "--box",
      "b=1",
      "--ctx",
      "128",
      "--slots",
      "1",
      "--measure",
      "--steps",
      "3",
    ]);
    assert.equal(code, 0);
  } finally {
    console.log = log;
    await Deno.remove(dir, { recursive: true });
  }
  const text = out.join("\n");
  const stages = [...text.matchAll(/layers (\d+):(\d+): ([\d.e+-]+) ms per token .* speed ([\d.e+-]+)/g)];
  assert.equal(stages.length, 2, text);
  for (const s of stages) assert.ok(Number(s[3]) > 0 && Number(s[4]) > 0, s[0]);
  const speed = /This GPU's speed: ([\d.e+-]+): pass --box NAME=MEM_GIB,\1 /.exec(text);
  assert.ok(speed && Number(speed[1]) > 0, text);
});
