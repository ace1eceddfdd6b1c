# Session 12 (issue 17), machine 1 of 2: sm_89 through 89-virtual on the H100.
# Source after docs/h100/env.sh and docs/h100/session10.sh (s10_step, s10_bin, the CUDA JIT cache
# settings), then run `s12_next` back to back while the machine is warm, until "S12 ALL DONE":
#   setup89   `tuner build --arch sm_89 --variant cuda` (89-virtual on this GPU) while llama-3.2-1b and
#             qwen2.5-0.5b are written, both quantized to Q4_K_M; the first llama-bench run (PTX JIT) timed
#   search89  the current pipeline (screen, confirm, output-equivalence gate with the kernel band,
#             residency) on the 1B at the stored result's depths, so results/sm_89/… is re-exported
#             with the gate's numbers; resumes on the next call (database kept in the run dir and $OUT)
#   seed89    the four reference-build rows that the `cuda` build runs, through 89-virtual, both models
#   cpurule   tests/integration/test_cpu_rule_cpu.py on this 16-CPU host (it skips on the 2-CPU CI box)
# Per call, $OUT gets s12.tgz (transcripts, the export, run logs; no models) and the study database.
S12=$TUNER_HOME/s12out
mkdir -p "$S12"
M1=$TUNER_HOME/models/l1b-q4km.gguf
N89=sm89-l1b-v4

s12_setup89() {
  local pids=() B m
  (t0=$SECONDS; python3 -m tuner model synth --like llama-3.2-1b -o "$TUNER_HOME/models/l1b-f16.gguf"
   echo "l1b synth $((SECONDS - t0)) s") >"$S12/synth-l1b.txt" 2>&1 & pids+=($!)
  (t0=$SECONDS; python3 -m tuner model synth --like qwen2.5-0.5b -o "$TUNER_HOME/models/q05b-f16.gguf"
   echo "qwen synth $((SECONDS - t0)) s") >"$S12/synth-q05b.txt" 2>&1 & pids+=($!)
  /usr/bin/time -f "build %e s" python3 -m tuner build --arch sm_89 --variant cuda -j 16 >"$S12/build-sm89.txt" 2>&1 \
    || { tail -20 "$S12/build-sm89.txt"; return 1; }
  for p in "${pids[@]}"; do wait "$p"; done
  B=$(s10_bin)
  for m in l1b q05b; do
    /usr/bin/time -f "$m quantize %e s" "$B/llama-quantize" "$TUNER_HOME/models/$m-f16.gguf" "$TUNER_HOME/models/$m-q4km.gguf" Q4_K_M \
      >"$S12/quantize-$m.txt" 2>&1 || { tail -5 "$S12/quantize-$m.txt"; return 1; }
  done
  # The JIT is paid once per machine (cache in $CUDA_CACHE_PATH); timed so it is data, not part of a baseline.
  { /usr/bin/time -f "first run (JIT) %e s" "$B/llama-bench" -m "$M1" -fa 1 -p 512 -n 16 -r 1
    /usr/bin/time -f "second run (JIT cache) %e s" "$B/llama-bench" -m "$M1" -fa 1 -p 512 -n 16 -r 1
    du -sh "$CUDA_CACHE_PATH"; } >"$S12/jit89.txt" 2>&1
  tail -n2 "$S12"/synth-*.txt "$S12"/quantize-*.txt "$S12/build-sm89.txt" "$S12/jit89.txt"
}

# The sm_90 1B's arguments (session 6/9: runtime knobs pinned, kernel screen and confirm) at the stored
# sm_89 result's four depths.
s12_search89() {
  mkdir -p "$TUNER_RUNS/$N89"
  python3 -m tuner search --arch sm_89 --ptx-jit --variant cuda --model "$M1" --study "$N89" --run-dir "$TUNER_RUNS/$N89" \
    --storage "sqlite:///$TUNER_RUNS/$N89/study.db" --time-budget $((575 - SECONDS - 30)) --jobs 16 \
    --trials 0 --depths 0,4096,16384,32768 --reps-pp 3 --reps-tg 3 --min-rounds 3 --max-rounds 10 --refine 0 2>&1 \
    | tee -a "$S12/search-$N89.txt"
  cp "$TUNER_RUNS/$N89/study.db" "$OUT/$N89.db"
  grep -q "^Exported the result" "$S12/search-$N89.txt"
}

