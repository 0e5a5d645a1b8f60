/**
 * Child processes of `mod.ts` for tests on loopback: spawn a command, wait for a line of its stderr, kill it
 * (the whole log is kept for failure messages), and a free TCP port.
 * @module
 */

const MOD = new URL("../../mod.ts", import.meta.url).pathname;

/** A running `deno run -A mod.ts ...` child. */
export interface Proc {
  /** The first stderr line (seen so far or later) matching `re`; throws with the log on exit or timeout. */
  waitFor(re: RegExp, timeoutMs?: number): Promise<RegExpMatchArray>;
  /** Signals the child (SIGTERM by default) and waits for it and its stderr. */
  kill(signal?: Deno.Signal): Promise<void>;
  /** Sends `signal` (SIGSTOP, SIGCONT, ...) without waiting. */
  signal(signal: Deno.Signal): void;
  /** The stderr lines so far. */
  readonly log: readonly string[];
}

/** Spawns `mod.ts` with `args`, stdout dropped, stderr collected line by line. */
export function spawnMod(args: string[], waitMs = 120_000): Proc {
  const child = new Deno.Command(Deno.execPath(), {
    args: ["run", "-A", MOD, ...args],
    stdout: "null",
    stderr: "piped",
    env: { NO_COLOR: "1", XDG_RUNTIME_DIR: Deno.env.get("XDG_RUNTIME_DIR") ?? "/tmp" },
  }).spawn();
  const log: string[] = [];
  let exited = false;
  const done = (async () => {
    let buf = "";
    for await (const chunk of child.stderr.pipeThrough(new TextDecoderStream())) {
      buf += chunk;
      const lines = buf.split("\n");
      buf = lines.pop()!;
      log.push(...lines);
    }
    exited = true;
  })();
  return {
    log,
    async waitFor(re, timeoutMs = waitMs) {
      const end = Date.now() + timeoutMs;
      for (;;) {
        for (const line of log) {
          const m = line.match(re);
          if (m) return m;
        }
        if (exited) throw new Error(`Process exited before ${re}:\n${log.join("\n")}`);
        if (Date.now() > end) throw new Error(`No line ${re} within ${timeoutMs} ms:\n${log.join("\n")}`);
        await new Promise((r) => setTimeout(r, 50));
      }
    },
    signal(signal) {
      child.kill(signal);
    },
    async kill(signal: Deno.Signal = "SIGTERM") {
      try {
        child.kill(signal);
      } catch { /* already exited */ }
      await child.status;
      await done;
    },
  };
}

/** A TCP port on 127.0.0.1 that was free a moment ago. */
export function freePort(): number {
  const l = Deno.listen({ hostname: "127.0.0.1", port: 0 });
  const port = (l.addr as Deno.NetAddr).port;
  l.close();
  return port;
}
