#!/usr/bin/env bash
# Writes tests/quant/fixtures/imatrix/llama_cpp_imatrix.gguf: llama.cpp's importance matrix of the
# demo model (repacked by `strata pack` in llama.cpp's stacked layout) over the committed text, four
# windows of 512 tokens. tests/quant/imatrix_test.cc compares `strata imatrix` on the same model and
# text against it.
# Usage: scripts/quant/make_imatrix_fixture.sh LLAMA_BIN_DIR [STRATA]
#   LLAMA_BIN_DIR holds llama-imatrix, built from the PyPI llama-cpp-python source distribution
#   (`pip download llama-cpp-python --no-binary :all: --no-deps`, then in vendor/llama.cpp:
#   cmake -B build -DGGML_NATIVE=OFF -DBUILD_SHARED_LIBS=OFF -DLLAMA_BUILD_TOOLS=ON -DLLAMA_CURL=OFF &&
#   cmake --build build --target llama-imatrix).
set -euo pipefail
cd "$(dirname "$0")/../.."
bin="${1:?usage: $0 LLAMA_BIN_DIR [STRATA]}"
strata="${2:-build/examples/strata}"
dir=tests/quant/fixtures/imatrix
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
"$strata" pack examples/models/austen-moe-q4_k.gguf "$tmp/demo.gguf"
(cd "$dir" && "$bin/llama-imatrix" -m "$tmp/demo.gguf" -f persuasion_23.txt -c 512 --chunks 4 -t 2 \
  -o "$tmp/imatrix.gguf" >/dev/null 2>&1)
cp "$tmp/imatrix.gguf" "$dir/llama_cpp_imatrix.gguf"
echo "wrote $dir/llama_cpp_imatrix.gguf"
