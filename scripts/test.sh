#!/usr/bin/env bash
# Installs dependencies, builds, and runs the whole CPU test suite (GPU tests need a GPU machine:
# see tests/README.md). Usage: scripts/test.sh
set -euo pipefail
cd "$(dirname "$0")/.."
cmake/install_deps.sh
scripts/build.sh
ctest --test-dir build --output-on-failure --label-exclude gpu --parallel "$(nproc)" --timeout 900
