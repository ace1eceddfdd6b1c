# Session 6 (issue 15) on the lent H100: finish the 8B and 1B studies of session 5 (resumed from their
# databases) and confirm them. Source after docs/h100/env.sh.
#   s6_setup        sm_90 build while both shapes are written and quantized (a carried CPU llama-quantize)
#   s6_call         the 1B, then the 8B, each with what is left of the call's 575 s; rerun until done
# s5_search, M1, M8 and L8_ARGS are session 5's.
. docs/h100/session5.sh

# A static CPU-only llama-quantize built on the dev machine from the same source (x86-64 with AVX2,
# `docs/h100/session6/quantize-build.txt`): quantizing needs no GPU, so both shapes are ready when
# the 376 s sm_90 build ends instead of ~120 s after it. Falls back to the built one.
Q=$PWD/.carry/llama-quantize

s6_setup() {
  mkdir -p "$TUNER_HOME/models" "$TUNER_HOME/setup"
  local S=$TUNER_HOME/setup q=$Q
  "$q" 2>&1 | grep -q usage || q=""
  local pids=()
  if [ -n "$q" ]; then
    [ -f "$M8" ] || { /usr/bin/time -f "8B synth+quantize %e s" python3 -m tuner model synth --like llama-3.1-8b --quant Q4_K_M --quantize-with "$q" -o "$M8" >"$S/synth8b.log" 2>&1 & pids+=($!); }
    [ -f "$M1" ] || { /usr/bin/time -f "1B synth+quantize %e s" python3 -m tuner model synth --like llama-3.2-1b --quant Q4_K_M --quantize-with "$q" -o "$M1" >"$S/synth1b.log" 2>&1 & pids+=($!); }
  fi
  /usr/bin/time -f "build %e s" python3 -m tuner build --arch sm_90 --variant cuda -j 16 >"$S/build-sm90.txt" 2>&1 || { tail -20 "$S/build-sm90.txt"; return 1; }
  for p in "${pids[@]}"; do wait "$p"; done
  if [ ! -f "$M1" ] || [ ! -f "$M8" ]; then  # no carried quantize (or it failed): session 4's way
    echo "carried llama-quantize not used: $(tail -3 "$S/synth8b.log" 2>/dev/null)"; s4_setup || return 1
  fi
  tail -3 "$S/synth8b.log" "$S/synth1b.log" "$S/build-sm90.txt" 2>/dev/null; ls -la "$TUNER_HOME/models"
  tar czf "$OUT/setup.tgz" -C "$TUNER_HOME" setup  # at most 8 files come back from $OUT
  echo "setup done at ${SECONDS} s"
}

# The 1B: session 4's ladder and settings (its seeded screen rounds must match), no refinement.
L1_ARGS="--trials 0 --depths 0,4096,8192,16384,32768,65536 --reps-pp 3 --reps-tg 3 --min-rounds 3 --max-rounds 3 --refine 0"

s6_call() {
  s5_search sm90-l1b-v3 "$M1" $((575 - SECONDS)) $L1_ARGS
  s5_search sm90-l8b-v3 "$M8" $((575 - SECONDS)) $L8_ARGS
  nvidia-smi --query-gpu=temperature.gpu,clocks.sm,power.draw --format=csv
  echo "s6_call ended at ${SECONDS} s"
}
