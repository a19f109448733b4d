#!/usr/bin/env bash
# The main job: set up, build, then run kvq on its default scenario:
#  1. the capacity/bandwidth planner on the design note's scenario (Llama 3.1 8B, H100 SXM);
#  2. every FP8 scheme on a synthetic KV tensor with outlier channels, keys then values.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
scripts/setup.sh
KVQ=build/${KVQ_PRESET:-default}/experiments/kvq
echo; echo "== kvq plan =="; "$KVQ" plan
echo; echo "== kvq compare --role key =="; "$KVQ" compare --role key
echo; echo "== kvq compare --role value =="; "$KVQ" compare --role value --outliers 0
