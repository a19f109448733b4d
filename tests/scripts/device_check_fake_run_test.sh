#!/usr/bin/env bash
# scripts/device-check.sh end to end without a GPU, on a pack of stand-ins: a fake nvidia-smi, nvcc
# and compute-sanitizer on PATH, and in place of every binary scripts/device-pack.sh --list names a
# script that prints what the real one would and writes its JSON (made-up numbers). The run must
# reach every step, exit 0 and write every section of the report with its table: the tests and
# sanitizers (side by side), the benches, [throughput], the model benches (depth 256, depth 32,704,
# batch 64 x 8k with its goals), chunked prefill, [model] and serve-bench; and the stand-in kvq
# must have been asked for the batch-64 decode as the plan says; the pack travels as pack.tar.xz. What the device run's report code
# does is checked here, before a device run spends its minutes on it.
# shellcheck disable=SC2016  # the stand-ins' bodies are single-quoted on purpose
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$root"
fail() { echo "FAIL: $*"; exit 1; }
t="$(mktemp -d)"
trap 'rm -rf "$t"' EXIT
mkdir -p "$t/path" "$t/pack/tests/cuda" "$t/pack/bench" "$t/pack/bin"
stub() {  # FILE BODY: an executable bash script
  printf '#!/usr/bin/env bash\n%s\n' "$2" >"$1"
  chmod +x "$1"
}
stub "$t/path/nvidia-smi" 'case "$*" in
  *compute_cap*) echo 9.0 ;;
  *name,driver*) echo "Stand-in H200, 580.0, 143771 MiB" ;;
  *) echo "GPU 0: Stand-in H200" ;;
esac'
stub "$t/path/nvcc" 'echo "Cuda compilation tools, release 13.0, V13.0.0"'
stub "$t/path/compute-sanitizer" 'while [[ "$1" == --* ]]; do shift 2; done
"$@"; rc=$?; echo "========= ERROR SUMMARY: 0 errors"; exit $rc'
test_stub='echo "[==========] 3 tests from 1 test suite ran. (5 ms total)"; echo "[  PASSED  ] 3 tests."'
bench_stub='for a; do [[ "$p" == --json ]] && echo "{\"goals\": [], \"results\": [], \"cases\": [{\"name\": \"q\", \"pct_peak\": 85.0}]}" >"$a"; p=$a; done
echo "| case | us |"; echo "|---|---:|"; echo "| stand-in | 1.0 |"'
# kvq: `run --out DIR CONFIG` writes the task's rows; `model bench|serve-bench ... --json F` its
# JSON; every call is logged.
kvq_stub='echo "$*" >>"'"$t"'/kvq.calls"
arg() { local k=$1; shift; while (( $# )); do [[ "$1" == "$k" ]] && { echo "$2"; return; }; shift; done; }
json=$(arg --json "$@"); spec=$(arg --kv "$@"); kv=${spec%%:*}
case "$1 $2" in
  "run --out")
    mkdir -p "$3"
    if [[ "$4" == *throughput* ]]; then
      echo "{\"device\": \"Stand-in\", \"driver_version\": 1, \"runtime_version\": 1, \"peak_gb_per_s\": 4800, \"peak_formula\": \"f\", \"memcpy_gb_per_s\": 3900, \"clock\": \"events\", \"context\": 4096, \"batch\": 1, \"scheme\": \"kivi2\", \"time_us\": 9.0, \"gb_per_s\": 900, \"of_peak\": 0.2, \"of_memcpy\": 0.25, \"speedup_vs_bf16\": 2.0}" >"$3/throughput.jsonl"
    else
      echo "{\"scheme\": \"kivi2\", \"settings\": {\"ctx\": 128}, \"ppl\": 9.0, \"ppl_fp32\": 8.0, \"kld\": 0.1, \"top1\": 0.9, \"quantized\": 0.5, \"seconds\": 1.0}" >"$3/model.jsonl"
    fi ;;
  "model bench")
    declare -A tps=([bf16]=100 [kivi4]=200 [kivi2]=300 [fp8_e4m3]=150)
    echo "{\"kv\": \"$kv\", \"depth\": $(arg --depth "$@"), \"batch\": $(b=$(arg --batch "$@"); echo "${b:-1}"), \"tg_tokens_per_s\": ${tps[$kv]}.0, \"pp_tokens_per_s\": 1000.0, \"tg_read_gbps\": 2400.0, \"peak_gbps\": 4800.0}" >"$json"
    echo "tg64 ${tps[$kv]}.0 tokens/s" ;;
  "model serve-bench")
    echo "{\"kv\": \"$spec\", \"max_held\": 7, \"decode_calls\": 30, \"decode_tokens_per_s\": 500.0, \"bound_decode_tokens_per_s\": 1000.0, \"peak_cache_bytes\": 4.0e7, \"predicted_peak_cache_bytes\": 4.0e7, \"device_bytes_start\": 1, \"device_bytes_peak\": 2, \"mem_bytes\": 5.0e7}" >"$json"
    echo "decode 500.0 tokens/s" ;;
  *) echo "stand-in kvq: $*" >&2; exit 9 ;;
