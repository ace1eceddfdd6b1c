# Session 9 (issues 15 and 17) on the lent H100. Source after docs/h100/env.sh, then run `s9_next`
# again and again (each call back to back, before the machine is given back): it does the next
# pending step that fits in what is left of the call's 575 s and says "S9 ALL DONE" at the end.
#   setup     sm_90 build; the 1B and 8B shapes quantized by the carried llama-quantize (session 6's)
#   l1b       the 1B study resumed from session 8 with --max-rounds 14: the screen reopens its open
#             decode depths only (the settle rule, new), composes, confirms (extra rounds where a rule
#             changes the kernel and its verdict is open), runs the output-equivalence gate
#   l1b_exp   export the 1B study (tarred into s9.tgz)
#   l8b       the 8B study resumed from session 7: screen and confirm are recorded, so it runs the gate
#   l8b_exp   export the 8B study
#   calib     issue 17: the gate's KLD numbers on CUDA (tuner equivalence): upstream vs itself, vs
#             each forced FA kernel, and deliberate KV-cache quantizations, for the 1B and the 8B
# Per call, $OUT gets the study databases (written while the search runs, so a killed call keeps
# them), s9.tgz (transcripts, logs, exports, calibration JSON) and nothing else.
. docs/h100/session8.sh

S9=$TUNER_HOME/s9out
S9_DONE=$TUNER_HOME/s9-done
mkdir -p "$S9" "$S9_DONE"
L1_ARGS9="$L1_ARGS --max-rounds 14"

# s9_search NAME MODEL SECONDS SEED_DB [args]: s8_search's way, resuming from SEED_DB (read-only
# copies come back from $OUT, so the working copy is made writable).
s9_search() {
  local name=$1 model=$2 secs=$3 seed=$4
  mkdir -p "$TUNER_RUNS/$name"
  if [ ! -f "$TUNER_RUNS/$name/study.db" ]; then
    for db in "docs/h100/session9/latest/$name.db" "$seed"; do
      [ -f "$db" ] && { cp "$db" "$TUNER_RUNS/$name/study.db"; chmod u+w "$TUNER_RUNS/$name/study.db"; echo "resuming $name from $db"; break; }
    done
  fi
  cp "$TUNER_RUNS/$name/study.db" "$OUT/$name.db" 2>/dev/null
  python3 -m tuner search --arch sm_90 --variant cuda --model "$model" --study "$name" --run-dir "$TUNER_RUNS/$name" \
    --storage "sqlite:///$OUT/$name.db" --time-budget "$secs" --jobs 16 "${@:5}" 2>&1 | tee -a "$S9/search-$name.txt"
  cp "$OUT/$name.db" "$TUNER_RUNS/$name/study.db"
  tar czf "$S9/$name-logs.tgz" --exclude '*.db' -C "$TUNER_RUNS" "$name" 2>/dev/null
  grep -q "^Exported the result" "$S9/search-$name.txt" && touch "$S9_DONE/search-$name"
  echo "search $name call ended at ${SECONDS} s"
}

# s9_export NAME LIKE FOLDER
s9_export() {
  python3 -m tuner export --study "$1" --storage "sqlite:///$TUNER_RUNS/$1/study.db" \
    -o "$TUNER_HOME/$3" --like "$2" --weight-type q4_k_m 2>&1 | tee "$S9/export-$3.txt"
  tar czf "$S9/$3.tgz" -C "$TUNER_HOME" "$3"
}

# s9_calib: `tuner equivalence` pairs on the tuned build (its llama-perplexity, built by the gate);
# one JSON per pair under $S9/calib. A failing pair exits 1 and is data, not an error here.
s9_calib() {
  local bin C=$S9/calib
  bin=$(dirname "$(find "$TUNER_HOME"/builds -name llama-perplexity -type f -perm -u+x | head -1)")
  [ -x "$bin/llama-perplexity" ] || { echo "no llama-perplexity in the build"; return 1; }
  mkdir -p "$C"
  s9_pair() {  # s9_pair MODEL TAG MODE [tuner equivalence args]
    local t0=$SECONDS
    python3 -m tuner equivalence --build "$bin" --model "$1" --mode "$3" --json -o "$C/$2" "${@:4}" >"$C/$2.json" 2>"$C/$2.err"
    echo "calib $2: rc $? ($((SECONDS - t0)) s) $(python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); s=d.get("stats") or {}; print(d.get("passed"), s.get("mean_kld"), s.get("p99_kld"), s.get("max_kld"), s.get("same_top_pct"), d.get("deterministic"))' "$C/$2.json" 2>/dev/null)"
  }
  s9_pair "$M1" 1b-decode-aa decode
  s9_pair "$M1" 1b-decode-VEC decode --env GGML_TUNER_FA_RULES=decode:0-=VEC
  s9_pair "$M1" 1b-decode-TILE decode --env GGML_TUNER_FA_RULES=decode:0-=TILE
  s9_pair "$M1" 1b-decode-MMA decode --env GGML_TUNER_FA_RULES=decode:0-=MMA
  s9_pair "$M1" 1b-prefill-aa prefill
  s9_pair "$M1" 1b-prefill-TILE prefill --env GGML_TUNER_FA_RULES=prefill:0-=TILE
  s9_pair "$M1" 1b-decode-kvq8 decode --args '-ctk q8_0 -ctv q8_0'
  s9_pair "$M1" 1b-decode-kvq4 decode --args '-ctk q4_0 -ctv q4_0'
  [ $((SECONDS + 120)) -gt 575 ] && { echo "calib: the 8B pairs need the next call"; return 1; }
  s9_pair "$M8" 8b-decode-aa decode
  s9_pair "$M8" 8b-decode-MMA decode --env GGML_TUNER_FA_RULES=decode:0-=MMA
  s9_pair "$M8" 8b-decode-TILE decode --env GGML_TUNER_FA_RULES=decode:0-=TILE
  s9_pair "$M8" 8b-decode-kvq4 decode --args '-ctk q4_0 -ctv q4_0'
  return 0
}

