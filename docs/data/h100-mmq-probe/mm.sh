#!/bin/bash
set -o pipefail
. docs/h100-env.sh || exit 1
export TUNER_PROGRESS=plain
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
t0=$(date +%s)
for v in cuda cuda-force-cublas; do
  python3 -m tuner build --arch sm_90 --variant $v -j 16 2>&1 | grep -v "steps (" | tee $OUT/build-$v.txt | tail -4
done
b1=$(awk -F'|' '/bin dir/{gsub(/ /,"",$3); print $3}' $OUT/build-cuda.txt); b2=$(awk -F'|' '/bin dir/{gsub(/ /,"",$3); print $3}' $OUT/build-cuda-force-cublas.txt)
echo "bins: $b1 $b2 ($(( $(date +%s) - t0 )) s)"
timeout 200 python3 "$(dirname "$0")/mm.py" "$b1" "$b2" 3 2>&1 | tee $OUT/mm-probe.txt
echo "wall=$(( $(date +%s) - t0 ))s"
