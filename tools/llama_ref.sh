#!/usr/bin/env bash
# llama.cpp's `llama-batched-bench` with its CUDA backend, built on the device from source, for #20's comparison
# on the same file and in the same call as this engine's benches (tools/h200_plan.sh step `llamaref`).
#
# The source never enters the project: it travels as the ignored folder .llama (carry it). Make it here once:
#
#   bash tools/llama_ref.sh pack
#
# which takes llama.cpp's source from the npm package node-llama-cpp (its llama/gitRelease.bundle, a git bundle
# of the llama.cpp release it binds; npm is the one registry reachable here) and writes .llama/llama.cpp.tar.xz
# (about 1.5 MB: the files a CUDA build of llama-batched-bench needs).
#
# On the device:
#   bash tools/llama_ref.sh build WAIT_S   builds llama-batched-bench under /tmp/llama.cpp (a warm machine keeps
#                                          it), in the background (setsid), waiting at most WAIT_S seconds; a
#                                          later call waits again for a build still running. rc 0 once built.
#   bash tools/llama_ref.sh bench MODEL    runs it: 64-token prompts, 128 new tokens, 1, 2, 4, 8 and 16
#                                          sequences, every layer on the GPU (the issue's command)
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
src_tar=${LLAMA_TAR:-$root/.llama/llama.cpp.tar.xz}
dir=/tmp/llama.cpp
bin=$dir/build/bin/llama-batched-bench
log=/tmp/llama_build.log

# find_lib NAME: the folder of the first libNAME.so* in the toolkit, the system's folders or the pip wheels
# (nvidia/cu13/lib: python3's site-packages).
find_lib() {
  local dirs f
  dirs=$(python3 -c 'import nvidia; print(" ".join(nvidia.__path__))' 2>/dev/null)
  # shellcheck disable=SC2086 # dirs: several folders
  f=$(find /usr/local/cuda*/ /usr/local/nvidia/lib64 /usr/lib/x86_64-linux-gnu $dirs -name "lib$1.so*" \
    2>/dev/null | head -1)
  [ -n "$f" ] && dirname "$f"
}

