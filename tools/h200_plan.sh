#!/usr/bin/env bash
# The measurements the open issues wait for, as named steps for one call of the device tool on the lent H200
# (docs/PERF.md records what they print). Prepare once here: `bash ../shared/tools/device-prep.sh` (after
# `npm install`); before each call `git rev-parse --short=12 HEAD > .devcfg/commit` (the bench lines' commit);
# then call the device tool with carry [".gl", ".bin", ".denodir", ".devcfg"] and the command
#
#   bash tools/h200_plan.sh tests attention decode
#
# Every step ran on 2026-12-05 (docs/PERF.md; the twenty-third to twenty-fifth sessions' calls on an H100).
# The fortieth session's H100 calls (the then `routernorm` / `routerquick` steps) measured the router's column
# norms (matvec NORM 2) slower than the norm's own dispatch, and the path was removed (docs/PERF.md).
# The forty-first session's H100 calls (`takenorm`, `confirm`) measured the router taking the post-attention norm:
# 16 slots +2.3%, 5.09-5.24x. What the next call should measure first: `confirm` on an H200 (every #20 goal at
# the default; one stream's HTTP TTFT read +16.7 ms over the engine's on that H100). The thirty-eighth session's H100 call (docs/PERF.md) put llama.cpp's
# CUDA batched bench and this engine on one file in one call (`llamaref`: 8 / 16 slots 4.08x / 5.02x, 1.20x /
# 1.31x llama.cpp), kept gdn_step's batched SPLIT 4 (`gdnquick`) and the prep's written-out solve on GPUs
# (`prepsolve`). That session built llama.cpp from the 4.5 MB .llama of the time in a call of its own (`bash
# tools/llama_ref.sh build 560`, carry .devcfg .llama, 221 s); `llama_ref.sh pack` now writes 1.5 MB, and the
# tree, .bin and .llama come to about 66.3 MB of the 67.1 MB (64 MiB) limit, so `llamaref` should build and
# bench in one call with carry [".gl", ".bin", ".denodir", ".devcfg", ".llama"] (not yet tried on a device).
# Where the engine's remaining ~17 ms for a fresh width go: `LLM_TRACE_DECODE=1` with `servewidth` (the `first-chunk`
# lines: graphMs, parts, firstPartMs).
# `servesolo` with `H200_TREE=.oldtree` (the same tree with the runner's `#lone` off) for the lone path's A/B.
# Then:
# `bits` after any change to a batched kernel, `batched` against
# the last tree's (`H200_TREE=.oldtree`), then `serve18`, `split3` and `combine smallchunk` after changes to
# the batched step or the expert kernels (the twenty-sixth session measured serve18 with the rewind points by
# copy_regions: 8 streams over HTTP 0.975x, one stream's TTFT +14.1 ms). The benches and the commands they
# start take int8 x for every mat-vec by default since the twenty-eighth session's `int8b` (1, 8, 16 slots: 248,
# 882, 1,088 tok/s on an H100 against 236, 846, 1,025 with --int8-experts, the default before it, which took
# int8 x for the expert passes alone since `int8experts`); the steps' earlier numbers are f32 x (--f32-experts). `H200_TREE=.oldtree` runs the steps on an
# older tree carried as an ignored folder (engine, wgsl, the benches used, mod.ts, version.ts,
# head.imports.json; under 1.5 MB: the carry limit is 64 MiB with the tree), for an A/B in one call.
# A warm machine keeps /tmp, so the model is written once per machine (~25 s); one call of
# `attention decode knobs` took 199 s, `split sampled tests serve` 328 s.
#
# `H200_PLAN_LOCAL=1 bash tools/h200_plan.sh tests` runs a step here instead (lavapipe; a dry run of the commands).
# Each step's output goes to $OUT/<step>.log (and to stdout); a step is skipped when fewer seconds are left of
# the call's budget (H200_BUDGET_S, default 570: the tool stops a command at 600 s) than the step's limit
# below, so a call ends with its logs instead of being killed. Steps:
#   tests      early reads, batched frames, stage ids and in-pass sampled draws, split ≡ unsplit (greedy,
#              sampled, drafts) on NVIDIA's Vulkan (the benches do not check outputs)
#   attention  #24: flash-attention prefill at depths 0, 2k, 8k, 32k (2,048-token chunks)
#   decode     #20: solo and 8/16-slot decode with prefill of 2,048 (readback batch 8), then the same with
#              --batch 2 (early reads: does a 2-step readback cost throughput?)
#   knobs      #20: 8 slots with --int8, then with --combine-norm-min-rows 17, then sampled (--temp 0.8)
#   int8experts  #20: solo, 8 and 16 slots with the default int8 x for the expert passes alone, beside
#              --f32-experts (f32 x everywhere, the exact path), in one call
#   split      #19: unsplit, 2 stages, 8 streams, pipelines 2 and 1; then the same with LLM_EARLY_READ=0
#   sampled    #19: the same at temperature 0.8 (the last stage's sampler in the pass)
#   serve      #20: HTTP and direct at 1 and 8 streams with a late 2,048-token prompt; direct with --batch 2
#   servesampled  the serve step's 1 and 8 streams sampled (--temp 0.8): the decode step's samplers' cost
#   graphs     graph building per kind on the 40-layer model (a cold slot's TTFT share)
#   draft      drafted single stream: prompt lookup and the draft cache, --min 2,4,6
#   combine    #20: 8 and 16 slots with the default combineNormMinRows (17: batched steps norm on their own)
#              and with 2 (their residual adds write the next norm, one workgroup per row)
#   trace2     #20: 1 and 2 streams over HTTP and direct with LLM_TRACE_DECODE=1 (the head's trace follows the
#              http lines): when each request reaches the service and the worker, its pieces and turns (2 streams
#              over HTTP waited +62 ms for the first id against the direct path's +14)
#   smallchunk #20/#24: prefill in chunks of 64 and 256 tokens, experts grouped (default) and per column
#   late       #20: a 2,048-token prompt arriving while 7 streams generate, its pieces sized by time
#              (--piece-gap 2.5, the default), fixed 256-token pieces (0), and 3
#   pieces     #20: one prompt piece's time by width (128..1024 at depth 1024), its first run (graph build,
#              pipelines of a new width) against warm runs, and a joining rest's (rows last): the pacer's inputs
#   msplit     #20: the prefill matmul of thin chunks (256 and 512 tokens) with K split into 2, 4, 8 runs beside
#              the engine's choice (ssm_out's 128 tiles of 64 x 64 at 256 tokens fill one wave of 132 SMs thinly)
#   split3     #19's whole table in one run: unsplit, 2 and 3 stages, --pipeline 1, drafts 0 and 7 with the
#              draft cache
#   lateparts  #20: the late prompt with its pieces in parts (chunk-wide pieces, a few layers per round; the
#              default) against whole pieces (--piece-parts 0)
#   batched    #20: solo, 8 and 16 slots (int8 x for the experts), the first half of int8experts
#   restprofile  #20: the profile of one slot's prefill chunk of 8, 56 and 64 tokens (the service's split of a
#              64-token prompt: a 56-token piece, the prompt-boundary snapshot, the 8-token rest; DECODE_FLAGS:
#              more flags for its runs, e.g. --int8-experts for an older tree's numerics)
#   rest8      restprofile's 8-token chunk alone (a short call; DECODE_FLAGS as there)
#   confirm    #20: solo, 2, 4, 8 and 16 slots, then solo, 8 and 16 twice more (the ratios' spread), bits,
#              then serve18 at 1, 2, 4 and 8 streams and late1 (the service and HTTP under the defaults);
#              about 160 s once the model is written (another 20 s)
#   rowsq      #20: solo, 8 and 16 slots with the defaults (DECODE_FLAGS: the knobs that give an older tree's
#              run the same numerics and ROWS, for an A/B with H200_TREE)
#   takenorm   #20: 1, 8 and 16 slots with the router taking the post-attention norm (the default) and with
#              --router-norm off (the norm's own dispatch, or the router's prologue at one token), twice in
#              turn, then batch_bits at 16 and 8 slots
#   rowsq4     #20: the same with matvec_q8b at ROWS 4 (--q8b-rows 4), and batch_bits with the defaults and at
#              ROWS 4 (bits at real K; soloDigest)
#   mvsweep    #20: the dense mat-vecs of a batched step alone at 8 and 16 columns (bench/matvec.ts
#              --batch-sweep): XR 2 by ROWS and UNROLL beside the old XR 1 default (about 150 s)
#   rows       #20: 8 and 16 slots with the batched int8-x expert passes at ROWS 2 and 4 (the same bits)
#   moeq8      #20: a batched step's expert passes alone (bench/moe.ts --tokens 8, 16), int8 x by TEAM x ROWS
#   stoppoints #20: 8 and 16 slots without and with an abort signal per item (--stop-points: a rewind point
#              per slot and readback batch, as the service's steps take them)
#   late1      #20: the late 2,048-token prompt among 7 streams, the service's defaults (pieces in parts)
#   serve18    #20: HTTP and direct at 1 and 8 streams against the engine, no late prompt
#   q8bsweep   #20: matvec_q8b alone on the batched step's dense shapes at 8 and 16 columns, ROWS 1 to 4, the
#              K-quants with and without XSUM (which ROWS per shape; the bits do not depend on ROWS or XSUM)
#   servewidth #20: one stream over HTTP, direct and the engine, with prompts of widths no graph has yet
#              (`ttftNewWidthMsMedian`: the chunk graph built on the way, sent to the GPU layer by layer)
#   q8c        #20: batch_bits at 8 and 16 slots, then 1, 8 and 16 slots
#   gdnsplit   #20: the batched steps' gdn_step SPLIT (StageOptions.gdnBatchedSplit; 4, the solo step's, by
#              default): the kernel alone at 8 and 16 columns (without its gated-norm dispatch), 8 and 16
#              slots at SPLIT 2, 8, 4, 2, 8, and batch_bits at 16 slots with SPLIT 2 and 8
#   gdnquick   gdnsplit's whole steps once (SPLIT 2, 8, 4) and its bits, for a short call
#   llamaref   #20: llama.cpp's llama-batched-bench (CUDA, built here from the carried .llama: tools/llama_ref.sh)
#              and bench/decode.ts at 1, 2, 4, 8 and 16 slots on the same file; a call that ends before the build
#              does leaves it running for the next call (carry .llama too)
#   prepsolve  gdn_chunk_prep's forward substitution written out (GPUs' default) against COMPACT_SOLVE's loops
#              (CPU adapters' default): the prep variants at 512 and 2,048 tokens, and the chunked layer both ways
#   servelevels  #20: the service at the levels: HTTP and direct at 1, 2, 4, 8 and 16 streams against the engine
#   servelate  servelevels, then the late 2,048-token prompt among 7 streams (direct)
#   servequick HTTP alone at 1, 2, 4 and 8 streams against the engine (a short call)
#   latequick  the late 2,048-token prompt among 7 streams alone (direct)
#   servesolo  one stream 7 times in turn over HTTP, directly and in the engine (medians; the service's piece
#              order timed in the engine), then 2 and 8 streams
#   servetrace servesolo's one stream alone with LLM_TRACE_DECODE=1: the runner's idle steps (idle-step: how
#              long each took) and what a request waited for one (idle-wait), beside its first chunk's trace
#   serve8     #20: 8 streams through the service (direct) against the engine, nothing else
#   trace      #20: 8 streams through the service (direct) with LLM_TRACE_DECODE=1: each landed batch, decode
#              call and runner turn on stderr, beside the engine's own batched run
#   gmvq       the gmv step's kernels at 64 and 256 tokens and its 256-token chunks, for a short call
#   bits       batched steps ≡ solo steps bit for bit on the 35B-A3B (bench/batch_bits.ts, 4 slots, int8 and
#              f32 experts): the test models' K = 256 cannot show a TEAM that follows a dispatch's rows
#   int8b      #20: int8 x for every mat-vec (the default since the twenty-eighth session; batched steps run
#              matvec_q8b, one dispatch per part for all columns) against --int8-experts (the old default) at
#              1, 8 and 16 slots, and its batched ≡ solo bits at real K
#   gmv        #20: thin chunks' experts as grouped mat-vecs (moe_gmv): its float64 test on NVIDIA, the kernels
#              alone beside moe_matmul and per column (64, 256, 512 tokens, with a TEAM x ROWS x CT sweep), and
#              prefill of 512 tokens in chunks of 64 and 256, default against --gmv-max 0
# The model is the 35B-A3B-shaped IQ4_XS file the benches synthesize (seed 7; MODEL, written on first use).
set -uo pipefail
root=$(pwd)
out=${OUT:-/tmp/h200_out}
mkdir -p "$out"
budget=${H200_BUDGET_S:-570}
model=${MODEL:-/tmp/bench-35b-a3b-iq4_xs.gguf}

