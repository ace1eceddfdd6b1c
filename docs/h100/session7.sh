# Session 7 (issues 15 and 16) on the lent H100: finish the 8B's confirm from session 6's database,
# export it, then build each sm_90 result's upstream.patch and check it (`tuner validate --gpu`).
# Source after docs/h100/env.sh.
#   s6_setup        (session 6's) sm_90 build while both shapes are quantized by the carried llama-quantize
#   s7_8b           the 8B search resumed from session6/sm90-l8b-v3.db, with what is left of the call's 575 s
#   s7_smoke        the selection check against itself (tuned binaries as both sides), and ncu tried
#   s7_export       export the 8B study ($OUT/l8b.tgz, copied into results/ here)
#   s7_upstream R.. for each result folder: the tuned build's tree rebuilt in place as pristine + its
#                   upstream.patch, then `tuner validate R --gpu` against it; the tuned tree restored
. docs/h100/session6.sh

s7_8b() {
  mkdir -p "$TUNER_RUNS/sm90-l8b-v3"
  # session 5's s5_search seeds from session5/; this session resumes session 6's database.
  [ -f "$TUNER_RUNS/sm90-l8b-v3/study.db" ] || cp docs/h100/session6/sm90-l8b-v3.db "$TUNER_RUNS/sm90-l8b-v3/study.db"
  # S7_RESERVE: seconds of the call kept for what follows the search
  s5_search sm90-l8b-v3 "$M8" $((575 - SECONDS - ${S7_RESERVE:-0})) $L8_ARGS --confirm-extra 1 "$@"
}

# Export into the machine's home (a result folder holds more files than $OUT brings back), tarred.
s7_export() {
  python3 -m tuner export --study sm90-l8b-v3 --storage "sqlite:///$TUNER_RUNS/sm90-l8b-v3/study.db" \
    -o "$TUNER_HOME/l8b" --like llama-3.1-8b --weight-type q4_k_m 2>&1 | tee "$OUT/export-l8b.txt"
  tar czf "$OUT/l8b.tgz" -C "$TUNER_HOME" l8b
}

# The checker against itself, before any upstream build exists: the tuned binaries stand in for the
# "upstream" side, run without rules, so at d65536 they launch upstream's VEC where the tuned side
# (rules on) logs TILE: the selection check must fail there and pass at d32768. Also tries ncu here.
s7_smoke() {
  local tuned_bin
  tuned_bin=$(dirname "$(ls "$TUNER_HOME"/builds/*/artifacts/*/bin/llama-bench | head -1)")
  /usr/bin/time -f "smoke %e s" python3 -m tuner validate results/sm_90/llama-3.2-1b-q4_k_m --gpu --model "$M1" \
    --upstream-bin "$tuned_bin" --tuned-bin "$tuned_bin" --log-dir "$TUNER_HOME/smoke" 2>&1 | tee "$OUT/smoke.txt"
  tar czf "$OUT/smoke-logs.tgz" -C "$TUNER_HOME" smoke
}

# The upstream build. A second full sm_90 build costs ~430 s of the session's 1800 s, so the tuned
# build's own tree is turned into the pristine one instead: every file the tuner changed is put back
# from the pristine source (a fresh copy, so Ninja rebuilds exactly what depends on it), the result's
# upstream.patch is applied, and Ninja rebuilds llama-bench and test-backend-ops; the CMake cache is
# the tuned build's (the result's defines). The tuned binaries stay in the build's artifacts/ folder,
# which `--tuned-bin` points at. At the end the tuned files are put back.
# s7_apply SRC PATCH: write PATCH's files into the tree SRC, applied to the pristine source by tuner's
# own patched_tree_text (in a temporary directory; each file replaced, never written through a hard link)
s7_apply() {
  python3 - "$1" "$2" "$TUNER_HOME/sources/832db0699007f1be/llama.cpp" <<'PY'
import sys
from pathlib import Path
from tuner.result.upstream_check import patched_tree_text
src, patch, pristine = map(Path, sys.argv[1:])
for rel, text in patched_tree_text(patch, pristine).items():
    (src / rel).unlink(missing_ok=True)
    (src / rel).write_text(text)
    print("rewrote", rel)
PY
}

