/**
 * Preload for `deno test --preload bench/_shader_dump.ts` (or `deno run`): every WGSL module a process
 * creates is written to `$SHADER_DUMP_DIR/<hash>.wgsl` once, and each creation appended to
 * `$SHADER_DUMP_DIR/index.jsonl` (label, hash, main module), for `bench/compile_all.ts` to time each unique
 * variant's compile. Changes nothing else.
 * @module
 */
const dir = Deno.env.get("SHADER_DUMP_DIR");
if (dir && typeof GPUDevice !== "undefined") {
  Deno.mkdirSync(dir, { recursive: true });
  const create = GPUDevice.prototype.createShaderModule;
  GPUDevice.prototype.createShaderModule = function (this: GPUDevice, desc: GPUShaderModuleDescriptor) {
    // FNV-1a, 32-bit, twice (two offsets): a name, not a defence
    let h1 = 0x811c9dc5;
    let h2 = 0x01000193;
    for (let i = 0; i < desc.code.length; i++) {
      const c = desc.code.charCodeAt(i);
      h1 = Math.imul(h1 ^ c, 0x01000193) >>> 0;
      h2 = Math.imul(h2 ^ c, 0x811c9dc5) >>> 0;
    }
    const hash = h1.toString(16).padStart(8, "0") + h2.toString(16).padStart(8, "0");
    const file = `${dir}/${hash}.wgsl`;
    try {
      Deno.writeTextFileSync(file, desc.code, { createNew: true });
    } catch (e) {
      if (!(e instanceof Deno.errors.AlreadyExists)) throw e;
    }
    const line = JSON.stringify({ label: desc.label ?? "", hash, main: Deno.mainModule });
    Deno.writeTextFileSync(`${dir}/index.jsonl`, line + "\n", { append: true });
    return create.call(this, desc);
  };
}
