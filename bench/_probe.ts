/**
 * Shared timing of the issue-bound probes (bench/dot4_probe.ts, bench/lookup_probe.ts): each WGSL source is a
 * 256-invocation kernel writing one word per invocation to binding 0; all run at full occupancy in 4
 * alternating rounds, keeping each one's best time.
 * @module
 */
import { PassTimer } from "./_pass_timer.ts";

/** Invocations per probe dispatch: 1056 workgroups of 256 (8 per SM on the H200's 132). */
export const PROBE_THREADS = 256 * 1056;

/** Best seconds per dispatch of each named kernel source. */
export async function timeProbes(
  device: GPUDevice,
  timestamps: boolean,
  sources: Record<string, string>,
): Promise<Map<string, number>> {
  const out = device.createBuffer({
    size: 4 * PROBE_THREADS,
    usage: GPUBufferUsage.STORAGE | GPUBufferUsage.COPY_SRC,
  });
  const timer = new PassTimer(device, timestamps);
  const pipes = await Promise.all(
    Object.entries(sources).map(async ([name, code]) => {
      const module = device.createShaderModule({ code });
      const pipeline = await device.createComputePipelineAsync({ layout: "auto", compute: { module } });
      const bg = device.createBindGroup({
        layout: pipeline.getBindGroupLayout(0),
        entries: [{ binding: 0, resource: { buffer: out } }],
      });
      return { name, pipeline, bg };
    }),
  );
  const best = new Map<string, number>();
  for (let round = 0; round < 4; round++) {
    for (const p of round % 2 === 0 ? pipes : [...pipes].reverse()) {
      const t = await timer.perRep(
        (pass) => {
          pass.setPipeline(p.pipeline);
          pass.setBindGroup(0, p.bg);
          pass.dispatchWorkgroups(PROBE_THREADS / 256);
        },
        4,
        { warmMs: round === 0 ? 50 : 0 },
      );
      best.set(p.name, Math.min(best.get(p.name) ?? Infinity, t));
    }
  }
  out.destroy();
  return best;
}
