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
//   z         array<vec4<f32>>  GNORM: the gate input of the gated norm, ne=[K] from element x_off (otherwise
//             bind any buffer of >= 16 bytes)
// Value: as matvec_q8 of quantize_q8's output.
// GNORM = D_V > 0 (NORM 0): x is a gated DeltaNet's o, and the prologue first applies its gated RMSNorm (spec
//   qwen3next.md §8.7) per head of D_V elements: v = o · (1 / sqrt(Σ_head o² / D_V + EPS)) · nw[i mod D_V] ·
//   silu(z), with nw the D_V-element ssm_norm weight, in gdn_chunk_norm's order of operations (each head's
//   squares as 64 partials of elements j, j + 64, ..., summed by halving), so the int8 x has the bits of
//   gdn_chunk_norm then quantize_q8. D_V % 64 == 0, K % D_V == 0.
// Constants: matvec_q8's (TYPE, TEAM, ROWS, ACC, RED, COPIES, GROUPS), const NORM: u32 (0 or 1), const EPS: f32
//   (the norm's epsilon), const KC: u32 (K / 32, the chunks held in workgroup memory), const GNORM: u32 (0, or
//   D_V).
// Workgroup memory: matvec_q8's + 36·KC + 1024 (the norm's partial sums) + (GNORM) 260·K/D_V bytes.

@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var<storage, read> weights: array<u32>;
@group(0) @binding(2) var<storage, read> weights2: array<vec2<u32>>;
@group(0) @binding(3) var<storage, read> x: array<vec4<f32>>;
@group(0) @binding(4) var<storage, read> nw: array<vec4<f32>>;
@group(0) @binding(5) var<storage, read_write> xn: array<vec4<f32>>;
@group(0) @binding(6) var<storage, read_write> xo: array<u32>;
@group(0) @binding(7) var<storage, read_write> y: array<f32>;
@group(0) @binding(8) var<storage, read> z: array<vec4<f32>>;

const WG: u32 = 256u;
const LAYOUT: u32 = select(0u, 1u, TYPE == 23u);

var<workgroup> xw: array<vec4<u32>, 2u * KC>;
var<workgroup> sw: array<f32, KC>;
// GNORM: the 64 partial sums of squares of each head (halved in place), then each head's scale.
const GN_HEADS: u32 = select(1u, 32u * KC / max(GNORM, 1u), GNORM > 0u);
var<workgroup> gn_red: array<f32, 64u * GN_HEADS>;
var<workgroup> gn_scale: array<f32, GN_HEADS>;

// GNORM: every head's scale into gn_scale (every invocation calls it: barriers).
fn gnorm_scales(lid: u32) {
  for (var i = lid; i < 64u * GN_HEADS; i += WG) {
    let h = i / 64u;
    let j = i % 64u;
    var s = 0.0;
    for (var e = j; e < GNORM; e += 64u) {
      let at = params.x_off + h * GNORM + e;
      let v = x[at >> 2u][at & 3u];
      s += v * v;
    }
    gn_red[i] = s;
  }
  workgroupBarrier();
  for (var o = 32u; o > 0u; o >>= 1u) {
    for (var i = lid; i < 64u * GN_HEADS; i += WG) {
      if (i % 64u < o) {
        gn_red[i] += gn_red[i + o];
      }
    }
    workgroupBarrier();
  }
  for (var h = lid; h < GN_HEADS; h += WG) {
    gn_scale[h] = 1.0 / sqrt(gn_red[64u * h] / f32(GNORM) + EPS);
  }
  workgroupBarrier();
}

// GNORM: chunk c of x (quad index xb) through the gated norm, rounded (q8x_chunk's steps on the normed values).
fn gnorm_chunk(xb: u32, c: u32) -> Q8xChunk {
  var out: Q8xChunk;
  var amax = 0.0;
  let scale = gn_scale[32u * c / GNORM];
  for (var m = 0u; m < 8u; m++) {
    let zc = z[xb + m];
    let v = x[xb + m] * scale * nw[(8u * c + m) % (GNORM / 4u)] * (zc / (1.0 + exp(-zc)));
    out.v[m] = v;
    amax = max(amax, q8x_amax4(v));
  }
  q8x_fill(&out, amax);
  return out;
}

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
  if (GNORM > 0u) {
    gnorm_scales(lid);
  }
  for (var c = lid; c < KC; c += WG) {
    let xb = (params.x_off >> 2u) + 8u * c;
    var q: Q8xChunk;
    if (GNORM > 0u) {
      q = gnorm_chunk(xb, c);
    } else {
      q = q8x_chunk(xb, c, scale);
    }
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
