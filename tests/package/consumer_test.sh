#!/usr/bin/env bash
# usage: consumer_test.sh BUILD_DIR CONSUMER_SRC MODEL CC
set -euo pipefail
build=$1 src=$2 model=$3 cc=$4
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cmake --install "$build" --prefix "$tmp/prefix" >/dev/null
# 1. CMake: find_package(strata) and strata::strata.
cmake -S "$src" -B "$tmp/cmake-build" -DCMAKE_PREFIX_PATH="$tmp/prefix" -DCMAKE_BUILD_TYPE=Release >/dev/null
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
echo "package consumer: ok"
