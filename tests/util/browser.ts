/**
 * The real browser the dashboard tests drive: Debian's `chromium` (CI's .ci/run installs it).
 * @module
 */

/** The chromium binary: `CHROMIUM_PATH`, else the usual Debian and Ubuntu paths. */
export function chromiumPath(): string {
  const candidates = [
    Deno.env.get("CHROMIUM_PATH"),
    "/usr/bin/chromium",
    "/usr/bin/chromium-browser",
    "/usr/bin/google-chrome",
  ].filter((p): p is string => p !== undefined && p !== "");
  for (const p of candidates) {
    try {
      if (Deno.statSync(p).isFile) return p;
    } catch (e) {
      if (!(e instanceof Deno.errors.NotFound)) throw e;
    }
  }
  throw new Error(
    `No chromium found (looked at ${candidates.join(", ")}): the dashboard test needs a real browser. ` +
      "Install Debian's package: apt-get install -y chromium (CI's .ci/run does), or set CHROMIUM_PATH",
  );
}
