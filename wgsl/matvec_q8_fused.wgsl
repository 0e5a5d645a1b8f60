// matvec_q8_fused: matvec_q8 with quantize_q8 in its prologue. Every workgroup rounds x (f32, RMSNorm-ed first
// with NORM) to int8 per 32-element chunk into workgroup memory, by lib/q8x.wgsl as quantize_q8 does (the
// same bits), then runs matvec_q8's body (lib/q8dot.wgsl) on it: one dispatch instead of two, each workgroup
// re-reading x's K floats (from L2) instead of a dependent dispatch's start-up.
//
// Bindings:
//   params    uniform Params (lib/q8dot.wgsl; x_off: the element offset of x[0], a multiple of 4)
//   weights   array<u32>        W ne=[K, N]; row n starts at byte w_off + n·row_bytes
//   weights2  array<vec2<u32>>  the same buffer (IQ4_XS: w_off % 8 == 0)
//   x         array<vec4<f32>>  ne=[K] from element x_off
//   nw        array<vec4<f32>>  ne=[K]  RMSNorm weight (NORM; otherwise bind any buffer of ≥ 16 bytes)
//   xn        array<vec4<f32>>  read_write: workgroup 0 writes the normed x at x_off (NORM; otherwise any
//             unaliased buffer)
//   xo        array<u32>        read_write: workgroup 0 writes the int8 x as quantize_q8 would (K/4 + K/32
//             words), for the mat-vecs after this one that read the same x, and for tests
//   y         array<f32>        element n at y_off + n
// Value: as matvec_q8 of quantize_q8's output.
// Constants: matvec_q8's (TYPE, TEAM, ROWS, ACC, RED, COPIES, GROUPS), const NORM: u32 (0 or 1), const EPS: f32
//   (the norm's epsilon), const KC: u32 (K / 32, the chunks held in workgroup memory).
// Workgroup memory: matvec_q8's + 36·KC + 1024 (the norm's partial sums) bytes.

@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var<storage, read> weights: array<u32>;
@group(0) @binding(2) var<storage, read> weights2: array<vec2<u32>>;
@group(0) @binding(3) var<storage, read> x: array<vec4<f32>>;
@group(0) @binding(4) var<storage, read> nw: array<vec4<f32>>;
@group(0) @binding(5) var<storage, read_write> xn: array<vec4<f32>>;
@group(0) @binding(6) var<storage, read_write> xo: array<u32>;
@group(0) @binding(7) var<storage, read_write> y: array<f32>;

const WG: u32 = 256u;
const LAYOUT: u32 = select(0u, 1u, TYPE == 23u);

var<workgroup> xw: array<vec4<u32>, 2u * KC>;
var<workgroup> sw: array<f32, KC>;

fn x_chunk(c: u32) -> XChunk {
  return XChunk(xw[2u * c], xw[2u * c + 1u], sw[c]);
}

@compute @workgroup_size(256)
fn main(
  @builtin(local_invocation_index) lid: u32,
  @builtin(workgroup_id) wid: vec3<u32>,
  @builtin(num_workgroups) nwg: vec3<u32>,
) {
  let wg = wid.y * nwg.x + wid.x;
  q8dot_table(lid);
  let scale = q8x_scale(lid, params.x_off, params.k);
  for (var c = lid; c < KC; c += WG) {
    let xb = (params.x_off >> 2u) + 8u * c;
    let q = q8x_chunk(xb, c, scale);
    xw[2u * c] = vec4<u32>(q.w[0], q.w[1], q.w[2], q.w[3]);
    xw[2u * c + 1u] = vec4<u32>(q.w[4], q.w[5], q.w[6], q.w[7]);
    sw[c] = q.d;
    if (wg == 0u) {
      for (var m = 0u; m < 8u; m++) {
        if (NORM == 1u) {
          xn[xb + m] = q.v[m];
        }
        xo[8u * c + m] = q.w[m];
      }
      xo[8u * KC + c] = bitcast<u32>(q.d);
    }
  }
  workgroupBarrier();
  q8dot_groups(wg, lid);
}
