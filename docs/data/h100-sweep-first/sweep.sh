#!/bin/bash
# Device steps: bash .carry/sweep.sh SECONDS fa|mmq NAME [tuner sweep run|mmq args...]
# Results stay in .devhome/sw/NAME (resumable on this machine) and are tarred to $OUT after each call.
set -o pipefail
. docs/h100-env.sh || exit 1
export TUNER_PROGRESS=plain
secs=$1; mode=$2; name=$3; shift 3
mkdir -p .devhome/sw
[ -f .carry/sw.tgz ] && [ ! -d .devhome/sw/$name ] && tar xzf .carry/sw.tgz -C .devhome && echo "restored .devhome/sw from .carry/sw.tgz"
cmd=run; [ "$mode" = mmq ] && cmd=mmq
t0=$(date +%s)
echo "$ tuner sweep $cmd $* -o sw/$name" | tee -a "$OUT/$name.txt"
timeout -s TERM "$secs" python3 -m tuner sweep $cmd "$@" -o .devhome/sw/$name 2>&1 | tee -a "$OUT/$name.txt"
echo "rc=${PIPESTATUS[0]} wall=$(( $(date +%s) - t0 ))s" | tee -a "$OUT/$name.txt"
tar czf "$OUT/sw.tgz" -C .devhome sw
ls -la "$OUT"
