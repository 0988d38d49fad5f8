#!/usr/bin/env bash
# Builds the library, the CLI and the tests with clang's AddressSanitizer and
# UndefinedBehaviorSanitizer (STRATA_SANITIZE) into build-asan, and runs the whole CPU test suite
# there, the CLI tests running the sanitized CLI. Any report (a leak included) fails the run.
# scripts/test.sh runs the same sanitizers over the library and the unit tests in its clang tree
# (build-fuzz); this adds the CLI. Usage: scripts/asan.sh [catch2 test filter]
set -euo pipefail
cd "$(dirname "$0")/.."
CC=clang CXX=clang++ cmake -S . -B build-asan -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  "-DCMAKE_C_FLAGS_RELWITHDEBINFO=-O1 -gline-tables-only -DNDEBUG" \
  "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O1 -gline-tables-only -DNDEBUG" \
  -DSTRATA_SANITIZE=address,undefined -DSTRATA_BUILD_BENCH=OFF -DSTRATA_ENABLE_CUDA=OFF \
  -DSTRATA_INSTALL=OFF >/dev/null
cmake --build build-asan --parallel "$(nproc)" --target strata_tests strata_cli
ASAN_OPTIONS="detect_leaks=1:halt_on_error=1" UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1" \
  build-asan/tests/strata_tests "$@"