s7_upstream() {
  local P=$TUNER_HOME/sources/832db0699007f1be/llama.cpp root
  root=$(dirname "$(ls -d "$TUNER_HOME"/builds/*/build | head -1)")
  local src=$root/src tuned_bin
  tuned_bin=$(dirname "$(ls "$root"/artifacts/*/bin/llama-bench | head -1)")
  local keep=$TUNER_HOME/tuned-files changed
  changed=$(cd "$src" && diff -rq . "$P" 2>/dev/null | sed -n 's|^Files \./\([^ ]*\) and .* differ$|\1|p')
  echo "tuner-changed files: $changed"
  mkdir -p "$keep"
  for f in $changed; do mkdir -p "$keep/$(dirname "$f")"; cp -p "$src/$f" "$keep/$f"; done
  local r name pf
  for r in "$@"; do
    name=$(basename "$r"); pf=$(realpath "$r/upstream.patch")
    for f in $changed ggml/src/ggml-cuda/fattn.cu; do rm -f "$src/$f"; cp "$P/$f" "$src/$f"; done
    # not `git apply` in $src: .devhome lies in this repository's work tree, and git then applies the
    # paths relative to the repository root and skips fattn.cu ("Skipped patch"; call 3 of session 7)
    s7_apply "$src" "$pf" || return 1
    /usr/bin/time -f "upstream build $name %e s" cmake --build "$root/build" --target llama-bench test-backend-ops \
      --parallel 16 >"$OUT/upstream-build-$name.txt" 2>&1 || { tail -20 "$OUT/upstream-build-$name.txt"; return 1; }
    tail -2 "$OUT/upstream-build-$name.txt"
    grep -c "Building CUDA object" "$OUT/upstream-build-$name.txt" | sed 's/^/CUDA objects rebuilt: /'
    python3 -m tuner validate "$r" --gpu --model "$M1" --model "$M8" --upstream-bin "$root/build/bin" \
      --tuned-bin "$tuned_bin" --log-dir "$TUNER_HOME/validate/$name" 2>&1 | tee "$OUT/validate-$name.txt"
  done
  for f in $changed; do rm -f "$src/$f"; cp -p "$keep/$f" "$src/$f"; done
  rm -f "$src/ggml/src/ggml-cuda/fattn.cu"; cp -p "$keep/ggml/src/ggml-cuda/fattn.cu" "$src/ggml/src/ggml-cuda/fattn.cu" 2>/dev/null \
    || cp "$P/ggml/src/ggml-cuda/fattn.cu" "$src/ggml/src/ggml-cuda/fattn.cu"
  tar czf "$OUT/validate-logs.tgz" -C "$TUNER_HOME" validate
  echo "s7_upstream ended at ${SECONDS} s"
}

# Call 4 (a fresh machine, ~450 s of budget left). Call 3's s7_upstream ran `git apply` inside the
# tree under .devhome, which lies in this repository's work tree: git applied the paths relative to the
# repository root and skipped fattn.cu ("Skipped patch"), so both "upstream" builds were the pristine
# tree, and the check said so (upstream VEC where the tuned build ran TILE / MMA). Here the tool builds
# the 8B's upstream.patch itself (`validate --gpu` without --upstream-bin: the pristine tree + the patch,
# the result's defines, a full build), then the 1B's patch replaces fattn.cu in that tree (applied by
# tuner's own patched_tree_text, in a temporary directory) and Ninja rebuilds what depends on it.
s7_fresh() {
  mkdir -p "$TUNER_HOME/models" "$TUNER_HOME/setup"
  local S=$TUNER_HOME/setup
  [ -f "$M8" ] || python3 -m tuner model synth --like llama-3.1-8b --quant Q4_K_M --quantize-with "$Q" -o "$M8" >"$S/synth8b.log" 2>&1 &
  [ -f "$M1" ] || python3 -m tuner model synth --like llama-3.2-1b --quant Q4_K_M --quantize-with "$Q" -o "$M1" >"$S/synth1b.log" 2>&1 &
  local r8=$TUNER_HOME/l8b
  mkdir -p "$r8" && tar xzf docs/h100/session7/call3/l8b.tgz -C "$TUNER_HOME"
  # 1) the tool's own path: pristine + upstream.patch built by validate --gpu, test-backend-ops on it; the
  #    models are still being written, so no --model: its selection line says "not checked" here
  /usr/bin/time -f "validate 8B build+gate %e s" python3 -m tuner validate "$r8" --gpu \
    --log-dir "$TUNER_HOME/validate/l8b-build" 2>&1 | tee "$OUT/validate-l8b.txt"
  wait
  # 2) the selection check on that build, once the model exists
  local root
  root=$(ls -d "$TUNER_HOME"/builds/*/ | head -1); root=${root%/}  # the only build on this fresh machine
  /usr/bin/time -f "validate 8B selection %e s" python3 -m tuner validate "$r8" --gpu --model "$M8" \
    --upstream-bin "$(dirname "$(ls "$root"/artifacts/*/bin/llama-bench | head -1)")" \
    --log-dir "$TUNER_HOME/validate/l8b" 2>&1 | tee -a "$OUT/validate-l8b.txt"
  echo "8B done at ${SECONDS} s"
  s7_apply "$root/src" results/sm_90/llama-3.2-1b-q4_k_m/upstream.patch
  /usr/bin/time -f "1B upstream rebuild %e s" cmake --build "$root/build" --target llama-bench test-backend-ops --parallel 16 \
    >"$S/upstream-build-l1b.txt" 2>&1 || tail -20 "$S/upstream-build-l1b.txt"
  tail -1 "$S/upstream-build-l1b.txt"
  /usr/bin/time -f "validate 1B %e s" python3 -m tuner validate results/sm_90/llama-3.2-1b-q4_k_m --gpu --model "$M1" \
    --upstream-bin "$root/build/bin" --log-dir "$TUNER_HOME/validate/l1b" 2>&1 | tee "$OUT/validate-l1b.txt"
  cp "$root/build.json" "$S/upstream-build-l8b.json"
  tar czf "$OUT/validate-logs.tgz" -C "$TUNER_HOME" validate setup
  echo "s7_fresh ended at ${SECONDS} s"
}