esac'
while read -r f; do
  case "$f" in
    tests/cuda/*) stub "$t/pack/$f" "$test_stub" ;;
    bench/*) stub "$t/pack/$f" "$bench_stub" ;;
    bin/kvq) stub "$t/pack/$f" "$kvq_stub" ;;
    *) fail "device-pack.sh --list names $f, which this test has no stand-in for" ;;
  esac
done < <(scripts/device-pack.sh --list)
# As device runs go: only the compressed pack travels (device-pack.sh's DIR.tar.xz), device-check
# unpacks it.
tar -C "$t" -cf - pack | xz -1 >"$t/pack.tar.xz"
rm -rf "$t/pack"
rc=0
PATH="$t/path:$PATH" KVQ_MODEL_DIR="$t/none" KVQ_DC_PREBUILT="$t/pack" scripts/device-check.sh "$t/out" \
  >"$t/stdout" 2>"$t/stderr" || rc=$?
report="$t/out/report.md"
[[ -s "$report" ]] || fail "no report; stderr: $(cat "$t/stderr")"
((rc == 0)) || fail "device-check exited $rc; notes: $(grep -A40 '^## Build' "$report")"
has() { grep -qF -- "$1" "$report" || fail "the report lacks '$1'"; }
has "- GPU: Stand-in H200, 580.0, 143771 MiB"
[[ -x "$t/pack/bin/kvq" ]] || fail "pack.tar.xz was not unpacked beside it"
for b in $(scripts/device-pack.sh --list | grep '^tests/cuda/' | grep -v _full_test); do
  has "| ${b#tests/cuda/} | passed | 3 | 0 | 0 |"
done
has "| memcheck | cuda_attention_kernel_test"
[[ $(grep -c '| clean | 3 | ERROR SUMMARY: 0 errors |' "$report") == 3 ]] || fail "not 3 clean sanitizer rows"
for b in $(scripts/device-pack.sh --list | grep '^bench/'); do has "### ${b#bench/}"; done
has "| 4096 | 1 | kivi2 | 9.0 | 900 | 20% | 25% | 2.00x |"
has "## Decode at long context on backend cuda"
has "| kivi2 | 32704 | 1 | 300.0 | 3.00x | 2400 | 50% | kivi2 >= 1x bf16: met |"
has "## Decode at batch 64 on backend cuda"
has "| kivi4 | 8192 | 64 | 200.0 | 2.00x | 2400 | 50% | kivi4 >= 1.8x bf16: met |"
has "| kivi2 | 8192 | 64 | 300.0 | 3.00x | 2400 | 50% | kivi2 >= 2.5x bf16: met |"
has "| fp8_e4m3 | 8192 | 64 | 150.0 | 1.50x | 2400 | 50% |  |"
has "| chunked | 256 | 1000.0 | 3 |"
has "| kivi2 | 128 | fp32 | 9.000 | 8.000 | 0.1 | 90.0% | 50% | 1.0 |"
has "| kivi2:g=32,r=32 | 7 | 30 | 500 | 1000 | 0.500 |"
grep -q -- '--batch 64 --fill synthetic' "$t/kvq.calls" || fail "no batch-64 call: $(cat "$t/kvq.calls")"
grep -q -- '--kv fp8_e4m3:gran=token .*--depth 8192' "$t/kvq.calls" || fail "no fp8 batch call"
echo "device-check stand-in run: status 0, $(grep -c '^## ' "$report") sections"
