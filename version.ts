/**
 * What build this is: the release version, the git commit and the wire protocol version. `--version` prints
 * it, and a split head and worker exchange it in their hellos.
 *
 * The commit comes from, in order: the value a bundle or compiled binary embeds at build time
 * ({@linkcode embedBuild}, called by the bundle's entry before anything else runs); `git rev-parse` in the
 * folder of this file when it runs from a checkout; the environment variable `LLM_COMMIT` (a copy of a tree
 * without its `.git`, such as the device runs of `tools/h200_plan.sh`); else `"unknown"`.
 *
 * @example
 * ```ts
 * import { buildInfo, versionLine } from "./version.ts";
 * console.log(versionLine()); // llm 0.1.0 (commit 5f937e9a1b2c, wire protocol 1)
 * const { version, commit } = buildInfo(); // the hello's `build` field
 * ```
 * @module
 */
import { PROTOCOL_VERSION } from "./wire/mod.ts";

/** The release version of this code (semver); raise it with each release. */
export const VERSION = "0.1.0";

/** The identity of a build. */
export interface BuildInfo {
  /** Release version ({@linkcode VERSION}). */
  readonly version: string;
  /** Git commit (12 hex digits), or `"unknown"` when neither embedded nor readable from a checkout. */
  readonly commit: string;
  /** Wire protocol version of the stage link ({@linkcode PROTOCOL_VERSION} of `wire/`). */
  readonly protocol: number;
}

let commit: string | undefined;

/**
 * Records the commit a bundle or binary was built from; its entry calls this before any command runs.
 * @throws {TypeError} when `build.commit` is not 7-40 hex digits or `"unknown"`
 */
export function embedBuild(build: { readonly commit: string }): void {
  if (!/^([0-9a-f]{7,40}|unknown)$/.test(build.commit)) {
    throw new TypeError(`Embedded commit "${build.commit}" is not 7-40 hex digits or "unknown": rebuild`);
  }
  commit = build.commit;
}

/** The commit of the checkout this file lies in, or `"unknown"` (not a checkout, no git, no permission). */
function commitFromCheckout(): string {
  const here = new URL(".", import.meta.url);
  if (here.protocol !== "file:") return "unknown";
  try {
    const out = new Deno.Command("git", {
      args: ["-C", here.pathname, "rev-parse", "--short=12", "HEAD"],
      stdout: "piped",
      stderr: "null",
    }).outputSync();
    const text = new TextDecoder().decode(out.stdout).trim();
    return out.success && /^[0-9a-f]{7,40}$/.test(text) ? text : "unknown";
  } catch (e) {
    // No git on the box, or run without --allow-run: the build is then simply not identified.
    if (
      e instanceof Deno.errors.NotFound || e instanceof Deno.errors.NotCapable ||
      e instanceof Deno.errors.PermissionDenied
    ) return "unknown";
    throw e;
  }
}

/** `LLM_COMMIT` when it holds 7-40 hex digits, else `"unknown"` (unset, or no permission to read it). */
function commitFromEnv(): string {
  try {
    const v = Deno.env.get("LLM_COMMIT") ?? "";
    return /^[0-9a-f]{7,40}$/.test(v) ? v : "unknown";
  } catch (e) {
    if (e instanceof Deno.errors.NotCapable || e instanceof Deno.errors.PermissionDenied) return "unknown";
    throw e;
  }
}

/** This build's version, commit and wire protocol version. */
export function buildInfo(): BuildInfo {
  if (commit === undefined) {
    const fromCheckout = commitFromCheckout();
    commit = fromCheckout === "unknown" ? commitFromEnv() : fromCheckout;
  }
  return { version: VERSION, commit, protocol: PROTOCOL_VERSION };
}

/** The line `--version` prints: `llm 0.1.0 (commit 5f937e9a1b2c, wire protocol 1)`. */
export function versionLine(): string {
  const b = buildInfo();
  return `llm ${b.version} (commit ${b.commit}, wire protocol ${b.protocol})`;
}
