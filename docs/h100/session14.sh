# Session 14 (2026-11-25, issue 17): the device items session 12 left. Source after docs/h100/env.sh,
# docs/h100/session10.sh, session11.sh, session12.sh and session13.sh, then run the machine's `*_next`
# back to back while it is warm, until it prints "ALL DONE".
# Machine A (sm_90), `s14_next`:
#   setup90   sm_90 `cuda` build while llama-3.2-1b and qwen2.5-0.5b are written, both as Q4_K_M
#   paced4    session 12's paced-4 study (call 7's database and probe logs) resumed: residency re-decided,
#             then the output-equivalence gate with today's `-nkvo` spelling, then the export
#   cublas    seed rank 3: a cuda-force-cublas build, cuda_cublas_dense vs cuda_dense, both models
#   soak      `tuner validate --soak 10000` on results/sm_90/llama-3.2-1b-q4_k_m (its own build, rules baked)
#   gpu       `tuner validate --gpu` on the same result: upstream.patch (rule 32768-=TILE) built on the
#             pristine tree, test-backend-ops FLASH_ATTN_EXT, the launched kernels checked by Nsight Compute
# Machine B (sm_89 through 89-virtual), `s14b_next`: seed ranks 1 and 3 (cuda-force-mmq and
# cuda-force-cublas builds) against cuda_dense, both models.
# Per call $OUT gets s14.tgz (transcripts, run directories, exports; no models) and study databases.
S14=$TUNER_HOME/s14out
mkdir -p "$S14"

s14_setup() {  # session 10's setup (both models), and the bin dir written down for later steps
  s10_setup || return 1
  s10_bin >"$S10_DONE/bin-cuda"
}

s14_paced4() {  # s13_resume's body without its setup
  local R=$TUNER_RUNS/paced-4 C=docs/h100/session12/call7
  mkdir -p "$R/residency/upstream" "$R/residency/final"
  [ -f "$R/study.db" ] || { cp "$C/paced-4.db" "$R/study.db" && chmod u+w "$R/study.db"; }
  cp "$C/x/runs/paced-4/residency/upstream/residency.log" "$R/residency/upstream/"
  cp "$C/x/runs/paced-4/residency/final/residency.log" "$R/residency/final/"
  s13_paced paced-4 --cpu-mask 0-3 | tee -a "$S14/paced4.txt"
  [ "${PIPESTATUS[0]}" = 0 ]
}

# s14_build ARCH VARIANT TAG: a second build; its bin dir is the newest llama-bench (as s10_mmq found it)
s14_build() {
  local B
  /usr/bin/time -f "build %e s" python3 -m tuner build --arch "$1" --variant "$2" -j 16 >"$S14/build-$3.txt" 2>&1 \
    || { tail -20 "$S14/build-$3.txt"; return 1; }
  tail -n 4 "$S14/build-$3.txt"
  B=$(dirname "$(ls -t $(find "$TUNER_HOME"/builds -name llama-bench -type f -perm -u+x) | head -1)")
  [ "$B" != "$(cat "$S10_DONE/bin-cuda")" ] || { echo "no second build found"; return 1; }
  echo "$B" >"$S10_DONE/bin-$3"
}

# s14_seed ARCH ROW TAG: ROW (a seed build name) on the TAG build against cuda_dense on the cuda build
s14_seed() {
  local t
  for t in l1b q05b; do
    timeout $((590 - SECONDS - 5)) python3 -m tuner bench --arch "$1" --model "$TUNER_HOME/models/$t-q4km.gguf" --depths 0,4096 \
      --pp 512 --tg 128 --reps 3 --build "$(cat "$S10_DONE/bin-cuda")" --seed-build cuda_dense \
      --build "$(cat "$S10_DONE/bin-$3")" --seed-build "$2" -o "$TUNER_HOME/runs/seed004-$3-$t" 2>&1 | tee "$S14/seed-$3-$t.txt"
    [ "${PIPESTATUS[0]}" = 0 ] || return 1
  done
}

s14_cublas() { s14_build sm_90 cuda-force-cublas cublas90 && s14_seed sm_90 cuda_cublas_dense cublas90; }

s14_soak() {
  timeout $((590 - SECONDS - 5)) python3 -m tuner validate --soak 10000 results/sm_90/llama-3.2-1b-q4_k_m --model "$M1" 2>&1 \
    | tee "$S14/soak.txt"
  local rc=${PIPESTATUS[0]}
  cp -r "$TUNER_RUNS"/soak-* "$S14/" 2>/dev/null
  return "$rc"
}

s14_gpu() {
  mkdir -p "$S14/gpu"
  timeout $((590 - SECONDS - 5)) python3 -m tuner validate --gpu results/sm_90/llama-3.2-1b-q4_k_m --model "$M1" \
    --log-dir "$S14/gpu" 2>&1 | tee "$S14/gpu.txt"
  [ "${PIPESTATUS[0]}" = 0 ]
}

