#!/usr/bin/env bash
# Writes tests/quant/fixtures/recipes.json: the type llama-quantize gives each tensor of a float32
# model of `strata synth --shape tiny` (4 layers, 16 experts, hidden 256) for each file type Strata
# packs, read back with the `gguf` package. tests/quant/recipe_test.cc packs the same model with each
# recipe and compares every tensor's type. (Q2_K_S is left out: llama-quantize makes it only with an
# importance matrix.)
# Usage: scripts/quant/make_recipe_fixture.sh LLAMA_BIN_DIR [STRATA]
#   LLAMA_BIN_DIR holds llama-quantize, built from the PyPI llama-cpp-python source distribution
#   (in its vendor/llama.cpp: cmake -B build -DGGML_NATIVE=OFF -DLLAMA_BUILD_TOOLS=ON -DLLAMA_CURL=OFF &&
#   cmake --build build --target llama-quantize).
set -euo pipefail
cd "$(dirname "$0")/../.."
bin="${1:?usage: $0 LLAMA_BIN_DIR [STRATA]}"
strata="${2:-build/examples/strata}"
py="${PYTHON:-build/venv/bin/python3}"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
"$strata" synth --shape tiny --codec f32 --attention f32 --out "$tmp/f32.gguf" >/dev/null 2>&1
types="Q2_K Q3_K_S Q3_K_M Q3_K_L Q4_K_S Q4_K_M Q5_K_S Q5_K_M Q6_K Q4_0 Q4_1 Q5_0 Q5_1 Q8_0 IQ4_NL IQ4_XS MXFP4_MOE"
for t in $types; do
  "$bin/llama-quantize" "$tmp/f32.gguf" "$tmp/$t.gguf" "$t" 1 >/dev/null 2>&1
done
"$py" - "$tmp" $types > tests/quant/fixtures/recipes.json <<'PY'
import json, sys
import gguf
tmp, types = sys.argv[1], sys.argv[2:]
out = {}
for t in types:
    r = gguf.GGUFReader("%s/%s.gguf" % (tmp, t))
    out[t] = {x.name: x.tensor_type.name for x in r.tensors}
print(json.dumps(out, indent=1, sort_keys=True))
PY
echo "wrote tests/quant/fixtures/recipes.json"
