#!/usr/bin/env bash
# Regenerates the figures and tables the README and docs/results.md show, from a `kvq run` of
# experiments/configs/default.toml (resumable) into docs/img/. Run after scripts/run-main.sh or
# on its own (it sets up what is missing).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
scripts/setup.sh
build/${KVQ_PRESET:-default}/experiments/kvq run experiments/configs/default.toml
.venv/bin/python experiments/plots/plot_results.py results/default --out docs/img
