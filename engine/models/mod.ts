/**
 * The architectures: `ARCHES` maps each `general.architecture` string to its {@linkcode Arch}
 * (hyper-parameters, tensor list, file check). Adding one is its file plus one line here (STYLE.md).
 *
 * @example
 * ```ts
 * import { openGguf } from "../gguf.ts";
 * import { archOf } from "./mod.ts";
 * const file = await openGguf("tiny.gguf");
 * const arch = archOf(file.metadata);
 * const hp = arch.readHparams(file.metadata);
 * const check = arch.checkTensors(file, hp); // throws before any upload when the file is wrong
 * console.log(hp.nLayer, check.layouts);
 * ```
 * @module
 */
import { GgufError } from "../errors.ts";
import type { GgufMetadata } from "../gguf.ts";
import { KEYS } from "../names.ts";
import type { Arch, ArchName } from "./_arch.ts";
import { QWEN35MOE } from "./qwen35moe.ts";
import { QWEN3NEXT } from "./qwen3next.ts";

export {
  type Arch,
  type ArchName,
  convChannels,
  DELTANET_LAYOUTS,
  type DeltaNetLayout,
  FLOAT_TYPES,
  type Hparams,
  MATRIX_TYPES,
  type TensorCheck,
  type TensorSpec,
} from "./_arch.ts";

/** Every supported architecture by its `general.architecture` string. */
export const ARCHES: Readonly<Record<ArchName, Arch>> = {
  qwen35moe: QWEN35MOE,
  qwen3next: QWEN3NEXT,
};

/** True when `name` is a supported architecture. */
export function isArchName(name: string): name is ArchName {
  return Object.hasOwn(ARCHES, name);
}

/**
 * The architecture a file declares in `general.architecture`.
 * @throws {GgufError} code `bad_value` when the key is missing or names an unsupported architecture
 */
export function archOf(meta: GgufMetadata): Arch {
  const name = meta.has(KEYS.architecture) ? meta.getString(KEYS.architecture) : undefined;
  if (name === undefined || !isArchName(name)) {
    throw new GgufError(
      "bad_value",
      `Metadata ${KEYS.architecture} is ${
        name === undefined ? "missing" : `"${name}"`
      } but this engine runs ` +
        `${Object.keys(ARCHES).join(", ")}: use a GGUF of a supported model (file ${meta.path})`,
      { path: meta.path },
    );
  }
  return ARCHES[name];
}
