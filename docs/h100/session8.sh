# Session 8 (issues 15 and 16) on the lent H100. Source after docs/h100/env.sh, then run `s8_next`
# again and again (each call back to back, before the machine is given back): it does the next
# pending step that fits in what is left of the call's 575 s and says "S8 ALL DONE" at the end.
#   setup     (session 6's) sm_90 build, the three shapes quantized by the carried llama-quantize
#   l1b       the 1B study resumed from session 6 with --max-rounds 6: the screen reopens (a raised
#             round cap), adds rounds until the d32768 cell decides or 6 rounds; compose; confirm
#   l1b_exp   export the 1B study (the result folder is checked next and brought back tarred)
#   chk_l8b   issue 16: the tuned tree rebuilt in place as pristine + the 8B's upstream.patch (tuner's
#             own patched_tree_text), `tuner validate --gpu` on it: test-backend-ops + ncu selection
#   chk_l1b   the same for the 1B export of this session
#   neg       issue 15's negative control: qwen2.5-0.5b (GQA 7, head size 64), a shape for which
#             upstream already switches decode VEC -> MMA at n_kv >= 8192 (the gqa_ratio > 4 rule);
#             the search must claim nothing beyond its A/A noise
# Per call, $OUT gets: the study databases (written while the search runs, so a killed call keeps
# them), s8.tgz (transcripts, logs, exports) and nothing else: at most 8 files come back.
. docs/h100/session7.sh

MQ=$TUNER_HOME/models/q05b-q4km.gguf
S8=$TUNER_HOME/s8out
S8_DONE=$TUNER_HOME/s8-done
mkdir -p "$S8" "$S8_DONE"
L1_ARGS8="$L1_ARGS --max-rounds 6"
LQ_ARGS="--trials 0 --reps-pp 3 --reps-tg 3 --min-rounds 3 --max-rounds 3 --refine 0"

# s8_search NAME MODEL SECONDS [args]: s5_search with its transcript and logs kept under $S8
# (s5_search put four files per study into $OUT). The study resumes from the warm machine's copy,
# else from docs/h100/session8/latest/ (brought back by an earlier call), else from session 6.
s8_search() {
  local name=$1 model=$2 secs=$3 db
  mkdir -p "$TUNER_RUNS/$name"
  if [ ! -f "$TUNER_RUNS/$name/study.db" ]; then
    for db in "docs/h100/session8/latest/$name.db" "docs/h100/session6/$name.db"; do
      [ -f "$db" ] && { cp "$db" "$TUNER_RUNS/$name/study.db"; echo "resuming $name from $db"; break; }
    done
  fi
  cp "$TUNER_RUNS/$name/study.db" "$OUT/$name.db" 2>/dev/null
  python3 -m tuner search --arch sm_90 --variant cuda --model "$model" --study "$name" --run-dir "$TUNER_RUNS/$name" \
    --storage "sqlite:///$OUT/$name.db" --time-budget "$secs" --jobs 16 "${@:4}" 2>&1 | tee -a "$S8/search-$name.txt"
  cp "$OUT/$name.db" "$TUNER_RUNS/$name/study.db"
  tar czf "$S8/$name-logs.tgz" --exclude '*.db' -C "$TUNER_RUNS" "$name" 2>/dev/null
  grep -q "^Exported the result" "$S8/search-$name.txt" && touch "$S8_DONE/search-$name"
  echo "search $name call ended at ${SECONDS} s"
}

s8_setup() {
  local S=$TUNER_HOME/setup
  mkdir -p "$TUNER_HOME/models" "$S"
  [ -f "$MQ" ] || { /usr/bin/time -f "qwen synth+quantize %e s" python3 -m tuner model synth --like qwen2.5-0.5b --quant Q4_K_M \
    --quantize-with "$Q" -o "$MQ" >"$S/synthq05b.log" 2>&1 & }
  s6_setup || return 1
  wait
  tail -2 "$S/synthq05b.log"; ls -la "$MQ"
  cp -r "$S" "$S8/"
}

s8_export_l1b() {
  python3 -m tuner export --study sm90-l1b-v3 --storage "sqlite:///$TUNER_RUNS/sm90-l1b-v3/study.db" \
    -o "$TUNER_HOME/l1b" --like llama-3.2-1b --weight-type q4_k_m 2>&1 | tee "$S8/export-l1b.txt"
  tar czf "$S8/l1b.tgz" -C "$TUNER_HOME" l1b
}

