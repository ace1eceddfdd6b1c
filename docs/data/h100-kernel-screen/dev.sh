#!/bin/bash
# Device steps: bash .carry/dev.sh search SECONDS [tuner search args...] | sweep SECONDS [tuner sweep run args...]
set -o pipefail
. docs/h100-env.sh || exit 1
export TUNER_PROGRESS=plain
stamp=$(date +%H%M%S)
mode=$1; secs=${2:-560}; shift 2
echo "start $(date -u +%FT%TZ)"
case "$mode" in
search)
  nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
  t0=$(date +%s)
  echo "$ tuner search $*" | tee "$OUT/search-$stamp.txt"
  timeout -s TERM "$secs" python3 -m tuner search "$@" 2>&1 | tee -a "$OUT/search-$stamp.txt"
  echo "rc=${PIPESTATUS[0]} wall=$(( $(date +%s) - t0 ))s" | tee -a "$OUT/search-$stamp.txt"
  tar czf "$OUT/runs.tgz" -C .devhome runs 2>/dev/null
  ;;
sweep)
  t0=$(date +%s)
  mkdir -p .devhome/sweep
  echo "$ tuner sweep run $* -o .devhome/sweep" | tee "$OUT/sweep-$stamp.txt"
  timeout -s TERM "$secs" python3 -m tuner sweep run "$@" -o .devhome/sweep 2>&1 | tee -a "$OUT/sweep-$stamp.txt"
  echo "rc=${PIPESTATUS[0]} wall=$(( $(date +%s) - t0 ))s" | tee -a "$OUT/sweep-$stamp.txt"
  tar czf "$OUT/sweep.tgz" -C .devhome sweep 2>/dev/null
  ;;
esac
ls -la "$OUT"
