/**
 * CLI entry: `deno run -A mod.ts <command> [options]`. Parses the command name and hands the rest of argv
 * to that command's module under `cli/`; holds no logic of its own.
 *
 * @example
 * ```sh
 * deno run -A mod.ts synth --arch qwen35moe --preset tiny --quant q8_0 --out tiny.gguf
 * deno run -A mod.ts inspect tiny.gguf
 * ```
 * @module
 */

import type { Command } from "./cli/command.ts";

export type { Command };

/** Every command, loaded lazily so that one command's imports never slow another's start. */
export const COMMANDS: Readonly<Record<string, () => Promise<Command>>> = {
  head: async () => (await import("./cli/head.ts")).command,
  synth: async () => (await import("./cli/synth.ts")).command,
  inspect: async () => (await import("./cli/inspect.ts")).command,
  generate: async () => (await import("./cli/generate.ts")).command,
  tokenize: async () => (await import("./cli/tokenize.ts")).command,
  gpu: async () => (await import("./cli/gpu.ts")).command,
};

async function main(argv: string[]): Promise<number> {
  const [name, ...rest] = argv;
  const load = name === undefined ? undefined : COMMANDS[name];
  if (!load) {
    const lines = await Promise.all(
      Object.entries(COMMANDS).map(async ([n, l]) => `  ${n.padEnd(10)} ${(await l()).summary}`),
    );
    const head = name === undefined || name === "help" ? "" : `Unknown command "${name}"\n`;
    console.log(`${head}Usage: deno run -A mod.ts <command> [options]\n\nCommands:\n${lines.join("\n")}`);
    return name === undefined || name === "help" ? 0 : 2;
  }
  const cmd = await load();
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
