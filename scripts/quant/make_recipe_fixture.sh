#!/usr/bin/env bash
# Writes tests/quant/fixtures/recipes.json: the type llama-quantize gives each tensor of a float32
# model of `strata synth --shape tiny` (4 layers, 16 experts, hidden 256) for each file type Strata
# packs, read back with the `gguf` package. tests/quant/recipe_test.cc packs the same model with each
# recipe and compares every tensor's type. The lattice i-quant types (IQ2_XXS ... IQ1_M) are made with
# an importance matrix (every column weighted 1 + its index mod 7, written here in llama.cpp's GGUF
# imatrix format), which llama-quantize requires for them; only whether there is one changes a type,
# so the test packs with its own. (Q2_K_S is left out.)
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
iq_types="IQ2_XXS IQ2_XS IQ2_S IQ2_M IQ3_XXS IQ3_XS IQ3_S IQ3_M IQ1_S IQ1_M"
for t in $types; do
  "$bin/llama-quantize" "$tmp/f32.gguf" "$tmp/$t.gguf" "$t" 1 >/dev/null 2>&1
done
"$py" - "$tmp/f32.gguf" "$tmp/imatrix.gguf" <<'PY'
import sys
import numpy as np
import gguf
model, out = sys.argv[1], sys.argv[2]
w = gguf.GGUFWriter(out, arch=None)
w.add_type("imatrix")
w.add_array("imatrix.datasets", ["synthetic"])
w.add_uint32("imatrix.chunk_count", 1)
w.add_uint32("imatrix.chunk_size", 512)
for t in sorted(gguf.GGUFReader(model).tensors, key=lambda t: t.name):
    if not t.name.startswith("blk.") or len(t.shape) < 2 or "_norm" in t.name or "ffn_gate_inp" in t.name:
        continue
    n_cols, n_mat = int(t.shape[0]), int(t.shape[2]) if len(t.shape) > 2 else 1
    sums = np.tile(1.0 + np.arange(n_cols) % 7, (n_mat, 1)).astype(np.float32)
    w.add_tensor(t.name + ".in_sum2", sums)
    w.add_tensor(t.name + ".counts", np.ones((n_mat, 1), dtype=np.float32))
w.write_header_to_file()
w.write_kv_data_to_file()
w.write_tensors_to_file()
w.close()
PY
for t in $iq_types; do
  "$bin/llama-quantize" --imatrix "$tmp/imatrix.gguf" "$tmp/f32.gguf" "$tmp/$t.gguf" "$t" 1 >"$tmp/$t.log" 2>&1 ||
    { cat "$tmp/$t.log" >&2; exit 1; }
done
types="$types $iq_types"
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
