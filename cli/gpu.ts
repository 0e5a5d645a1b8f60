/**
 * `mod.ts gpu`: prints the adapter summary, or the reason there is none.
 * @module
 */
import type { Command } from "./command.ts";
import { acquireGpu } from "../engine/mod.ts";

/** The `gpu` command. */
export const command: Command = {
  summary: "print the WebGPU adapter this machine gives (or why there is none)",
  async run(): Promise<number> {
    const gpu = await acquireGpu();
    console.log(gpu.summary);
    gpu.device.destroy();
    return 0;
  },
};
