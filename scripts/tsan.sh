#!/usr/bin/env bash
# Builds the tests with ThreadSanitizer into build-tsan and runs the expert-cache tests (prefetch
# racing eviction at a tiny budget, I/O threads, faults) and the batching thread test (host threads
# feeding sessions while another steps). Usage: scripts/tsan.sh
set -euo pipefail
cd "$(dirname "$0")/.."
cmake -S . -B build-tsan -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DSTRATA_BUILD_BENCH=OFF \
  -DSTRATA_ENABLE_CUDA=OFF -DSTRATA_INSTALL=OFF \
  -DCMAKE_C_FLAGS=-fsanitize=thread -DCMAKE_CXX_FLAGS=-fsanitize=thread \
  -DCMAKE_EXE_LINKER_FLAGS=-fsanitize=thread -DCMAKE_SHARED_LINKER_FLAGS=-fsanitize=thread >/dev/null
cmake --build build-tsan --parallel "$(nproc)" --target strata_tests strata_cli
TSAN_OPTIONS="halt_on_error=1" build-tsan/tests/strata_tests "[store],[threads]"
