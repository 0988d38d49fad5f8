#!/usr/bin/env bash
# Installs what Strata needs to build and test on Debian 12, from Debian's packages.
# Usage: cmake/install_deps.sh   (as root, or with sudo available)
set -euo pipefail

packages=(
  build-essential cmake ninja-build pkg-config git
  libabsl-dev nlohmann-json3-dev liburing-dev libnuma-dev
  libcpp-httplib-dev      # strata serve's HTTP server
  catch2 libbenchmark-dev
  clang libclang-rt-dev   # libFuzzer targets replay their corpus in the tests
  python3 python3-venv    # the server test's virtual environment (below)
)

sudo_cmd=()
if [ "$(id -u)" -ne 0 ]; then sudo_cmd=(sudo); fi

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ "${#missing[@]}" -gt 0 ]; then
  echo "strata: installing ${missing[*]}" >&2
  "${sudo_cmd[@]}" apt-get update -qq
  DEBIAN_FRONTEND=noninteractive "${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

# The Python tests' environment: a virtual environment in the build tree (build/venv, or STRATA_VENV)
# with the official `openai` client (the server test), numpy and pytest (the Python package's tests)
# and gguf (scripts/quant: the codec fixtures' oracle and the GGUF reader)
# from PyPI, so nothing is installed into the system's Python.
venv="${STRATA_VENV:-$(cd "$(dirname "$0")/.." && pwd)/build/venv}"
if ! "$venv/bin/python3" -c "import openai, numpy, pytest, gguf" 2>/dev/null; then
  echo "strata: making $venv with openai, numpy, pytest and gguf" >&2
  python3 -m venv "$venv"
  "$venv/bin/python3" -m pip install -q --disable-pip-version-check "openai>=1.0" numpy pytest gguf
fi
