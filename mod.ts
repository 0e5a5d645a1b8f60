/**
 * CLI entry: `deno run -A mod.ts <command> [options]`. Parses the command name and hands the rest of argv
 * to that command's module under `cli/`; holds no logic of its own.
 *
 * @example
 * ```sh
 * deno run -A mod.ts synth --arch qwen35moe --preset tiny --quant q8_0 --out tiny.gguf
 * deno run -A mod.ts inspect tiny.gguf
 * deno run -A mod.ts plan --model tiny.gguf --box gpu1=24,2 --box mac=16   # layers per box, start commands
 * deno run -A mod.ts probe gpu2:9100 --model tiny.gguf --layers 0:2          # would a head accept this worker?
 * deno run -A mod.ts --version        # version, git commit, wire protocol version (also `<command> --version`)
 * deno run -A mod.ts head --help      # a command's options (also `-h`, `help head`)
 * ```
 * @module
 */

import type { Command } from "./cli/command.ts";
import { versionLine } from "./version.ts";

export type { Command };

/** Every command, loaded lazily so that one command's imports never slow another's start. */
export const COMMANDS: Readonly<Record<string, () => Promise<Command>>> = {
  head: async () => (await import("./cli/head.ts")).command,
  synth: async () => (await import("./cli/synth.ts")).command,
  inspect: async () => (await import("./cli/inspect.ts")).command,
  generate: async () => (await import("./cli/generate.ts")).command,
  tokenize: async () => (await import("./cli/tokenize.ts")).command,
  gpu: async () => (await import("./cli/gpu.ts")).command,
  worker: async () => (await import("./cli/worker.ts")).command,
  demo: async () => (await import("./cli/demo.ts")).command,
  plan: async () => (await import("./cli/plan.ts")).command,
  probe: async () => (await import("./cli/probe.ts")).command,
};

const HELP_FLAGS: readonly string[] = ["--help", "-h"];

async function usage(): Promise<string> {
  const lines = await Promise.all(
    Object.entries(COMMANDS).map(async ([n, l]) => `  ${n.padEnd(10)} ${(await l()).summary}`),
  );
  return `Usage: deno run -A mod.ts <command> [options]\n\nCommands:\n${lines.join("\n")}\n\n` +
    `<command> --help (or -h, or help <command>) prints a command's options; --version prints the version.`;
}

/**
 * Runs the CLI on `argv` (without the program name) and resolves to the exit code; the single-file bundle's
 * entry calls it, since inside a bundle this module is not the main module.
 */
export async function main(argv: string[]): Promise<number> {
  const [first, ...args] = argv;
  if (first === "--version") {
    console.log(versionLine());
    return 0;
  }
  // `help head` is `head --help`; `help`, `--help`, `-h` and no command at all list the commands.
  const [name, rest] = first === "help" && args[0] !== undefined ? [args[0], ["--help"]] : [first, args];
  if (name === undefined || name === "help" || HELP_FLAGS.includes(name)) {
    console.log(await usage());
    return 0;
  }
  const load = COMMANDS[name];
  if (!load) {
    console.error(`Unknown command "${name}"\n${await usage()}`);
    return 2;
  }
  const cmd = await load();
  if (rest.includes("--version")) {
    console.log(versionLine());
    return 0;
  }
  if (rest.some((a) => HELP_FLAGS.includes(a))) {
    console.log(cmd.usage ?? `Usage: deno run -A mod.ts ${name} [options]\n  ${cmd.summary}`);
    return 0;
  }
  try {
    return await cmd.run(rest);
  } catch (e) {
    const debug = rest.includes("--debug");
    console.error(
      debug && e instanceof Error ? e.stack : `error: ${e instanceof Error ? e.message : String(e)}`,
    );
    return 1;
  }
}

if (import.meta.main) Deno.exit(await main(Deno.args));
