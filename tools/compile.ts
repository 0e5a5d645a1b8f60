/**
 * `deno task compile`: single binaries of the CLI, one per target, in `out/` (`out/llm-<target>`), compiled
 * from the bundle (`tools/bundle.ts`), so they carry exactly what the bundle carries: the kernels, the chat
 * templates, the engine's Worker module and the CLI's npm packages, nothing of the test-only ones.
 *
 * `deno compile` writes a program into a copy of `denort`, Deno's runtime binary for the target, which it
 * otherwise downloads from dl.deno.land. Where that cannot be reached, give it with `DENORT_BIN` (Deno's own
 * variable): one denort per run, whose target this script reads from the file's header. Without it the task
 * stops and says what it needs, unless `--download` lets `deno compile` fetch denort itself.
 *
 * ```sh
 * DENORT_BIN=/opt/denort-2.9.6-x86_64-linux/denort deno task compile   # out/llm-x86_64-unknown-linux-gnu
 * deno task compile --download                                         # all three targets, denort fetched
 * deno task compile --download --target aarch64-apple-darwin
 * ```
 * @module
 */
import { parseArgs } from "node:util";
import { buildBundle, checkoutCommit } from "./bundle.ts";

/** The targets the project ships binaries for. */
export const TARGETS = [
  "x86_64-unknown-linux-gnu",
  "aarch64-unknown-linux-gnu",
  "aarch64-apple-darwin",
] as const;

/** One of {@linkcode TARGETS}. */
export type Target = typeof TARGETS[number];

const ROOT = new URL("../", import.meta.url);

/**
 * The target a denort binary runs on, read from its ELF or Mach-O header; undefined for any other file.
 * @param head the file's first 64 bytes (or more)
 */
export function denortTarget(head: Uint8Array): Target | undefined {
  if (head.length < 20) return undefined;
  const view = new DataView(head.buffer, head.byteOffset, head.byteLength);
  // ELF: "\x7fELF", 64-bit little-endian, e_machine at byte 18 (EM_X86_64 = 62, EM_AARCH64 = 183).
  if (view.getUint32(0, false) === 0x7f454c46 && head[4] === 2 && head[5] === 1) {
    const machine = view.getUint16(18, true);
    if (machine === 62) return "x86_64-unknown-linux-gnu";
    if (machine === 183) return "aarch64-unknown-linux-gnu";
    return undefined;
  }
  // Mach-O 64-bit little-endian (MH_MAGIC_64), cputype at byte 4 (CPU_TYPE_ARM64 = 0x0100000c).
  if (view.getUint32(0, true) === 0xfeedfacf && view.getUint32(4, true) === 0x0100000c) {
    return "aarch64-apple-darwin";
  }
  return undefined;
}

/** The message for a run without `DENORT_BIN` and without `--download`. */
export function missingDenortMessage(targets: readonly Target[]): string {
  const v = Deno.version.deno;
  return [
    `deno compile needs denort, Deno ${v}'s runtime binary, for each target (${targets.join(", ")}), and`,
    `downloads it from dl.deno.land unless DENORT_BIN names one; DENORT_BIN is not set.`,
    `Either: on a machine that reaches dl.deno.land fetch https://dl.deno.land/release/v${v}/denort-<target>.zip,`,
    `unzip it here and run \`DENORT_BIN=/path/to/denort deno task compile\` once per target (the target is read`,
    `from the file); or, where dl.deno.land is reachable, run \`deno task compile --download\`.`,
    `Without a binary, \`deno task bundle\` builds out/llm.js, which runs anywhere with \`deno run -A out/llm.js\`.`,
  ].join("\n");
}

/**
 * Compiles `bundle` for `target` into `output` with `deno compile`; `denort` (a path) is passed on as
 * `DENORT_BIN`, or, when undefined, `deno compile` downloads it.
 * @throws {Error} when `deno compile` fails
 */
