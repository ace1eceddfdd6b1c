# Session 4 (issue 15) on the lent H100: screen -> compose -> tune -> confirm for the two GQA-4 shapes.
# Source after docs/h100/env.sh. Every step leaves its transcript, logs and study database under $OUT.
#   s4_setup                  sm_90 build (variant cuda) + llama-3.2-1b and llama-3.1-8b shapes, Q4_K_M
#   s4_search NAME MODEL SECONDS [args]   resumable: rerun with the same NAME to continue
M1=$TUNER_HOME/models/l1b-q4km.gguf
M8=$TUNER_HOME/models/l8b-q4km.gguf

# Compile-time MMA rows pinned at upstream: this session spends its device time on the kernel screen
# and the confirm stage; the tune stage samples the process-wide knobs (graph opt, PDL, fusion, -ub).
_pin_rows() {
  local d f out=""
  for d in 64 128; do
    for f in nbatch_fa=64 nbatch_combine=$((d / 2)) nstages_target=2 Q_in_reg=1 nthreads=128 occupancy=2; do out="$out --set mma.ampere.d$d.c64.$f"; done
    out="$out --set mma.ampere.d$d.c64.nbatch_K2=$((d / 2)) --set mma.ampere.d$d.c64.nbatch_V2=$((d / 2))"
  done
  echo "$out"
}

s4_setup() {
  mkdir -p "$TUNER_HOME/models"
  [ -f "$M8" ] || python3 -m tuner model synth --like llama-3.1-8b -o "$TUNER_HOME/models/l8b-f16.gguf" >"$OUT/synth8b.log" 2>&1 &
  local synth=$!
  python3 -m tuner build --arch sm_90 --variant cuda -j 16 >"$OUT/build-sm90.txt" 2>&1 || { tail -20 "$OUT/build-sm90.txt"; return 1; }
  B=$(awk '/bin dir/ {print $5}' "$OUT/build-sm90.txt")
  [ -f "$M1" ] || python3 -m tuner model synth --like llama-3.2-1b --quant Q4_K_M --quantize-with "$B/llama-quantize" -o "$M1" >"$OUT/synth1b.log" 2>&1 || return 1
  wait $synth
  if [ ! -f "$M8" ]; then
    /usr/bin/time -f "quantize %e s" "$B/llama-quantize" "$TUNER_HOME/models/l8b-f16.gguf" "$M8" Q4_K_M 16 >"$OUT/quantize8b.log" 2>&1 || return 1
    rm -f "$TUNER_HOME/models/l8b-f16.gguf"
  fi
  tail -2 "$OUT/build-sm90.txt"; ls -la "$TUNER_HOME/models"
}

s4_search() {
  local name=$1 model=$2 secs=$3
  mkdir -p "$TUNER_RUNS/$name"
  # A study database brought back from an earlier machine continues there.
  [ -f "$TUNER_RUNS/$name/study.db" ] || [ ! -f "docs/h100/session4/$name.db" ] || cp "docs/h100/session4/$name.db" "$TUNER_RUNS/$name/study.db"
  # (calls 1-3 of session 4 ran the version without --storage under $OUT; see README)
  # The database lives under $OUT, which comes back even when the call is killed at its limit (call 3
  # of this session lost its study that way); it is copied back to the run dir for the next call.
  cp "$TUNER_RUNS/$name/study.db" "$OUT/$name.db" 2>/dev/null
  python3 -m tuner search --arch sm_90 --variant cuda --model "$model" --study "$name" --run-dir "$TUNER_RUNS/$name" \
    --storage "sqlite:///$OUT/$name.db" --time-budget "$secs" --jobs 16 $(_pin_rows) "${@:4}" 2>&1 | tee "$OUT/search-$name.txt"
  cp "$OUT/$name.db" "$TUNER_RUNS/$name/study.db"
  tar czf "$OUT/$name-logs.tgz" --exclude '*.db' -C "$TUNER_RUNS" "$name" 2>/dev/null
}
