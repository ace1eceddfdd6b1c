#!/bin/bash
# bash docs/data/h200-pipeline/validate.sh [LIMIT_S]: `tuner validate --gpu` of results/sm_90/hopper-table on an
# H200, with this checkout's tuner. Run right after h200.sh has finished its `call` step there (the stores in
# .devhome/h200), it first merges the table again with the H200's four confirm stores (as
# tools/reexport-results.sh does with the stored copies); on a machine without that step it validates the
# table as committed. The transcripts and the validated table come back under $OUT; nothing here is measured
# for a speedup (test-backend-ops and ncu only).
set -o pipefail
source docs/h100-env.sh || exit 1
P=$PWD/.devhome/h200
[ "$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)" = "NVIDIA H200" ] || { echo "not an NVIDIA H200: nothing run" >&2; exit 4; }
ht=results/sm_90/hopper-table
if [ -f "$P/call.done" ]; then
  tmp=$(mktemp -d)
  cp -r "$ht/parts/fattn-mmq-table" "$ht/parts/fattn-ne1-table" "$tmp/"
  { echo "\$ tuner sweep merge fattn-mmq-table fattn-ne1-table --gpu h200/confirm --gpu h200/confirm-ne1 --gpu h200/ub512-iq4_xs --gpu h200/ub512-q5_k_m -o hopper-table"
    tuner sweep merge "$tmp/fattn-mmq-table" "$tmp/fattn-ne1-table" -o "$tmp/hopper-table" \
      --gpu "$P/confirm" --gpu "$P/confirm-ne1" --gpu "$P/ub512-iq4_xs" --gpu "$P/ub512-q5_k_m"; echo "rc=$?"; } 2>&1 | tee "$OUT/merge-transcript.txt"
  cp -r "$ht/evidence" "$tmp/hopper-table/"
  rm -rf "$ht" && cp -r "$tmp/hopper-table" "$ht"
else
  echo "no finished call step here: the table as committed is validated" | tee "$OUT/merge-transcript.txt"
fi
sha256sum "$ht/upstream.patch" | tee -a "$OUT/merge-transcript.txt"
nvidia-smi --query-gpu=timestamp,name,driver_version,clocks.max.sm,clocks.applications.graphics,memory.total --format=csv > "$OUT/gpu.txt"
s=$(date +%s)
{ echo "\$ tuner validate --gpu results/sm_90/hopper-table"
  timeout $(( ${1:-570} )) python3 -m tuner validate --gpu "$ht"; echo "rc=$? wall=$(( $(date +%s) - s )) s on $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)"; } 2>&1 | tee "$OUT/validate-gpu-transcript.txt"
mkdir -p "$OUT/hopper-table" && cp -r "$ht"/PR.md "$ht"/report.md "$ht"/table.toml "$ht"/upstream.patch "$ht"/gpus "$OUT/hopper-table/"
[ -f "$P/call.done" ] && cp "$P/confirm/confirm.sqlite3" "$OUT/confirm.sqlite3"
exit 0