_s14_pack() {  # $1: tarball name
  nvidia-smi --query-gpu=temperature.gpu,clocks.sm,power.draw --format=csv,noheader 2>/dev/null
  ls "$S10_DONE"
  tar czf "$OUT/$1" --exclude='*.gguf' --exclude='*.db' --exclude='*.kld' -C "$TUNER_HOME" s14out s10out s13out s10-done \
    runs/paced-4 runs/seed004-cublas90-l1b runs/seed004-cublas90-q05b runs/seed004-mmq89-l1b runs/seed004-mmq89-q05b \
    runs/seed004-cublas89-l1b runs/seed004-cublas89-q05b 2>/dev/null
  ls -la "$OUT"
}

s14_next() {
  ls "$TUNER_HOME"/builds/*/artifacts/*/bin/llama-bench >/dev/null 2>&1 || rm -f "$S10_DONE/setup90"
  s10_step setup90 420 s14_setup \
    && { s10_step paced4 150 s14_paced4; [ -f "$S10_DONE/setup90" ]; } \
    && s10_step cublas 450 s14_cublas \
    && s10_step soak 360 s14_soak \
    && s10_step gpu 420 s14_gpu \
    && echo "S14 ALL DONE"
  _s14_pack s14.tgz; echo "s14_next ended at ${SECONDS} s"
}

# Machine B: 89-virtual. setup89 is session 12's (build, models, the JIT timed); the forced builds pay
# their own JIT on their first llama-bench run, which the bench's first (dropped) repetition absorbs.
s14b_setup() { s12_setup89 || return 1; s10_bin >"$S10_DONE/bin-cuda"; }

s14b_next() {
  ls "$TUNER_HOME"/builds/*/artifacts/*/bin/llama-bench >/dev/null 2>&1 || rm -f "$S10_DONE/setup89"
  # on a machine that ran machine C's steps first: s10_bin must find the 89-virtual build alone
  [ -f "$S10_DONE/setup89" ] || rm -rf "$TUNER_HOME/builds" "$S10_DONE/bin-cuda"
  s10_step setup89 420 s14b_setup \
    && s10_step mmq89b 360 s14_build sm_89 cuda-force-mmq mmq89 \
    && s10_step mmq89 220 s14_seed sm_89 cuda_mmq_moe mmq89 \
    && s10_step cublas89b 360 s14_build sm_89 cuda-force-cublas cublas89 \
    && s10_step cublas89 220 s14_seed sm_89 cuda_cublas_dense cublas89 \
    && echo "S14B ALL DONE"
  _s14_pack s14b.tgz; echo "s14b_next ended at ${SECONDS} s"
}

# Machine C (sm_90, a fresh one: machine A went back between calls 2 and 3). The soak's own build (the
# result's config, rules baked) is made first with llama-quantize as well, which quantizes the 1B, so no
# separate `cuda` build is paid; `tuner validate --soak` then finds that build cached (same key, its
# targets present).
s14c_soakbuild() {
  (t0=$SECONDS; python3 -m tuner model synth --like llama-3.2-1b -o "$TUNER_HOME/models/l1b-f16.gguf"
   echo "l1b synth $((SECONDS - t0)) s") >"$S14/synth-l1b.txt" 2>&1 &
  local synth=$! B
  /usr/bin/time -f "build %e s" python3 - results/sm_90/llama-3.2-1b-q4_k_m >"$S14/build-soak.txt" 2>&1 <<'PY' || { tail -20 "$S14/build-soak.txt"; return 1; }
import sys
from pathlib import Path
from tuner.builder.cmake import build_variant
from tuner.plan.render import render_variant
from tuner.result.export import baked_runtime
from tuner.result.validate import load_config
from tuner.source import fetch_source
cfg = load_config(Path(sys.argv[1]))
choice = cfg["choice"]
rv = render_variant(fetch_source(cfg["source"]["spec"]), cfg["target"]["arch"], choice["variant"],
                    compile_values=dict(choice["compile"]),
                    baked_runtime=baked_runtime(list(choice["fa_rules"]), dict(choice["fa_env"])))
b = build_variant(rv, targets=("llama-bench", "llama-quantize"), jobs=16)
print("bin dir", b.bin_dir)
PY
  wait "$synth"
  B=$(awk '/^bin dir/ {print $3}' "$S14/build-soak.txt")
  /usr/bin/time -f "l1b quantize %e s" "$B/llama-quantize" "$TUNER_HOME/models/l1b-f16.gguf" "$M1" Q4_K_M \
    >"$S14/quantize-l1b.txt" 2>&1 || { tail -5 "$S14/quantize-l1b.txt"; return 1; }
  tail -n2 "$S14"/synth-l1b.txt "$S14"/quantize-l1b.txt "$S14/build-soak.txt"
}

s14c_next() {
  ls "$TUNER_HOME"/builds/*/artifacts/*/bin/llama-bench >/dev/null 2>&1 || rm -f "$S10_DONE/soakbuild"
  s10_step soakbuild 420 s14c_soakbuild \
    && s10_step soak 100 s14_soak \
    && s10_step gpu 420 s14_gpu \
    && echo "S14C ALL DONE"
  _s14_pack s14c.tgz; echo "s14c_next ended at ${SECONDS} s"
}
