#!/usr/bin/env bash
# The standing side-by-side of kvq and llama.cpp on KV-cache damage (issue 10): the same GGUF
# (an F32 copy written by llama.cpp's own quantizer, so neither side quantizes activations), the
# same KJV text, the same 510 scored positions (the second half of two 512-token windows, as
# llama-perplexity scores), KLD against an f32 cache. llama.cpp runs with its Hadamard rotation of
# quantized caches on (its default since 2026) and off (LLAMA_ATTN_ROT_DISABLE=1); kvq with and
# without --hadamard. Not part of the build or of CI: it needs llama.cpp built from source.
#
#   LLAMA_BIN=/path/to/llama.cpp/build/bin experiments/plots/compare_llamacpp_kld.sh [OUTDIR]
#
# llama.cpp: build llama-perplexity and llama-quantize from the vendor/llama.cpp tree of PyPI's
# llama-cpp-python source archive (pip download --no-deps --no-binary :all: llama-cpp-python):
#   cmake -B build -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON -DLLAMA_CURL=OFF
#   cmake --build build -j2 --target llama-perplexity llama-quantize
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
: "${LLAMA_BIN:?set LLAMA_BIN to the build/bin folder of llama.cpp}"
OUT="${1:-/tmp/kvq-llamacpp-kld}"
mkdir -p "$OUT"
KVQ=build/default/experiments/kvq
MODEL_DIR="${KVQ_MODEL_DIR:-$HOME/.cache/kvq}"
GGUF="$MODEL_DIR/SmolLM2-135M-Instruct.Q4_1.gguf"
[ -x "$KVQ" ] || { echo "build kvq first (scripts/setup.sh)" >&2; exit 1; }
[ -f "$GGUF" ] || { echo "no model: run scripts/fetch-model.sh" >&2; exit 1; }
TEXT="$OUT/kjv600.txt"
head -600 "$MODEL_DIR/kjv.txt" > "$TEXT"
F32="$OUT/SmolLM2-135M-Instruct.F32.gguf"
[ -f "$F32" ] || "$LLAMA_BIN/llama-quantize" --allow-requantize "$GGUF" "$F32" F32 > "$OUT/quantize.log" 2>&1

lp() { "$LLAMA_BIN/llama-perplexity" -m "$F32" -f "$TEXT" -c 512 --chunks 2 -t 2 "$@"; }
lp -ctk f32 -ctv f32 -fa off --kl-divergence-base "$OUT/base.kld" > "$OUT/base.log" 2>&1
row() {  # name, then llama.cpp cache flags
  local name="$1"; shift
  for rot in on off; do
    local env=()
    [ "$rot" = off ] && env=(LLAMA_ATTN_ROT_DISABLE=1)
    env "${env[@]}" "$LLAMA_BIN/llama-perplexity" -m "$F32" -f "$TEXT" -c 512 --chunks 2 -t 2 -fa on \
      --kl-divergence-base "$OUT/base.kld" --kl-divergence "$@" > "$OUT/$name-rot$rot.log" 2>&1
    local kld top
    kld=$(grep -m1 "Mean    KLD" "$OUT/$name-rot$rot.log" | awk '{print $3}')
    top=$(grep -m1 "Same top p:" "$OUT/$name-rot$rot.log" | awk '{print $4 " %"}')
    echo "| llama.cpp $name | rotation $rot | $kld | $top |"
  done
}
kvq_row() {  # spec
  for rot in "" --hadamard; do
    "$KVQ" model ppl --model-file "$GGUF" --kv "$1" $rot --text "$TEXT" --ctx 512 --max-tokens 1024 \
      --score-from 256 --threads 2 --json "$OUT/kvq.json" > /dev/null 2>&1
    python3 -c 'import json, sys; j = json.load(open(sys.argv[1]))
print("| kvq %s | %s | %.6f | %.3f %% |" % (j["kv"], "hadamard" if j["hadamard"] else "none",
                                          j["kld"], 100 * j["top1"]))' "$OUT/kvq.json"
  done
}
echo "| cache | rotation | mean KLD | same top-1 |"
echo "|---|---|---:|---:|"
row q4_1 -ctk q4_1 -ctv q4_1
kvq_row "int4:k=token,v=token,g=32"
row q4_0 -ctk q4_0 -ctv q4_0
kvq_row "int4:k=token,v=token,g=32,sym"
row q8_0 -ctk q8_0 -ctv q8_0
kvq_row "int8:k=token,v=token,g=32,sym"
echo "base ppl: $(grep -m1 'Final estimate' "$OUT/base.log")"
