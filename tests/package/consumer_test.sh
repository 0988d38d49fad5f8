#!/usr/bin/env bash
# usage: consumer_test.sh BUILD_DIR CONSUMER_SRC MODEL CC CUDA_PLUGIN ABSL_STATIC REFUSING_PLUGIN
#   CUDA_PLUGIN: ON when the build made libstrata-cuda.so; ABSL_STATIC: ON when Abseil's archives are
#   linked into libstrata.so; REFUSING_PLUGIN: a plugin of another build (tests/capi/fake_cuda_plugin.c).
set -euo pipefail
build=$1 src=$2 model=$3 cc=$4 cuda_plugin=$5 absl_static=$6 refusing=$7
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cmake --install "$build" --prefix "$tmp/prefix" >/dev/null
# 1. CMake: find_package(strata) and strata::strata; the package names its CUDA plugin.
cmake -S "$src" -B "$tmp/cmake-build" -DCMAKE_PREFIX_PATH="$tmp/prefix" -DCMAKE_BUILD_TYPE=Release > "$tmp/configure.out"
if [ "$cuda_plugin" = ON ]; then want_plugin="$tmp/prefix/lib/libstrata-cuda.so"; else want_plugin=""; fi
grep -qx -- "-- strata_CUDA_PLUGIN=$want_plugin" "$tmp/configure.out" ||
  { echo "strata_CUDA_PLUGIN is not '$want_plugin':" >&2; grep strata_CUDA_PLUGIN "$tmp/configure.out" >&2; exit 1; }