# s8_check FOLDER: session 7's in-place upstream build and check for one result folder; its files go to $S8
s8_check() {
  local name real_out=$OUT
  name=$(basename "$1")
  mkdir -p "$S8/check-$name"
  OUT=$S8/check-$name s7_upstream "$1"
  OUT=$real_out
  grep -h "PASS\|FAIL\|selection\|test-backend-ops\|upstream build" "$S8/check-$name"/validate-*.txt "$S8/check-$name"/upstream-build-*.txt 2>/dev/null | tail -20
}

# s8_step NAME SECONDS_NEEDED CMD...: run CMD unless done or the call has too little time left
s8_step() {
  local name=$1 need=$2; shift 2
  [ -f "$S8_DONE/$name" ] && return 0
  if [ $((SECONDS + need)) -gt 575 ]; then echo "S8 $name needs ~${need} s, ${SECONDS} s used: next call"; return 1; fi
  echo "S8 step $name at ${SECONDS} s"
  "$@"
  local rc=$?
  [ "$rc" = 0 ] && touch "$S8_DONE/$name"
  echo "S8 step $name ended at ${SECONDS} s (rc $rc)"
  return "$rc"
}

s8_next() {
  # a fresh machine (no build) redoes the setup even if an earlier machine had done it
  ls "$TUNER_HOME"/builds/*/artifacts/*/bin/llama-bench >/dev/null 2>&1 || rm -f "$S8_DONE/setup"
  s8_step setup 450 s8_setup || { s8_pack; return 0; }
  if [ ! -f "$S8_DONE/search-sm90-l1b-v3" ] && [ $((575 - SECONDS)) -gt 100 ]; then
    s8_search sm90-l1b-v3 "$M1" $((575 - SECONDS)) $L1_ARGS8
  fi
  if [ -f "$S8_DONE/search-sm90-l1b-v3" ]; then
    s8_step l1b_exp 20 s8_export_l1b && s8_step chk_l8b 190 s8_check results/sm_90/llama-3.1-8b-q4_k_m \
      && s8_step chk_l1b 190 s8_check "$TUNER_HOME/l1b"
  fi
  if [ -f "$S8_DONE/chk_l1b" ] && [ ! -f "$S8_DONE/search-sm90-q05b" ] && [ $((575 - SECONDS)) -gt 120 ]; then
    s8_search sm90-q05b "$MQ" $((575 - SECONDS)) $LQ_ARGS --export "$TUNER_HOME/q05b"
  fi
  [ -f "$S8_DONE/search-sm90-q05b" ] && [ -f "$S8_DONE/chk_l1b" ] && echo "S8 ALL DONE"
  s8_pack
}

s8_pack() {
  nvidia-smi --query-gpu=temperature.gpu,clocks.sm,power.draw --format=csv,noheader 2>/dev/null
  ls "$S8_DONE"
  tar czf "$OUT/s8.tgz" -C "$TUNER_HOME" s8out s8-done
  echo "s8_next ended at ${SECONDS} s"
}

# The user's own command, on a fresh machine (call 4): `tuner validate R --gpu` builds the pristine
# tree + R's upstream.patch with R's defines (a full build) and runs test-backend-ops; the same command
# with --model then reuses that build (cached) and adds the ncu selection check. The 1B (its model is
# written in ~60 s while the build runs).
s8_tool() {
  local R=results/sm_90/llama-3.2-1b-q4_k_m
  mkdir -p "$TUNER_HOME/models" "$S8"
  [ -f "$M1" ] || { /usr/bin/time -f "1B synth+quantize %e s" python3 -m tuner model synth --like llama-3.2-1b --quant Q4_K_M \
    --quantize-with "$Q" -o "$M1" >"$S8/synth1b.log" 2>&1 & }
  /usr/bin/time -f "validate --gpu (build + test-backend-ops) %e s" python3 -m tuner validate "$R" --gpu \
    --log-dir "$TUNER_HOME/validate-tool/build" 2>&1 | tee "$S8/validate-tool.txt"
  wait
  /usr/bin/time -f "validate --gpu --model (cached build) %e s" python3 -m tuner validate "$R" --gpu --model "$M1" \
    --log-dir "$TUNER_HOME/validate-tool/select" 2>&1 | tee -a "$S8/validate-tool.txt"
  cp "$(ls -d "$TUNER_HOME"/builds/*/ | head -1)build.json" "$S8/upstream-build.json" 2>/dev/null
  cp -r "$TUNER_HOME/validate-tool" "$S8/"
  s8_pack
}
