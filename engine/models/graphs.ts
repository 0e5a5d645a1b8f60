/**
 * What each architecture adds to the shared layer loop (`_hybrid.ts`), by its `general.architecture`: the
 * stage builds its graphs through this table, so no code outside an architecture's file asks which one it is.
 * @module
 */
import type { ArchName } from "./_arch.ts";
import type { HybridModel } from "./_hybrid.ts";
import { QWEN35MOE_GRAPH } from "./qwen35moe.ts";
import { QWEN3NEXT_GRAPH } from "./qwen3next.ts";

/** The graph hooks of every supported architecture. */
export const GRAPHS: Readonly<Record<ArchName, HybridModel>> = {
  qwen35moe: QWEN35MOE_GRAPH,
  qwen3next: QWEN3NEXT_GRAPH,
};
