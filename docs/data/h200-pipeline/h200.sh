#!/bin/bash
# bash docs/data/h200-pipeline/h200.sh LIMIT_S: results/sm_90/hopper-table's confirmation on one H200,
# resumable across calls and machines. Run from the repository root on the GPU machine with .whl (wheels of
# tuner's dependencies missing there) and .carry (source pack, tuner code snapshot, the table's sweep stores,
# the state so far as state.tar.xz) carried. Each step is one tuner command, skipped once it has exited 0,
# started only with more than 60 s left, given --time-budget (stops between rounds, exit 3) and timed into
# h200/timing.tsv. The state (stores, reports, transcripts) comes back as $OUT/h200-state.tar.xz.
set -o pipefail
export PYTHONUNBUFFERED=1 TUNER_PROGRESS=plain
deadline=$(( $(date +%s) + $1 ))
R=$PWD
if [ ! -d /tmp/site/optuna ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
fi
# tuner's code: the snapshot in .carry/code (git archive of commit 1cb6dc4), not the working tree's tuner/,
# which other work edits meanwhile; -P keeps the working directory off sys.path
export PYTHONPATH=/tmp/site:$R/.carry/code
export TUNER_HOME=$R/.devhome TUNER_RUNS=$R/.devhome/runs
tn() { python3 -P -m tuner "$@"; }
mkdir -p .devhome
[ -d .devhome/sources/832db0699007f1be ] || tn source unpack .carry/llama-0.3.36.tgz >/dev/null || exit 1
P=$R/.devhome/h200
if [ ! -d "$P" ]; then
  if [ -f .carry/state.tar.xz ]; then tar -xJf .carry/state.tar.xz -C .devhome || exit 1
  else mkdir -p "$P"; cp -r .carry/ht/fa .carry/ht/mmq .carry/ht/ne1 "$P/"; fi
  # each machine builds once (the build is not part of the carried state)
  rm -f "$P/build.done"
fi
T=$P/timing.tsv
GPU=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
# the stores hold NVIDIA H200 rounds only (a confirm store refuses another model's, exit 2): on any other
# GPU stop here, before the build, and say which one came
[ "$GPU" = "NVIDIA H200" ] || { echo "this machine's GPU is $GPU, not an NVIDIA H200: nothing run" >&2; exit 4; }
nvidia-smi --query-gpu=timestamp,name,driver_version,pci.bus_id,clocks.sm,clocks.max.sm,clocks.applications.graphics,clocks.mem,clocks.max.mem,memory.total,power.limit --format=csv | tee -a "$P/gpu.txt"
if [ ! -f "$P/nvidia-smi-q.txt" ]; then  # once per state: the full report, and a copy bandwidth read by PyTorch
  nvidia-smi -q > "$P/nvidia-smi-q.txt"
  python3 - >> "$P/gpu.txt" <<'PY'
import torch
a = torch.empty(2 * 1024**3, dtype=torch.uint8, device="cuda"); b = torch.empty_like(a)
for _ in range(3): b.copy_(a)
e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
e0.record()
for _ in range(20): b.copy_(a)
e1.record(); torch.cuda.synchronize()
s = e0.elapsed_time(e1) / 1e3 / 20
p = torch.cuda.get_device_properties(0)
print(f"torch: {p.name}, {p.multi_processor_count} SMs, {p.total_memory / 2**30:.1f} GiB; device-to-device copy of 2 GiB: "
      f"{2 * a.numel() / s / 1e12:.2f} TB/s counting bytes read and written (mean of 20 after 3 warm-ups)")
PY
  tail -1 "$P/gpu.txt"
fi
step() {  # step NAME ARGS...: `tuner ARGS --time-budget LEFT` unless NAME is done, timed
  name=$1; shift
  [ -f "$P/$name.done" ] && return 0
  left=$(( deadline - $(date +%s) ))
  [ $left -le 60 ] && return 1
  s=$(date +%s)
  [ "$name" != build ] && set -- "$@" --time-budget $(( left - 30 ))
  echo "\$ tuner $*" >> "$P/$name-transcript.txt"
  timeout $left python3 -P -m tuner "$@" 2>&1 | tee -a "$P/$name-transcript.txt" | grep -v '^\s*$' | tail -25
  rc=${PIPESTATUS[0]}
  e=$(date +%s)
  printf '%s\t%s\t%s\t%s\t%s\t%s\n' "$name" "$s" "$e" "$((e-s))" "$rc" "$GPU" >> "$T"
  echo "rc=$rc wall=$((e-s)) s on $GPU" >> "$P/$name-transcript.txt"
  [ "$rc" -eq 0 ] && touch "$P/$name.done"
  return $rc
}
FA="$P/fa --mmq $P/mmq"
ALL="--like llama-3.1-8b --like llama-3.2-1b --like qwen2.5-3b --like gemma-3-12b-shape"
# a build packed off the GPU machine (`tuner build ... --pack .carry/build-sm90.tar.xz`, docs/h100.md) is installed
# instead of compiling where it was carried (not yet tried on an H200); else the build takes 350-365 s here
BUILD="--arch sm_90 --hook mmq --targets llama-bench,test-backend-ops,llama-quantize,llama-perplexity"
if [ -f .carry/build-sm90.tar.xz ]; then BUILD="$BUILD --from-pack .carry/build-sm90.tar.xz"; else BUILD="$BUILD -j 16"; fi
step build build $BUILD \
  && step c8b sweep confirm $FA --like llama-3.1-8b -o $P/confirm \
  && step ub512-iq4_xs sweep confirm $FA --like llama-3.1-8b --quant IQ4_XS --depths 0 --mmq-like none -o $P/ub512-iq4_xs \
  && step ub512-q5_k_m sweep confirm $FA --like llama-3.1-8b --quant Q5_K_M --depths 0 --mmq-like none -o $P/ub512-q5_k_m \
  && step c3 sweep confirm $FA --like llama-3.1-8b --like llama-3.2-1b --like qwen2.5-3b -o $P/confirm \
  && step ne1 sweep confirm $P/ne1 --like llama-3.1-8b --like llama-3.2-1b --like qwen2.5-3b --mmq-like none -o $P/confirm-ne1 \
  && step call sweep confirm $FA $ALL -o $P/confirm
# the state only: stores, reports, transcripts (models, logits files and logs are remade where needed)
tar -cJf "$OUT/h200-state.tar.xz" -C .devhome --exclude=logs --exclude='*.kld' --exclude='*.gguf' --exclude=equivalence h200
ls -la "$OUT"; cat "$T"
