# Session 10 (issue 17, item 6) on the lent H100: the six reference builds' decode ranking (docs/seed004-builds.md), the rows one build can run.
# Source after docs/h100/env.sh, then run `s10_next` (again, back to back, while the machine is warm):
#   setup   sm_90 `cuda` build while llama-3.2-1b and qwen2.5-0.5b are written (f16), then both
#           quantized to Q4_K_M by the build's llama-quantize
#   l1b     tuner bench, the four seed builds that the `cuda` variant runs (cuda_dense, cuda_hybrid,
#           cpu_cuda_hybrid, cpu_hybrid), interleaved with cuda_dense as the anchor, d 0 and 4096
#   qwen    the same for qwen2.5-0.5b (a second family and size)
# cuda_mmq_moe and cuda_cublas_dense need their own builds (cuda-force-mmq, cuda-force-cublas: ~5 min
# each here) and 89-virtual doubles all of it; this session had ~10 minutes of device time, so they
# are not run. Per call, $OUT gets s10.tgz (transcripts and run directories, no models).
S10=$TUNER_HOME/s10out
S10_DONE=$TUNER_HOME/s10-done
mkdir -p "$S10" "$S10_DONE" "$TUNER_HOME/models"
export CUDA_CACHE_PATH=$TUNER_HOME/nvcache CUDA_CACHE_MAXSIZE=4294967296

s10_setup() {  # f16 shapes written while the build runs, then Q4_K_M with the build's own llama-quantize
  local pids=() B
  (t0=$SECONDS; python3 -m tuner model synth --like llama-3.2-1b -o "$TUNER_HOME/models/l1b-f16.gguf"
   echo "l1b synth $((SECONDS - t0)) s") >"$S10/synth-l1b.txt" 2>&1 & pids+=($!)
  (t0=$SECONDS; python3 -m tuner model synth --like qwen2.5-0.5b -o "$TUNER_HOME/models/q05b-f16.gguf"
   echo "qwen synth $((SECONDS - t0)) s") >"$S10/synth-q05b.txt" 2>&1 & pids+=($!)
  /usr/bin/time -f "build %e s" python3 -m tuner build --arch sm_90 --variant cuda -j 16 >"$S10/build-sm90.txt" 2>&1 \
    || { tail -20 "$S10/build-sm90.txt"; return 1; }
  for p in "${pids[@]}"; do wait "$p"; done
  B=$(s10_bin)
  for m in l1b q05b; do
    /usr/bin/time -f "$m quantize %e s" "$B/llama-quantize" "$TUNER_HOME/models/$m-f16.gguf" "$TUNER_HOME/models/$m-q4km.gguf" Q4_K_M \
      >"$S10/quantize-$m.txt" 2>&1 || { tail -5 "$S10/quantize-$m.txt"; return 1; }
  done
  tail -n2 "$S10"/synth-*.txt "$S10"/quantize-*.txt "$S10/build-sm90.txt"; ls -la "$TUNER_HOME/models"
}

s10_bin() { dirname "$(find "$TUNER_HOME"/builds -name llama-bench -type f -perm -u+x | head -1)"; }

# s10_seed TAG MODEL: the four rows in one interleaved run; timeout keeps the call inside its limit
# (a killed run keeps its raw llama-bench logs under the run directory).
s10_seed() {
  local tag=$1 model=$2 B
  B=$(s10_bin)
  timeout $((575 - SECONDS - 15)) python3 -m tuner bench --arch sm_90 --model "$model" --depths 0,4096 --pp 512 --tg 128 --reps 3 \
    --build "$B" --seed-build cuda_dense --build "$B" --seed-build cuda_hybrid \
    --build "$B" --seed-build cpu_cuda_hybrid --build "$B" --seed-build cpu_hybrid \
    -o "$TUNER_HOME/runs/seed004-$tag" 2>&1 | tee "$S10/seed-$tag.txt"
  [ "${PIPESTATUS[0]}" = 0 ]
}

s10_step() {  # s10_step NAME SECONDS_NEEDED CMD...
  local name=$1 need=$2; shift 2
  [ -f "$S10_DONE/$name" ] && return 0
  if [ $((SECONDS + need)) -gt 575 ]; then echo "S10 $name needs ~${need} s, ${SECONDS} s used: next call"; return 1; fi
  echo "S10 step $name at ${SECONDS} s"
  "$@"; local rc=$?
  [ "$rc" = 0 ] && touch "$S10_DONE/$name"
  echo "S10 step $name ended at ${SECONDS} s (rc $rc)"
  return "$rc"
}

s10_next() {
  ls "$TUNER_HOME"/builds/*/artifacts/*/bin/llama-bench >/dev/null 2>&1 || rm -f "$S10_DONE/setup"
  s10_step setup 420 s10_setup \
    && s10_step l1b 120 s10_seed l1b "$TUNER_HOME/models/l1b-q4km.gguf" \
    && s10_step qwen 100 s10_seed q05b "$TUNER_HOME/models/q05b-q4km.gguf" \
    && echo "S10 ALL DONE"
  nvidia-smi --query-gpu=temperature.gpu,clocks.sm,power.draw --format=csv,noheader 2>/dev/null
  ls "$S10_DONE"
  tar czf "$OUT/s10.tgz" --exclude='*.gguf' -C "$TUNER_HOME" s10out s10-done runs 2>/dev/null
  ls -la "$OUT"; echo "s10_next ended at ${SECONDS} s"
}

# Call 2 (same machine, warm): seed rank 1, `cuda_mmq_moe` = the cuda-force-mmq variant, against
# cuda_dense (rank 2) on both models. cuda_cublas_dense (rank 3) did not fit this session's device time.
s10_mmq() {
  local B M t
  B=$(s10_bin)
  /usr/bin/time -f "build %e s" python3 -m tuner build --arch sm_90 --variant cuda-force-mmq -j 16 >"$S10/build-sm90-mmq.txt" 2>&1 \
    || { tail -20 "$S10/build-sm90-mmq.txt"; return 1; }
  tail -n 12 "$S10/build-sm90-mmq.txt"
  M=$(dirname "$(ls -t $(find "$TUNER_HOME"/builds -name llama-bench -type f -perm -u+x) | head -1)")
  echo "cuda: $B  cuda-force-mmq: $M"
  [ "$M" != "$B" ] || { echo "no second build found"; return 1; }
  for t in l1b q05b; do
    timeout $((590 - SECONDS - 5)) python3 -m tuner bench --arch sm_90 --model "$TUNER_HOME/models/$t-q4km.gguf" --depths 0,4096 \
      --pp 512 --tg 128 --reps 3 --build "$B" --seed-build cuda_dense --build "$M" --seed-build cuda_mmq_moe \
      -o "$TUNER_HOME/runs/seed004-mmq-$t" 2>&1 | tee "$S10/seed-mmq-$t.txt"
  done
  tar czf "$OUT/s10b.tgz" --exclude='*.gguf' -C "$TUNER_HOME" s10out runs/seed004-mmq-l1b runs/seed004-mmq-q05b 2>/dev/null
  ls -la "$OUT"; echo "s10_mmq ended at ${SECONDS} s"
}
