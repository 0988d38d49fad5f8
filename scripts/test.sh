#!/usr/bin/env bash
# Installs dependencies, builds, and runs the whole CPU test suite (GPU tests need a GPU machine:
# see tests/README.md). Usage: scripts/test.sh
set -euo pipefail
cd "$(dirname "$0")/.."
cmake/install_deps.sh
scripts/build.sh
# CI compiles all CUDA code: where a CUDA compiler exists (cmake/StrataCuda.cmake finds it, building for
# sm_90 plus PTX) the kernels, their GPU tests, the host check of their decoders (run by ctest below)
# and the CUDA benchmark must have been built; the GPU tests then skip themselves here, as on any
# machine without a GPU.
if command -v nvcc >/dev/null 2>&1 || [ -x /usr/local/cuda/bin/nvcc ]; then
  test -x build/tests/strata_gpu_tests
  test -x build/tests/strata_cuda_host_tests
  test -x build/bench/cuda_bench
  build/tests/strata_gpu_tests >/dev/null
fi

# A second tree built with clang, AddressSanitizer and UndefinedBehaviorSanitizer (STRATA_SANITIZE):
# the library and its unit tests, whose run below is the ASan + UBSan job (leaks included), and the
# libFuzzer targets of every parser over that same library. Each fuzz target replays its corpus,
# then fuzzes briefly; new inputs go to a scratch directory, crash reproducers to
# build-fuzz/artifacts/. A finding or a sanitizer report fails the script.
fuzz_targets=(gguf safetensors hf_config tokenizer chat_template snapshot hotlist http_body imatrix)
CC=clang CXX=clang++ cmake -S . -B build-fuzz -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  "-DCMAKE_C_FLAGS_RELWITHDEBINFO=-O1 -gline-tables-only -DNDEBUG" \
  "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O1 -gline-tables-only -DNDEBUG" \
  -DSTRATA_SANITIZE=address,undefined -DSTRATA_BUILD_FUZZ=ON -DSTRATA_BUILD_BENCH=OFF \
  -DSTRATA_BUILD_EXAMPLES=OFF -DSTRATA_ENABLE_CUDA=OFF -DSTRATA_INSTALL=OFF >/dev/null
cmake --build build-fuzz --parallel "$(nproc)" --target strata_tests \
  "${fuzz_targets[@]/%/_fuzz}" "${fuzz_targets[@]/%/_replay}"
export ASAN_OPTIONS="detect_leaks=1:halt_on_error=1" UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1"
ctest --test-dir build-fuzz --output-on-failure --label-exclude gpu --parallel "$(nproc)" --timeout 900 >build-fuzz/ctest.log ||
  { tail -n 60 build-fuzz/ctest.log; echo "the sanitized clang tree's tests failed (build-fuzz/ctest.log)" >&2; exit 1; }
mkdir -p build-fuzz/artifacts
for target in "${fuzz_targets[@]}"; do
  inputs=("tests/fuzz/corpus/${target}")
  if [ -d "tests/fuzz/regressions/${target}" ]; then inputs+=("tests/fuzz/regressions/${target}"); fi
  # Small inputs, except where the seeds are larger files (tokenizers, snapshots): their sizes.
  case "$target" in tokenizer | snapshot) max_len=() ;; *) max_len=(-max_len=8192) ;; esac
  build-fuzz/tests/fuzz/${target}_fuzz -runs=0 "${inputs[@]}"
  scratch="$(mktemp -d)"
  build-fuzz/tests/fuzz/${target}_fuzz -max_total_time=10 "${max_len[@]}" -rss_limit_mb=2048 \
    -artifact_prefix=build-fuzz/artifacts/ -print_final_stats=1 "$scratch" "${inputs[@]}"
  rm -rf "$scratch"
done
unset ASAN_OPTIONS UBSAN_OPTIONS

# A third tree with ThreadSanitizer: the library and its threaded tests (scripts/tsan.sh).
scripts/tsan.sh

# The unit, golden, CLI, package and corpus-replay tests; their summary is the last thing printed.
ctest --test-dir build --output-on-failure --label-exclude gpu --parallel "$(nproc)" --timeout 900