s12_seed89() {
  local t B
  B=$(s10_bin)
  for t in l1b q05b; do
    timeout $((575 - SECONDS - 10)) python3 -m tuner bench --arch sm_89 --model "$TUNER_HOME/models/$t-q4km.gguf" --depths 0,4096 \
      --pp 512 --tg 128 --reps 3 --build "$B" --seed-build cuda_dense --build "$B" --seed-build cuda_hybrid \
      --build "$B" --seed-build cpu_cuda_hybrid --build "$B" --seed-build cpu_hybrid \
      -o "$TUNER_HOME/runs/seed004-89v-$t" 2>&1 | tee "$S12/seed89-$t.txt"
    [ "${PIPESTATUS[0]}" = 0 ] || return 1
  done
}

s12_cpurule() {
  TUNER_TEST_HOME=$TUNER_HOME timeout $((575 - SECONDS - 5)) python3 -m pytest -q -p no:cacheprovider -rs \
    tests/integration/test_cpu_rule_cpu.py 2>&1 | tee "$S12/cpurule.txt"
  [ "${PIPESTATUS[0]}" = 0 ]
}

s12_next() {
  ls "$TUNER_HOME"/builds/*/artifacts/*/bin/llama-bench >/dev/null 2>&1 || rm -f "$S10_DONE/setup89"
  s10_step setup89 400 s12_setup89 \
    && { [ -f "$S10_DONE/search89" ] || [ $((SECONDS + 120)) -gt 575 ] || s10_step search89 120 s12_search89; } \
    && [ -f "$S10_DONE/search89" ] \
    && s10_step seed89 230 s12_seed89 \
    && s10_step cpurule 150 s12_cpurule \
    && echo "S12 ALL DONE"
  nvidia-smi --query-gpu=temperature.gpu,clocks.sm,power.draw --format=csv,noheader 2>/dev/null
  ls "$S10_DONE"
  tar czf "$OUT/s12.tgz" --exclude='*.gguf' --exclude='*.db' --exclude='*.kld' -C "$TUNER_HOME" s12out s10-done \
    "runs/$N89" runs/seed004-89v-l1b runs/seed004-89v-q05b 2>/dev/null
  ls -la "$OUT"; echo "s12_next ended at ${SECONDS} s"
}

# Calls 3-4 on the same machine: item 3's host-paced search and item 4's real CUDA residency logs on
# the 89-virtual build (the project brief's target arch), instead of session 11's sm_90 plan (one build less).
# Needs docs/h100/session11.sh sourced too (s11_residency).
s12_paced() {  # s12_paced NAME [args]: the 1B with half its layers on the CPU, resumable
  local name=$1
  mkdir -p "$TUNER_RUNS/$name"
  python3 -m tuner search --arch sm_89 --ptx-jit --variant cuda --model "$M1" --study "$name" \
    --run-dir "$TUNER_RUNS/$name" --storage "sqlite:///$TUNER_RUNS/$name/study.db" --time-budget $((575 - SECONDS - 20)) \
    --set ngl=8 --depths 0,4096 --trials 8 --min-rounds 2 --max-rounds 3 --refine 0 --confirm-extra 0 "${@:2}" 2>&1 \
    | tee -a "$S12/search-$name.txt"
  cp "$TUNER_RUNS/$name/study.db" "$OUT/$name.db"
  grep -q "^Exported the result" "$S12/search-$name.txt"
}

s12_next2() {
  s10_step cpurule 150 s12_cpurule
  s10_step residency 60 s11_residency
  s10_step paced-all 240 s12_paced paced-all \
    && s10_step paced-4 240 s12_paced paced-4 --cpu-mask 0-3 \
    && echo "S12 CALLS 3-4 DONE"
  ls "$S10_DONE"
  tar czf "$OUT/s12b.tgz" --exclude='*.gguf' --exclude='*.db' --exclude='*.kld' -C "$TUNER_HOME" s12out s11out s10-done \
    runs/paced-all runs/paced-4 2>/dev/null
  ls -la "$OUT"; echo "s12_next2 ended at ${SECONDS} s"
}
