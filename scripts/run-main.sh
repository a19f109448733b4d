#!/usr/bin/env bash
# The main job: set up (packages, model, text, plot venv, build), then
#  1. kvq plan: the design note's capacity/bandwidth scenario (Llama 3.1 8B on an H100 SXM);
#  2. kvq compare: every FP8 and KIVI scheme on a synthetic key tensor with outlier channels;
#  3. kvq run experiments/configs/default.toml: the default experiment - synthetic K/V metrics for
#     14 schemes and SmolLM2-135M perplexity / KLD vs the fp32 cache on KJV text for 6 of them,
#     in 512- and 2,048-token windows (results/default/*.csv, resumable: rerunning skips
#     finished rows);
#  4. plots of those results (results/default/*.png).
# After setup (a first build takes ~15 minutes on 2 cores with the CUDA kernels), the runs take
# about two minutes: the default config finishes in ~110 s.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
scripts/setup.sh
KVQ=build/${KVQ_PRESET:-default}/experiments/kvq
echo; echo "== kvq plan =="; "$KVQ" plan
echo; echo "== kvq compare --role key =="
"$KVQ" compare --role key --kv bf16 fp8_e4m3:gran=tensor fp8_e4m3:gran=head fp8_e4m3:gran=token \
  fp8_e4m3:gran=channel fp8_e5m2:gran=token kivi8 kivi4 kivi2 int2:k=token,v=token
echo; echo "== kvq run experiments/configs/default.toml =="
# Results of an earlier default.toml are kept aside, not refused and not mixed with new rows.
if [[ -f results/default/config.toml ]] &&
   ! cmp -s results/default/config.toml experiments/configs/default.toml; then
  aside="results/default.before-$(date +%Y%m%d-%H%M%S)"
  mv results/default "$aside"
  echo "results/default was made by an earlier default.toml: kept as $aside"
fi
"$KVQ" run experiments/configs/default.toml
echo; .venv/bin/python experiments/plots/plot_results.py results/default
.venv/bin/python - results/default/model.csv <<'PY'
import csv, sys
rows = list(csv.DictReader(open(sys.argv[1])))
print(f"{'scheme':<40} {'ctx':>5} {'bits':>6} {'B/token':>8} {'ppl':>8} {'d ppl':>8} {'KLD':>9} {'top-1':>7}")
for r in rows:
    print(f"{r['scheme']:<40} {r['settings.ctx']:>5} {float(r['bits']):6.2f} {float(r['bytes_per_token']):8.0f} "
          f"{float(r['ppl']):8.4f} {float(r['delta_ppl']):+8.4f} {float(r['kld']):9.5f} "
          f"{100 * float(r['top1']):6.2f}%")
PY