if [ -n "${H200_PLAN_LOCAL:-}" ]; then
  # A dry run of the plan's commands on this machine (lavapipe): the checkout's Deno and config.
  D="$root/node_modules/.bin/deno run -A"
  synth_root=$root
  T="$root/node_modules/.bin/deno test -A"
else
  for f in .gl/*.deb; do dpkg -x "$f" / >/dev/null; done
  ldconfig
  export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
  export __EGL_VENDOR_LIBRARY_FILENAMES=/usr/local/nvidia/share/glvnd/egl_vendor.d/10_nvidia.json
  export DENO_DIR=$root/.denodir NO_COLOR=1 DENO_NO_UPDATE_CHECK=1
  xz -dc .bin/deno.xz > /tmp/deno && chmod +x /tmp/deno
  # The tree runs from a copy whose deno.json is the device's (the head's npm imports only, no lock file).
  rm -rf /tmp/t && mkdir -p /tmp/t
  # H200_TREE: another tree to run (an older commit's files, carried as an ignored folder such as .oldtree).
  (cd "${H200_TREE:-.}" && cp -r mod.ts version.ts head.imports.json engine wgsl bench cli server wire tools tests \
    /tmp/t/ 2>/dev/null)
  cp .devcfg/deno.json /tmp/t/deno.json
  # The model is always written by this tree's synth: a pruned older tree may lack what mod.ts imports.
  rm -rf /tmp/tsynth && mkdir -p /tmp/tsynth
  cp -r mod.ts version.ts head.imports.json engine wgsl cli server wire /tmp/tsynth/ 2>/dev/null
  cp .devcfg/deno.json /tmp/tsynth/deno.json
  cd /tmp/t || exit 1
  D="/tmp/deno run --cached-only -A"
  synth_root=/tmp/tsynth
  T="/tmp/deno test --cached-only -A"
fi
# On the device the commit comes from .devcfg/commit, which the caller writes here before the call (`git
# rev-parse --short=12 HEAD > .devcfg/commit`), so the bench lines name it: the device's copy of the tree may
# carry a .git of another commit (a call of 2026-12-05 named 7346b40 for a tree at e613f99).
if [ -n "${H200_TREE:-}" ] && [ -s "$root/$H200_TREE/.commit" ]; then
  git_rev=$(cat "$root/$H200_TREE/.commit")
elif [ -z "${H200_PLAN_LOCAL:-}" ] && [ -s "$root/.devcfg/commit" ]; then
  git_rev=$(cat "$root/.devcfg/commit")
else
  git_rev=$(cd "$root" && git rev-parse --short=12 HEAD 2>/dev/null || echo unknown)
fi
export LLM_COMMIT=$git_rev BENCH_COMMIT=$git_rev
echo "h200_plan: tree $git_rev, steps: $*, budget ${budget}s"
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv,noheader 2>/dev/null

# run STEP LIMIT_S COMMAND...: the command under `timeout`, logged, unless the budget has no LIMIT_S left.
run() {
  local step=$1 limit=$2
  shift 2
  local left=$((budget - SECONDS))
  if [ "$left" -lt "$limit" ]; then
    echo "== $step: skipped ($left s left, needs $limit): $*" | tee -a "$out/$step.log"
    return 0
  fi
  echo "== $step ($limit s): $*" | tee -a "$out/$step.log"
  local t0=$SECONDS
  timeout "$limit" "$@" 2>&1 | tee -a "$out/$step.log"
  echo "== $step: rc ${PIPESTATUS[0]} after $((SECONDS - t0)) s" | tee -a "$out/$step.log"
}

# The model first, once (15-25 s on the lent machines; a limit over the call's budget would skip it and leave
# every bench after it without its file): the benches below all read it.
ensure_model() {
  [ -f "$model" ] && return 0
  run model 90 $D "$synth_root/mod.ts" synth --arch qwen35moe --preset 35b-a3b --quant iq4_xs --seed 7 \
    --out "$model"
}

# gdn_splits STEP LIMIT "SPLITS": 8 and 16 slots at each gdn_step SPLIT in turn (StageOptions.gdnBatchedSplit),
# then batch_bits at 16 slots with SPLIT 2 and 8.
gdn_splits() {
  local step=$1 limit=$2 s
  for s in $3; do
    run "$step" "$limit" $D bench/decode.ts --model "$model" --prompt 64 --n 128 --prefill 64 --chunk 64 \
      --slots 8,16 --gdn-split "$s"
  done
  for s in 2 8; do
    run "$step" 50 $D bench/batch_bits.ts --model "$model" --slots 16 --gdn-split "$s"
  done
}

for step in "$@"; do
  case $step in
    tests)
      run tests 240 $T engine/gpu/readback_test.ts tests/stage_ids_test.ts tests/split_batch_test.ts \
        tests/chunk_exact_test.ts tests/split_draft_test.ts
      ;;
    attention)
      run attention 150 $D bench/attention.ts --kv f32 --prefill-only --depths 0,2048,8192,32768 --chunk 2048
      ;;
    decode)
      ensure_model
      run decode 200 $D bench/decode.ts --model "$model" --prompt 64 --n 128 --prefill 2048 --chunk 2048 \
        --slots 1,8,16
      run decode 150 $D bench/decode.ts --model "$model" --prompt 64 --n 128 --prefill 64 --chunk 64 \
        --slots 1,8 --batch 2
      ;;
    knobs)
      ensure_model
      run knobs 150 $D bench/decode.ts --model "$model" --prompt 64 --n 128 --prefill 64 --chunk 64 --slots 8 \
        --int8-experts
      run knobs 150 $D bench/decode.ts --model "$model" --prompt 64 --n 128 --prefill 64 --chunk 64 --slots 8 \
        --combine-norm-min-rows 17
      run knobs 150 $D bench/decode.ts --model "$model" --prompt 64 --n 128 --prefill 64 --chunk 64 --slots 1,8 \
        --temp 0.8
      ;;
    split)
      ensure_model
      run split 240 $D bench/split.ts --model "$model" --stages 1,2 --slots 8 --n 128 --pipelines 2,1
      LLM_EARLY_READ=0 run split 200 $D bench/split.ts --model "$model" --stages 2 --slots 8 --n 128 --pipelines 2
      ;;
    sampled)
      ensure_model
      run sampled 240 $D bench/split.ts --model "$model" --stages 1,2 --slots 8 --n 128 --pipelines 2 --temp 0.8
      ;;
    serve)
      ensure_model
      run serve 300 $D bench/serve.ts --model "$model" --levels 1,8 --n 128 --prompt 64 --ctx 4096 \
        --modes http,direct --late 2048 --head-flags="--cached-only"
      run serve 200 $D bench/serve.ts --model "$model" --levels 1,8 --n 128 --prompt 64 --ctx 4096 --modes direct \
        --batch 2
      ;;
    servesampled)
      ensure_model
      run servesampled 300 $D bench/serve.ts --model "$model" --levels 1,8 --n 128 --prompt 64 --ctx 4096 \
        --modes http,direct --temp 0.8 --head-flags="--cached-only"
      ;;
    graphs)
      ensure_model
      run graphs 150 $D bench/graph_build.ts --model "$model"
      ;;
    draft)
      ensure_model
      run draft 240 $D bench/draft.ts --synth-out "$model" --prompt 256 --n 128 --rounds 3 --min 2,4,6
      ;;
    combine)
      ensure_model
      run combine 120 $D bench/decode.ts --model "$model" --prompt 64 --n 128 --prefill 64 --chunk 64 --slots 8,16
      run combine 120 $D bench/decode.ts --model "$model" --prompt 64 --n 128 --prefill 64 --chunk 64 --slots 8,16 \
        --combine-norm-min-rows 2
      ;;
    int8experts)
      ensure_model
      run int8experts 120 $D bench/decode.ts --model "$model" --prompt 64 --n 128 --prefill 64 --chunk 64 --slots 1,8,16
      run int8experts 120 $D bench/decode.ts --model "$model" --prompt 64 --n 128 --prefill 64 --chunk 64 --slots 1,8,16 \
        --f32-experts
      ;;
    confirm)
      ensure_model
      run confirm 120 $D bench/decode.ts --model "$model" --prompt 64 --n 128 --prefill 64 --chunk 64 --slots 1,2,4,8,16
      for _ in 2 3; do
        run confirm 90 $D bench/decode.ts --model "$model" --prompt 64 --n 128 --prefill 64 --chunk 64 --slots 1,8,16
      done
      run confirm 60 $D bench/batch_bits.ts --model "$model"
      run confirm 200 $D bench/serve.ts --model "$model" --levels 1,2,4,8 --n 128 --prompt 64 --ctx 4096 \
        --modes http,direct --head-flags="--cached-only"
      run confirm 90 $D bench/serve.ts --model "$model" --levels 8 --n 128 --prompt 64 --ctx 4096 --modes direct \
        --late 2048
      ;;
    rowsq)
      ensure_model
      # shellcheck disable=SC2086 # DECODE_FLAGS: more flags, split on spaces (an older tree's knobs)
      run rowsq 90 $D bench/decode.ts --model "$model" --prompt 64 --n 128 --prefill 64 --chunk 64 --slots 1,8,16 \
        ${DECODE_FLAGS:-}
      ;;
    gdnsplit)
      ensure_model
      run gdnsplit 60 $D bench/gdn_step.ts --cols 8,16 --split 8,4,2
      gdn_splits gdnsplit 80 "2 8 4 2 8"
      ;;
    llamaref)
      # llama.cpp's CUDA build starts in the background (a fresh machine: 16 cores, several minutes) while the
      # model is written; then its batched bench and this engine's at the levels, on the same file.
      bash "$root/tools/llama_ref.sh" build 0 2>&1 | tee -a "$out/llamaref.log"
      ensure_model
      w=$((budget - SECONDS - 240))
      [ "$w" -lt 10 ] && w=10
      run llamaref $((w + 10)) bash "$root/tools/llama_ref.sh" build "$w"
      if [ -x /tmp/llama.cpp/build/bin/llama-batched-bench ]; then
        run llamaref 120 bash "$root/tools/llama_ref.sh" bench "$model"
        run llamaref 110 $D bench/decode.ts --model "$model" --prompt 64 --n 128 --prefill 64 --chunk 64 \
          --slots 1,2,4,8,16
      fi
      ;;
    prepsolve)
      run prepsolve 90 $D bench/gdn_chunk.ts --scan --scan-n 512,2048
      run prepsolve 60 $D bench/gdn_chunk.ts --n 512,2048 --step-max 0
      run prepsolve 60 $D bench/gdn_chunk.ts --n 512,2048 --step-max 0 --compact-solve
      ;;
    gdnquick)
      ensure_model
      gdn_splits gdnquick 60 "2 8 4"
      ;;
    q8c)
      ensure_model
      run q8c 90 $D bench/batch_bits.ts --model "$model" --slots 8
      run q8c 90 $D bench/batch_bits.ts --model "$model" --slots 16
      run q8c 90 $D bench/decode.ts --model "$model" --prompt 64 --n 128 --prefill 64 --chunk 64 --slots 1,8,16
      ;;
    takenorm)
      # The router taking the post-attention norm (StageOptions.routerTakesNorm, the default) against the
      # norm's own dispatch or the one-token router's prologue (--router-norm off), alternating, then the
      # default's batched ≡ solo bits at 16 and 8 slots.
      ensure_model
      for f in on off on off; do
        run takenorm 80 $D bench/decode.ts --model "$model" --prompt 64 --n 128 --prefill 64 --chunk 64 \
          --slots 1,8,16 --router-norm "$f"
      done
      run takenorm 60 $D bench/batch_bits.ts --model "$model" --slots 16
      run takenorm 60 $D bench/batch_bits.ts --model "$model" --slots 8
      ;;
    rowsq4)
      ensure_model
      run rowsq4 90 $D bench/decode.ts --model "$model" --prompt 64 --n 128 --prefill 64 --chunk 64 --slots 1,8,16 \
        --q8b-rows 4
      run rowsq4 90 $D bench/batch_bits.ts --model "$model"
      run rowsq4 90 $D bench/batch_bits.ts --model "$model" --q8b-rows 4
      ;;
    restprofile)
      ensure_model
      for w in 8 56 64; do
        # shellcheck disable=SC2086 # DECODE_FLAGS: more flags, split on spaces (e.g. --int8-experts)
        run restprofile 90 $D bench/decode.ts --model "$model" --prompt 64 --n 16 --prefill $w --chunk $w ${DECODE_FLAGS:-}
      done
      ;;
    rest8)
      ensure_model
      # shellcheck disable=SC2086 # DECODE_FLAGS: more flags, split on spaces
      run rest8 60 $D bench/decode.ts --model "$model" --prompt 64 --n 16 --prefill 8 --chunk 8 ${DECODE_FLAGS:-}
      ;;
    mvsweep)
      run mvsweep 200 $D bench/matvec.ts --batch-sweep
      ;;
    batched)
      ensure_model
      run batched 120 $D bench/decode.ts --model "$model" --prompt 64 --n 128 --prefill 64 --chunk 64 --slots 1,8,16
      ;;
    rows)
      ensure_model
      for rows in 2 4; do
        run rows 100 $D bench/decode.ts --model "$model" --prompt 64 --n 128 --prefill 64 --chunk 64 --slots 8,16 \
          --batched-q8-rows $rows
      done
      ;;
    moeq8)
      for tokens in 8 16; do
        run moeq8 120 $D bench/moe.ts --tokens $tokens --q8-only
      done
      ;;
    stoppoints)
      ensure_model
      for flag in "" --stop-points; do
        run stoppoints 100 $D bench/decode.ts --model "$model" --prompt 64 --n 128 --prefill 64 --chunk 64 \
          --slots 8,16 $flag
      done
      ;;
    late1)
      ensure_model
      run late1 100 $D bench/serve.ts --model "$model" --levels 8 --n 128 --prompt 64 --ctx 4096 --modes direct \
        --late 2048
      ;;
    serve18)
      ensure_model
      run serve18 240 $D bench/serve.ts --model "$model" --levels 1,8 --n 128 --prompt 64 --ctx 4096 \
        --modes http,direct --head-flags="--cached-only"
      ;;
    servelevels)
      ensure_model
      run servelevels 200 $D bench/serve.ts --model "$model" --levels 1,2,4,8,16 --n 128 --prompt 64 --ctx 4096 \
        --modes http,direct --head-flags="--cached-only"
      ;;
    servequick)
      ensure_model
      run servequick 150 $D bench/serve.ts --model "$model" --levels 1,2,4,8 --n 128 --prompt 64 --ctx 4096 \
        --modes http --head-flags="--cached-only"
      ;;
    servesolo)
      ensure_model
      run servesolo 150 $D bench/serve.ts --model "$model" --levels 1,2,8 --n 128 --prompt 64 --ctx 4096 \
        --modes http,direct --solo 7 --head-flags="--cached-only"
      ;;
    q8bsweep)
      run q8bsweep 200 $D bench/matvec.ts --batch-sweep --q8b-only
      ;;
    servewidth)
      ensure_model
      run servewidth 100 $D bench/serve.ts --model "$model" --levels 1 --n 64 --prompt 64 --ctx 4096 \
        --modes http,direct --solo 5 --head-flags="--cached-only"
      ;;
    latequick)
      ensure_model
      run latequick 90 $D bench/serve.ts --model "$model" --levels 8 --n 128 --prompt 64 --ctx 4096 --modes direct \
        --late 2048 --solo 3
      ;;
    servelate)
      ensure_model
      run servelate 200 $D bench/serve.ts --model "$model" --levels 1,2,4,8,16 --n 128 --prompt 64 --ctx 4096 \
        --modes http,direct --head-flags="--cached-only"
      run servelate 90 $D bench/serve.ts --model "$model" --levels 8 --n 128 --prompt 64 --ctx 4096 --modes direct \
        --late 2048
      ;;
    serve8)
      ensure_model
      run serve8 200 $D bench/serve.ts --model "$model" --levels 8 --n 128 --prompt 64 --ctx 4096 --modes direct
      ;;
    trace)
      ensure_model
      export LLM_TRACE_DECODE=1
      run trace 200 $D bench/serve.ts --model "$model" --levels 8 --n 128 --prompt 64 --ctx 4096 --modes direct
      unset LLM_TRACE_DECODE
      ;;
    servetrace)
      ensure_model
      export LLM_TRACE_DECODE=1
      run servetrace 100 $D bench/serve.ts --model "$model" --levels 1 --n 128 --prompt 64 --ctx 4096 \
        --modes http,direct --solo 7 --head-flags="--cached-only"
      unset LLM_TRACE_DECODE
      ;;
    trace2)
      ensure_model
      export LLM_TRACE_DECODE=1
      run trace2 150 $D bench/serve.ts --model "$model" --levels 1,2 --n 128 --prompt 64 --ctx 4096 \
        --modes http,direct --head-flags="--cached-only"
      unset LLM_TRACE_DECODE
      ;;
    smallchunk)
      ensure_model
      for chunk in 64 256; do
        run smallchunk 90 $D bench/decode.ts --model "$model" --prompt 16 --n 16 --prefill 512 --chunk $chunk
        run smallchunk 90 $D bench/decode.ts --model "$model" --prompt 16 --n 16 --prefill 512 --chunk $chunk \
          --per-column
      done
      ;;
    late)
      ensure_model
      for gap in 2.5 0 3; do
        run late 100 $D bench/serve.ts --model "$model" --levels 8 --n 128 --prompt 64 --ctx 4096 --modes direct \
          --late 2048 --piece-gap $gap
      done
      ;;
    lateparts)
      ensure_model
      for parts in 1 0; do
        run lateparts 100 $D bench/serve.ts --model "$model" --levels 8 --n 128 --prompt 64 --ctx 4096 --modes direct \
          --late 2048 --piece-parts $parts
      done
      ;;
    gmvq)
      ensure_model
      run gmvq 45 $D bench/decode.ts --model "$model" --prompt 16 --n 16 --prefill 512 --chunk 256
      run gmvq 45 $D bench/decode.ts --model "$model" --prompt 16 --n 16 --prefill 512 --chunk 256 --gmv-max 0
      run gmvq 60 $D bench/moe_prefill.ts --tokens 64,256
      ;;
    bits)
      ensure_model
      run bits 90 $D bench/batch_bits.ts --model "$model"
      run bits 90 $D bench/batch_bits.ts --model "$model" --int8-experts
      run bits 90 $D bench/batch_bits.ts --model "$model" --f32-experts
      ;;
    int8b)
      ensure_model
      run int8b 90 $D bench/batch_bits.ts --model "$model" --slots 8
      run int8b 120 $D bench/decode.ts --model "$model" --prompt 64 --n 128 --prefill 64 --chunk 64 --slots 1,8,16
      run int8b 120 $D bench/decode.ts --model "$model" --prompt 64 --n 128 --prefill 64 --chunk 64 --slots 1,8,16 \
        --int8-experts
      ;;
    gmv)
      ensure_model
      run gmv 90 $T wgsl/moe_group_test.ts
      run gmv 120 $D bench/moe_prefill.ts --tokens 64,256,512
      for chunk in 64 256; do
        run gmv 60 $D bench/decode.ts --model "$model" --prompt 16 --n 16 --prefill 512 --chunk $chunk
        run gmv 60 $D bench/decode.ts --model "$model" --prompt 16 --n 16 --prefill 512 --chunk $chunk --gmv-max 0
      done
      ;;
    pieces)
      ensure_model
      run pieces 120 $D bench/pieces.ts --model "$model" --widths 128,256,384,512,768,1024 --depth 1024 --reps 3
      ;;
    msplit)
      for m in 256 512; do
        run msplit 60 $D bench/matmul.ts --m $m --type IQ4_XS --splits 2,4,8
      done
      ;;
    split3)
      ensure_model
      run split3 330 $D bench/split.ts --model "$model" --stages 1,2,3 --slots 8 --n 128 --pipelines 1 --drafts 0,7 \
        --draft-cache 1000000
      ;;
    *)
      echo "h200_plan: unknown step $step (tests attention decode knobs split sampled serve servesampled graphs draft combine smallchunk split3 int8experts late gmv gmvq bits pieces msplit lateparts batched rows moeq8 serve8 trace serve18 stoppoints late1 servesolo servewidth q8bsweep latequick servelevels servelate confirm)" >&2
      exit 2
      ;;
  esac
done
echo "h200_plan: done in $SECONDS s"