case ${1:-} in
  pack)
    set -e
    tmp=$(mktemp -d)
    (cd "$tmp" && npm pack --silent node-llama-cpp@3.22.1 >/dev/null && tar xzf node-llama-cpp-3.22.1.tgz \
      package/llama/gitRelease.bundle package/llama/llama.cpp.info.json)
    git clone -q "$tmp/package/llama/gitRelease.bundle" "$tmp/src" 2>/dev/null
    mkdir -p "$root/.llama"
    # The files a CUDA build of llama-batched-bench reads: the CPU and CUDA backends (x86 only), the library,
    # common and its vendored headers, the one tool; tools/ and vendor/ get CMake lists of just those, so that
    # .llama (about 1.5 MB) travels beside .bin within the carry limit and one call builds and benches.
    src=$tmp/src
    (cd "$src" && git rev-parse HEAD >"$root/.llama/commit")
    printf '%s\n' '# Written by tools/llama_ref.sh pack: the one tool the comparison builds.' \
      'find_package(Threads REQUIRED)' 'llama_add_compile_flags()' 'add_subdirectory(batched-bench)' \
      >"$src/tools/CMakeLists.txt"
    printf '%s\n' '# Written by tools/llama_ref.sh pack: what common links.' 'add_subdirectory(nlohmann)' \
      'add_subdirectory(sheredom)' 'add_subdirectory(cpp-httplib)' >"$src/vendor/CMakeLists.txt"
    ex=()
    for d in sycl hexagon opencl et vulkan metal cann openvino webgpu musa rpc zdnn blas hip virtgpu zendnn; do
      ex+=("--exclude=ggml/src/ggml-$d")
    done
    for d in arch/arm arch/loongarch arch/powerpc arch/riscv arch/s390 arch/wasm spacemit kleidiai; do
      ex+=("--exclude=ggml/src/ggml-cpu/$d")
    done
    (cd "$src" && tar cJf "$root/.llama/llama.cpp.tar.xz" "${ex[@]}" CMakeLists.txt cmake ggml src include \
      common tools/CMakeLists.txt tools/batched-bench vendor/CMakeLists.txt vendor/nlohmann vendor/sheredom \
      vendor/cpp-httplib LICENSE)
    cp "$tmp/package/llama/llama.cpp.info.json" "$root/.llama/"
    rm -rf "$tmp"
    ls -l "$root/.llama"
    ;;
  build)
    wait_s=${2:-500}
    t0=$SECONDS
    if [ ! -x "$bin" ] && [ ! -f /tmp/llama_build.started ]; then
      echo "llama_ref: nvcc $(command -v nvcc) ($(nvcc --version 2>/dev/null | tail -1)), cmake $(cmake --version |
        head -1), ninja $(command -v ninja), $(nproc) cores"
      rm -rf "$dir" && mkdir -p "$dir" && tar xJf "$src_tar" -C "$dir" || exit 1
      flags=()
      lib=$(find_lib cublas)
      drv=$(find_lib cuda)
      echo "llama_ref: cuBLAS in ${lib:-(not found)}, libcuda in ${drv:-(not found)}"
      if [ -n "$drv" ] && ! ls /usr/local/cuda*/lib64/stubs/libcuda.so >/dev/null 2>&1; then
        flags+=("-DCUDA_cuda_driver_LIBRARY=$(ls "$drv"/libcuda.so* | head -1)")
      fi
      if [ -n "$lib" ] && ! ls /usr/local/cuda*/lib64/libcublas.so* >/dev/null 2>&1; then
        # A pip wheel's cuBLAS: name its libraries and headers to CMake's FindCUDAToolkit.
        inc=$(dirname "$lib")/include
        flags+=("-DCUDA_cublas_LIBRARY=$(ls "$lib"/libcublas.so* | head -1)"
          "-DCUDA_cublasLt_LIBRARY=$(ls "$lib"/libcublasLt.so* | head -1)"
          "-DCMAKE_CUDA_FLAGS=-I$inc" "-DCMAKE_CXX_FLAGS=-I$inc")
      fi
      touch /tmp/llama_build.started
      # shellcheck disable=SC2016 # expanded by the inner shell
      setsid nohup bash -c 'cd "$0" && cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=OFF \
        -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 -DGGML_CUDA_NCCL=OFF -DLLAMA_BUILD_TESTS=OFF \
        -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_APP=OFF -DLLAMA_OPENSSL=OFF \
        -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF "${@}" &&
        cmake --build build --target llama-batched-bench -j "$(nproc)"; echo $? > /tmp/llama_build.rc' \
        "$dir" "${flags[@]}" >"$log" 2>&1 </dev/null &
    fi
    while [ ! -f /tmp/llama_build.rc ] && [ $((SECONDS - t0)) -lt "$wait_s" ]; do sleep 5; done
    if [ ! -f /tmp/llama_build.rc ]; then
      echo "llama_ref: still building after ${wait_s}s: $(tail -1 "$log")"
      exit 2
    fi
    rc=$(cat /tmp/llama_build.rc)
    echo "llama_ref: build rc $rc ($((SECONDS - t0)) s waited here)"
    [ "$rc" = 0 ] || { grep -i -B2 -A8 "error" "$log" | head -60; exit 1; }
    ;;
  bench)
    model=${2:?model path}
    lib=$(find_lib cublas)
    export LD_LIBRARY_PATH=$dir/build/bin${lib:+:$lib}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
    echo "llama_ref: llama.cpp $(cat "$root/.llama/commit" 2>/dev/null) ($(cat "$root/.llama/llama.cpp.info.json" \
      2>/dev/null | tr -d ' \n'))"
    "$bin" -m "$model" -c 4096 -b 2048 -ub 512 -ngl 99 -npp 64 -ntg 128 -npl 1,2,4,8,16
    ;;
  *)
    echo "usage: bash tools/llama_ref.sh pack | build [WAIT_S] | bench MODEL" >&2
    exit 64
    ;;
esac
