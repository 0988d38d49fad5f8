#!/usr/bin/env bash
# Builds the library and its threaded tests (strata_thread_tests, tests/CMakeLists.txt) with clang's
# ThreadSanitizer into build-tsan and runs them: the thread pool, host threads feeding sessions while
# another steps, the KV cache and its admission, the expert cache's I/O and prefetch threads
# (faults, prefetch racing eviction), the VRAM tier, the soak. Any report fails the run.
# scripts/test.sh runs it. Usage: scripts/tsan.sh [catch2 test filter]
set -euo pipefail
cd "$(dirname "$0")/.."
CC=clang CXX=clang++ cmake -S . -B build-tsan -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  "-DCMAKE_C_FLAGS_RELWITHDEBINFO=-O1 -gline-tables-only -DNDEBUG" \
  "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O1 -gline-tables-only -DNDEBUG" \
  -DSTRATA_SANITIZE=thread -DSTRATA_BUILD_BENCH=OFF -DSTRATA_BUILD_EXAMPLES=OFF \
  -DSTRATA_ENABLE_CUDA=OFF -DSTRATA_INSTALL=OFF >/dev/null
cmake --build build-tsan --parallel "$(nproc)" --target strata_thread_tests
TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1" build-tsan/tests/strata_thread_tests "$@"
