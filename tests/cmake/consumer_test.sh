#!/usr/bin/env bash
# The installed package works for another project: `cmake --install` the build tree into a fresh
# prefix, check the installed headers hold no file-scope `using namespace`, configure
# examples/consumer with find_package(kvq) against that prefix, build it and run it.
#   consumer_test.sh BUILD_DIR SOURCE_DIR WORK_DIR
set -euo pipefail
BUILD=$1 SRC=$2 WORK=$3
rm -rf "$WORK"
cmake --install "$BUILD" --prefix "$WORK/prefix" --component dev >/dev/null
test -f "$WORK/prefix/lib/cmake/kvq/kvqConfig.cmake"
if grep -rn '^using namespace' "$WORK/prefix/include/kvq"; then
  echo "consumer_test: public headers must not hold 'using namespace' at file scope" >&2
  exit 1
fi
cmake -S "$SRC/examples/consumer" -B "$WORK/build" -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_PREFIX_PATH="$WORK/prefix" >/dev/null
cmake --build "$WORK/build" -j 2 >/dev/null
"$WORK/build/kvq_consumer"
