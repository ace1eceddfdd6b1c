#!/bin/bash
# .carry/pipe.sh LIMIT_S: the sm_90 table end to end on one H100, resumable across calls and machines:
# install the carried build, FlashAttention sweep, MMQ sweep, confirm. Each step's tuner calls are timed
# into pipe/timing.tsv; the state (stores, reports, transcripts) comes back as $OUT/pipe.tar.
set -o pipefail
. docs/h100-env.sh || exit 1
export TUNER_PROGRESS=plain
P=.devhome/pipe
if [ ! -d "$P" ] && [ -f .carry/pipe.tar ]; then tar -xf .carry/pipe.tar -C .devhome || exit 1; fi
mkdir -p "$P"
T=$P/timing.tsv
deadline=$(( $(date +%s) + $1 ))
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,memory.total --format=csv,noheader | tee -a $P/gpu.txt
GPU=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
step() {  # step NAME ARGS...: `tuner ARGS` unless NAME is done, within the time left, timed
  name=$1; shift
  [ -f "$P/$name.done" ] && return 0
  left=$(( deadline - $(date +%s) ))
  [ $left -le 30 ] && return 1
  s=$(date +%s)
  # each step stops between rounds within the call (exit 3: resumed by the next call)
  set -- "$@" --time-budget $(( left - 30 ))
  echo "\$ tuner $*" >> "$P/$name-transcript.txt"
  timeout $left python3 -m tuner "$@" 2>&1 | tee -a "$P/$name-transcript.txt" | grep -v '^\s*$' | grep -v "measuring calls" | tail -30
  rc=${PIPESTATUS[0]}
  e=$(date +%s)
  printf '%s\t%s\t%s\t%s\t%s\t%s\n' "$name" "$s" "$e" "$((e-s))" "$rc" "$GPU" >> "$T"
  echo "rc=$rc wall=$((e-s)) s" >> "$P/$name-transcript.txt"
  [ "$rc" -eq 0 ] && touch "$P/$name.done"
  return $rc
}
# the build is this machine's, not the carried state's: installed once per machine
if [ ! -f .devhome/build-installed ]; then
  s=$(date +%s)
  python3 -m tuner build --arch sm_90 --hook mmq --targets llama-bench,test-backend-ops,llama-quantize,llama-perplexity \
    --from-pack .carry/build-sm90.tar.xz 2>&1 | tee -a "$P/build-transcript.txt" | tail -12 || exit 1
  touch .devhome/build-installed
  printf 'install\t%s\t%s\t%s\t0\t%s\n' "$s" "$(date +%s)" "$(( $(date +%s) - s ))" "$GPU" >> "$T"
fi
step fa sweep run --arch sm_90 -o $P/fa \
  && step mmq sweep mmq --arch sm_90 --no-cuda-graphs -o $P/mmq \
  && step confirm sweep confirm $P/fa --mmq $P/mmq -o $P/confirm
# the state only: stores, reports, transcripts. The confirm's equivalence files (32 MB logits per run) and
# models are remade where a resumed call needs them; a file over 4 MB would not come back anyway.
find .devhome/pipe -type f -size +4M > "$OUT/left-out.txt"
tar -czf "$OUT/pipe.tar" -C .devhome --exclude=logs --exclude='*.kld' --exclude='*.gguf' \
  --exclude-from=<(sed 's|^\.devhome/||' "$OUT/left-out.txt") pipe
ls -la "$OUT"; cat "$T"
