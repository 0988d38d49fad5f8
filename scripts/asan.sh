#!/usr/bin/env bash
# Builds the library, the CLI and the tests with clang's AddressSanitizer and
# UndefinedBehaviorSanitizer into build-asan, and runs the whole CPU test suite there (the CLI
# tests run the sanitized CLI). Any report fails the run. Takes ~25 minutes on two cores, so it is
# not part of scripts/test.sh. Usage: scripts/asan.sh [catch2 test filter]
set -euo pipefail
cd "$(dirname "$0")/.."
san="-fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined"
# The runtime as a shared library: libstrata.so links with --no-undefined.
link="-fsanitize=address,undefined -shared-libsan"
CC=clang CXX=clang++ cmake -S . -B build-asan -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DSTRATA_BUILD_BENCH=OFF \
  -DSTRATA_ENABLE_CUDA=OFF -DSTRATA_INSTALL=OFF "-DCMAKE_C_FLAGS=$san" "-DCMAKE_CXX_FLAGS=$san" \
  "-DCMAKE_EXE_LINKER_FLAGS=$link" "-DCMAKE_SHARED_LINKER_FLAGS=$link" >/dev/null
export LD_LIBRARY_PATH="$(dirname "$(clang -print-file-name=libclang_rt.asan-x86_64.so)")${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
cmake --build build-asan --parallel "$(nproc)" --target strata_tests strata_cli
ASAN_OPTIONS="detect_leaks=1:halt_on_error=1" UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1" \
  build-asan/tests/strata_tests "$@"
