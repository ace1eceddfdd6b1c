# Session 3 of issue 7 on the lent H100 (source this after docs/h100/env.sh).
#   machine 1:  s3_setup (build sm_90, llama-3.1-8b shape, threshold demo), then s3_search8b SECONDS [--set ...]
#               (resumable; the third call pinned the D=128 row at upstream with
#               --set mma.ampere.d128.c64.nthreads=128 --set mma.ampere.d128.c64.occupancy=2)
#   machine 2:  s3_sm89_setup (build sm_89 as 89-virtual, llama-3.2-1b shape, JIT timing), then s3_sm89 SECONDS
# Every step leaves its logs and the study database under $OUT.
M8=$TUNER_HOME/models/l8b-q4km.gguf
# JIT results of 89-virtual PTX persist here between processes (the default cache is too small).
export CUDA_CACHE_PATH=$TUNER_HOME/nvcache CUDA_CACHE_MAXSIZE=4294967296

# MMA rows at upstream values except the D=128 prefill row's nthreads x occupancy (this shape's head size).
_pin_rows() {
  local d f v out=""
  for d in 64 128; do
    for f in nbatch_fa=64 nbatch_combine=$((d / 2)) nstages_target=2 Q_in_reg=1; do out="$out --set mma.ampere.d$d.c64.$f"; done
    out="$out --set mma.ampere.d$d.c64.nbatch_K2=$((d / 2)) --set mma.ampere.d$d.c64.nbatch_V2=$((d / 2))"
  done
  echo "$out --set mma.ampere.d64.c64.nthreads=128 --set mma.ampere.d64.c64.occupancy=2 $*"
}

s3_setup() {
  mkdir -p "$TUNER_HOME/models"
  tuner model synth --like llama-3.1-8b -o "$TUNER_HOME/models/l8b-f16.gguf" --json >"$OUT/synth8b.json" 2>"$OUT/synth8b.log" &
  local synth=$!
  tuner build --arch sm_90 --variant cuda -j 16 >"$OUT/build-sm90.txt" 2>&1 || return 1
  wait $synth || return 1
  B=$(awk '/bin dir/ {print $5}' "$OUT/build-sm90.txt")
  /usr/bin/time -f "quantize %e s" "$B/llama-quantize" "$TUNER_HOME/models/l8b-f16.gguf" "$M8" Q4_K_M 16 \
    >"$OUT/quantize8b.log" 2>&1 || return 1
  tail -3 "$OUT/quantize8b.log"; rm -f "$TUNER_HOME/models/l8b-f16.gguf"
  # Selector thresholds flip the kernel: Llama GQA 4 decodes with VEC unless gqa 4 > T1 (default 4) and
  # n_kv >= T3 (default 8192). T1=2 -> MMA from n_kv 8192 on; T1=2 with T3=INT_MAX -> VEC again.
  local t
  for t in "" "GGML_TUNER_FA_T1=2" "GGML_TUNER_FA_T1=2 GGML_TUNER_FA_T3=2147483647"; do
    echo "== env: ${t:-(none)}"
    env GGML_TUNER_FA_LOG=1 $t "$B/llama-bench" -m "$M8" -fa 1 -p 0 -n 16 -d 0,8192 -r 1 2>&1 | grep -E "tg16|ne1=1 "
  done >"$OUT/thresholds.txt"
  cat "$OUT/thresholds.txt"
}

s3_search8b() {
  python3 -m tuner search --arch sm_90 --variant cuda --model "$M8" --depths 0,4096,16384,32768 \
    --study sm90-llama-3.1-8b-q4km --run-dir "$TUNER_RUNS/sm90-l8b" --trials 500 --time-budget "$1" \
    --jobs 16 $(_pin_rows "${@:2}") 2>&1 | tee "$OUT/search8b.txt"
  cp "$TUNER_RUNS"/sm90-l8b/*.db "$OUT/" 2>/dev/null
  tar czf "$OUT/search8b-logs.tgz" --exclude '*.db' -C "$TUNER_RUNS" sm90-l8b 2>/dev/null
}

# sm_89 on the H100: 89-virtual (PTX, JIT-compiled for the H100 at first use; `tuner build` and
# `tuner search` pick it because the local GPU is newer). The first llama-bench run pays the JIT; it
# is timed here so that cost is data, not a hidden part of the baseline's first measurement.
M1=$TUNER_HOME/models/l1b-q4km.gguf
s3_sm89_setup() {
  tuner build --arch sm_89 --variant cuda -j 16 >"$OUT/build-sm89.txt" 2>&1 || return 1
  cat "$OUT/build-sm89.txt"
  B89=$(awk '/bin dir/ {print $5}' "$OUT/build-sm89.txt")
  tuner model synth --like llama-3.2-1b --quant Q4_K_M --quantize-with "$B89/llama-quantize" -o "$M1" \
    >"$OUT/synth1b.log" 2>&1 || return 1
  [ "$1" = quick ] && return 0  # the JIT timing below was taken once (jit89.txt); later setups skip it
  { /usr/bin/time -f "first run (JIT) %e s" "$B89/llama-bench" -m "$M1" -fa 1 -p 512 -n 16 -r 1
    /usr/bin/time -f "second run (JIT cache) %e s" "$B89/llama-bench" -m "$M1" -fa 1 -p 512 -n 16 -r 1
    du -sh "$CUDA_CACHE_PATH"; } >"$OUT/jit89.txt" 2>&1
  cat "$OUT/jit89.txt"
}

# Compile-time rows pinned at upstream (a short search of the runtime knobs).
s3_sm89() {
  python3 -m tuner search --arch sm_89 --ptx-jit --variant cuda --model "$M1" \
    --depths 0,4096,16384,32768 --study sm89v-llama-3.2-1b-q4km --run-dir "$TUNER_RUNS/sm89-l1b" \
    --trials 500 --time-budget "$1" --jobs 16 \
    $(_pin_rows --set mma.ampere.d128.c64.nthreads=128 --set mma.ampere.d128.c64.occupancy=2) 2>&1 | tee "$OUT/search89.txt"
  cp "$TUNER_RUNS"/sm89-l1b/*.db "$OUT/" 2>/dev/null
  tar czf "$OUT/search89-logs.tgz" --exclude '*.db' -C "$TUNER_RUNS" sm89-l1b 2>/dev/null
}
