#!/usr/bin/env bash
# Writes the King James Bible as plain text (verse references stripped, one verse per line) to
# ${KVQ_MODEL_DIR:-$HOME/.cache/kvq}/kjv.txt from Debian's bible-kjv package. Idempotent.
set -euo pipefail
dir="${KVQ_MODEL_DIR:-$HOME/.cache/kvq}"
out="$dir/kjv.txt"
if [ -s "$out" ]; then echo "$out"; exit 0; fi
command -v bible >/dev/null || { echo "fetch-text: the 'bible' program is missing; apt-get install bible-kjv" >&2; exit 1; }
mkdir -p "$dir"
tmp="$out.tmp.$$"
bible -f "Gen1:1-Rev22:21" | sed 's/^[^ ]* //' > "$tmp"
lines=$(wc -l < "$tmp")
[ "$lines" -ge 31000 ] || { rm -f "$tmp"; echo "fetch-text: bible printed only $lines verses (expected 31,102)" >&2; exit 1; }
mv "$tmp" "$out"
echo "$out"
