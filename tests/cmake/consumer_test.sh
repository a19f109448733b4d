#!/usr/bin/env bash
# The installed package works for another project used the way a stranger would use it:
# `cmake --install` the build tree into a fresh prefix, check that the installed headers hold no
# file-scope `using namespace`, then configure, build and run against that prefix
#   consumers/core   find_package(kvq) and kvq::core, no C++ standard set, with OpenMP, Eigen3,
#                    PkgConfig (PCRE2), nlohmann_json and CUDAToolkit unfindable (core needs fmt);
#   consumers/full   find_package(kvq) and the whole library, no C++ standard set;
#   examples/consumer
# and configure consumers/missing (find_package(kvq REQUIRED COMPONENTS model) without OpenMP),
# which must fail with kvq's message naming the component and the package.
#   consumer_test.sh BUILD_DIR SOURCE_DIR WORK_DIR
set -euo pipefail
BUILD=$1 SRC=$2 WORK=$3
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
rm -rf "$WORK"
mkdir -p "$WORK"

# quietly LOG CMD...: runs CMD with its output in LOG; on failure prints LOG and stops.
quietly() {
  local log=$1
  shift
  if ! "$@" >"$log" 2>&1; then
    cat "$log" >&2
    echo "consumer_test: failed: $*" >&2
    exit 1
  fi
}

quietly "$WORK/install.log" cmake --install "$BUILD" --prefix "$WORK/prefix" --component dev
test -f "$WORK/prefix/lib/cmake/kvq/kvqConfig.cmake"
if grep -rn '^using namespace' "$WORK/prefix/include/kvq"; then
  echo "consumer_test: public headers must not hold 'using namespace' at file scope" >&2
  exit 1
fi

# consumer NAME SOURCE_DIR EXE [CMAKE_ARGS...]: configure, build and run one consumer project.
consumer() {
  local name=$1 src=$2 exe=$3
  shift 3
  quietly "$WORK/$name.configure.log" cmake -S "$src" -B "$WORK/$name" \
    -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH="$WORK/prefix" "$@"
  quietly "$WORK/$name.build.log" cmake --build "$WORK/$name" -j 2
  "$WORK/$name/$exe"
}

unfindable=()
for pkg in OpenMP Eigen3 PkgConfig nlohmann_json CUDAToolkit; do
  unfindable+=("-DCMAKE_DISABLE_FIND_PACKAGE_$pkg=ON")
done
consumer core "$HERE/consumers/core" core_consumer "${unfindable[@]}"
consumer full "$HERE/consumers/full" full_consumer
consumer example "$SRC/examples/consumer" kvq_consumer

log=$WORK/missing.configure.log
if cmake -S "$HERE/consumers/missing" -B "$WORK/missing" -DCMAKE_PREFIX_PATH="$WORK/prefix" \
  -DCMAKE_DISABLE_FIND_PACKAGE_OpenMP=ON >"$log" 2>&1; then
  echo "consumer_test: find_package(kvq COMPONENTS model) succeeded with OpenMP unfindable" >&2
  exit 1
fi
if ! grep -q 'kvq::model' "$log" || ! grep -q 'OpenMP' "$log"; then
  cat "$log" >&2
  echo "consumer_test: the failure above does not name kvq::model and OpenMP" >&2
  exit 1
fi
echo "missing: find_package(kvq COMPONENTS model) without OpenMP fails naming both"
