#!/usr/bin/env bash
# Installs dependencies, builds, and runs the whole CPU test suite (GPU tests need a GPU machine:
# see tests/README.md). Usage: scripts/test.sh
set -euo pipefail
cd "$(dirname "$0")/.."
cmake/install_deps.sh
scripts/build.sh
# CI compiles all CUDA code: where a CUDA compiler exists (cmake/StrataCuda.cmake finds it, building for
# sm_90 plus PTX) the kernels, their GPU tests and the CUDA benchmark must have been built; the GPU
# tests then skip themselves here, as on any machine without a GPU.
if command -v nvcc >/dev/null 2>&1 || [ -x /usr/local/cuda/bin/nvcc ]; then
  test -x build/tests/strata_gpu_tests
  test -x build/bench/cuda_bench
  build/tests/strata_gpu_tests >/dev/null
fi

# A second tree built with clang: the library and its unit tests (the tests run below, a compiler
# other than the main tree's, without the CLI and the install), and the parsers' libFuzzer targets
# (ASan + UBSan). Each fuzz target replays its seed corpus, then fuzzes briefly; new inputs go to a
# scratch directory, crash reproducers to build-fuzz/artifacts/. A finding fails the script.
CC=clang CXX=clang++ cmake -S . -B build-fuzz -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DSTRATA_BUILD_FUZZ=ON -DSTRATA_BUILD_BENCH=OFF -DSTRATA_BUILD_EXAMPLES=OFF \
  -DSTRATA_ENABLE_CUDA=OFF -DSTRATA_INSTALL=OFF >/dev/null
cmake --build build-fuzz --parallel "$(nproc)" --target gguf_fuzz safetensors_fuzz strata_tests gguf_replay safetensors_replay
ctest --test-dir build-fuzz --output-on-failure --label-exclude gpu --parallel "$(nproc)" --timeout 900 >build-fuzz/ctest.log ||
  { tail -n 60 build-fuzz/ctest.log; echo "the clang tree's tests failed (build-fuzz/ctest.log)" >&2; exit 1; }
mkdir -p build-fuzz/artifacts
for target in gguf safetensors; do
  build-fuzz/tests/fuzz/${target}_fuzz -runs=0 "tests/fuzz/corpus/${target}" "tests/fuzz/found/${target}"
  scratch="$(mktemp -d)"
  build-fuzz/tests/fuzz/${target}_fuzz -max_total_time=15 -max_len=8192 -rss_limit_mb=2048 \
    -artifact_prefix=build-fuzz/artifacts/ -print_final_stats=1 "$scratch" "tests/fuzz/corpus/${target}" \
    "tests/fuzz/found/${target}"
  rm -rf "$scratch"
done

# The unit, golden, CLI, package and corpus-replay tests; their summary is the last thing printed.
ctest --test-dir build --output-on-failure --label-exclude gpu --parallel "$(nproc)" --timeout 900
