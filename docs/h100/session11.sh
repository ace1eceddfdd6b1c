# Session 11 plan (issue 17), NOT RUN YET: written at the end of session 10, when no device time was left.
# Source after docs/h100/env.sh and docs/h100/session10.sh (its setup, s10_bin and s10_step are reused),
# then run `s11_next` again and again, back to back, until it prints "S11 ALL DONE":
#   setup      session 10's: sm_90 `cuda` build, llama-3.2-1b and qwen2.5-0.5b as Q4_K_M
#   residency  real CUDA residency logs (replacing the written fixtures of tests/data/residency/cuda-*.log):
#              full offload and -nkvo 1 on both models, each judged by tuner.measure.residency.judge
#   paced      item 3's host-paced scenario: the 1B with half its layers on the CPU (--set ngl=8, where
#              session 10 measured decode as CPU-paced), the same search unpinned and on 4 cores
#              (--cpu-mask 0-3); the exported picks (threads, -ub, graphs...) are compared
#   cublas     seed rank 3: a cuda-force-cublas build, cuda_cublas_dense vs cuda_dense on both models
# Per call, $OUT gets s11.tgz (transcripts, run directories, study databases; no models).
S11=$TUNER_HOME/s11out
mkdir -p "$S11"

s11_residency() {
  python3 - "$(s10_bin)" "$TUNER_HOME/models" "$S11/residency" <<'EOF' 2>&1 | tee "$S11/residency.txt"
import sys
from pathlib import Path
from tuner.measure.residency import input_layer_mib, judge, run_residency
b, models, out = Path(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3])
for m in ("l1b-q4km", "q05b-q4km"):
    gguf = models / f"{m}.gguf"
    for tag, args in (("full", ["-fa", "1"]), ("nkvo", ["-fa", "1", "-nkvo", "1"])):
        d = out / f"{m}-{tag}"
        d.mkdir(parents=True, exist_ok=True)
        r = run_residency(b, gguf, args=args, log_dir=d)
        print(m, tag, r.summary, judge(r, full_offload=True, host_weights_mib=input_layer_mib(gguf)))
EOF
}

# s11_search NAME [args]: one search of the 1B with half its layers offloaded (resumes on the next call:
# the database stays in the run directory while the machine is warm, and a copy goes back in $OUT).
s11_search() {
  local name=$1
  mkdir -p "$TUNER_RUNS/$name"
  python3 -m tuner search --arch sm_90 --variant cuda --model "$TUNER_HOME/models/l1b-q4km.gguf" --study "$name" \
    --run-dir "$TUNER_RUNS/$name" --storage "sqlite:///$TUNER_RUNS/$name/study.db" --time-budget $((575 - SECONDS - 20)) \
    --set ngl=8 --depths 0,4096 --trials 8 --min-rounds 2 --max-rounds 3 --refine 0 --confirm-extra 0 "${@:2}" 2>&1 \
    | tee -a "$S11/search-$name.txt"
  cp "$TUNER_RUNS/$name/study.db" "$OUT/$name.db"
  grep -q "^Exported the result" "$S11/search-$name.txt"
}

s11_cublas() {
  local B C t
  B=$(s10_bin)
  python3 -m tuner build --arch sm_90 --variant cuda-force-cublas -j 16 >"$S11/build-cublas.txt" 2>&1 || { tail -20 "$S11/build-cublas.txt"; return 1; }
  C=$(grep "bin dir" "$S11/build-cublas.txt" | awk -F'|' '{gsub(/ /, "", $3); print $3}')
  [ -x "$C/llama-bench" ] || { echo "no cublas bin dir in the build output"; return 1; }
  for t in l1b q05b; do
    python3 -m tuner bench --arch sm_90 --model "$TUNER_HOME/models/$t-q4km.gguf" --depths 0,4096 --pp 512 --tg 128 --reps 5 \
      --build "$B" --seed-build cuda_dense --build "$C" --seed-build cuda_cublas_dense -o "$TUNER_HOME/runs/seed004-cublas-$t" \
      2>&1 | tee "$S11/seed-cublas-$t.txt"
  done
}

s11_next() {
  ls "$TUNER_HOME"/builds/*/artifacts/*/bin/llama-bench >/dev/null 2>&1 || rm -f "$S10_DONE/setup"
  s10_step setup 420 s10_setup \
    && s10_step residency 60 s11_residency \
    && s10_step paced-all 240 s11_search paced-all \
    && s10_step paced-4 240 s11_search paced-4 --cpu-mask 0-3 \
    && s10_step cublas 450 s11_cublas \
    && echo "S11 ALL DONE"
  ls "$S10_DONE"
  tar czf "$OUT/s11.tgz" --exclude='*.gguf' --exclude='*.db' -C "$TUNER_HOME" s11out s10-done \
    runs/paced-all/export runs/paced-4/export runs/seed004-cublas-l1b runs/seed004-cublas-q05b 2>/dev/null
  ls -la "$OUT"; echo "s11_next ended at ${SECONDS} s"
}
