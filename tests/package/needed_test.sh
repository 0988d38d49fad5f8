#!/usr/bin/env bash
# usage: needed_test.sh LIBSTRATA ABSL_STATIC [PLUGIN]
# libstrata.so needs no CUDA library (the CUDA backend is the plugin libstrata-cuda.so, opened at
# run time), nor Abseil's shared objects when ABSL_STATIC is ON; the plugin, when built, exports
# its entry alone and needs no CUDA runtime library (cudart is linked into it).
set -euo pipefail
lib=$1 absl_static=$2 plugin=${3:-}
needed() { readelf -d "$1" | awk '/NEEDED/ {print $5}' | tr -d '[]'; }
bad=$(needed "$lib" | grep -E '^lib(cudart|cublas|cublasLt|cuda|nvrtc)\.so' || true)
if [ "$absl_static" = ON ]; then bad="$bad$(needed "$lib" | grep -E '^libabsl_' || true)"; fi
if [ -n "$bad" ]; then echo "$lib needs: $bad" >&2; exit 1; fi
# The check sees a CUDA library where there is one.
if [ -n "$plugin" ]; then
  needed "$plugin" | grep -q '^libcublasLt\.so' || { echo "the check does not see the plugin's cuBLASLt" >&2; exit 1; }
  bad=$(needed "$plugin" | grep -E '^lib(cudart|cuda)\.so' || true)
  if [ "$absl_static" = ON ]; then bad="$bad$(needed "$plugin" | grep -E '^libabsl_' || true)"; fi
  if [ -n "$bad" ]; then echo "$plugin needs: $bad" >&2; exit 1; fi
  exported=$(nm -D --defined-only "$plugin" | awk '{print $3}' | grep -v '^$')
  [ "$exported" = strata_cuda_plugin_open ] || { echo "the plugin exports: $exported" >&2; exit 1; }
fi
echo "needed: $(needed "$lib" | tr '\n' ' ')"