export async function compileBundle(
  bundle: string,
  output: string,
  opts: { target: Target; denort?: string },
): Promise<void> {
  const env: Record<string, string> = opts.denort === undefined ? {} : { DENORT_BIN: opts.denort };
  const o = await new Deno.Command(Deno.execPath(), {
    // The bundle imports nothing (packages inlined), so no config, lock file or npm snapshot goes in; -A
    // because the CLI reads models, listens and starts its GPU Worker.
    args: ["compile", "--quiet", "--no-config", "-A", "--target", opts.target, "--output", output, bundle],
    env,
    stdout: "inherit",
    stderr: "inherit",
  }).output();
  if (!o.success) {
    throw new Error(
      `deno compile for ${opts.target} failed (exit ${o.code}): see its output above` +
        (opts.denort === undefined ? "" : `; DENORT_BIN=${opts.denort}`),
    );
  }
}

async function main(args: string[]): Promise<number> {
  const { values } = parseArgs({
    args,
    options: {
      target: { type: "string", multiple: true },
      download: { type: "boolean", default: false },
      "out-dir": { type: "string", default: new URL("out/", ROOT).pathname },
    },
    strict: true,
  });
  for (const t of values.target ?? []) {
    if (!(TARGETS as readonly string[]).includes(t)) {
      console.error(`error: --target ${t} is not one of ${TARGETS.join(", ")}`);
      return 2;
    }
  }
  let targets = (values.target ?? [...TARGETS]) as Target[];
  const denort = Deno.env.get("DENORT_BIN") || undefined;
  if (denort !== undefined) {
    let head: Uint8Array;
    try {
      using f = Deno.openSync(denort);
      head = new Uint8Array(64);
      f.readSync(head);
    } catch (e) {
      console.error(`error: DENORT_BIN=${denort} cannot be read: ${e instanceof Error ? e.message : e}`);
      return 2;
    }
    const target = denortTarget(head);
    if (target === undefined) {
      console.error(
        `error: DENORT_BIN=${denort} is not a denort binary for ${TARGETS.join(", ")} ` +
          `(no x86-64/arm64 ELF or arm64 Mach-O header): unzip denort-<target>.zip and point DENORT_BIN at it`,
      );
      return 2;
    }
    if (values.target !== undefined && !targets.includes(target)) {
      console.error(`error: DENORT_BIN=${denort} is for ${target}, not ${targets.join(", ")}`);
      return 2;
    }
    if (targets.length > 1) console.log(`DENORT_BIN is for ${target}: building that target only`);
    targets = [target];
  } else if (!values.download) {
    console.error(`error: ${missingDenortMessage(targets)}`);
    return 2;
  }
  const outDir = values["out-dir"].replace(/\/?$/, "/");
  const bundle = `${outDir}llm.js`;
  const commit = await checkoutCommit();
  await buildBundle(bundle, { commit });
  for (const target of targets) {
    const output = `${outDir}llm-${target}`;
    await compileBundle(bundle, output, { target, denort });
    if (target === Deno.build.target) {
      // A binary for this machine is run once: the full `deno` CLI given as DENORT_BIN compiles without
      // complaint but ignores the program it carries.
      const o = await new Deno.Command(output, { args: ["--version"], stdout: "piped" }).output();
      const line = new TextDecoder().decode(o.stdout).trim();
      if (!o.success || !line.startsWith("llm ")) {
        throw new Error(
          `${output} --version printed "${line.split("\n")[0]}", not "llm ...": DENORT_BIN must be denort ` +
            `(denort-<target>.zip), not the deno CLI`,
        );
      }
    }
    console.log(`${output}: ${(Deno.statSync(output).size / 1e6).toFixed(1)} MB, commit ${commit}`);
  }
  return 0;
}

if (import.meta.main) {
  try {
    Deno.exit(await main(Deno.args));
  } catch (e) {
    console.error(`error: ${e instanceof Error ? e.message : String(e)}`);
    Deno.exit(1);
  }
}
