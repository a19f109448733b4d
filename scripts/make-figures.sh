#!/usr/bin/env bash
# Regenerates the figures and tables the README and docs/results.md show, from a `kvq run` of
# experiments/configs/default.toml (resumable; through scripts/run-main.sh, which sets up what is
# missing) and the study configs below, into docs/img/.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
scripts/run-main.sh   # setup, and the default config into results/default (resumable)
.venv/bin/python experiments/plots/plot_results.py results/default --out docs/img
# Planner curves (the design note's tables as curves): decode tokens/s against the batch per KV
# format, capped by what fits, at three contexts (Llama 3.1 8B on an H100, the design note's).
build/${KVQ_PRESET:-default}/experiments/kvq plan --kv bf16 fp8 kivi4 kivi2 --sweep-csv build/plan_sweep.csv \
  --sweep-batch 1 2 4 8 16 32 64 128 256 --sweep-ctx 4096 32768 131072 > /dev/null
.venv/bin/python experiments/plots/plot_plan.py build/plan_sweep.csv --out docs/img/plan_sweep.png
# The model's own K/V through the Python package: per-channel magnitudes (KIVI's figure 2) and
# the per-layer granularity comparison (also granularity_layers.csv).
.venv/bin/python experiments/plots/channel_magnitudes.py --out docs/img
.venv/bin/python experiments/plots/granularity_layers.py --out docs/img
# Quality against context length (~4 minutes): KLD, top-1 and ppl per window length.
build/${KVQ_PRESET:-default}/experiments/kvq run experiments/configs/context.toml
.venv/bin/python experiments/plots/plot_context.py results/context --out docs/img
# Passkey retrieval grid (~8 minutes): found / trials per context and depth, per scheme.
build/${KVQ_PRESET:-default}/experiments/kvq run experiments/configs/needle.toml
.venv/bin/python experiments/plots/plot_needle.py results/needle --out docs/img
# RULER-style long-context tasks (~15 minutes): accuracy against length per task and scheme, and
# docs/img/ruler_accuracy.csv.
build/${KVQ_PRESET:-default}/experiments/kvq run experiments/configs/ruler.toml
.venv/bin/python experiments/plots/plot_ruler.py results/ruler --out docs/img
# Cache throughput (~10 + ~4 minutes, one thread; run it on a quiet machine): decode per batch
# over cold caches and prefill quantize, per scheme, backend and context, backend cpu in both int
# modes (exact, then int8).
build/${KVQ_PRESET:-default}/experiments/kvq run experiments/configs/throughput.toml
build/${KVQ_PRESET:-default}/experiments/kvq run experiments/configs/throughput_int8.toml
.venv/bin/python experiments/plots/plot_throughput.py results/throughput results/throughput_int8 \
  --out docs/img
# The issue-15 studies: rotation on/off (~10 minutes), exact attention sinks (~9 minutes), and the
# per-layer sensitivity (~5 minutes) whose kivi2 rows set the kivi2/kivi4 allocation (~2 minutes;
# the allocation config is regenerated from the sensitivity rows, then run).
build/${KVQ_PRESET:-default}/experiments/kvq run experiments/configs/rotation.toml
.venv/bin/python experiments/plots/plot_options.py rotation results/rotation --out docs/img
build/${KVQ_PRESET:-default}/experiments/kvq run experiments/configs/sinks.toml
.venv/bin/python experiments/plots/plot_options.py sinks results/sinks --out docs/img
build/${KVQ_PRESET:-default}/experiments/kvq run experiments/configs/layer_sensitivity.toml
.venv/bin/python experiments/plots/plot_options.py allocate results/layer_sensitivity \
  > build/layer_allocation.toml   # replaced only when the script succeeds
mv build/layer_allocation.toml experiments/configs/layer_allocation.toml
build/${KVQ_PRESET:-default}/experiments/kvq run experiments/configs/layer_allocation.toml
.venv/bin/python experiments/plots/plot_options.py layers results/layer_sensitivity \
  results/layer_allocation --out docs/img
