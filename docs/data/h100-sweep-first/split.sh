#!/bin/bash
# Device: the sweeps' build (split MMA TUs + MMQ hook), 1-TU rebuild timings, FLASH_ATTN_EXT and MUL_MAT checks.
set -o pipefail
. docs/h100-env.sh || exit 1
export TUNER_PROGRESS=plain
b() { local t0=$(date +%s%N); python3 -m tuner build --arch sm_90 --variant cuda --hook mmq -j 16 "$@" 2>&1 | grep -v "steps (" ; echo "wall $(( ($(date +%s%N) - t0) / 1000000 )) ms for: tuner build --arch sm_90 --variant cuda --hook mmq -j 16 $*"; }
{
echo "== full build"; b
echo "== trial A: one D64 MMA row changed"; b --set mma.ampere.d64.c8.occupancy=1
echo "== trial B: one D128 MMA row changed (A's header back to empty)"; b --set mma.ampere.d128.c8.occupancy=1
echo "== trial A again"; b --set mma.ampere.d64.c8.occupancy=1
echo "== upstream rows again"; b
} | tee $OUT/build.txt
B=$(awk -F'|' '/bin dir/{gsub(/ /,"",$3); print $3}' $OUT/build.txt | tail -1)
echo "bin: $B"
( time timeout 240 $B/test-backend-ops -o FLASH_ATTN_EXT -b CUDA0 ) > $OUT/fa-check.log 2>&1; echo "rc=$?"; grep -c "OK$" $OUT/fa-check.log; grep -c "FAIL" $OUT/fa-check.log; tail -6 $OUT/fa-check.log