cmake --build "$tmp/cmake-build" >/dev/null
LD_LIBRARY_PATH="$tmp/prefix/lib" "$tmp/cmake-build/consumer" "$model" | grep -q "vocab 256"
# 2. pkg-config, strict C99.
export PKG_CONFIG_PATH="$tmp/prefix/lib/pkgconfig"
pkg-config --exists strata
pkg-config --modversion strata | grep -qx "0.9.0"
"$cc" -std=c99 -pedantic -Wall -Werror -o "$tmp/pc-consumer" "$src/main.c" $(pkg-config --cflags --libs strata)
LD_LIBRARY_PATH="$tmp/prefix/lib" "$tmp/pc-consumer" "$model" | grep -q "vocab 256"
# 3. Only the C ABI is exported from the shared library.
lib=$(ls "$tmp"/prefix/lib/libstrata.so.*.*.* | head -1)
bad=$(nm -D --defined-only "$lib" | awk '{print $3}' | grep -v '^moe_' | grep -v '^STRATA_0$' || true)
if [ -n "$bad" ]; then echo "non-moe_ symbols exported: $bad" >&2; exit 1; fi
# 4. The installed CLI runs the installed demo model, found beside it wherever the prefix is: in a
#    copy of the prefix whose demo model is replaced by MODEL, `strata run` without --model gives
#    MODEL's tokens, not the source tree's demo model's.
"$tmp/prefix/bin/strata" run -n 2 >/dev/null 2>&1 || { echo "installed strata run failed" >&2; exit 1; }
cp -r "$tmp/prefix" "$tmp/moved"
demo=$(ls "$tmp"/moved/share/strata/*.gguf | head -1)
cp "$model" "$demo"
want=$("$tmp/moved/bin/strata" run --model "$model" --tokens 1,2 -n 3 --temp 0 2>/dev/null)
got=$("$tmp/moved/bin/strata" run --tokens 1,2 -n 3 --temp 0 2>/dev/null) ||
  { echo "a moved prefix's strata run failed" >&2; exit 1; }
[ -n "$want" ] && [ "$got" = "$want" ] || { echo "a moved prefix's strata found another demo model" >&2; exit 1; }
# 5. The C++ wrapper is installed beside moe.h and builds against the installed package.
printf '#include <strata/moe.hpp>\nint main() { return strata::version() == "0.9.0" ? 0 : 1; }\n' > "$tmp/hpp.cc"
c++ -std=c++17 -pedantic -Wall -Werror -o "$tmp/hpp" "$tmp/hpp.cc" $(pkg-config --cflags --libs strata)
LD_LIBRARY_PATH="$tmp/prefix/lib" "$tmp/hpp"
# 6. The static archive: a C host linked against it runs with no library path, and needs none of
#    Abseil's, liburing's, libnuma's or CUDA's shared objects.
"$cc" -std=c99 -o "$tmp/static-consumer" "$src/main.c" $(pkg-config --cflags --libs strata-static)
LD_LIBRARY_PATH= "$tmp/static-consumer" "$model" | grep -q "vocab 256"
needed=$(ldd "$tmp/static-consumer" | awk '{print $1}')
extra=$(echo "$needed" | grep -v -E '^(linux-vdso\.so|/lib64/ld-linux|libc\.so|libm\.so|libstdc\+\+\.so|libgcc_s\.so)' || true)
if [ -n "$extra" ]; then echo "the static consumer needs: $extra" >&2; exit 1; fi
# 7. The CUDA backend is a plugin: libstrata.so needs none of CUDA's libraries (nor Abseil's when
#    the build could link Abseil's archives into it), the plugin is installed beside it, exports
#    one symbol, and pkg-config names it.
needed=$(readelf -d "$lib" | awk '/NEEDED/ {print $5}' | tr -d '[]')
bad=$(echo "$needed" | grep -E '^lib(cudart|cublas|cublasLt|cuda|nvrtc)\.so' || true)
if [ "$absl_static" = ON ]; then bad="$bad$(echo "$needed" | grep -E '^libabsl_' || true)"; fi
if [ -n "$bad" ]; then echo "libstrata.so needs: $bad" >&2; exit 1; fi
"$cc" -std=c99 -pedantic -Wall -Werror -o "$tmp/backend" "$src/backend.c" $(pkg-config --cflags --libs strata)
run_backend() { LD_LIBRARY_PATH="$1" "$tmp/backend" "$model"; }
if [ "$cuda_plugin" = ON ]; then
  plugin="$tmp/prefix/lib/libstrata-cuda.so"
  [ -f "$plugin" ] || { echo "libstrata-cuda.so is not installed beside libstrata.so" >&2; exit 1; }
  exported=$(nm -D --defined-only "$plugin" | awk '{print $3}' | grep -v '^$')
  [ "$exported" = strata_cuda_plugin_open ] || { echo "the plugin exports: $exported" >&2; exit 1; }
  [ "$(realpath "$(pkg-config --variable=cuda_plugin strata)")" = "$(realpath "$plugin")" ] ||
    { echo "strata.pc names no plugin" >&2; exit 1; }
  # Found beside the library: here a device, or the reason there is none.
  out=$(run_backend "$tmp/prefix/lib")
  echo "$out" | sed -n 1p | grep -qE '^cuda: (available|unavailable: the CUDA backend finds no CUDA device)' ||
    { echo "with the plugin installed: $out" >&2; exit 1; }
  echo "$out" | grep -qx "auto: vocab 256"
  # A path that names nothing: the CPU for AUTO, the reason for CUDA, the same reason for both.
  nowhere="$tmp/nowhere/libstrata-cuda.so"
  why="the CUDA backend's plugin was not found: tried $nowhere (the path STRATA_CUDA_PLUGIN names)"
  out=$(STRATA_CUDA_PLUGIN="$nowhere" run_backend "$tmp/prefix/lib")
  want=$(printf 'cuda: unavailable: %s\nauto: vocab 256\ncuda: MOE_ERR_UNSUPPORTED_BACKEND: %s' "$why" "$why")
  [ "$out" = "$want" ] || { printf 'a path naming nothing gave:\n%s\nnot:\n%s\n' "$out" "$want" >&2; exit 1; }
  # The plugin of another build, refused with its reason.
  out=$(STRATA_CUDA_PLUGIN="$refusing" run_backend "$tmp/prefix/lib")
  echo "$out" | sed -n 1p | grep -qF "cuda: unavailable: the CUDA backend's plugin $refusing refused to load: the CUDA plugin is built for plugin ABI 9999" ||
    { echo "a plugin of another build gave: $out" >&2; exit 1; }
  echo "$out" | grep -qx "auto: vocab 256"
  # The moved prefix without its plugin: every place tried is named, the CPU still runs, and the
  # installed CLI says why in one line.
  rm "$tmp/moved/lib/libstrata-cuda.so"
  out=$(run_backend "$tmp/moved/lib")
  echo "$out" | sed -n 1p | grep -qF "cuda: unavailable: the CUDA backend's plugin was not found: tried $tmp/moved/lib/libstrata-cuda.so, $tmp/libstrata-cuda.so and the dynamic loader's search for libstrata-cuda.so" ||
    { echo "without the plugin: $out" >&2; exit 1; }
  echo "$out" | grep -qx "auto: vocab 256"
  if "$tmp/moved/bin/strata" run --backend cuda -n 2 > /dev/null 2> "$tmp/cli.err"; then
    echo "the installed strata ran --backend cuda without its plugin" >&2; exit 1
  fi
  [ "$(wc -l < "$tmp/cli.err")" = 1 ] && grep -q "^strata: error: .*the CUDA backend's plugin was not found: tried $tmp/moved/bin/libstrata-cuda.so" "$tmp/cli.err" ||
    { echo "the installed strata without its plugin said:" >&2; cat "$tmp/cli.err" >&2; exit 1; }
  "$tmp/moved/bin/strata" run -n 2 >/dev/null 2>&1 || { echo "the installed strata without its plugin failed on the CPU" >&2; exit 1; }
else
  out=$(run_backend "$tmp/prefix/lib")
  echo "$out" | sed -n 1p | grep -qx "cuda: unavailable: the CUDA backend is not available in this build"
fi
echo "package consumer: ok"
