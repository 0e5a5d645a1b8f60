/**
 * The entry of the single-file bundle `out/llm.js` (built by `tools/bundle.ts`): one file that is both the
 * CLI and the engine's Worker module.
 *
 * In the source tree the engine service starts its Worker from `new URL("./worker.ts", import.meta.url)`.
 * In a bundle every module's `import.meta.url` is the bundle's, so that URL names a file that does not
 * exist. The bundle therefore starts the Worker from itself: on the main thread this entry swaps exactly
 * that URL for the bundle's own before the CLI runs, and inside a Worker it runs the engine worker module
 * instead of the CLI. Messages that arrive before the worker module has set its handler are held and
 * replayed, so none is lost.
 * @module
 */
import { embedBuild } from "../version.ts";

/** What the bundle script embeds: the commit the bundle was built from. */
export interface EmbeddedBuild {
  /** Git commit (7-40 hex digits) or `"unknown"`. */
  readonly commit: string;
}

interface WorkerScopeLike {
  onmessage: ((e: MessageEvent) => void) | null;
  dispatchEvent(e: Event): boolean;
}

function inWorker(): boolean {
  const scope = (globalThis as { WorkerGlobalScope?: abstract new () => unknown }).WorkerGlobalScope;
  return scope !== undefined && globalThis instanceof scope;
}

/** Replaces the global `Worker` by one that starts the engine worker from this bundle. */
function redirectEngineWorker(): void {
  const engineWorker = new URL("./worker.ts", import.meta.url).href;
  const self = import.meta.url;
  const Base = globalThis.Worker;
  globalThis.Worker = class extends Base {
    constructor(url: string | URL, opts?: WorkerOptions) {
      super(new URL(url).href === engineWorker ? self : url, opts);
    }
  };
}

/** Runs the bundle: the engine worker inside a Worker, else the CLI on `Deno.args`. */
export async function runBundle(build: EmbeddedBuild): Promise<void> {
  embedBuild(build);
  if (inWorker()) {
    const scope = globalThis as unknown as WorkerScopeLike;
    const held: MessageEvent[] = [];
    const hold = (e: MessageEvent) => void held.push(e);
    scope.onmessage = hold;
    await import("../engine/serve/worker.ts");
    if (scope.onmessage === hold) scope.onmessage = null;
    for (const e of held) scope.dispatchEvent(new MessageEvent("message", { data: e.data }));
    return;
  }
  redirectEngineWorker();
  const { main } = await import("../mod.ts");
  Deno.exit(await main(Deno.args));
}
