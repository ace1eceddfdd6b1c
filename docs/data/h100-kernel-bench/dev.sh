#!/bin/bash
# Device steps: bash .carry/dev.sh search SECONDS | kbench
set -o pipefail
. docs/h100-env.sh || exit 1
export TUNER_PROGRESS=plain
stamp=$(date +%H%M%S)
echo "start $(date -u +%FT%TZ)"
case "$1" in
search)
  nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader; command -v ccache || echo "no ccache"
  t0=$(date +%s)
  timeout -s TERM "${2:-560}" python3 -m tuner search 2>&1 | tee "$OUT/search-$stamp.txt"
  echo "rc=${PIPESTATUS[0]} wall=$(( $(date +%s) - t0 ))s" | tee -a "$OUT/search-$stamp.txt"
  ;;
kbench)
  t0=$(date +%s)
  python3 .carry/kbench.py 2>&1 | tee "$OUT/kbench-$stamp.txt"
  echo "rc=${PIPESTATUS[0]} wall=$(( $(date +%s) - t0 ))s" | tee -a "$OUT/kbench-$stamp.txt"
  ;;
esac
tar czf "$OUT/runs.tgz" -C .devhome runs 2>/dev/null
ls -la "$OUT"