# s9_step NAME SECONDS_NEEDED CMD...: run CMD unless done or the call has too little time left
s9_step() {
  local name=$1 need=$2; shift 2
  [ -f "$S9_DONE/$name" ] && return 0
  if [ $((SECONDS + need)) -gt 575 ]; then echo "S9 $name needs ~${need} s, ${SECONDS} s used: next call"; return 1; fi
  echo "S9 step $name at ${SECONDS} s"
  "$@"
  local rc=$?
  [ "$rc" = 0 ] && touch "$S9_DONE/$name"
  echo "S9 step $name ended at ${SECONDS} s (rc $rc)"
  return "$rc"
}

s9_next() {
  # a fresh machine (no build) redoes the setup even if an earlier machine had done it
  ls "$TUNER_HOME"/builds/*/artifacts/*/bin/llama-bench >/dev/null 2>&1 || rm -f "$S9_DONE/setup"
  s9_step setup 450 s6_setup || { s9_pack; return 0; }
  if [ ! -f "$S9_DONE/search-sm90-l1b-v3" ] && [ $((575 - SECONDS)) -gt 90 ]; then
    s9_search sm90-l1b-v3 "$M1" $((575 - SECONDS)) docs/h100/session8/latest/sm90-l1b-v3.db $L1_ARGS9
  fi
  [ -f "$S9_DONE/search-sm90-l1b-v3" ] && s9_step l1b_exp 20 s9_export sm90-l1b-v3 llama-3.2-1b l1b
  if [ -f "$S9_DONE/l1b_exp" ] && [ ! -f "$S9_DONE/search-sm90-l8b-v3" ] && [ $((575 - SECONDS)) -gt 150 ]; then
    s9_search sm90-l8b-v3 "$M8" $((575 - SECONDS)) docs/h100/session7/sm90-l8b-v3.db $L8_ARGS --confirm-extra 1
  fi
  [ -f "$S9_DONE/search-sm90-l8b-v3" ] && s9_step l8b_exp 25 s9_export sm90-l8b-v3 llama-3.1-8b l8b \
    && s9_step calib 150 s9_calib
  [ -f "$S9_DONE/calib" ] && echo "S9 ALL DONE"
  s9_pack
}

s9_pack() {
  nvidia-smi --query-gpu=temperature.gpu,clocks.sm,power.draw --format=csv,noheader 2>/dev/null
  ls "$S9_DONE"
  tar czf "$OUT/s9.tgz" -C "$TUNER_HOME" s9out s9-done setup 2>/dev/null
  echo "s9_next ended at ${SECONDS} s"
}

# Call 5 (a fresh machine): the gate judged by the kernel band (new after call 4). Both studies resume
# from docs/h100/session9/latest/: screen, compose and confirm are recorded, and so are the gate's
# candidate checks (failed under the CPU thresholds), so each search runs only the band's llama-perplexity
# pairs, re-judges its check by them, and exports. Small tarball only (call 2's s9.tgz was too big).
s9_regate() {
  s9_step setup 450 s6_setup || { s9_pack_small; return 0; }
  rm -f "$S9_DONE"/search-* "$S9_DONE"/l1b_exp "$S9_DONE"/l8b_exp "$TUNER_RUNS"/*/study.db
  : >"$S9/search-sm90-l1b-v3.txt"; : >"$S9/search-sm90-l8b-v3.txt"
  s9_search sm90-l1b-v3 "$M1" $((575 - SECONDS)) docs/h100/session9/latest/sm90-l1b-v3.db $L1_ARGS9
  [ -f "$S9_DONE/search-sm90-l1b-v3" ] && s9_step l1b_exp 20 s9_export sm90-l1b-v3 llama-3.2-1b l1b
  s9_search sm90-l8b-v3 "$M8" $((575 - SECONDS)) docs/h100/session9/latest/sm90-l8b-v3.db $L8_ARGS --confirm-extra 1
  [ -f "$S9_DONE/search-sm90-l8b-v3" ] && s9_step l8b_exp 25 s9_export sm90-l8b-v3 llama-3.1-8b l8b
  s9_pack_small
}

s9_pack_small() {
  ls "$S9_DONE"
  tar czf "$OUT/s9small.tgz" --exclude='*.kld' --exclude='*.tgz' --exclude='*.gguf' -C "$TUNER_HOME" s9out s9-done l1b l8b setup \
    runs/sm90-l1b-v3/equivalence runs/sm90-l8b-v3/equivalence 2>/dev/null
  ls -la "$OUT"
  echo "s9_regate ended at ${SECONDS} s"
}
